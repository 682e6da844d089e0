"""``teamtr eval --data``: a user's file read by the one loader of ``[task] kind = "dataset"``.

JSON, JSONL, CSV or Parquet (``llm.problems.data_files.read_problems``), its columns mapped by
the run's own ``question_column``, ``answer_column`` and ``notes_columns`` (their defaults,
"question", "answer" and none, for a run of another kind), each replaceable on the command
line; every other column goes into ``Problem.metadata``, where a reward reads it. A field the
team would not see is refused rather than dropped: a ``notes`` column that no notes mapping
names (agent k's note must be a column of its own), or a notes mapping of another size than
the team.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from llm.common.config import ConfigError, RunConfig, TaskSettings
from llm.common.rules import reward_names
from llm.problems.data_files import read_problems
from llm.problems.task import reference_parses
from llm.problems.tasks import Problem, TaskDataError

UNMAPPED_NOTES = ("notes", "note")
"""Column names that hold private notes in other tools' files: refused unless mapped."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--question-column", help="--data: the question's column (default: the run's mapping)"
    )
    parser.add_argument(
        "--answer-column", help="--data: the answer's column (\"\": none; default: the run's)"
    )
    parser.add_argument(
        "--notes-column",
        action="append",
        metavar="COLUMN",
        help="--data: agent k's private note is the k-th of these columns (default: the run's "
        "notes_columns)",
    )


def data_mapping(config: RunConfig, args: argparse.Namespace) -> TaskSettings:
    """The run's own ``[task]`` as a dataset of ``--data`` (its column mapping, reward and
    metric; the default mapping for a run of another kind), the command line's columns in
    place of its own where given."""
    data = str(Path(args.data).resolve())  # relative to the working directory
    task = config.task
    mapping = dataclasses.replace(
        task,
        kind="dataset",
        train_file=data,
        test_file="",
        data_format="",  # from the file's suffix
    )
    return dataclasses.replace(
        mapping,
        question_column=_given(args.question_column, mapping.question_column),
        answer_column=_given(args.answer_column, mapping.answer_column),
        notes_columns=tuple(_given(args.notes_column, mapping.notes_columns)),
    )


def _given(value, default):
    return default if value is None else value


def evaluation_problems(config: RunConfig, args: argparse.Namespace) -> list[Problem]:
    """The problems of ``--data``, read as a dataset run reads its files."""
    mapping = data_mapping(config, args)
    speakers = config.team.n_agents
    if mapping.notes_columns and len(mapping.notes_columns) != speakers:
        raise ConfigError(
            f"--data {args.data}: {len(mapping.notes_columns)} notes columns "
            f"{list(mapping.notes_columns)} for a team of {speakers} agents; give one per agent"
        )
    problems = read_problems(mapping, mapping.train_file, "--data")  # [task]'s one loader
    unseen = [name for name in UNMAPPED_NOTES if name in problems[0].metadata]
    if unseen and not mapping.notes_columns:
        raise ConfigError(
            f"--data {args.data}: column {unseen[0]!r} would reach no agent (it holds private "
            "notes, but no notes mapping names it); give each agent's note a column of its own "
            "and name them with --notes-column (once per agent) or [task] notes_columns"
        )
    names = reward_names(mapping)
    own_code = config.task.kind == "python"  # its factory's task scores as it will
    if not own_code and names in ((), ("math_verify",)):  # accuracy compares with math-verify
        for problem in problems:
            if not reference_parses(problem.answer):
                raise TaskDataError(
                    f"--data: {problem.origin}: answer {problem.answer!r:.40} is not a number or "
                    "expression math-verify can parse (the run's reward compares with it)"
                )
    return problems
