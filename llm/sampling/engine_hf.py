"""The in-process engine: Hugging Face ``generate`` on the speaker's policy (the default).

The speaker's adapter is merged into a plain copy of the base model (``llm.models.generation``)
in float32, or applied by the training model's own LoRA layers in half precision; prompts are
prefilled once per group and kept contexts continued (``llm.sampling.messages``). Sampling
draws from torch's generator, which the sampler seeds once per play: this engine needs no
per-request seeds, and its samples are what they were before engines existed, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import torch
from peft import PeftModel
from transformers import PreTrainedModel

from llm.common.settings import SamplerSettings
from llm.conversation.dialogue import ChatFormat
from llm.models.agents import LoraTeam, is_half_precision
from llm.sampling.engine import Drawn, TurnRequest
from llm.sampling.messages import generate_messages


class HFEngine:
    name = "hf"

    def __init__(self, chat: ChatFormat, settings: SamplerSettings, reuse_work: bool) -> None:
        self.chat = chat
        self.settings = settings
        self.reuse_work = reuse_work

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

    def row_seeds(self, rows: int) -> list[int] | None:
        return None

    def draw(self, request: TurnRequest) -> Drawn:
        model = self.speaker_model(request.team, request.speaker)
        recorded: list[torch.Tensor] | None = (
            [] if request.record and self.records_logps(model, request.temperature) else None
        )
        messages = generate_messages(
            model,
            request.contexts,
            self.chat,
            request.max_new_tokens,
            request.temperature,
            request.prompt_lengths,
            sampled_logps=recorded,
            kept=request.kept,
            draw=self.settings.draw,
        )
        return Drawn(messages, recorded)

    def keep_log_in(self, run_dir: Path) -> None:
        pass  # in process: its messages are the run's own

    def close(self) -> None:
        pass  # nothing to stop
