"""``teamtr gymnasium-check``: sim.from_gymnasium against Gymnasium's own step().

For FrozenLake, CliffWalking and Taxi, and for one, two and three agents taking turns, the
exact J of a team (a linear solve on the MDP that ``sim.from_gymnasium`` builds) is set beside
the mean return of seeded episodes of the registered Gymnasium environment, in which agent
``t mod n`` picks the action at step t. Discounted returns are estimated without truncation
bias by geometric termination: after every step the episode also stops with probability
1 - gamma, so E[sum of undiscounted rewards] = sum_t gamma^t E[r_t] = J. The episodic row
(gamma = 1, horizon = the registered time limit) uses Gymnasium's ``TimeLimit`` as it is.

The "ignoring terminated" column is the reading of ``env.P`` that drops the terminated flag,
which keeps charging the rewards of the states an episode has ended in.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium
import numpy as np
from numpy.typing import NDArray
from tqdm import tqdm

import sim
from studies import options

Array = NDArray[np.float64]

PROG = "teamtr gymnasium-check"
NO_TIME_LIMIT = 10**9
"""A TimeLimit no geometrically stopped episode reaches (the chance is gamma^1e9)."""


def epsilon_greedy(mdp: sim.TurnTakingMDP, epsilon: float) -> Array:
    """A good team table: greedy in the optimal Q (value iteration), mixed with uniform."""
    values = np.zeros(mdp.n_states)
    q = np.zeros((mdp.n_states, mdp.n_actions))
    for _ in range(100_000):
        q = mdp.R + mdp.gamma * (mdp.P @ values).reshape(mdp.n_states, mdp.n_actions)
        values, previous = q.max(axis=1), values
        if np.abs(values - previous).max() < 1e-10:
            break
    greedy = np.zeros_like(q)
    greedy[np.arange(mdp.n_states), q.argmax(axis=1)] = 1.0
    return (1.0 - epsilon) * greedy + epsilon / mdp.n_actions


def gymnasium_returns(
    env_id: str,
    policies: Sequence[Array],
    gamma: float,
    episodes: int,
    seed: int,
    max_episode_steps: int | None = NO_TIME_LIMIT,
    make_kwargs: Mapping[str, Any] | None = None,
) -> Array:
    """Returns of ``episodes`` seeded episodes of ``gymnasium.make(env_id)``.

    ``policies[k]`` is an S_env x A table that agent k uses at steps t with t mod n = k.
    gamma < 1: undiscounted sums up to a geometric stop (module docstring); gamma = 1: the
    plain return, with ``max_episode_steps=None`` keeping the registered time limit.
    ``make_kwargs`` go to ``gymnasium.make`` (e.g. ``{"is_rainy": True}`` for Taxi).
    """
    env = gymnasium.make(env_id, max_episode_steps=max_episode_steps, **(make_kwargs or {}))
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    cumulative = [np.cumsum(policy, axis=1) for policy in policies]
    returns = np.empty(episodes)
    for episode in range(episodes):
        state, _ = env.reset()
        total, t = 0.0, 0
        while True:
            row = cumulative[t % len(cumulative)][state]
            u = rng.random() * row[-1]
            action = min(int(np.searchsorted(row, u, side="right")), len(row) - 1)
            state, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            t += 1
            if terminated or truncated or rng.random() >= gamma:
                break
        returns[episode] = total
    return returns


def ignoring_terminated(
    env_id: str,
    gamma: float,
    horizon: int | None = None,
    make_kwargs: Mapping[str, Any] | None = None,
) -> sim.TurnTakingMDP:
    """The reading of ``env.P`` that drops the terminated flag (what from_gymnasium avoids)."""
    env: Any = gymnasium.make(
        env_id, **(make_kwargs or {})
    ).unwrapped  # a toy-text env: P, initial_state_distrib
    n_states, n_actions = env.observation_space.n, env.action_space.n
    P = np.zeros((n_states, n_actions, n_states))
    R = np.zeros((n_states, n_actions))
    for s, by_action in env.P.items():
        for a, outcomes in by_action.items():
            for probability, next_state, reward, _ in outcomes:
                P[s, a, next_state] += probability
                R[s, a] += probability * reward
    agents = np.zeros(n_states, dtype=np.int64)
    return sim.TurnTakingMDP(P, R, env.initial_state_distrib, gamma, agents, horizon)


@dataclass(frozen=True)
class Row:
    env: str
    n_agents: int
    policies: str
    gamma: float
    horizon: int | None
    exact_J: float
    ignoring_terminated_J: float | None
    """Only for one agent (the naive reading has no turns)."""
    mc_mean: float
    mc_standard_error: float
    episodes: int

    @property
    def z(self) -> float:
        """(MC mean - exact J) in standard errors (0 or inf when every return was equal)."""
        gap = self.mc_mean - self.exact_J
        if self.mc_standard_error == 0.0:
            return 0.0 if gap == 0.0 else float(np.copysign(np.inf, gap))
        return gap / self.mc_standard_error


def check(
    env_id: str,
    policy_names: Sequence[str],
    gamma: float,
    episodes: int,
    seed: int,
    horizon: int | None = None,
    make_kwargs: Mapping[str, Any] | None = None,
) -> Row:
    """One row: exact J of the alternating team against the Monte-Carlo mean."""
    env = gymnasium.make(env_id, **(make_kwargs or {}))
    # The good policy is greedy for the discounted single-agent problem (0.99 when episodic).
    single = sim.from_gymnasium(env, gamma=gamma if horizon is None else 0.99)
    n_env = single.n_states - 1
    tables = {
        "uniform": np.full((n_env, single.n_actions), 1.0 / single.n_actions),
        "greedy-0.1": epsilon_greedy(single, 0.1)[:n_env],
        "greedy-0.5": epsilon_greedy(single, 0.5)[:n_env],
    }
    policies = [tables[name] for name in policy_names]
    mdp = sim.from_gymnasium(env, gamma=gamma, n_agents=len(policies), horizon=horizon)
    exact = sim.evaluate(mdp, sim.alternating_team(mdp, policies)).J
    naive = None
    if len(policies) == 1:
        naive_mdp = ignoring_terminated(env_id, gamma, horizon, make_kwargs)
        naive = sim.evaluate(naive_mdp, policies[0]).J
    limit = None if horizon is not None else NO_TIME_LIMIT
    returns = gymnasium_returns(env_id, policies, gamma, episodes, seed, limit, make_kwargs)
    return Row(
        env=env_id + "".join(f" {key}={value}" for key, value in (make_kwargs or {}).items()),
        n_agents=len(policies),
        policies=" / ".join(policy_names),
        gamma=gamma,
        horizon=horizon,
        exact_J=exact,
        ignoring_terminated_J=naive,
        mc_mean=float(returns.mean()),
        mc_standard_error=float(returns.std(ddof=1) / np.sqrt(episodes)),
        episodes=episodes,
    )


CASES: tuple[tuple[str, dict[str, Any], tuple[str, ...], int | None], ...] = (
    ("FrozenLake-v1", {}, ("uniform",), None),
    ("FrozenLake-v1", {}, ("greedy-0.1",), None),
    ("FrozenLake-v1", {}, ("greedy-0.1",), 100),
    ("CliffWalking-v1", {}, ("uniform",), None),
    ("CliffWalking-v1", {}, ("greedy-0.1",), None),
    ("CliffWalking-v1", {}, ("greedy-0.1", "uniform"), None),
    ("CliffWalkingSlippery-v1", {}, ("greedy-0.1",), None),
    ("Taxi-v4", {}, ("uniform",), None),
    ("Taxi-v4", {}, ("greedy-0.1",), None),
    ("Taxi-v4", {}, ("greedy-0.1", "uniform", "greedy-0.5"), None),
    ("Taxi-v4", {"is_rainy": True}, ("greedy-0.1",), None),
)
"""(environment, gymnasium.make arguments, one policy per agent, horizon): horizon 100 is
FrozenLake-v1's time limit."""


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Exact J of sim.from_gymnasium MDPs against Gymnasium's own rollouts.",
    )
    options.add_json(parser, "write the rows here")
    parser.add_argument("--episodes", type=int, default=20_000, help="episodes per row")
    parser.add_argument("--gamma", type=float, default=0.95, help="discount of the rows")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first row")
    return parser


def run(args: argparse.Namespace) -> int:
    problem = options.first_problem(
        None if args.episodes >= 2 else f"--episodes must be >= 2, got {args.episodes}",
        None if 0.0 <= args.gamma < 1.0 else f"--gamma must lie in [0, 1), got {args.gamma}",
        options.seed_list_problem(range(args.seed, args.seed + len(CASES)), "--seed"),
        options.output_problem(args.json, "--json"),
    )
    if problem is not None:
        return options.refuse(PROG, problem)
    began = time.perf_counter()
    rows = []
    for index, case in enumerate(
        tqdm(CASES, unit="row", file=sys.stderr, disable=not sys.stderr.isatty())
    ):
        env_id, make_kwargs, policies, horizon = case
        gamma = args.gamma if horizon is None else 1.0
        seed = args.seed + index
        rows.append(check(env_id, policies, gamma, args.episodes, seed, horizon, make_kwargs))
    print(
        "| environment | agents' policies | gamma, H | exact J | MC mean ± SE | z | "
        "ignoring terminated |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        naive = "" if row.ignoring_terminated_J is None else f"{row.ignoring_terminated_J:.4f}"
        setting = f"{row.gamma:g}" + ("" if row.horizon is None else f", H={row.horizon}")
        print(
            f"| {row.env} | {row.policies} | {setting} | {row.exact_J:.4f} | "
            f"{row.mc_mean:.4f} ± {row.mc_standard_error:.4f} | {row.z:+.2f} | {naive} |"
        )
    if args.json is not None:
        result = {
            "rows": [asdict(row) | {"z": row.z} for row in rows],
            "seconds": round(time.perf_counter() - began, 2),
        }
        options.prepared(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m studies.tabular.gymnasium_check``: the same as ``teamtr gymnasium-check``."""
    return run(build_parser("python -m studies.tabular.gymnasium_check").parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
