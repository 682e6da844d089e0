"""Figures drawn from the JSON files of ``teamtr scaling``, ``teamtr sim-train`` and
``teamtr swap-sim`` (no training).

The scripts in ``figures/`` are thin command-line wrappers around these three functions;
``teamtr swap-sim --plot`` draws its figure with ``plot_swap_sim``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

SCHEME_COLOURS = {
    "stale": "tab:red",
    "teamtr": "tab:blue",
    "joint": "tab:green",
    "happo": "tab:purple",
    "single": "tab:gray",
}
SCHEME_LABELS = {"stale": "stale (Thm 3.7)", "teamtr": "TeamTR (Thm 3.6)"}

Source = str | Path | dict[str, Any]


def _load(source: Source) -> dict[str, Any]:
    if isinstance(source, dict):
        return source
    loaded: dict[str, Any] = json.loads(Path(source).read_text())
    return loaded


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
    result = _load(source)
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
    figure.tight_layout()
    return _save(figure, png_path)


def plot_sim_train(source: Source, png_path: str | Path) -> Path:
    """One row per family: mean J per stage for each sampler, and certificate vs realised gain."""
    result = _load(source)
    families = list(result["families"])
    settings = list(result["columns"])
    columns = len(settings) + 1
    figure, axes = plt.subplots(
        len(families), columns, figsize=(4.6 * columns, 3.4 * len(families)), squeeze=False
    )
    rows = result["summary"]
    for i, family in enumerate(families):
        for j, setting in enumerate(settings):
            axis = axes[i][j]
            for row in rows:
                if (row["family"], row["setting"]) != (family, setting):
                    continue
                curve = np.asarray(row["J_mean_curve"])
                # stale and joint make identical moves with exact advantages: draw stale wide
                # underneath so that both stay visible.
                wide = row["scheme"] == "stale"
                axis.plot(
                    np.arange(curve.size),
                    curve,
                    "-",
                    color=SCHEME_COLOURS[row["scheme"]],
                    label=row["scheme"],
                    lw=4.0 if wide else 1.4,
                    alpha=0.45 if wide else 1.0,
                )
            axis.set_title(f"{family}: {setting}", fontsize=10)
            axis.set_xlabel("stage")
            axis.set_ylabel("J (mean over seeds)")
            axis.grid(True, alpha=0.3)
            if i == 0 and j == 0:
                axis.legend(fontsize=8)
        axis = axes[i][-1]
        low, high = np.inf, -np.inf
        for run in result["runs"]:
            if run["family"] != family:
                continue
            certs = np.asarray([s["certificate"] for s in run["stages"]])
            gains = np.asarray([s["realised_gain"] for s in run["stages"]])
            if run["radius"] != result["settings"]["radius"] or run["sampler"] != "exact":
                continue  # exact small-radius runs: there the certificate is a theorem, not a proxy
            axis.scatter(
                certs,
                gains,
                s=12,
                color=SCHEME_COLOURS[run["scheme"]],
                linewidths=0.7,
                alpha=0.7,
            )
            low = min(low, certs.min(), gains.min())
            high = max(high, certs.max(), gains.max())
        if np.isfinite(low):
            axis.plot([low, high], [low, high], "k--", lw=0.8, label="gain = certificate")
        axis.axhline(0.0, color="k", lw=0.5)
        axis.axvline(0.0, color="k", lw=0.5)
        axis.set_title(
            f"{family}: certificate vs gain, δ={result['settings']['radius']:g}", fontsize=10
        )
        axis.set_xlabel("stage certificate (exact advantages)")
        axis.set_ylabel("J_end − J_start")
        axis.grid(True, alpha=0.3)
        if i == 0:
            axis.legend(fontsize=8)
    settings = result.get("settings", {})
    figure.suptitle(
        f"Multi-stage training: δ = {settings.get('radius')}, {settings.get('seeds')} seeds, "
        f"{settings.get('episodes')} episodes per sampled batch",
        fontsize=11,
    )
    figure.tight_layout()
    return _save(figure, png_path)


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
    result = _load(source)
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
    figure.tight_layout()
    return _save(figure, png_path)


def _save(figure: Any, png_path: str | Path) -> Path:
    path = Path(png_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
