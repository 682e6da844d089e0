"""The figure of ``teamtr sim-train`` (``studies.tabular.sim_train``), drawn from its JSON result:
mean J per stage of every scheme, and every exact stage's certificate against its realised gain
(no training)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from studies.figures import SCHEME_COLOURS, Source, load_result, plt, save_figure


def plot_sim_train(source: Source, png_path: str | Path) -> Path:
    """One row per family: mean J per stage for each sampler, and certificate vs realised gain."""
    result = load_result(source)
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
    return save_figure(figure, png_path)
