"""Tolerances of the checks and the slack conventions (no bound is ever loosened).

A slack is "bound side minus the quantity it bounds": >= 0 means the fact holds. An identity
gets ``IDENTITY_TOL`` relative to its scale; an inequality only the floating-point allowance
``FLOAT_SLACK`` relative to the magnitudes it compares.
"""

from __future__ import annotations

from proofs_check.instances import TabularMDP

FLOAT_SLACK = 1e-10
"""Floating-point allowance of an inequality, relative to the scale of its two sides."""
IDENTITY_TOL = 1e-9
"""Tolerance of an exact identity, relative to the scale of its two sides."""
UNBIASED_Z = 5.0
"""Band of the unbiasedness checks: |sample mean - exact KL| <= 5 exact standard errors. Under
the normal approximation a correct estimator leaves it with probability 5.7e-7 per instance."""
UNBIASED_DRAWS = 4000
"""Messages drawn per unbiasedness check."""
HOEFFDING_ETA = 0.1
"""eta of the finite-sample term: it must cover the error in at least 1 - eta of repetitions."""
HOEFFDING_REPETITIONS = 400
"""Seeded repetitions per instance of the Hoeffding coverage check."""
STAGE0_RTOL = 1e-12
"""Relative accuracy of the Stage-0 bisection in the comparison with scipy.optimize."""
HOEFFDING_FALSE_ALARM = 1e-6
"""The coverage check allows failures up to the (1 - 1e-6) quantile of Binomial(reps, eta)."""


def float_allowance(*magnitudes: float) -> float:
    """The floating-point allowance of an inequality: FLOAT_SLACK times its largest magnitude."""
    return FLOAT_SLACK * max([1.0, *(abs(m) for m in magnitudes)])


def identity_slack(left: float, right: float, scale: float) -> float:
    """IDENTITY_TOL times the scale, minus |left - right|: >= 0 when the identity holds."""
    return IDENTITY_TOL * max(1.0, abs(scale), abs(left), abs(right)) - abs(left - right)


def value_scale(mdp: TabularMDP) -> float:
    """Magnitude of J and of A in this MDP: R_max/(1-gamma), or R_max H when episodic."""
    if mdp.horizon is not None:
        return mdp.r_max * mdp.horizon
    return mdp.r_max / (1.0 - mdp.gamma)
