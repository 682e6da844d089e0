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

writes ``RESULTS/<run>.json``: per checkpoint stage, the evaluation's metrics and the stage's
end on the run's budget clock (``stage_ends_minutes``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def run_directories(runs: Path) -> list[Path]:
    """The run directories under ``runs`` (those holding a ``config.json``), sorted by name."""
    return sorted(p for p in runs.iterdir() if (p / "config.json").is_file())


def stage_minutes(run_dir: Path) -> list[float]:
    """Each stage's end on the run's budget clock, from ``metrics.jsonl`` and the run record."""
    from studies.llm.run_records import budget_clock_minutes, stage_ends_minutes

    stages = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    used = budget_clock_minutes(run_dir)
    return stage_ends_minutes({"stages": stages, "budget_clock_minutes_used": used})


def evaluate_checkpoints(run_dir: Path, progress: bool) -> dict[str, Any]:
    """Every stage checkpoint of ``run_dir`` evaluated greedily on the run's held-out set."""
    from llm.common.config import load_config
    from llm.models.agents import LoraTeam
    from llm.training.builder import build, problem_sources
    from llm.training.checkpoint import find_policies, stage_directories
    from llm.training.evaluation import evaluate_team

    config = load_config(run_dir / "config.json")
    problems = problem_sources(config)[1]
    parts = build(config, progress=progress)
    minutes = stage_minutes(run_dir)
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
                "eval_cpu_seconds": time.process_time() - started,
                "metrics": metrics,
            }
        )
    return {"run": run_dir.name, "scheme": config.stage.scheme, "curve": curve}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m studies.llm.checkpoint_curves", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=Path, required=True, help="parent of the run directories")
    parser.add_argument("--results", type=Path, required=True, help="folder of per-run files")
    parser.add_argument("--only", nargs="*", default=None, help="run names (default: every run)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.runs.is_dir():
        print(f"error: --runs {args.runs}: no such folder", file=sys.stderr)
        return 2
    runs = [r for r in run_directories(args.runs) if args.only is None or r.name in args.only]
    if not runs:
        print(f"error: --runs {args.runs}: no run directory (config.json) in it", file=sys.stderr)
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


if __name__ == "__main__":
    raise SystemExit(main())
