"""What the half-precision stage saves (docs/stage_cost.md, "A bfloat16 stage, part by part")
computes what it computed before, bit for bit, and a float32 model never reaches it.

- The float32 LoRA sum's layer (``Float32SumLoraLinear``) calls the functional products instead
  of PEFT's submodules: every gradient equals that of PEFT's composition of the same
  operations, ``to_float32(W to_product_dtype(x)) + B (A x) s``, bit for bit (the same products
  in the same layouts), and its output equals the composition's to the rounding of the rank-r
  sum (its ``addmm`` sums in the order the BLAS library picks; docs/float_tolerances.md).
- Without gradients, the products that read one input share its cast (``to_product_dtype``):
  the shared cast is the one each would compute, and a changed input (in place) gets a fresh
  one. With gradients each casts its own (a shared cast would sum their input gradients in
  bfloat16: measured here, it changes them).
- The two options that are not exact (``llm.models.precision``: attention in bfloat16, a
  bfloat16 head for sampling) change what they say and nothing in a float32 model.
"""

from __future__ import annotations

import torch
from llm_test_support import gamma
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import Linear as LoraLinear

from llm.models import half_precision_sum
from llm.models.agents import wrap_in_peft
from llm.models.half_precision_sum import Float32SumLoraLinear, install_lora_sum, to_product_dtype
from llm.models.loading import load_model
from llm.models.precision import half_precision_attention, half_precision_head_for_sampling


class Block(torch.nn.Module):
    """Two projections reading one input, as a layer's q/k/v (or gate/up) do."""

    def __init__(self, width: int = 48, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.q = torch.nn.Linear(width, width, bias=False)
        self.k = torch.nn.Linear(width, width, bias=True)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) * self.k(x)


def adapted(dtype: torch.dtype, seed: int = 0):
    model = get_peft_model(
        Block(seed=seed).to(dtype),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q", "k"], lora_dropout=0.0),
    )
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.01)
    install_lora_sum(model, "float32")
    return model


def composed(layer: LoraLinear, x: torch.Tensor) -> torch.Tensor:
    """PEFT's vanilla LoRA operations, in PEFT's order, on the float32 sum's terms."""
    base = layer.get_base_layer()
    result = base(x.to(base.weight.dtype)).float()
    lora_a, lora_b = layer.lora_A["default"], layer.lora_B["default"]
    return result + lora_b(lora_a(x.float())) * layer.scaling["default"]


def branch_terms(layer: LoraLinear, x: torch.Tensor) -> torch.Tensor:
    """``|s| sum_k |a_k b_k|`` per output in float64: the absolute sum of the rank-r branch's
    terms, ``a = A x`` the down projection (float32, as the layer computes it) and ``b`` a row
    of B. float64 holds each product of two float32 exactly and rounds the r-term sum of
    non-negative values by under ``r 2^-53`` of it, far inside the slack of ``gamma``."""
    lora_a, lora_b = layer.lora_A["default"], layer.lora_B["default"]
    down = lora_a(x.float()).double().abs()
    return abs(layer.scaling["default"]) * (down @ lora_b.weight.double().abs().T)


def rounding_bound(layer: LoraLinear, x: torch.Tensor, roundings: int) -> torch.Tensor:
    """How far two float32 computations of ``c + s B (A x)`` may lie apart, ``c`` the base
    product (its bfloat16 output upcast: exact, and the same bits on both sides) and ``A x``
    the same float32 down projection on both sides: each is off the exact value by at most
    ``gamma_roundings (|c| + |s| sum_k |a_k b_k|)`` when every term, ``c`` included, passes
    through at most ``roundings`` roundings, whatever the order (``llm_test_support.gamma``)."""
    base = layer.get_base_layer()(x.to(torch.bfloat16)).double().abs()
    return 2 * gamma(roundings) * (base + branch_terms(layer, x))


def test_the_float32_sum_layer_is_peft_composition_forward_to_rounding_backward_bit_for_bit():
    """The forward pass: the fused ``addmm`` and PEFT's ``mm``, scaling and sum are two
    kernels, and the BLAS library promises neither's order (it may start the sum from the
    addend ``c``, or block the rank-r sum otherwise; MKL's paths on AMD EPYC and on AMX give
    the same bits today, which nothing promises). With ``s = 2`` (alpha 8 / rank 4) the
    scaling is exact wherever it is applied, so every term passes through at most r + 1
    roundings (the products and the sum, ``c``'s add included) on either side: within
    ``2 gamma_5`` of the terms' absolute sum of each other (``rounding_bound``). The backward pass of a fixed
    cotangent (a linear loss: the gradients do not read the forward's rounding) is the same
    products in the same layouts on both sides (``MKL_VERBOSE`` lists the same four GEMM calls,
    shapes and transposes for both; the ``addmm``'s multiplies its products by 2 after them,
    ``linear``'s before: exact either way), bit for bit."""
    model = adapted(torch.bfloat16)
    layer = model.base_model.model.k
    assert type(layer) is Float32SumLoraLinear and layer.get_base_layer().bias is not None
    assert layer.scaling["default"] == 2.0 and layer.r["default"] == 4
    x = torch.randn(3, 5, 48, generator=torch.Generator().manual_seed(7))
    cotangent = torch.randn(3, 5, 48, generator=torch.Generator().manual_seed(6))
    gradients = []
    outputs = []
    for forward in (layer, lambda inp: composed(layer, inp)):
        model.zero_grad()
        inp = x.clone().requires_grad_(True)
        out = forward(inp)
        (out * cotangent).sum().backward()
        outputs.append(out.detach())
        gradients.append(
            [inp.grad]
            + [p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and "k" in n]
        )
    assert outputs[0].dtype == torch.float32
    with torch.no_grad():
        bound = rounding_bound(layer, x, roundings=4 + 1)
    assert ((outputs[0].double() - outputs[1].double()).abs() <= bound).all()
    assert len(gradients[0]) == 3  # the input, lora_A and lora_B of k
    for lean, reference in zip(gradients[0], gradients[1], strict=True):
        assert torch.equal(lean, reference)


def test_products_of_one_input_share_its_cast_and_only_while_it_is_unchanged():
    x = torch.randn(4, 48)
    with torch.no_grad():
        first = to_product_dtype(x, torch.bfloat16)
        assert to_product_dtype(x, torch.bfloat16) is first
        assert torch.equal(first, x.to(torch.bfloat16))
        assert to_product_dtype(x, torch.float16).dtype == torch.float16  # another dtype
        x.mul_(3.0)  # changed in place: the version counter says so
        again = to_product_dtype(x, torch.bfloat16)
        assert again is not first and torch.equal(again, x.to(torch.bfloat16))
        assert to_product_dtype(x.clone(), torch.bfloat16) is not again  # equal, not the same
        assert to_product_dtype(x, torch.float32) is x
    assert to_product_dtype(x, torch.bfloat16) is not to_product_dtype(x, torch.bfloat16)


def _input_gradient(model, x: torch.Tensor, cast) -> torch.Tensor:
    """The gradient of the block's output sum with respect to its float32 input, with
    ``cast`` in place of ``to_product_dtype``."""
    original = half_precision_sum.to_product_dtype
    half_precision_sum.to_product_dtype = cast
    try:
        inp = x.clone().requires_grad_(True)
        model(inp).sum().backward()
    finally:
        half_precision_sum.to_product_dtype = original
    assert inp.grad is not None
    return inp.grad


def test_with_gradients_each_product_casts_its_own_input():
    """A shared cast would change the input's gradient (summed in bfloat16): with gradients
    the model's input gradient is the one of a cast per product, as before the sharing."""
    model = adapted(torch.bfloat16, seed=3)
    x = torch.randn(6, 48, generator=torch.Generator().manual_seed(2))
    separate = _input_gradient(model, x, lambda t, dtype: t.to(dtype))
    shared_casts: dict[int, torch.Tensor] = {}

    def always_shared(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return shared_casts.setdefault(id(t), t.to(dtype))

    assert not torch.equal(_input_gradient(model, x, always_shared), separate)
    assert torch.equal(_input_gradient(model, x, to_product_dtype), separate)
    half_precision_sum._last_cast = None
    with torch.no_grad():  # without gradients the shared cast computes the same output
        shared_output = model(x)
        assert half_precision_sum._last_cast is not None and half_precision_sum._last_cast[0] is x
    assert torch.equal(shared_output, model(x).detach())


def test_a_float32_model_keeps_pefts_layers_and_their_results():
    """float32 runs do not reach any of it: the layers stay PEFT's, and its forward pass is
    PEFT's own, bit for bit, with or without ``install_lora_sum``."""
    installed, untouched = adapted(torch.float32, seed=5), None
    untouched = get_peft_model(
        Block(seed=5), LoraConfig(r=4, lora_alpha=8, target_modules=["q", "k"], lora_dropout=0.0)
    )
    untouched.load_state_dict(installed.state_dict())
    assert all(type(m) is LoraLinear for m in installed.modules() if isinstance(m, LoraLinear))
    assert install_lora_sum(installed, "float32") == 0
    x = torch.randn(2, 7, 48, generator=torch.Generator().manual_seed(9))
    assert torch.equal(installed(x), untouched(x))


def test_a_scaling_not_a_power_of_two_differs_by_float32_rounding_of_the_rank_r_sum_at_most():
    """alpha / r = 1.5. Per output, both sides compute ``y = c + s sum_{k<r} a_k b_k`` in
    float32 from the same float32 values: ``c`` the bfloat16 base product upcast (exact), ``a``
    the down projection ``A x`` (one ``linear`` call on both sides: the same bits, asserted) and
    ``b`` a row of B. What differs is the count of roundings, and the order, which the BLAS
    library picks (docs/float_tolerances.md):

    - PEFT's ``mm``: the r products and their sum round each term at most r times, in any order
      or tree, fused multiply-adds or not; the scaling ``fl(s p)`` once more, the add of ``c``
      once more: every term, ``c`` included, at most r + 2 roundings.
    - the fused ``addmm``: the same sum, with the scaling applied after it, or to a factor
      before the products (MKL packs ``fl(s b_k)``: one rounding of each term), and ``c`` added
      last or loaded as the sum's start: again at most r + 2 roundings a term.

    So each side is off the exact ``y`` by at most ``gamma_{r+2} (|c| + s sum_k |a_k b_k|)``
    (Higham (3.5), ``llm_test_support.gamma``) and the two by twice that: ``2 gamma_6``, about
    12 u of the terms' absolute sum. A bound on ``max(|c|, |s B A x|)`` alone (the former
    ``6 u m``) counts the branch as one rounded value and fails where its r terms cancel: a
    rank-4 sum of 3.6 in absolute terms that comes to 0.2 carries the rounding of the 3.6.
    A sum that drops the scaling, adds the branch twice or rounds it to bfloat16 is off by
    half the branch, the branch or up to ``2^-9`` of it: thousands of times the bound."""
    model = get_peft_model(
        Block(seed=11).to(torch.bfloat16),
        LoraConfig(r=4, lora_alpha=6, target_modules=["q", "k"], lora_dropout=0.0),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)))
    install_lora_sum(model, "float32")
    layer = model.base_model.model.q
    assert layer.scaling["default"] == 1.5 and layer.r["default"] == 4
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(8))
    lora_a = layer.lora_A["default"]
    with torch.no_grad():
        # the premise: the down projection has the same bits in both (one call, one kernel)
        assert torch.equal(lora_a(x), torch.nn.functional.linear(x, lora_a.weight))
        fused, reference = layer(x), composed(layer, x)
        bound = rounding_bound(layer, x, roundings=4 + 2)
        branch = (reference.double() - layer.get_base_layer()(x.to(torch.bfloat16)).double()).abs()
    assert ((fused.double() - reference.double()).abs() <= bound).all()
    # The bound is far under a bfloat16 step of the branch: the bugs above fail it.
    assert (bound < 2.0**-12 * branch).float().mean() > 0.9


def test_the_bfloat16_head_option_serves_the_whole_model_only_and_float32_is_untouched():
    """``half_precision_head_for_sampling``: generation's call of the whole model gets the
    bfloat16 head's logits, the scoring pass's call of the head alone float32's; a float32
    model has no ``Float32Head`` and is left as it is."""
    model = load_model("tiny", dtype=torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator())
    with torch.no_grad():
        before = model(input_ids=ids).logits
        hidden = model.model(input_ids=ids).last_hidden_state
        assert half_precision_head_for_sampling(model)
        after = model(input_ids=ids).logits
        alone = model.lm_head(hidden)
    head = model.lm_head
    assert torch.equal(alone, before)  # the head called alone: float32, as before
    expected = torch.nn.functional.linear(hidden.to(torch.bfloat16), head.weight).float()
    assert torch.equal(after, expected) and not torch.equal(after, before)
    assert not head.in_whole_model
    assert not half_precision_head_for_sampling(load_model("tiny"))


def test_the_bfloat16_attention_option_rounds_q_k_v_and_leaves_float32_alone():
    model = wrap_in_peft(
        load_model("tiny", dtype=torch.bfloat16),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0),
        "default",
    )
    install_lora_sum(model, "float32")
    ids = torch.randint(0, 60, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        assert cache.layers[0].keys.dtype == torch.float32  # the float32 sum's keys
        layers = model.get_base_model().config.num_hidden_layers
        assert half_precision_attention(model) == 3 * layers
        cache = model(input_ids=ids, use_cache=True).past_key_values
        assert cache.layers[0].keys.dtype == torch.bfloat16
    assert model.get_base_model().config._attn_implementation == "sdpa"
    assert half_precision_attention(load_model("tiny")) == 0
