"""The figure of ``teamtr swap-sim`` (``studies.tabular.swap_sim``), drawn from its JSON result
(no training). Scores = (J - J_uniform) / (J_max - J_uniform) x 100 (0: uniform team, 100:
optimal):

(a) per seed and mean: the trained team, right after a direct and an aligned swap, and after the
    further TeamTR stages (with the no-swap continuation for reference);
(b) the delta0 sweep: score right after the aligned swap and after further stages, against the
    direct swap;
(c) the SAT-style upgrade: trained team -> n-1 agents replaced -> all n, direct versus aligned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from studies.figures import Source, load_result, plt, save_figure

SWAP_COLOURS = {"direct": "tab:red", "aligned": "tab:blue", "no_swap": "tab:gray"}


def _score(run: dict[str, Any], j: float) -> float:
    return 100.0 * (j - run["J_uniform"]) / (run["J_max"] - run["J_uniform"])


def _trajectory_panel(axis: Any, runs: list[dict[str, Any]], further: int) -> None:
    """Score before the swap (x=0), right after it (x=1) and after each further stage."""
    x = np.arange(further + 2)
    for key, label in (("no_swap", "no swap"), ("direct", "direct swap"), ("aligned", "aligned")):
        curves = []
        for run in runs:
            at_swap = run["J_trained"] if key == "no_swap" else run[key]["J_swap"]
            js = [run["J_trained"], at_swap, *run[key]["J_further"]]
            curve = np.array([_score(run, j) for j in js])
            curves.append(curve)
            axis.plot(x, curve, color=SWAP_COLOURS[key], alpha=0.15, lw=0.8)
        mean = np.mean(curves, axis=0)
        axis.plot(
            x, mean, color=SWAP_COLOURS[key], lw=2.5, marker="o", ms=4, label=f"{label} (mean)"
        )
    axis.set_xticks(x, ["trained", "swap", *[f"+{i}" for i in range(1, further + 1)]])
    axis.set_xlabel("swap, then further TeamTR stages")
    axis.set_ylabel("normalised score (J) x 100")
    axis.set_title("(a) swap shock and recovery, per seed")
    axis.legend(fontsize=8, loc="lower right")


def _sweep_panel(axis: Any, result: dict[str, Any]) -> None:
    summary = result["summary"]
    delta0 = [row["delta0"] for row in summary["sweep"]]
    for field, style, label in (
        ("score_swap", "-", "aligned, at swap"),
        ("score_final", "--", "aligned, after further stages"),
    ):
        mean = np.array([100 * row[field]["mean"] for row in summary["sweep"]])
        std = np.array([100 * row[field]["std"] for row in summary["sweep"]])
        axis.errorbar(
            delta0,
            mean,
            yerr=std,
            color=SWAP_COLOURS["aligned"],
            ls=style,
            marker="o",
            ms=4,
            capsize=2,
            label=label,
        )
    for key, style, label in (
        ("direct_swap", "-", "direct, at swap"),
        ("direct_final", "--", "direct, after further stages"),
    ):
        axis.axhline(
            100 * summary["score"][key]["mean"], color=SWAP_COLOURS["direct"], ls=style, label=label
        )
    axis.axhline(
        100 * summary["score"]["trained"]["mean"], color="k", lw=0.8, ls=":", label="trained team"
    )
    axis.set_xscale("log")
    axis.set_xlabel("Stage-0 radius delta0")
    axis.set_ylabel("normalised score x 100 (mean ± std)")
    axis.set_title("(b) alignment radius")
    axis.legend(fontsize=7)


def _upgrade_panel(axis: Any, result: dict[str, Any]) -> None:
    upgrade = result["summary"]["upgrade"]
    labels = ["trained", "all but one\nreplaced", "all replaced", "+ further\nstages"]
    for mode in ("direct", "aligned"):
        values = [*upgrade[mode]["score_trained_two_all"], upgrade[mode]["score_final"]]
        axis.plot(range(4), values, color=SWAP_COLOURS[mode], marker="o", lw=2, label=mode)
        for i, v in enumerate(values):
            axis.annotate(
                f"{v:.1f}",
                (i, v),
                textcoords="offset points",
                xytext=(0, 5),
                ha="center",
                fontsize=7,
                color=SWAP_COLOURS[mode],
            )
    axis.set_xticks(range(4), labels)
    axis.set_ylabel("normalised score x 100 (mean over seeds)")
    axis.set_title("(c) upgrade with the donor's agents (SAT: 56.5 -> 66.9 -> 70.4)")
    axis.legend(fontsize=8)


def plot_swap_sim(source: Source, png_path: str | Path) -> Path:
    """Draw the figure of a ``teamtr swap-sim`` result (a JSON path or the loaded dict)."""
    result = load_result(source)
    runs = result["runs"]
    settings = result["settings"]
    figure, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    _trajectory_panel(axes[0], runs, settings["further_stages"])
    _sweep_panel(axes[1], result)
    _upgrade_panel(axes[2], result)
    family = next(iter(result["family"]))
    figure.suptitle(
        f"Swap shock, exact ({family}, {settings['seeds']} seeds, delta0 = {settings['delta0']}, "
        f"radius = {settings['radius']})"
    )
    return save_figure(figure, png_path)
