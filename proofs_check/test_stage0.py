"""THEORY.md §2, Stage-0 alignment: the closed form pi_pre^{1/(1+lambda)} pi_cur^{lambda/(1+lambda)}
is the minimiser of KL(pi || pi_pre) s.t. KL(pi || pi_cur) <= delta0 (against scipy.optimize on
the same instance) and lies inside the radius."""

from hypothesis import given

from proofs_check.checks import stage0_feasibility_slack, stage0_optimality_slack
from proofs_check.strategies import stage0_instances


@given(stage0_instances())
def test_closed_form_is_no_worse_than_scipy(instance):
    assert stage0_optimality_slack(*instance) >= 0


@given(stage0_instances())
def test_closed_form_is_inside_the_radius(instance):
    assert stage0_feasibility_slack(*instance) >= 0
