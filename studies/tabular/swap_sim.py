"""``teamtr swap-sim``: the exact swap-shock study (THEORY.md §2, "Stage-0 alignment").

Per seed, on one instance of a built-in family (exact values throughout):

1. train a team pi_A with a few exact TeamTR stages from a random start;
2. train a donor team pi_B the same way from another random start, for more stages: its agents
   are plausibly good but were trained against other teammates, the tabular analogue of a
   model from another run (or a larger model) that is dropped into the team;
3. replace agent k of pi_A by pi_B's agent k directly, and after Stage-0 alignment with radius
   delta0 (``sim.agent_alignment.align_agent``); record J right after each swap (the swap shock) and
   after further TeamTR stages from each team, next to pi_A trained on without any swap;
4. check that the Thm 3.4 certificate of the aligned swap (an update of agent k with
   KL(pi_new || pi_cur)(s) <= delta0) lies below its realised change, on every seed and for
   every delta0 of the sweep;
5. SAT-style upgrade: replace agents 0..n-2 of pi_A by pi_B's, then all n, directly versus one
   aligned swap after another (each certified by Thm 3.4; the sum telescopes as in Thm 3.6).

Scores are also reported normalised, (J - J_uniform) / (J_max - J_uniform): 0 for the team that
plays uniformly at random, 1 for the optimal policy (like accuracy above chance), so that
relative improvements read like the papers' accuracy ratios (TeamTR: aligned swap +27% over direct; SAT:
56.5 -> 66.9 -> 70.4 after upgrading two agents, then all three).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tqdm import tqdm

import sim
from sim.agent_alignment import SwapCertificate, align_agent, swap_certificate
from studies import options
from studies.tabular.families import FAMILIES, build_family
from studies.tabular.swap_sim_settings import REPLACEMENTS, StudySettings
from studies.tabular.swap_sim_summary import PAPER_CLAIMS, print_summary, summarise
from studies.tabular.training import Trainer

OTHER_TEAM_CONCENTRATION = 0.3
"""Dirichlet concentration of the frozen teammates an ``other-team`` replacement is trained with:
small, so that those teammates have decided habits that differ from the trained team's."""
DEFINITIONS: dict[str, str] = {
    "J": "exact J of a team (sim.evaluate)",
    "score": (
        "(J - J_uniform) / (J_max - J_uniform): 0 for the uniform random team, 1 for the best "
        "policy (value iteration); negative below chance"
    ),
    "shock": "J(trained team) - J(team right after the swap); positive means the swap hurt",
    "further": "J after each of the further TeamTR stages trained from the swapped team",
    "relative_improvement": (
        "mean score(aligned) / mean score(direct) - 1 over seeds (the papers' +27% is such a "
        "ratio); per_seed_mean is the mean of the per-seed ratios"
    ),
    "certificate": (
        "Thm 3.4 for the swap as an update of agent k from the trained team: "
        "L - penalty(eps, E_d[KL]); covers = realised change >= every form of the bound"
    ),
}


REPLACEMENT_UNIFORM_MIX = 1e-3
"""The replacement is the donor's agent mixed with this much of the uniform policy. A softmax
model never gives an action probability 0, and the Stage-0 problem needs it: where pi_pre is a
point mass on an action pi_cur rarely takes, no policy inside supp(pi_pre) meets the radius."""


def replacement_table(donor: sim.TabularTeam) -> NDArray[np.float64]:
    """The donor team's table as the replacement model for any of its agents (full support)."""
    n_actions = donor.table.shape[1]
    table: NDArray[np.float64] = (
        1.0 - REPLACEMENT_UNIFORM_MIX
    ) * donor.table + REPLACEMENT_UNIFORM_MIX / n_actions
    return table


SEED_KEYS: tuple[str, ...] = (
    "seed",
    "agent",
    "states",
    "J_uniform",
    "J_max",
    "J_trained_curve",
    "J_donor_curve",
    "J_trained",
    "J_donor",
    "J_replacement_team",
    "no_swap",
    "direct",
    "aligned",
    "sweep",
    "upgrade",
)
"""The fields of one seed's record in the JSON output (``study_seed``)."""


class SwapCertificateViolation(AssertionError):
    """An aligned swap changed J by less than its exact Thm 3.4 certificate (never tolerated)."""


def optimal_value(mdp: sim.TurnTakingMDP, tolerance: float = 1e-12) -> float:
    """J_max, the best J of any policy, by value iteration.

    Discounted: V <- max_a [R + gamma P V] (a gamma-contraction) until the update is below
    ``tolerance`` (1 - gamma); episodic: H steps of backward induction (the best time-dependent
    policy, an upper bound for the stationary teams trained here).
    """
    n_states, n_actions = mdp.n_states, mdp.n_actions
    values = np.zeros(n_states)
    steps = mdp.horizon if mdp.horizon is not None else 100_000
    for _ in range(steps):
        q = mdp.R + mdp.gamma * (mdp.P @ values).reshape(n_states, n_actions)
        updated = q.max(axis=1)
        change = float(np.max(np.abs(updated - values)))
        values = updated
        if mdp.horizon is None and change < tolerance * (1.0 - mdp.gamma):
            break
    return float(mdp.rho0 @ values)


def _certificate_record(certificate: SwapCertificate) -> dict[str, Any]:
    record = certificate.as_dict()
    # JSON has no infinity: a direct swap onto an action the current agent never takes has
    # KL = inf and a vacuous certificate; write those as null.
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()
    }


def _check_covers(certificate: SwapCertificate, where: str) -> None:
    if not certificate.covers:
        raise SwapCertificateViolation(
            f"{where}: aligned swap changed J by {certificate.realised_gain:.6g} < certificate "
            f"{certificate.certificate:.6g}"
        )


def upgrade_team(
    mdp: sim.TurnTakingMDP,
    team: sim.TabularTeam,
    replacement: NDArray[np.float64],
    agents: Sequence[int],
    delta0: float | None,
) -> tuple[sim.TabularTeam, list[SwapCertificate]]:
    """Replace ``agents`` of ``team`` by ``replacement``'s one by one, aligned when ``delta0``.

    Each swap is certified by Thm 3.4 against the team it starts from, so the certificates add
    up to a lower bound on the whole upgrade (the telescoping of Thm 3.6).
    """
    certificates = []
    for agent in agents:
        if delta0 is None:
            certificates.append(swap_certificate(mdp, team, agent, replacement))
            team = team.with_agent(agent, replacement)
        else:
            aligned = align_agent(mdp, team, agent, replacement, delta0)
            certificates.append(aligned.certificate)
            team = aligned.team(team)
    return team, certificates


def study_seed(settings: StudySettings, seed: int) -> dict[str, Any]:
    """The whole study on one seeded instance; raises if a certificate fails."""
    mdp = build_family(settings.family, seed)
    j_uniform = sim.evaluate(mdp, sim.uniform_team(mdp).table).J
    j_max = optimal_value(mdp)
    trainer = Trainer(mdp, settings.radius, seed)
    agent = settings.agent if settings.agent is not None else seed % mdp.n_agents
    if not 0 <= agent < mdp.n_agents:
        raise ValueError(f"--agent must lie in [0, {mdp.n_agents}), got {agent}")
    further = settings.further_stages

    start = sim.random_team(mdp, np.random.default_rng([seed, 0]), settings.concentration)
    donor_start = sim.random_team(mdp, np.random.default_rng([seed, 1]), settings.concentration)
    trained, trained_curve = trainer.train(start, settings.train_stages, "trained team")
    donor, donor_curve = trainer.train(donor_start, settings.donor_stages, "donor team")
    upgrade_replacement = replacement_table(donor)
    if settings.replacement == "other-run":
        replacement, replacement_team_j = upgrade_replacement, donor_curve[-1]
    else:
        teammates = sim.random_team(
            mdp, np.random.default_rng([seed, 2]), OTHER_TEAM_CONCENTRATION
        ).with_agent(agent, donor_start.table)
        # agent k trained alone: one trust-region update of agent k per stage, the others frozen.
        other_team, other_curve = trainer.train(
            teammates, settings.donor_stages, f"agent {agent} alone", order=(agent,)
        )
        replacement, replacement_team_j = replacement_table(other_team), other_curve[-1]
    current = sim.evaluate(mdp, trained.table)
    _, no_swap_curve = trainer.train(trained, further, "no swap")

    direct = swap_certificate(mdp, trained, agent, replacement, current=current)
    _, direct_curve = trainer.train(trained.with_agent(agent, replacement), further, "direct")

    def aligned_run(delta0: float) -> dict[str, Any]:
        result = align_agent(mdp, trained, agent, replacement, delta0, current=current)
        _check_covers(result.certificate, f"seed {seed}, delta0 {delta0}")
        _, curve = trainer.train(result.team(trained), further, f"aligned delta0={delta0}")
        return {
            "delta0": delta0,
            "J_swap": result.certificate.j_after,
            "J_further": curve[1:],
            "active_fraction": float(result.active.sum() / mdp.states_of(agent).sum()),
            "expected_kl_to_pre": result.expected_kl_to_pre,
            "expected_kl_to_cur": result.expected_kl_to_cur,
            "max_kl_to_cur": result.max_kl_to_cur,
            "certificate": _certificate_record(result.certificate),
        }

    sweep = [aligned_run(delta0) for delta0 in settings.sweep if delta0 != settings.delta0]
    aligned = aligned_run(settings.delta0)
    sweep = sorted([*sweep, aligned], key=lambda row: row["delta0"])

    upgrade: dict[str, Any] = {}
    all_but_last = list(range(mdp.n_agents - 1))
    for mode, delta0 in (("direct", None), ("aligned", settings.delta0)):
        team_partial, certs_partial = upgrade_team(
            mdp, trained, upgrade_replacement, all_but_last, delta0
        )
        team_full, certs_last = upgrade_team(
            mdp, team_partial, upgrade_replacement, [mdp.n_agents - 1], delta0
        )
        certificates = certs_partial + certs_last
        if delta0 is not None:
            for step, certificate in enumerate(certificates):
                _check_covers(certificate, f"seed {seed}, aligned upgrade step {step}")
        _, curve = trainer.train(team_full, further, f"{mode} upgrade")
        certificate_sum = float(sum(c.certificate for c in certificates))
        upgrade[mode] = {
            "J": [current.J, certs_partial[-1].j_after, certs_last[-1].j_after],
            "J_further": curve[1:],
            "certificate_sum": certificate_sum if math.isfinite(certificate_sum) else None,
            "covers": all(c.covers for c in certificates),
        }

    return {
        "seed": seed,
        "agent": agent,
        "states": mdp.n_states,
        "J_uniform": j_uniform,
        "J_max": j_max,
        "J_trained_curve": trained_curve,
        "J_donor_curve": donor_curve,
        "J_trained": current.J,
        "J_donor": donor_curve[-1],
        "J_replacement_team": replacement_team_j,
        "no_swap": {"J_further": no_swap_curve[1:]},
        "direct": {
            "J_swap": direct.j_after,
            "J_further": direct_curve[1:],
            "expected_kl_to_cur": direct.expected_kl if math.isfinite(direct.expected_kl) else None,
            "certificate": _certificate_record(direct),
        },
        "aligned": aligned,
        "sweep": sweep,
        "upgrade": upgrade,
    }


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Exact swap-shock study: replace one agent of a trained team by an agent trained in "
            "another run, directly or after Stage-0 alignment, then train on with TeamTR."
        ),
    )
    options.add_seed_count(parser, 20, "seeded instances (one study each): seeds 0..N-1")
    options.add_json(parser)
    options.add_plot(parser)
    parser.add_argument(
        "--family",
        default="ring",
        help=f"built-in MDP family, one of {', '.join(FAMILIES)}",
    )
    parser.add_argument(
        "--train-stages", type=int, default=4, help="TeamTR stages that train the team pi_A"
    )
    parser.add_argument(
        "--donor-stages",
        type=int,
        default=8,
        help="TeamTR stages that train the donor team pi_B (the replacement's own run)",
    )
    parser.add_argument(
        "--further-stages", type=int, default=4, help="TeamTR stages trained after the swap"
    )
    options.add_radius(parser, 0.05)
    parser.add_argument(
        "--delta0",
        type=float,
        default=0.05,
        help="delta0, the Stage-0 radius: KL(pi_new || pi_cur)(s) <= delta0 on agent k's states",
    )
    parser.add_argument(
        "--delta0-sweep",
        default="0.01,0.05,0.2,1,5",
        help="comma-separated delta0 values, each also aligned and trained on",
    )
    parser.add_argument(
        "--agent",
        type=int,
        default=None,
        help="the replaced agent k (default: seed mod n, so every agent is replaced on some seed)",
    )
    parser.add_argument(
        "--replacement",
        choices=sorted(REPLACEMENTS),
        default="other-team",
        help="; ".join(f"{k}: {v}" for k, v in REPLACEMENTS.items()),
    )
    parser.add_argument(
        "--concentration",
        type=float,
        default=1.0,
        help="Dirichlet concentration of the random start teams",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        settings = StudySettings.from_args(args)
    except ValueError as error:
        return options.refuse("teamtr swap-sim", str(error))
    problem = options.first_problem(
        options.output_problem(args.json, "--json"), options.output_problem(args.plot, "--plot")
    )
    if problem is not None:
        return options.refuse("teamtr swap-sim", problem)
    began = time.perf_counter()
    runs = [
        study_seed(settings, seed)
        for seed in tqdm(
            range(settings.seeds),
            desc="swap-sim",
            unit="seed",
            file=sys.stderr,
            disable=not sys.stderr.isatty(),  # bars only on a terminal, not in logs
        )
    ]
    summary = summarise(runs, settings)
    result = {
        "family": {settings.family: FAMILIES[settings.family]},
        "settings": {
            "seeds": settings.seeds,
            "train_stages": settings.train_stages,
            "donor_stages": settings.donor_stages,
            "further_stages": settings.further_stages,
            "radius": settings.radius,
            "delta0": settings.delta0,
            "delta0_sweep": list(settings.sweep),
            "agent": "seed mod n" if settings.agent is None else settings.agent,
            "concentration": settings.concentration,
            "replacement": {settings.replacement: REPLACEMENTS[settings.replacement]},
            "upgrade_donor": REPLACEMENTS["other-run"],
            "seconds": round(time.perf_counter() - began, 2),
        },
        "paper_claims": PAPER_CLAIMS,
        "definitions": DEFINITIONS,
        "summary": summary,
        "runs": runs,
    }
    print_summary(summary, settings)
    if args.json is not None:
        options.prepared(args.json).write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
        print(f"wrote {args.json}")
    if args.plot is not None:
        from studies.tabular.swap_sim_plot import plot_swap_sim  # matplotlib only when drawing

        print(f"wrote {plot_swap_sim(result, args.plot)}")
    return 0
