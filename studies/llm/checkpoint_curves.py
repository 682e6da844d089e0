"""Held-out learning curves from a run's checkpoints, evaluated after the fact.

A seed study's runs evaluate every ``eval_every`` stages with the metrics of their time; this
command evaluates every stage checkpoint of every run with today's evaluation (e.g. the chain's
``turn_credit``, the share of turns that state the running total), so that curves and
regressions can be read from stages the training never evaluated. The model is loaded once per
run and every checkpoint's adapters are put into it in turn (greedy decoding, the run's own
config and held-out set). Each run's file is written as soon as it is complete, and a run whose
file exists is skipped: rerunning the command resumes.

Usage::

    python -m studies.llm.checkpoint_curves --runs runs/chain4 --results results/chain4_curves
    python -m studies.llm.checkpoint_curves --summarise-only --results results/chain4_curves \
        --untrained results/chain4/untrained_teamtr.json --markdown --plot figures/chain4.png

writes ``RESULTS/<run>.json``: per checkpoint stage, the evaluation's metrics and the stage's
end on the run's budget clock (``stage_ends_minutes``). The summary groups runs by method (the
run name before ``-s<seed>``): the final metric's mean ± standard error over seeds, and per run
the regressions, checkpoints whose metric fell by more than twice the standard error of the
difference below the one before (the untrained team first, when given).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from studies.llm.run_records import (
    budget_clock_minutes,
    held_out,
    held_out_drops,
    mean_and_error,
    stage_ends_minutes,
    training_cpu_ends,
    value_at,
)


def run_directories(runs: Path) -> list[Path]:
    """The run directories under ``runs`` (those holding a ``config.json``), sorted by name."""
    return sorted(p for p in runs.iterdir() if (p / "config.json").is_file())


def logged_stages(run_dir: Path) -> list[dict[str, Any]]:
    """The run's stage records, one per line of its ``metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def stage_minutes(run_dir: Path, stages: list[dict[str, Any]]) -> list[float]:
    """Each stage's end on the run's budget clock, from its ``stages`` and the run record."""
    used = budget_clock_minutes(run_dir)
    return stage_ends_minutes({"stages": stages, "budget_clock_minutes_used": used})


def training_cpu_minutes(stages: list[dict[str, Any]]) -> list[float | None]:
    """Each stage's end in training CPU minutes (``training_cpu_ends``), None for every stage
    of a run recorded before stages kept their CPU time."""
    ends = training_cpu_ends({"stages": stages})
    return [None] * len(stages) if ends is None else list(ends)


def evaluate_checkpoints(run_dir: Path, progress: bool) -> dict[str, Any]:
    """Every stage checkpoint of ``run_dir`` evaluated greedily on the run's held-out set."""
    from llm.common.config import load_config
    from llm.evaluation.held_out_problems import evaluate_team
    from llm.models.agents import LoraTeam
    from llm.training.builder import build, problem_sources
    from llm.training.checkpoint import find_policies, stage_directories

    config = load_config(run_dir / "config.json")
    problems = problem_sources(config)[1]
    parts = build(config, progress=progress)
    stages = logged_stages(run_dir)
    minutes = stage_minutes(run_dir, stages)
    cpu_minutes = training_cpu_minutes(stages)
    curve = []
    for directory in stage_directories(run_dir):
        stage = int(directory.name.rsplit("_", 1)[1])
        found = find_policies(run_dir, stage, config.team.n_policies)
        team = LoraTeam(parts.team.backbone, found.policies)
        started = time.process_time()
        metrics = evaluate_team(team, parts.sampler, problems, progress=progress)
        curve.append(
            {
                "stages_trained": stage,
                "budget_minutes": minutes[stage - 1] if 0 < stage <= len(minutes) else None,
                "training_cpu_minutes": (
                    cpu_minutes[stage - 1] if 0 < stage <= len(cpu_minutes) else None
                ),
                "eval_cpu_seconds": time.process_time() - started,
                "metrics": metrics,
            }
        )
    return {"run": run_dir.name, "scheme": config.stage.scheme, "curve": curve}


def method_of(run: str) -> str:
    """``teamtr-s2`` -> ``teamtr`` (the seed study's run names)."""
    name, _, seed = run.rpartition("-s")
    return name if name and seed.isdigit() else run


def stage_costs(run_dir: Path) -> dict[str, float]:
    """What a run's stages cost and how often an agent's batch carried a reward signal, from
    its ``metrics.jsonl``: generated tokens per stage, the share of agent updates whose batch
    held a group with differing rewards (``batch_signal_groups``), and the updates that moved
    the policy (kept, with a KL above 0)."""
    stages = logged_stages(run_dir)
    batches = [groups for stage in stages for groups in stage.get("batch_signal_groups", [])]
    updates = [update for stage in stages for update in stage["updates"]]
    return {
        "stages": float(len(stages)),
        "generated_tokens_per_stage": float(np.mean([s["generated_tokens"] for s in stages])),
        "groups_drawn_per_stage": float(np.mean([s.get("groups_drawn", 0) for s in stages])),
        "agent_batches_with_signal": float(np.mean([g > 0 for g in batches])) if batches else 0.0,
        "updates_that_moved": float(sum(u["kept"] and u["kl"] > 0 for u in updates)),
        "agent_updates": float(len(updates)),
    }


def training_clock(curves: list[dict[str, Any]]) -> str:
    """The x axis of the curves: each checkpoint's training CPU minutes when every checkpoint
    has them (runs whose stages record their CPU time), else its end on the budget clock."""
    points = [p for curve in curves for p in curve["curve"]]
    if all(p.get("training_cpu_minutes") is not None for p in points):
        return "training_cpu_minutes"
    return "budget_minutes"


def minutes_to_reach(curve: list[dict[str, Any]], metric: str, level: float, clock: str):
    """The ``clock`` minutes of the first checkpoint whose ``metric`` is at least ``level``
    (None when no checkpoint reaches it)."""
    return next((p[clock] for p in curve if p["metrics"][metric] >= level), None)


def summarise(
    curves: list[dict[str, Any]],
    metric: str,
    untrained: dict[str, float] | None,
    runs_dir: Path | None = None,
    reach: float | None = None,
    at: float | None = None,
) -> dict[str, Any]:
    """Per method: the last checkpoint's ``metric`` (mean ± s.e. over runs), its accuracy, the
    regressions of every run, and every run's curve against ``training_clock``; with
    ``runs_dir`` (the run directories, where still present) also what the stages cost
    (``stage_costs``); with ``reach``, the minutes each run took to reach that ``metric``; with
    ``at``, every run's ``metric`` at that many minutes (``value_at``: linear between the
    checkpoints either side, from the untrained team at 0), the comparison at equal CPU."""
    methods: dict[str, list[dict[str, Any]]] = {}
    for curve in curves:
        methods.setdefault(method_of(curve["run"]), []).append(curve)
    clock = training_clock(curves)
    summary: dict[str, Any] = {"metric": metric, "clock": clock, "methods": {}}
    if untrained is not None:
        summary["untrained"] = {metric: untrained[metric], "accuracy": held_out(untrained)}
    for method, runs in sorted(methods.items()):
        final = mean_and_error([run["curve"][-1]["metrics"][metric] for run in runs])
        accuracy = mean_and_error([held_out(run["curve"][-1]["metrics"]) for run in runs])
        start = [] if untrained is None else [untrained]
        summary["methods"][method] = {
            "runs": [run["run"] for run in runs],
            "final": final["mean"],
            "final_standard_error": final["standard_error"],
            "final_accuracy": accuracy["mean"],
            "final_accuracy_standard_error": accuracy["standard_error"],
            "checkpoints": [len(run["curve"]) for run in runs],
            "regressions": [
                held_out_drops(start + [p["metrics"] for p in run["curve"]], metric) for run in runs
            ],
            "curves": [[(p[clock], p["metrics"][metric]) for p in run["curve"]] for run in runs],
        }
        if reach is not None:
            reached = [minutes_to_reach(run["curve"], metric, reach, clock) for run in runs]
            summary["methods"][method]["reach"] = {
                "level": reach,
                "minutes": reached,
                # Over seeds only when every run got there (a run that did not is no time).
                "mean": mean_and_error(reached) if None not in reached else None,
            }
        if at is not None:
            origin = [] if untrained is None else [(0.0, untrained[metric])]
            values = [
                value_at(origin + [(p[clock], p["metrics"][metric]) for p in run["curve"]], at)
                for run in runs
            ]
            summary["methods"][method]["at"] = {"minutes": at, "values": values}
            summary["methods"][method]["at"].update(mean_and_error(values))
        present = [] if runs_dir is None else [runs_dir / run["run"] for run in runs]
        if present and all((d / "metrics.jsonl").is_file() for d in present):
            costs = [stage_costs(d) for d in present]
            summary["methods"][method]["costs"] = {
                key: float(np.mean([c[key] for c in costs])) for key in costs[0]
            }
    return summary


def _with_error(
    mean: float, error: float | None, digits: int, scale: float = 1.0, unit: str = ""
) -> str:
    """``mean`` (times ``scale``, with ``unit``) ± its standard error, where there is one."""
    text = f"{scale * mean:.{digits}f}{unit}"
    return text if error is None else f"{text} ± {scale * error:.{digits}f}"


def markdown(summary: dict[str, Any]) -> str:
    metric = summary["metric"]
    costs = all("costs" in row for row in summary["methods"].values())
    reach = all("reach" in row for row in summary["methods"].values()) and summary["methods"]
    extra = (
        " tokens per stage | agent batches with a signal | updates that moved |" if costs else ""
    )
    if reach:
        level = next(iter(summary["methods"].values()))["reach"]["level"]
        extra += f" minutes to {metric} {level:g}, per run |"
    at = all("at" in row for row in summary["methods"].values()) and summary["methods"]
    if at:
        minutes = next(iter(summary["methods"].values()))["at"]["minutes"]
        extra += f" {metric} at {minutes:g} minutes (mean ± s.e.) | per run |"
    lines = [
        f"| method | final {metric} (mean ± s.e.) | final accuracy | checkpoints | regressions |"
        + extra,
        "|---|---|---|---|---|"
        + "---|---|---|" * costs
        + "---|" * bool(reach)
        + "---|---|" * bool(at),
    ]
    if "untrained" in summary:
        untrained = summary["untrained"]
        lines.append(
            f"| untrained | {untrained[metric]:.3f} | {100 * untrained['accuracy']:.1f}% | 0 | — |"
            + " — | — | — |" * costs
            + " — |" * bool(reach)
            + " — | — |" * bool(at)
        )
    for method, row in summary["methods"].items():
        lines.append(
            f"| {method} | {_with_error(row['final'], row['final_standard_error'], 3)} | "
            f"{_with_error(row['final_accuracy'], row['final_accuracy_standard_error'], 1, 100, '%')} | "
            f"{', '.join(map(str, row['checkpoints']))} | "
            f"{', '.join(map(str, row['regressions']))} |"
            + (
                f" {row['costs']['generated_tokens_per_stage']:.0f} |"
                f" {100 * row['costs']['agent_batches_with_signal']:.0f}% |"
                f" {row['costs']['updates_that_moved']:.1f} of {row['costs']['agent_updates']:.1f} |"
                if costs
                else ""
            )
            + (f" {_reached(row['reach']['minutes'])} |" if reach else "")
            + (
                f" {_with_error(row['at']['mean'], row['at']['standard_error'], 3)} |"
                f" {', '.join(f'{v:.2f}' for v in row['at']['values'])} |"
                if at
                else ""
            )
        )
    return "\n".join(lines)


def _reached(minutes: list[float | None]) -> str:
    return ", ".join("never" if m is None else f"{m:.1f}" for m in minutes)


def plot(summary: dict[str, Any], destination: Path) -> None:
    """Every run's curve of the metric against the budget clock, one colour per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    start = summary.get("untrained", {}).get(summary["metric"])
    for colour, (method, row) in zip(colours, summary["methods"].items(), strict=False):
        for index, curve in enumerate(row["curves"]):
            xs = [0.0] * (start is not None) + [x for x, _ in curve]
            ys = [start] * (start is not None) + [y for _, y in curve]
            axes.plot(xs, ys, "o-", color=colour, alpha=0.8, label=method if index == 0 else None)
    axes.set_xlabel(
        "training CPU minutes (evaluations excluded)"
        if summary.get("clock") == "training_cpu_minutes"
        else "budget clock (minutes)"
    )
    axes.set_ylabel(f"held-out {summary['metric']}")
    axes.set_title("held-out curve of every run, from its checkpoints")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    destination.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(destination, dpi=120)
    plt.close(figure)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m studies.llm.checkpoint_curves", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=Path, help="parent of the run directories")
    parser.add_argument("--results", type=Path, required=True, help="folder of per-run files")
    parser.add_argument(
        "--more-results",
        type=Path,
        nargs="*",
        default=[],
        help="further folders of per-run files, summarised with --results (never written)",
    )
    parser.add_argument("--only", nargs="*", default=None, help="run names (default: every run)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument(
        "--summarise-only", action="store_true", help="only summarise the per-run files"
    )
    parser.add_argument("--metric", default="turn_credit", help="the summary's metric")
    parser.add_argument("--untrained", type=Path, help="`teamtr eval` JSON of the untrained team")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--plot", type=Path, help="draw every run's curve here (PNG)")
    parser.add_argument("--markdown", action="store_true", help="print the summary as a table")
    parser.add_argument(
        "--reach", type=float, help="also report the minutes each run took to reach this metric"
    )
    parser.add_argument(
        "--at",
        type=float,
        help="also report each run's metric at this many minutes (linear between checkpoints)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.summarise_only:
        status = evaluate_runs(args)
        if status:
            return status
    if args.json is None and args.plot is None and not args.markdown:
        return 0  # no summary asked for
    paths = [
        p for folder in (args.results, *args.more_results) for p in sorted(folder.glob("*.json"))
    ]
    records = [json.loads(path.read_text()) for path in paths]
    curves = [record for record in records if "curve" in record]  # not a summary written there
    if args.only is not None:
        curves = [c for c in curves if c["run"] in args.only]
    if not curves:
        print(f"error: --results {args.results}: no per-run file", file=sys.stderr)
        return 2
    untrained = None if args.untrained is None else json.loads(args.untrained.read_text())
    missing = [c["run"] for c in curves if args.metric not in c["curve"][-1]["metrics"]]
    if missing or (untrained is not None and args.metric not in untrained):
        where = ", ".join(missing) or str(args.untrained)
        print(f"error: --metric {args.metric}: not in the evaluations of {where}", file=sys.stderr)
        return 2
    summary = summarise(curves, args.metric, untrained, args.runs, args.reach, args.at)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    if args.plot is not None:
        plot(summary, args.plot)
    if args.markdown:
        print(markdown(summary))
    return 0


def evaluate_runs(args: argparse.Namespace) -> int:
    """Evaluate every checkpoint of every run without a results file; 2 on bad input."""
    if args.runs is None or not args.runs.is_dir():
        print(f"error: --runs {args.runs}: no such folder", file=sys.stderr)
        return 2
    runs = [r for r in run_directories(args.runs) if args.only is None or r.name in args.only]
    if not runs:
        print(f"error: --runs {args.runs}: no run directory (config.json) in it", file=sys.stderr)
        return 2
    # A file of the run's name that is not a curve (a seed study's per-run summary, say) would
    # otherwise read as "already evaluated" and the run would be skipped without a word.
    foreign = [
        destination
        for destination in (args.results / f"{r.name}.json" for r in runs)
        if destination.is_file() and "curve" not in _read_object(destination)
    ]
    if foreign:
        print(
            f"error: --results {args.results}: {foreign[0].name} is not a curve file (a seed "
            "study's results?); give the curves a folder of their own",
            file=sys.stderr,
        )
        return 2
    args.results.mkdir(parents=True, exist_ok=True)
    for run_dir in runs:
        destination = args.results / f"{run_dir.name}.json"
        if destination.exists():
            continue
        curve = evaluate_checkpoints(run_dir, progress=not args.no_progress)
        partial = destination.with_suffix(".json.partial")
        partial.write_text(json.dumps(curve, indent=1) + "\n")
        partial.replace(destination)  # a crash never leaves a half-written results file
        print(f"{run_dir.name}: {len(curve['curve'])} checkpoints -> {destination}", flush=True)
    return 0


def _read_object(path: Path) -> dict[str, Any]:
    """A JSON file's top-level object ({} for anything else, which is no curve either)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


if __name__ == "__main__":
    raise SystemExit(main())
