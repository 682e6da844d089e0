"""One output head for sampling and training alike: float32 logits from a half-precision model.

The trust region measures KLs of a few 1e-3 nats over a vocabulary of tens of thousands of
tokens; bfloat16 logits (8 significant bits: steps of 0.06 at a logit of 16) would round those
differences away before any log-softmax sees them. The training pass has therefore always
projected its last hidden states with a float32 copy of the head (``llm.logprobs.scoring``).
Generation, though, called the model's own half-precision head, so the policy that sampled a
token and the policy the updater scored it with differed by that rounding (tenths of a nat
on some tokens of SmolLM2 in bfloat16: ``bench/behaviour_logp_gap.py``, docs/scaling_out.md,
"Half precision").

``install_float32_head`` replaces a half-precision model's ``lm_head`` by ``Float32Head``, which
holds the head's weight in float32 and casts its input up: every caller of the model (Hugging
Face ``generate``, the scoring pass, a deep copy made for generation) then computes the same
float32 logits from the same hidden states. A float32 model is left as it is, so its results
do not change by a bit.
"""

from __future__ import annotations

import typing

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

HALF_DTYPES = (torch.bfloat16, torch.float16)


class Float32Head(torch.nn.Module):
    """``Linear(hidden) -> logits`` computed in float32 whatever the hidden states' dtype.

    ``weight`` stays the wrapped head's own parameter (so that weight tying, state dicts and
    PEFT see what they saw before); the forward pass reads ``weight_float32``, a non-persistent
    float32 copy taken once (the base model is frozen, so the copy never goes stale).
    """

    def __init__(self, head: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = head.in_features
        self.out_features = head.out_features
        self.weight = head.weight
        self.register_buffer("weight_float32", head.weight.detach().float(), persistent=False)
        bias = None if head.bias is None else head.bias.detach().float()
        self.register_buffer("bias_float32", bias, persistent=False)

    weight_float32: torch.Tensor
    bias_float32: torch.Tensor | None
    half_for_sampling = False
    """``half_precision_head_for_sampling``: the head in half precision inside the whole model."""
    in_whole_model = False

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.half_for_sampling and self.in_whole_model:
            weight = typing.cast(torch.Tensor, self.weight)
            bias = None if self.bias_float32 is None else self.bias_float32.to(weight.dtype)
            return torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias).float()
        return torch.nn.functional.linear(hidden.float(), self.weight_float32, self.bias_float32)


ModelT = typing.TypeVar("ModelT", bound=torch.nn.Module)


def install_float32_head(model: ModelT) -> ModelT:
    """``model`` with its ``lm_head`` computing float32 logits where its weights are in half
    precision (in place; returned for chaining). A float32 model, or one whose head is already
    a ``Float32Head``, is returned untouched."""
    head = getattr(model, "lm_head", None)
    if isinstance(head, Float32Head) or head is None:
        return model
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"output head {type(head).__name__}: only a Linear head is supported")
    if head.weight.dtype not in HALF_DTYPES:
        return model
    model.lm_head = Float32Head(head)
    return model


FLOAT32_ATTENTION = "teamtr_float32_sdpa"
"""The attention implementation ``install_float32_attention`` registers with transformers."""


def float32_sdpa_attention(module, query, key, value, attention_mask, *args, **kwargs):
    """transformers' SDPA attention on float32 copies of a half-precision model's queries,
    keys and values, rounded back to the model's dtype.

    On CPUs without AMX, torch's bfloat16 attention kernel is slower than its float32 one at a
    decoding step's shape (one query against the keys so far) and no faster over whole
    transcripts (docs/scaling_out.md, "Half precision", "Is it faster?"); the products around
    it are what half precision speeds up. In float32 the softmax also rounds less.
    """
    dtype = query.dtype
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    output, weights = sdpa_attention_forward(
        module, query.float(), key.float(), value.float(), attention_mask, *args, **kwargs
    )
    return output.to(dtype), weights


def install_float32_attention(model: ModelT) -> ModelT:
    """``model`` computing attention in float32 (``float32_sdpa_attention``) where its
    weights are in half precision and it uses SDPA (in place; returned for chaining)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return model
    pretrained = typing.cast(PreTrainedModel, model)
    if typing.cast(torch.Tensor, pretrained.get_input_embeddings().weight).dtype not in HALF_DTYPES:
        return model
    AttentionInterface.register(FLOAT32_ATTENTION, float32_sdpa_attention)
    # Its masks are SDPA's: an implementation without a registered mask function gets none
    # at all from transformers (no causal mask, every position sees the whole transcript).
    AttentionMaskInterface.register(FLOAT32_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    pretrained.set_attn_implementation(FLOAT32_ATTENTION)
    return model


def is_half(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is bfloat16 or float16."""
    return dtype in HALF_DTYPES


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = 2^-p of a floating type with p significand bits (float32 2^-24, bfloat16 2^-8,
    float16 2^-11): the largest relative error of rounding one number to it."""
    return float(torch.finfo(dtype).eps) / 2


def half_precision_attention(model: torch.nn.Module) -> int:
    """Attention in the model's half-precision dtype (an option, not a default; in place):
    the query, key and value projections' outputs, float32 under the float32 LoRA sum, are
    rounded to the base weights' dtype, so the key/value cache holds them at half the bytes
    and attention runs on torch's half-precision SDPA kernel. Returns how many projections
    round. On a CPU with AMX that kernel is faster than float32's; on AVX-512 without AMX it is
    slower, which is why attention is float32 by default (``float32_sdpa_attention``; both
    measured in docs/stage_cost.md, "A bfloat16 stage, part by part"). It moves the policy by a rounding of q,
    k and v: the sampler's recorded log-probs and the trainer's both see it, and the stage
    bench reports the mismatch it leaves."""
    base = typing.cast(PreTrainedModel, getattr(model, "get_base_model", lambda: model)())
    dtype = typing.cast(torch.Tensor, base.get_input_embeddings().weight).dtype
    if dtype not in HALF_DTYPES:
        return 0

    def rounded(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output.to(dtype)

    changed = 0
    for name, module in base.named_modules():
        if name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj") and ".self_attn." in name:
            module.register_forward_hook(rounded)
            changed += 1
    base.set_attn_implementation("sdpa")
    return changed


def half_precision_head_for_sampling(model: torch.nn.Module) -> bool:
    """The output head in the model's half-precision dtype when the whole causal LM runs (as
    generation calls it), float32 when the head is called on its own (as scoring does: the
    trust region's log-probs stay float32). An option, not a default: the sampler then draws
    from, and records, bfloat16 logits; the mismatch check and the importance weights see
    the gap (its KL: docs/stage_cost.md). Returns whether the model has a ``Float32Head``."""
    base = typing.cast(torch.nn.Module, getattr(model, "get_base_model", lambda: model)())
    head = getattr(base, "lm_head", None)
    if not isinstance(head, Float32Head):
        return False

    def entering(_module: torch.nn.Module, _args: tuple) -> None:
        head.in_whole_model = True

    def leaving(_module: torch.nn.Module, _args: tuple, _output: typing.Any) -> None:
        head.in_whole_model = False

    head.half_for_sampling = True
    base.register_forward_pre_hook(entering)
    base.register_forward_hook(leaving)
    return True
