"""THEORY.md §2, Theorem 3.7: the occupancy drift before update i,
||d_{pi_hat^{i-1}} - d_{pi_cur}||_1 <= sum_{k<i} 2 gamma/(1-gamma) sqrt(delta_k/2), and the
stale penalty sum: an update certified with the stage-start occupancy needs the penalty
C_i sum_{k<=i} sqrt(delta_k) (per update and summed over the stage)."""

from hypothesis import given

from proofs_check.strategies import exact_update_traces, random_update_traces
from proofs_check.theorem_3_7 import drift_slacks, stale_penalty_slacks


@given(random_update_traces(min_agents=2))
def test_drift_bound_random_updates(trace):
    assert min(drift_slacks(trace)) >= 0


@given(exact_update_traces(min_agents=2))
def test_drift_bound_exact_updates(trace):
    assert min(drift_slacks(trace)) >= 0


@given(random_update_traces(min_agents=2))
def test_stale_penalty_covers_occupancy_drift(trace):
    assert min(stale_penalty_slacks(trace)) >= 0
