"""The engine a config asks for (``[sampler] engine``), built without starting anything."""

from __future__ import annotations

from llm.common.settings import SamplerSettings
from llm.conversation.dialogue import ChatFormat
from llm.engines.hf.engine import HFEngine
from llm.engines.protocol import Engine
from llm.engines.vllm.client import VLLMEngine


def make_engine(chat: ChatFormat, settings: SamplerSettings, reuse_work: bool = True) -> Engine:
    """``settings.engine``'s engine for dialogues in ``chat``; ``reuse_work``: the in-process
    engine shares each group's prompt and keeps contexts (False: the straightforward path the
    equality tests compare against). A server engine is started by ``Engine.start``."""
    if settings.engine == "vllm":
        return VLLMEngine(chat, settings)
    return HFEngine(chat, settings, reuse_work)
