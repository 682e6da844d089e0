"""The figure of ``teamtr seed-study`` (``studies.llm.seed_study``), drawn from its per-run
files: training reward per stage against the budget clock, one line per seed; the held-out
learning curve when the runs evaluated during training; and held-out accuracy, untrained and
trained (mean ± s.e. over seeds, dots: seeds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from studies.figures import plt, save_figure
from studies.llm.run_records import held_out, held_out_curve, stage_ends_minutes, training_cpu_ends


def plot(summary: dict[str, Any], results: Path, out: Path) -> Path:
    methods = list(summary["methods"])
    runs = {
        m: [json.loads(p.read_text()) for p in sorted(results.glob(f"{m}-s*.json"))]
        for m in methods
    }
    # Runs that evaluated during training ([run] eval_every) get a held-out learning curve.
    with_curve = any(len(held_out_curve(run)) > 1 for group in runs.values() for run in group)
    # Against training CPU where every run records its stages' CPU time (evaluations
    # excluded), else against the budget clock and stages trained.
    on_cpu = all(training_cpu_ends(run) for group in runs.values() for run in group)
    figure, axes = plt.subplots(1, 3 if with_curve else 2, figsize=(16 if with_curve else 11, 4.2))
    left, right = axes[0], axes[-1]
    for index, method in enumerate(methods):
        colour = f"C{index}"
        for number, run in enumerate(runs[method]):
            ends = (training_cpu_ends(run) if on_cpu else None) or stage_ends_minutes(run)
            rewards = [s["train_reward"] for s in run["stages"]]
            label = method if number == 0 else None
            left.plot(ends, rewards, color=colour, alpha=0.6, linewidth=1, label=label)
            if with_curve:
                curve: list[tuple[float, float]] = [(0.0, 100 * held_out(run["untrained"]))]
                curve += [
                    (ends[stage - 1] if on_cpu else float(stage), 100 * accuracy)
                    for stage, accuracy in held_out_curve(run)
                ]
                stages, accuracies = zip(*curve, strict=True)
                axes[1].plot(
                    stages, accuracies, "o-", color=colour, alpha=0.6, markersize=3, label=label
                )
        entry = summary["methods"][method]
        if entry.get("untrained_accuracy") is not None:
            right.bar(
                index - 0.18,
                100 * entry["untrained_accuracy"],
                0.36,
                color="0.7",
                label="untrained" if index == 0 else None,
            )
            value = 100 * entry["untrained_accuracy"]
            right.annotate(f"{value:.0f}", (index - 0.18, value), ha="center", va="bottom")
        if "trained_accuracy" in entry:
            trained = entry["trained_accuracy"]
            right.bar(
                index + 0.18,
                100 * trained["mean"],
                0.36,
                color=colour,
                yerr=100 * (trained["standard_error"] or 0),
                capsize=3,
                label="trained (mean ± s.e. over seeds)" if index == 0 else None,
            )
            for run in entry["per_seed"]:
                right.plot(index + 0.18, 100 * run["trained"], "k.", markersize=4)
            value = 100 * trained["mean"]
            right.annotate(f"{value:.0f}", (index + 0.18, value), ha="center", va="bottom")
    clock = "training CPU minutes (evaluations excluded)"
    left.set_xlabel(clock if on_cpu else "budget clock at the stage's end (minutes)")
    left.set_ylabel("training reward (stage-start rollouts)")
    left.set_title("training, one line per seed")
    if left.get_legend_handles_labels()[0]:
        left.legend()
    if with_curve:
        axes[1].set_xlabel(clock if on_cpu else "stages trained")
        axes[1].set_ylabel("greedy held-out accuracy (%)")
        axes[1].set_ylim(0, 105)
        axes[1].set_title("held-out accuracy during training, one line per seed")
        axes[1].legend()
    right.set_xticks(range(len(methods)), methods)
    right.set_ylim(0, 105)
    right.set_ylabel("greedy held-out accuracy (%)")
    right.set_title("held-out accuracy (dots: seeds)")
    if right.get_legend_handles_labels()[0]:
        right.legend()
    return save_figure(figure, out)
