"""The training forward pass: logits and log-probs of one agent's messages in full transcripts.

Both the sampler (to record the behaviour log-probs) and the updater (to compute the new ones)
call ``message_logits`` with the same episodes in the same chunks, so before any update the
ratio new/old is exactly 1 (the updater asserts it). Only positions that predict the
agent's own message tokens go through the output head, which keeps the ``V``-wide logits small.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from peft import PeftModel

from llm.common import profiling
from llm.common.devices import model_device
from llm.common.hf_compat import cache_argument, cache_of
from llm.conversation.dialogue import ChatFormat, Episode
from llm.models.precision import Float32Head


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

    def log_probs(self) -> torch.Tensor:
        """(M, T, V) log-probabilities over the vocabulary at every scored position."""
        return torch.log_softmax(self.logits, dim=-1)

    def token_logps(self, log_probs: torch.Tensor | None = None) -> torch.Tensor:
        """(M, T) log-probabilities of the sampled tokens (0 where masked); ``log_probs`` is
        ``self.log_probs()`` when the caller has it already."""
        logps = self.log_probs() if log_probs is None else log_probs
        picked = logps.gather(-1, self.tokens.unsqueeze(-1)).squeeze(-1)
        return torch.where(self.mask, picked, torch.zeros_like(picked))

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())


def turns_of(
    chat: ChatFormat, episodes: Sequence[Episode], agent: int, indices: Sequence[int]
) -> list[tuple[int, int]]:
    """(episode, turn) pairs of policy ``agent``'s non-empty messages among ``indices``."""
    return [
        (e, t)
        for e in indices
        for t, turn in enumerate(episodes[e].turns)
        if chat.policy(turn.agent) == agent and turn.message
    ]


def message_tokens(chat: ChatFormat, episodes: Sequence[Episode], agent: int) -> int:
    """How many message tokens policy ``agent`` sampled in ``episodes`` (the tokens it is
    scored on)."""
    return sum(
        len(turn.message) for e in episodes for turn in e.turns if chat.policy(turn.agent) == agent
    )


Row = tuple[int, int | None]
"""A scored transcript: (episode index, the view it is rendered in; ``ChatFormat.view_of``)."""


def message_logits(
    model: PeftModel,
    chat: ChatFormat,
    episodes: Sequence[Episode],
    agent: int,
    indices: Sequence[int],
    temperature: float = 1.0,
    share_prompt: bool = True,
) -> MessageBatch | None:
    """Score ``agent``'s messages in episodes ``indices`` with whatever adapter is active.

    With ``share_prompt`` the episodes of one problem (a GRPO group: same prompt tokens) run
    their common prompt through the model once and continue from its key/value cache, instead
    of once per episode: the same logits up to float rounding (causal attention: a prompt
    position never sees what follows it), for a fraction of the work. Returns None when the
    agent has no message there.

    Each message is scored in its speaker's own view (``ChatFormat.view_of``): a transcript
    row per episode and view, one per episode when the problem has no private notes.
    """
    refs = turns_of(chat, episodes, agent, indices)
    if not refs:
        return None
    row_of_ref = {
        (e, t): (e, chat.view_of(episodes[e], episodes[e].turns[t].agent)) for e, t in refs
    }
    rows = sorted(
        set(row_of_ref.values()), key=lambda row: (row[0], -1 if row[1] is None else row[1])
    )
    assembled = {row: chat.assemble(episodes[row[0]], row[1]) for row in rows}
    # Causal attention: nothing after the agent's last message token changes its logits, so
    # each row stops there (the first speaker's rows skip the rest of the dialogue).
    needed = dict.fromkeys(rows, 0)
    for ref in refs:
        row = row_of_ref[ref]
        needed[row] = max(needed[row], assembled[row][1][ref[1]][1])
    causal_lm = model.get_base_model()
    device = model_device(causal_lm)
    if share_prompt:
        hidden, row_of, offset_of = _hidden_sharing_prompts(
            causal_lm, chat, episodes, assembled, needed, device
        )
    else:
        hidden, row_of = _hidden_per_row(causal_lm, chat, assembled, needed, device)
        offset_of = dict.fromkeys(rows, 0)
    spans = [assembled[row_of_ref[ref]][1][ref[1]] for ref in refs]
    longest = max(end - start for start, end in spans)
    positions = torch.zeros((len(refs), longest), dtype=torch.long)
    tokens = torch.zeros((len(refs), longest), dtype=torch.long)
    mask = torch.zeros((len(refs), longest), dtype=torch.bool)
    for m, ((e, t), (start, end)) in enumerate(zip(refs, spans, strict=True)):
        n = end - start
        # The logits at position p predict token p + 1 (hidden rows start at offset_of[row]).
        positions[m, :n] = torch.arange(start - 1, end - 1) - offset_of[row_of_ref[(e, t)]]
        tokens[m, :n] = torch.tensor(episodes[e].turns[t].message)
        mask[m, :n] = True
    row_index = torch.tensor([row_of[row_of_ref[ref]] for ref in refs])
    row_index = row_index.unsqueeze(-1).expand_as(positions)
    selected = hidden[row_index.to(device), positions.to(device)]
    logits = output_logits(_submodule(causal_lm, "lm_head"), selected) / temperature
    profiling.count("scored message tokens", int(mask.sum()))
    return MessageBatch(tuple(refs), tokens.to(device), mask.to(device), logits)


def output_logits(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Float32 logits of the output head, whatever the model's dtype.

    The trust region measures KLs of a few 1e-3 nats over a vocabulary of tens of thousands of
    tokens; bfloat16 logits (8 significant bits: steps of 0.06 at a logit of 16) would round
    those differences away before the log-softmax sees them. A half-precision model loaded by
    ``llm.models.loading`` carries a ``Float32Head`` (``llm.models.precision``), which
    generation calls too, so that the sampler draws from exactly these logits; a plain
    half-precision ``Linear`` head is projected with a float32 copy of its weights here. Every
    log-softmax and KL downstream (``MessageBatch.token_logps``, ``llm.logprobs.losses``) runs
    on float32 logits.
    """
    if hidden.dtype == torch.float32 or isinstance(head, Float32Head):
        return head(hidden).float()
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"output head {type(head).__name__}: only a Linear head is supported")
    bias = None if head.bias is None else head.bias.float()
    return torch.nn.functional.linear(hidden.float(), head.weight.float(), bias)


def _submodule(causal_lm: torch.nn.Module, name: str) -> torch.nn.Module:
    """``causal_lm.<name>`` (``model``: the decoder stack, ``lm_head``: the output head of a
    Hugging Face causal LM), checked to be a module."""
    module = getattr(causal_lm, name)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{type(causal_lm).__name__}.{name} is not a module")
    return module


def _hidden_per_row(
    causal_lm: torch.nn.Module,
    chat: ChatFormat,
    assembled: dict[Row, tuple[list[int], list[tuple[int, int]]]],
    needed: dict[Row, int],
    device: torch.device,
) -> tuple[torch.Tensor, dict[Row, int]]:
    """Every row's transcript (up to ``needed``) through the model, right-padded."""
    rows = list(assembled)
    row_of = {e: r for r, e in enumerate(rows)}
    length = max(needed.values())
    input_ids = torch.full((len(rows), length), chat.pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    for e, (ids, _) in assembled.items():
        input_ids[row_of[e], : needed[e]] = torch.tensor(ids[: needed[e]])
        attention[row_of[e], : needed[e]] = 1
    profiling.count("scored positions", int(attention.sum()))
    hidden = _submodule(causal_lm, "model")(
        input_ids=input_ids.to(device), attention_mask=attention.to(device)
    ).last_hidden_state
    return hidden, row_of


def _hidden_sharing_prompts(
    causal_lm: torch.nn.Module,
    chat: ChatFormat,
    episodes: Sequence[Episode],
    assembled: dict[Row, tuple[list[int], list[tuple[int, int]]]],
    needed: dict[Row, int],
    device: torch.device,
) -> tuple[torch.Tensor, dict[Row, int], dict[Row, int]]:
    """Each distinct prompt through the model once; its rows continue from its cache.

    Returns the hidden states after the prompt, right-padded to one length, the row of each
    episode, and the transcript position each row starts at (its prompt's length).
    """
    groups: dict[tuple[int, ...], list[Row]] = {}
    for row in assembled:
        groups.setdefault(episodes[row[0]].prompt, []).append(row)
    pieces = []
    row_of: dict[Row, int] = {}
    offset_of: dict[Row, int] = {}
    for prompt, members in groups.items():
        # All but the prompt's last token: every scored position (the one before a message
        # token) then lies after the shared part, whatever the turn headers are.
        p = len(prompt) - 1
        cache = None
        if p > 0:
            prefix_ids = torch.tensor([prompt[:p]], device=device)
            prefix = _submodule(causal_lm, "model")(input_ids=prefix_ids, use_cache=True)
            cache = cache_of(prefix)
            cache.batch_repeat_interleave(len(members))
        length = max(needed[e] for e in members) - p
        input_ids = torch.full((len(members), length), chat.pad_id, dtype=torch.long)
        attention = torch.zeros((len(members), p + length), dtype=torch.long)
        attention[:, :p] = 1
        for r, e in enumerate(members):
            ids = assembled[e][0]
            input_ids[r, : needed[e] - p] = torch.tensor(ids[p : needed[e]])
            attention[r, p : needed[e]] = 1
            row_of[e] = len(row_of)
            offset_of[e] = p
        profiling.count("scored positions", p + int(attention[:, p:].sum()))
        out = _submodule(causal_lm, "model")(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            use_cache=True,
            **cache_argument(cache),
        )
        pieces.append(out.last_hidden_state)
    longest = max(piece.shape[1] for piece in pieces)
    padded = [torch.nn.functional.pad(x, (0, 0, 0, longest - x.shape[1])) for x in pieces]
    return torch.cat(padded), row_of, offset_of


def score_chunks(
    model: PeftModel,
    chat: ChatFormat,
    episodes: Sequence[Episode],
    agent: int,
    chunk_size: int,
    temperature: float = 1.0,
    share_prompt: bool = True,
) -> Iterator[tuple[list[int], MessageBatch]]:
    """``message_logits`` over consecutive chunks of ``episodes`` (the same chunks for sampler,
    updater and alignment, so their forward passes match), skipping chunks where ``agent`` does
    not speak. Gradients are tracked as the caller's ``torch.no_grad`` state says."""
    for chunk in chunks(range(len(episodes)), chunk_size):
        batch = message_logits(model, chat, episodes, agent, chunk, temperature, share_prompt)
        if batch is not None:
            yield chunk, batch


def chunks(indices: Sequence[int], size: int) -> list[list[int]]:
    """Deterministic consecutive chunks (the same for the sampler and the updater)."""
    return [list(indices[i : i + size]) for i in range(0, len(indices), size)]
