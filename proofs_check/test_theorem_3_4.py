"""THEORY.md §2, Theorem 3.4: one update from the intermediate team pi_hat^{i-1} gains at
least L_i - 2 gamma eps_i/(1-gamma)^2 E_d[TV_i] (TV form) and at least
L_i - sqrt(2) gamma eps_i/(1-gamma)^2 sqrt(delta_i) with delta_i = E_d[KL_i] (KL form), for
both KL directions; checked on every update of a stage by exact evaluation."""

from hypothesis import given

from proofs_check.checks import theorem_3_4_slacks
from proofs_check.strategies import exact_update_traces, random_update_traces


@given(random_update_traces())
def test_tv_form_random_updates(trace):
    assert min(theorem_3_4_slacks(trace, "tv")) >= 0


@given(random_update_traces(direction="reverse"))
def test_kl_form_reverse_random_updates(trace):
    assert min(theorem_3_4_slacks(trace, "kl_reverse")) >= 0


@given(random_update_traces(direction="forward"))
def test_kl_form_forward_random_updates(trace):
    assert min(theorem_3_4_slacks(trace, "kl_forward")) >= 0


@given(random_update_traces(near_deterministic=True))
def test_tv_and_kl_forms_near_deterministic_teams(trace):
    for form in ("tv", "kl_reverse", "kl_forward"):
        assert min(theorem_3_4_slacks(trace, form)) >= 0


@given(exact_update_traces(direction="reverse"))
def test_exact_optimal_reverse_kl_updates(trace):
    for form in ("tv", "kl_reverse"):
        assert min(theorem_3_4_slacks(trace, form)) >= 0


@given(exact_update_traces(direction="forward"))
def test_exact_optimal_forward_kl_updates(trace):
    for form in ("tv", "kl_forward"):
        assert min(theorem_3_4_slacks(trace, form)) >= 0
