"""What a sampler asks an engine, and what it gets back.

The sampler decides who speaks, over which tokens, how far and how randomly; an engine only
draws: for one speaker and a batch of contexts (token ids, each in that speaker's own view),
one message per context and, where asked, the log-probability of each sampled token under the
distribution it was drawn from, log softmax(logits / T). Two engines implement it:
``llm.engines.hf`` (Hugging Face ``generate`` in this process, the default) and
``llm.engines.vllm`` (a vLLM server holding the base once and one adapter per agent);
``llm.engines.factory.make_engine`` picks one from ``[sampler] engine``. The sampler's
exactness arguments (prefix reuse, dynamic sampling) rest only on each message being a draw of
its speaker's policy, whichever engine draws it.

Randomness: the sampler seeds torch's generator once per play (``llm.common.devices.seeded``);
every engine draws whatever it needs from that generator, in the order of the turns it is
asked for, so a replayed play draws the same messages. A request with ``seeds`` draws each row
from the numbers of its own seed instead, the same numbers in whatever batch, call or draw the
row comes (common random numbers): Hugging Face by an exponential race (Gumbel-max,
``llm.engines.hf.draw.CoupledDraw``), vLLM by the same race from each request's seed.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from llm.common.config import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from llm.models.agents import LoraTeam


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
    """Each context's prompt length (its group's opening, the same for every dialogue of the
    group), where the engine runs each distinct prompt once (``Engine.shares_prompts``); None:
    it draws whole contexts."""
    seeds: Sequence[int] | None = None
    """Per context, the seed (below 2**63) of the random numbers its message is drawn with: the
    rows of coupled dialogues (a held-out pair's two sides, ``llm.sampling.held_out_groups``),
    whose tokens coincide where the same seed meets the same next-token distribution. None: the
    engine's own generator."""


@dataclass(frozen=True)
class Drawn:
    messages: list[tuple[int, ...]]
    """One message per context, up to and including its stop token where one was drawn."""
    logps: list[torch.Tensor] | None
    """Per message, each token's log-prob under the distribution it was drawn from."""


class Engine(Protocol):
    name: str

    def context_limit(self, positions: int) -> int:
        """The longest context (prompt and messages, in tokens) this engine draws for, on a
        model of ``positions`` positions: what every dialogue of a run must fit."""
        ...

    def start(
        self, team: LoraTeam, tokenizer: PreTrainedTokenizerBase, positions: int, threads: int
    ) -> None:
        """Make the engine ready to draw for ``team`` (a server engine starts or checks its
        server here, before the run directory exists); ``positions``: the model's,
        ``threads``: the CPU threads it may use (0: torch's count)."""
        ...

    def shares_prompts(self, prompt_lengths: Sequence[int]) -> bool:
        """Whether this engine runs each distinct prompt of a batch once, for contexts whose
        prompts are ``prompt_lengths`` tokens long (it is then given them in
        ``TurnRequest.prompt_lengths``); False: each request holds whole contexts (a server
        keeps its own prefix cache)."""
        ...

    def drawing(self, team: LoraTeam, continues: bool) -> AbstractContextManager[None]:
        """One draw of ``team`` (every play of one ``sample``); ``continues``: it continues
        the previous draw by prefix reuse (what an engine keeps between draws may be read)."""
        ...

    def draw(self, request: TurnRequest) -> Drawn:
        """One message per context (and, where ``request.record`` asks and the engine keeps
        them, their tokens' log-probs)."""
        ...

    def keep_log_in(self, run_dir: Path) -> None:
        """Write the engine's log into the run directory from now on (where it has one)."""
        ...

    def drawn_by(self, team: LoraTeam) -> str:
        """What draws ``team``'s messages, as each update's record names it: the engine, the
        precision and how its adapted layers add the LoRA branch (e.g. "vllm, bfloat16, LoRA
        sum stochastic"), the sum whose rounding decides whether the policy that samples
        carries an update's small first steps."""
        ...

    def close(self) -> None: ...


class EngineUnavailable(ConfigError):
    """The engine a config asks for cannot be used here (not installed, a model it cannot
    serve): bad input, found before anything is written."""


class EngineStartFailed(OSError):
    """The engine's server did not become ready (it stopped, or did not answer in time), or a
    server named by ``engine_url`` is not the one the run needs: a fault of the surroundings
    found before the run began (the CLI's one ``error:`` line, exit 2)."""


class EngineFailed(ConnectionError):
    """The engine stopped answering mid-run, or refused a request (HTTP 4xx): a fault of the
    surroundings, like a full disk (an ``OSError``, so the run saves its checkpoint and exits
    1; ``--resume`` continues)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ECONNABORTED, message)
