"""``teamtr scaling``: does the stale scheme's occupancy drift grow like n^2 and TeamTR's like n?

For every n and seed, one exact stage of ``stale`` and one of ``teamtr`` start from the same
random team of a ``turn_taking_ring`` MDP with a fixed per-agent radius delta. Each stage is
measured exactly (``measure.measure_stage``) and the exponent alpha of every metric against n
is fitted on log-log axes (``fitting.fit_exponent``). Theorem 3.7 (THEORY.md §2) predicts a
certified penalty Theta(n^2 sqrt(delta)) for stale against Theta(n sqrt(delta)) for TeamTR; the
papers report drift exponents 1.94 and 1.07.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

import sim
from studies import options
from studies.tabular.families import turn_taking_ring
from studies.tabular.measure import (
    ExactEvaluations,
    StageMeasurement,
    measure_stage,
    run_recorded_stage,
)
from teamtr import StageConfig
from teamtr.config import SchemeName
from teamtr.fitting import finite_or_none, fit_exponent, loglog_slope

SCHEMES: tuple[SchemeName, ...] = ("stale", "teamtr")
PAPERS_ALPHA = {"stale": 1.94, "teamtr": 1.07}

DEFINITIONS: dict[str, str] = {
    "drift": (
        "The headline metric, one value per stage. stale: D_stale = sum_i ||d_{pi_hat^{i-1}} - "
        "d_{pi_cur}||_1 (update i is trained under the stage-start occupancy d_{pi_cur} while the "
        "true one is that of the intermediate team pi_hat^{i-1}). teamtr: D_teamtr = sum_i "
        "||d_{pi_hat^i} - d_{pi_hat^{i-1}}||_1 (the shift each update causes to the occupancy the "
        "next update trains under, which resampling re-measures; its train-vs-true mismatch is 0)."
    ),
    "train_true_mismatch": (
        "sum_i ||d_train(i) - d_{pi_hat^{i-1}}||_1, d_train(i) the occupancy of the behaviour team "
        "of the rollouts update i was given: equal to D_stale for stale, exactly 0 for teamtr."
    ),
    "step_shift": "sum_i ||d_{pi_hat^i} - d_{pi_hat^{i-1}}||_1 (for teamtr this is D_teamtr).",
    "mean_update_shift": (
        "step_shift / (kept updates): the occupancy shift of one update. A fixed per-agent radius "
        "spreads an agent's KL over its 1/n share of the occupancy, so this shrinks with n; "
        "alpha(drift) = alpha(count of terms) + alpha(mean_update_shift) when shifts are coherent."
    ),
    "drift_in_update_shifts": (
        "drift / mean_update_shift: the drift counted in units of one update's own shift. It "
        "removes the shrinking size of a single update and keeps the combinatorics: exactly n "
        "for teamtr; n(n-1)/2 times the coherence of the earlier shifts for stale."
    ),
    "net_shift": "||d_{pi_bar} - d_{pi_cur}||_1, the stage's total occupancy change.",
    "coherence": (
        "net_shift / step_shift: 1 when all updates move the occupancy the same way, about "
        "1/sqrt(n) for independent directions."
    ),
    "surrogate_error": (
        "sum_i |L_i - (J(pi_hat^i) - J(pi_hat^{i-1}))| over the kept updates, L_i the surrogate "
        "the update was certified with (stale: under d_{pi_cur} and A_{pi_cur}; teamtr: under "
        "d_{pi_hat^{i-1}} and A_{pi_hat^{i-1}}, Thm 3.4)."
    ),
    "surrogate_error_aggregate": (
        "|sum_i (L_i - (J(pi_hat^i) - J(pi_hat^{i-1})))| = |sum_i L_i - (J(pi_bar) - J(pi_cur))|: "
        "the error of the stage's summed surrogate, where signed per-update errors may cancel."
    ),
    "surrogate_error_signed": "sum_i (L_i - (J(pi_hat^i) - J(pi_hat^{i-1}))), signed.",
    "certified_penalty": (
        "stale: sum_i C_i sum_{k<=i} sqrt(delta_k) (Thm 3.7, teamtr.bounds.stale_penalty_sum); "
        "teamtr: sum_i C_i sqrt(delta_i) (Thm 3.6, intermediate_penalty_sum); C_i = sqrt(2) "
        "gamma eps_i/(1-gamma)^2 with eps_i the update's advantage bound, delta_i the radius."
    ),
    "drift_bound": (
        "stale: sum_i theorem_3_7_drift_bound(gamma, delta_{<i}) = sum_i sum_{k<i} 2gamma/(1-gamma) "
        "sqrt(delta_k/2); teamtr: sum_i 2gamma/(1-gamma) sqrt(delta_i/2), the occupancy-shift bound "
        "of each update. (The stale updates are constrained under d_{pi_cur}, so Thm 3.7's premise "
        "holds only approximately for them.)"
    ),
    "realised_gain": "J(pi_bar) - J(pi_cur), exact.",
    "certificate": "sum_i L_i - certified_penalty.",
    "term_count_alpha": (
        "log-log slope over the measured n of the number of per-update shifts each drift adds "
        "up: n(n-1)/2 for D_stale (update i sees the i-1 earlier shifts), n for D_teamtr. With "
        "coherent shifts alpha(drift) ~ term_count_alpha + alpha(mean_update_shift)."
    ),
    "alpha": (
        "Least-squares slope of log(mean over seeds) against log(n); spread: 2.5-97.5% "
        "percentiles and std over bootstrap resamples of the seeds within every n."
    ),
}

METRICS = (
    "drift",
    "train_true_mismatch",
    "step_shift",
    "mean_update_shift",
    "drift_in_update_shifts",
    "net_shift",
    "coherence",
    "surrogate_error",
    "surrogate_error_aggregate",
    "surrogate_error_signed",
    "certified_penalty",
    "drift_bound",
    "realised_gain",
    "certificate",
)


def parse_agents(text: str) -> list[int]:
    """'2..8' (inclusive range) or '2,4,8' -> sorted list of team sizes (each >= 2)."""
    try:
        if ".." in text:
            low, high = (int(part) for part in text.split("..", 1))
            values = list(range(low, high + 1))
        else:
            values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"--agents takes 'LOW..HIGH' or 'A,B,C', got {text!r}"
        ) from error
    if len(set(values)) < 2 or min(values) < 2:
        raise argparse.ArgumentTypeError(
            f"--agents needs at least two distinct team sizes >= 2 to fit an exponent, got {text!r}"
        )
    return sorted(set(values))


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Exact stages of stale and teamtr for n = 2..8 agents at a fixed per-agent KL radius: "
            "occupancy drift, surrogate error, certified penalty and realised gain against n, with "
            "fitted log-log exponents (THEORY.md Thm 3.6/3.7)."
        ),
    )
    options.add_json(parser)
    options.add_plot(parser, "draw the log-log figure here (PNG)")
    options.add_seed_count(parser, 24, "seeded MDPs (one stage each) per n: seeds 0..N-1")
    parser.add_argument(
        "--agents",
        type=parse_agents,
        default=parse_agents("2..8"),
        help="team sizes n: 2..8 or 2,4,8",
    )
    options.add_radius(parser, 0.02)
    parser.add_argument(
        "--radius-growth",
        choices=("constant", "linear"),
        default="constant",
        help="constant: delta_i = --radius for every n; linear: delta_i = --radius * n / n_min, "
        "which on this family keeps each update's occupancy shift about constant in n "
        "(E_d[TV_i] ~ sqrt(delta_i / 2n) when an agent owns 1/n of the occupancy)",
    )
    parser.add_argument(
        "--states-per-agent", type=int, default=6, help="states each agent owns in the ring MDP"
    )
    parser.add_argument("--actions", type=int, default=3, help="actions per state")
    parser.add_argument("--gamma", type=float, default=0.9, help="discount gamma")
    parser.add_argument(
        "--successors", type=int, default=3, help="random successors of each state-action pair"
    )
    parser.add_argument(
        "--concentration",
        type=float,
        default=1.0,
        help="Dirichlet concentration of the random starting team",
    )
    parser.add_argument(
        "--bootstrap", type=int, default=1000, help="bootstrap resamples for the spread of alpha"
    )
    return parser


def _validate(args: argparse.Namespace) -> str | None:
    return options.first_problem(
        options.seed_count_problem(args.seeds),
        options.radius_problem(args.radius),
        None if 0.0 < args.gamma < 1.0 else f"--gamma must lie in (0, 1), got {args.gamma}",
        None if args.bootstrap >= 1 else f"--bootstrap must be >= 1, got {args.bootstrap}",
        options.output_problem(args.json, "--json"),
        options.output_problem(args.plot, "--plot"),
    )


def radius_for(args: argparse.Namespace, n: int) -> float:
    """delta_i for a team of n agents under ``--radius-growth``."""
    if getattr(args, "radius_growth", "constant") == "linear":
        return float(args.radius * n / min(args.agents))
    return float(args.radius)


def metric_values(scheme: str, measurement: StageMeasurement) -> dict[str, float]:
    """One stage's value of every metric in ``METRICS``."""
    drift = measurement.train_true_mismatch if scheme == "stale" else measurement.step_shift
    return {
        "drift": drift,
        "train_true_mismatch": measurement.train_true_mismatch,
        "step_shift": measurement.step_shift,
        "mean_update_shift": (
            measurement.step_shift / measurement.kept_updates
            if measurement.kept_updates
            else math.nan
        ),
        "drift_in_update_shifts": (
            drift * measurement.kept_updates / measurement.step_shift
            if measurement.step_shift > 0
            else math.nan
        ),
        "net_shift": measurement.net_shift,
        "coherence": measurement.coherence,
        "surrogate_error": measurement.surrogate_error,
        "surrogate_error_aggregate": abs(measurement.surrogate_error_signed),
        "surrogate_error_signed": measurement.surrogate_error_signed,
        "certified_penalty": measurement.certified_penalty,
        "drift_bound": measurement.drift_bound,
        "realised_gain": measurement.realised_gain,
        "certificate": measurement.certificate,
    }


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Run every (n, seed, scheme) stage; return per-scheme, per-metric, per-n value lists."""
    values: dict[str, dict[str, list[list[float]]]] = {
        scheme: {metric: [[] for _ in args.agents] for metric in METRICS} for scheme in SCHEMES
    }
    sign_agreement: list[list[float]] = [[] for _ in args.agents]
    jobs = [(j, n, seed) for j, n in enumerate(args.agents) for seed in range(args.seeds)]
    for j, n, seed in tqdm(
        jobs,
        desc="scaling",
        unit="stage pair",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),  # bars only on a terminal, not in logs
    ):
        mdp = turn_taking_ring(
            n,
            states_per_agent=args.states_per_agent,
            n_actions=args.actions,
            gamma=args.gamma,
            successors=args.successors,
            seed=seed,
        )
        start = sim.random_team(mdp, np.random.default_rng([seed, n]), args.concentration)
        evaluations = ExactEvaluations(mdp)
        for scheme in SCHEMES:
            config = StageConfig(
                scheme=scheme, radius=radius_for(args, n), order="fixed", seed=seed
            )
            trace = run_recorded_stage(mdp, start, config, evaluations)
            measurement = measure_stage(mdp, trace, evaluations)
            for metric, value in metric_values(scheme, measurement).items():
                values[scheme][metric][j].append(value)
            if scheme == "stale" and measurement.surrogate_error_signed != 0:
                errors = np.asarray(measurement.per_update_error)
                agree = np.sign(errors) == np.sign(measurement.surrogate_error_signed)
                sign_agreement[j].append(float(agree.mean()))
    return {"values": values, "sign_agreement": sign_agreement}


def summarise(
    args: argparse.Namespace, collected: dict[str, Any], seconds: float
) -> dict[str, Any]:
    """Means, spreads and fitted exponents of every metric; the JSON document of the command."""
    values = collected["values"]
    n_values = list(args.agents)
    metrics: dict[str, dict[str, Any]] = {}
    alpha_all: dict[str, dict[str, Any]] = {}
    for scheme in SCHEMES:
        metrics[scheme] = {}
        alpha_all[scheme] = {}
        for metric in METRICS:
            groups = [np.asarray(v, dtype=np.float64) for v in values[scheme][metric]]
            metrics[scheme][metric] = {
                "mean": [finite_or_none(float(np.mean(g))) for g in groups],
                "std": [finite_or_none(float(np.std(g))) for g in groups],
                "values": [[finite_or_none(float(x)) for x in g] for g in groups],
            }
            fit = fit_exponent(n_values, groups, n_bootstrap=args.bootstrap, seed=0)
            alpha_all[scheme][metric] = fit.as_json()
    alpha = {scheme: alpha_all[scheme]["drift"]["alpha"] for scheme in SCHEMES}
    stale_means = np.asarray(metrics["stale"]["drift"]["mean"], dtype=np.float64)
    teamtr_means = np.asarray(metrics["teamtr"]["drift"]["mean"], dtype=np.float64)
    ratio = stale_means / teamtr_means
    n_array = np.asarray(n_values, dtype=np.float64)
    # How many ||.||_1 terms each drift sums, as n grows: stale sum_i sum_{k<i} (n(n-1)/2 update
    # shifts, Thm 3.7), teamtr n. Their log-log slopes over these n are what constant, perfectly
    # coherent per-update shifts would give.
    term_counts = {
        "stale": loglog_slope(n_array, n_array * (n_array - 1) / 2)[0],
        "teamtr": loglog_slope(n_array, n_array)[0],
    }
    aggregate = aggregate_error_analysis(n_values, metrics, alpha_all, collected["sign_agreement"])
    return {
        "n": n_values,
        "alpha": alpha,
        "alpha_spread": {
            scheme: {
                "bootstrap_std": alpha_all[scheme]["drift"]["bootstrap_std"],
                "ci95": alpha_all[scheme]["drift"]["ci95"],
            }
            for scheme in SCHEMES
        },
        "alpha_gap": (
            None
            if alpha["stale"] is None or alpha["teamtr"] is None
            else alpha["stale"] - alpha["teamtr"]
        ),
        "drift_ratio_stale_over_teamtr": [finite_or_none(float(r)) for r in ratio],
        "term_count_alpha": term_counts,
        "alpha_in_update_shifts": {
            scheme: alpha_all[scheme]["drift_in_update_shifts"]["alpha"] for scheme in SCHEMES
        },
        "metrics": metrics,
        "alpha_all": alpha_all,
        "aggregate_stale_error": aggregate,
        "definitions": DEFINITIONS,
        "papers": dict(PAPERS_ALPHA),
        "setup": {
            "family": "turn_taking_ring",
            "family_note": (
                "n agents on a ring, states_per_agent states each, every transition passes the "
                "turn to the next agent, uniform start: each agent holds exactly 1/n of the "
                "occupancy for every team. One exact stage per (n, seed), fixed order 0..n-1, "
                "stale and teamtr from the same random starting team, exact advantages."
            ),
            "radius": args.radius,
            "radius_growth": getattr(args, "radius_growth", "constant"),
            "seeds": args.seeds,
            "states_per_agent": args.states_per_agent,
            "actions": args.actions,
            "gamma": args.gamma,
            "successors": args.successors,
            "concentration": args.concentration,
            "bootstrap": args.bootstrap,
            "seconds": round(seconds, 2),
        },
    }


def aggregate_error_analysis(
    n_values: list[int],
    metrics: dict[str, dict[str, Any]],
    alpha_all: dict[str, dict[str, Any]],
    sign_agreement: list[list[float]],
) -> dict[str, Any]:
    """Does |sum_i e_i| of the stale scheme grow like n^2? It does only if the errors agree in sign."""
    stale = metrics["stale"]
    summed_abs = np.asarray(stale["surrogate_error"]["mean"], dtype=np.float64)
    aggregate = np.asarray(stale["surrogate_error_aggregate"]["mean"], dtype=np.float64)
    alpha_aggregate = alpha_all["stale"]["surrogate_error_aggregate"]["alpha"]
    alpha_summed = alpha_all["stale"]["surrogate_error"]["alpha"]
    agreement = [float(np.mean(a)) if a else None for a in sign_agreement]
    if alpha_aggregate is None:
        finding = "the aggregate stale error has a non-positive mean at some n; no exponent fitted"
    else:
        closeness = "consistent with" if abs(alpha_aggregate - 2.0) <= 0.3 else "not"
        finding = (
            f"|sum_i e_i| (stale) grows like n^{alpha_aggregate:.2f}, {closeness} n^2; the sum of "
            f"|e_i| grows like n^{alpha_summed:.2f}; on average "
            f"{100 * float(np.nanmean([a for a in agreement if a is not None])):.0f}% of a stage's "
            "per-update errors share the sign of the aggregate"
        )
    return {
        "alpha_aggregate": alpha_aggregate,
        "alpha_sum_of_abs": alpha_summed,
        "cancellation_ratio": [finite_or_none(float(x)) for x in aggregate / summed_abs],
        "sign_agreement": agreement,
        "finding": finding,
        "definitions": {
            "cancellation_ratio": "mean |sum_i e_i| / mean sum_i |e_i| per n (1: no cancellation)",
            "sign_agreement": "mean fraction of a stage's e_i with the sign of sum_i e_i, per n",
        },
    }


def print_summary(result: dict[str, Any]) -> None:
    metrics = result["metrics"]
    print(
        f"{'n':>3} {'D_stale':>10} {'D_teamtr':>10} {'ratio':>7} {'err_stale':>10} "
        f"{'err_teamtr':>10} {'pen_stale':>10} {'pen_teamtr':>10}"
    )
    for j, n in enumerate(result["n"]):
        print(
            f"{n:>3} {metrics['stale']['drift']['mean'][j]:>10.4g} "
            f"{metrics['teamtr']['drift']['mean'][j]:>10.4g} "
            f"{result['drift_ratio_stale_over_teamtr'][j]:>7.3g} "
            f"{metrics['stale']['surrogate_error']['mean'][j]:>10.4g} "
            f"{metrics['teamtr']['surrogate_error']['mean'][j]:>10.4g} "
            f"{metrics['stale']['certified_penalty']['mean'][j]:>10.4g} "
            f"{metrics['teamtr']['certified_penalty']['mean'][j]:>10.4g}"
        )
    for scheme in SCHEMES:
        spread = result["alpha_spread"][scheme]["ci95"]
        alpha = result["alpha"][scheme]
        shown = "n/a" if alpha is None else f"{alpha:.3f}"
        print(
            f"alpha[{scheme}] (drift) = {shown}  95% bootstrap {spread}  "
            f"(papers: {result['papers'][scheme]})"
        )
    for scheme in SCHEMES:
        parts = []
        for metric, fit in result["alpha_all"][scheme].items():
            if fit["alpha"] is not None:
                parts.append(f"{metric}={fit['alpha']:.2f}")
        print(f"  {scheme}: " + ", ".join(parts))
    print("aggregate stale error: " + result["aggregate_stale_error"]["finding"])


def write_json(path: Path, document: dict[str, Any]) -> None:
    options.prepared(path).write_text(json.dumps(document, indent=2, allow_nan=False) + "\n")


def run(args: argparse.Namespace) -> int:
    problem = _validate(args)
    if problem is not None:
        return options.refuse("teamtr scaling", problem)
    began = time.perf_counter()
    collected = collect(args)
    result = summarise(args, collected, time.perf_counter() - began)
    print_summary(result)
    if args.json is not None:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    if args.plot is not None:
        from studies.tabular.scaling_plot import plot_scaling

        plot_scaling(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
