"""The training forward pass: logits and log-probs of one agent's messages in full transcripts.

Both the sampler (to record the behaviour log-probs) and the updater (to compute the new ones)
call ``message_logits`` with the same episodes in the same chunks, so before any update the
ratio new/old is exactly 1 (issue 4; the updater asserts it). Only positions that predict the
agent's own message tokens go through the output head, which keeps the ``V``-wide logits small.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from peft import PeftModel

from llm.devices import model_device
from llm.dialogue import ChatFormat, Episode


@dataclass(frozen=True)
class MessageBatch:
    """One row per message of one agent: the tokens it sampled and the logits that scored them."""

    refs: tuple[tuple[int, int], ...]
    """(episode index, turn index) of each row."""
    tokens: torch.Tensor
    """(M, T) sampled token ids, 0 where masked."""
    mask: torch.Tensor
    """(M, T) True on real message tokens."""
    logits: torch.Tensor
    """(M, T, V) temperature-scaled logits that predicted each token."""

    def token_logps(self) -> torch.Tensor:
        """(M, T) log-probabilities of the sampled tokens (0 where masked)."""
        logps = torch.log_softmax(self.logits, dim=-1)
        picked = logps.gather(-1, self.tokens.unsqueeze(-1)).squeeze(-1)
        return torch.where(self.mask, picked, torch.zeros_like(picked))


def turns_of(
    episodes: Sequence[Episode], agent: int, indices: Sequence[int]
) -> list[tuple[int, int]]:
    """(episode, turn) pairs of ``agent``'s non-empty messages among ``indices``."""
    return [
        (e, t)
        for e in indices
        for t, turn in enumerate(episodes[e].turns)
        if turn.agent == agent and turn.message
    ]


def message_logits(
    model: PeftModel,
    chat: ChatFormat,
    episodes: Sequence[Episode],
    agent: int,
    indices: Sequence[int],
    temperature: float = 1.0,
) -> MessageBatch | None:
    """Score ``agent``'s messages in episodes ``indices`` with whatever adapter is active.

    Returns None when the agent has no message there.
    """
    refs = turns_of(episodes, agent, indices)
    if not refs:
        return None
    rows = sorted({e for e, _ in refs})
    row_of = {e: r for r, e in enumerate(rows)}
    assembled = {e: chat.assemble(episodes[e]) for e in rows}
    # Causal attention: nothing after the agent's last message token changes its logits, so
    # each row stops there (the first speaker's rows skip the rest of the dialogue).
    needed = {e: 0 for e in rows}
    for e, t in refs:
        needed[e] = max(needed[e], assembled[e][1][t][1])
    length = max(needed.values())
    input_ids = torch.full((len(rows), length), chat.pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    for e, (ids, _) in assembled.items():
        input_ids[row_of[e], : needed[e]] = torch.tensor(ids[: needed[e]])
        attention[row_of[e], : needed[e]] = 1
    causal_lm = model.get_base_model()
    device = model_device(causal_lm)
    hidden = causal_lm.model(
        input_ids=input_ids.to(device), attention_mask=attention.to(device)
    ).last_hidden_state
    longest = max(assembled[e][1][t][1] - assembled[e][1][t][0] for e, t in refs)
    positions = torch.zeros((len(refs), longest), dtype=torch.long)
    tokens = torch.zeros((len(refs), longest), dtype=torch.long)
    mask = torch.zeros((len(refs), longest), dtype=torch.bool)
    for m, (e, t) in enumerate(refs):
        start, end = assembled[e][1][t]
        n = end - start
        # The logits at position p predict token p + 1.
        positions[m, :n] = torch.arange(start - 1, end - 1)
        tokens[m, :n] = torch.tensor(episodes[e].turns[t].message)
        mask[m, :n] = True
    row_index = torch.tensor([row_of[e] for e, _ in refs]).unsqueeze(-1).expand_as(positions)
    selected = hidden[row_index.to(device), positions.to(device)]
    logits = output_logits(causal_lm.lm_head, selected) / temperature
    return MessageBatch(tuple(refs), tokens.to(device), mask.to(device), logits)


def output_logits(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Float32 logits of the output head, whatever the model's dtype.

    The trust region measures KLs of a few 1e-3 nats over a vocabulary of tens of thousands of
    tokens; bfloat16 logits (8 significant bits: steps of 0.06 at a logit of 16) would round
    those differences away before the log-softmax sees them. A half-precision model therefore
    projects its last hidden states with a float32 copy of the head, and every log-softmax and
    KL downstream (``MessageBatch.token_logps``, ``llm.losses``) runs on float32 logits.
    """
    if hidden.dtype == torch.float32:
        return head(hidden).float()
    weight = head.weight.float()
    bias = None if head.bias is None else head.bias.float()
    return torch.nn.functional.linear(hidden.float(), weight, bias)


def chunks(indices: Sequence[int], size: int) -> list[list[int]]:
    """Deterministic consecutive chunks (the same for the sampler and the updater)."""
    return [list(indices[i : i + size]) for i in range(0, len(indices), size)]
