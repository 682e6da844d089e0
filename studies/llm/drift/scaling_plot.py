"""The figure of ``teamtr llm-scaling`` (``studies.llm.drift.scaling``): drift against n on
language-model teams, and the fitted exponents of both worlds (language models and the exact
tabular rings) side by side."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from studies.figures import plt, save_figure

COLOURS = {"stale": "tab:red", "teamtr": "tab:blue"}
LABELS = {"stale": "stale", "teamtr": "TeamTR"}


def _drift_panel(axis: Any, summary: dict[str, Any], metric: str, ylabel: str) -> None:
    sizes = np.asarray(summary["agents"], dtype=float)
    grid = np.linspace(sizes.min(), sizes.max(), 50)
    for scheme in ("stale", "teamtr"):
        block = summary["schemes"][scheme]
        stats = [block["per_n"][str(int(n))][metric] for n in sizes]
        mean = np.array([np.nan if s["mean"] is None else s["mean"] for s in stats])
        error = np.array([0.0 if s["stderr"] is None else s["stderr"] for s in stats])
        # Each seed's value, faint, so that the spread behind the mean is visible.
        for n, s in zip(sizes, stats, strict=True):
            values = [v for v in s["values"] if v is not None and v > 0]
            axis.plot([n] * len(values), values, ".", color=COLOURS[scheme], alpha=0.3, ms=4)
        shown = mean > 0
        lower = np.minimum(error, mean * 0.999)
        axis.errorbar(
            sizes[shown],
            mean[shown],
            yerr=[lower[shown], error[shown]],
            fmt="o",
            color=COLOURS[scheme],
            ms=5,
            capsize=2,
        )
        fit = block["alpha"].get(metric)
        if fit and fit["alpha"] is not None:
            axis.plot(
                grid,
                np.exp(fit["intercept"]) * grid ** fit["alpha"],
                color=COLOURS[scheme],
                label=f"{LABELS[scheme]}: alpha = {fit['alpha']:.2f} "
                f"[{fit['ci95'][0]:.2f}, {fit['ci95'][1]:.2f}]",
            )
    axis.set_xscale("log")
    if any(line.get_label()[0] != "_" for line in axis.get_lines()) or _any_positive(
        summary, metric
    ):
        axis.set_yscale("log")
    else:  # every stage left its team where it was: nothing to draw on log axes
        axis.text(0.5, 0.5, "no update moved a team", ha="center", transform=axis.transAxes)
    axis.set_xticks(sizes, [str(int(n)) for n in sizes])
    axis.set_xlabel("agents n")
    axis.set_ylabel(ylabel)
    if any(line.get_label()[0] != "_" for line in axis.get_lines()):
        axis.legend(fontsize=8)
    axis.grid(True, which="both", alpha=0.3)


def _any_positive(summary: dict[str, Any], metric: str) -> bool:
    return any(
        (v or 0) > 0
        for block in summary["schemes"].values()
        for stats in block["per_n"].values()
        for v in stats[metric]["values"]
    )


def _exponent_panel(axis: Any, summary: dict[str, Any], tabular: Sequence[dict[str, Any]]) -> None:
    """Every world's alpha with its 95% bootstrap interval; the papers' as dashed lines."""
    rows: list[tuple[str, str, float, tuple[float, float]]] = []
    for metric, label in (("drift_l1", "LM, sqrt(2 KL) terms"), ("drift_kl", "LM, KL")):
        for scheme in ("stale", "teamtr"):
            fit = summary["schemes"][scheme]["alpha"].get(metric)
            if fit and fit["alpha"] is not None:
                rows.append((label, scheme, fit["alpha"], tuple(fit["ci95"])))
    for result in tabular:
        radius = result.get("setup", {}).get("radius_growth", "constant")
        label = f"tabular ring, exact L1 ({radius} delta)"
        for scheme in ("stale", "teamtr"):
            spread = result["alpha_spread"][scheme]
            rows.append((label, scheme, result["alpha"][scheme], tuple(spread["ci95"])))
    labels = list(dict.fromkeys(r[0] for r in rows))
    for r in rows:
        y = labels.index(r[0]) + (0.15 if r[1] == "stale" else -0.15)
        low, high = r[3]
        axis.errorbar(
            r[2],
            y,
            xerr=[[r[2] - low], [high - r[2]]],
            fmt="o",
            color=COLOURS[r[1]],
            capsize=3,
        )
    for scheme in ("stale", "teamtr"):  # legend entries for the points
        axis.plot([], [], "o", color=COLOURS[scheme], label=LABELS[scheme])
    for scheme, alpha in summary["papers_alpha"].items():
        axis.axvline(alpha, color=COLOURS[scheme], ls="--", lw=1, label=f"papers, {LABELS[scheme]}")
    axis.set_yticks(range(len(labels)), labels, fontsize=8)
    axis.set_xlabel("alpha (drift ~ n^alpha), 95% bootstrap CI")
    axis.legend(fontsize=8, loc="lower right")
    axis.grid(True, axis="x", alpha=0.3)


def plot_llm_scaling(
    summary: dict[str, Any], path: str | Path, tabular: Sequence[dict[str, Any]] = ()
) -> Path:
    """Three panels: KL drift and its Pinsker L1 sum against n, and the exponents."""
    figure, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    _drift_panel(axes[0], summary, "drift_kl", "drift: sum of dialogue KLs (nats)")
    _drift_panel(axes[1], summary, "drift_l1", "drift: sum of sqrt(2 KL) (L1 bound)")
    _exponent_panel(axes[2], summary, tabular)
    settings = summary["settings"]
    figure.suptitle(
        f"One stage of stale and TeamTR on language-model teams (running-sum chain; seeds "
        f"{len(summary['seeds'])}; per-agent radius {settings['radius']} nats per "
        f"{settings['radius_unit']}; mean ± s.e. over seeds, dots: seeds)"
    )
    return save_figure(figure, path)
