"""Lemma 3.1 helpers on team tables."""

from __future__ import annotations

import numpy as np
import pytest

from teamtr.divergence import kl, tv
from teamtr.turns import (
    agent_mask,
    intermediate_tables,
    replace_agent_rows,
    team_divergence_from_agent,
)

AGENT_OF_STATE = np.array([0, 1, 2, 0, 1, 2, 0])


def _random_tables(rng: np.random.Generator, k: int) -> list[np.ndarray]:
    return [rng.dirichlet(np.ones(3), size=AGENT_OF_STATE.size) for _ in range(k)]


def test_agent_mask() -> None:
    np.testing.assert_array_equal(agent_mask(AGENT_OF_STATE, 1), AGENT_OF_STATE == 1)
    with pytest.raises(ValueError, match="integer"):
        agent_mask(np.array([0.0, 1.0]), 0)


def test_lemma_3_1_team_divergence_is_agent_divergence_where_active() -> None:
    rng = np.random.default_rng(0)
    team, agent_new = _random_tables(rng, 2)
    for k in range(3):
        new_team = replace_agent_rows(team, agent_new, AGENT_OF_STATE, k)
        # Other agents' rows are untouched, agent k's rows are the new ones.
        active = AGENT_OF_STATE == k
        np.testing.assert_array_equal(new_team[~active], team[~active])
        np.testing.assert_array_equal(new_team[active], agent_new[active])
        for div in (kl, tv):
            team_div = div(new_team, team)
            from_agent = team_divergence_from_agent(AGENT_OF_STATE, k, div(agent_new, team))
            np.testing.assert_allclose(team_div, from_agent, rtol=1e-14, atol=0)
            assert np.all(team_div[~active] == 0.0)


def test_replace_agent_rows_does_not_mutate() -> None:
    rng = np.random.default_rng(1)
    team, new = _random_tables(rng, 2)
    before = team.copy()
    replace_agent_rows(team, new, AGENT_OF_STATE, 0)
    np.testing.assert_array_equal(team, before)
    with pytest.raises(ValueError, match="one entry per state"):
        replace_agent_rows(team, new, AGENT_OF_STATE[:-1], 0)


def test_intermediate_tables() -> None:
    rng = np.random.default_rng(2)
    start, *targets = _random_tables(rng, 4)
    order = [2, 0, 1]
    tables = intermediate_tables(start, targets, order, AGENT_OF_STATE)
    assert len(tables) == 4
    np.testing.assert_array_equal(tables[0], start)
    # pi_hat^i differs from pi_hat^{i-1} only at agent order[i-1]'s states.
    for i, k in enumerate(order, start=1):
        changed = np.any(tables[i] != tables[i - 1], axis=1)
        assert np.all(AGENT_OF_STATE[changed] == k)
    # pi_bar is every agent's target on its own states, whatever the order.
    pi_bar = np.stack([targets[AGENT_OF_STATE[s]][s] for s in range(AGENT_OF_STATE.size)])
    np.testing.assert_array_equal(tables[-1], pi_bar)
    other = intermediate_tables(start, dict(enumerate(targets)), [1, 2, 0], AGENT_OF_STATE)
    np.testing.assert_array_equal(other[-1], pi_bar)
    with pytest.raises(ValueError, match="repeat"):
        intermediate_tables(start, targets, [0, 0], AGENT_OF_STATE)
    with pytest.raises(ValueError, match="agent 5"):
        intermediate_tables(start, targets, [5], AGENT_OF_STATE)
