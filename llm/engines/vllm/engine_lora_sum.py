"""How a vLLM server teamtr starts adds each LoRA branch in half precision (``[sampler]
engine_lora_sum``), through teamtr's vLLM plugin (``vllm_plugin/``, installed into vLLM's
environment by ``make vllm``; never imported here, since it lives in vLLM's environment).

vLLM adds the branch into the base product's half-precision output, rounded to nearest: an
update's small first steps round away (the served policy keeps a fraction of float32's change
on the default relay's first updates: docs/scaling_out.md, "vLLM in half precision: the LoRA
sum", with the bench that measures it). The plugin adds
it in float32 and rounds the sum stochastically, unbiased. The server is told by one variable
in its environment, and says in its log, from each process it patched, that the plugin ran:
a server whose vLLM lacks the plugin is refused rather than left to serve a lagging policy.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from llm.engines.protocol import EngineUnavailable
from llm.models.precision import HALF_DTYPES

ENVIRONMENT = "TEAMTR_VLLM_LORA_SUM"
"""The plugin's variable (``teamtr_vllm_plugin.ENVIRONMENT``; a test holds the two equal)."""
RAN = re.compile(r"teamtr_vllm_plugin: LoRA sum '(\w+)' in process (\d+)")
"""The line the plugin prints in every server process it patched (a process forked from one
inherits the patch, and prints nothing)."""
ENGINE_CORE_LINE = re.compile(r"^\(EngineCore\S* pid=\d+\)", re.MULTILINE)
"""A line vLLM's engine-core process logged: the API server, which loads vLLM's plugins before
it starts that process, has run teamtr's plugin by then if its vLLM has it."""


def sum_of(dtype: torch.dtype, choice: str) -> str:
    """The sum a server of ``dtype`` runs: ``choice`` in half precision; float32 sums exactly
    whatever is chosen (the plugin leaves it untouched)."""
    return choice if dtype in HALF_DTYPES else "float32"


def plugin_environment(dtype: torch.dtype, choice: str) -> tuple[tuple[str, str], ...]:
    """The server's variable for ``choice`` (none where vLLM's own sum is asked for)."""
    return ((ENVIRONMENT, choice),) if sum_of(dtype, choice) == "stochastic" else ()


def require_plugin(log: Path, dtype: torch.dtype, choice: str, ready: bool = True) -> None:
    """Where the stochastic sum is asked for, the server's log must show the plugin patched at
    least one process (``EngineUnavailable`` otherwise, saying how to install it): once the
    server is ready (``ready``), or already while it starts, once its engine core has logged a
    line (``ENGINE_CORE_LINE``), before that process loads the model (minutes for a large one
    on a GPU node)."""
    if sum_of(dtype, choice) != "stochastic":
        return
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    if any(found[0] == "stochastic" for found in RAN.findall(text)):
        return
    if not ready and not ENGINE_CORE_LINE.search(text):
        return  # too soon to tell
    raise EngineUnavailable(
        '[sampler] engine_lora_sum = "stochastic": the server\'s vLLM has no teamtr plugin '
        "(its log never says it ran): `make vllm` installs it into .venv-vllm, `pip install "
        './vllm_plugin` into another environment; engine_lora_sum = "vllm" serves with '
        f"vLLM's own sum, which loses most of an update's first steps; the log: {log}"
    )
