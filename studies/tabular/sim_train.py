"""``teamtr sim-train``: multi-stage tabular training of every scheme, exact and sampled.

Schemes (THEORY.md §1-2, ``teamtr.schemes``):

- ``teamtr``: resample under the intermediate team before every agent update (Thm 3.4/3.6);
- ``stale``: every agent trained on the stage-start rollouts (Thm 3.7's naive baseline);
- ``joint``: every agent against the stage-start team, all swapped in at once;
- ``happo``: stage-start rollouts reweighted by the earlier agents' probability ratios;
- ``single``: one shared policy, i.e. the team treated as a single agent acting in every state,
  updated once per stage with the summed radius n*delta. By Lemma 3.1 a joint move of n agents
  each within delta has team-level E_d[KL] <= n*delta, so ``single`` spends the same KL budget per
  stage as the team, without the turn-taking factorisation.

Each family is trained from the same random team by every scheme, with exact advantages
(``sim.ExactSampler``) and with sampled ones (``sim.SampledSampler``). Exact ``teamtr`` updates
carry a valid Thm 3.4 certificate, so a kept update never gains less than its certificate and a
stage with a positive certificate never regresses: ``check_certified_improvement`` raises if
that ever fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm import tqdm

import sim
from studies import options
from studies.tabular.families import FAMILIES, build_family
from studies.tabular.training import IMPROVEMENT_TOLERANCE, check_certified_improvement
from teamtr import StageConfig, run_stages
from teamtr.config import SchemeName

SCHEMES = ("teamtr", "stale", "joint", "happo", "single")
SAMPLERS = ("exact", "sampled")


def as_single_agent(mdp: sim.TurnTakingMDP) -> sim.TurnTakingMDP:
    """The same MDP with one agent acting in every state (the ``single`` scheme's view)."""
    return sim.TurnTakingMDP(
        mdp.P,
        mdp.R,
        mdp.rho0,
        mdp.gamma,
        np.zeros(mdp.n_states, dtype=np.int64),
        horizon=mdp.horizon,
    )


@dataclass(frozen=True)
class RunSpec:
    """One training run: a family instance, the advantages, the per-agent radius, a scheme."""

    family: str
    seed: int
    sampler: str
    radius: float
    scheme: str

    @property
    def setting(self) -> str:
        return setting_label(self.sampler, self.radius)


def setting_label(sampler: str, radius: float) -> str:
    """How a column of results is named: the advantages and the per-agent radius."""
    return f"{sampler} δ={radius:g}"


def train_one(
    spec: RunSpec,
    mdp: sim.TurnTakingMDP,
    start: Any,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Train ``args.stages`` stages of one scheme from ``start``; return the per-stage record."""
    radius = spec.radius
    scheme = spec.scheme
    if scheme == "single":
        radius = spec.radius * mdp.n_agents
        mdp = as_single_agent(mdp)
        start = sim.TabularTeam(start.table, mdp.agent_of_state)
    # ``single`` is one agent, for which teamtr, stale and joint coincide; run it as teamtr.
    core_scheme: SchemeName = "teamtr" if scheme == "single" else scheme  # type: ignore[assignment]
    config = StageConfig(scheme=core_scheme, radius=radius, order=args.order, seed=spec.seed)
    if spec.sampler == "exact":
        sampler: Any = sim.ExactSampler(mdp)
    else:
        sampler = sim.SampledSampler(mdp, n_episodes=args.episodes, seed=spec.seed)
    updater = sim.ExactUpdater(mdp)

    def value(team: Any) -> float:
        return float(sim.evaluate(mdp, team.table).J)

    j_values = [value(start)]
    stages: list[dict[str, Any]] = []
    for index, (report, _team) in enumerate(
        run_stages(start, sampler, updater, config, mdp.penalty_model(), args.stages, value)
    ):
        if spec.sampler == "exact" and spec.scheme == "teamtr":
            check_certified_improvement(report, f"{spec} stage {index}")
        assert report.j_end is not None and report.realised_gain is not None
        j_values.append(report.j_end)
        stages.append(
            {
                "certificate": float(report.certificate),
                "realised_gain": float(report.realised_gain),
                "kept": sum(r.kept for r in report.records),
                "updates": len(report.records),
            }
        )
    return {
        "family": spec.family,
        "seed": spec.seed,
        "sampler": spec.sampler,
        "radius": spec.radius,
        "setting": spec.setting,
        "scheme": spec.scheme,
        "J": j_values,
        "stages": stages,
    }


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Multi-stage tabular training of teamtr, stale, joint, happo and a single shared "
            "policy on built-in families, with exact and with sampled advantages."
        ),
    )
    options.add_json(parser)
    options.add_plot(parser, "draw J per stage here (PNG)")
    parser.add_argument("--stages", type=int, default=15, help="stages of training per run")
    options.add_seed_count(parser, 3, "seeded instances per family: seeds 0..N-1")
    parser.add_argument(
        "--families",
        default=",".join(FAMILIES),
        help=f"comma-separated families from {', '.join(FAMILIES)}",
    )
    parser.add_argument(
        "--samplers", default=",".join(SAMPLERS), help="comma-separated: exact, sampled"
    )
    options.add_radius(parser, 0.05)
    parser.add_argument(
        "--large-radius",
        type=float,
        default=1.0,
        help="a second, near-greedy radius run with exact advantages only (0 to skip)",
    )
    parser.add_argument(
        "--order", choices=("fixed", "random"), default="fixed", help="update order sigma"
    )
    parser.add_argument(
        "--episodes", type=int, default=200, help="episodes per rollout batch (sampled runs)"
    )
    parser.add_argument(
        "--concentration", type=float, default=1.0, help="Dirichlet concentration of the start team"
    )
    return parser


def _split(text: str, allowed: tuple[str, ...] | dict[str, str], flag: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise ValueError(
            f"{flag}: unknown or empty {unknown or text!r}; choose from {list(allowed)}"
        )
    return names


def summarise(
    runs: list[dict[str, Any]], families: list[str], settings: list[str]
) -> dict[str, Any]:
    """Per (family, setting, scheme): J curve, final J, regressions, certificate vs realised gain;
    and how far every scheme ends from teamtr on the same instances."""
    table: list[dict[str, Any]] = []
    differences: list[dict[str, Any]] = []
    for family in families:
        for setting in settings:
            by_scheme = {
                scheme: [
                    r
                    for r in runs
                    if (r["family"], r["setting"], r["scheme"]) == (family, setting, scheme)
                ]
                for scheme in SCHEMES
            }
            for scheme, group in by_scheme.items():
                if not group:
                    continue
                curves = np.asarray([r["J"] for r in group])
                stages = [s for r in group for s in r["stages"]]
                gains = np.asarray([s["realised_gain"] for s in stages])
                certs = np.asarray([s["certificate"] for s in stages])
                scale = IMPROVEMENT_TOLERANCE * np.maximum(1.0, np.abs(curves[:, :-1].ravel()))
                table.append(
                    {
                        "family": family,
                        "setting": setting,
                        "sampler": group[0]["sampler"],
                        "radius": group[0]["radius"],
                        "scheme": scheme,
                        "J_start": float(curves[:, 0].mean()),
                        "J_final_mean": float(curves[:, -1].mean()),
                        "J_final_std": float(curves[:, -1].std()),
                        "J_mean_curve": [float(x) for x in curves.mean(axis=0)],
                        "stages": int(gains.size),
                        "regressions": int(np.sum(gains < -scale)),
                        "worst_regression": float(min(0.0, gains.min())),
                        "positive_certificates": int(np.sum(certs > 0)),
                        "certificate_violations": int(np.sum(certs > gains + scale)),
                        "mean_certificate": float(certs.mean()),
                        "mean_realised_gain": float(gains.mean()),
                    }
                )
            reference = {r["seed"]: r for r in by_scheme["teamtr"]}
            for scheme in SCHEMES:
                if scheme == "teamtr":
                    continue
                paired = [
                    (r["seed"], np.asarray(r["J"]) - np.asarray(reference[r["seed"]]["J"]))
                    for r in by_scheme[scheme]
                    if r["seed"] in reference
                ]
                if not paired:
                    continue
                final = np.asarray([diff[-1] for _, diff in paired])
                seed, widest = max(paired, key=lambda p: float(np.max(np.abs(p[1]))))
                stage = int(np.argmax(np.abs(widest)))
                differences.append(
                    {
                        "family": family,
                        "setting": setting,
                        "scheme": scheme,
                        "final_J_minus_teamtr_mean": float(final.mean()),
                        "final_J_minus_teamtr_std": float(final.std()),
                        "largest_gap": {
                            "seed": int(seed),
                            "stage": stage,
                            "J_minus_teamtr": float(widest[stage]),
                        },
                    }
                )
    return {"table": table, "differences": differences}


def print_table(summary: dict[str, Any]) -> None:
    print(
        f"{'family':<13}{'setting':<16}{'scheme':<8}{'J_start':>9}{'J_final':>10}{'±':>8}"
        f"{'regr':>6}{'cert>0':>8}{'viol':>6}{'mean_cert':>11}{'mean_gain':>11}"
    )
    for row in summary["table"]:
        print(
            f"{row['family']:<13}{row['setting']:<16}{row['scheme']:<8}{row['J_start']:>9.4f}"
            f"{row['J_final_mean']:>10.4f}{row['J_final_std']:>8.4f}"
            f"{row['regressions']:>3}/{row['stages']:<3}{row['positive_certificates']:>7}"
            f"{row['certificate_violations']:>6}{row['mean_certificate']:>11.4g}"
            f"{row['mean_realised_gain']:>11.4g}"
        )
    print("final J minus teamtr (mean ± std over seeds; largest gap at any stage):")
    for row in summary["differences"]:
        gap = row["largest_gap"]
        print(
            f"  {row['family']:<13}{row['setting']:<16}{row['scheme']:<8}"
            f"{row['final_J_minus_teamtr_mean']:+.4g} ± {row['final_J_minus_teamtr_std']:.2g}; "
            f"largest {gap['J_minus_teamtr']:+.4g} (seed {gap['seed']}, stage {gap['stage']})"
        )


PROG = "teamtr sim-train"


def _validate(args: argparse.Namespace) -> str | None:
    large = args.large_radius  # 0 skips the second run; any other value is a radius
    large_problem = None if large == 0 else options.radius_problem(large, "--large-radius")
    return options.first_problem(
        None if args.stages >= 1 else f"--stages must be >= 1, got {args.stages}",
        options.seed_count_problem(args.seeds),
        None if args.episodes >= 1 else f"--episodes must be >= 1, got {args.episodes}",
        options.radius_problem(args.radius),
        None if large_problem is None else f"{large_problem} (0 skips it)",
        options.output_problem(args.json, "--json"),
        options.output_problem(args.plot, "--plot"),
    )


def run(args: argparse.Namespace) -> int:
    try:
        families = _split(args.families, FAMILIES, "--families")
        samplers = _split(args.samplers, SAMPLERS, "--samplers")
    except ValueError as error:
        return options.refuse(PROG, str(error))
    problem = _validate(args)
    if problem is not None:
        return options.refuse(PROG, problem)
    began = time.perf_counter()
    pairs = [(sampler, args.radius) for sampler in samplers]
    if args.large_radius > 0 and "exact" in samplers:
        pairs.append(("exact", args.large_radius))
    settings = [setting_label(sampler, radius) for sampler, radius in pairs]
    specs = [
        RunSpec(family, seed, sampler, radius, scheme)
        for family in families
        for seed in range(args.seeds)
        for sampler, radius in pairs
        for scheme in SCHEMES
    ]
    runs: list[dict[str, Any]] = []
    instances: dict[tuple[str, int], tuple[sim.TurnTakingMDP, Any]] = {}
    for spec in tqdm(
        specs,
        desc="sim-train",
        unit="run",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),  # bars only on a terminal, not in logs
    ):
        key = (spec.family, spec.seed)
        if key not in instances:
            mdp = build_family(spec.family, spec.seed)
            rng = np.random.default_rng([spec.seed, 7])
            instances[key] = (mdp, sim.random_team(mdp, rng, args.concentration))
        mdp, start = instances[key]
        runs.append(train_one(spec, mdp, start, args))
    summary = summarise(runs, families, settings)
    result = {
        "families": {name: FAMILIES[name] for name in families},
        "schemes": list(SCHEMES),
        "samplers": samplers,
        "columns": settings,
        "settings": {
            "stages": args.stages,
            "seeds": args.seeds,
            "radius": args.radius,
            "large_radius": args.large_radius,
            "single_radius": "n * radius (the team's summed per-agent budget, Lemma 3.1)",
            "order": args.order,
            "episodes": args.episodes,
            "concentration": args.concentration,
            "seconds": round(time.perf_counter() - began, 2),
        },
        "definitions": DEFINITIONS,
        "summary": summary["table"],
        "differences": summary["differences"],
        "runs": runs,
    }
    print_table(summary)
    if args.json is not None:
        options.prepared(args.json).write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
        print(f"wrote {args.json}")
    if args.plot is not None:
        from studies.tabular.sim_train_plot import plot_sim_train

        plot_sim_train(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


DEFINITIONS: dict[str, str] = {
    "J": "exact J(pi) of the team before stage 1 and after every stage (sim.evaluate)",
    "regressions": "stages with J_end < J_start (beyond 1e-9 relative floating-point slack)",
    "certificate": (
        "the stage certificate the loop computes: sum_i [L_i - C_i sqrt(KL_i)] (Thm 3.6) over "
        "kept updates; joint: Thm 3.4 on the whole team move. Valid with exact inputs for teamtr "
        "and joint; for stale/happo it uses the stage-start occupancy (Thm 3.7 says what that "
        "misses); with sampled advantages it is an estimate (a proxy)."
    ),
    "certificate_violations": "stages whose realised gain is below their certificate",
    "single": "one shared policy: the team as a single agent acting in every state, radius n*delta",
}
