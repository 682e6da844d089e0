"""THEORY.md §2, Theorem 3.4: one update from the intermediate team pi_hat^{i-1} gains at
least L_i - 2 gamma eps_i/(1-gamma)^2 E_d[TV_i] (TV form) and at least
L_i - sqrt(2) gamma eps_i/(1-gamma)^2 sqrt(delta_i) with delta_i = E_d[KL_i] (KL form), for
both KL directions; checked on every update of a stage by exact evaluation."""

import numpy as np
from hypothesis import given

from proofs_check.instances import TabularMDP
from proofs_check.strategies import exact_update_traces, random_update_traces
from proofs_check.theorem_3_4 import theorem_3_4_slacks
from proofs_check.traces import exact_proposal, stage_trace


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


def test_exact_forward_update_when_the_radius_exceeds_every_attainable_kl():
    """Minimal instance found by the thorough profile: one state, gamma = 0, the only action
    with a different advantage has probability 1e-8, so the forward KL of the KL-constrained
    maximiser stays far below delta = 0.5; the update must still return (it is the
    unconstrained limit), and Thm 3.4 must hold for it."""
    pi = np.array([[9.9999e-01, 5.6048e-06, 7.9354e-14, 9.6723e-09]])
    pi /= pi.sum()
    mdp = TabularMDP(
        P=np.ones((1, 4, 1)),
        R=np.array([[0.0, 0.0, 0.0, -0.0117]]),
        rho0=np.array([1.0]),
        gamma=0.0,
        agent_of_state=np.array([0]),
    )
    trace = stage_trace(mdp, pi, (0,), exact_proposal(mdp, "forward", [0.5]))
    assert min(theorem_3_4_slacks(trace, "kl_forward")) >= 0
