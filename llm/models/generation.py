"""Sampling at the bare model's speed: a plain copy of the base model holding one merged policy.

PEFT applies an agent's LoRA update as an extra low-rank product on every adapted linear layer,
``x W^T + s (x A^T) B^T``. While generating, one token at a time, those small extra matmuls cost
about a quarter of the throughput. Merging them, ``x (W + s B A)^T``, computes the same policy
up to float rounding at the bare model's cost.

PEFT's own ``merge_adapter``/``unmerge_adapter`` would do this in the training model's base
weights, but ``W + BA - BA`` is not ``W`` bit for bit: the base, and with it every other agent,
would drift a little with each round trip. The merge therefore goes into a separate copy of the
base model (plain transformers, no PEFT), recomputed from the training model's base weights,
which are frozen and never written. The copy costs one base model of memory; it holds one
agent's policy at a time and is rewritten only when a different snapshot speaks.

Only sampling uses the copy. The log-probs the updater trains on are recomputed by the training
forward pass (``llm.logprobs.scoring``), so the ratio-1 check before an update is unaffected.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Mapping

import torch
from peft import PeftModel
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.lora import LoraLayer
from transformers import PreTrainedModel

from llm.common import profiling


class MergedGenerationCopy:
    """A plain copy of ``model``'s base whose adapted linear weights are ``W + scale * B @ A``.

    The copy is keyed by the snapshot it holds: snapshots are immutable and their version is
    unique, so asking again for the snapshot already merged costs nothing, and an adapter that
    was trained in place can never be served stale (it only reaches the copy as a new snapshot).
    """

    def __init__(self, model: PeftModel) -> None:
        base = model.get_base_model()
        key_prefix_of = {id(module): name for name, module in model.named_modules()}
        adapted = [
            (name, module) for name, module in base.named_modules() if isinstance(module, LoraLayer)
        ]
        for name, module in adapted:
            unsupported = self._unsupported(module)
            if unsupported:
                raise ValueError(f"{name}: cannot merge for generation: {unsupported}")
        # The copy takes the LoRA wrappers along; each is then replaced by its plain base layer.
        self.model = typing.cast(PreTrainedModel, copy.deepcopy(base))
        self._layers: list[tuple[str, LoraLinear, torch.nn.Linear]] = []
        # Every adapted layer is a LoraLinear now (``_unsupported`` refused the rest).
        linear = [(name, module) for name, module in adapted if isinstance(module, LoraLinear)]
        for name, module in linear:
            parent_name, _, child_name = name.rpartition(".")
            parent = self.model.get_submodule(parent_name)
            plain = getattr(parent, child_name).get_base_layer()
            setattr(parent, child_name, plain)
            self._layers.append((key_prefix_of[id(module)], module, plain))
        self.model.requires_grad_(False)
        self.model.eval()
        self._expected_keys = {
            f"{prefix}.{matrix}.weight"
            for prefix, _, _ in self._layers
            for matrix in ("lora_A", "lora_B")
        }
        self._holding: tuple[int, str] | None = None
        self.merges = 0
        """How many times the weights were computed (misses of the one-snapshot cache)."""

    @staticmethod
    def _unsupported(module: LoraLayer) -> str:
        if not isinstance(module, LoraLinear):
            return f"{type(module).__name__} adapters (only Linear)"
        if not isinstance(module.get_base_layer(), torch.nn.Linear):
            return f"base layer {type(module.get_base_layer()).__name__}"
        if module.fan_in_fan_out:
            return "fan_in_fan_out"
        if any(module.use_dora.values()) or any(getattr(module, "lora_bias", {}).values()):
            return "DoRA or LoRA bias"
        return ""

    def speaking(
        self, tensors: Mapping[str, torch.Tensor], version: int, adapter_name: str
    ) -> PreTrainedModel:
        """The copy holding snapshot ``version`` (its ``tensors``) in slot ``adapter_name``.

        ``adapter_name`` selects the slot's LoRA scaling; the keys of ``tensors`` are those of
        ``llm.models.agents.AdapterWeights`` (slot-independent parameter names).
        """
        wanted = (version, adapter_name)
        if self._holding == wanted:
            return self.model
        if tensors.keys() != self._expected_keys:
            raise ValueError("adapter weights do not match the model's LoRA layers")
        self._holding = None  # an interrupted merge must not leave a claim to any snapshot
        with profiling.section("merge"), torch.no_grad():
            for prefix, lora_layer, plain in self._layers:
                weight = plain_weight(lora_layer)
                scale = lora_layer.scaling[adapter_name]
                if weight.dtype != torch.float32:
                    # A half-precision base: W + s B A is formed in float32 (the adapters' own
                    # precision) and rounded once, rather than rounding B A before the sum.
                    lora_a = tensors[f"{prefix}.lora_A.weight"].to(weight.device, torch.float32)
                    lora_b = tensors[f"{prefix}.lora_B.weight"].to(weight.device, torch.float32)
                    plain.weight.copy_(torch.addmm(weight.float(), lora_b, lora_a, alpha=scale))
                    continue
                lora_a = tensors[f"{prefix}.lora_A.weight"].to(weight)
                lora_b = tensors[f"{prefix}.lora_B.weight"].to(weight)
                torch.addmm(weight, lora_b, lora_a, alpha=scale, out=plain.weight)
        self._holding = wanted
        self.merges += 1
        return self.model


def plain_weight(lora_layer: LoraLinear) -> torch.Tensor:
    """The weight of the plain ``Linear`` a LoRA layer wraps."""
    base = lora_layer.get_base_layer()
    if not isinstance(base, torch.nn.Linear):
        raise TypeError(f"base layer {type(base).__name__}: only Linear can be merged")
    return base.weight
