"""Equal-budget comparison over seeds: train every method with every seed, side by side.

Each method is a config (its budget, clock and thread count are the config's: one torch thread
and a CPU-time budget make runs that share a machine comparable). The study

1. evaluates each method's untrained team once (LoRA B = 0 and greedy decoding: the same team
   and the same answers for every seed), and once for all methods whose untrained teams are
   the same (``untrained_key``: e.g. teamtr, stale and a shared adapter of one format);
2. trains each (method, seed) as ``teamtr train --config C --name METHOD-sSEED --seed SEED``,
   ``--jobs`` runs at a time, seed 0 of every method first so that a partial study is balanced;
   a run interrupted earlier is resumed from its newest checkpoint;
3. writes each finished run's summary to ``RESULTS/METHOD-sSEED.json`` at once (run directories
   may not outlive the machine; these files are small enough to commit), and after every run
   the aggregate ``RESULTS.json`` (per method: mean ± standard error over seeds) and its figure,
   over the methods named and every other method with runs in ``RESULTS`` (a batch of some
   methods into a folder another batch filled keeps the others).

Usage (``python -m studies.llm.seed_study`` takes the same options)::

    teamtr seed-study --results results/study_arithmetic --runs runs/study_arithmetic \\
        --method teamtr=configs/compare/teamtr.toml --method grpo=configs/compare/grpo.toml \\
        --seeds 0 1 2 --jobs 2

``--report`` only rebuilds the aggregate and the figure from the per-run files.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studies import options
from studies.llm.run_records import (
    RunSpec,
    held_out,
    held_out_drops,
    mean_and_error,
    summarise,
)


@dataclass(frozen=True)
class Method:
    name: str
    config: Path

    @classmethod
    def parse(cls, text: str) -> Method:
        name, _, config = text.partition("=")
        if not name or not config:
            raise argparse.ArgumentTypeError(f"--method {text!r}: expected NAME=CONFIG.toml")
        from llm.common.config import ConfigError, find_config  # torch-free

        try:
            path = find_config(config)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(f"--method {text!r}: {error}") from None
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"--method {text!r}: no such config file {config}")
        return cls(name, path)


@dataclass(frozen=True)
class Job:
    """One command of the study and the file that says it is done."""

    label: str
    command: list[str]
    done: Path


def teamtr_command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "teamtr", *arguments]


def untrained_path(results: Path, method: str) -> Path:
    return results / f"untrained_{method}.json"


def run_path(results: Path, method: str, seed: int) -> Path:
    return results / f"{method}-s{seed}.json"


def untrained_key(config_path: Path) -> str:
    """What decides a method's untrained greedy answers: the model, the team's format, the
    task and the message lengths. Not the scheme, the budget, the updater, the seed (every
    adapter starts at B = 0, i.e. as the base model) or whether one adapter is shared."""
    import dataclasses

    from llm.common.config import load_config

    config = load_config(config_path)
    team = dataclasses.replace(config.team, shared_adapter=False)
    parts = (config.model, team, config.task, config.sampler.turns, config.sampler.max_new_tokens)
    return repr(parts)


def share_untrained(methods: list[Method]) -> dict[str, list[str]]:
    """The method whose untrained evaluation runs -> the methods that reuse its file."""
    first_of: dict[str, str] = {}
    sharing: dict[str, list[str]] = {}
    for m in methods:
        owner = first_of.setdefault(untrained_key(m.config), m.name)
        sharing.setdefault(owner, []).append(m.name)
    return sharing


def copy_untrained(results: Path, owner: str, sharing: dict[str, list[str]]) -> None:
    source = untrained_path(results, owner)
    if source.is_file():
        for other in sharing.get(owner, []):
            target = untrained_path(results, other)
            if other != owner and not target.is_file():
                partial = target.with_name(target.name + ".partial")
                partial.write_bytes(source.read_bytes())
                os.replace(partial, target)


def plan(
    methods: list[Method],
    seeds: list[int],
    results: Path,
    runs: Path,
    sharing: dict[str, list[str]],
) -> list[Job]:
    """The jobs not done yet; ``sharing`` (``share_untrained``) says which untrained
    evaluations run and which are copies."""
    for owner in sharing:
        copy_untrained(results, owner, sharing)
    jobs = [
        Job(
            f"untrained {m.name}",
            teamtr_command(
                "eval", "--config", str(m.config), "--json", str(untrained_path(results, m.name))
            ),
            untrained_path(results, m.name),
        )
        for m in methods
        if m.name in sharing
    ]
    for seed in seeds:
        for m in methods:
            name = f"{m.name}-s{seed}"
            run_dir = runs / name
            if (run_dir / "config.json").is_file():
                command = teamtr_command("train", "--resume", str(run_dir))
            else:
                command = teamtr_command(
                    "train", "--config", str(m.config), "--name", name, "--seed", str(seed)
                )
                command += ["--output-dir", str(runs)]
            jobs.append(Job(f"train {name}", command, run_path(results, m.name, seed)))
    return [job for job in jobs if not job.done.is_file()]


def record_run(results: Path, runs: Path, method: str, seed: int) -> Path:
    """The finished run's summary (its own final evaluation) as a small results file."""
    run_dir = runs / f"{method}-s{seed}"
    summary = summarise(RunSpec(method, run_dir, Path("-"), untrained_path(results, method)))
    summary["seed"] = seed
    out = run_path(results, method, seed)
    write_json(out, summary)
    return out


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1))
    os.replace(partial, path)  # a crash leaves the old file or the new one, never half of one


def eval_only_accuracy(evaluation: dict[str, Any]) -> float | None:
    """Accuracy on the questions of templates never trained on, from the per-template keys
    (None when the evaluation has no such template)."""
    from llm.evaluation.held_out_problems import EVAL_ONLY_TEMPLATES

    right = total = 0.0
    for template in EVAL_ONLY_TEMPLATES:
        n = evaluation.get(f"template/{template}/n")
        if n:
            right += held_out(evaluation, f"template/{template}/") * n
            total += n
    return right / total if total else None


def aggregate(methods: list[str], results: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {"methods": {}}
    for method in methods:
        runs = sorted(results.glob(f"{method}-s*.json"), key=lambda p: p.name)
        records = [json.loads(p.read_text()) for p in runs]
        untrained_file = untrained_path(results, method)
        untrained = json.loads(untrained_file.read_text()) if untrained_file.is_file() else None
        entry: dict[str, Any] = {
            "untrained_accuracy": None if untrained is None else held_out(untrained),
            "seeds": [r["seed"] for r in records],
        }
        # Runs that evaluate only afterwards (eval_every = 0) have no trained accuracy here.
        evaluated = bool(records) and all(r["trained"] is not None for r in records)
        if evaluated:
            entry["trained_accuracy"] = mean_and_error([held_out(r["trained"]) for r in records])
            entry["gain"] = mean_and_error(
                [held_out(r["trained"]) - held_out(r["untrained"]) for r in records]
            )
            unseen = [eval_only_accuracy(r["trained"]) for r in records]
            if all(value is not None for value in unseen):
                entry["eval_only_template_accuracy"] = mean_and_error(
                    [float(value) for value in unseen if value is not None]
                )
            untrained_held_out = None if untrained is None else eval_only_accuracy(untrained)
            if untrained_held_out is not None:
                entry["untrained_eval_only_template_accuracy"] = untrained_held_out
        if records:
            entry["stages"] = mean_and_error([float(r["stages_trained"]) for r in records])
            entry["agent_updates"] = mean_and_error(
                [float(sum(len(s["updates"]) for s in r["stages"])) for r in records]
            )
            entry["regressions"] = mean_and_error([float(regressions(r)) for r in records])
            if all(sampling_recorded(r) for r in records):
                entry["sampling"] = {
                    key: mean_and_error([sampling_costs(r)[key] for r in records])
                    for key in SAMPLING_COSTS
                }
            entry["per_seed"] = [
                {
                    "seed": r["seed"],
                    "trained": None if r["trained"] is None else held_out(r["trained"]),
                    "stages": r["stages_trained"],
                    "budget_clock_minutes_used": r["budget_clock_minutes_used"],
                    "regressions": regressions(r),
                }
                for r in records
            ]
        summary["methods"][method] = entry
    return summary


SAMPLING_COSTS = {
    "stage_start_signal": "share of stages whose first batch held a group with differing rewards",
    "batch_signal": "share of all agent batches (TeamTR resamples: one per update) with one",
    "groups_per_batch": "groups played per batch, dynamic sampling's discarded ones included",
    "tokens_per_stage": "tokens generated per stage (looking for a signal included)",
    "cpu_seconds_per_stage": "training CPU seconds per stage (evaluations excluded)",
}
"""What a run's sampling cost and found, per run (``sampling_costs``); the aggregate gives the
mean ± standard error over seeds of each."""


def sampling_recorded(run: dict[str, Any]) -> bool:
    """Whether the run's record keeps its stages' sampling (runs recorded since it is kept)."""
    keys = ("cpu_seconds", "generated_tokens", "groups_drawn", "batch_signal_groups")
    return bool(run["stages"]) and all(
        s.get(key) is not None for s in run["stages"] for key in keys
    )


def sampling_costs(run: dict[str, Any]) -> dict[str, float]:
    """``SAMPLING_COSTS`` of one run record: so that a scheme or a way of drawing batches that
    spends more tokens looking for a reward signal shows it beside its accuracy."""
    stages = run["stages"]
    batches = [groups for s in stages for groups in s["batch_signal_groups"]]
    return {
        "stage_start_signal": sum(s["batch_signal_groups"][0] > 0 for s in stages) / len(stages),
        "batch_signal": sum(groups > 0 for groups in batches) / len(batches),
        "groups_per_batch": sum(s["groups_drawn"] for s in stages) / len(batches),
        "tokens_per_stage": sum(s["generated_tokens"] for s in stages) / len(stages),
        "cpu_seconds_per_stage": sum(s["cpu_seconds"] for s in stages) / len(stages),
    }


def regressions(run: dict[str, Any]) -> int:
    """Held-out evaluations that fell by more than two standard errors below the one before
    (the untrained evaluation first; ``held_out_drops``)."""
    return held_out_drops([run["untrained"]] + [s["eval"] for s in run["stages"] if "eval" in s])


def rerecord(methods: list[str], results: Path, runs: Path) -> None:
    """Record again every finished run whose directory is still here (what the current code
    records: e.g. per-template accuracy added since)."""
    for method in methods:
        for path in results.glob(f"{method}-s*.json"):
            seed = int(path.stem.rpartition("-s")[2])
            if (runs / f"{method}-s{seed}" / "metrics.jsonl").is_file():
                record_run(results, runs, method, seed)


def methods_with_runs(named: list[str], results: Path) -> list[str]:
    """``named``, then every other method with a recorded run in ``results``: the aggregate
    covers the whole folder, so that a batch of some methods run into a folder another batch
    filled never drops the others from RESULTS.json."""
    found = {
        path.stem.rpartition("-s")[0]
        for path in results.glob("*-s*.json")
        if path.stem.rpartition("-s")[2].isdigit() and not path.stem.startswith("untrained_")
    }
    return [*named, *sorted(found - set(named))]


def report(methods: list[str], results: Path, figure: Path | None) -> dict[str, Any]:
    methods = methods_with_runs(methods, results)
    summary = aggregate(methods, results)
    write_json(results.with_suffix(".json"), summary)
    if figure is not None:
        from studies.llm.seed_study_plot import plot  # matplotlib only when drawing

        plot(summary, results, figure)
    return summary


def cell(entry: dict[str, Any] | None, scale: float = 100.0, digits: int = 1) -> str:
    """``mean ± standard error`` of an aggregate entry, scaled (100: percent); "–" if none."""
    if not entry:
        return "–"
    error = entry["standard_error"]
    shown = f"{scale * entry['mean']:.{digits}f}"
    return shown if error is None else f"{shown} ± {scale * error:.{digits}f}"


def markdown(summary: dict[str, Any]) -> str:
    """The aggregate as a markdown table (percent; mean ± standard error over seeds)."""

    lines = [
        "| method | untrained (%) | trained (%) | gain (points) | trained, eval-only templates (%) "
        "| stages | agent updates | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, entry in summary["methods"].items():
        untrained = entry.get("untrained_accuracy")
        lines.append(
            f"| {method} | {'–' if untrained is None else f'{100 * untrained:.1f}'} | "
            f"{cell(entry.get('trained_accuracy'))} | {cell(entry.get('gain'))} | "
            f"{cell(entry.get('eval_only_template_accuracy'))} | "
            f"{cell(entry.get('stages'), 1.0)} | {cell(entry.get('agent_updates'), 1.0)} | "
            f"{len(entry['seeds'])} |"
        )
    return "\n".join(lines)


def sampling_markdown(summary: dict[str, Any]) -> str:
    """What each method's sampling cost and found (``SAMPLING_COSTS``), for methods whose
    records keep it; empty when none does."""
    rows = {m: e["sampling"] for m, e in summary["methods"].items() if "sampling" in e}
    if not rows:
        return ""

    lines = [
        "| method | stage-start batches with a signal (%) | agent batches with a signal (%) "
        "| groups played per batch | generated tokens per stage | CPU seconds per stage |",
        "|---|---|---|---|---|---|",
    ]
    for method, costs in rows.items():
        lines.append(
            f"| {method} | {cell(costs['stage_start_signal'], 100.0, 0)} | "
            f"{cell(costs['batch_signal'], 100.0, 0)} | {cell(costs['groups_per_batch'], 1.0, 1)} | "
            f"{cell(costs['tokens_per_stage'], 1.0, 0)} | "
            f"{cell(costs['cpu_seconds_per_stage'], 1.0, 0)} |"
        )
    return "\n".join(lines)


def run_jobs(jobs: list[Job], parallel: int, on_done) -> int:
    """Run ``jobs``, ``parallel`` at a time; returns how many failed."""
    pending: list[Job] = list(jobs)
    running: list[tuple[Job, subprocess.Popen, Any, Path]] = []
    failed = 0
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    while pending or running:
        while pending and len(running) < parallel:
            job = pending.pop(0)
            log = job.done.with_suffix(".log")
            log.parent.mkdir(parents=True, exist_ok=True)
            handle = log.open("w")
            print(f"[{time.strftime('%H:%M:%S')}] start {job.label}", flush=True)
            process = subprocess.Popen(
                [*job.command, "--no-progress"],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=environment,
            )
            running.append((job, process, handle, log))
        time.sleep(2)
        for entry in list(running):
            job, process, handle, log = entry
            if process.poll() is None:
                continue
            running.remove(entry)
            handle.close()
            ok = process.returncode == 0
            print(
                f"[{time.strftime('%H:%M:%S')}] {'done' if ok else 'FAILED'} {job.label}"
                + ("" if ok else f" (exit {process.returncode}, see {log})"),
                flush=True,
            )
            if ok:
                log.unlink(missing_ok=True)
                on_done(job)
            else:
                failed += 1
    return failed


PROG = "teamtr seed-study"


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--method",
        type=Method.parse,
        action="append",
        required=True,
        help="NAME=CONFIG: a method and its config (a TOML path, or a packaged name: default)",
    )
    options.add_seed_list(parser, [0, 1, 2], "the seeds every method is trained with")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    parser.add_argument(
        "--results",
        type=Path,
        required=True,
        help="folder of per-run files; RESULTS.json is the aggregate",
    )
    parser.add_argument("--runs", type=Path, required=True, help="parent of the run directories")
    options.add_plot(parser, "figure (PNG) of the aggregate")
    parser.add_argument("--report", action="store_true", help="only rebuild the aggregate")
    parser.add_argument("--markdown", action="store_true", help="print the aggregate as a table")
    return parser


def run(args: argparse.Namespace) -> int:
    names = [m.name for m in args.method]
    problem = options.first_problem(
        options.seed_list_problem(args.seeds),
        None if args.jobs >= 1 else f"--jobs must be >= 1, got {args.jobs}",
        None if len(set(names)) == len(names) else f"--method: names must differ, got {names}",
        options.output_problem(args.plot, "--plot"),
    )
    if problem is not None:
        return options.refuse(PROG, problem)
    if args.report:
        rerecord(names, args.results, args.runs)
    else:
        sharing = share_untrained(args.method)
        jobs = plan(args.method, args.seeds, args.results, args.runs, sharing)

        def on_done(job: Job) -> None:
            if job.label.startswith("untrained "):
                copy_untrained(args.results, job.label.removeprefix("untrained "), sharing)
            if job.label.startswith("train "):
                method, _, seed = job.label.removeprefix("train ").rpartition("-s")
                record_run(args.results, args.runs, method, int(seed))
            report(names, args.results, args.plot)

        failed = run_jobs(jobs, args.jobs, on_done)
        if failed:
            print(f"{failed} job(s) failed; run the same command again to retry them")
    summary = report(names, args.results, args.plot)
    if args.markdown:
        print("\n\n".join(text for text in (markdown(summary), sampling_markdown(summary)) if text))
    else:
        print(json.dumps(summary["methods"], indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m studies.llm.seed_study``: the same as ``teamtr seed-study``."""
    return run(build_parser("python -m studies.llm.seed_study").parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
