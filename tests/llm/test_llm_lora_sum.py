"""How a half-precision model adds its LoRA branch (``llm.models.half_precision_sum``): the
rounding that lost bfloat16's signal, and the sums that keep it.

PEFT rounds ``W x`` to bfloat16, adds ``s B A x`` and rounds again: a branch under half a unit
in the last place of ``W x`` vanishes. These tests build such branches on purpose and check
that ``"float32"`` keeps every one exactly, that ``"round_once"`` keeps them in expectation, and
that a tiny model's policy moves as far in bfloat16 as in float32 for the same adapter weights
(with PEFT's sum it does not: the tests would fail on the sum that lost the signal).
"""

from __future__ import annotations

import math

import pytest
import torch
from llm_test_support import gamma
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from llm.common.devices import seeded
from llm.common.settings import LoraSettings
from llm.models.agents import AdapterWeights, LoraBackbone
from llm.models.half_precision_sum import (
    Float32SumLoraLinear,
    RoundOnceLoraLinear,
    install_lora_sum,
    lora_sum_of,
)
from llm.models.precision import install_float32_attention, install_float32_head


class OneLayer(torch.nn.Module):
    def __init__(self, width: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.proj = torch.nn.Linear(width, width, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(width, width, generator=generator))


def adapted_layer(
    mode: str, width: int = 64, branch_scale: float = 1e-6, seed: int = 0, rows: int = 256
):
    """A bfloat16 Linear (outputs of size ~sqrt(width)) with one float32 LoRA adapter whose B is
    ``branch_scale``-sized: its branch lies far under bfloat16's half spacing at the output."""
    model = OneLayer(width, seed).to(torch.bfloat16)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["proj"], lora_dropout=0.0)
    )
    generator = torch.Generator().manual_seed(seed + 1)
    layer = peft_model.base_model.model.proj
    with torch.no_grad():
        layer.lora_B["default"].weight.copy_(
            torch.randn(layer.lora_B["default"].weight.shape, generator=generator) * branch_scale
        )
    install_lora_sum(peft_model, mode)
    x = torch.randn(rows, width, generator=generator).to(torch.bfloat16)  # as the model feeds it
    return peft_model, layer, x


def branch_of(layer, x: torch.Tensor) -> torch.Tensor:
    """s B A x in float32, computed independently of the layer's forward."""
    a = layer.lora_A["default"].weight.detach().float()
    b = layer.lora_B["default"].weight.detach().float()
    return (x.float() @ a.T @ b.T) * layer.scaling["default"]


def outputs_with_and_without(peft_model, layer, x):
    with torch.no_grad():
        adapted = layer(x)
        with peft_model.disable_adapter():
            plain = layer(x)
    return adapted, plain


def test_installing_swaps_only_half_precision_lora_layers_and_says_which_sum():
    peft_model, layer, _ = adapted_layer("float32")
    assert isinstance(layer, Float32SumLoraLinear)
    assert lora_sum_of(peft_model) == "float32"
    assert install_lora_sum(peft_model, "round_once") == 1
    assert isinstance(layer, RoundOnceLoraLinear)
    float32_model = get_peft_model(
        OneLayer(8, 0), LoraConfig(r=2, target_modules=["proj"], lora_dropout=0.0)
    )
    assert install_lora_sum(float32_model, "float32") == 0  # float32 runs are left as they are
    assert lora_sum_of(float32_model) is None
    with pytest.raises(ValueError, match="half_precision_sum"):
        install_lora_sum(peft_model, "float16")


def test_peft_sum_rounds_a_small_branch_away_entirely():
    """The failure the other sums fix: the adapted output is the base's but for a few elements
    that sat at a rounding boundary (3 of 16,384 measured; under 1% asserted)."""
    peft_model, layer, x = adapted_layer("peft")
    adapted, plain = outputs_with_and_without(peft_model, layer, x)
    assert adapted.dtype == torch.bfloat16
    changed = (adapted != plain).float().mean().item()
    assert changed < 0.01  # a branch ~1e-5 of the output's spacing moves next to nothing


def test_float32_sum_adds_the_branch_exactly():
    """Output = float32(bfloat16 product) + s B A x, kept in float32: it is the plain product
    ``c`` (the same bfloat16 kernel's bits, upcast exactly) plus the exact branch
    ``e = s sum_k b_k d_k``, ``d = A x``, to float32's rounding counted whatever the order
    (``llm_test_support.gamma``): the down projection's ``n``-term sums are off by at most
    ``gamma_n D_k`` (``D_k = sum_i |x_i A_ki|``); the rank-r sum, its exact scaling by 2 and
    the add of ``c`` pass every term through at most r + 1 roundings more, so
    ``|y - c - e| <= gamma_{r+1} |c| + gamma_{n+r+1} s sum_k |b_k| D_k`` (Higham's Lemma 3.3
    composes the two stages). ``|branch|`` alone (the former ``70 u |branch|``) misses the
    cancellation inside the sums."""
    peft_model, layer, x = adapted_layer("float32")
    adapted, plain = outputs_with_and_without(peft_model, layer, x)
    assert adapted.dtype == torch.float32
    weight = layer.get_base_layer().weight
    assert torch.equal(plain, torch.nn.functional.linear(x, weight))  # c: one kernel's bits
    scaling, rank = layer.scaling["default"], layer.r["default"]
    assert scaling == 2.0  # a power of two: the scaling rounds nothing
    a = layer.lora_A["default"].weight.detach().double()
    b = layer.lora_B["default"].weight.detach().double()
    exact = scaling * (x.double() @ a.T @ b.T)  # float64: every product exact, sums to 2^-53
    width = x.shape[-1]
    terms = scaling * (x.double().abs() @ a.abs().T @ b.abs().T)  # s sum_k |b_k| D_k
    tolerance = gamma(rank + 1) * plain.double().abs() + gamma(width + rank + 1) * terms
    assert exact.abs().max() > 0
    assert ((adapted.double() - plain.double() - exact).abs() <= tolerance).all()
    # The test's power: where the branch exceeds the tolerance (about half the outputs here),
    # a sum that drops it (PEFT's rounding, or no branch) fails.
    assert (exact.abs() > tolerance).any()


def test_round_once_keeps_the_branch_in_expectation():
    """round(v + b) - round(v) is 0 or one spacing, with mean b when v sits anywhere between
    its two neighbours: summed over 131,072 outputs the kept share of the branch is 1 within
    4 standard deviations (variance of each term at most spacing x |b|)."""
    peft_model, layer, x = adapted_layer("round_once", branch_scale=1e-3, rows=2048)
    with torch.no_grad():
        adapted = layer(x)
        base = layer.get_base_layer().weight
        plain = torch.nn.functional.linear(x.float(), base.float()).to(torch.bfloat16)
    branch = branch_of(layer, x).double()
    moved = (adapted.double() - plain.double()) * branch.sign()
    spacing = torch.finfo(torch.bfloat16).eps * plain.double().abs().clamp_min(1e-30)
    kept = moved.sum() / branch.abs().sum()
    sigma = math.sqrt(float((spacing * branch.abs()).sum())) / float(branch.abs().sum())
    assert sigma < 0.1  # the test can tell a kept branch from a lost one
    assert abs(float(kept) - 1.0) < 4 * sigma


def trained_size_llama(dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """A tiny Llama whose weights have a trained model's size (std 0.2 at width 64: layer outputs
    of order 1, as in SmolLM2), so that a first step's LoRA branch lies under bfloat16's spacing
    at the outputs; the default tiny model's std 0.02 makes outputs so small that its branches
    stay above it. Attention and head in float32, as ``load_model`` installs them."""
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    with seeded(seed):
        model = LlamaForCausalLM(config)
    model.eval()
    torch.nn.Module.to(model, dtype=dtype)
    return install_float32_attention(install_float32_head(model))


def log_prob_change(
    dtype: torch.dtype,
    mode: str,
    scale: float = 1e-4,
    targets: str | tuple[str, ...] = "all-linear",
) -> torch.Tensor:
    """How far every log-prob of a fixed token batch moves when agent 0's B matrices go from 0
    to the same random ``scale``-sized values, in the model of ``dtype`` (float64, flattened),
    with adapters on the ``targets`` layers."""
    model = trained_size_llama(dtype, seed=0)
    settings = LoraSettings(rank=4, half_precision_sum=mode, target_modules=targets)
    backbone = LoraBackbone.create(model, 1, settings, seed=0)
    team = backbone.initial_team()
    generator = torch.Generator().manual_seed(7)
    moved = AdapterWeights(
        {
            key: torch.randn(value.shape, generator=generator) * scale if "lora_B" in key else value
            for key, value in team.agent(0).tensors.items()
        }
    )
    tokens = torch.randint(3, 64, (8, 64), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        before = team.use(0)(input_ids=tokens).logits.float().log_softmax(-1)
        after = team.with_agent(0, moved).use(0)(input_ids=tokens).logits.float().log_softmax(-1)
    return (after - before).flatten().double()


def kept_share(change: torch.Tensor, reference: torch.Tensor) -> float:
    """The projection of ``change`` on ``reference`` in units of ``reference``: 1 when all of
    float32's move is there, 0 when none is (rounding noise is orthogonal to it on average)."""
    return float(change @ reference) / float(reference @ reference)


def test_a_bfloat16_policy_keeps_float32s_move_for_the_same_small_adapter():
    """The same small adapter moves the bfloat16 policy as the float32 one: with "float32"
    sums the projection of its log-prob change on float32's is 1 within 0.15 (measured 0.94 to
    1.02 over four model seeds; the rest of the change is rounding noise). PEFT's sum keeps
    0.26 to 0.38 of it (the control: this test fails on the rounding that lost the signal)."""
    reference = log_prob_change(torch.float32, "float32")
    assert reference.abs().max() > 0
    assert abs(kept_share(log_prob_change(torch.bfloat16, "float32"), reference) - 1) < 0.15
    assert kept_share(log_prob_change(torch.bfloat16, "peft"), reference) < 0.5


@pytest.mark.parametrize("mode", ["float32", "round_once", "peft"])
def test_a_bfloat16_model_with_adapters_on_some_layers_runs_under_every_sum(mode):
    """Adapters on q_proj and v_proj only: under "float32" sums the other projections are
    plain bfloat16 ``Linear`` layers fed the float32 stream, so they must round their input
    (the pre-hook) or their product fails on mixed dtypes. Under every sum the forward pass
    runs and the adapter moves the log-probs; under "float32" as far as it moves the float32
    model's (kept share 1 within 0.15, measured 1.06 on AMX; "round_once" keeps it only in
    expectation, measured 0.77 at this size, and "peft" 0.29: neither is held to it)."""
    targets = ("q_proj", "v_proj")
    reference = log_prob_change(torch.float32, "float32", targets=targets)
    change = log_prob_change(torch.bfloat16, mode, targets=targets)
    assert reference.abs().max() > 0
    assert torch.isfinite(change).all() and change.abs().max() > 0
    if mode == "float32":
        assert abs(kept_share(change, reference) - 1) < 0.15
