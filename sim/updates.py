"""The exact trust-region update of one agent (THEORY.md §2, Thm 3.4; ARCHITECTURE.md).

For agent k, with the occupancy d and advantages A-hat of the rollouts it is given:

    maximise    sum_{s in S_k} d(s) sum_a pi'(a|s) A-hat(s,a)
    subject to  sum_{s in S_k} d(s) KL(s) <= delta,

where KL(s) is KL(pi' || pi) ("reverse", the direction the language-model backend uses) or
KL(pi || pi') ("forward"). Lagrange conditions give the maximiser in closed form up to one
temperature shared by all states, which a bisection (Brent's method on its logarithm) sets so
that the expected KL equals delta:

    reverse:  pi'(a|s) = pi(a|s) exp(A-hat(s,a)/beta) / Z_s
    forward:  pi'(a|s) = lambda pi(a|s) / (c_s - A-hat(s,a)),  c_s > max_a A-hat(s,a) such that
              the row sums to 1 (one root per state, found by a vectorised Newton iteration).

Both are invariant to adding a constant to A-hat(s, .), so advantages are centred per state at
their maximum. Actions outside the support of pi keep probability 0 in both directions.

``advantage_bound`` (eps of Thm 3.4) is exact when the rollouts carry an exact evaluation:
max over agent k's reached states of |E_{pi'} A(s, .)| (discounted), or of |E_{pi'} A_t(s, .)|
over t and the states reached at step t (episodic, as ``teamtr.penalty.EpisodicPenalty`` needs).
For sampled rollouts it is max_s |E_{pi'} A-hat(s, .)| with the estimated A-hat (the estimate of
A_bar when episodic): an estimate, not a bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import brentq
from scipy.special import logsumexp

from sim.evaluate import advantage_bound
from sim.mdp import TurnTakingMDP
from sim.team import TabularTeam
from teamtr.reports import AgentUpdate

Array = NDArray[np.float64]
Direction = Literal["reverse", "forward"]

KL_RELATIVE_TOL = 1e-9
"""The expected KL of a constrained update equals the radius to this relative accuracy."""


@dataclass(frozen=True)
class _Rows:
    """The rows of agent k's states that the update may change (d(s) > 0, advantage varies)."""

    weights: Array
    """d(s) of those states."""
    policy: Array
    """pi(.|s), m x A."""
    centred: Array
    """A-hat(s,.) - max over the support of pi(.|s): <= 0, = 0 on the greedy set."""
    support: NDArray[np.bool_]

    @property
    def greedy_set(self) -> NDArray[np.bool_]:
        """T(s): the supported actions of largest advantage."""
        return self.support & (self.centred == 0.0)

    @property
    def greedy_mass(self) -> Array:
        """pi(T(s)|s)."""
        return np.where(self.greedy_set, self.policy, 0.0).sum(axis=1)


def _reverse_tilt(rows: _Rows, log_temperature: float) -> tuple[Array, Array]:
    """pi' proportional to pi exp(A/beta) and KL(pi' || pi) per state, in log space."""
    beta = np.exp(log_temperature)
    with np.errstate(divide="ignore"):
        log_policy = np.log(rows.policy)
    logits = np.where(rows.support, log_policy + rows.centred / beta, -np.inf)
    log_new = logits - logsumexp(logits, axis=1, keepdims=True)
    new = np.exp(log_new)
    kl = np.sum(np.where(rows.support, new * (log_new - log_policy), 0.0), axis=1)
    return new, np.maximum(kl, 0.0)


def _forward_roots(rows: _Rows, lam: float) -> Array:
    """c_s with sum_a lam pi(a) / (c_s - A(a)) = 1 for each state (A centred, max 0).

    g(c) = sum_a lam pi(a)/(c - A(a)) is convex and decreasing on c > 0, and g(lam pi(T)) >= 1
    with T the greedy set, so Newton's iteration started there increases monotonically to the
    root (the tangent of a convex decreasing function lies below it).
    """
    c = lam * rows.greedy_mass
    mass = np.where(rows.support, lam * rows.policy, 0.0)
    for _ in range(200):
        gaps = c[:, None] - rows.centred
        g = np.sum(mass / gaps, axis=1)
        slope = -np.sum(mass / gaps**2, axis=1)
        step = (g - 1.0) / slope
        c_next = np.minimum(c - step, lam)  # c <= lam always holds at the root
        done = np.abs(c_next - c) <= 4e-16 * c_next
        c = c_next
        if done.all():
            break
    return c


def _forward_solution(rows: _Rows, log_lambda: float) -> tuple[Array, Array]:
    """pi' = lambda pi / (c_s - A) and KL(pi || pi') per state."""
    lam = np.exp(log_lambda)
    c = _forward_roots(rows, lam)
    new = np.where(rows.support, lam * rows.policy / (c[:, None] - rows.centred), 0.0)
    new /= new.sum(axis=1, keepdims=True)  # removes the root's last rounding error
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(rows.support, rows.policy * np.log(rows.policy / new), 0.0)
    return new, np.maximum(terms.sum(axis=1), 0.0)


def _greedy(rows: _Rows) -> Array:
    """The beta -> 0 limit of the reverse tilt: pi restricted to the argmax set, renormalised."""
    best = np.where(rows.greedy_set, rows.policy, 0.0)
    return best / best.sum(axis=1, keepdims=True)


def _solve_temperature(expected_kl: Callable[[float], float], radius: float, guess: float) -> float:
    """log-temperature u with expected_kl(u) = radius; expected_kl decreases in u."""

    def gap(u: float) -> float:
        return expected_kl(u) - radius

    low = high = guess
    while gap(high) > 0:
        high += 2.0
    while gap(low) < 0:
        low -= 2.0
    if low == high:
        return low
    return float(brentq(gap, low, high, xtol=1e-14, rtol=1e-15, maxiter=500))


class ExactUpdater:
    """The exact maximiser of agent k's surrogate inside its expected-KL radius.

    Implements ``teamtr.protocols.AgentUpdater`` for ``TabularTeam`` and the rollouts of
    ``sim.ExactSampler`` / ``sim.SampledSampler`` (anything with ``occupancy``, ``advantage``
    and ``surrogate_scale``). Uses only the rollouts' d and A-hat, never the MDP's dynamics;
    for eps it also reads the per-step advantages of an exact episodic ``evaluation`` (module
    docstring). With sampled rollouts (no evaluation) the reported ``advantage_bound`` is an
    estimate computed from the sampled A-hat, and the certificate built on it is a proxy.
    """

    def __init__(self, mdp: TurnTakingMDP, direction: Direction = "reverse") -> None:
        if direction not in ("reverse", "forward"):
            raise ValueError(f"direction must be 'reverse' or 'forward', got {direction!r}")
        self.mdp = mdp
        self.direction: Direction = direction

    def update(self, team: Any, agent: int, rollouts: Any, radius: float) -> AgentUpdate:
        if not isinstance(team, TabularTeam):
            raise TypeError(f"ExactUpdater needs a TabularTeam, got {type(team).__name__}")
        if not (radius >= 0 and np.isfinite(radius)):
            raise ValueError(f"radius must be a finite number >= 0, got {radius!r}")
        old = team.agent(agent)
        occupancy = np.asarray(rollouts.occupancy, dtype=np.float64)
        advantage = np.asarray(rollouts.advantage, dtype=np.float64)
        scale = float(rollouts.surrogate_scale)
        mine = team.states_of(agent) & (occupancy > 0)

        policy = old[mine]
        support = policy > 0
        adv = advantage[mine]
        top = np.max(np.where(support, adv, -np.inf), axis=1, keepdims=True)
        bottom = np.min(np.where(support, adv, np.inf), axis=1, keepdims=True)
        varies = (top > bottom).ravel()

        new_rows = policy.copy()
        temperature = np.inf
        greedy = False
        if radius > 0 and varies.any():
            rows = _Rows(
                weights=occupancy[mine][varies],
                policy=policy[varies],
                centred=np.where(support[varies], adv[varies] - top[varies], 0.0),
                support=support[varies],
            )
            solution, temperature, greedy = self._solve(rows, radius)
            new_rows[varies] = solution

        new_table = old.copy()
        new_table[mine] = new_rows
        evaluation = getattr(rollouts, "evaluation", None)
        if evaluation is not None and np.ndim(evaluation.A) == 3:
            # Episodic with exact per-step advantages (those of the team the rollouts
            # evaluate): the episodic penalty needs eps = max over t and reached s of
            # |E_{pi'} A_t(s, .)|, which the time-averaged A_bar can understate.
            epsilon = evaluation.advantage_bound(new_table, mine)
        else:
            epsilon = advantage_bound(new_table, advantage, mine)
        return self._report(
            old, new_table, mine, occupancy, advantage, scale, epsilon, temperature, greedy
        )

    def _solve(self, rows: _Rows, radius: float) -> tuple[Array, float, bool]:
        solve_rows = _reverse_tilt if self.direction == "reverse" else _forward_solution

        def expected_kl(u: float) -> float:
            return float(rows.weights @ solve_rows(rows, u)[1])

        if self.direction == "reverse":
            greedy = _greedy(rows)
            greedy_kl = -np.log(rows.greedy_mass)
            if rows.weights @ greedy_kl <= radius:
                # Even the limit beta -> 0 is inside the trust region: it is the maximiser.
                return greedy, 0.0, True
        # Second-order start: both KLs are ~ Var_pi(A) / (2 t^2) for a large temperature t.
        mean = np.sum(rows.policy * rows.centred, axis=1, keepdims=True)
        variance = float(rows.weights @ np.sum(rows.policy * (rows.centred - mean) ** 2, axis=1))
        guess = 0.5 * np.log(max(variance, 1e-300) / (2.0 * radius))
        u = _solve_temperature(expected_kl, radius, guess)
        return solve_rows(rows, u)[0], float(np.exp(u)), False

    def _report(
        self,
        old: Array,
        new: Array,
        mine: NDArray[np.bool_],
        occupancy: Array,
        advantage: Array,
        scale: float,
        epsilon: float,
        temperature: float,
        greedy: bool,
    ) -> AgentUpdate:
        weights = occupancy[mine]
        p, q = old[mine], new[mine]
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.direction == "reverse":
                kl_terms = np.where(q > 0, q * np.log(q / p), 0.0)
            else:
                kl_terms = np.where(p > 0, p * np.log(p / q), 0.0)
        kl = np.maximum(kl_terms.sum(axis=1), 0.0)
        tv = 0.5 * np.abs(q - p).sum(axis=1)
        expected_advantage = np.sum(q * advantage[mine], axis=1)
        return AgentUpdate(
            policy=new,
            # L_i of Thm 3.4 restricted to agent k's states (elsewhere pi' = pi).
            surrogate=scale * float(weights @ expected_advantage),
            kl=float(weights @ kl),
            advantage_bound=epsilon,
            tv=float(weights @ tv),
            kl_quantile=None,
            extras={"temperature": temperature, "greedy": float(greedy)},
        )
