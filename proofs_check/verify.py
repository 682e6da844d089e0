"""``teamtr verify``: every check of ``proofs_check.checks`` on N seeded random instances.

Outside hypothesis: instance seeds 0 .. N-1, the same for every run, so a violation printed
here is reproduced by ``proofs_check.checks.CHECKS_BY_NAME[name].function(seed)``. Prints one
row per check (instances, violations, min and median slack), optionally writes JSON, and exits
1 if any check is violated.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from proofs_check.checks import CHECKS, Check


@dataclass(frozen=True)
class CheckSummary:
    """One row of the verify table (and of its JSON)."""

    name: str
    instances: int
    violations: int
    """Instances with slack < 0 (or a non-finite slack, or an exception)."""
    min_slack: float
    median_slack: float
    worst_seed: int
    """The instance seed of the smallest slack: ``CHECKS_BY_NAME[name].function(worst_seed)``."""


def summarise(name: str, seeds: Sequence[int], slacks: Sequence[float]) -> CheckSummary:
    """Count violations (slack < 0, or not finite) and the slack statistics of one check."""
    values = np.asarray(slacks, dtype=np.float64)
    if values.size == 0:
        raise ValueError(f"check {name} was run on no instance")
    bad = ~np.isfinite(values) | (values < 0)
    # A non-finite slack is a violation and counts as the worst one.
    ordered = np.where(np.isfinite(values), values, -math.inf)
    worst = int(np.argmin(ordered))
    return CheckSummary(
        name=name,
        instances=int(values.size),
        violations=int(bad.sum()),
        min_slack=float(ordered[worst]),
        median_slack=float(np.median(ordered)),
        worst_seed=int(seeds[worst]),
    )


def run_check(check: Check, seeds: Iterable[int], progress: Callable[[], None]) -> CheckSummary:
    """Run one check on every seed; an exception on an instance counts as a violation."""
    seed_list = list(seeds)
    slacks = []
    for seed in seed_list:
        try:
            slacks.append(float(check.function(seed)))
        except Exception as error:  # noqa: BLE001 - reported, and counted as a violation
            print(f"{check.name}: seed {seed} raised {error!r}", file=sys.stderr)
            slacks.append(math.nan)
        progress()
    return summarise(check.name, seed_list, slacks)


def run_checks(
    checks: Sequence[Check], n_seeds: int, show_progress: bool = True
) -> list[CheckSummary]:
    """Every check on instance seeds 0 .. n_seeds-1, with a tqdm bar on stderr."""
    from tqdm import tqdm

    with tqdm(
        total=len(checks) * n_seeds,
        desc="teamtr verify",
        unit="instance",
        file=sys.stderr,
        # A bar redraws with carriage returns: only on a terminal, never into a log file.
        disable=not (show_progress and sys.stderr.isatty()),
    ) as bar:
        return [run_check(check, range(n_seeds), lambda: bar.update(1)) for check in checks]


def format_table(summaries: Sequence[CheckSummary]) -> str:
    """The printed table: check, instances, violations, min slack, median slack."""
    width = max(len("check"), *(len(s.name) for s in summaries))
    lines = [f"{'check':<{width}}  instances  violations  {'min slack':>11}  {'median slack':>12}"]
    for s in summaries:
        lines.append(
            f"{s.name:<{width}}  {s.instances:>9}  {s.violations:>10}  "
            f"{s.min_slack:>11.3e}  {s.median_slack:>12.3e}"
        )
    return "\n".join(lines)


def to_json(summaries: Sequence[CheckSummary]) -> dict[str, list[dict[str, object]]]:
    """``{"checks": [{"name", "instances", "violations", "min_slack", "median_slack", ...}]}``.

    Non-finite slacks are written as null (JSON has no infinities).
    """
    rows = []
    for s in summaries:
        row: dict[str, object] = asdict(s)
        for key in ("min_slack", "median_slack"):
            value = row[key]
            assert isinstance(value, float)
            row[key] = value if math.isfinite(value) else None
        rows.append(row)
    return {"checks": rows}


def report(summaries: Sequence[CheckSummary], json_path: Path | None) -> int:
    """Print the table, write the JSON, and return the exit code (1 if any violation)."""
    print(format_table(summaries))
    violated = [s for s in summaries if s.violations]
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(to_json(summaries), indent=2) + "\n")
    if violated:
        for s in violated:
            print(
                f"VIOLATED: {s.name} on {s.violations}/{s.instances} instances "
                f"(worst: seed {s.worst_seed}, slack {s.min_slack:.3e})",
                file=sys.stderr,
            )
        return 1
    total = sum(s.instances for s in summaries)
    print(f"all {len(summaries)} checks hold on {total} instances")
    return 0


def build_parser(prog: str) -> argparse.ArgumentParser:
    """Options of ``teamtr verify``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Check every lemma and theorem of THEORY.md §2 on seeded random instances by "
            "exact evaluation. Slack = bound side minus the quantity bounded (>= 0 holds)."
        ),
    )
    parser.add_argument(
        "--seeds", type=int, default=50, help="instances per check (seeds 0 .. N-1)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the table as JSON")
    parser.add_argument(
        "--check",
        action="append",
        choices=[c.name for c in CHECKS],
        default=None,
        help="run only this check (repeatable); default: all",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def run(args: argparse.Namespace) -> int:
    """``teamtr verify``: run the checks, print the table, exit 1 on any violation."""
    if args.seeds < 1:
        print(f"teamtr verify: --seeds must be >= 1, got {args.seeds}", file=sys.stderr)
        return 2
    selected = [c for c in CHECKS if args.check is None or c.name in args.check]
    summaries = run_checks(selected, args.seeds, show_progress=not args.no_progress)
    return report(summaries, args.json)
