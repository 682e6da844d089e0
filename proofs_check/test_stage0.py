"""THEORY.md §2, Stage-0 alignment: the closed form pi_pre^{1/(1+lambda)} pi_cur^{lambda/(1+lambda)}
is the minimiser of KL(pi || pi_pre) s.t. KL(pi || pi_cur) <= delta0 (against scipy.optimize on
the same instance) and lies inside the radius."""

import numpy as np
from hypothesis import example, given

from proofs_check.stage0 import stage0_feasibility_slack, stage0_optimality_slack
from proofs_check.strategies import stage0_instances

# SLSQP found no feasible point here (singular subproblem next to a near-deterministic
# pi_pre); the comparison now falls back to trust-constr.
NEAR_DETERMINISTIC_PRE = (
    np.array([[9.99998974e-01, 1.02609165e-06], [9.50621710e-01, 4.93782895e-02]]),
    np.array([[0.47040312, 0.52959688], [0.29027952, 0.70972048]]),
    0.4375587020570997,
)


@given(stage0_instances())
@example(NEAR_DETERMINISTIC_PRE)
def test_closed_form_is_no_worse_than_scipy(instance):
    assert stage0_optimality_slack(*instance) >= 0


# KL(pi_new || pi_cur) exceeded delta0 by 5e-18 (rounding): the check now has the standard
# floating-point allowance of FLOAT_SLACK * max(1, delta0).
ROUNDING_AT_THE_BOUNDARY = (
    np.array([[0.00119723, 0.99880277]]),
    np.array([[0.0188223, 0.9811777]]),
    0.013759829607432801,
)


@given(stage0_instances())
@example(ROUNDING_AT_THE_BOUNDARY)
def test_closed_form_is_inside_the_radius(instance):
    assert stage0_feasibility_slack(*instance) >= 0
