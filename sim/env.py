"""Gymnasium environments that sample from any TurnTakingMDP (the only place with a dict P).

Discounted MDPs are simulated with geometric termination: after every step the episode ends
with probability 1 - gamma. Then E[sum of undiscounted rewards] = J(pi) exactly and every step
is a draw from the (unnormalised) discounted occupancy, which is what the sampled estimators
of ``sim.rollouts`` rely on. Episodic MDPs are truncated after ``horizon`` steps.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from sim.mdp import TurnTakingMDP


class TurnTakingEnv(gymnasium.Env[np.int64, np.int64]):
    """One episode of a turn-taking MDP; ``info['agent']`` names the agent that acts next.

    Observations and actions are ``Discrete``. ``terminated`` is the geometric end of a
    discounted episode; ``truncated`` is the horizon (episodic) or ``max_steps``.

    >>> import sim
    >>> env = TurnTakingEnv(sim.coordination_game(n_agents=2, seed=0))
    >>> state, info = env.reset(seed=0)
    >>> sorted(info)
    ['agent', 't']
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        mdp: TurnTakingMDP,
        max_steps: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.mdp = mdp
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.observation_space = spaces.Discrete(mdp.n_states)
        self.action_space = spaces.Discrete(mdp.n_actions)
        self._initial_cumulative = np.cumsum(mdp.rho0)
        self._state = 0
        self._t = 0

    def _info(self) -> dict[str, Any]:
        return {"agent": int(self.mdp.agent_of_state[self._state]), "t": self._t}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.int64, dict[str, Any]]:
        super().reset(seed=seed)
        u = self.np_random.random() * self._initial_cumulative[-1]
        self._state = int(
            min(np.searchsorted(self._initial_cumulative, u, side="right"), self.mdp.n_states - 1)
        )
        self._t = 0
        return np.int64(self._state), self._info()

    def resume(self, state: int, t: int) -> tuple[np.int64, dict[str, Any]]:
        """Continue an episode from ``state`` after ``t`` steps, as if its first ``t`` steps
        had just been played (the kept prefix of a resample); the random stream goes on.
        Without a ``reset`` first, the environment seeds itself as ``reset`` would."""
        if not 0 <= state < self.mdp.n_states:
            raise ValueError(f"state must be in 0..{self.mdp.n_states - 1}, got {state!r}")
        if t < 0 or (self.mdp.horizon is not None and t >= self.mdp.horizon):
            raise ValueError(f"t must be a step before the horizon, got {t!r}")
        self._state = int(state)
        self._t = int(t)
        return np.int64(self._state), self._info()

    def _next_state(self, state: int, action: int) -> int:
        P = self.mdp.P
        row = state * self.mdp.n_actions + action
        start, end = int(P.indptr[row]), int(P.indptr[row + 1])
        # The row's own cumulative sum (not a global one) keeps full precision in huge MDPs.
        cumulative = np.cumsum(P.data[start:end])
        u = self.np_random.random() * cumulative[-1]
        position = int(np.searchsorted(cumulative, u, side="right"))
        return int(P.indices[start + min(position, end - start - 1)])

    def step(self, action: Any) -> tuple[np.int64, float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(action):
            raise ValueError(f"action must be in Discrete({self.mdp.n_actions}), got {action!r}")
        a = int(action)
        reward = float(self.mdp.R[self._state, a])
        self._state = self._next_state(self._state, a)
        self._t += 1
        terminated = False
        truncated = False
        if self.mdp.horizon is not None:
            truncated = self._t >= self.mdp.horizon
        else:
            terminated = bool(self.np_random.random() >= self.mdp.gamma)
        if self.max_steps is not None and self._t >= self.max_steps:
            truncated = True
        return np.int64(self._state), reward, terminated, truncated, self._info()

    def render(self) -> str | None:  # type: ignore[override]
        if self.render_mode == "ansi":
            info = self._info()
            return f"t={info['t']} state={self._state} agent={info['agent']}\n"
        return None

    @property
    def transition_dict(self) -> dict[int, dict[int, list[tuple[float, int, float, bool]]]]:
        """P in Gymnasium's toy-text form {s: {a: [(prob, next_state, reward, done)]}}."""
        P, A = self.mdp.P, self.mdp.n_actions
        table: dict[int, dict[int, list[tuple[float, int, float, bool]]]] = {}
        for s in range(self.mdp.n_states):
            table[s] = {}
            for a in range(A):
                row = s * A + a
                lo, hi = P.indptr[row], P.indptr[row + 1]
                reward = float(self.mdp.R[s, a])
                table[s][a] = [
                    (float(p), int(t), reward, False)
                    for p, t in zip(P.data[lo:hi], P.indices[lo:hi], strict=True)
                ]
        return table


ENV_IDS = ("teamtr/RandomTeam-v0", "teamtr/Coordination-v0", "teamtr/Dialogue-v0")


def make_random_team_env(
    n_states: int = 24,
    n_actions: int = 3,
    n_agents: int = 3,
    gamma: float = 0.9,
    seed: int = 0,
    max_steps: int | None = 500,
    render_mode: str | None = None,
) -> TurnTakingEnv:
    from sim.generators import random_mdp

    mdp = random_mdp(n_states, n_actions, n_agents, gamma=gamma, seed=seed)
    return TurnTakingEnv(mdp, max_steps=max_steps, render_mode=render_mode)


def make_coordination_env(
    n_agents: int = 3,
    n_actions: int = 3,
    gamma: float = 0.9,
    seed: int = 0,
    max_steps: int | None = 500,
    render_mode: str | None = None,
) -> TurnTakingEnv:
    from sim.generators import coordination_game

    mdp = coordination_game(n_agents, n_actions=n_actions, gamma=gamma, seed=seed)
    return TurnTakingEnv(mdp, max_steps=max_steps, render_mode=render_mode)


def make_dialogue_env(
    n_agents: int = 2,
    vocab_size: int = 3,
    message_length: int = 2,
    n_turns: int = 4,
    seed: int = 0,
    render_mode: str | None = None,
) -> TurnTakingEnv:
    from sim.dialogue import dialogue_mdp

    mdp = dialogue_mdp(n_agents, vocab_size, message_length, n_turns=n_turns, seed=seed)
    return TurnTakingEnv(mdp, render_mode=render_mode)


def register_envs() -> None:
    """Register the built-in families with Gymnasium (idempotent)."""
    # String entry points: Gymnasium imports the factory lazily, and the registry stays
    # picklable for vectorised environments.
    factories = ("make_random_team_env", "make_coordination_env", "make_dialogue_env")
    for env_id, factory in zip(ENV_IDS, factories, strict=True):
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=f"sim.env:{factory}")
