"""THEORY.md §2, Theorem 3.6: a stage gains at least the sum of its updates' certificates, for
any order.
"""

from __future__ import annotations

from proofs_check.instances import Direction
from proofs_check.tolerances import float_allowance, value_scale
from proofs_check.traces import Trace, all_update_terms, mdp_penalty
from teamtr import bounds


def theorem_3_6_slack(trace: Trace, direction: Direction = "reverse") -> float:
    """Thm 3.6: J(pi_bar) - J(pi_cur) >= sum_i [L_i - C_i sqrt(delta_i)] (any order sigma)."""
    terms = all_update_terms(trace)
    kls = [t.mean_kl_reverse if direction == "reverse" else t.mean_kl_forward for t in terms]
    bound = bounds.theorem_3_6_stage_bound(
        [t.surrogate for t in terms],
        [t.advantage_bound for t in terms],
        kls,
        mdp_penalty(trace.mdp),
    )
    gain = trace.evaluations[-1].J - trace.evaluations[0].J
    return gain - bound + float_allowance(value_scale(trace.mdp))
