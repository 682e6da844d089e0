"""sim.from_gymnasium against Monte-Carlo returns of Gymnasium's own step().

Every comparison is exact J (a linear solve on the converted MDP) against the mean return of
seeded Gymnasium episodes, with a tolerance of 4 standard errors of that mean. Discounted
returns are estimated without truncation bias by geometric termination: after every step the
episode also stops with probability 1 - gamma, so E[sum of undiscounted rewards] =
sum_t gamma^t E[r_t] = J (the convention of ``sim.env``). Each test also checks that it
could fail: the reading of ``env.P`` that ignores the terminated flag lies many standard
errors away on CliffWalking and Taxi.
"""

from __future__ import annotations

import doctest
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from numpy.typing import NDArray

import sim
import sim.toy_text
from studies.tabular.gymnasium_check import (
    epsilon_greedy,
    gymnasium_returns,
    ignoring_terminated,
    main,
)

Array = NDArray[np.float64]
TOLERANCE_SE = 4.0
"""|MC mean - J| <= 4 standard errors: a false alarm has probability ~6e-5 per comparison.
A wrong value must lie more than twice that away, so that the comparison would catch it."""
GAMMA = 0.95
EPISODES = 4000


def monte_carlo(
    env_id: str,
    policies: Sequence[Array],
    gamma: float,
    seed: int,
    episodes: int = EPISODES,
    max_episode_steps: int | None = 10**9,
    make_kwargs: dict[str, Any] | None = None,
) -> tuple[float, float]:
    """Mean return of seeded Gymnasium episodes and its standard error."""
    returns = gymnasium_returns(
        env_id, policies, gamma, episodes, seed, max_episode_steps, make_kwargs
    )
    return float(returns.mean()), float(returns.std(ddof=1) / np.sqrt(episodes))


ENVIRONMENTS: dict[str, tuple[str, dict[str, Any], str]] = {
    # FrozenLake's terminal tiles loop with reward 0: there the flag happens not to matter.
    "FrozenLake": ("FrozenLake-v1", {}, "equal"),
    "CliffWalking": ("CliffWalking-v1", {}, "far"),
    # Slippery, the goal is rarely reached within the discount's horizon: the flag moves J by
    # about 2 standard errors only, so that comparison is not asserted.
    "CliffWalking slippery": ("CliffWalkingSlippery-v1", {}, "near"),
    "Taxi": ("Taxi-v4", {}, "far"),
    "Taxi rainy": ("Taxi-v4", {"is_rainy": True}, "far"),
}
"""name: (environment id, gymnasium.make arguments, how far ignoring ``terminated`` moves J)."""


@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_value_matches_gymnasium_rollouts(name: str) -> None:
    env_id, make_kwargs, ignoring_terminated_is = ENVIRONMENTS[name]
    mdp = sim.from_gymnasium(gymnasium.make(env_id, **make_kwargs), gamma=GAMMA)
    n_env = mdp.n_states - 1
    policy = epsilon_greedy(mdp, 0.1)
    exact = sim.evaluate(mdp, policy).J
    mean, standard_error = monte_carlo(
        env_id, [policy[:n_env]], GAMMA, seed=0, make_kwargs=make_kwargs
    )
    assert abs(mean - exact) <= TOLERANCE_SE * standard_error
    naive = sim.evaluate(ignoring_terminated(env_id, GAMMA, None, make_kwargs), policy[:n_env]).J
    if ignoring_terminated_is == "equal":
        np.testing.assert_allclose(naive, exact, rtol=1e-9)
    elif ignoring_terminated_is == "far":
        assert abs(mean - naive) > 2 * TOLERANCE_SE * standard_error


@pytest.mark.parametrize(("env_id", "n_agents"), [("CliffWalking-v1", 2), ("Taxi-v4", 3)])
def test_alternating_agents_match_gymnasium_rollouts(env_id: str, n_agents: int) -> None:
    single = sim.from_gymnasium(gymnasium.make(env_id), gamma=GAMMA)
    n_env = single.n_states - 1
    good = epsilon_greedy(single, 0.1)[:n_env]
    policies = [
        good,
        np.full_like(good, 1.0 / single.n_actions),
        epsilon_greedy(single, 0.5)[:n_env],
    ]
    policies = policies[:n_agents]
    mdp = sim.from_gymnasium(gymnasium.make(env_id), gamma=GAMMA, n_agents=n_agents)
    exact = sim.evaluate(mdp, sim.alternating_team(mdp, policies)).J
    mean, standard_error = monte_carlo(env_id, policies, GAMMA, seed=1)
    assert abs(mean - exact) <= TOLERANCE_SE * standard_error
    # The alternation matters: agent 0's policy alone would be far off.
    alone = sim.evaluate(single, epsilon_greedy(single, 0.1)).J
    assert abs(mean - alone) > 2 * TOLERANCE_SE * standard_error


def test_episodic_frozen_lake_matches_the_registered_time_limit() -> None:
    """gamma = 1, horizon = 100: Gymnasium's own FrozenLake-v1, TimeLimit(100) included."""
    env = gymnasium.make("FrozenLake-v1")
    assert env.spec is not None and env.spec.max_episode_steps == 100
    policy = epsilon_greedy(sim.from_gymnasium(env, gamma=0.99), 0.1)
    mdp = sim.from_gymnasium(env, gamma=1.0, horizon=100)
    exact = sim.evaluate(mdp, policy).J
    mean, standard_error = monte_carlo(
        "FrozenLake-v1", [policy[:16]], 1.0, seed=2, episodes=2000, max_episode_steps=None
    )
    assert abs(mean - exact) <= TOLERANCE_SE * standard_error
    # The horizon matters at this precision: a shorter one would be far off.
    shorter = sim.evaluate(sim.from_gymnasium(env, gamma=1.0, horizon=30), policy).J
    assert mean - shorter > 2 * TOLERANCE_SE * standard_error


@pytest.mark.parametrize("n_agents", [1, 2, 3])
def test_layout_absorbing_state_and_start(n_agents: int) -> None:
    env = gymnasium.make("FrozenLake8x8-v1")
    table, start = env.unwrapped.P, env.unwrapped.initial_state_distrib
    mdp = sim.from_gymnasium(env, gamma=0.9, n_agents=n_agents)
    n_env, n_actions = 64, 4
    absorbing = n_agents * n_env
    assert (mdp.n_states, mdp.n_actions, mdp.n_agents) == (absorbing + 1, n_actions, n_agents)
    np.testing.assert_array_equal(
        mdp.agent_of_state[:absorbing], np.repeat(np.arange(n_agents), n_env)
    )
    np.testing.assert_array_equal(mdp.rho0[:n_env], start)
    assert mdp.rho0[n_env:].sum() == 0.0
    expected_P = np.zeros((mdp.n_states, n_actions, mdp.n_states))
    expected_P[absorbing, :, absorbing] = 1.0
    expected_R = np.zeros((mdp.n_states, n_actions))
    for s, by_action in table.items():
        for a, outcomes in by_action.items():
            for turn in range(n_agents):
                row = turn * n_env + s
                for probability, next_state, reward, terminated in outcomes:
                    target = absorbing if terminated else (turn + 1) % n_agents * n_env + next_state
                    expected_P[row, a, target] += probability
                    expected_R[row, a] += probability * reward
    np.testing.assert_allclose(mdp.transitions_dense(), expected_P, rtol=0, atol=1e-15)
    np.testing.assert_allclose(mdp.R, expected_R, rtol=0, atol=1e-12)


def test_agents_playing_one_policy_are_the_single_agent_environment() -> None:
    """Alternation is invisible when every agent plays the same table: V(turn, s) = V(s)."""
    env = gymnasium.make("CliffWalking-v1", is_slippery=True)
    single = sim.from_gymnasium(env, gamma=0.97)
    policy = epsilon_greedy(single, 0.3)
    reference = sim.evaluate(single, policy)
    pair = sim.from_gymnasium(env, gamma=0.97, n_agents=2)
    both = sim.evaluate(pair, sim.alternating_team(pair, [policy[:48], policy[:48]]))
    np.testing.assert_allclose(both.J, reference.J, rtol=1e-9)
    np.testing.assert_allclose(both.V[:48], reference.V[:48], rtol=1e-9)
    np.testing.assert_allclose(both.V[48:96], reference.V[:48], rtol=1e-9)


def test_initial_distribution_can_be_given() -> None:
    env = gymnasium.make("FrozenLake-v1")
    start = np.zeros(16)
    start[14] = 1.0  # next to the goal
    mdp = sim.from_gymnasium(env, gamma=0.9, initial_distribution=start)
    default = sim.from_gymnasium(env, gamma=0.9)
    policy = epsilon_greedy(default, 0.1)
    assert sim.evaluate(mdp, policy).J == pytest.approx(
        sim.evaluate(default, policy).V[14], rel=1e-12
    )
    with pytest.raises(
        sim.GymnasiumConversionError, match=r"initial_distribution must have shape \(16,\)"
    ):
        sim.from_gymnasium(env, gamma=0.9, initial_distribution=np.ones(3) / 3)


def test_what_cannot_be_converted_is_refused() -> None:
    with pytest.raises(sim.GymnasiumConversionError, match="no toy-text transition table"):
        sim.from_gymnasium(gymnasium.make("CartPole-v1"), gamma=0.9)
    with pytest.raises(sim.GymnasiumConversionError, match="fickle_passenger"):
        sim.from_gymnasium(gymnasium.make("Taxi-v4", fickle_passenger=True), gamma=0.9)
    with pytest.raises(sim.GymnasiumConversionError, match="n_agents must be an int >= 1"):
        sim.from_gymnasium(gymnasium.make("Taxi-v4"), gamma=0.9, n_agents=0)
    with pytest.raises(sim.MDPValidationError, match=r"gamma must lie in \[0, 1\)"):
        sim.from_gymnasium(gymnasium.make("Taxi-v4"), gamma=1.0)
    env = gymnasium.make("FrozenLake-v1")
    env.unwrapped.P[3][2] = [(0.5, 2, 0.0, False)]
    with pytest.raises(
        sim.GymnasiumConversionError, match=r"P\[3\]\[2\]: probabilities must sum to 1"
    ):
        sim.from_gymnasium(env, gamma=0.9)
    env.unwrapped.P[3][2] = [(1.0, 99, 0.0, False)]
    with pytest.raises(
        sim.GymnasiumConversionError, match=r"leads to state 99, outside Discrete\(16\)"
    ):
        sim.from_gymnasium(env, gamma=0.9)


def test_alternating_team_checks_its_policies() -> None:
    mdp = sim.from_gymnasium(gymnasium.make("FrozenLake-v1"), gamma=0.9, n_agents=2)
    with pytest.raises(sim.PolicyValidationError, match="one policy per agent"):
        sim.alternating_team(mdp, [np.full((16, 4), 0.25)])
    with pytest.raises(sim.PolicyValidationError, match="shape"):
        sim.alternating_team(mdp, [np.full((17, 4), 0.25)] * 2)


def test_report_script_writes_its_rows(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    assert main(["--episodes", "50", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [row["n_agents"] for row in rows] == [1, 1, 1, 1, 1, 2, 1, 1, 1, 3, 1]
    assert all(np.isfinite(row["exact_J"]) and row["mc_standard_error"] >= 0 for row in rows)
    assert main(["--episodes", "1"]) == 2


def test_module_examples_run() -> None:
    assert doctest.testmod(sim.toy_text, raise_on_error=True).attempted > 0
