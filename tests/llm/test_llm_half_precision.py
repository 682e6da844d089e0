"""Half precision samples the policy it trains: one float32 head, the adapter unmerged, the
sampler's log-probs measured against the trainer's at every update, checked and corrected
(``llm.models.precision``, ``llm.update.mismatch``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from llm_test_support import with_rewards
from test_llm_devices import with_placement, write_config

from llm.common.config import load_config
from llm.interface.cli import main
from llm.models.agents import AdapterWeights
from llm.models.precision import FLOAT32_ATTENTION, Float32Head, unit_roundoff
from llm.training.builder import build
from llm.update.mismatch import (
    KL_TOLERANCE_FACTOR,
    MismatchTally,
    message_weights_of,
    mismatch_kl_tolerance,
    truncated_weights,
)
from llm.update.updater import RatioCheckError

HALF = ("bfloat16", "float16")


def half_parts(tmp_path, dtype: str, extra: str = ""):
    # Half precision's attention runs in float32 (``llm.models.precision``), so torch's
    # bfloat16 attention kernel, which forced AVX2 kernels refuse, is never called.
    return build(with_placement(load_config(write_config(tmp_path, extra)), "cpu", dtype))


def trainer_against_sampler(parts, team, agent: int):
    """A fresh draw of ``team``: per message token of ``agent``, the trainer's log-prob minus
    the one the sampler recorded while drawing it."""
    rollouts = parts.sampler.sample(team)
    recorded = rollouts.recorded_logps(agent, parts.chat.policy)
    assert recorded is not None, "a half-precision sampler records what it drew tokens with"
    trainer = parts.sampler.agent_logps(team, rollouts.episodes, agent)
    assert recorded.keys() == trainer.keys() and recorded
    return torch.cat([trainer[key] - recorded[key] for key in recorded]).double()


def within_rounding(gaps: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether per-token gaps g are what rounding to ``dtype`` explains: their KL, the mean
    of e^g - 1 - g, within c·u², and so their root mean square within √(2c)·u."""
    tolerance = mismatch_kl_tolerance(dtype)
    kl = float((torch.expm1(gaps) - gaps).mean())
    rms = float(gaps.square().mean().sqrt())
    return kl <= tolerance and rms <= math.sqrt(2 * KL_TOLERANCE_FACTOR) * unit_roundoff(dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_sampling_and_training_read_one_float32_head(tmp_path, dtype):
    parts = half_parts(tmp_path, dtype)
    base = parts.team.backbone.model.get_base_model()
    assert isinstance(base.lm_head, Float32Head)
    assert base.lm_head.weight.dtype == getattr(torch, dtype)  # the model's own, for tying
    ids = torch.tensor([[1, 2, 3, 4]])
    assert parts.team.use(0)(input_ids=ids).logits.dtype == torch.float32
    assert base.config._attn_implementation == FLOAT32_ATTENTION
    # A float32 model keeps its plain head and attention: its results do not change by a bit.
    plain = build(load_config(write_config(tmp_path))).team.backbone.model.get_base_model()
    assert type(plain.lm_head) is torch.nn.Linear
    assert plain.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("dtype", HALF)
def test_float32_attention_is_causal_and_is_sdpa_to_rounding(tmp_path, dtype):
    """The float32 attention keeps SDPA's causal mask (a later token changes no earlier
    logit, bit for bit) and computes what SDPA computes, up to the rounding of the format."""
    model = half_parts(tmp_path, dtype).team.use(0).get_base_model()
    ids = torch.tensor([list(range(1, 31)), list(range(31, 61))])
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # a left-padded row, as the sampler lays its contexts out
    changed = ids.clone()
    changed[:, 20:] = 7
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask).logits
        later = model(input_ids=changed, attention_mask=mask).logits
        assert torch.equal(later[:, :20], ours[:, :20])
        model.set_attn_implementation("sdpa")
        try:
            plain = model(input_ids=ids, attention_mask=mask).logits
        finally:
            model.set_attn_implementation(FLOAT32_ATTENTION)
    ours, plain = ours[mask.bool()], plain[mask.bool()]  # padded positions predict nothing
    # Each of the tiny model's layers rounds its output to the format once in either; the
    # logits (of magnitude ~1 here) then differ by a few units of u, never by a mask's worth.
    assert (ours - plain).abs().max() <= 64 * unit_roundoff(getattr(torch, dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_an_adapter_change_below_the_weights_spacing_reaches_the_sampler(tmp_path, dtype):
    """A LoRA change mostly below half of W's spacing vanishes when W + s·BA is rounded to
    ``dtype``: the merged copy's policy stays the base's, not the trainer's. The sampler
    generates with the adapter unmerged, so it draws from the trainer's policy."""
    parts = half_parts(tmp_path, dtype)
    team = parts.team
    generator = torch.Generator().manual_seed(3)
    tensors = {
        key: torch.randn(value.shape, generator=generator) * 1e-5 if "lora_B" in key else value
        for key, value in team.agent(0).tensors.items()
    }
    moved = team.with_agent(0, AdapterWeights(tensors))
    ids = torch.tensor([list(range(1, 40))])

    def logits(model):
        with torch.no_grad():
            return model(input_ids=ids).logits.double()

    trainer = logits(moved.use(0))
    merged = logits(moved.generation_model(0))
    base = logits(team.use(0))
    change = (trainer - base).abs().max()
    assert change > 0, "the change must reach the trainer's policy"
    assert (merged - trainer).abs().max() >= 0.5 * change  # lost to the merge's rounding
    gaps = trainer_against_sampler(parts, moved, 0)
    assert within_rounding(gaps, getattr(torch, dtype))


def test_after_an_update_the_next_draw_is_the_trainers_policy_and_its_mismatch_is_logged(
    tmp_path,
):
    parts = half_parts(tmp_path, "bfloat16")
    graded = with_rewards(parts.sampler.sample(parts.team), [1.0, 0.0] * 8)
    update = parts.updater.update(parts.team, 0, graded, radius=0.05)
    assert update.accepted and update.kl > 0
    assert update.mismatch is not None and update.mismatch.tokens > 0
    assert update.mismatch.kl <= update.mismatch.kl_tolerance
    team = parts.team.with_agent(0, update.policy)
    assert not team.agent(0).equal(parts.team.agent(0))
    assert within_rounding(trainer_against_sampler(parts, team, 0), torch.bfloat16)


def test_stale_rollouts_are_still_refused_in_half_precision(tmp_path):
    """Rollouts drawn by another policy of the agent (here: its adapter moved far, as many
    updates would) lie far above what rounding to bfloat16 explains: the check refuses them,
    while the same team's own rollouts pass it."""
    parts = half_parts(tmp_path, "bfloat16")
    generator = torch.Generator().manual_seed(5)
    tensors = {
        key: torch.randn(value.shape, generator=generator) * 0.5 if "lora_B" in key else value
        for key, value in parts.team.agent(0).tensors.items()
    }
    other = parts.team.with_agent(0, AdapterWeights(tensors))
    own = with_rewards(parts.sampler.sample(parts.team), [1.0, 0.0] * 8)
    assert parts.updater.update(parts.team, 0, own, radius=0.05).mismatch is not None
    stale = with_rewards(parts.sampler.sample(other), [1.0, 0.0] * 8)
    recorded = stale.recorded_logps(0, parts.chat.policy)
    trainer = parts.sampler.agent_logps(parts.team, stale.episodes, 0)
    gaps = torch.cat([trainer[key] - recorded[key] for key in recorded]).double()
    assert float((torch.expm1(gaps) - gaps).mean()) > mismatch_kl_tolerance(torch.bfloat16)
    with pytest.raises(RatioCheckError, match="stale rollouts"):
        parts.updater.update(parts.team, 0, stale, radius=0.05)


def test_a_half_precision_run_logs_the_mismatch_of_every_update(tmp_path):
    config = write_config(tmp_path, extra='dtype = "bfloat16"\nname = "half"')
    assert main(["train", "--config", str(config)]) == 0
    lines = (tmp_path / "runs" / "half" / "metrics.jsonl").read_text().splitlines()
    updates = [u for line in lines for u in json.loads(line).get("updates", [])]
    measured = [u for u in updates if u["mismatch"] is not None]
    assert measured, "no update of the stage measured its sampler"
    # An update that needs no forward pass (no reward signal, the agent never spoke) has none.
    assert all(u["kl"] == 0 and u["surrogate"] == 0 for u in updates if u["mismatch"] is None)
    for update in measured:
        figures = update["mismatch"]
        assert set(figures) == {
            "tokens",
            "max_gap",
            "mean_gap",
            "over_tolerance",
            "kl",
            "truncated",
        }
        assert 0 <= figures["kl"] <= mismatch_kl_tolerance(torch.bfloat16)
        assert 0 <= figures["over_tolerance"] <= 1 and 0 <= figures["truncated"] <= 1


def test_a_float32_run_records_the_mismatch_within_ratio_tolerance(tmp_path):
    parts = build(load_config(write_config(tmp_path)))
    graded = with_rewards(parts.sampler.sample(parts.team), [1.0, 0.0] * 8)
    update = parts.updater.update(parts.team, 0, graded, radius=0.05)
    assert update.mismatch is not None and math.isinf(update.mismatch.kl_tolerance)
    assert update.mismatch.max_gap <= parts.config.updater.ratio_tolerance
    assert update.mismatch.truncated == 0  # "auto" corrects nothing in float32


def test_truncated_importance_weights_and_the_tally_are_the_exact_formulas():
    rng = np.random.default_rng(0)
    trainer = rng.normal(-2, 1, size=(3, 5))
    sampler = trainer + rng.normal(0, 0.8, size=(3, 5))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=bool)
    t, s, m = (torch.tensor(x) for x in (trainer, sampler, mask))
    cap = 1.5
    weights = truncated_weights(t, s, m, cap).numpy()
    expected = np.where(mask, np.minimum(np.exp(trainer - sampler), cap), 1.0)
    np.testing.assert_allclose(weights, expected, rtol=1e-12, atol=0)
    messages = message_weights_of(t, s, m, cap).numpy()
    product = np.exp(np.where(mask, trainer - sampler, 0).sum(axis=1))
    np.testing.assert_allclose(messages, np.minimum(product, cap), rtol=1e-12, atol=0)

    tally = MismatchTally()
    for row in range(3):
        tally.add(t[row][m[row]] - s[row][m[row]], 0.5, cap)
    result = tally.result(0.5, 1.0)
    gaps = (trainer - sampler)[mask]
    assert result.tokens == gaps.size
    assert result.max_gap == pytest.approx(np.abs(gaps).max(), abs=1e-12)
    assert result.mean_gap == pytest.approx(np.abs(gaps).mean(), abs=1e-12)
    assert result.over_tolerance == pytest.approx(np.mean(np.abs(gaps) > 0.5), abs=1e-12)
    assert result.kl == pytest.approx(np.mean(np.expm1(gaps) - gaps), abs=1e-12)
    assert result.truncated == pytest.approx(np.mean(gaps > np.log(cap)), abs=1e-12)


def test_the_precision_tolerance_is_c_times_the_squared_unit_roundoff():
    assert mismatch_kl_tolerance(torch.bfloat16) == pytest.approx(1024 * 2.0**-16, rel=1e-12)
    assert mismatch_kl_tolerance(torch.float16) == pytest.approx(1024 * 2.0**-22, rel=1e-12)
    assert unit_roundoff(torch.float32) == 2.0**-24


def test_the_corrected_surrogate_weighs_each_message_by_its_truncated_ratio(tmp_path):
    """At the pre-update parameters (new = old), the surrogate L̂_i behind the certificate is
    the mean over episodes of Â times the sum, over the agent's messages, of min(π/μ, C) of the
    whole message: recomputed here from the sampler's and the trainer's log-probs."""
    parts = half_parts(tmp_path, "bfloat16")
    rollouts = with_rewards(parts.sampler.sample(parts.team), [1.0, 0.0] * 8)
    policy = parts.chat.policy
    sampled = dict(rollouts.recorded_logps(0, policy))
    shifted = next(iter(sampled))
    sampled[shifted] = sampled[shifted] + 0.05  # this message as if μ had drawn it likelier
    updater, cap = parts.updater, 1.02
    tokens = sum(len(v) for v in sampled.values())
    reference = updater._reference_pass(parts.team, 0, rollouts, tokens, sampled, cap)
    measured = updater._kl_and_surrogate(parts.team, 0, rollouts, reference.chunks)
    trainer = parts.sampler.agent_logps(parts.team, rollouts.episodes, 0)
    original = rollouts.recorded_logps(0, policy)

    def surrogate(recorded):
        gain = np.zeros(len(rollouts.episodes))
        for (e, t), logps in recorded.items():
            weight = min(math.exp(float((trainer[(e, t)] - logps).double().sum())), cap)
            gain[e] += weight * rollouts.advantages[e]
        return gain.mean()

    assert measured.kl == 0.0
    # The message weights are float32 sums of ~20 log-ratios exponentiated: relative 1e-6.
    assert measured.surrogate == pytest.approx(surrogate(sampled), rel=1e-6, abs=1e-9)
    assert abs(surrogate(sampled) - surrogate(original)) > 1e-3  # the weight is really applied
