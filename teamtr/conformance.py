"""Does a backend keep the promises the stage loop relies on? (``teamtr.protocols``)

``check_backend(team, sampler, updater)`` runs small composable checks (each takes a
``Backend``, the parts and how to probe them), one per behavioural
promise of the protocols, on a backend's own parts, and raises ``BackendCheckError`` naming the
promise that fails. It is the analogue of Gymnasium's ``check_env`` for a third backend:

- ``check_team_is_a_value``: ``with_agent`` returns a new team and never mutates the old one;
  neither does an update (the stage loop keeps pi_hat^0 .. pi_hat^n side by side, THEORY.md §1).
- ``check_rollouts_record_their_team``: ``sample(team).behaviour`` is the team that was sampled,
  with and without prefix reuse (the occupancy of Thm 3.4 is that team's).
- ``check_updates_inside_radius``: no update comes back accepted with a non-finite statistic or
  with E_d[KL_i] above its radius delta_i (Thm 3.4 needs E_d[KL_i] <= delta_i).
- ``check_resampling_is_on_policy``: rollouts resampled with prefix reuse after an update are
  those of the intermediate team pi_hat^i: they record it, and, where the caller can compute a
  ``statistic`` of rollouts that is deterministic in their distribution (an exact backend's
  occupancy, say), they agree with fresh rollouts of that team.

The protocols do not define equality of policies; ``same_policy`` compares numpy arrays
exactly, objects with an ``equal`` method through it, and anything else with ``==``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from teamtr.config import DEFAULT_RADIUS
from teamtr.protocols import AgentUpdater, Sampler, TeamPolicy
from teamtr.trust_region import admitted, check_radius

Statistic = Callable[[Any], Any]
"""A deterministic function of the distribution of rollouts (returns a number or an array)."""


class BackendCheckError(AssertionError):
    """A backend broke one of the protocols' behavioural promises."""


@dataclass(frozen=True)
class Backend:
    """The parts a backend supplies, and how to probe them."""

    team: TeamPolicy
    """A team that can improve at ``radius`` (the checks need one accepted update)."""
    sampler: Sampler
    updater: AgentUpdater
    radius: float = DEFAULT_RADIUS
    """delta_i of the probing updates (the core's default radius unless given)."""
    statistic: Statistic | None = None
    """A deterministic function of the rollouts' distribution, where the backend has one."""
    tolerance: float = 1e-9
    """How far ``statistic`` of prefix-reusing and of fresh rollouts may differ."""

    def __post_init__(self) -> None:
        check_radius(self.radius)  # given here, not through a StageConfig: the core's one rule


def same_policy(a: Any, b: Any) -> bool:
    """Whether two agent policies are identical (arrays bit for bit, or their own ``equal``)."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    equal = getattr(a, "equal", None)
    if callable(equal):
        return bool(equal(b))
    return bool(a == b)


def same_team(a: TeamPolicy, b: TeamPolicy) -> bool:
    """Whether two teams are the same object or have identical agents."""
    if a is b:
        return True
    if a.n_agents != b.n_agents:
        return False
    return all(same_policy(a.agent(k), b.agent(k)) for k in range(a.n_agents))


def _snapshot(team: TeamPolicy) -> list[Any]:
    return [copy.deepcopy(team.agent(k)) for k in range(team.n_agents)]


def _require_unchanged(team: TeamPolicy, snapshot: list[Any], after: str) -> None:
    for k, before in enumerate(snapshot):
        if not same_policy(team.agent(k), before):
            raise BackendCheckError(f"teams must be values: agent {k} of a team changed {after}")


def _first_update(backend: Backend) -> tuple[int, Any, Any]:
    """(agent, rollouts, update) of the first agent whose update is accepted."""
    team = backend.team
    rollouts = backend.sampler.sample(team)
    for agent in range(team.n_agents):
        update = backend.updater.update(team, agent, rollouts, backend.radius)
        if update.accepted:
            return agent, rollouts, update
    raise BackendCheckError(
        f"no agent's update was accepted at radius {backend.radius}: the checks need one "
        "accepted update (pass a team that can improve, or a larger radius)"
    )


def check_team_is_a_value(backend: Backend) -> None:
    """``with_agent`` and ``update`` leave the team they are given exactly as it was."""
    team = backend.team
    snapshot = _snapshot(team)
    agent, _, update = _first_update(backend)
    _require_unchanged(team, snapshot, "during AgentUpdater.update")
    new = team.with_agent(agent, update.policy)
    _require_unchanged(team, snapshot, f"when with_agent({agent}, ...) built another team from it")
    if new is team:
        raise BackendCheckError("with_agent must return a new team, not the team itself")
    if new.n_agents != team.n_agents:
        raise BackendCheckError(
            f"with_agent changed the team size from {team.n_agents} to {new.n_agents}"
        )
    if not same_policy(new.agent(agent), update.policy):
        raise BackendCheckError(f"with_agent({agent}, policy) does not play that policy")


def check_rollouts_record_their_team(backend: Backend) -> None:
    """``rollouts.behaviour`` is the team that was sampled, also when a prefix is reused."""
    team = backend.team
    agent, rollouts, update = _first_update(backend)
    if not same_team(rollouts.behaviour, team):
        raise BackendCheckError("sample(team).behaviour is not the team that was sampled")
    new = team.with_agent(agent, update.policy)
    for previous, label in ((None, "fresh"), (rollouts, "prefix-reusing")):
        resampled = backend.sampler.sample(new, previous=previous, updated_agent=agent)
        if not same_team(resampled.behaviour, new):
            raise BackendCheckError(
                f"{label} rollouts of a team with agent {agent} updated record another team "
                "as their behaviour"
            )


def check_updates_inside_radius(backend: Backend) -> None:
    """No update is accepted with E_d[KL_i] > delta_i or a non-finite statistic, at ``radius``
    and at a hundredth of it (a tight radius is where a careless step overshoots)."""
    team = backend.team
    rollouts = backend.sampler.sample(team)
    for delta in (backend.radius, backend.radius / 100.0):
        for agent in range(team.n_agents):
            update = backend.updater.update(team, agent, rollouts, delta)
            if not update.accepted:
                continue
            values = (update.kl, update.surrogate, update.advantage_bound)
            if not all(math.isfinite(v) for v in values):
                raise BackendCheckError(
                    f"agent {agent}'s update was accepted with a non-finite KL, surrogate or "
                    f"advantage bound {values}"
                )
            # The stage loop's rule with its default slack (StageConfig.kl_tolerance).
            if not admitted(update.kl, delta):
                raise BackendCheckError(
                    f"agent {agent}'s update was accepted with E_d[KL] = {update.kl:.6g} above its "
                    f"radius {delta:.6g}"
                )


def check_resampling_is_on_policy(backend: Backend) -> None:
    """Prefix-reusing rollouts after an update stand for the intermediate team pi_hat^i."""
    agent, rollouts, update = _first_update(backend)
    new = backend.team.with_agent(agent, update.policy)
    resampled = backend.sampler.sample(new, previous=rollouts, updated_agent=agent)
    if resampled is rollouts:
        raise BackendCheckError("sample(new team, previous=...) returned the previous rollouts")
    if not same_team(resampled.behaviour, new):
        raise BackendCheckError("resampled rollouts do not record the intermediate team")
    statistic, tolerance = backend.statistic, backend.tolerance
    if statistic is None:
        return
    fresh = backend.sampler.sample(new)
    got, want = np.asarray(statistic(resampled), float), np.asarray(statistic(fresh), float)
    if got.shape != want.shape or not np.allclose(got, want, rtol=0.0, atol=tolerance):
        gap = float(np.max(np.abs(got - want))) if got.shape == want.shape else math.inf
        raise BackendCheckError(
            f"rollouts resampled with prefix reuse after agent {agent}'s update differ from fresh "
            f"rollouts of the same team by {gap:.3g} > {tolerance:.3g} (off-policy reuse)"
        )


CHECKS: dict[str, Callable[[Backend], None]] = {
    "team_is_a_value": check_team_is_a_value,
    "rollouts_record_their_team": check_rollouts_record_their_team,
    "updates_inside_radius": check_updates_inside_radius,
    "resampling_is_on_policy": check_resampling_is_on_policy,
}
"""Every check, by name, in the order ``check_backend`` runs them."""


def check_backend(
    team: TeamPolicy,
    sampler: Sampler,
    updater: AgentUpdater,
    *,
    radius: float = DEFAULT_RADIUS,
    statistic: Statistic | None = None,
    tolerance: float = 1e-9,
) -> tuple[str, ...]:
    """Run every check of ``CHECKS`` on a backend's parts; return the names of those that ran.

    ``team`` should be able to improve at ``radius`` (the checks need one accepted update).
    ``statistic`` (optional) is a deterministic function of the rollouts' distribution; with it,
    prefix-reusing rollouts must agree with fresh ones within ``tolerance``.
    """
    backend = Backend(team, sampler, updater, radius, statistic, tolerance)
    for check in CHECKS.values():
        check(backend)
    return tuple(CHECKS)
