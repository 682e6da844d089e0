"""Held-out transcripts scored again by the task's metric as it is now: after a change to how
answers are read from messages, what each saved evaluation would have scored, without playing
the dialogues again (the messages are the transcripts' own; the problems are the config's
held-out problems, in order, which the transcripts index).

    python -m studies.llm.reasoning.rescore_transcripts --config reasoning/letter_counting \\
        results/reasoning_gym/trained/letter_counting-team-s0.transcripts.jsonl

prints, for each file, the accuracy as recorded and as rescored, and how many dialogues changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from llm.common.config import ConfigError, load_config
from llm.problems.configured import build_task
from llm.problems.task import Dialogue, Task


def rescore(task: Task, rows: list[dict[str, Any]]) -> list[bool]:
    """Whether each transcript's dialogue is correct by ``task``'s metric now."""
    verdicts = []
    for row in rows:
        problem = task.test[row["problem"]]
        if problem.question != row["question"]:
            raise ValueError(
                f"transcript of problem {row['problem']} asks {row['question'][:60]!r}, the "
                f"config's held-out problem {row['problem']} {problem.question[:60]!r}: "
                "not this config's evaluation"
            )
        turns = row["turns"]
        dialogue = Dialogue(
            problem,
            tuple(turn["text"] for turn in turns),
            tuple(turn["agent"] for turn in turns),
        )
        verdicts.append(task.score(dialogue) >= 1.0)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the config the evaluation ran")
    parser.add_argument("transcripts", type=Path, nargs="+", help="*.transcripts.jsonl files")
    parser.add_argument("--json", type=Path, help="every file's accuracies as JSON")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, [])
    except ConfigError as error:
        parser.error(str(error))
    task = build_task(config.task, config.team.n_agents)
    results = {}
    print("| transcripts | recorded | rescored | dialogues changed |")
    print("| --- | --- | --- | --- |")
    for path in args.transcripts:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line]
        now = rescore(task, rows)
        before = [bool(row["correct"]) for row in rows]
        changed = sum(a != b for a, b in zip(before, now, strict=True))
        results[str(path)] = {
            "recorded": sum(before) / len(rows),
            "rescored": sum(now) / len(rows),
            "changed": changed,
            "n": len(rows),
        }
        print(
            f"| {path.name} | {100 * sum(before) / len(rows):.0f}% "
            f"| {100 * sum(now) / len(rows):.0f}% | {changed} of {len(rows)} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
