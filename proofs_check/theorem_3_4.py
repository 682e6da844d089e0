"""THEORY.md §2, Theorem 3.4: one update gains at least L_i minus its penalty (TV form, and the
KL form in either direction).
"""

from __future__ import annotations

from proofs_check.tolerances import float_allowance, value_scale
from proofs_check.traces import Trace, all_update_terms, mdp_penalty
from teamtr import bounds


def theorem_3_4_slacks(trace: Trace, form: str) -> list[float]:
    """Thm 3.4 for every update of the trace: gain_i - bound_i.

    ``form`` = "tv" (L_i - 2 gamma eps_i/(1-gamma)^2 E_d[TV_i]), "kl_reverse" or "kl_forward"
    (L_i - sqrt(2) gamma eps_i/(1-gamma)^2 sqrt(delta_i) with delta_i = E_d[KL_i] in that
    direction). Episodic traces use the horizon constants of ``EpisodicPenalty``.
    """
    mdp = trace.mdp
    penalty = mdp_penalty(mdp)
    slacks = []
    for terms in all_update_terms(trace):
        if form == "tv":
            bound = bounds.theorem_3_4_lower_bound(
                terms.surrogate, terms.advantage_bound, penalty, mean_tv=terms.mean_tv
            )
        elif form in ("kl_reverse", "kl_forward"):
            delta = terms.mean_kl_reverse if form == "kl_reverse" else terms.mean_kl_forward
            bound = bounds.theorem_3_4_lower_bound(
                terms.surrogate, terms.advantage_bound, penalty, mean_kl=delta
            )
        else:
            raise ValueError(f"form must be 'tv', 'kl_reverse' or 'kl_forward', got {form!r}")
        slacks.append(terms.gain - bound + float_allowance(value_scale(mdp)))
    return slacks
