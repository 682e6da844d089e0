"""What the measured certificate certified on language-model runs: a table from their records.

For every run directory (``metrics.jsonl`` of a ``teamtr train`` run with ``[stage]
certificate_groups`` > 0) it reports:

- the updates measured, how many were certified positive by the measured bound and how many by
  the theory's (Thm 3.4), the pairs' mean, the bound and the pairs' spread, averaged;
- each evaluated checkpoint's greedy held-out change since the evaluation before it (the
  untrained team's ``teamtr eval`` result, where given, before the first) beside the sum of the stages' measured
  means and bounds in between. The bound is on J, the training reward at the sampling
  temperature, not on held-out greedy accuracy: the two move together without being one
  number. k stages' bounds summed hold together with probability >= 1 - k alpha (union bound);
- the held-out groups' cost: their tokens against the training draws' tokens;
- how many pairs the typical update would need (``teamtr.measured.pairs_to_certify``, from the
  mean and spread of the updates that gained), where the records carry the spread.

Usage::

    python -m studies.llm.certificate.measured_table \\
        --run relay-s0=results/certificate/relay-g64-s0:results/default/untrained_teamtr.json \\
        ... --json results/certificate/table.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llm.common.config import ConfigError
from llm.interface.plot import read_records
from studies.llm.run_records import held_out
from teamtr.measured import pairs_to_certify


def read_stages(run_dir: Path) -> list[dict[str, Any]]:
    """The stage records of a run directory (or of a ``metrics.jsonl`` file)."""
    return read_records(run_dir / "metrics.jsonl" if run_dir.is_dir() else run_dir)


def measured_updates(stages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every update record with a measured certificate, its stage attached."""
    return [
        {**update, "stage": stage["stage"]}
        for stage in stages
        for update in stage["updates"]
        if update.get("measured")
    ]


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def checkpoint_rows(
    stages: Sequence[dict[str, Any]], untrained: float | None
) -> list[dict[str, Any]]:
    """Per evaluated stage: held-out change since the previous evaluation, and the stages'
    measured means and bounds summed over the same interval (None where one is missing)."""
    rows = []
    before, since = untrained, 0
    for index, stage in enumerate(stages):
        if "eval" not in stage:
            continue
        interval = stages[since : index + 1]
        measured = [s["measured"] for s in interval if s.get("measured") is not None]
        complete = len(measured) == len(interval)
        accuracy = held_out(stage["eval"])
        rows.append(
            {
                "stages": [s["stage"] + 1 for s in interval],
                "held_out": accuracy,
                "held_out_change": None if before is None else accuracy - before,
                "measured_mean": sum(m["mean"] for m in measured) if complete else None,
                "measured_bound": sum(m["bound"] for m in measured) if complete else None,
                "level": 1 - len(interval) * (1 - measured[0]["level"]) if complete else None,
            }
        )
        before, since = accuracy, index + 1
    return rows


def summary(name: str, stages: Sequence[dict[str, Any]], untrained: float | None) -> dict[str, Any]:
    """One run's row of the table, and its checkpoints'."""
    updates = measured_updates(stages)
    certificates = [u["measured"] for u in updates]
    spreads = [c["sd"] for c in certificates if c.get("sd") is not None]
    gains = [c for c in certificates if c["mean"] > 0 and c.get("sd") is not None]
    width = certificates[0]["reward_width"] if certificates else math.nan
    level = certificates[0]["level"] if certificates else math.nan
    typical = (
        pairs_to_certify(
            statistics.fmean(c["mean"] for c in gains),
            statistics.fmean(c["sd"] for c in gains),
            width,
            level,
        )
        if gains
        else None
    )
    held_out_tokens = sum(s.get("held_out_tokens", 0) for s in stages)
    training_tokens = sum(s["generated_tokens"] for s in stages)
    return {
        "run": name,
        "stages": len(stages),
        "updates": sum(len(s["updates"]) for s in stages),
        "measured": len(updates),
        "pairs_per_update": _mean([c["n"] for c in certificates]),
        "certified_measured": sum(c["bound"] > 0 for c in certificates),
        "certified_theory": sum(u["certificate"] > 0 for u in updates),
        "mean_gain": _mean([c["mean"] for c in certificates]),
        "mean_bound": _mean([c["bound"] for c in certificates]),
        "mean_sd": _mean(spreads),
        "pairs_to_certify_typical_gain": typical,
        "held_out_tokens": held_out_tokens,
        "training_tokens": training_tokens,
        "held_out_per_training_token": held_out_tokens / training_tokens,
        "cpu_seconds": sum(s["cpu_seconds"] for s in stages),
        "checkpoints": checkpoint_rows(stages, untrained),
    }


def _number(value: float | int | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return str(value) if isinstance(value, int) else f"{value:+.{digits}f}"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The runs' table, then each run's checkpoints."""
    lines = [
        "| run | updates measured | pairs each | certified > 0: measured / Thm 3.4 | mean pair "
        "mean | mean bound | mean pair sd | pairs to certify the mean gain | held-out / "
        "training tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['run']} | {row['measured']} of {row['updates']} | "
            f"{row['pairs_per_update']:.0f} | {row['certified_measured']} / "
            f"{row['certified_theory']} | {_number(row['mean_gain'])} | "
            f"{_number(row['mean_bound'])} | "
            f"{'n/a' if row['mean_sd'] is None else format(row['mean_sd'], '.3f')} | "
            f"{row['pairs_to_certify_typical_gain'] or 'n/a'} | "
            f"{row['held_out_tokens']:,} / {row['training_tokens']:,} "
            f"({row['held_out_per_training_token']:.1f}x) |"
        )
    lines += [
        "",
        "| run | stages | held out after | its change | measured: summed mean | summed bound "
        "(joint level) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        for point in row["checkpoints"]:
            level = "" if point["level"] is None else f" ({100 * point['level']:.0f}%)"
            lines.append(
                f"| {row['run']} | {point['stages'][0]}-{point['stages'][-1]} | "
                f"{100 * point['held_out']:.0f}% | "
                f"{_number(point['held_out_change'], 2)} | {_number(point['measured_mean'])} | "
                f"{_number(point['measured_bound'])}{level} |"
            )
    return "\n".join(lines)


def _run_argument(text: str) -> tuple[str, Path, Path | None]:
    name, _, rest = text.partition("=")
    path, _, untrained = rest.partition(":")
    if not name or not path:
        raise argparse.ArgumentTypeError(
            f"--run {text!r}: expected NAME=RUN_DIR[:UNTRAINED_EVAL.json]"
        )
    return name, Path(path), Path(untrained) if untrained else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run",
        type=_run_argument,
        action="append",
        required=True,
        help="NAME=RUN_DIR[:UNTRAINED_EVAL.json], the last teamtr eval's result of the "
        "untrained team (the first checkpoint's change is measured from it)",
    )
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    rows = []
    for name, run_dir, untrained_eval in args.run:
        try:
            stages = read_stages(run_dir)
            untrained = held_out(json.loads(untrained_eval.read_text())) if untrained_eval else None
        except (OSError, ConfigError, json.JSONDecodeError, KeyError) as error:
            parser.error(f"--run {name}: cannot read {run_dir} ({error})")
        if not measured_updates(stages):
            parser.error(f"--run {name}: no update measured ([stage] certificate_groups = 0?)")
        rows.append(summary(name, stages, untrained))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
