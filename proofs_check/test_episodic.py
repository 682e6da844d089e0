"""THEORY.md §2, episodic version (gamma = 1, horizon H) of Theorems 3.4 and 3.7 and the
certificate proxy with exact inputs."""

from hypothesis import given

from proofs_check.episodic import certificate_proxy_slack, episodic_per_step_slacks
from proofs_check.strategies import random_update_traces
from proofs_check.theorem_3_4 import theorem_3_4_slacks
from proofs_check.theorem_3_7 import drift_slacks


@given(random_update_traces(episodic=True))
def test_per_step_form(trace):
    """gain >= L - 2 eps sum_u (H-1-u) E_{rho_u}[TV_u]."""
    assert min(episodic_per_step_slacks(trace)) >= 0


@given(random_update_traces(episodic=True))
def test_horizon_constant_forms(trace):
    """gain >= L - 2 (H-1) H eps E_d[TV] and >= L - 2 (H-1) H eps sqrt(E_d[KL]/2)."""
    for form in ("tv", "kl_reverse", "kl_forward"):
        assert min(theorem_3_4_slacks(trace, form)) >= 0


@given(random_update_traces(episodic=True, min_agents=2))
def test_average_occupancy_drift(trace):
    assert min(drift_slacks(trace)) >= 0


@given(random_update_traces(episodic=True, direction="reverse"))
def test_certificate_proxy_with_exact_inputs_is_a_lower_bound(trace):
    assert certificate_proxy_slack(trace) >= 0
