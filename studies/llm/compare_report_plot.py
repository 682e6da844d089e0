"""The figure of ``python -m studies.llm.compare_report`` (``teamtr compare-report``): the
training reward per stage against the budget clock (left) and held-out accuracy with ±1 s.e.
bars against the untrained team (right)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.figures import plt, save_figure
from studies.llm.run_records import held_out, stage_ends_minutes


def plot(summary: dict[str, Any], out: Path) -> Path:
    """Training reward per stage against the budget clock; held-out accuracy, untrained and
    trained, with ±1 binomial standard error."""
    runs = summary["runs"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, run in runs.items():
        ends = stage_ends_minutes(run)
        rewards = [stage["train_reward"] for stage in run["stages"]]
        left.plot(ends, rewards, marker="o", markersize=3, label=f"{name} ({len(rewards)} stages)")
    budgets = {run["budget"]["minutes"] for run in runs.values()}
    if len(budgets) == 1 and budgets != {0.0}:  # a stage ends after the budget runs out
        left.axvline(budgets.pop(), color="0.5", linestyle="--", linewidth=1, label="budget")
    left.set_xlabel("budget clock at the stage's end (minutes)")
    left.set_ylabel("training reward (stage-start rollouts)")
    left.set_title("training")
    left.legend()
    names = list(runs)
    for index, name in enumerate(names):
        for offset, key, colour in ((-0.18, "untrained", "0.6"), (0.18, "trained", "C0")):
            result = runs[name][key]
            if result is None:  # no untrained evaluation given, or a run that never evaluated
                continue
            right.bar(
                index + offset,
                100 * held_out(result),
                width=0.36,
                yerr=100 * result["standard_error"],
                color=colour,
                capsize=3,
                label=key if index == 0 else None,
            )
    right.set_xticks(range(len(names)), names)
    right.set_ylabel("greedy accuracy, held-out questions (%)")
    right.set_title("held-out accuracy (±1 binomial s.e.)")
    right.legend()
    return save_figure(figure, out)
