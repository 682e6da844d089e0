"""The in-process engine: Hugging Face ``generate`` on the speaker's policy (the default).

The speaker's adapter is merged into a plain copy of the base model (``llm.models.generation``)
in float32, or applied by the training model's own LoRA layers in half precision; prompts are
prefilled once per group (``llm.engines.hf.messages``), and within one stage an unchanged speaker
continues from the keys and values it computed over the same prefix in the draw before
(``llm.engines.hf.context_cache``, ``[sampler] kept_contexts_mb``). Sampling draws from torch's
generator, which the sampler seeds once per play: the samples are what they were before
engines existed, bit for bit; a request's coupled rows (``TurnRequest.seeds``) draw from their
own seeds' numbers instead (``llm.engines.hf.draw.CoupledDraw``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from peft import PeftModel
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from llm.common.settings import SamplerSettings
from llm.conversation.dialogue import ChatFormat
from llm.engines.hf.context_cache import ContextCaches
from llm.engines.hf.messages import generate_messages
from llm.engines.protocol import Drawn, TurnRequest
from llm.models.agents import LoraBackbone, LoraTeam, is_half_precision, weights_dtype
from llm.models.half_precision_sum import lora_sum_of


class HFEngine:
    name = "hf"

    def __init__(self, chat: ChatFormat, settings: SamplerSettings, reuse_work: bool) -> None:
        self.chat = chat
        self.settings = settings
        self.reuse_work = reuse_work
        self.context_caches = self._new_context_caches()
        """The keys and values each speaker snapshot computed over its contexts in the last
        draw (``[sampler] kept_contexts_mb``), read by the next draw's generation."""
        self._keeping = False

    # -- the Engine protocol ------------------------------------------------------------------
    def context_limit(self, positions: int) -> int:
        return positions  # generate runs as far as the model's positions go

    def start(
        self, team: LoraTeam, tokenizer: PreTrainedTokenizerBase, positions: int, threads: int
    ) -> None:
        pass  # in process: the team's own models draw

    def shares_prompts(self, prompt_lengths: Sequence[int]) -> bool:
        """Each group's prompt is run once and its rows continue from that cache, which keeps
        all but a prompt's last token (every row keeps one of its own to process): a one-token
        prompt shares nothing."""
        return min(prompt_lengths) >= 2

    def draw(self, request: TurnRequest) -> Drawn:
        model = self.speaker_model(request.team, request.speaker)
        recorded: list[torch.Tensor] | None = (
            [] if request.record and self.records_logps(model, request.temperature) else None
        )
        kept = None
        if self._keeping and request.prompt_lengths is not None:
            kept = (
                self.context_caches,
                (request.policy, request.team.agent(request.policy).version),
            )
        messages = generate_messages(
            model,
            request.contexts,
            self.chat,
            request.max_new_tokens,
            request.temperature,
            request.prompt_lengths,
            sampled_logps=recorded,
            kept=kept,
            draw=self.settings.draw,
            seeds=request.seeds,
        )
        return Drawn(messages, recorded)

    @contextlib.contextmanager
    def drawing(self, team: LoraTeam, continues: bool) -> Iterator[None]:
        """One draw of ``team``: its generation reads and keeps speakers' contexts (where
        ``keeps_contexts``); evaluation and other plays outside a draw do neither. A draw that
        does not ``continue`` the previous one (by prefix reuse: a stage's first) starts from
        nothing, so each stage's draws depend on that stage alone and a run resumed from a
        checkpoint computes what the straight run computes."""
        if not self.keeps_contexts:
            yield
            return
        if not continues:
            self.context_caches = self._new_context_caches()
        self.context_caches.new_draw([(k, p.version) for k, p in enumerate(team.policies)])
        self._keeping = True
        try:
            yield
        finally:
            self._keeping = False
            self.context_caches.end_draw()

    def drawn_by(self, team: LoraTeam) -> str:
        backbone = team.backbone
        # The model itself, not training_model(), which would switch the active adapter.
        model = backbone.model if isinstance(backbone, LoraBackbone) else backbone.models[0]
        dtype = str(weights_dtype(model)).removeprefix("torch.")
        if not team.backbone.half_precision:
            return f"hf, {dtype}"
        return f"hf, {dtype}, LoRA sum {lora_sum_of(model)}"

    def keep_log_in(self, run_dir: Path) -> None:
        pass  # in process: its messages are the run's own

    def close(self) -> None:
        pass  # nothing to stop

    # -- the generating model -----------------------------------------------------------------
    def speaker_model(self, team: LoraTeam, speaker: int) -> PreTrainedModel | PeftModel:
        """The model that generates ``speaker``'s messages (see ``merged_generation``): its
        policy's adapter."""
        policy = self.chat.policy(speaker)
        # In half precision the merge W + s·BA would be rounded to W's 8 or 11 bits, dropping
        # every adapter change below W's spacing from the policy that samples; generation then
        # goes through the training model's own layers (LoRA unmerged, in float32).
        if self.settings.merged_generation and not team.backbone.half_precision:
            return team.generation_model(policy)
        return team.use(policy)

    def records_logps(self, model: torch.nn.Module, temperature: float) -> bool:
        """Whether sampling with ``model`` records each token's log-prob on its turn: at a
        sampling temperature on the default path (``reuse_work``), with ``[sampler]
        behaviour_logps = "sampled"`` or a half-precision model, whose updates always compare
        (and correct) the sampler's log-probs against the trainer's (``llm.update.mismatch``)."""
        return (
            (self.settings.behaviour_logps == "sampled" or is_half_precision(model))
            and temperature > 0
            and self.reuse_work
        )

    # -- kept contexts ------------------------------------------------------------------------
    @property
    def keeps_contexts(self) -> bool:
        """Whether draws keep their speakers' contexts for the next draw: on the default path
        (``reuse_work``), with ``kept_contexts_mb`` > 0 and dialogues of 3 or more turns (with
        2, no unchanged speaker follows a kept turn: nothing could be read again)."""
        return self.reuse_work and self.settings.kept_contexts_mb > 0 and self.settings.turns >= 3

    def _new_context_caches(self) -> ContextCaches:
        return ContextCaches(limit_bytes=self.settings.kept_contexts_mb * 2**20)
