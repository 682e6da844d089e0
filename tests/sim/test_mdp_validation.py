"""Every malformed MDP raises MDPValidationError with a message that says what and where."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

import sim
from teamtr.penalty import DiscountedPenalty, EpisodicPenalty


def valid_parts() -> dict[str, Any]:
    P = np.zeros((3, 2, 3))
    P[:, 0, 0] = 1.0
    P[:, 1, :] = [0.2, 0.3, 0.5]
    return {
        "P": P,
        "R": np.arange(6.0).reshape(3, 2),
        "rho0": np.array([0.5, 0.5, 0.0]),
        "gamma": 0.9,
        "agent_of_state": np.array([0, 1, 0]),
    }


def with_change(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    parts = valid_parts()
    change(parts)
    return parts


def set_item(key: str, index: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(parts: dict[str, Any]) -> None:
        array = np.array(parts[key], dtype=float)
        array[index] = value
        parts[key] = array

    return change


def replace(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(parts: dict[str, Any]) -> None:
        parts[key] = value

    return change


def unnormalise_row(parts: dict[str, Any]) -> None:
    parts["P"][2, 1, 2] = 0.6


def sparse_wrong_shape(parts: dict[str, Any]) -> None:
    parts["P"] = sp.csr_matrix(np.ones((5, 3)) / 3)


MALFORMED = {
    "P dense shape": (replace("P", np.ones((3, 3)) / 3), "dense P must have shape"),
    "P sparse shape": (sparse_wrong_shape, "sparse P must have shape (S*A, S)"),
    "P NaN": (set_item("P", (1, 0, 2), np.nan), "non-finite probability nan at state 1, action 0"),
    "P inf": (set_item("P", (2, 1, 1), np.inf), "non-finite probability inf at state 2, action 1"),
    "P negative": (
        set_item("P", (1, 1, 0), -0.2),
        "negative probability -0.2 at state 1, action 1",
    ),
    "P row sum": (unnormalise_row, "worst at state 2, action 1"),
    "P text": (replace("P", np.full((3, 2, 3), "x")), "P must hold real numbers"),
    "R NaN": (set_item("R", (2, 1), np.nan), "R is not finite at state 2, action 1"),
    "R one-dimensional": (replace("R", np.zeros(6)), "R must be an S x A array"),
    "rho0 shape": (replace("rho0", np.ones(4) / 4), "rho0 must have shape (S,)"),
    "rho0 negative": (replace("rho0", np.array([1.5, -0.5, 0.0])), "rho0 is negative at state 1"),
    "rho0 sum": (replace("rho0", np.array([0.5, 0.6, 0.0])), "rho0 must sum to 1"),
    "rho0 NaN": (replace("rho0", np.array([np.nan, 0.5, 0.5])), "rho0 is not finite at state 0"),
    "agent negative": (replace("agent_of_state", np.array([0, -1, 0])), "state 1 has agent -1"),
    "agent fraction": (replace("agent_of_state", np.array([0, 0.5, 1])), "state 1 has 0.5"),
    "agent shape": (replace("agent_of_state", np.array([0, 1])), "agent_of_state must have shape"),
    "agent bool": (replace("agent_of_state", np.array([True, False, True])), "must hold integers"),
    "gamma one": (replace("gamma", 1.0), "gamma must lie in [0, 1)"),
    "gamma negative": (replace("gamma", -0.1), "gamma must lie in [0, 1)"),
    "gamma text": (replace("gamma", "0.9"), "gamma must be a real number"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_mdp_raises_with_location(case: str) -> None:
    change, message = MALFORMED[case]
    with pytest.raises(sim.MDPValidationError) as caught:
        sim.TurnTakingMDP(**with_change(change))
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("gamma", "horizon", "message"),
    [
        (0.9, 3, "gamma must be 1"),
        (1.0, 0, "horizon must be an int >= 1"),
        (1.0, 2.5, "horizon must be an int >= 1"),
        (1.0, True, "horizon must be an int >= 1"),
    ],
)
def test_episodic_discounting_is_validated(gamma: float, horizon: Any, message: str) -> None:
    parts = valid_parts() | {"gamma": gamma}
    with pytest.raises(sim.MDPValidationError, match=message):
        sim.TurnTakingMDP(**parts, horizon=horizon)


def test_agent_id_beyond_declared_team_size() -> None:
    with pytest.raises(sim.MDPValidationError, match="state 1 has agent 1"):
        sim.TurnTakingMDP(**valid_parts(), n_agents=1)


def test_valid_mdp_is_stored_as_csr_and_read_only() -> None:
    mdp = sim.TurnTakingMDP(**valid_parts())
    assert sp.isspmatrix_csr(mdp.P) and mdp.P.shape == (6, 3)
    np.testing.assert_array_equal(mdp.transitions_dense(), valid_parts()["P"])
    assert (mdp.n_states, mdp.n_actions, mdp.n_agents) == (3, 2, 2)
    assert mdp.r_max == 5.0
    with pytest.raises(ValueError):
        mdp.R[0, 0] = 1.0
    with pytest.raises(ValueError):
        mdp.P.data[0] = 0.5


def test_sparse_and_dense_inputs_agree() -> None:
    parts = valid_parts()
    dense = sim.TurnTakingMDP(**parts)
    parts["P"] = sp.coo_matrix(parts["P"].reshape(6, 3))
    sparse = sim.TurnTakingMDP(**parts)
    assert (dense.P != sparse.P).nnz == 0


def test_near_stochastic_rows_are_renormalised() -> None:
    parts = valid_parts()
    parts["P"][0, 1] *= 1 + 5e-10
    mdp = sim.TurnTakingMDP(**parts)
    row_sums = np.asarray(mdp.P.sum(axis=1)).ravel()
    np.testing.assert_allclose(row_sums, 1.0, rtol=0, atol=1e-15)


def test_penalty_model_matches_setting() -> None:
    assert sim.TurnTakingMDP(**valid_parts()).penalty_model() == DiscountedPenalty(0.9)
    episodic = sim.TurnTakingMDP(**(valid_parts() | {"gamma": 1.0}), horizon=4)
    assert episodic.penalty_model() == EpisodicPenalty(4)
    assert episodic.is_episodic and episodic.horizon == 4
