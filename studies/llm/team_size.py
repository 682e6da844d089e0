"""Team size (docs/eight_agents.md): the schemes' gap read against n, from one step-size map per n.

The papers' prediction: the stale scheme's occupancy shift grows as n² and TeamTR's as n, so
TeamTR − stale, trained at equal CPU, should grow with n. Each n has its own study
(``studies.llm.step_size_map`` of its runs: n = 4 is the map, n = 2 and n = 8 the relay chain's
other sizes at the same δ and learning-rate rule); this reads one map per n at one δ and lays
out, per n,

- each scheme's held-out turn credit at the budget, its mean over the budget (the area under
  the held-out curve over the budget: not capped where both schemes reach 1.0 before the
  budget) and final accuracy (mean ± standard error over seeds), its stages, tokens and CPU per
  stage and regressions per run;
- the paired difference TeamTR − stale (and every other scheme − stale), seed by seed
  (``step_size_map.paired_differences``), and how many standard errors it is from 0.

Usage::

    python -m studies.llm.team_size --radius 0.2 --map 2=results/two_map.json \\
        --map 4=results/stepsize_map.json --map 8=results/eight_map.json \\
        --json results/team_size.json --plot figures/team_size.png --markdown
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from studies.llm.step_size_map import stat_cell

ROW_KEYS = (
    "turn_credit_at_budget",
    "turn_credit_mean_to_budget",
    "accuracy",
    "regressions_turn_credit",
    "stages",
    "generated_tokens_per_stage",
    "cpu_seconds_per_stage",
)
"""What each (n, scheme) row carries over from its map's row."""


def parse_map(text: str) -> tuple[int, Path]:
    """``N=PATH`` -> (N, PATH); ValueError on anything else."""
    n, separator, path = text.partition("=")
    if not separator or not n.isdigit() or int(n) < 1 or not path:
        raise ValueError(f"--map {text!r}: expected N=PATH with N the number of agents")
    return int(n), Path(path)


def standard_errors_from_zero(stat: dict[str, float | None]) -> float | None:
    """mean / standard error (None with one pair or no spread)."""
    error = stat["standard_error"]
    return None if not error else stat["mean"] / error  # type: ignore[operator]


def team_size(maps: dict[int, dict[str, Any]], radius: float) -> dict[str, Any]:
    """Per n, the rows and paired differences of ``maps[n]`` at ``radius``."""
    rows, paired = [], []
    for n in sorted(maps):
        summary = maps[n]
        for row in summary["rows"]:
            if row["radius"] == radius:
                kept = {key: row[key] for key in ROW_KEYS}
                rows.append({"n": n, "scheme": row["scheme"], "seeds": row["seeds"], **kept})
        for row in summary.get("paired", []):
            if row["radius"] == radius:
                z = standard_errors_from_zero(row["turn_credit_at_budget"])
                z_mean = standard_errors_from_zero(row["turn_credit_mean_to_budget"])
                paired.append({"n": n, **row, "standard_errors_from_zero": z,
                               "mean_standard_errors_from_zero": z_mean})  # fmt: skip
    return {"radius": radius, "rows": rows, "paired": paired}


def markdown(summary: dict[str, Any]) -> str:
    """The per-n table, then the paired differences."""
    lines = [
        "| n | scheme | seeds | turn credit at the budget | mean over the budget | final accuracy "
        "| regressions per run | stages | tokens / stage | CPU s / stage |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        lines.append(
            f"| {row['n']} | {row['scheme']} | {row['seeds']} | "
            f"{stat_cell(row['turn_credit_at_budget'], 3)} | "
            f"{stat_cell(row['turn_credit_mean_to_budget'], 3)} | "
            f"{stat_cell(row['accuracy'], 1, 100)}% | "
            f"{stat_cell(row['regressions_turn_credit'], 2)} | {stat_cell(row['stages'], 1)} | "
            f"{row['generated_tokens_per_stage']['mean']:.0f} | "
            f"{row['cpu_seconds_per_stage']['mean']:.0f} |"
        )
    lines += [
        "",
        "| n | paired difference | seeds | turn credit at the budget | standard errors from 0 "
        "| above on | mean over the budget | standard errors from 0 | final accuracy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["paired"]:
        pairs = len(row["seeds"])
        z, z_mean = row["standard_errors_from_zero"], row["mean_standard_errors_from_zero"]
        lines.append(
            f"| {row['n']} | {row['scheme']} − {row['baseline']} | {pairs} | "
            f"{stat_cell(row['turn_credit_at_budget'], 3)} | {'–' if z is None else f'{z:.1f}'} | "
            f"{row['turn_credit_at_budget_above']} of {pairs} | "
            f"{stat_cell(row['turn_credit_mean_to_budget'], 3)} | "
            f"{'–' if z_mean is None else f'{z_mean:.1f}'} | "
            f"{stat_cell(row['accuracy'], 1, 100)} points |"
        )
    return "\n".join(lines)


def plot(summary: dict[str, Any], destination: Path) -> Path:
    """Left: each scheme's turn credit at the budget against n; right: each paired difference
    from stale against n, at the budget (dots: the seeds' differences) and in the mean over the
    budget (dashed), mean ± s.e."""
    from studies.figures import plt, save_figure

    figure, (levels, gaps) = plt.subplots(1, 2, figsize=(13, 4.2))
    schemes = sorted({row["scheme"] for row in summary["rows"]})
    for index, scheme in enumerate(schemes):
        colour = f"C{index}"
        rows = [row for row in summary["rows"] if row["scheme"] == scheme]
        levels.errorbar(
            [row["n"] for row in rows],
            [row["turn_credit_at_budget"]["mean"] for row in rows],
            yerr=[row["turn_credit_at_budget"]["standard_error"] or 0.0 for row in rows],
            marker="o", color=colour, capsize=3, label=scheme,
        )  # fmt: skip
        differences = [row for row in summary["paired"] if row["scheme"] == scheme]
        if not differences:
            continue
        gaps.errorbar(
            [row["n"] for row in differences],
            [row["turn_credit_at_budget"]["mean"] for row in differences],
            yerr=[row["turn_credit_at_budget"]["standard_error"] or 0.0 for row in differences],
            marker="o", color=colour, capsize=3, label=f"{scheme} − stale",
        )  # fmt: skip
        gaps.errorbar(
            [row["n"] for row in differences],
            [row["turn_credit_mean_to_budget"]["mean"] for row in differences],
            yerr=[row["turn_credit_mean_to_budget"]["standard_error"] or 0.0 for row in differences],
            marker="s", linestyle="--", color=colour, capsize=3, alpha=0.6,
            label=f"{scheme} − stale, mean over the budget",
        )  # fmt: skip
        for row in differences:
            seeds = row["turn_credit_at_budget_differences"]
            gaps.plot([row["n"]] * len(seeds), seeds, ".", color=colour, alpha=0.5)
    gaps.axhline(0.0, color="grey", linewidth=0.8)
    ticks = sorted({row["n"] for row in summary["rows"]})
    for axes in (levels, gaps):
        axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, [str(n) for n in ticks])
        axes.set_xlabel("agents n")
    levels.legend()
    # Beside the axes: the differences and their seeds spread over the whole panel.
    gaps.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    levels.set_ylabel("held-out turn credit at the CPU budget")
    gaps.set_ylabel("paired difference from stale (turn credit)")
    figure.suptitle(f"δ = {summary['radius']:g} nats per turn, each n at its own budget")
    return save_figure(figure, destination)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--map", action="append", required=True, help="N=PATH of a map's JSON")
    parser.add_argument("--radius", type=float, required=True, help="δ to read at")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--plot", type=Path, help="write the figure here")
    parser.add_argument("--markdown", action="store_true", help="print the tables")
    args = parser.parse_args(argv)
    maps = {}
    for text in args.map:
        try:
            n, path = parse_map(text)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if not path.is_file():
            print(f"error: --map {text}: no such file", file=sys.stderr)
            return 2
        maps[n] = json.loads(path.read_text())
    summary = team_size(maps, args.radius)
    if not summary["rows"]:
        print(f"error: no map has runs at δ = {args.radius:g}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    if args.plot:
        plot(summary, args.plot)
    if args.markdown:
        print(markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
