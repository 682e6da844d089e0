"""One agent's policy as a PEFT adapter folder: what an export holds per agent and what a vLLM
engine loads per snapshot, written by one function so that the two never differ.

The folder holds ``adapter_config.json`` (the slot's LoRA config for inference: its true ``r``,
``lora_alpha`` and adapted modules, the base it belongs to where named) and
``adapter_model.safetensors`` (the weights under PEFT's own key names, those of a checkpoint),
so ``PeftModel.from_pretrained(base, folder)`` and vLLM's ``--lora-modules`` or run-time loading
read it alike.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file

from llm.models.agents import AdapterWeights, slot_name

ADAPTER_FILE = "adapter_model.safetensors"
"""PEFT's name for an adapter folder's weights."""


def write_adapter(
    folder: Path,
    model: PeftModel,
    policy: int,
    weights: AdapterWeights,
    base_name: str | None = None,
) -> None:
    """``weights`` (policy ``policy``'s snapshot on ``model``) as a PEFT adapter folder at
    ``folder``, written beside it and renamed into place (a folder of that name before is
    replaced whole); ``base_name``: the adapter's ``base_model_name_or_path``."""
    config = copy.deepcopy(model.peft_config[slot_name(policy)])
    assert isinstance(config, LoraConfig)  # every slot is a LoRA adapter
    config.inference_mode = True
    config.target_modules = adapted_module_names(model)
    if base_name is not None:
        config.base_model_name_or_path = base_name
    temporary = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    try:
        config.save_pretrained(str(temporary))
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.tensors.items()}
        save_file(tensors, str(temporary / ADAPTER_FILE), metadata={"format": "pt"})
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(temporary, folder)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def adapted_module_names(model: PeftModel) -> list[str]:
    """The adapted modules by their short names (``q_proj``, ...), as adapters usually list
    them and as vLLM matches them, where those names pick out exactly the adapted modules among
    the base's linear layers; else their full paths."""
    base = model.get_base_model()
    adapted = {name for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    inside_adapted = tuple(f"{name}." for name in adapted)
    linear = {
        name
        for name, module in base.named_modules()
        if isinstance(module, torch.nn.Linear) and not name.startswith(inside_adapted)
    }
    short = {name.rsplit(".", 1)[-1] for name in adapted}
    matched = {name for name in linear | adapted if name.rsplit(".", 1)[-1] in short}
    return sorted(short) if matched == adapted else sorted(adapted)
