"""How fast HAPPO's importance weights collapse along a stage, from its runs' stage records.

HAPPO trains the k-th agent of a stage on the stage-start batch, each dialogue weighted by the
ratio of the k agents updated before it to their stage-start policies. The batch then estimates
the intermediate team's surrogate from as many independent dialogues as its effective sample
size (Kish's (Σw)² / (N Σw²), ``llm.update.outcome.effective_sample_size``) says, as a share of
the batch. This reads ``updates[k].effective_sample_size`` of every stage of every given
``metrics.jsonl`` and reports, per update position k = 1..n, the mean ± standard error over
the stages (and the smallest seen): the step-size map gives the mean alone, per seed; this
shows how the size spreads over one run's stages (docs/eight_agents.md: HAPPO's seed 2 at
n = 8).

Usage::

    python -m studies.llm.weight_collapse --metrics results/eight_metrics/happo-d02-s2.jsonl \\
        --json results/eight/happo_weights.json --markdown
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from studies.llm.run_records import mean_and_error
from studies.llm.step_size_map import sizes_by_position


def read_stages(path: Path) -> list[dict[str, Any]]:
    """The stage records of one ``metrics.jsonl`` (one JSON object a line, blank lines skipped)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def collapse(stages: list[dict[str, Any]]) -> list[dict[str, float | None]]:
    """Per update position, over the stages: the effective sample size's mean ± standard error,
    the number of stages and the smallest value. ValueError where a stage's updates carry no
    effective sample size (records written before it was kept) or no stage has an update."""
    rows = []
    for sizes in sizes_by_position(stages):
        stat = mean_and_error(sizes)
        rows.append({"mean": stat["mean"], "standard_error": stat["standard_error"],
                     "stages": float(len(sizes)), "smallest": min(sizes)})  # fmt: skip
    return rows


def markdown(summary: dict[str, Any]) -> str:
    """One row: the effective sample size at each update position (mean ± s.e., smallest)."""
    rows = summary["by_position"]
    head = " | ".join(f"update {k + 1}" for k in range(len(rows)))
    cells = []
    for row in rows:
        text = f"{row['mean']:.2f}"
        if row["standard_error"] is not None:
            text += f" ± {row['standard_error']:.2f}"
        cells.append(f"{text} (min {row['smallest']:.2f})")
    return "\n".join([
        f"| runs | stages | {head} |",
        "|---|---|" + "---|" * len(rows),
        f"| {', '.join(summary['runs'])} | {summary['stages']} | {' | '.join(cells)} |",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metrics", type=Path, nargs="+", required=True,
                        help="metrics.jsonl of HAPPO runs (named by their file stem)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--markdown", action="store_true", help="print the table")
    args = parser.parse_args(argv)
    stages = []
    for path in args.metrics:
        try:
            stages += read_stages(path)
        except (OSError, json.JSONDecodeError) as error:
            print(f"error: --metrics {path}: cannot read ({error})", file=sys.stderr)
            return 2
    try:
        rows = collapse(stages)
    except (ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    summary = {"runs": [p.stem for p in args.metrics], "stages": len(stages), "by_position": rows}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    if args.markdown:
        print(markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
