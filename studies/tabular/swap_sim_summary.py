"""The summary of ``teamtr swap-sim``: per-seed records of ``studies.tabular.swap_sim`` reduced to
shocks, raw and normalised scores, the papers' ratios, and the certificate checks; and its
printed table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from studies.tabular.swap_sim_settings import StudySettings

PAPER_CLAIMS: dict[str, str] = {
    "teamtr": "aligned swap +27% over the direct swap (1.5B agent replaced by an 8B agent)",
    "sat": "composite score 56.5 (trained team) -> 66.9 (two agents upgraded) -> 70.4 (all three)",
}
TIE_TOLERANCE = 1e-9
"""Scores closer than this count as a tie (both teams converged to the same optimum)."""


def _stats(values: Sequence[float] | NDArray[np.float64]) -> dict[str, float]:
    array = np.asarray(values, dtype=float)
    return {"mean": float(array.mean()), "std": float(array.std())}


def _ratio(aligned: np.ndarray, direct: np.ndarray) -> dict[str, float | None]:
    """Relative improvement of aligned over direct scores, as a ratio of means and per seed."""
    per_seed = [a / d - 1.0 for a, d in zip(aligned, direct, strict=True) if d > 0]
    direct_mean = float(direct.mean())
    return {
        "ratio_of_means": float(aligned.mean() / direct_mean - 1.0) if direct_mean > 0 else None,
        "per_seed_mean": float(np.mean(per_seed)) if per_seed else None,
    }


def _sweep_j(run: dict[str, Any], position: int, final: bool) -> float:
    """J right after the aligned swap of sweep entry ``position``, or after further stages."""
    row = run["sweep"][position]
    return float(row["J_further"][-1] if final else row["J_swap"])


def summarise(runs: list[dict[str, Any]], settings: StudySettings) -> dict[str, Any]:
    """Aggregates over seeds: J and scores at the swap and after further stages, win rates."""

    def score(run: dict[str, Any], j: float) -> float:
        return float((j - run["J_uniform"]) / (run["J_max"] - run["J_uniform"]))

    def column(pick: Callable[[dict[str, Any]], float], normalised: bool) -> np.ndarray:
        return np.asarray([score(r, pick(r)) if normalised else pick(r) for r in runs])

    moments: dict[str, Callable[[dict[str, Any]], float]] = {
        "trained": lambda r: r["J_trained"],
        "donor_team": lambda r: r["J_donor"],
        "direct_swap": lambda r: r["direct"]["J_swap"],
        "aligned_swap": lambda r: r["aligned"]["J_swap"],
        "no_swap_final": lambda r: r["no_swap"]["J_further"][-1],
        "direct_final": lambda r: r["direct"]["J_further"][-1],
        "aligned_final": lambda r: r["aligned"]["J_further"][-1],
    }
    summary: dict[str, Any] = {
        "J": {name: _stats(column(pick, False)) for name, pick in moments.items()},
        "score": {name: _stats(column(pick, True)) for name, pick in moments.items()},
    }
    shock_direct = column(lambda r: r["J_trained"] - r["direct"]["J_swap"], False)
    shock_aligned = column(lambda r: r["J_trained"] - r["aligned"]["J_swap"], False)
    summary["shock"] = {"direct": _stats(shock_direct), "aligned": _stats(shock_aligned)}
    for when, direct_key, aligned_key in (
        ("at_swap", "direct_swap", "aligned_swap"),
        ("after_further_stages", "direct_final", "aligned_final"),
    ):
        direct = column(moments[direct_key], True)
        aligned = column(moments[aligned_key], True)
        summary[when] = {
            "aligned_beats_direct_fraction": float(np.mean(aligned > direct + TIE_TOLERANCE)),
            "tie_fraction": float(np.mean(np.abs(aligned - direct) <= TIE_TOLERANCE)),
            "relative_improvement": _ratio(aligned, direct),
            "score_difference": _stats(aligned - direct),
        }
    summary["certificate"] = {
        "aligned_covers_every_seed": all(r["aligned"]["certificate"]["covers"] for r in runs),
        "sweep_covers_every_seed": all(
            row["certificate"]["covers"] for r in runs for row in r["sweep"]
        ),
        "aligned_certificate": _stats([r["aligned"]["certificate"]["certificate"] for r in runs]),
        "aligned_realised_gain": _stats(
            [r["aligned"]["certificate"]["realised_gain"] for r in runs]
        ),
        "direct_certificate_vacuous_fraction": float(
            np.mean(
                [
                    (r["direct"]["certificate"]["certificate"] or -math.inf)
                    < r["direct"]["certificate"]["realised_gain"] - 1.0
                    for r in runs
                ]
            )
        ),
    }
    direct_swap = column(moments["direct_swap"], True)
    direct_final = column(moments["direct_final"], True)
    summary["sweep"] = []
    for position, delta0 in enumerate(settings.sweep):
        at_swap = column(partial(_sweep_j, position=position, final=False), True)
        final = column(partial(_sweep_j, position=position, final=True), True)
        summary["sweep"].append(
            {
                "delta0": delta0,
                "score_swap": _stats(at_swap),
                "score_final": _stats(final),
                "aligned_beats_direct_fraction_at_swap": float(
                    np.mean(at_swap > direct_swap + TIE_TOLERANCE)
                ),
                "aligned_beats_direct_fraction_final": float(
                    np.mean(final > direct_final + TIE_TOLERANCE)
                ),
                "relative_improvement_at_swap": _ratio(at_swap, direct_swap)["ratio_of_means"],
                "relative_improvement_final": _ratio(final, direct_final)["ratio_of_means"],
                "covers_every_seed": all(
                    r["sweep"][position]["certificate"]["covers"] for r in runs
                ),
            }
        )
    summary["upgrade"] = {}
    for mode in ("direct", "aligned"):
        scores = np.asarray(
            [[score(r, j) for j in r["upgrade"][mode]["J"]] for r in runs], dtype=float
        )
        final = np.asarray([score(r, r["upgrade"][mode]["J_further"][-1]) for r in runs])
        summary["upgrade"][mode] = {
            "score_trained_two_all": [float(x) for x in 100.0 * scores.mean(axis=0)],
            "score_final": float(100.0 * final.mean()),
            "covers_every_seed": all(r["upgrade"][mode]["covers"] for r in runs),
        }
    return summary


def print_summary(summary: dict[str, Any], settings: StudySettings) -> None:
    score = summary["score"]
    print(
        f"{settings.family}: {settings.seeds} seeds, delta0 = {settings.delta0}, "
        f"{settings.further_stages} further stages (scores x100, mean ± std)"
    )
    for name in (
        "trained",
        "donor_team",
        "direct_swap",
        "aligned_swap",
        "no_swap_final",
        "direct_final",
        "aligned_final",
    ):
        print(f"  {name:<15}{100 * score[name]['mean']:8.2f} ± {100 * score[name]['std']:.2f}")
    for when in ("at_swap", "after_further_stages"):
        row = summary[when]
        ratio = row["relative_improvement"]["ratio_of_means"]
        ratio_text = "n/a" if ratio is None else f"{100 * ratio:+.1f}%"
        print(
            f"  {when}: aligned beats direct on {100 * row['aligned_beats_direct_fraction']:.0f}% "
            f"of seeds (ties {100 * row['tie_fraction']:.0f}%); relative improvement {ratio_text} (paper: +27%)"
        )
    print("  delta0 sweep (score at swap / after further stages, % seeds aligned > direct):")
    for row in summary["sweep"]:
        print(
            f"    {row['delta0']:<8g}{100 * row['score_swap']['mean']:8.2f}"
            f"{100 * row['score_final']['mean']:8.2f}"
            f"{100 * row['aligned_beats_direct_fraction_at_swap']:6.0f}%"
            f"{100 * row['aligned_beats_direct_fraction_final']:6.0f}%"
        )
    for mode in ("direct", "aligned"):
        row = summary["upgrade"][mode]
        path = " -> ".join(f"{x:.1f}" for x in row["score_trained_two_all"])
        print(f"  upgrade {mode:<8}{path} -> {row['score_final']:.1f} after further stages")
    print(f"  (SAT: {PAPER_CLAIMS['sat']})")
    certificate = summary["certificate"]
    print(
        f"  certificate covers the aligned swap on every seed: "
        f"{certificate['aligned_covers_every_seed']} (sweep: {certificate['sweep_covers_every_seed']})"
    )
