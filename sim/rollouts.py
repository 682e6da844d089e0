"""Samplers of decision points for the stage loop: exact (linear solves) and Monte-Carlo.

Both return ``TabularRollouts``: an occupancy d and advantages A-hat over S x A, which is all
an ``ExactUpdater`` reads. The surrogate of Thm 3.4 is then
L = surrogate_scale * sum_s d(s) sum_a pi'(a|s) A-hat(s,a), with surrogate_scale = 1/(1-gamma)
(discounted) or H (episodic, d the average of the per-step marginals).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sim.coupling import StepNumbers, first_state, play_coupled
from sim.env import TurnTakingEnv
from sim.evaluate import Evaluation, evaluate
from sim.linear import validate_solver_options
from sim.mdp import TurnTakingMDP
from sim.pairing import EpisodeBatch, Steps, estimate_width, first_turns, return_estimates
from sim.team import TabularTeam, as_fitting_team
from teamtr.measured import PairedDifferences

Array = NDArray[np.float64]


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
    held_out: EpisodeBatch | None = None
    """Episodes of ``behaviour`` left out of the occupancy and advantages, for the next draw
    to continue (``SampledSampler.with_held_out``)."""
    pairs: PairedDifferences | None = None
    """This draw's continuation of the previous draw's held-out episodes, new return minus
    old (``teamtr.protocols.PairedRollouts``); None when it continued none."""

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

    With ``held_out`` episodes (``with_held_out``, ``teamtr.protocols.PairingSampler``) every
    draw also plays that many episodes the occupancy and advantages leave out
    (``TabularRollouts.held_out``), and a draw after agent k's update continues the previous
    draw's held-out episodes from agent k's first turn (``paired_differences``). With
    ``coupled``, held-out episodes and their continuations share their random numbers step by
    step (``sim.coupling``): same marginals, so the same expected difference, and a difference
    of 0 wherever the two teams act alike.
    """

    def __init__(
        self,
        mdp: TurnTakingMDP,
        n_episodes: int,
        seed: int | None = 0,
        max_steps: int | None = None,
        held_out: int = 0,
        coupled: bool = False,
    ) -> None:
        if n_episodes < 1:
            raise ValueError(f"n_episodes must be >= 1, got {n_episodes}")
        if held_out < 0:
            raise ValueError(f"held_out must be >= 0, got {held_out}")
        self.mdp = mdp
        self.n_episodes = n_episodes
        self.held_out = held_out
        self.coupled = coupled
        """Play held-out episodes, and continue them, with common random numbers."""
        self.env = TurnTakingEnv(mdp, max_steps=max_steps)
        seeds = np.random.SeedSequence(seed).spawn(2)
        self._action_rng = np.random.default_rng(seeds[0])
        self._env_seed = int(seeds[1].generate_state(1)[0])
        self._env_seeded = False

    def with_held_out(self, groups: int, chained: bool = True) -> SampledSampler:
        """This sampler (its environment and random streams shared) holding out ``groups`` fresh
        episodes per draw, ``chained`` or not. Pairs need bounded returns: episodic, or
        discounted without ``max_steps`` (``sim.pairing.return_estimates``)."""
        if groups < 0:
            raise ValueError(f"held-out groups must be >= 0, got {groups}")
        if groups and self.env.max_steps is not None and self.mdp.horizon is None:
            raise ValueError("pairs of a discounted MDP need episodes without max_steps")
        other = copy.copy(self)
        other.held_out = groups
        return other

    def rollout(
        self, team: TabularTeam, n_episodes: int | None = None, coupled: bool = False
    ) -> EpisodeBatch:
        """Play ``n_episodes`` (default: the sampler's) episodes of ``team``; ``coupled``: each
        from random numbers of its own seed, which its continuations read again
        (``sim.coupling``)."""
        as_fitting_team(self.mdp, team, "SampledSampler.rollout")
        count = self.n_episodes if n_episodes is None else n_episodes
        cumulative = np.cumsum(team.table, axis=1)
        steps = Steps()
        if coupled:
            seeds = self._action_rng.integers(0, 2**62, size=count)
            for e, episode_seed in enumerate(seeds.tolist()):
                numbers = StepNumbers(episode_seed)
                start = first_state(self.mdp, numbers)
                play_coupled(self.mdp, cumulative, numbers, e, start, 0, steps, self.env.max_steps)
            return steps.batch(count, seeds)
        for e in range(count):
            # Seed the environment once; later resets continue its random stream.
            seed = None if self._env_seeded else self._env_seed
            self._env_seeded = True
            state, _ = self.env.reset(seed=seed)
            self._play(cumulative, e, int(state), 0, steps)
        return steps.batch(count)

    def continued(self, batch: EpisodeBatch, team: TabularTeam, agent: int) -> EpisodeBatch:
        """``batch``'s episodes with every step from ``agent``'s first turn on played again by
        ``team`` (an episode where ``agent`` never acts is kept whole). If ``team`` differs
        from the batch's team only in ``agent``, the kept prefixes are distributed alike under
        both, so each continued episode is an exact draw of ``team`` (Lemma 3.1's setting)."""
        as_fitting_team(self.mdp, team, "SampledSampler.continued")
        first = first_turns(self.mdp, batch, agent)
        cumulative = np.cumsum(team.table, axis=1)
        steps = Steps()
        for e in range(batch.n_episodes):
            own = np.flatnonzero(batch.episode == e)
            kept = own if first[e] < 0 else own[own < first[e]]
            steps.extend(batch, kept, e)
            if first[e] < 0:
                continue
            state, t = int(batch.state[first[e]]), int(batch.time[first[e]])
            if batch.seeds is not None:  # the old episode's numbers from step t on
                numbers = StepNumbers(int(batch.seeds[e]))
                max_steps = self.env.max_steps
                play_coupled(self.mdp, cumulative, numbers, e, state, t, steps, max_steps)
            else:
                self.env.resume(state, t)
                self._play(cumulative, e, state, t, steps)
        return steps.batch(batch.n_episodes, batch.seeds)

    def paired_differences(
        self, batch: EpisodeBatch, team: TabularTeam, agent: int
    ) -> PairedDifferences:
        """``team``'s continuation of ``batch`` (``continued``) minus ``batch``, one return
        estimate per episode (``sim.pairing.return_estimates``)."""
        new = self.continued(batch, team, agent)
        differences = return_estimates(self.mdp, new) - return_estimates(self.mdp, batch)
        return PairedDifferences(differences, estimate_width(self.mdp), updated_agent=agent)

    def continue_held_out(
        self, team: Any, previous: Any, updated_agent: int
    ) -> PairedDifferences | None:
        """The pairs of ``previous``'s held-out episodes continued by ``team`` alone
        (``teamtr.protocols.PairingSampler``: a stage's last update)."""
        earlier = getattr(previous, "held_out", None)
        if earlier is None:
            return None
        tabular = as_fitting_team(self.mdp, team, "SampledSampler.continue_held_out")
        return self.paired_differences(earlier, tabular, updated_agent)

    def draw_pairs(self, old: Any, new: Any, updated_agent: int, count: int) -> PairedDifferences:
        """``count`` fresh episodes of ``old``, read by no update, each continued by ``new``
        from ``updated_agent``'s first turn (``teamtr.protocols.SequentialPairingSampler``)."""
        old_team = as_fitting_team(self.mdp, old, "SampledSampler.draw_pairs")
        new_team = as_fitting_team(self.mdp, new, "SampledSampler.draw_pairs")
        batch = self.rollout(old_team, count, self.coupled)
        return self.paired_differences(batch, new_team, updated_agent)

    def _play(self, cumulative: Array, e: int, state: int, t: int, steps: Steps) -> None:
        """Play episode ``e`` from ``state`` at step ``t`` to its end, actions drawn from the
        team whose rows' cumulative sums are ``cumulative``."""
        while True:
            row = cumulative[state]
            u = self._action_rng.random() * row[-1]
            action = min(int(np.searchsorted(row, u, side="right")), row.size - 1)
            next_state, reward, terminated, truncated, _ = self.env.step(action)
            steps.append(e, t, state, action, reward)
            t += 1
            state = int(next_state)
            if terminated or truncated:
                break

    def sample(
        self,
        team: Any,
        *,
        previous: Any | None = None,
        updated_agent: int | None = None,
    ) -> TabularRollouts:
        tabular = as_fitting_team(self.mdp, team, "SampledSampler.sample")
        batch = self.rollout(tabular)
        held_out = self.rollout(tabular, self.held_out, self.coupled) if self.held_out else None
        pairs = None
        earlier = getattr(previous, "held_out", None)
        if self.held_out and earlier is not None and updated_agent is not None:
            pairs = self.paired_differences(earlier, tabular, updated_agent)
        return TabularRollouts(
            behaviour=tabular,
            occupancy=self._occupancy(batch, np.ones(batch.state.size)),
            advantage=self._advantage(batch),
            surrogate_scale=surrogate_scale(self.mdp),
            episodes=batch,
            held_out=held_out,
            pairs=pairs,
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
