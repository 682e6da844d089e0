"""The language-model part of ``make demo`` in one line: a team's held-out accuracy before and
after a ``teamtr train`` run.

"Before" is the ``teamtr eval --config`` JSON of the untrained team; "after" is the run's own
evaluation after its last stage (the last line of its ``metrics.jsonl`` that holds one). Both
must be on the same held-out set (the same number of problems, per template too). Prints e.g.

    language-model team (relay, SmolLM2-135M-Instruct, 2 stages): held-out accuracy 0.00 -> 0.87 (n = 100, standard error 0.000 -> 0.034)

and, with ``--json``, writes both evaluations, the run and what its stages cost. Bad input
(a missing or unreadable file, a run without an evaluation, two different held-out sets) is
one ``error:`` line and exit code 2.

    python -m studies.llm.demo_summary --untrained UNTRAINED.json --run RUN_DIR [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from studies.llm.run_records import MEASURES, held_out, measure_of

MEASURED = frozenset(MEASURES)

MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct"}
"""Display names of model sources (any other source is shown as given)."""

RELAYS = {"first": "relay", "sum": "sum of private numbers", "chain": "running sum"}
"""What a private-notes team is asked, by ``[task] note_answer``."""


class DemoInputError(Exception):
    """A file of the summary is missing, unreadable, or does not fit the other."""


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DemoInputError(f"{path}: no such file ({what})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DemoInputError(f"{path}: cannot read {what}: {error}") from None


def last_evaluation(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's last held-out evaluation, and every stage record of its ``metrics.jsonl``."""
    metrics = run_dir / "metrics.jsonl"
    try:
        lines = metrics.read_text().splitlines()
    except FileNotFoundError:
        raise DemoInputError(f"{metrics}: no such file (is {run_dir} a finished run?)") from None
    except OSError as error:
        raise DemoInputError(f"{metrics}: cannot read: {error}") from None
    try:
        stages = [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError as error:
        raise DemoInputError(f"{metrics}: cannot read: {error}") from None
    evaluated = [record for record in stages if "eval" in record]
    if not evaluated:
        raise DemoInputError(
            f"{metrics}: no stage was evaluated ([run] eval_every = 0, or the run has no test set)"
        )
    return evaluated[-1], stages


def team_label(config: dict[str, Any], stages: int) -> str:
    """E.g. ``relay, SmolLM2-135M-Instruct, 2 stages``."""
    task = config["task"]
    if task["kind"] == "private_notes":
        what = RELAYS.get(task["note_answer"], task["note_answer"])
    else:
        what = task["kind"]
    source = config["model"]["source"]
    model = MODEL_NAMES.get(source, source)
    return f"{what}, {model}, {stages} stage{'' if stages == 1 else 's'}"


def _counts(evaluation: dict[str, Any]) -> dict[str, float]:
    """The numbers of problems of an evaluation: in all, and per template or difficulty."""
    return {k: v for k, v in evaluation.items() if k == "n" or k.endswith("/n")}


def summarise(untrained_path: Path, run_dir: Path) -> dict[str, Any]:
    """Both evaluations, checked to be on the same held-out set, and the run's costs."""
    untrained = _read_json(untrained_path, "the untrained team's evaluation")
    if (
        not isinstance(untrained, dict)
        or not MEASURED.intersection(untrained)
        or "n" not in untrained
    ):
        raise DemoInputError(f"{untrained_path}: not a `teamtr eval` results file")
    if untrained.get("checkpoint") is not None:
        raise DemoInputError(
            f"{untrained_path}: evaluates checkpoint {untrained['checkpoint']!r}, not the "
            "untrained team (`teamtr eval --config`)"
        )
    config = _read_json(run_dir / "config.json", "the run's config")
    record, stages = last_evaluation(run_dir)
    trained = record["eval"]
    if _counts(untrained) != _counts(trained):
        raise DemoInputError(
            f"{untrained_path} and {run_dir}: different held-out sets (problems per template: "
            f"{_counts(untrained)} against {_counts(trained)}); evaluate the untrained team "
            "with the run's config"
        )
    trained_stages = record["stage"] + 1
    return {
        "team": team_label(config, trained_stages),
        "run": str(run_dir),
        "stages": trained_stages,
        "n": trained["n"],
        "untrained": {k: v for k, v in untrained.items() if k != "transcripts"},
        "trained": trained,
        "training_wall_seconds": sum(s["wall_seconds"] for s in stages[:trained_stages]),
        "training_cpu_seconds": sum(s["cpu_seconds"] for s in stages[:trained_stages]),
    }


def summary_line(summary: dict[str, Any]) -> str:
    before, after = summary["untrained"], summary["trained"]
    return (
        f"language-model team ({summary['team']}): held-out {measure_of(after)} "
        f"{held_out(before):.2f} -> {held_out(after):.2f} (n = {summary['n']:.0f}, "
        f"standard error {before['standard_error']:.3f} -> {after['standard_error']:.3f})"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m studies.llm.demo_summary", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--untrained",
        type=Path,
        required=True,
        help="`teamtr eval --config CONFIG --json` results of the untrained team",
    )
    parser.add_argument("--run", type=Path, required=True, help="run directory of `teamtr train`")
    parser.add_argument("--json", type=Path, help="write the summary here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        summary = summarise(args.untrained, args.run)
    except DemoInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    print(summary_line(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
