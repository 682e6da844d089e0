"""The exact trust-region update of one agent (THEORY.md §2, Thm 3.4).

ARCHITECTURE.md, "The tabular world", places it among the parts of the exact backend.

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
their maximum, and both depend on A-hat / temperature only, so they are solved on advantages
scaled to max |A-hat| = 1. Actions outside the support of pi keep probability 0 in both
directions.

When the radius does not bind, the limit is returned: the greedy policy (reverse, whose KL
stays below -log pi(T|s) with T the argmax set), or, forward, whose KL grows only like
pi(a) log(1/lambda) for the actions it empties, the solution at the smallest lambda at which
every pi'(a) is still a normal float (the maximiser to working precision). ``extras["greedy"]``
is 1 in both cases.

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

from sim.evaluate import NonFiniteResultError, advantage_bound
from sim.mdp import TurnTakingMDP
from sim.team import TeamMismatchError, as_fitting_team
from teamtr.reports import AgentUpdate
from teamtr.trust_region import check_radius

Array = NDArray[np.float64]
Direction = Literal["reverse", "forward"]

KL_RELATIVE_TOL = 1e-9
"""The expected KL of a constrained update equals the radius to this relative accuracy."""

_TINY = float(np.finfo(np.float64).tiny)
_LOG_TEMPERATURE_FLOOR = -700.0
"""The smallest log-temperature searched. The centred advantages are rescaled to max |A| = 1
first, so down to exp(-700) ~ 1e-304 the tilt is a normal float computation; below, the reverse
tilt is the greedy policy to working precision."""


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
    with np.errstate(divide="ignore", invalid="ignore"):  # log 0, -inf - -inf: off the support
        log_policy = np.log(rows.policy)
        logits = np.where(rows.support, log_policy + rows.centred / beta, -np.inf)
        log_new = logits - logsumexp(logits, axis=1, keepdims=True)
        new = np.exp(log_new)
        kl = np.sum(np.where(rows.support, new * (log_new - log_policy), 0.0), axis=1)
    return new, np.maximum(kl, 0.0)


def _forward_log_gaps(rows: _Rows, log_lambda: float, k: Array) -> Array:
    """log(k_s + b(a)) with b(a) = -A(a)/lambda >= 0 (A centred), computed without overflow."""
    with np.errstate(divide="ignore"):
        log_b = np.log(-rows.centred) - log_lambda  # -inf on the greedy set and off the support
    return np.logaddexp(np.log(k)[:, None], log_b)


def _forward_roots(rows: _Rows, log_lambda: float) -> Array:
    """k_s = c_s / lambda with sum_a pi(a) / (k_s + b(a)) = 1, b(a) = -A(a)/lambda (A centred).

    g(k) = sum_a pi(a)/(k + b(a)) is convex and decreasing on k > 0, g(pi(T)) >= 1 with T the
    greedy set (b = 0 there) and g(1) <= 1, so Newton's iteration started at pi(T) increases
    monotonically to the root in (pi(T), 1] (the tangent of a convex decreasing function lies
    below it). Every term is evaluated in log space, so no temperature overflows or divides by
    zero, however small lambda is.
    """
    with np.errstate(divide="ignore"):
        log_policy = np.where(rows.support, np.log(rows.policy), -np.inf)
    k = rows.greedy_mass
    for _ in range(200):
        log_gaps = _forward_log_gaps(rows, log_lambda, k)
        g = np.sum(np.exp(log_policy - log_gaps), axis=1)
        slope = -np.sum(np.exp(log_policy - 2.0 * log_gaps), axis=1)
        k_next = np.minimum(k - (g - 1.0) / slope, 1.0)  # k <= 1 always holds at the root
        done = np.abs(k_next - k) <= 4e-16 * k_next
        k = k_next
        if done.all():
            break
    return k


def _forward_solution(rows: _Rows, log_lambda: float) -> tuple[Array, Array]:
    """pi' = lambda pi / (c_s - A) = pi / (k_s + b) and KL(pi || pi') per state, in log space."""
    k = _forward_roots(rows, log_lambda)
    log_gaps = _forward_log_gaps(rows, log_lambda, k)
    with np.errstate(divide="ignore"):
        log_new = np.where(rows.support, np.log(rows.policy) - log_gaps, -np.inf)
    # Normalising removes the root's last rounding error; KL(pi || pi') per state is then
    # sum_a pi(a) log(k + b(a)) + log(normaliser), finite even where pi'(a) underflows.
    log_normaliser = logsumexp(log_new, axis=1)
    new = np.exp(log_new - log_normaliser[:, None])
    kl = np.sum(np.where(rows.support, rows.policy * log_gaps, 0.0), axis=1) + log_normaliser
    return new, np.maximum(kl, 0.0)


def _forward_floor(rows: _Rows) -> float:
    """The smallest log(lambda) at which every supported pi'(a) stays a normal float.

    pi'(a) >= pi(a) / (1 + b(a)) since k <= 1, and that is >= 2 * tiny once
    b(a) = -A(a)/lambda <= pi(a) / (4 tiny). Below this lambda the forward maximiser moves
    mass that a float cannot hold (pi'(a) would round to 0 and KL(pi || pi') to infinity).
    """
    below = rows.support & (rows.centred < 0) & (rows.policy >= 4.0 * _TINY)
    with np.errstate(divide="ignore"):
        bounds = np.log(-rows.centred) - np.log(rows.policy) + np.log(4.0 * _TINY)
    return float(np.max(bounds[below], initial=_LOG_TEMPERATURE_FLOOR))


def _greedy(rows: _Rows) -> Array:
    """The beta -> 0 limit of the reverse tilt: pi restricted to the argmax set, renormalised."""
    best = np.where(rows.greedy_set, rows.policy, 0.0)
    return best / best.sum(axis=1, keepdims=True)


def _solve_temperature(
    expected_kl: Callable[[float], float], radius: float, guess: float, floor: float
) -> tuple[float, bool]:
    """log-temperature u >= floor with expected_kl(u) = radius; expected_kl decreases in u.

    Returns (u, False), or (floor, True) when even expected_kl(floor) <= radius: the radius does
    not bind down to the smallest temperature the update can represent. The bracket is grown
    by doubling steps, so a root far from the guess costs a few dozen evaluations.
    """

    def gap(u: float) -> float:
        return expected_kl(u) - radius

    low = high = max(guess, floor)
    step = 2.0
    while gap(high) > 0:
        high += step
        step *= 2.0
    step = 2.0
    while gap(low) < 0:
        if low <= floor:
            return floor, True
        low = max(low - step, floor)
        step *= 2.0
    if low == high:
        return low, False
    return float(brentq(gap, low, high, xtol=1e-14, rtol=1e-15, maxiter=500)), False


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
        team = as_fitting_team(self.mdp, team, "ExactUpdater.update")
        # Radius 0 is the degenerate region {pi} itself: the update is the exact "no move" (the
        # old policy, KL 0), which a direct caller may ask for (tests/sim/test_updates.py). Any
        # other radius meets the core's one rule (the stage loop's were checked by StageConfig).
        if radius != 0:
            check_radius(radius)
        old = team.agent(agent)
        occupancy, advantage, scale = self._read_rollouts(rollouts)
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
            with np.errstate(over="ignore"):
                centred = np.where(support[varies], adv[varies] - top[varies], 0.0)
            # A spread beyond float64's range (advantages of both signs near 1e308) is centred
            # in halves instead: halving is exact, and the difference of two halves is finite.
            halved = not np.isfinite(centred).all()
            if halved:
                centred = np.where(support[varies], 0.5 * adv[varies] - 0.5 * top[varies], 0.0)
            # Both maximisers depend on A / temperature only: solving on advantages scaled to
            # max |A| = 1 keeps the temperature search in normal floats whatever their size
            # (advantage spreads of 1e-308, from a subnormal gamma, included).
            spread = float(-centred.min()) * (2.0 if halved else 1.0)
            rows = _Rows(
                weights=occupancy[mine][varies],
                policy=policy[varies],
                centred=centred / float(-centred.min()),
                support=support[varies],
            )
            solution, temperature, greedy = self._solve(rows, radius)
            with np.errstate(over="ignore"):
                temperature *= spread
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

    def _read_rollouts(self, rollouts: Any) -> tuple[Array, Array, float]:
        """(d, A-hat, surrogate scale) of ``rollouts``, checked against the MDP's shape.

        Non-finite inputs are refused here: they would turn the temperature search and the
        reported certificate into NaN.
        """
        shape = (self.mdp.n_states, self.mdp.n_actions)
        occupancy = np.asarray(rollouts.occupancy, dtype=np.float64)
        advantage = np.asarray(rollouts.advantage, dtype=np.float64)
        scale = float(rollouts.surrogate_scale)
        if occupancy.shape != shape[:1] or advantage.shape != shape:
            raise TeamMismatchError(
                f"ExactUpdater.update: rollouts with occupancy {occupancy.shape} and advantage "
                f"{advantage.shape} do not fit the MDP's (S,) = {shape[:1]} and (S, A) = {shape}"
            )
        for name, values in (("occupancy", occupancy), ("advantage", advantage)):
            if not np.isfinite(values).all():
                index = tuple(int(i) for i in np.argwhere(~np.isfinite(values))[0])
                raise NonFiniteResultError(
                    f"ExactUpdater.update: the rollouts' {name} is not finite at {index}: "
                    f"{values[index]}"
                )
        if (occupancy < 0).any() or not (np.isfinite(scale) and scale > 0):
            raise ValueError(
                "ExactUpdater.update: rollouts need an occupancy >= 0 and a finite surrogate "
                f"scale > 0, got min d = {occupancy.min():.3g}, scale = {scale!r}"
            )
        return occupancy, advantage, scale

    def _solve(self, rows: _Rows, radius: float) -> tuple[Array, float, bool]:
        """(policy rows, temperature, limit): limit when the radius does not bind."""
        solve_rows = _reverse_tilt if self.direction == "reverse" else _forward_solution

        def expected_kl(u: float) -> float:
            return float(rows.weights @ solve_rows(rows, u)[1])

        if self.direction == "reverse":
            greedy = _greedy(rows)
            greedy_kl = -np.log(rows.greedy_mass)
            if rows.weights @ greedy_kl <= radius:
                # Even the limit beta -> 0 is inside the trust region: it is the maximiser.
                return greedy, 0.0, True
            floor = _LOG_TEMPERATURE_FLOOR
        else:
            # The forward KL grows without bound as lambda -> 0, but only like
            # pi(a) log(1/lambda) for the actions it empties: when those are rare the radius
            # is met at a lambda that no float holds. The policy at the floor is then the
            # maximiser to working precision (it differs from it by < 1e-300 per action).
            floor = _forward_floor(rows)
        # Second-order start: both KLs are ~ Var_pi(A) / (2 t^2) for a large temperature t.
        mean = np.sum(rows.policy * rows.centred, axis=1, keepdims=True)
        variance = float(rows.weights @ np.sum(rows.policy * (rows.centred - mean) ** 2, axis=1))
        guess = 0.5 * np.log(max(variance, 1e-300) / (2.0 * radius))
        u, limit = _solve_temperature(expected_kl, radius, guess, floor)
        return solve_rows(rows, u)[0], float(np.exp(u)), limit

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
        with np.errstate(over="ignore", invalid="ignore"):
            expected_advantage = np.sum(q * advantage[mine], axis=1)
            surrogate = scale * float(weights @ expected_advantage)
        report = {
            "surrogate": surrogate,
            "kl": float(weights @ kl),
            "advantage_bound": epsilon,
            "tv": float(weights @ tv),
        }
        for name, value in report.items():
            if not np.isfinite(value):
                raise NonFiniteResultError(
                    f"ExactUpdater.update: the update's {name} is not finite ({value}); the "
                    f"advantages (max |A-hat| = {np.abs(advantage).max():.3g}) times the "
                    f"surrogate scale {scale:.3g} overflow float64. Rescale the rewards."
                )
        return AgentUpdate(
            policy=new,
            # L_i of Thm 3.4 restricted to agent k's states (elsewhere pi' = pi).
            surrogate=report["surrogate"],
            kl=report["kl"],
            advantage_bound=report["advantage_bound"],
            tv=report["tv"],
            kl_quantile=None,
            extras={"temperature": temperature, "greedy": float(greedy)},
        )
