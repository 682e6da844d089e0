"""THEORY.md §2, Lemma 3.1: the team divergence is the active agent's (state level), and the
message KL is the expected sum of per-token KLs (token level, also on ``sim.dialogue_mdp``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from proofs_check.instances import (
    MessagePair,
    TabularMDP,
    all_messages,
    token_log_probs,
    token_logits_along,
)
from proofs_check.tolerances import IDENTITY_TOL, identity_slack
from teamtr.divergence import kl, message_kl_from_token_kls, token_kl_from_logits, tv
from teamtr.turns import team_divergence_from_agent

FloatArray = NDArray[np.float64]


def lemma_3_1_state_slack(
    mdp: TabularMDP, team: FloatArray, agent: int, target: FloatArray
) -> float:
    """Lemma 3.1, state level: replacing agent k changes the team only where k acts.

    Builds the new team with ``sim.TabularTeam.with_agent`` and compares the team KL (both
    directions) and TV at every state with 1[agent(s) = k] times agent k's divergence.
    """
    from sim.team import TabularTeam

    old = TabularTeam(team, mdp.agent_of_state, n_agents=mdp.n_agents)
    new = old.with_agent(agent, target)
    agent_old, agent_new = old.agent(agent), target
    worst = 0.0
    scale = 1.0
    for team_div, agent_div in (
        (kl(new.table, old.table), kl(agent_new, agent_old)),
        (kl(old.table, new.table), kl(agent_old, agent_new)),
        (tv(new.table, old.table), tv(agent_new, agent_old)),
    ):
        predicted = team_divergence_from_agent(mdp.agent_of_state, agent, agent_div)
        worst = max(worst, float(np.max(np.abs(team_div - predicted))))
        scale = max(scale, float(np.max(np.abs(predicted))))
    return IDENTITY_TOL * scale - worst


def message_chain_rule_slack(pair: MessagePair) -> float:
    """Lemma 3.1, token level: KL(p||q) over whole messages (enumerated) equals
    E_{y ~ p}[sum_t KL(p(.|y_<t) || q(.|y_<t))] with exact per-token KLs from the logits."""
    messages = all_messages(pair.vocab_size, pair.length)
    along_p = token_logits_along(pair.logits_p, messages, pair.vocab_size)
    along_q = token_logits_along(pair.logits_q, messages, pair.vocab_size)
    logp = token_log_probs(along_p, messages).sum(axis=1)
    logq = token_log_probs(along_q, messages).sum(axis=1)
    p = np.exp(logp)
    message_kl = float(np.sum(p * (logp - logq)))
    per_token = token_kl_from_logits(along_p, along_q)  # (M, T)
    summed = message_kl_from_token_kls(per_token, np.ones_like(per_token, dtype=bool))
    return identity_slack(message_kl, float(np.sum(p * summed)), pair.length)


def dialogue_chain_rule_slack(
    n_agents: int, vocab_size: int, length: int, logit_scale: float, closeness: float, seed: int
) -> float:
    """Lemma 3.1, token level, on ``sim.dialogue_mdp``: at every state of the dialogue, the
    KL between two teams' message distributions (actions = all V^T messages, enumerated)
    equals E_{y~p}[sum_t KL(p(.|y_<t) || q(.|y_<t))] computed with
    ``teamtr.divergence.token_kl_from_logits`` along every message's prefixes; and
    ``sim.dialogue.per_token_kl_sum`` agrees. Identity slack (1e-9), min over states."""
    from sim.dialogue import TokenFactorisation, dialogue_mdp, message_probs_from_token_logits

    rng = np.random.default_rng(seed)
    mdp = dialogue_mdp(n_agents, vocab_size, length, seed=rng)
    tokens = TokenFactorisation(vocab_size, length)
    shape = (mdp.n_states, tokens.n_prefixes, vocab_size)
    logits_p = logit_scale * rng.standard_normal(shape)
    logits_q = logits_p + closeness * rng.standard_normal(shape)
    p = message_probs_from_token_logits(logits_p, vocab_size, length)  # (S, V^T): team tables
    q = message_probs_from_token_logits(logits_q, vocab_size, length)
    prefixes = tokens.message_prefixes  # (V^T, T)
    per_token = token_kl_from_logits(logits_p[:, prefixes], logits_q[:, prefixes])  # (S, M, T)
    summed = message_kl_from_token_kls(per_token, np.ones(per_token.shape, dtype=bool))
    chain = np.sum(p * summed, axis=1)
    message = kl(p, q)
    from_sim = tokens.per_token_kl_sum(p, q)
    worst = max(float(np.max(np.abs(message - chain))), float(np.max(np.abs(message - from_sim))))
    return IDENTITY_TOL * max(1.0, length) - worst
