"""THEORY.md §2, episodic version (gamma = 1, horizon H): the per-step form of Thm 3.4 and the
certificate proxy with exact inputs.
"""

from __future__ import annotations

from proofs_check.tolerances import float_allowance, value_scale
from proofs_check.traces import Trace, all_update_terms
from teamtr import bounds


def episodic_per_step_slacks(trace: Trace) -> list[float]:
    """Thm 3.4 episodic per-step form: gain >= L - 2 eps sum_u (H-1-u) E_{rho_u}[TV_u]."""
    slacks = []
    for terms in all_update_terms(trace):
        assert terms.tv_per_step is not None
        bound = bounds.episodic_update_lower_bound(
            terms.surrogate, terms.advantage_bound, terms.tv_per_step
        )
        slacks.append(terms.gain - bound + float_allowance(value_scale(trace.mdp)))
    return slacks


def certificate_proxy_slack(trace: Trace) -> float:
    """THEORY §2 certificate proxy, episodic, exact inputs: J(pi_bar) - J(pi_cur) >=
    sum_i [L_i - c_i sqrt(KL_i/2)] with c_i = horizon_constant(eps_i, H) and KL_i the reverse
    KL averaged over the H decision points (the average occupancy of pi_hat^{i-1})."""
    mdp = trace.mdp
    assert mdp.horizon is not None
    terms = all_update_terms(trace)
    c = [bounds.horizon_constant(t.advantage_bound, mdp.horizon) for t in terms]
    certificate = bounds.certificate_proxy(
        [t.surrogate for t in terms], [t.mean_kl_reverse for t in terms], c
    )
    gain = trace.evaluations[-1].J - trace.evaluations[0].J
    return gain - certificate + float_allowance(value_scale(mdp))
