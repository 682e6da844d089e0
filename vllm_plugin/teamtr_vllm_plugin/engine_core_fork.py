"""The API server's engine core forked, not spawned, on vLLM's CPU build.

vLLM's OpenAI server runs its engine core in a process of its own (``AsyncLLM`` has no
in-process engine), started with ``VLLM_WORKER_MULTIPROC_METHOD``; the CPU platform sets that
to ``spawn`` for every process vLLM starts (``CpuPlatform.check_and_update_config``), so the
engine core is a fresh interpreter that imports vLLM again (and, under ``spawn``, the server's
``__main__`` module too) before it can load a model: about 9 CPU-seconds of every server start
that the API server, which has imported all of it already, spent a moment before.

With ``TEAMTR_VLLM_ENGINE_CORE=fork`` in the server's environment (teamtr's engine sets it,
``llm.engines.vllm.command.cpu_build_environment``), the platform's choice is set back to
``fork`` right after the platform makes it, so that the engine core is forked from the API
server. What the platform's ``spawn`` guards against does not arise there: the engine core runs
the model in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no worker process of its
own, so nothing forks a process that has run the model), and the API server has run no torch
computation before it forks (it loads the model's config and tokenizer, not its weights), so
no OpenMP thread pool exists to be lost in the fork. Unset, or ``spawn``: vLLM's own choice.
"""

from __future__ import annotations

import os
from typing import Any

ENVIRONMENT = "TEAMTR_VLLM_ENGINE_CORE"
STARTS = ("spawn", "fork")
PATCHED = "_teamtr_engine_core_fork"


def chosen_start() -> str:
    from teamtr_vllm_plugin import environment_choice

    return environment_choice(ENVIRONMENT, STARTS)


def install() -> bool:
    """Make the CPU platform leave vLLM's processes forked; whether it patched now (and then
    says so in the server's log, with the process)."""
    try:
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:  # a build without the CPU platform
        return False
    original: Any = CpuPlatform.check_and_update_config
    if getattr(original, PATCHED, False):
        return False

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        original(vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    setattr(check_and_update_config, PATCHED, True)
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore
    # In the server's log: vLLM runs its plugins in every process it starts with a fresh
    # interpreter, so a line from its engine core's pid would say that one was spawned.
    print(f"teamtr_vllm_plugin: engine core 'fork' in process {os.getpid()}", flush=True)
    return True
