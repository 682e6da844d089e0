"""Every fact of THEORY.md §2 as a plain function ``check_xxx(instance_seed) -> slack``.

A slack is "bound side minus the quantity it bounds": >= 0 means the fact holds on that
instance. For an identity (performance difference, Lemma 3.1, the chain rule) the slack is
``1e-9 * scale - |left - right|``. Inequalities get only a floating-point allowance of
``FLOAT_SLACK * scale`` (scale = the magnitude of the compared quantities); no bound is ever
loosened. Statistical checks return the margin by which the observed statistic stays inside
its stated band.

The same slack functions (``*_slack``) take explicit instances; the hypothesis tests in
``proofs_check/test_*.py`` draw instances with ``proofs_check.strategies`` and assert the
slack is >= 0, while ``teamtr verify`` calls ``check_xxx`` on seeded random instances.
Exact values come from the independent dense oracle ``proofs_check.oracle``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, stats

from proofs_check import oracle
from proofs_check.instances import (
    Direction,
    MessagePair,
    TabularMDP,
    all_messages,
    draw_radius,
    draw_tabular_mdp,
    draw_team,
    perturb_within_radius,
    random_message_pair,
    random_policy_table,
    sample_messages,
    tilt,
    token_log_probs,
    token_logits_along,
)
from teamtr import bounds
from teamtr.alignment import stage0_projection
from teamtr.divergence import (
    expected,
    k1_estimator,
    k3_estimator,
    kl,
    log_softmax,
    message_kl_from_token_kls,
    token_kl_from_logits,
    tv,
)
from teamtr.penalty import DiscountedPenalty, EpisodicPenalty
from teamtr.surrogate import exact_surrogate
from teamtr.turns import replace_agent_rows, team_divergence_from_agent

FloatArray = NDArray[np.float64]

FLOAT_SLACK = 1e-10
"""Floating-point allowance of an inequality, relative to the scale of its two sides."""
IDENTITY_TOL = 1e-9
"""Tolerance of an exact identity, relative to the scale of its two sides."""
UNBIASED_Z = 5.0
"""Band of the unbiasedness checks: |sample mean - exact KL| <= 5 exact standard errors. Under
the normal approximation a correct estimator leaves it with probability 5.7e-7 per instance."""
UNBIASED_DRAWS = 4000
"""Messages drawn per unbiasedness check."""
HOEFFDING_ETA = 0.1
"""eta of the finite-sample term: it must cover the error in at least 1 - eta of repetitions."""
HOEFFDING_REPETITIONS = 400
"""Seeded repetitions per instance of the Hoeffding coverage check."""
STAGE0_RTOL = 1e-12
"""Relative accuracy of the Stage-0 bisection in the comparison with scipy.optimize."""
HOEFFDING_FALSE_ALARM = 1e-6
"""The coverage check allows failures up to the (1 - 1e-6) quantile of Binomial(reps, eta)."""


def _allowance(*magnitudes: float) -> float:
    return FLOAT_SLACK * max([1.0, *(abs(m) for m in magnitudes)])


def _identity_slack(left: float, right: float, scale: float) -> float:
    return IDENTITY_TOL * max(1.0, abs(scale), abs(left), abs(right)) - abs(left - right)


def value_scale(mdp: TabularMDP) -> float:
    """Magnitude of J and of A in this MDP: R_max/(1-gamma), or R_max H when episodic."""
    if mdp.horizon is not None:
        return mdp.r_max * mdp.horizon
    return mdp.r_max / (1.0 - mdp.gamma)


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


# --- performance difference and occupancy shift ----------------------------------------------


def performance_difference_slack(mdp: TabularMDP, pi: FloatArray, pi_new: FloatArray) -> float:
    """THEORY §2 performance difference: J(pi') - J(pi) = 1/(1-gamma) E_{d_pi', pi'}[A_pi]."""
    old, new = oracle.discounted(mdp, pi), oracle.discounted(mdp, pi_new)
    rhs = bounds.performance_difference_rhs(pi_new, old.A, new.d, mdp.gamma)
    return _identity_slack(new.J - old.J, rhs, value_scale(mdp))


def episodic_performance_difference_slack(
    mdp: TabularMDP, pi: FloatArray, pi_new: FloatArray
) -> float:
    """THEORY §2 episodic version: J(pi') - J(pi) = sum_t E_{rho_t^pi', pi'}[A_t^pi]."""
    old, new = oracle.episodic(mdp, pi), oracle.episodic(mdp, pi_new)
    rhs = bounds.episodic_performance_difference_rhs(pi_new, old.A, new.rho)
    return _identity_slack(new.J - old.J, rhs, value_scale(mdp))


def occupancy_shift_slack(mdp: TabularMDP, pi: FloatArray, pi_new: FloatArray) -> float:
    """THEORY §2: ||d_pi' - d_pi||_1 <= 2 gamma/(1-gamma) E_{d_pi}[TV(pi', pi)]."""
    old, new = oracle.discounted(mdp, pi), oracle.discounted(mdp, pi_new)
    shift = float(np.abs(new.d - old.d).sum())
    bound = bounds.occupancy_shift_bound(mdp.gamma, expected(tv(pi_new, pi), old.d))
    return bound - shift + _allowance(2.0 / (1.0 - mdp.gamma))


def occupancy_shift_sup_slack(mdp: TabularMDP, pi: FloatArray, pi_new: FloatArray) -> float:
    """THEORY §2, sup form: ||d_pi' - d_pi||_1 <= 2 gamma/(1-gamma) max_s TV(pi', pi)(s)."""
    old, new = oracle.discounted(mdp, pi), oracle.discounted(mdp, pi_new)
    shift = float(np.abs(new.d - old.d).sum())
    bound = bounds.occupancy_shift_bound_sup(mdp.gamma, float(np.max(tv(pi_new, pi))))
    return bound - shift + _allowance(2.0 / (1.0 - mdp.gamma))


def marginal_shift_slack(mdp: TabularMDP, pi: FloatArray, pi_new: FloatArray) -> float:
    """THEORY §2 episodic: ||rho_t^pi' - rho_t^pi||_1 <= 2 sum_{u<t} E_{rho_u^pi}[TV] for
    t = 1 .. H-1 (t = 0 is trivially 0 <= 0 and left out; H = 1 has nothing to check)."""
    assert mdp.horizon is not None
    if mdp.horizon < 2:
        raise ValueError("the marginal shift needs a horizon H >= 2")
    old, new = oracle.episodic(mdp, pi), oracle.episodic(mdp, pi_new)
    shifts = np.abs(new.rho - old.rho).sum(axis=1)
    limits = bounds.marginal_shift_bounds(old.rho @ tv(pi_new, pi))
    return float(np.min((limits - shifts)[1:])) + _allowance(2.0 * mdp.horizon)


def sim_evaluation_slack(mdp: TabularMDP, pi: FloatArray, sparse: bool) -> float:
    """THEORY §1 "all are exact in sim/": ``sim.evaluate`` agrees with the dense oracle on J,
    V, Q, A, d (and the episodic marginals rho) to IDENTITY_TOL relative to R_max/(1-gamma)."""
    from sim.evaluate import evaluate

    got = evaluate(to_sim(mdp, sparse), pi)
    if mdp.horizon is None:
        want: oracle.Discounted | oracle.Episodic = oracle.discounted(mdp, pi)
        pairs = [(got.V, want.V), (got.Q, want.Q), (got.A, want.A)]
    else:
        want = oracle.episodic(mdp, pi)
        assert got.rho is not None
        pairs = [(got.V, want.V[:-1]), (got.Q, want.Q), (got.A, want.A), (got.rho, want.rho)]
    scale = max(1.0, value_scale(mdp))
    worst = abs(got.J - want.J) / scale
    for a, b in pairs:
        worst = max(worst, float(np.max(np.abs(np.asarray(a) - b))) / scale)
    worst = max(worst, float(np.max(np.abs(got.d - want.d))))
    return IDENTITY_TOL - worst


# --- Lemma 3.1 ----------------------------------------------------------------------------------


def lemma_3_1_state_slack(
    mdp: TabularMDP, team: FloatArray, agent: int, target: FloatArray
) -> float:
    """Lemma 3.1, state level: replacing agent k changes the team only where k acts.

    Builds the new team with ``sim.TabularTeam.with_agent`` and compares the team KL (both
    directions) and TV at every state with 1[agent(s) = k] times agent k's divergence.
    """
    from sim.team import TabularTeam

    old = TabularTeam(team, mdp.agent_of_state, n_agents=mdp.n_agents)
    new = old.with_agent(agent, target)
    agent_old, agent_new = old.agent(agent), target
    worst = 0.0
    scale = 1.0
    for team_div, agent_div in (
        (kl(new.table, old.table), kl(agent_new, agent_old)),
        (kl(old.table, new.table), kl(agent_old, agent_new)),
        (tv(new.table, old.table), tv(agent_new, agent_old)),
    ):
        predicted = team_divergence_from_agent(mdp.agent_of_state, agent, agent_div)
        worst = max(worst, float(np.max(np.abs(team_div - predicted))))
        scale = max(scale, float(np.max(np.abs(predicted))))
    return IDENTITY_TOL * scale - worst


def message_chain_rule_slack(pair: MessagePair) -> float:
    """Lemma 3.1, token level: KL(p||q) over whole messages (enumerated) equals
    E_{y ~ p}[sum_t KL(p(.|y_<t) || q(.|y_<t))] with exact per-token KLs from the logits."""
    messages = all_messages(pair.vocab_size, pair.length)
    along_p = token_logits_along(pair.logits_p, messages, pair.vocab_size)
    along_q = token_logits_along(pair.logits_q, messages, pair.vocab_size)
    logp = token_log_probs(along_p, messages).sum(axis=1)
    logq = token_log_probs(along_q, messages).sum(axis=1)
    p = np.exp(logp)
    message_kl = float(np.sum(p * (logp - logq)))
    per_token = token_kl_from_logits(along_p, along_q)  # (M, T)
    summed = message_kl_from_token_kls(per_token, np.ones_like(per_token, dtype=bool))
    return _identity_slack(message_kl, float(np.sum(p * summed)), pair.length)


def dialogue_chain_rule_slack(
    n_agents: int, vocab_size: int, length: int, logit_scale: float, closeness: float, seed: int
) -> float:
    """Lemma 3.1, token level, on ``sim.dialogue_mdp``: at every state of the dialogue, the
    KL between two teams' message distributions (actions = all V^T messages, enumerated)
    equals E_{y~p}[sum_t KL(p(.|y_<t) || q(.|y_<t))] computed with
    ``teamtr.divergence.token_kl_from_logits`` along every message's prefixes; and
    ``sim.dialogue.per_token_kl_sum`` agrees. Identity slack (1e-9), min over states."""
    from sim.dialogue import TokenFactorisation, dialogue_mdp, message_probs_from_token_logits

    rng = np.random.default_rng(seed)
    mdp = dialogue_mdp(n_agents, vocab_size, length, seed=rng)
    tokens = TokenFactorisation(vocab_size, length)
    shape = (mdp.n_states, tokens.n_prefixes, vocab_size)
    logits_p = logit_scale * rng.standard_normal(shape)
    logits_q = logits_p + closeness * rng.standard_normal(shape)
    p = message_probs_from_token_logits(logits_p, vocab_size, length)  # (S, V^T): team tables
    q = message_probs_from_token_logits(logits_q, vocab_size, length)
    prefixes = tokens.message_prefixes  # (V^T, T)
    per_token = token_kl_from_logits(logits_p[:, prefixes], logits_q[:, prefixes])  # (S, M, T)
    summed = message_kl_from_token_kls(per_token, np.ones(per_token.shape, dtype=bool))
    chain = np.sum(p * summed, axis=1)
    message = kl(p, q)
    from_sim = tokens.per_token_kl_sum(p, q)
    worst = max(float(np.max(np.abs(message - chain))), float(np.max(np.abs(message - from_sim))))
    return IDENTITY_TOL * max(1.0, length) - worst


# --- statistical checks of the sampled side ------------------------------------------------------


def _estimator_values(pair: MessagePair, estimator: str, messages: NDArray[np.int64]):
    """Per-message value of the estimator: k1 or k3 summed over the message's tokens."""
    logp = token_log_probs(token_logits_along(pair.logits_p, messages, pair.vocab_size), messages)
    logq = token_log_probs(token_logits_along(pair.logits_q, messages, pair.vocab_size), messages)
    if estimator == "k1":
        values = k1_estimator(logp, logq).sum(axis=1)
    elif estimator == "k3":
        values = k3_estimator(logp, logq).sum(axis=1)
    else:
        raise ValueError(f"estimator must be 'k1' or 'k3', got {estimator!r}")
    return values, logp.sum(axis=1), logq.sum(axis=1)


def _exact_moments(pair: MessagePair, estimator: str) -> tuple[float, float, float]:
    """(exact message KL, exact mean of the estimator, its exact standard deviation), by
    enumerating every message."""
    everything = all_messages(pair.vocab_size, pair.length)
    values, logp, logq = _estimator_values(pair, estimator, everything)
    p = np.exp(logp)
    exact_kl = float(np.sum(p * (logp - logq)))
    mean = float(np.sum(p * values))
    return exact_kl, mean, math.sqrt(float(np.sum(p * (values - mean) ** 2)))


def estimator_expectation_slack(pair: MessagePair, estimator: str) -> float:
    """THEORY §2: E_{y~p}[k(y)] = KL(p || q) exactly (k1 or per-token k3 summed), by
    enumerating all messages: an identity, to 1e-9."""
    exact_kl, mean, _ = _exact_moments(pair, estimator)
    return _identity_slack(mean, exact_kl, 1.0)


def estimator_unbiased_slack(
    pair: MessagePair, estimator: str, rng: np.random.Generator, n_draws: int = UNBIASED_DRAWS
) -> float:
    """THEORY §2: k1 and k3 (summed per token over y ~ p) are unbiased for the message KL.

    Draws ``n_draws`` messages y ~ p; slack = UNBIASED_Z standard errors minus |sample mean -
    exact KL|. The standard error uses the estimator's exact standard deviation (from the
    enumeration), not the sample one, which rare high-ratio messages make unreliable.
    """
    messages = sample_messages(rng, pair.logits_p, pair.vocab_size, n_draws)
    values, _, _ = _estimator_values(pair, estimator, messages)
    exact_kl, _, std = _exact_moments(pair, estimator)
    standard_error = std / math.sqrt(n_draws)
    return (
        UNBIASED_Z * standard_error - abs(float(np.mean(values)) - exact_kl) + _allowance(exact_kl)
    )


def hoeffding_coverage_slack(
    trace: Trace,
    i: int,
    n_samples: int,
    rng: np.random.Generator,
    eta: float = HOEFFDING_ETA,
    repetitions: int = HOEFFDING_REPETITIONS,
) -> float:
    """THEORY §2 (Thm 3.4, N_i samples): the Hoeffding term 2B sqrt(log(2/eta)/(2N)) covers
    |L_hat_i - L_i| in at least 1 - eta of the repetitions.

    L_hat_i is the mean of N i.i.d. draws of A_{pi_hat^{i-1}}(s, a)/(1-gamma), s ~ d_{pi_hat^{i-1}},
    a ~ pi_hat^i, each in [-B, B] with B = max|A|/(1-gamma). Failures are counted over
    ``repetitions`` seeded repetitions; the slack is (allowed - observed failures)/repetitions,
    allowed = the (1 - HOEFFDING_FALSE_ALARM) quantile of Binomial(repetitions, eta).
    """
    mdp = trace.mdp
    ev = trace.evaluations[i - 1]
    assert isinstance(ev, oracle.Discounted)
    after = trace.tables[i]
    scale = 1.0 / (1.0 - mdp.gamma)
    exact = exact_surrogate(after, ev.A, ev.d, scale)
    # Joint law of (s, a) and the value of each pair.
    joint = (ev.d[:, None] * after).ravel()
    joint = np.clip(joint, 0.0, None) / joint.sum()
    values = (scale * ev.A).ravel()
    half_range = float(np.max(np.abs(values)))
    draws = rng.choice(values.size, size=(repetitions, n_samples), p=joint)
    estimates = values[draws].mean(axis=1)
    term = bounds.hoeffding_term(half_range, n_samples, eta)
    failures = int(np.sum(np.abs(estimates - exact) > term + _allowance(half_range)))
    allowed = int(stats.binom.ppf(1.0 - HOEFFDING_FALSE_ALARM, repetitions, eta))
    return (allowed - failures) / repetitions


# --- Theorem 3.4 (one update), 3.6 (stage), 3.7 (drift, stale penalties) ----------------------


def theorem_3_4_slacks(trace: Trace, form: str) -> list[float]:
    """Thm 3.4 for every update of the trace: gain_i - bound_i.

    ``form`` = "tv" (L_i - 2 gamma eps_i/(1-gamma)^2 E_d[TV_i]), "kl_reverse" or "kl_forward"
    (L_i - sqrt(2) gamma eps_i/(1-gamma)^2 sqrt(delta_i) with delta_i = E_d[KL_i] in that
    direction). Episodic traces use the horizon constants of ``EpisodicPenalty``.
    """
    mdp = trace.mdp
    penalty = mdp_penalty(mdp)
    slacks = []
    for terms in all_update_terms(trace):
        if form == "tv":
            bound = bounds.theorem_3_4_lower_bound(
                terms.surrogate, terms.advantage_bound, penalty, mean_tv=terms.mean_tv
            )
        elif form in ("kl_reverse", "kl_forward"):
            delta = terms.mean_kl_reverse if form == "kl_reverse" else terms.mean_kl_forward
            bound = bounds.theorem_3_4_lower_bound(
                terms.surrogate, terms.advantage_bound, penalty, mean_kl=delta
            )
        else:
            raise ValueError(f"form must be 'tv', 'kl_reverse' or 'kl_forward', got {form!r}")
        slacks.append(terms.gain - bound + _allowance(value_scale(mdp)))
    return slacks


def mdp_penalty(mdp: TabularMDP) -> DiscountedPenalty | EpisodicPenalty:
    """The Thm 3.4 penalty constants of the MDP's setting."""
    if mdp.horizon is None:
        return DiscountedPenalty(mdp.gamma)
    return EpisodicPenalty(mdp.horizon)


def episodic_per_step_slacks(trace: Trace) -> list[float]:
    """Thm 3.4 episodic per-step form: gain >= L - 2 eps sum_u (H-1-u) E_{rho_u}[TV_u]."""
    slacks = []
    for terms in all_update_terms(trace):
        assert terms.tv_per_step is not None
        bound = bounds.episodic_update_lower_bound(
            terms.surrogate, terms.advantage_bound, terms.tv_per_step
        )
        slacks.append(terms.gain - bound + _allowance(value_scale(trace.mdp)))
    return slacks


def theorem_3_6_slack(trace: Trace, direction: Direction = "reverse") -> float:
    """Thm 3.6: J(pi_bar) - J(pi_cur) >= sum_i [L_i - C_i sqrt(delta_i)] (any order sigma)."""
    terms = all_update_terms(trace)
    kls = [t.mean_kl_reverse if direction == "reverse" else t.mean_kl_forward for t in terms]
    bound = bounds.theorem_3_6_stage_bound(
        [t.surrogate for t in terms],
        [t.advantage_bound for t in terms],
        kls,
        mdp_penalty(trace.mdp),
    )
    gain = trace.evaluations[-1].J - trace.evaluations[0].J
    return gain - bound + _allowance(value_scale(trace.mdp))


def certificate_proxy_slack(trace: Trace) -> float:
    """THEORY §2 certificate proxy, episodic, exact inputs: J(pi_bar) - J(pi_cur) >=
    sum_i [L_i - c_i sqrt(KL_i/2)] with c_i = horizon_constant(eps_i, H) and KL_i the reverse
    KL averaged over the H decision points (the average occupancy of pi_hat^{i-1})."""
    mdp = trace.mdp
    assert mdp.horizon is not None
    terms = all_update_terms(trace)
    c = [bounds.horizon_constant(t.advantage_bound, mdp.horizon) for t in terms]
    certificate = bounds.certificate_proxy(
        [t.surrogate for t in terms], [t.mean_kl_reverse for t in terms], c
    )
    gain = trace.evaluations[-1].J - trace.evaluations[0].J
    return gain - certificate + _allowance(value_scale(mdp))


def _tightest_kls(terms: Sequence[UpdateTerms]) -> FloatArray:
    # Pinsker holds in either direction, so either measured KL is a valid delta_k; the
    # smaller one gives the stronger statement.
    return np.array([min(t.mean_kl_reverse, t.mean_kl_forward) for t in terms])


def drift_slacks(trace: Trace) -> list[float]:
    """Thm 3.7: ||d_{pi_hat^{i-1}} - d_{pi_cur}||_1 <= sum_{k<i} 2 gamma/(1-gamma) sqrt(delta_k/2)
    for i = 2 .. n (i = 1 is 0 <= 0), delta_k = E_{d_{pi_hat^{k-1}}}[KL_k]; episodic traces
    use the average occupancy and the factor 2 (H-1)."""
    mdp = trace.mdp
    deltas = _tightest_kls(all_update_terms(trace))
    d0 = trace.evaluations[0].d
    slacks = []
    factor = 2.0 * (mdp.horizon - 1) if mdp.horizon is not None else 2.0 / (1.0 - mdp.gamma)
    for i in range(2, len(trace.tables)):
        drift = float(np.abs(trace.evaluations[i - 1].d - d0).sum())
        bound = bounds.theorem_3_7_drift_bound(
            0.0 if mdp.horizon is not None else mdp.gamma, deltas[: i - 1], horizon=mdp.horizon
        )
        slacks.append(bound - drift + _allowance(factor * len(trace.order)))
    return slacks


def stale_penalty_slacks(trace: Trace) -> list[float]:
    """Thm 3.7 penalty sums: the stale certified penalty covers the occupancy drift.

    Per update: gain_i >= L_i^{d_cur} - C_i sum_{k<=i} sqrt(delta_k), where L_i^{d_cur} is the
    surrogate evaluated under the stage-start occupancy (Thm 3.4 plus
    |L_i - L_i^{d_cur}| <= eps_i/(1-gamma) ||d_{pi_hat^{i-1}} - d_{pi_cur}||_1 and the drift
    bound). The last entry is the stage sum, with ``bounds.stale_penalty_sum``:
    J(pi_bar) - J(pi_cur) >= sum_i L_i^{d_cur} - sum_i C_i sum_{k<=i} sqrt(delta_k).
    """
    mdp = trace.mdp
    penalty = mdp_penalty(mdp)
    terms = all_update_terms(trace)
    deltas = _tightest_kls(terms)
    coefficients = [bounds.kl_penalty_coefficient(t.advantage_bound, penalty) for t in terms]
    allowance = _allowance(value_scale(mdp) * len(terms))
    slacks = []
    for i, t in enumerate(terms):
        charged = coefficients[i] * float(np.sum(np.sqrt(deltas[: i + 1])))
        slacks.append(t.gain - (t.surrogate_stage_start_occupancy - charged) + allowance)
    stage_gain = trace.evaluations[-1].J - trace.evaluations[0].J
    stage_bound = sum(t.surrogate_stage_start_occupancy for t in terms)
    stage_bound -= bounds.stale_penalty_sum(coefficients, deltas)
    slacks.append(stage_gain - stage_bound + allowance)
    return slacks


def stage_loop_slacks(
    mdp: TabularMDP,
    start: FloatArray,
    direction: Direction,
    radius: float,
    penalty_form: str = "kl",
    order_seed: int = 0,
) -> list[float]:
    """Thm 3.6 as the library runs it: one ``teamtr.run_stage`` of the ``teamtr`` scheme with
    ``sim``'s exact sampler and updater in a random order. Slacks: realised gain minus
    certificate for every kept update (Thm 3.4), and for the stage (Thm 3.6), J exact."""
    from sim.rollouts import ExactSampler
    from sim.team import TabularTeam
    from sim.updates import ExactUpdater
    from teamtr.config import StageConfig
    from teamtr.stage import run_stage

    sim_mdp = to_sim(mdp)
    evaluate = oracle.discounted if mdp.horizon is None else oracle.episodic
    config = StageConfig(
        scheme="teamtr",
        radius=radius,
        order="random",
        seed=order_seed,
        penalty_form=penalty_form,  # type: ignore[arg-type]
    )
    report, _ = run_stage(
        TabularTeam(start, mdp.agent_of_state, n_agents=mdp.n_agents),
        ExactSampler(sim_mdp),
        ExactUpdater(sim_mdp, direction=direction),
        config,
        sim_mdp.penalty_model(),
        evaluator=lambda team: evaluate(mdp, np.asarray(team.table)).J,  # type: ignore[attr-defined]
    )
    allowance = _allowance(value_scale(mdp) * len(report.records))
    slacks = []
    for record in report.records:
        if record.kept:
            assert record.realised_gain is not None
            slacks.append(record.realised_gain - record.certificate + allowance)
    assert report.realised_gain is not None
    slacks.append(report.realised_gain - report.certificate + allowance)
    return slacks


# --- Stage-0 alignment ---------------------------------------------------------------------------


SCIPY_FEASIBILITY = 1e-8
"""A scipy.optimize result counts only if it exceeds the radius by at most this much."""


def _scipy_projection(pre: FloatArray, cur: FloatArray, radius: float) -> FloatArray:
    """min KL(pi || pre) s.t. KL(pi || cur) <= radius, by SLSQP over softmax logits.

    Several SLSQP starts (pi_cur, a geometric mixture, pi_pre), then trust-constr if none of
    them ends feasible; every run that ends feasible to
    SCIPY_FEASIBILITY counts (SLSQP often stops with "positive directional derivative" at the
    limit of its precision; an unconverged point can only make the comparison more lenient
    towards scipy, never flag a correct closed form), and the best of them is returned.
    """

    def as_policy(z: FloatArray) -> FloatArray:
        e = np.exp(z - z.max())
        return e / e.sum()

    def kl_and_gradient(z: FloatArray, reference: FloatArray) -> tuple[float, FloatArray]:
        # d/dz_j KL(softmax(z) || ref) = pi_j (log(pi_j / ref_j) - KL).
        log_pi = log_softmax(z)
        pi = np.exp(log_pi)
        log_ratio = log_pi - np.log(reference)
        value = float(np.dot(pi, log_ratio))
        return value, pi * (log_ratio - value)

    best: FloatArray | None = None
    for start in (np.log(cur), 0.5 * (np.log(cur) + np.log(pre)), np.log(pre)):
        result = optimize.minimize(
            lambda z: kl_and_gradient(z, pre),
            start,
            jac=True,
            method="SLSQP",
            constraints=[
                {
                    "type": "ineq",
                    "fun": lambda z: radius - kl_and_gradient(z, cur)[0],
                    "jac": lambda z: -kl_and_gradient(z, cur)[1],
                }
            ],
            options={"ftol": 1e-14, "maxiter": 1000},
        )
        candidate = as_policy(result.x)
        feasible = float(kl(candidate, cur)) <= radius + SCIPY_FEASIBILITY
        if feasible and (best is None or kl(candidate, pre) < kl(best, pre)):
            best = candidate
    if best is None:
        # SLSQP's least-squares subproblem can go singular next to a near-deterministic pi_pre;
        # the interior-point method is slower but stays feasible there.
        result = optimize.minimize(
            lambda z: kl_and_gradient(z, pre),
            np.log(cur),
            jac=True,
            method="trust-constr",
            constraints=[
                optimize.NonlinearConstraint(
                    lambda z: kl_and_gradient(z, cur)[0],
                    -np.inf,
                    radius,
                    jac=lambda z: kl_and_gradient(z, cur)[1][None, :],
                )
            ],
            options={"xtol": 1e-14, "gtol": 1e-14, "maxiter": 3000},
        )
        candidate = as_policy(result.x)
        if float(kl(candidate, cur)) <= radius + SCIPY_FEASIBILITY:
            best = candidate
    if best is None:
        raise RuntimeError("scipy.optimize found no feasible solution from any start")
    return best


def stage0_optimality_slack(pre: FloatArray, cur: FloatArray, radius: float) -> float:
    """Stage-0 closed form (THEORY §2) against scipy.optimize on the same states.

    Per state: KL(pi_new || pi_pre) <= KL(pi_scipy || pi_pre), both objectives taken to the
    boundary KL(. || pi_cur) = delta0 to first order (the multiplier lambda of the closed form
    is the derivative of the optimum in delta0). Slack = min over states.
    """
    projection = stage0_projection(pre, cur, radius, rtol=STAGE0_RTOL)
    slacks = []
    for s in range(pre.shape[0]):
        numeric = _scipy_projection(pre[s], cur[s], radius)
        lam = float(projection.lam[s])
        if not math.isfinite(lam):
            raise ValueError(f"state {s}: no finite multiplier, the instance has no solution")
        # Both solvers stop near the boundary KL(. || pi_cur) = delta0: the bisection up to
        # rtol inside it, SLSQP possibly a hair outside. To first order the optimum moves by
        # -lambda per unit of radius, so each objective is moved to the exact boundary.
        closed = float(kl(projection.policy[s], pre[s]))
        closed -= lam * (radius - float(kl(projection.policy[s], cur[s])))
        numerical = float(kl(numeric, pre[s]))
        numerical += lam * max(0.0, float(kl(numeric, cur[s])) - radius)
        slacks.append(numerical - closed + _allowance(closed))
    return min(slacks)


def stage0_feasibility_slack(pre: FloatArray, cur: FloatArray, radius: float) -> float:
    """Stage-0: the projected policy lies in the trust region, KL(pi_new || pi_cur) <= delta0."""
    projection = stage0_projection(pre, cur, radius)
    return radius - float(np.max(kl(projection.policy, cur))) + _allowance(radius)


def draw_stage0(rng: np.random.Generator) -> tuple[FloatArray, FloatArray, float]:
    """pi_pre, pi_cur (a few states, near-deterministic at times) and a radius delta0."""
    n_states, n_actions = int(rng.integers(1, 4)), int(rng.integers(2, 6))
    pre = random_policy_table(rng, n_states, n_actions, float(rng.uniform(0.3, 4.0)))
    cur = random_policy_table(rng, n_states, n_actions, float(rng.uniform(0.3, 4.0)))
    radius = float(rng.uniform(0.05, 1.2)) * float(np.mean(kl(pre, cur)))
    return pre, cur, max(radius, 1e-4)


def draw_message_pair(rng: np.random.Generator) -> MessagePair:
    """A small pair of token-by-token message policies (V <= 4, T <= 3)."""
    return random_message_pair(
        rng,
        vocab_size=int(rng.integers(2, 5)),
        length=int(rng.integers(1, 4)),
        logit_scale=float(rng.uniform(0.2, 3.0)),
        closeness=float(rng.uniform(0.05, 1.0)),
    )


def pinsker_slack(p: FloatArray, q: FloatArray) -> float:
    """THEORY §1 Pinsker, both directions: TV(p, q) <= sqrt(KL/2) (min over rows)."""
    distance = tv(p, q)
    tightest = np.sqrt(np.minimum(kl(p, q), kl(q, p)) / 2.0)
    return float(np.min(tightest - distance)) + _allowance()


# --- the named checks of ``teamtr verify`` ----------------------------------------------------


def _rng(instance_seed: int) -> np.random.Generator:
    return np.random.default_rng(instance_seed)


def check_performance_difference(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    mdp = draw_tabular_mdp(rng)
    return performance_difference_slack(mdp, *draw_policy_pair(rng, mdp))


def check_occupancy_shift(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    mdp = draw_tabular_mdp(rng)
    return occupancy_shift_slack(mdp, *draw_policy_pair(rng, mdp))


def check_occupancy_shift_sup(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    mdp = draw_tabular_mdp(rng)
    return occupancy_shift_sup_slack(mdp, *draw_policy_pair(rng, mdp))


def check_pinsker(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    n_actions = int(rng.integers(2, 8))
    p = random_policy_table(rng, 8, n_actions, float(rng.uniform(0.1, 12.0)))
    q = random_policy_table(rng, 8, n_actions, float(rng.uniform(0.1, 12.0)))
    return pinsker_slack(p, q)


def check_sim_evaluate(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    mdp = draw_tabular_mdp(rng, episodic=bool(rng.random() < 0.5))
    return sim_evaluation_slack(mdp, draw_team(rng, mdp), sparse=bool(rng.random() < 0.5))


def check_lemma_3_1_state(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    mdp = draw_tabular_mdp(rng)
    team = draw_team(rng, mdp)
    agent = int(rng.integers(mdp.n_agents))
    return lemma_3_1_state_slack(mdp, team, agent, draw_team(rng, mdp))


def check_lemma_3_1_token(instance_seed: int) -> float:
    return message_chain_rule_slack(draw_message_pair(_rng(instance_seed)))


def check_lemma_3_1_dialogue(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    return dialogue_chain_rule_slack(
        n_agents=int(rng.integers(1, 4)),
        vocab_size=int(rng.integers(2, 4)),
        length=int(rng.integers(1, 4)),
        logit_scale=float(rng.choice([rng.uniform(0.1, 3.0), rng.uniform(8.0, 14.0)])),
        closeness=float(rng.uniform(0.01, 1.5)),
        seed=int(rng.integers(2**32)),
    )


def check_k1_unbiased(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    return estimator_unbiased_slack(draw_message_pair(rng), "k1", rng)


def check_k3_unbiased(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    return estimator_unbiased_slack(draw_message_pair(rng), "k3", rng)


def check_theorem_3_4_tv(instance_seed: int) -> float:
    return min(theorem_3_4_slacks(draw_trace(_rng(instance_seed)), "tv"))


def check_theorem_3_4_kl_reverse(instance_seed: int) -> float:
    trace = draw_trace(_rng(instance_seed), direction="reverse")
    return min(theorem_3_4_slacks(trace, "kl_reverse"))


def check_theorem_3_4_kl_forward(instance_seed: int) -> float:
    trace = draw_trace(_rng(instance_seed), direction="forward")
    return min(theorem_3_4_slacks(trace, "kl_forward"))


def check_theorem_3_4_exact_reverse(instance_seed: int) -> float:
    trace = draw_trace(_rng(instance_seed), direction="reverse", exact=True)
    return min(theorem_3_4_slacks(trace, "kl_reverse") + theorem_3_4_slacks(trace, "tv"))


def check_theorem_3_4_exact_forward(instance_seed: int) -> float:
    trace = draw_trace(_rng(instance_seed), direction="forward", exact=True)
    return min(theorem_3_4_slacks(trace, "kl_forward") + theorem_3_4_slacks(trace, "tv"))


def check_theorem_3_6_exact(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    direction: Direction = "reverse" if rng.random() < 0.5 else "forward"
    return theorem_3_6_slack(draw_trace(rng, direction=direction, exact=True), direction)


def _stage_loop_check(instance_seed: int, episodic: bool) -> float:
    rng = _rng(instance_seed)
    mdp = draw_tabular_mdp(rng, episodic=episodic)
    direction: Direction = "reverse" if rng.random() < 0.5 else "forward"
    form = "tv" if rng.random() < 0.5 else "kl"
    return min(
        stage_loop_slacks(
            mdp, draw_team(rng, mdp), direction, draw_radius(rng), form, int(rng.integers(1000))
        )
    )


def check_stage_loop_certificate(instance_seed: int) -> float:
    return _stage_loop_check(instance_seed, episodic=False)


def check_episodic_stage_loop_certificate(instance_seed: int) -> float:
    return _stage_loop_check(instance_seed, episodic=True)


def check_theorem_3_4_hoeffding(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    trace = draw_trace(rng)
    i = int(rng.integers(1, len(trace.tables)))
    return hoeffding_coverage_slack(trace, i, n_samples=int(rng.integers(5, 200)), rng=rng)


def check_theorem_3_6(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    direction: Direction = "reverse" if rng.random() < 0.5 else "forward"
    return theorem_3_6_slack(draw_trace(rng, direction=direction), direction)


def check_theorem_3_7_drift(instance_seed: int) -> float:
    return min(drift_slacks(draw_trace(_rng(instance_seed), min_agents=2)))


def check_theorem_3_7_stale_penalty(instance_seed: int) -> float:
    return min(stale_penalty_slacks(draw_trace(_rng(instance_seed))))


def check_episodic_performance_difference(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    mdp = draw_tabular_mdp(rng, episodic=True)
    return episodic_performance_difference_slack(mdp, *draw_policy_pair(rng, mdp))


def check_episodic_marginal_shift(instance_seed: int) -> float:
    rng = _rng(instance_seed)
    mdp = draw_tabular_mdp(rng, episodic=True, min_horizon=2)
    return marginal_shift_slack(mdp, *draw_policy_pair(rng, mdp))


def check_episodic_theorem_3_4_per_step(instance_seed: int) -> float:
    return min(episodic_per_step_slacks(draw_trace(_rng(instance_seed), episodic=True)))


def check_episodic_theorem_3_4_kl(instance_seed: int) -> float:
    trace = draw_trace(_rng(instance_seed), episodic=True)
    return min(theorem_3_4_slacks(trace, "kl_reverse"))


def check_episodic_theorem_3_7_drift(instance_seed: int) -> float:
    return min(drift_slacks(draw_trace(_rng(instance_seed), episodic=True, min_agents=2)))


def check_certificate_proxy(instance_seed: int) -> float:
    return certificate_proxy_slack(draw_trace(_rng(instance_seed), episodic=True))


def check_stage0_closed_form(instance_seed: int) -> float:
    return stage0_optimality_slack(*draw_stage0(_rng(instance_seed)))


def check_stage0_inside_radius(instance_seed: int) -> float:
    return stage0_feasibility_slack(*draw_stage0(_rng(instance_seed)))


@dataclass(frozen=True)
class Check:
    """One named fact: ``function(instance_seed)`` returns its slack (>= 0 means it holds)."""

    name: str
    fact: str
    """Where the fact is stated (THEORY.md section and statement)."""
    function: Callable[[int], float]


CHECKS: tuple[Check, ...] = (
    Check("performance_difference", "§2 performance difference", check_performance_difference),
    Check("occupancy_shift", "§2 occupancy shift, E_d[TV] form", check_occupancy_shift),
    Check("occupancy_shift_sup", "§2 occupancy shift, max_s TV form", check_occupancy_shift_sup),
    Check("pinsker", "§1 Pinsker, both directions", check_pinsker),
    Check("sim_evaluate_exact", "§1 exact evaluation in sim/", check_sim_evaluate),
    Check("lemma_3_1_state", "§2 Lemma 3.1, state level", check_lemma_3_1_state),
    Check("lemma_3_1_token", "§2 Lemma 3.1, token chain rule", check_lemma_3_1_token),
    Check(
        "lemma_3_1_dialogue",
        "§2 Lemma 3.1, token chain rule on sim.dialogue_mdp",
        check_lemma_3_1_dialogue,
    ),
    Check("k1_unbiased", "§2 k1 estimator unbiased", check_k1_unbiased),
    Check("k3_unbiased", "§2 k3 estimator unbiased", check_k3_unbiased),
    Check("thm_3_4_tv", "§2 Thm 3.4, TV form", check_theorem_3_4_tv),
    Check("thm_3_4_kl_reverse", "§2 Thm 3.4, KL form, KL(new||old)", check_theorem_3_4_kl_reverse),
    Check("thm_3_4_kl_forward", "§2 Thm 3.4, KL form, KL(old||new)", check_theorem_3_4_kl_forward),
    Check(
        "thm_3_4_exact_reverse",
        "§2 Thm 3.4, TV and KL forms, exact KL(new||old) updates",
        check_theorem_3_4_exact_reverse,
    ),
    Check(
        "thm_3_4_exact_forward",
        "§2 Thm 3.4, TV and KL forms, exact KL(old||new) updates",
        check_theorem_3_4_exact_forward,
    ),
    Check("thm_3_4_hoeffding", "§2 Thm 3.4, finite-sample term", check_theorem_3_4_hoeffding),
    Check("thm_3_6_stage", "§2 Thm 3.6, random order", check_theorem_3_6),
    Check(
        "thm_3_6_stage_exact", "§2 Thm 3.6, random order, exact updates", check_theorem_3_6_exact
    ),
    Check(
        "stage_loop_certificate",
        "§2 Thm 3.4/3.6 as teamtr.run_stage certifies them",
        check_stage_loop_certificate,
    ),
    Check("thm_3_7_drift", "§2 Thm 3.7, occupancy drift", check_theorem_3_7_drift),
    Check("thm_3_7_stale_penalty", "§2 Thm 3.7, penalty sums", check_theorem_3_7_stale_penalty),
    Check(
        "episodic_performance_difference",
        "§2 episodic performance difference",
        check_episodic_performance_difference,
    ),
    Check("episodic_marginal_shift", "§2 episodic marginal shift", check_episodic_marginal_shift),
    Check(
        "episodic_thm_3_4_per_step",
        "§2 episodic Thm 3.4, per-step form",
        check_episodic_theorem_3_4_per_step,
    ),
    Check("episodic_thm_3_4_kl", "§2 episodic Thm 3.4, KL form", check_episodic_theorem_3_4_kl),
    Check("episodic_thm_3_7_drift", "§2 episodic drift", check_episodic_theorem_3_7_drift),
    Check(
        "episodic_stage_loop_certificate",
        "§2 episodic Thm 3.4/3.6 as teamtr.run_stage certifies them",
        check_episodic_stage_loop_certificate,
    ),
    Check("certificate_proxy", "§2 certificate proxy, exact inputs", check_certificate_proxy),
    Check("stage0_closed_form", "§2 Stage-0 closed form vs scipy", check_stage0_closed_form),
    Check("stage0_inside_radius", "§2 Stage-0 projection feasible", check_stage0_inside_radius),
)
