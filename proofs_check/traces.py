"""Stage traces pi_hat^0 .. pi_hat^n with exact evaluations, and their seeded drawing.

A ``Trace`` is one stage of an MDP: its start team, order and every intermediate team, each
evaluated exactly by ``proofs_check.oracle``; ``update_terms`` gives update i's quantities of
Theorems 3.4-3.7 (surrogate, divergences, advantage bound, realised gain).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from proofs_check import oracle
from proofs_check.instances import (
    Direction,
    TabularMDP,
    draw_radius,
    draw_tabular_mdp,
    draw_team,
    perturb_within_radius,
    tilt,
)
from teamtr.divergence import expected, kl, tv
from teamtr.penalty import DiscountedPenalty, EpisodicPenalty
from teamtr.surrogate import exact_surrogate
from teamtr.turns import replace_agent_rows

FloatArray = NDArray[np.float64]


# --- stage traces: pi_hat^0 .. pi_hat^n with exact evaluations -------------------------------

Proposal = Callable[[int, FloatArray, FloatArray], FloatArray]
"""(agent k, team table pi_hat^{i-1}, its occupancy d) -> a full table whose rows at agent k's
states are the target pi_tar^k."""


def random_proposal(
    mdp: TabularMDP, rng: np.random.Generator, direction: Direction, radii: Sequence[float]
) -> Proposal:
    """Random trust-region steps: agent k's rows tilted until E_d[KL] (``direction``) = delta_k."""

    def propose(agent: int, table: FloatArray, d: FloatArray) -> FloatArray:
        rows = mdp.agent_of_state == agent
        return perturb_within_radius(table, rows, d, radii[agent], direction, rng)

    return propose


@dataclass(frozen=True)
class Trace:
    """The intermediate teams of one stage and their exact evaluations (THEORY.md §1)."""

    mdp: TabularMDP
    order: tuple[int, ...]
    tables: tuple[FloatArray, ...]
    """pi_hat^0 = pi_cur, ..., pi_hat^n = pi_bar."""
    evaluations: tuple[oracle.Discounted | oracle.Episodic, ...]


def stage_trace(
    mdp: TabularMDP, start: FloatArray, order: Sequence[int], propose: Proposal
) -> Trace:
    """pi_hat^i = pi_hat^{i-1} with agent sigma(i) replaced by its target (THEORY.md §1)."""
    evaluate = oracle.discounted if mdp.horizon is None else oracle.episodic
    tables = [np.asarray(start, dtype=np.float64)]
    evaluations = [evaluate(mdp, tables[0])]
    for agent in order:
        target = propose(agent, tables[-1], evaluations[-1].d)
        tables.append(replace_agent_rows(tables[-1], target, mdp.agent_of_state, agent))
        evaluations.append(evaluate(mdp, tables[-1]))
    return Trace(mdp, tuple(int(k) for k in order), tuple(tables), tuple(evaluations))


@dataclass(frozen=True)
class UpdateTerms:
    """The exact terms of Theorem 3.4 for update i (pi_hat^{i-1} -> pi_hat^i)."""

    gain: float
    """J(pi_hat^i) - J(pi_hat^{i-1})."""
    surrogate: float
    """L_i, under d_{pi_hat^{i-1}} and A_{pi_hat^{i-1}}."""
    surrogate_stage_start_occupancy: float
    """L_i with d_{pi_cur} in place of d_{pi_hat^{i-1}} (same advantage): the stale occupancy."""
    advantage_bound: float
    """eps_i = max_s |E_{a ~ pi_hat^i} A_{pi_hat^{i-1}}(s, a)| (max over t too, episodic)."""
    mean_tv: float
    """E_{d_{pi_hat^{i-1}}}[TV_i]."""
    mean_kl_reverse: float
    """E_{d_{pi_hat^{i-1}}}[KL(pi_hat^i || pi_hat^{i-1})]."""
    mean_kl_forward: float
    """E_{d_{pi_hat^{i-1}}}[KL(pi_hat^{i-1} || pi_hat^i)]."""
    tv_per_step: FloatArray | None = None
    """Episodic only: E_{rho_u}[TV_i] for u = 0 .. H-1."""


def update_terms(trace: Trace, i: int) -> UpdateTerms:
    """Terms of the i-th update (1-based: pi_hat^{i-1} -> pi_hat^i)."""
    before, after = trace.tables[i - 1], trace.tables[i]
    ev_before, ev_after = trace.evaluations[i - 1], trace.evaluations[i]
    d0 = trace.evaluations[0].d
    tv_s, kl_rev_s, kl_fwd_s = tv(after, before), kl(after, before), kl(before, after)
    gain = ev_after.J - ev_before.J
    mean_tv = expected(tv_s, ev_before.d)
    mean_kl_reverse = expected(kl_rev_s, ev_before.d)
    mean_kl_forward = expected(kl_fwd_s, ev_before.d)
    if isinstance(ev_before, oracle.Discounted):
        scale = 1.0 / (1.0 - trace.mdp.gamma)
        return UpdateTerms(
            gain=gain,
            surrogate=exact_surrogate(after, ev_before.A, ev_before.d, scale),
            surrogate_stage_start_occupancy=exact_surrogate(after, ev_before.A, d0, scale),
            advantage_bound=float(np.max(np.abs(np.sum(after * ev_before.A, axis=1)))),
            mean_tv=mean_tv,
            mean_kl_reverse=mean_kl_reverse,
            mean_kl_forward=mean_kl_forward,
        )
    assert isinstance(ev_before, oracle.Episodic)
    gains_per_state = np.sum(after[None] * ev_before.A, axis=2)  # (H, S)
    rho0_steps = trace.evaluations[0]
    assert isinstance(rho0_steps, oracle.Episodic)
    return UpdateTerms(
        gain=gain,
        surrogate=float(np.sum(ev_before.rho * gains_per_state)),
        surrogate_stage_start_occupancy=float(np.sum(rho0_steps.rho * gains_per_state)),
        advantage_bound=float(np.max(np.abs(gains_per_state))),
        mean_tv=mean_tv,
        mean_kl_reverse=mean_kl_reverse,
        mean_kl_forward=mean_kl_forward,
        tv_per_step=ev_before.rho @ tv_s,
    )


def all_update_terms(trace: Trace) -> list[UpdateTerms]:
    return [update_terms(trace, i) for i in range(1, len(trace.tables))]


def to_sim(mdp: TabularMDP, sparse: bool = False):
    """The same MDP as a ``sim.TurnTakingMDP`` (P passed dense S x A x S or sparse (S*A) x S)."""
    import scipy.sparse as sp

    from sim.mdp import TurnTakingMDP

    s, a = mdp.n_states, mdp.n_actions
    P = sp.csr_matrix(mdp.P.reshape(s * a, s)) if sparse else mdp.P
    return TurnTakingMDP(
        P, mdp.R, mdp.rho0, mdp.gamma, mdp.agent_of_state, mdp.horizon, n_agents=mdp.n_agents
    )


@dataclass(frozen=True)
class ExactRolloutsView:
    """What ``sim.ExactUpdater`` reads from rollouts, filled from the independent oracle:
    the occupancy d of pi_hat^{i-1}, its advantage (episodic: A_bar, the rho-weighted average
    of A_t) and the surrogate scale (1/(1-gamma), or H)."""

    occupancy: FloatArray
    advantage: FloatArray
    surrogate_scale: float


def exact_rollouts(mdp: TabularMDP, evaluation: oracle.Discounted | oracle.Episodic):
    """The exact decision points of a team, in the form ``sim.ExactUpdater`` consumes."""
    if isinstance(evaluation, oracle.Discounted):
        return ExactRolloutsView(evaluation.d, evaluation.A, 1.0 / (1.0 - mdp.gamma))
    mass = evaluation.rho.sum(axis=0)
    weighted = np.einsum("ts,tsa->sa", evaluation.rho, evaluation.A)
    a_bar = np.where(mass[:, None] > 0, weighted / np.where(mass > 0, mass, 1.0)[:, None], 0.0)
    assert mdp.horizon is not None
    return ExactRolloutsView(evaluation.d, a_bar, float(mdp.horizon))


def exact_proposal(mdp: TabularMDP, direction: Direction, radii: Sequence[float]) -> Proposal:
    """Exact-optimal trust-region steps: ``sim.ExactUpdater`` (the maximiser of L_i subject to
    E_{d_{pi_hat^{i-1}}}[KL_i] <= delta_i) given the exact d and A of the intermediate team."""
    from sim.team import TabularTeam
    from sim.updates import ExactUpdater

    updater = ExactUpdater(to_sim(mdp), direction=direction)
    evaluate = oracle.discounted if mdp.horizon is None else oracle.episodic

    def propose(agent: int, table: FloatArray, d: FloatArray) -> FloatArray:
        team = TabularTeam(table, mdp.agent_of_state, n_agents=mdp.n_agents)
        rollouts = exact_rollouts(mdp, evaluate(mdp, table))
        update = updater.update(team, agent, rollouts, radii[agent])
        if not update.accepted:
            return table
        return np.asarray(team.with_agent(agent, update.policy).table)

    return propose


def mdp_penalty(mdp: TabularMDP) -> DiscountedPenalty | EpisodicPenalty:
    """The Thm 3.4 penalty constants of the MDP's setting."""
    if mdp.horizon is None:
        return DiscountedPenalty(mdp.gamma)
    return EpisodicPenalty(mdp.horizon)


# --- drawing the instances of a check from its seed ------------------------------------------


def draw_trace(
    rng: np.random.Generator,
    episodic: bool = False,
    direction: Direction = "reverse",
    min_agents: int = 1,
    exact: bool = False,
) -> Trace:
    """A random MDP, team and order; every agent takes a trust-region step of radius delta_k:
    a random one (``exact=False``) or the exact-optimal one of ``sim.ExactUpdater``."""
    mdp = draw_tabular_mdp(rng, episodic=episodic, min_agents=min_agents)
    start = draw_team(rng, mdp)
    radii = [draw_radius(rng) for _ in range(mdp.n_agents)]
    order = tuple(int(k) for k in rng.permutation(mdp.n_agents))
    if exact:
        return stage_trace(mdp, start, order, exact_proposal(mdp, direction, radii))
    return stage_trace(mdp, start, order, random_proposal(mdp, rng, direction, radii))


def draw_policy_pair(rng: np.random.Generator, mdp: TabularMDP) -> tuple[FloatArray, FloatArray]:
    """Two arbitrary teams: pi, and pi tilted on every state by a random step (any size)."""
    pi = draw_team(rng, mdp)
    step = float(np.exp(rng.uniform(np.log(1e-3), np.log(5.0))))
    return pi, tilt(pi, rng.standard_normal(pi.shape), step)
