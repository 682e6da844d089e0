"""THEORY.md §2, performance difference: J(pi') - J(pi) = 1/(1-gamma) E_{d_pi', pi'}[A_pi],
and its episodic form sum_t E_{rho_t^pi', pi'}[A_t^pi], to 1e-9 by exact evaluation."""

from hypothesis import given
from hypothesis import strategies as st

from proofs_check.performance_difference import (
    episodic_performance_difference_slack,
    performance_difference_slack,
    sim_evaluation_slack,
)
from proofs_check.strategies import policy_pairs, tabular_mdps, team_tables


@given(st.data(), tabular_mdps())
def test_performance_difference_identity(data, mdp):
    pi, pi_new = data.draw(policy_pairs(mdp))
    assert performance_difference_slack(mdp, pi, pi_new) >= 0


@given(st.data(), tabular_mdps(episodic=True))
def test_episodic_performance_difference_identity(data, mdp):
    pi, pi_new = data.draw(policy_pairs(mdp))
    assert episodic_performance_difference_slack(mdp, pi, pi_new) >= 0


@given(st.data(), tabular_mdps(episodic=None), st.booleans())
def test_sim_evaluate_matches_dense_oracle(data, mdp, sparse):
    """THEORY.md §1: sim.evaluate is exact (checked against an independent dense solve)."""
    assert sim_evaluation_slack(mdp, data.draw(team_tables(mdp)), sparse) >= 0
