"""THEORY.md §2, occupancy shift (E_d[TV] and sup forms), the episodic marginal shift, and
Pinsker (§1), on which the KL forms of the bounds rest.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from proofs_check import oracle
from proofs_check.instances import TabularMDP
from proofs_check.tolerances import float_allowance
from teamtr import bounds
from teamtr.divergence import expected, kl, tv

FloatArray = NDArray[np.float64]


def occupancy_shift_slack(mdp: TabularMDP, pi: FloatArray, pi_new: FloatArray) -> float:
    """THEORY §2: ||d_pi' - d_pi||_1 <= 2 gamma/(1-gamma) E_{d_pi}[TV(pi', pi)]."""
    old, new = oracle.discounted(mdp, pi), oracle.discounted(mdp, pi_new)
    shift = float(np.abs(new.d - old.d).sum())
    bound = bounds.occupancy_shift_bound(mdp.gamma, expected(tv(pi_new, pi), old.d))
    return bound - shift + float_allowance(2.0 / (1.0 - mdp.gamma))


def occupancy_shift_sup_slack(mdp: TabularMDP, pi: FloatArray, pi_new: FloatArray) -> float:
    """THEORY §2, sup form: ||d_pi' - d_pi||_1 <= 2 gamma/(1-gamma) max_s TV(pi', pi)(s)."""
    old, new = oracle.discounted(mdp, pi), oracle.discounted(mdp, pi_new)
    shift = float(np.abs(new.d - old.d).sum())
    bound = bounds.occupancy_shift_bound_sup(mdp.gamma, float(np.max(tv(pi_new, pi))))
    return bound - shift + float_allowance(2.0 / (1.0 - mdp.gamma))


def marginal_shift_slack(mdp: TabularMDP, pi: FloatArray, pi_new: FloatArray) -> float:
    """THEORY §2 episodic: ||rho_t^pi' - rho_t^pi||_1 <= 2 sum_{u<t} E_{rho_u^pi}[TV] for
    t = 1 .. H-1 (t = 0 is trivially 0 <= 0 and left out; H = 1 has nothing to check)."""
    assert mdp.horizon is not None
    if mdp.horizon < 2:
        raise ValueError("the marginal shift needs a horizon H >= 2")
    old, new = oracle.episodic(mdp, pi), oracle.episodic(mdp, pi_new)
    shifts = np.abs(new.rho - old.rho).sum(axis=1)
    limits = bounds.marginal_shift_bounds(old.rho @ tv(pi_new, pi))
    return float(np.min((limits - shifts)[1:])) + float_allowance(2.0 * mdp.horizon)


def pinsker_slack(p: FloatArray, q: FloatArray) -> float:
    """THEORY §1 Pinsker, both directions: TV(p, q) <= sqrt(KL/2) (min over rows)."""
    distance = tv(p, q)
    tightest = np.sqrt(np.minimum(kl(p, q), kl(q, p)) / 2.0)
    return float(np.min(tightest - distance)) + float_allowance()
