"""A third backend in a few lines of numpy, for the core's own tests: a one-step team game.

Agent k acts in its own state k (visited with probability 1/n) and picks one of ``A`` actions
with reward ``rewards[k, a]``; gamma = 0, so J = (1/n) sum_k pi_k . r_k and the surrogate L_i of
Thm 3.4 equals the realised gain exactly. Its updater mixes the agent's policy towards its best
action and halves the step until E_d[KL(new || old)] <= delta_i (reverse KL, as ``sim``).
The broken variants below each break one promise of ``teamtr.protocols``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from teamtr import AgentUpdate, DiscountedPenalty


class ToyTeam:
    def __init__(self, policies: list[np.ndarray]) -> None:
        self._policies = policies

    @property
    def n_agents(self) -> int:
        return len(self._policies)

    def agent(self, index: int) -> np.ndarray:
        return self._policies[index]

    def with_agent(self, index: int, policy: np.ndarray) -> ToyTeam:
        policies = list(self._policies)
        policies[index] = np.asarray(policy, dtype=np.float64)
        return ToyTeam(policies)


@dataclass(frozen=True)
class ToyRollouts:
    behaviour: ToyTeam
    occupancy: np.ndarray
    """d(k) = 1/n: every agent's state is visited alike, whatever the team."""
    advantage: np.ndarray
    """A(k, a) = r(k, a) - pi_k . r_k under ``behaviour``."""


@dataclass
class ToyGame:
    rewards: np.ndarray
    """n x A."""

    def uniform_team(self) -> ToyTeam:
        n, a = self.rewards.shape
        return ToyTeam([np.full(a, 1.0 / a) for _ in range(n)])

    def value(self, team: ToyTeam) -> float:
        return float(np.mean([team.agent(k) @ self.rewards[k] for k in range(team.n_agents)]))

    def penalty(self) -> DiscountedPenalty:
        return DiscountedPenalty(0.0)


def toy_game(n_agents: int = 3, n_actions: int = 4, seed: int = 0) -> ToyGame:
    return ToyGame(np.random.default_rng(seed).uniform(-1.0, 1.0, size=(n_agents, n_actions)))


@dataclass
class ToySampler:
    game: ToyGame

    def sample(self, team, *, previous=None, updated_agent=None) -> ToyRollouts:
        n = team.n_agents
        values = np.array([team.agent(k) @ self.game.rewards[k] for k in range(n)])
        return ToyRollouts(team, np.full(n, 1.0 / n), self.game.rewards - values[:, None])

    def importance_weighted(self, rollouts, team) -> ToyRollouts:
        # The occupancy does not depend on the team; the advantages stay the behaviour's.
        return rollouts


def reverse_kl(new: np.ndarray, old: np.ndarray) -> float:
    """KL(new || old) of two distributions with full support."""
    return float(np.sum(new * np.log(new / old)))


@dataclass
class ToyUpdater:
    max_backtracks: int = 40

    def update(self, team, agent, rollouts, radius) -> AgentUpdate:
        old = team.agent(agent)
        advantage = rollouts.advantage[agent]
        greedy = np.zeros_like(old)
        greedy[int(np.argmax(advantage))] = 1.0
        weight = float(rollouts.occupancy[agent])
        step = 1.0
        for backtracks in range(self.max_backtracks + 1):
            # Mix no further than 1 - 1e-3 towards the greedy action: full support keeps KL finite.
            new = (1.0 - 0.999 * step) * old + 0.999 * step * greedy
            kl = weight * reverse_kl(new, old)
            if kl <= radius:
                return AgentUpdate(
                    policy=new,
                    surrogate=weight * float(new @ advantage),
                    kl=kl,
                    advantage_bound=float(np.max(np.abs(advantage))),
                    backtracks=backtracks,
                )
            step /= 2.0
        return AgentUpdate(
            policy=old,
            surrogate=0.0,
            kl=0.0,
            advantage_bound=0.0,
            accepted=False,
            backtracks=self.max_backtracks,
        )


def toy_statistic(rollouts: ToyRollouts) -> np.ndarray:
    """Deterministic in the rollouts' distribution: occupancy and advantages, flattened."""
    return np.concatenate([rollouts.occupancy, rollouts.advantage.ravel()])


# -- broken variants, one per promise ------------------------------------------------------------
class MutatingTeam(ToyTeam):
    """Breaks "teams are values": ``with_agent`` writes the new policy into the shared arrays."""

    def with_agent(self, index: int, policy: np.ndarray) -> MutatingTeam:
        self._policies[index][:] = policy
        return MutatingTeam(list(self._policies))


@dataclass
class MislabellingSampler(ToySampler):
    """Breaks "rollouts record their team": prefix-reusing rollouts keep the previous label."""

    def sample(self, team, *, previous=None, updated_agent=None) -> ToyRollouts:
        rollouts = super().sample(team)
        if previous is not None:
            return replace(rollouts, behaviour=previous.behaviour)
        return rollouts


@dataclass
class OverreachingUpdater(ToyUpdater):
    """Breaks "no accepted update above its radius": it always takes the full step."""

    def update(self, team, agent, rollouts, radius) -> AgentUpdate:
        update = super().update(team, agent, rollouts, radius=1e9)
        return replace(update, accepted=True)


@dataclass
class StaleReusingSampler(ToySampler):
    """Breaks "resampled rollouts are on-policy": prefix reuse keeps all the previous data and
    only relabels it, so the advantages are those of the team before the update."""

    def sample(self, team, *, previous=None, updated_agent=None) -> ToyRollouts:
        if previous is not None:
            return replace(previous, behaviour=team)
        return super().sample(team)
