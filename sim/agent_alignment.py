"""Stage-0 alignment of a replacement agent on a tabular team, and the certificate of the swap.

THEORY.md §2, "Stage-0 alignment (plug-and-play swap)". Before a new model pi_pre replaces
agent k of the current team pi_cur, it is projected into the trust region around agent k:

    pi_new = argmin_pi E_{s~d_{pi_cur}}[KL(pi || pi_pre)(s)]  s.t.  KL(pi || pi_cur)(s) <= delta0,

over agent k's states. The constraint is per state, so the problem decouples into one
projection per state, solved in closed form by ``teamtr.alignment.stage0_projection``; this
module only supplies the tabular inputs (agent k's rows, the exact occupancy d_{pi_cur}).

The aligned swap is then an ordinary update of agent k from pi_cur, so Theorem 3.4 applies to
it (Lemma 3.1: the team divergence is agent k's where k acts, 0 elsewhere):

    J(pi_cur with k <- pi_new) - J(pi_cur) >= L - penalty(eps, E_{d_{pi_cur}}[KL(pi_new||pi_cur)])
                                            >= L - C sqrt(delta0),

L = scale * E_{s~d_{pi_cur}, a~pi_new}[A_{pi_cur}(s, a)], eps = max_s |E_{a~pi_new} A_{pi_cur}(s, a)|
over agent k's states (per step t when episodic), C sqrt(delta) the KL-form penalty of ``teamtr.penalty`` (scale and
penalty are those of the MDP's setting, discounted or episodic). ``swap_certificate`` evaluates
this bound and the realised change exactly, for any replacement, aligned or not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sim.evaluate import Evaluation, evaluate
from sim.mdp import TurnTakingMDP
from sim.team import TabularTeam, check_team_fits, validate_policy
from teamtr.alignment import stage0_projection
from teamtr.bounds import theorem_3_4_lower_bound
from teamtr.divergence import expected, kl, tv
from teamtr.surrogate import exact_surrogate

FloatArray = NDArray[np.float64]

COVER_TOLERANCE = 1e-9
"""Relative slack (times max(1, |J|)) allowed when checking that a certificate covers a swap:
floating-point rounding only; an exact certificate is never violated by more."""


@dataclass(frozen=True)
class SwapCertificate:
    """Theorem 3.4 for the replacement of one agent, seen as an update of that agent."""

    agent: int
    """k, the replaced agent."""
    surrogate: float
    """L = scale * E_{s~d_cur, a~pi_new}[A_cur(s, a)] (in units of J)."""
    advantage_bound: float
    """eps = max over agent k's states of |E_{a~pi_new} A_cur(s, a)|."""
    expected_kl: float
    """E_{s~d_cur}[KL(pi_new || pi_cur)(s)] (Lemma 3.1: 0 outside agent k's states); may be inf."""
    max_kl: float
    """max over agent k's states of KL(pi_new || pi_cur)(s)."""
    expected_tv: float
    """E_{s~d_cur}[TV(pi_new, pi_cur)(s)]."""
    certificate: float
    """L - penalty(eps, E_d[KL]): the KL form of Thm 3.4 with the measured divergence."""
    certificate_tv: float
    """L - tv_penalty(eps, E_d[TV]): the tighter TV form."""
    certificate_at_radius: float | None
    """L - C sqrt(delta0), the bound the radius alone guarantees (None when no radius given)."""
    j_before: float
    """J(pi_cur)."""
    j_after: float
    """J of the team after the swap."""

    @property
    def realised_gain(self) -> float:
        """J(after) - J(pi_cur): the swap's realised change (negative: a swap shock)."""
        return self.j_after - self.j_before

    @property
    def covers(self) -> bool:
        """Whether every bound above lies below the realised change (up to rounding)."""
        slack = COVER_TOLERANCE * max(1.0, abs(self.j_before))
        bounds = [self.certificate, self.certificate_tv]
        if self.certificate_at_radius is not None:
            bounds.append(self.certificate_at_radius)
        return all(self.realised_gain >= b - slack for b in bounds if math.isfinite(b))

    def as_dict(self) -> dict[str, float | int | bool | None]:
        return {
            "agent": self.agent,
            "surrogate": self.surrogate,
            "advantage_bound": self.advantage_bound,
            "expected_kl": self.expected_kl,
            "max_kl": self.max_kl,
            "expected_tv": self.expected_tv,
            "certificate": self.certificate,
            "certificate_tv": self.certificate_tv,
            "certificate_at_radius": self.certificate_at_radius,
            "j_before": self.j_before,
            "j_after": self.j_after,
            "realised_gain": self.realised_gain,
            "covers": self.covers,
        }


@dataclass(frozen=True)
class AlignmentResult:
    """The aligned replacement of one agent and what the projection did."""

    agent: int
    """k, the agent being replaced."""
    delta0: float
    """The alignment radius: KL(pi_new || pi_cur)(s) <= delta0 on every state of agent k."""
    table: FloatArray
    """pi_new as a full S x A agent table: agent k's rows projected, other rows from pi_cur."""
    lambdas: FloatArray
    """The multiplier lambda >= 0 per state (0 outside agent k's states and where inactive)."""
    active: NDArray[np.bool_]
    """States of agent k where the constraint binds (pi_pre was outside the radius)."""
    expected_kl_to_pre: float
    """E_{s~d_cur}[KL(pi_new || pi_pre)(s)] over agent k's states: the objective's value."""
    expected_kl_to_cur: float
    """E_{s~d_cur}[KL(pi_new || pi_cur)(s)]: the trust-region statistic of the swap."""
    max_kl_to_cur: float
    """max over agent k's states of KL(pi_new || pi_cur)(s) (<= delta0)."""
    direct_expected_kl_to_cur: float
    """E_{s~d_cur}[KL(pi_pre || pi_cur)(s)]: the divergence a direct swap would make."""
    direct_max_kl_to_cur: float
    """max over agent k's states of KL(pi_pre || pi_cur)(s)."""
    certificate: SwapCertificate
    """Theorem 3.4 for the aligned swap, with J before and after evaluated exactly."""

    def team(self, current: TabularTeam) -> TabularTeam:
        """The aligned team: ``current`` with agent k's rows replaced by pi_new."""
        return current.with_agent(self.agent, self.table)


def _agent_table(mdp: TurnTakingMDP, table: ArrayLike, name: str) -> FloatArray:
    try:
        return validate_policy(table, mdp.n_states, mdp.n_actions)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from error


def _surrogate_scale(mdp: TurnTakingMDP) -> float:
    """1/(1-gamma) discounted, H episodic (``teamtr.surrogate.exact_surrogate``)."""
    if mdp.horizon is not None:
        return float(mdp.horizon)
    return 1.0 / (1.0 - mdp.gamma)


def swap_certificate(
    mdp: TurnTakingMDP,
    team: TabularTeam,
    agent: int,
    new_table: ArrayLike,
    radius: float | None = None,
    current: Evaluation | None = None,
) -> SwapCertificate:
    """Thm 3.4 for replacing agent ``agent`` of ``team`` by ``new_table`` (an S x A agent table).

    Everything is exact: advantages and occupancy of ``team`` (pass ``current`` to reuse an
    evaluation of it), the surrogate, the divergences and J after the swap. ``radius`` (delta0)
    adds the bound L - C sqrt(delta0), valid when KL(new || cur)(s) <= delta0 on agent k's states.
    """
    check_team_fits(mdp, team, "swap_certificate")
    new = _agent_table(mdp, new_table, "new_table")
    before = current if current is not None else evaluate(mdp, team.table)
    after_team = team.with_agent(agent, new)
    after = evaluate(mdp, after_team.table)
    mine = mdp.states_of(agent)
    advantage = before.surrogate_advantage
    # Lemma 3.1: the swapped team equals pi_cur off agent k's states, so only its rows move.
    moved = after_team.table
    surrogate = exact_surrogate(moved, advantage, before.d, _surrogate_scale(mdp))
    # eps per step t at the states reached then when episodic (Evaluation.advantage_bound).
    epsilon = before.advantage_bound(moved, mine)
    kl_per_state = np.where(mine, kl(moved, team.table), 0.0)
    tv_per_state = np.where(mine, tv(moved, team.table), 0.0)
    mean_kl = expected(kl_per_state, before.d)
    mean_tv = expected(tv_per_state, before.d)
    penalty = mdp.penalty_model()
    certificate = (
        theorem_3_4_lower_bound(surrogate, epsilon, penalty, mean_kl=mean_kl)
        if math.isfinite(mean_kl)
        else -math.inf
    )
    at_radius = (
        None
        if radius is None
        else theorem_3_4_lower_bound(surrogate, epsilon, penalty, mean_kl=float(radius))
    )
    return SwapCertificate(
        agent=agent,
        surrogate=surrogate,
        advantage_bound=epsilon,
        expected_kl=mean_kl,
        max_kl=float(np.max(kl_per_state[mine], initial=0.0)),
        expected_tv=mean_tv,
        certificate=certificate,
        certificate_tv=theorem_3_4_lower_bound(surrogate, epsilon, penalty, mean_tv=mean_tv),
        certificate_at_radius=at_radius,
        j_before=float(before.J),
        j_after=float(after.J),
    )


def align_agent(
    mdp: TurnTakingMDP,
    team: TabularTeam,
    agent: int,
    pi_pre_table: ArrayLike,
    delta0: float,
    current: Evaluation | None = None,
) -> AlignmentResult:
    """Stage-0 alignment of the replacement ``pi_pre_table`` for agent ``agent`` of ``team``.

    ``pi_pre_table`` is an S x A agent table (only agent k's rows are read). On each of agent
    k's states the closed-form projection (THEORY.md §2) keeps pi_pre where
    KL(pi_pre || pi_cur)(s) <= delta0 and otherwise tilts it towards pi_cur until the constraint
    holds with equality. The returned certificate is Thm 3.4 for the aligned swap.
    """
    if not (math.isfinite(delta0) and delta0 > 0):
        raise ValueError(f"delta0 must be finite and > 0, got {delta0!r}")
    if not 0 <= agent < mdp.n_agents:
        raise ValueError(f"agent must lie in [0, {mdp.n_agents}), got {agent}")
    check_team_fits(mdp, team, "align_agent")
    pre = _agent_table(mdp, pi_pre_table, "pi_pre_table")
    before = current if current is not None else evaluate(mdp, team.table)
    mine = mdp.states_of(agent)
    cur = team.table

    projection = stage0_projection(pre[mine], cur[mine], delta0)
    table = np.array(cur, dtype=np.float64)
    table[mine] = projection.policy
    lambdas = np.zeros(mdp.n_states)
    lambdas[mine] = projection.lam

    def mean_over_agent(per_state: FloatArray) -> float:
        # E_{s~d_cur} over agent k's states (Lemma 3.1: the other states do not move).
        return expected(np.where(mine, per_state, 0.0), before.d)

    kl_new_cur = kl(table, cur)
    kl_pre_cur = kl(pre, cur)
    return AlignmentResult(
        agent=agent,
        delta0=float(delta0),
        table=table,
        lambdas=lambdas,
        active=mine & (lambdas > 0),
        expected_kl_to_pre=mean_over_agent(kl(table, pre)),
        expected_kl_to_cur=mean_over_agent(kl_new_cur),
        max_kl_to_cur=float(np.max(kl_new_cur[mine], initial=0.0)),
        direct_expected_kl_to_cur=mean_over_agent(kl_pre_cur),
        direct_max_kl_to_cur=float(np.max(kl_pre_cur[mine], initial=0.0)),
        certificate=swap_certificate(mdp, team, agent, table, radius=delta0, current=before),
    )
