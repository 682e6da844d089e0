"""Gymnasium environments: the checker, seeding, turn information, Monte-Carlo against exact J."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import sim


@pytest.mark.parametrize("env_id", sim.ENV_IDS)
def test_registered_env_passes_the_checker(env_id: str) -> None:
    env = gymnasium.make(env_id)
    check_env(env.unwrapped, skip_render_check=False)
    env.close()


def test_episodic_env_passes_the_checker() -> None:
    check_env(sim.TurnTakingEnv(sim.random_mdp(6, 2, 2, seed=0, horizon=3)), skip_render_check=True)


def test_registration_is_idempotent() -> None:
    before = {env_id: gymnasium.registry[env_id] for env_id in sim.ENV_IDS}
    sim.register_envs()
    assert all(gymnasium.registry[env_id] is before[env_id] for env_id in sim.ENV_IDS)


def play(env: gymnasium.Env, seed: int, steps: int) -> list[tuple[int, float, bool, int]]:
    state, info = env.reset(seed=seed)
    trace = [(int(state), 0.0, False, info["agent"])]
    for t in range(steps):
        state, reward, terminated, truncated, info = env.step(t % env.action_space.n)
        trace.append((int(state), float(reward), terminated or truncated, info["agent"]))
        if terminated or truncated:
            state, info = env.reset()
    return trace


@pytest.mark.parametrize("env_id", sim.ENV_IDS)
def test_seeded_rollouts_are_deterministic(env_id: str) -> None:
    first = play(gymnasium.make(env_id), seed=3, steps=60)
    second = play(gymnasium.make(env_id), seed=3, steps=60)
    other = play(gymnasium.make(env_id), seed=4, steps=60)
    assert first == second
    env = gymnasium.make(env_id).unwrapped
    stochastic = bool(np.any(env.mdp.P.data < 1.0)) or np.count_nonzero(env.mdp.rho0) > 1
    # The dialogue is deterministic given the actions: the seed cannot change its trace.
    assert (first != other) == stochastic


def test_info_names_the_agent_of_the_state() -> None:
    mdp = sim.random_mdp(15, 3, 3, seed=2)
    env = sim.TurnTakingEnv(mdp, max_steps=40)
    state, info = env.reset(seed=0)
    while True:
        assert info["agent"] == mdp.agent_of_state[state]
        state, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            break


def test_episodic_env_truncates_at_the_horizon() -> None:
    env = sim.TurnTakingEnv(sim.random_mdp(6, 2, 2, seed=0, horizon=5))
    env.reset(seed=0)
    flags = [env.step(0)[2:4] for _ in range(5)]
    assert flags[:-1] == [(False, False)] * 4 and flags[-1] == (False, True)


def test_episodic_monte_carlo_matches_exact_J() -> None:
    mdp = sim.dialogue_mdp(2, 2, 2, n_turns=3, seed=0)
    team = sim.random_team(mdp, 0)
    batch = sim.SampledSampler(mdp, n_episodes=3000, seed=0).rollout(team)
    returns = np.bincount(batch.episode, weights=batch.reward)
    standard_error = returns.std(ddof=1) / np.sqrt(returns.size)
    assert abs(returns.mean() - sim.evaluate(mdp, team).J) <= 5 * standard_error


def test_transition_dict_round_trips() -> None:
    mdp = sim.coordination_game(2, seed=0)
    table = sim.TurnTakingEnv(mdp).transition_dict
    P = np.zeros((mdp.n_states, mdp.n_actions, mdp.n_states))
    for s, by_action in table.items():
        for a, outcomes in by_action.items():
            for probability, next_state, reward, _ in outcomes:
                P[s, a, next_state] += probability
                assert reward == mdp.R[s, a]
    np.testing.assert_allclose(P, mdp.transitions_dense(), atol=1e-15)


def test_invalid_action_is_rejected() -> None:
    env = sim.TurnTakingEnv(sim.random_mdp(6, 2, 2, seed=0))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="Discrete"):
        env.step(5)
