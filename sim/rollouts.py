"""Samplers of decision points for the stage loop: exact (linear solves) and Monte-Carlo.

Both return ``TabularRollouts``: an occupancy d and advantages A-hat over S x A, which is all
an ``ExactUpdater`` reads. The surrogate of Thm 3.4 is then
L = surrogate_scale * sum_s d(s) sum_a pi'(a|s) A-hat(s,a), with surrogate_scale = 1/(1-gamma)
(discounted) or H (episodic, d the average of the per-step marginals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sim.env import TurnTakingEnv
from sim.evaluate import Evaluation, evaluate
from sim.linear import validate_solver_options
from sim.mdp import TurnTakingMDP
from sim.team import TabularTeam, as_fitting_team

Array = NDArray[np.float64]


@dataclass(frozen=True)
class EpisodeBatch:
    """Flat arrays over every step of a batch of episodes."""

    episode: NDArray[np.int64]
    """Which episode each step belongs to (0 .. n_episodes - 1)."""
    time: NDArray[np.int64]
    state: NDArray[np.int64]
    action: NDArray[np.int64]
    reward: Array
    return_to_go: Array
    """Undiscounted sum of this and later rewards of the episode (see ``sim.env``)."""
    n_episodes: int


@dataclass(frozen=True)
class TabularRollouts:
    """Decision points of a team as an occupancy and an advantage table.

    Implements ``teamtr.protocols.Rollouts``. ``behaviour`` is the team the data (and the
    advantages) come from. After ``importance_weighted`` the occupancy stands for
    ``reweighted_for`` while the advantages stay those of ``behaviour`` (HAPPO's stale
    advantages).
    """

    behaviour: TabularTeam
    occupancy: Array
    """d(s), sums to 1: the discounted occupancy, or the average per-step marginal (episodic)."""
    advantage: Array
    """A-hat(s, a), S x A: A (discounted) or the occupancy-averaged A_bar (episodic)."""
    surrogate_scale: float
    """1/(1-gamma) discounted, H episodic."""
    evaluation: Evaluation | None = None
    """The exact evaluation of ``behaviour`` (None when sampled)."""
    episodes: EpisodeBatch | None = None
    """The sampled episodes (None when exact)."""
    reweighted_for: TabularTeam | None = None
    """The team the occupancy was importance-weighted to, if any."""

    def surrogate(self, policy: Array, states: NDArray[np.bool_] | None = None) -> float:
        """surrogate_scale * sum_s d(s) sum_a policy(a|s) A-hat(s,a), over ``states`` if given."""
        per_state = self.occupancy * np.einsum("sa,sa->s", policy, self.advantage)
        if states is not None:
            per_state = per_state[states]
        return float(self.surrogate_scale * per_state.sum())


ExactRollouts = TabularRollouts
"""The name under which the stage loop and the proofs refer to tabular rollouts."""


def surrogate_scale(mdp: TurnTakingMDP) -> float:
    if mdp.horizon is not None:
        return float(mdp.horizon)
    return 1.0 / (1.0 - mdp.gamma)


class ExactSampler:
    """Exact "rollouts": the occupancy and advantages of a team by linear solves.

    Implements ``teamtr.protocols.Sampler``: the limit of infinitely many on-policy episodes.
    Teams must fit ``mdp`` (``sim.team.check_team_fits``); ``rtol`` is in (0, 1).
    """

    def __init__(self, mdp: TurnTakingMDP, *, rtol: float = 1e-11) -> None:
        validate_solver_options(rtol, "auto")
        self.mdp = mdp
        self.rtol = rtol

    def sample(
        self,
        team: Any,
        *,
        previous: Any | None = None,
        updated_agent: int | None = None,
    ) -> TabularRollouts:
        """Exact rollouts of ``team`` (``previous``/``updated_agent`` are not needed here)."""
        tabular = as_fitting_team(self.mdp, team, "ExactSampler.sample")
        evaluation = evaluate(self.mdp, tabular.table, rtol=self.rtol)
        return TabularRollouts(
            behaviour=tabular,
            occupancy=evaluation.d,
            advantage=evaluation.surrogate_advantage,
            surrogate_scale=surrogate_scale(self.mdp),
            evaluation=evaluation,
        )

    def importance_weighted(self, rollouts: Any, team: Any) -> TabularRollouts:
        """What an infinite HAPPO-weighted cache of ``rollouts`` stands for, exactly.

        The product of the changed agents' ratios over an episode turns the behaviour's
        trajectory distribution into ``team``'s, so the cache follows d_team; the advantages
        attached to its decision points stay those of the behaviour team (stale). Episodic:
        A_bar is re-averaged with team's per-step marginals, sum_t rho_t^team A_t^behaviour.
        """
        target = as_fitting_team(self.mdp, team, "ExactSampler.importance_weighted")
        target_evaluation = evaluate(self.mdp, target.table, rtol=self.rtol)
        advantage = np.asarray(rollouts.advantage)
        behaviour_evaluation = getattr(rollouts, "evaluation", None)
        if self.mdp.horizon is not None and behaviour_evaluation is not None:
            marginals = target_evaluation.rho
            assert marginals is not None
            visits = marginals.sum(axis=0)
            weighted = np.einsum("ts,tsa->sa", marginals, behaviour_evaluation.A)
            advantage = np.zeros_like(weighted)
            reached = visits > 0
            advantage[reached] = weighted[reached] / visits[reached, None]
        return TabularRollouts(
            behaviour=rollouts.behaviour,
            occupancy=target_evaluation.d,
            advantage=advantage,
            surrogate_scale=surrogate_scale(self.mdp),
            evaluation=behaviour_evaluation,
            reweighted_for=target,
        )


class SampledSampler:
    """Monte-Carlo rollouts of ``TurnTakingEnv`` episodes (finite-sample studies).

    Occupancy: the visit frequencies of all steps (with geometric termination every step is a
    draw from d_pi; episodic: from the average marginal). Advantages: the mean over visits of
    (s, a) of G_t - V-hat(s) (discounted) or G_t - V-hat_t(s) (episodic), G_t the return to go
    and V-hat the mean return to go of the state (at that step). Because the policy is
    stationary this is a consistent estimate of A (or A_bar). Unvisited (s, a) get 0.
    """

    def __init__(
        self,
        mdp: TurnTakingMDP,
        n_episodes: int,
        seed: int | None = 0,
        max_steps: int | None = None,
    ) -> None:
        if n_episodes < 1:
            raise ValueError(f"n_episodes must be >= 1, got {n_episodes}")
        self.mdp = mdp
        self.n_episodes = n_episodes
        self.env = TurnTakingEnv(mdp, max_steps=max_steps)
        seeds = np.random.SeedSequence(seed).spawn(2)
        self._action_rng = np.random.default_rng(seeds[0])
        self._env_seed = int(seeds[1].generate_state(1)[0])
        self._env_seeded = False

    def rollout(self, team: TabularTeam) -> EpisodeBatch:
        """Play ``n_episodes`` episodes of ``team`` in the environment."""
        as_fitting_team(self.mdp, team, "SampledSampler.rollout")
        cumulative = np.cumsum(team.table, axis=1)
        episodes: list[int] = []
        times: list[int] = []
        states: list[int] = []
        actions: list[int] = []
        rewards: list[float] = []
        for e in range(self.n_episodes):
            # Seed the environment once; later resets continue its random stream.
            seed = None if self._env_seeded else self._env_seed
            self._env_seeded = True
            state, _ = self.env.reset(seed=seed)
            t = 0
            while True:
                s = int(state)
                u = self._action_rng.random() * cumulative[s, -1]
                action = min(
                    int(np.searchsorted(cumulative[s], u, side="right")), cumulative.shape[1] - 1
                )
                state, reward, terminated, truncated, _ = self.env.step(action)
                episodes.append(e)
                times.append(t)
                states.append(s)
                actions.append(action)
                rewards.append(reward)
                t += 1
                if terminated or truncated:
                    break
        episode = np.asarray(episodes, dtype=np.int64)
        reward_array = np.asarray(rewards, dtype=np.float64)
        return EpisodeBatch(
            episode=episode,
            time=np.asarray(times, dtype=np.int64),
            state=np.asarray(states, dtype=np.int64),
            action=np.asarray(actions, dtype=np.int64),
            reward=reward_array,
            return_to_go=_returns_to_go(episode, reward_array),
            n_episodes=self.n_episodes,
        )

    def sample(
        self,
        team: Any,
        *,
        previous: Any | None = None,
        updated_agent: int | None = None,
    ) -> TabularRollouts:
        tabular = as_fitting_team(self.mdp, team, "SampledSampler.sample")
        batch = self.rollout(tabular)
        return TabularRollouts(
            behaviour=tabular,
            occupancy=self._occupancy(batch, np.ones(batch.state.size)),
            advantage=self._advantage(batch),
            surrogate_scale=surrogate_scale(self.mdp),
            episodes=batch,
        )

    def importance_weighted(self, rollouts: Any, team: Any) -> TabularRollouts:
        """The cache reweighted by each episode's product of the changed agents' ratios.

        Self-normalised weights on the occupancy; the advantages stay the behaviour's.
        """
        target = as_fitting_team(self.mdp, team, "SampledSampler.importance_weighted")
        batch: EpisodeBatch | None = rollouts.episodes
        if batch is None:
            raise ValueError("importance weighting needs sampled episodes (rollouts.episodes)")
        behaviour: TabularTeam = rollouts.behaviour
        changed = np.isin(self.mdp.agent_of_state[batch.state], target.changed_agents(behaviour))
        with np.errstate(divide="ignore"):
            log_ratio = np.log(target.table[batch.state, batch.action]) - np.log(
                behaviour.table[batch.state, batch.action]
            )
        log_weight = np.bincount(
            batch.episode, weights=np.where(changed, log_ratio, 0.0), minlength=batch.n_episodes
        )
        weight = np.exp(log_weight - log_weight.max())
        return TabularRollouts(
            behaviour=behaviour,
            occupancy=self._occupancy(batch, weight[batch.episode]),
            advantage=np.asarray(rollouts.advantage),
            surrogate_scale=surrogate_scale(self.mdp),
            episodes=batch,
            reweighted_for=target,
        )

    def _occupancy(self, batch: EpisodeBatch, step_weight: Array) -> Array:
        counts = np.bincount(batch.state, weights=step_weight, minlength=self.mdp.n_states)
        return counts / counts.sum()

    def _advantage(self, batch: EpisodeBatch) -> Array:
        n_states, n_actions = self.mdp.n_states, self.mdp.n_actions
        # Baseline key: the state (discounted) or the (step, state) pair (episodic).
        if self.mdp.horizon is not None:
            key = batch.time * n_states + batch.state
            n_keys = self.mdp.horizon * n_states
        else:
            key = batch.state
            n_keys = n_states
        visits = np.bincount(key, minlength=n_keys)
        totals = np.bincount(key, weights=batch.return_to_go, minlength=n_keys)
        baseline = totals[key] / visits[key]
        pair = batch.state * n_actions + batch.action
        pair_visits = np.bincount(pair, minlength=n_states * n_actions)
        pair_totals = np.bincount(
            pair, weights=batch.return_to_go - baseline, minlength=n_states * n_actions
        )
        advantage = np.zeros(n_states * n_actions)
        seen = pair_visits > 0
        advantage[seen] = pair_totals[seen] / pair_visits[seen]
        return advantage.reshape(n_states, n_actions)


def _returns_to_go(episode: NDArray[np.int64], reward: Array) -> Array:
    """Sum of the rewards from each step to the end of its episode (steps are contiguous)."""
    if reward.size == 0:
        return reward.copy()
    total = np.cumsum(reward[::-1])[::-1]
    last_index = np.flatnonzero(np.r_[episode[1:] != episode[:-1], True])
    after_episode = np.zeros(reward.size)
    ends = np.searchsorted(last_index, np.arange(reward.size))
    following = last_index[ends] + 1
    inside = following < reward.size
    after_episode[inside] = total[following[inside]]
    return total - after_episode
