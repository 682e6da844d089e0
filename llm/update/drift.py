"""How far apart two language-model teams' dialogue distributions are, from sampled dialogues.

The distance the drift study (``studies.llm.drift.scaling``) adds up is the KL divergence between the
distributions of whole dialogues that two teams A and B produce, KL(P_A || P_B). By the chain
rule over turns and tokens (Lemma 3.1: at every step only the speaking agent's policy acts, and
routing and grading depend on the transcript alone),

    KL(P_A || P_B) = E_{dialogue ~ A} [ sum over turns t, tokens j of
                                        KL( A_{k_t}(. | s_tj) || B_{k_t}(. | s_tj) ) ],

where k_t is the speaker of turn t and s_tj the context before its j-th token. Each inner KL is
exact over the whole vocabulary (``llm.logprobs.losses.token_kl_from_log_probs``), so the only sampling
error is the outer mean over dialogues drawn from A. Turns of agents whose policy is the same
in A and B contribute exactly 0 and are not scored. A message is cut at the longest message
length whatever the policy, so the positions a dialogue reaches are those where it sampled.

The occupancy of a dialogue team is a marginal of its dialogue distribution, so the L1 distance
of the two teams' occupancies is at most 2 TV(P_A, P_B) <= sqrt(2 KL(P_A || P_B)) (Pinsker):
``l1_bound`` is that bound, the quantity comparable to the tabular study's exact
||d_A - d_B||_1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from llm.conversation.dialogue import ChatFormat, Episode
from llm.logprobs.losses import token_kl_from_log_probs
from llm.logprobs.scoring import score_chunks
from llm.models.agents import LoraTeam
from llm.sampling.rollouts import DialogueRollouts


def dialogue_kls(
    chat: ChatFormat,
    team_a: LoraTeam,
    team_b: LoraTeam,
    episodes: Sequence[Episode],
    *,
    temperature: float,
    chunk_size: int = 8,
    share_prompt: bool = True,
) -> np.ndarray:
    """Per dialogue (sampled from ``team_a``): the sum over its turns and tokens of the exact
    per-token KL(A || B). Its mean over dialogues estimates KL(P_A || P_B) without bias."""
    return agent_message_kls(
        chat,
        team_a,
        team_b,
        episodes,
        temperature=temperature,
        chunk_size=chunk_size,
        share_prompt=share_prompt,
    ).sum(axis=1)


def agent_message_kls(
    chat: ChatFormat,
    team_a: LoraTeam,
    team_b: LoraTeam,
    episodes: Sequence[Episode],
    *,
    temperature: float,
    chunk_size: int = 8,
    share_prompt: bool = True,
) -> np.ndarray:
    """``(dialogues, agents)``: each agent's share of ``dialogue_kls``, the exact per-token
    KL(A_k || B_k) summed over agent k's messages (0 for agents that are the same in both)."""
    totals = np.zeros((len(episodes), team_a.n_agents))
    for agent in team_a.differing_agents(team_b):
        with torch.no_grad():
            scored_a = [
                (batch.refs, batch.mask, batch.log_probs().double())
                for _, batch in score_chunks(
                    team_a.use(agent), chat, episodes, agent, chunk_size, temperature, share_prompt
                )
            ]
            scored_b = score_chunks(
                team_b.use(agent), chat, episodes, agent, chunk_size, temperature, share_prompt
            )
            for (refs, mask, log_p), (_, batch_b) in zip(scored_a, scored_b, strict=True):
                # float64: the per-token KLs of a trust-region step are ~1e-4 nats, a difference
                # of nearly equal log-probabilities summed over the whole vocabulary.
                per_token = token_kl_from_log_probs(log_p, batch_b.log_probs().double())
                per_message = torch.where(mask, per_token, torch.zeros_like(per_token)).sum(-1)
                for row, (e, _) in enumerate(refs):
                    totals[e, agent] += float(per_message[row])
    return totals


def l1_bound(kl: float) -> float:
    """Pinsker: ||d_A - d_B||_1 <= 2 TV(P_A, P_B) <= sqrt(2 KL(P_A || P_B))."""
    return math.sqrt(2.0 * max(kl, 0.0))


def surrogate_on(
    chat: ChatFormat,
    rollouts: DialogueRollouts,
    agent: int,
    updated: LoraTeam,
    *,
    chunk_size: int = 8,
    share_prompt: bool = True,
) -> float:
    """Agent ``agent``'s surrogate L = mean over dialogues of sum over its turns of
    (message ratio updated/behaviour) * advantage, on ``rollouts`` (Thm 3.4's L_i, the quantity
    ``llm.update.updater`` reports for the batch it trained on), here on any batch of the behaviour
    team: evaluated on fresh rollouts it says what the update is worth where it is applied."""
    # The behaviour's log-probs (its training forward pass), before ``updated`` is loaded.
    behaviour = rollouts.behaviour_logps(agent, chat.policy, recorded=False)
    gains = np.zeros(len(rollouts.episodes))
    with torch.no_grad():
        for _, batch in score_chunks(
            updated.use(agent),
            chat,
            rollouts.episodes,
            agent,
            chunk_size,
            rollouts.temperature,
            share_prompt,
        ):
            logps = batch.token_logps()
            for row, (e, t) in enumerate(batch.refs):
                new = float(logps[row][batch.mask[row]].double().sum())
                old = float(behaviour[(e, t)].double().sum())
                gains[e] += math.exp(new - old) * float(rollouts.advantages[e])
    weights = rollouts.episode_weights()
    return float(np.sum(weights * gains) / np.sum(weights))
