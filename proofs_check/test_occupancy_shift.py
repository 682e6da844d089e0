"""THEORY.md §2, occupancy shift: ||d_pi' - d_pi||_1 <= 2 gamma/(1-gamma) E_{d_pi}[TV(pi', pi)]
(and the sup form), the episodic per-step marginal shift, and Pinsker (§1) that the KL forms
of the bounds rest on."""

from hypothesis import given
from hypothesis import strategies as st

from proofs_check.occupancy_shift import (
    marginal_shift_slack,
    occupancy_shift_slack,
    occupancy_shift_sup_slack,
    pinsker_slack,
)
from proofs_check.strategies import policy_pairs, tabular_mdps, team_tables


@given(st.data(), tabular_mdps())
def test_occupancy_shift_expectation_form(data, mdp):
    pi, pi_new = data.draw(policy_pairs(mdp))
    assert occupancy_shift_slack(mdp, pi, pi_new) >= 0


@given(st.data(), tabular_mdps())
def test_occupancy_shift_sup_form(data, mdp):
    pi, pi_new = data.draw(policy_pairs(mdp))
    assert occupancy_shift_sup_slack(mdp, pi, pi_new) >= 0


@given(st.data(), tabular_mdps(episodic=True, min_horizon=2))
def test_episodic_marginal_shift(data, mdp):
    """||rho_t^pi' - rho_t^pi||_1 <= 2 sum_{u<t} E_{rho_u^pi}[TV_u] for every t < H."""
    pi, pi_new = data.draw(policy_pairs(mdp))
    assert marginal_shift_slack(mdp, pi, pi_new) >= 0


@given(st.data(), tabular_mdps(max_states=8))
def test_pinsker_both_directions(data, mdp):
    p, q = data.draw(team_tables(mdp)), data.draw(team_tables(mdp))
    assert pinsker_slack(p, q) >= 0
