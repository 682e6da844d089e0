"""``teamtr chat``: a trained team answers a question of one's own, turn by turn.

``teamtr chat --run DIR --question "..." [--note TEXT]...`` plays one dialogue (greedy, as the
run's evaluation plays) and prints each turn with its speaker; without ``--question`` it reads
questions from the terminal, one a line, until an empty line or end of input. ``--json``
writes every dialogue played with each message's token ids and their log-probabilities under
the speaker's policy (what ``docs/examples/exported_team/play_with_peft.py`` is checked
against). ``--set SECTION.KEY=VALUE`` changes a key of the run's config for the dialogues
(``--set sampler.max_new_tokens=64``), checked as ``train`` checks it. ``--url URL`` plays
through an OpenAI-compatible (vLLM) server that serves the team's adapters under the export's
names (``TrainedTeam.served_at``), its key, if any, in the environment variable
``--key-variable`` names. The run, the step, the notes, the ``--json`` path, the URL and the key
are checked before the model loads; a bad one is one ``error:`` line and exit code 2
(``llm.interface.cli``), as is a server that does not answer as the team's policy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm.common.config import ConfigError
from llm.interface.cli_args import add_command, add_set_option, integer_at_least

if TYPE_CHECKING:
    from llm.export.trained_team import TrainedTeam


EXAMPLES = """examples:
  teamtr chat --run runs/try --question "What is 12 + 30?"
  teamtr chat --run exported_team --question "..." --note "17" --note ""
  teamtr chat --run runs/try --set sampler.max_new_tokens=64   # questions from stdin"""


def add_parser(commands: Any) -> None:
    """``teamtr chat``: its line in the list of commands, its ``--help`` and its options."""
    parser = add_command(
        commands,
        "chat",
        "ask a trained team a question",
        "One dialogue of a trained team (a run directory or an export) about a question "
        "of one's own, each turn printed with its speaker; without --question, questions "
        "are read from stdin, one a line.",
        EXAMPLES,
    )
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, help="run directory of `teamtr train`, or export")
    parser.add_argument(
        "--step", type=integer_at_least(0), help="checkpoint stage (default: the latest)"
    )
    parser.add_argument("--question", help="the question (default: read questions from stdin)")
    parser.add_argument(
        "--note",
        action="append",
        default=[],
        metavar="TEXT",
        help="a private note, once per agent in order (agent k sees note k only)",
    )
    parser.add_argument(
        "--json", help="write the dialogues, with tokens and log-probs per message, here"
    )
    parser.add_argument(
        "--sample", action="store_true", help="sample at the policy's temperature (not greedy)"
    )
    parser.add_argument("--seed", type=integer_at_least(0), default=0, help="routes and samples")
    parser.add_argument("--device", help='where the models go, e.g. "cpu" (default: the run\'s)')
    parser.add_argument(
        "--url",
        help="play through the OpenAI-compatible (vLLM) server at URL that serves the team's "
        "adapters under the export's names (agent0, ...)",
    )
    parser.add_argument(
        "--key-variable",
        default="",
        metavar="NAME",
        help="with --url: the environment variable that holds the server's key",
    )
    add_set_option(parser, example="sampler.max_new_tokens=64")


def run_chat(args: argparse.Namespace) -> int:
    from llm.export.trained_team import locate_team
    from llm.training.preflight import require_writable_file

    source = locate_team(args.run, args.step, args.set)
    if args.note and len(args.note) != source.n_agents:
        raise ConfigError(
            f"--note: {len(args.note)} notes for a team of {source.n_agents} agents; give one "
            'per agent, in order ("" for an agent without one), or none'
        )
    if args.question is not None and not args.question.strip():
        raise ConfigError("--question: empty; give the question's text")
    destination = Path(args.json) if args.json else None
    if destination is not None:
        require_writable_file(destination, "--json")
    _check_server_arguments(args.url, args.key_variable)
    trained = source.load(args.device)
    if args.url:
        trained = trained.served_at(args.url, args.key_variable)
    try:
        _chat(args, trained, destination)
    finally:
        trained.close()
    return 0


def _check_server_arguments(url: str | None, key_variable: str) -> None:
    """``--url`` and ``--key-variable``, before any model loads."""
    if key_variable and not url:
        raise ConfigError("--key-variable: only with --url (the key of the server there)")
    if not url:
        return
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--url: {url!r} is not an http://host:port address")
    if key_variable and not os.environ.get(key_variable):
        raise ConfigError(
            f"--key-variable {key_variable}: the environment has no {key_variable} (the key of "
            "the server at --url; it is read from there, never given on the command line)"
        )


def _chat(args: argparse.Namespace, trained: TrainedTeam, destination: Path | None) -> None:
    from llm.evaluation.held_out_problems import transcript_turn  # torch: once a team is loaded

    played: list[dict[str, Any]] = []
    questions = [args.question] if args.question is not None else _typed_questions()
    for question in questions:
        problem = trained.problem(question, args.note)
        episode = trained.episodes([problem], sample=args.sample, seed=args.seed)[0]
        logps = trained.message_logps([episode])[0]
        record: dict[str, Any] = {
            "question": problem.question,
            "notes": list(problem.notes),
            "turns": [
                {
                    **transcript_turn(turn, trained.chat.message_text(turn)),
                    "tokens": list(turn.message),
                    "logps": [float(x) for x in logps[t]],
                }
                for t, turn in enumerate(episode.turns)
            ],
        }
        for turn in record["turns"]:
            print(f"agent {turn['agent']}: {turn['text']}", flush=True)
            for said in turn.get("environment", ()):
                to = "" if said["to"] is None else f" (to agent {said['to']})"
                print(f"environment{to}: {said['text']}", flush=True)
        played.append(record)
        if destination is not None:
            _write_dialogues(destination, trained.checkpoint, played)


def _typed_questions() -> Iterator[str]:
    """Questions typed at the terminal (or piped in), until an empty line or end of input."""
    while True:
        try:
            line = input("question> " if sys.stdin.isatty() else "")
        except EOFError:
            return
        if not line.strip():
            return
        yield line


def _write_dialogues(path: Path, checkpoint: str, played: Sequence[dict[str, Any]]) -> None:
    from llm.training.checkpoint import write_atomically

    path.parent.mkdir(parents=True, exist_ok=True)
    result = {"checkpoint": checkpoint, "dialogues": list(played)}
    write_atomically(path, json.dumps(result, indent=1).encode() + b"\n")
