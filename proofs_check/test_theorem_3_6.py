"""THEORY.md §2, Theorem 3.6: for any update order sigma, J(pi_bar) - J(pi_cur) >=
sum_i [L_i - C_i sqrt(delta_i)] (the sum of the per-update certificates)."""

from hypothesis import given

from proofs_check.strategies import exact_update_traces, random_update_traces
from proofs_check.theorem_3_6 import theorem_3_6_slack


@given(random_update_traces(direction="reverse"))
def test_stage_gain_covers_certificates_random_updates_reverse(trace):
    assert theorem_3_6_slack(trace, "reverse") >= 0


@given(random_update_traces(direction="forward"))
def test_stage_gain_covers_certificates_random_updates_forward(trace):
    assert theorem_3_6_slack(trace, "forward") >= 0


@given(exact_update_traces(direction="reverse"))
def test_stage_gain_covers_certificates_exact_updates(trace):
    assert theorem_3_6_slack(trace, "reverse") >= 0
