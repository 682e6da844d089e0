"""What a sampler asks an engine, and what it gets back.

The sampler decides who speaks, over which tokens, how far and how randomly; an engine only
draws: for one speaker and a batch of contexts (token ids, each in that speaker's own view),
one message per context and, where asked, the log-probability of each sampled token under the
distribution it was drawn from, log softmax(logits / T). Two engines implement it:
``llm.sampling.engine_hf`` (Hugging Face ``generate`` in this process, the default) and
``llm.sampling.engine_vllm`` (a vLLM server holding the base once and one adapter per
agent). The sampler's exactness arguments (prefix reuse, dynamic sampling) rest only on each
message being a draw of its speaker's policy, whichever engine draws it.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from llm.common.config import ConfigError

if TYPE_CHECKING:
    from llm.models.agents import LoraTeam
    from llm.sampling.context_cache import ContextCaches, SnapshotKey


@dataclass(frozen=True)
class TurnRequest:
    """One turn of a batch of dialogues, all spoken by one speaker."""

    team: LoraTeam
    speaker: int
    """The agent speaking (``ChatFormat.policy`` maps it to the policy whose adapter draws)."""
    policy: int
    contexts: Sequence[Sequence[int]]
    max_new_tokens: int
    temperature: float
    """0: greedy (evaluation); otherwise sampling from softmax(logits / temperature)."""
    record: bool
    """Whether the sampled tokens' log-probs are wanted."""
    prompt_lengths: Sequence[int] | None = None
    """Each context's prompt length, where prompts are shared within the batch."""
    kept: tuple[ContextCaches, SnapshotKey] | None = None
    """The contexts this speaker snapshot read in earlier draws (the in-process engine's)."""
    seeds: Sequence[int] | None = None
    """One seed per context, for an engine that seeds each request (a server)."""


@dataclass(frozen=True)
class Drawn:
    messages: list[tuple[int, ...]]
    """One message per context, up to and including its stop token where one was drawn."""
    logps: list[torch.Tensor] | None
    """Per message, each token's log-prob under the distribution it was drawn from."""


class Engine(Protocol):
    name: str

    def row_seeds(self, rows: int) -> list[int] | None:
        """Seeds for ``rows`` requests, drawn from torch's generator (seeded by the sampler's
        play), or None for an engine that draws from that generator itself."""
        ...

    def draw(self, request: TurnRequest) -> Drawn:
        """One message per context (and, where ``request.record`` asks and the engine keeps
        them, their tokens' log-probs)."""
        ...

    def keep_log_in(self, run_dir: Path) -> None:
        """Write the engine's log into the run directory from now on (where it has one)."""
        ...

    def close(self) -> None: ...


class EngineUnavailable(ConfigError):
    """The engine a config asks for cannot be used here (not installed, a model it cannot
    serve): bad input, found before anything is written."""


class EngineStartFailed(OSError):
    """The engine's server did not become ready (it stopped, or did not answer in time): a
    fault of the surroundings found before the run began (the CLI's one ``error:`` line)."""


class EngineFailed(ConnectionError):
    """The engine stopped answering mid-run: a fault of the surroundings, like a full disk
    (an ``OSError``, so the run saves its checkpoint and exits 1; ``--resume`` continues)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ECONNABORTED, message)
