"""The figure of ``teamtr scaling`` (``studies.tabular.scaling``), drawn from its JSON result:
drift, certified penalty and surrogate error against n on log-log axes, with the fitted power
laws and the papers' slopes (no training)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from studies.figures import SCHEME_COLOURS, Source, load_result, plt, save_figure


def _fitted_panel(
    axis: Any,
    result: dict[str, Any],
    series: list[tuple[str, str, str, str]],
    title: str,
    ylabel: str,
) -> None:
    """Means +- std against n on log-log axes with the fitted power law of each series.

    ``series``: (scheme, metric, label, line style).
    """
    n = np.asarray(result["n"], dtype=float)
    grid = np.linspace(n.min(), n.max(), 50)
    for scheme, metric, label, style in series:
        stats = result["metrics"][scheme][metric]
        mean = np.asarray(stats["mean"], dtype=float)
        std = np.asarray(stats["std"], dtype=float)
        if not np.all(mean > 0):
            continue
        colour = SCHEME_COLOURS[scheme]
        lower = np.minimum(std, mean * 0.999)  # keep the error bar inside the log axis
        axis.errorbar(n, mean, yerr=[lower, std], fmt="o", color=colour, ms=4, capsize=2)
        fit = result["alpha_all"][scheme][metric]
        if fit["alpha"] is not None:
            line = np.exp(fit["intercept"]) * grid ** fit["alpha"]
            axis.plot(grid, line, style, color=colour, label=f"{label}: α = {fit['alpha']:.2f}")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xticks(n)
    axis.set_xticklabels([str(int(v)) for v in n])
    axis.minorticks_off()
    axis.set_xlabel("number of agents n")
    axis.set_ylabel(ylabel)
    axis.set_title(title, fontsize=10)
    axis.grid(True, which="major", alpha=0.3)


def plot_scaling(source: Source, png_path: str | Path) -> Path:
    """Three log-log panels: drift, certified penalty, surrogate error, each against n."""
    result = load_result(source)
    n = np.asarray(result["n"], dtype=float)
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.6))

    drift_axis = axes[0]
    _fitted_panel(
        drift_axis,
        result,
        [
            ("stale", "drift", "D_stale", "-"),
            ("teamtr", "drift", "D_teamtr", "-"),
        ],
        "occupancy drift per stage",
        "Σ_i ‖·‖₁ (see definitions)",
    )
    # The papers' exponents as reference slopes, anchored at each family's fitted value at n_min.
    for scheme, paper_alpha in result["papers"].items():
        fit = result["alpha_all"][scheme]["drift"]
        if fit["alpha"] is None:
            continue
        anchor = np.exp(fit["intercept"]) * n.min() ** fit["alpha"]
        drift_axis.plot(
            n,
            anchor * (n / n.min()) ** paper_alpha,
            ":",
            color=SCHEME_COLOURS[scheme],
            alpha=0.7,
            label=f"papers' slope {paper_alpha} ({scheme})",
        )
    drift_axis.legend(fontsize=8)

    _fitted_panel(
        axes[1],
        result,
        [
            ("stale", "certified_penalty", "stale penalty Σ C_i Σ_{k≤i}√δ_k", "-"),
            ("teamtr", "certified_penalty", "TeamTR penalty Σ C_i √δ_i", "-"),
            ("stale", "drift_bound", "stale drift bound", "--"),
            ("teamtr", "drift_bound", "TeamTR shift bound", "--"),
        ],
        "bounds (Thm 3.6 / 3.7)",
        "penalty (units of J) / bound on Σ‖·‖₁",
    )
    axes[1].legend(fontsize=8)

    _fitted_panel(
        axes[2],
        result,
        [
            ("stale", "surrogate_error", "stale Σ|e_i|", "-"),
            ("teamtr", "surrogate_error", "TeamTR Σ|e_i|", "-"),
            ("stale", "surrogate_error_aggregate", "stale |Σ e_i|", "--"),
        ],
        "surrogate error e_i = L_i − (J(π̂^i) − J(π̂^{i−1}))",
        "units of J",
    )
    axes[2].legend(fontsize=8)

    setup = result.get("setup", {})
    figure.suptitle(
        f"Scaling with the number of agents: δ = {setup.get('radius')}, "
        f"{setup.get('seeds')} seeds per n, {setup.get('family', '')}",
        fontsize=11,
    )
    return save_figure(figure, png_path)
