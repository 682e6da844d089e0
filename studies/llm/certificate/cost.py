"""What the measured certificate's held-out pairs cost a run, beside the same run without them,
and the least any held-out scheme could cost for the same pairs.

For each ``--run NAME=WITH_PAIRS:WITHOUT`` (two ``teamtr train`` run directories of one config
and seed, run side by side) it reads the stages' process CPU time (``cpu_seconds`` of
``metrics.jsonl``) and every measured update's pairs, and reports:

- the held-out CPU: the stages' CPU with pairs minus without, per pair, and the ratio of the
  two runs' CPU;
- the bar's budget a pair: (bar - 1) x the CPU without / the pairs drawn, what a pair may cost
  for the run to stay within ``--bar`` times the run without;
- the floor: what these pairs' turns alone would cost at ``bench/held_out_play_cost.py``'s
  per-dialogue slope (its ``--play-cost`` JSON, at the run's precision): every pair plays at
  least one turn of its continuation, and the run's first update's old sides are played whole
  (no earlier draw of that team exists to continue), so at least turns x n_1 + sum_k n_k
  dialogue-turns, each at slope / turns (the bench plays whole dialogues, so this is the
  average of their turns; a continuation's later turn reads a longer context and costs
  somewhat more). A play's fixed cost (its decoding steps, paid once per play whatever its
  rows) is left out: the floor is what these pairs would cost at any batching;
- the floor at the information limit: were every measured update of the run to gain +0.10
  with pairs spread as the gaining updates' of all runs given (their mean standard deviation
  sigma), each would need n* = 2 log(1/alpha) sigma^2 / 0.10^2 pairs at the least (the
  leading term of every bound here, to which their finite-n terms only add), and the floor
  of those pairs.

The two runs draw the same problems only until the first held-out draw, which moves the
sampler's generator: after it they train on other batches, so their stages are compared in
total, not one by one (docs/measured_certificate.md).

Usage::

    python -m studies.llm.certificate.cost \\
        --run s0=results/measured_certificate/run_records/x-g32b32-s0:\\
results/measured_certificate/run_records/x-none-s0 ... \\
        --play-cost results/measured_certificate/held_out_play_cost.json --json out.json
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
from studies.llm.certificate.measured_table import measured_updates, read_stages

BAR = 1.5
"""The ratio to the run without pairs that the measured certificate aims to stay within (the
bar of docs/measured_certificate.md)."""

GAIN = 0.10
"""The gain every update that reaches it should have certified (the bar's other half)."""


def parse_run(text: str) -> tuple[str, Path, Path]:
    """``NAME=WITH_PAIRS:WITHOUT``."""
    name, _, rest = text.partition("=")
    parts = rest.split(":")
    if not name or len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"--run {text!r}: expected NAME=WITH_PAIRS:WITHOUT")
    return name, Path(parts[0]), Path(parts[1])


def run_precision(stages: Sequence[dict[str, Any]]) -> str:
    """The precision the run drew in, from its updates' ``drawn_by`` ("hf, bfloat16, ...")."""
    for stage in stages:
        for update in stage["updates"]:
            drawn_by = update.get("drawn_by")
            if drawn_by:
                return str(drawn_by).split(",")[1].strip()
    raise ConfigError("the run's records do not say what drew its dialogues (drawn_by)")


def turns_of(run_dir: Path) -> int:
    """The dialogues' turns (``[sampler] turns`` of the run's config.json)."""
    config = json.loads((run_dir / "config.json").read_text())
    return int(config["sampler"]["turns"])


def floor_turns(pairs: Sequence[int], turns: int) -> int:
    """The dialogue-turns no held-out scheme can play fewer of for ``pairs`` (each update's, in
    order): the first update's old sides played whole (no earlier draw of that team exists to
    continue), and one continuation turn a pair."""
    return turns * pairs[0] + sum(pairs)


def run_cost(
    with_pairs: Path, without: Path, play_cost: dict[str, Any], bar: float = BAR
) -> dict[str, Any]:
    """One run's held-out cost against its run without pairs, and its floor."""
    stages, plain = read_stages(with_pairs), read_stages(without)
    if len(stages) != len(plain):
        raise ConfigError(
            f"{with_pairs} has {len(stages)} stages, {without} {len(plain)}: "
            "compare runs of the same length"
        )
    if measured_updates(plain):
        raise ConfigError(f"{without} measured its updates: it is not a run without pairs")
    updates = measured_updates(stages)
    if not updates:
        raise ConfigError(f"{with_pairs} measured no update")
    pairs = [int(u["measured"]["n"]) for u in updates]
    cpu = sum(float(s["cpu_seconds"]) for s in stages)
    cpu_without = sum(float(s["cpu_seconds"]) for s in plain)
    precision = run_precision(stages)
    if precision not in play_cost:
        raise ConfigError(f"the play-cost report has no {precision} line (--dtypes {precision})")
    turns = turns_of(with_pairs)
    per_turn = float(play_cost[precision]["per_dialogue_seconds"]) / turns
    floor = per_turn * floor_turns(pairs, turns)
    held_out = cpu - cpu_without
    gaining = [u["measured"] for u in updates if u["measured"]["mean"] >= GAIN]
    level = float(updates[0]["measured"]["level"])
    return {
        "pairs": pairs,
        "certified": [bool(u["measured"]["bound"] > 0) for u in updates],
        "means": [float(u["measured"]["mean"]) for u in updates],
        "gaining": len(gaining),
        "gaining_certified": sum(m["bound"] > 0 for m in gaining),
        "cpu_seconds": cpu,
        "cpu_seconds_without": cpu_without,
        "held_out_cpu_seconds": held_out,
        "per_pair": held_out / sum(pairs),
        "ratio": cpu / cpu_without,
        "bar": bar,
        "bar_budget_per_pair": (bar - 1.0) * cpu_without / sum(pairs),
        "precision": precision,
        "floor_dialogue_turns": floor_turns(pairs, turns),
        "floor_cpu_seconds": floor,
        "floor_per_pair": floor / sum(pairs),
        "floor_ratio": (cpu_without + floor) / cpu_without,
        "alpha": 1.0 - level,
        "turns": turns,
        "per_dialogue_turn_seconds": per_turn,
        "gaining_sds": [float(m["sd"]) for m in gaining if m.get("sd") is not None],
    }


def information_limit(rows: dict[str, dict[str, Any]], gain: float = GAIN) -> dict[str, Any] | None:
    """The floor of every run were each of its measured updates to gain ``gain`` with pairs
    spread as the gaining updates' of all ``rows`` (None where none gained ``gain``)."""
    spreads = [sd for row in rows.values() for sd in row["gaining_sds"]]
    if not spreads:
        return None
    sd = statistics.fmean(spreads)
    alpha = max(row["alpha"] for row in rows.values())
    pairs = math.ceil(2.0 * math.log(1.0 / alpha) * sd**2 / gain**2)
    runs = {}
    for name, row in rows.items():
        turns = floor_turns([pairs] * len(row["pairs"]), row["turns"])
        seconds = row["per_dialogue_turn_seconds"] * turns
        runs[name] = {
            "dialogue_turns": turns,
            "cpu_seconds": seconds,
            "ratio": (row["cpu_seconds_without"] + seconds) / row["cpu_seconds_without"],
        }
    return {"gain": gain, "sd": sd, "alpha": alpha, "pairs_per_update": pairs, "runs": runs}


def limit_line(limit: dict[str, Any]) -> str:
    """The information limit's floor in one line."""
    ratios = [run["ratio"] for run in limit["runs"].values()]
    return (
        f"information limit: +{limit['gain']:.2f} at the gaining updates' mean spread "
        f"{limit['sd']:.3f} needs {limit['pairs_per_update']} pairs an update; every update "
        f"there, the floor is {min(ratios):.2f}x to {max(ratios):.2f}x"
    )


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The report as a markdown table."""
    lines = [
        f"| run | pairs each (c: certified) | gaining +{GAIN:.2f}: certified "
        "| CPU-s with / without | held out a pair | ratio | bar's budget a pair "
        "| floor a pair | floor ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        pairs = ", ".join(
            f"{n}{'c' if c else ''}" for n, c in zip(r["pairs"], r["certified"], strict=True)
        )
        lines.append(
            f"| {name} | {pairs} | {r['gaining_certified']} of {r['gaining']} "
            f"| {r['cpu_seconds']:.1f} / {r['cpu_seconds_without']:.1f} "
            f"| {r['per_pair']:.3f} | {r['ratio']:.2f}x | {r['bar_budget_per_pair']:.3f} "
            f"| {r['floor_per_pair']:.3f} | {r['floor_ratio']:.2f}x |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m studies.llm.certificate.cost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--run", type=parse_run, action="append", required=True)
    parser.add_argument("--play-cost", type=Path, required=True, help="held_out_play_cost's JSON")
    parser.add_argument("--bar", type=float, default=BAR, help="the ratio a run should keep")
    parser.add_argument("--json", type=Path, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        play_cost = json.loads(args.play_cost.read_text())
        rows = {name: run_cost(w, wo, play_cost, args.bar) for name, w, wo in args.run}
    except (OSError, ValueError, KeyError, ConfigError) as error:
        print(f"studies.llm.certificate.cost: {error}", file=sys.stderr)
        return 2
    print(table(rows))
    limit = information_limit(rows)
    if limit is not None:
        print(limit_line(limit))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"runs": rows, "information_limit": limit}
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
