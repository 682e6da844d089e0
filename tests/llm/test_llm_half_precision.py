"""Half precision samples the policy it trains: one float32 head, the adapter unmerged, the
sampler's log-probs measured against the trainer's at every update, checked and corrected
(``llm.models.precision``, ``llm.update.mismatch``)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from llm_test_support import (
    FLOAT32_EPSILON,
    full_pass_logps,
    perturb_agent,
    with_rewards,
    with_sampled_logps,
)
from test_llm_devices import with_placement, write_config

from llm.common.config import load_config
from llm.interface.cli import main
from llm.models.precision import FLOAT32_ATTENTION, Float32Head, unit_roundoff
from llm.training.builder import build
from llm.update.mismatch import (
    MismatchTally,
    message_weights_of,
    mismatch_kl_tolerance,
    truncated_weights,
)
from llm.update.reference import RatioCheckError
from llm.update.updater import TrustRegionUpdater

HALF = ("bfloat16", "float16")


def half_parts(tmp_path, dtype: str, extra: str = ""):
    # Half precision's attention runs in float32 (``llm.models.precision``), so torch's
    # bfloat16 attention kernel, which forced AVX2 kernels refuse, is never called.
    return build(with_placement(load_config(write_config(tmp_path, extra)), "cpu", dtype))


def mean_gap(logps, reference) -> float:
    """mean |log p - log q| over the tokens of every message of ``logps``."""
    return float(torch.cat([(logps[k] - reference[k]).double() for k in logps]).abs().mean())


def sampler_margin(dtype: torch.dtype) -> float:
    """How much nearer the trainer's log-probs a half-precision sampler's recorded ones lie
    than those of a policy it did not draw from: sqrt(u32/u), 1/256 in bfloat16, 1/91 in
    float16.

    A merged copy rounds every weight W + s·BA to the format's unit roundoff u, so every
    product it computes is off by a relative ~u and each token's log-prob with it (mean gap
    5e-3 in bfloat16, 7e-4 in float16, on the tiny model with LoRA B ~ N(0, 0.3²)). Drawing
    with the trainer's own weights and layers, the sampler differs from the training pass only
    in the order its float32 sums add up (a key/value cache, one position at a time); that
    changes a rounding to the format only where the float32 value lies within float32's u32 of
    a rounding boundary, a share ~u32/u of them, so its gaps are about u32/u of the merged
    copy's (measured 1e-4 and 9e-4 of them; u32/u = 2^-16 and 2^-13). The line is drawn
    halfway on a log scale: a sampler that drew from the other policy has gaps that policy's
    own (a ratio about 1), one that drew from the trainer's about u32/u.
    """
    return math.sqrt(unit_roundoff(torch.float32) / unit_roundoff(dtype))


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
    # Both sum in float32 and round each layer's attention output, and the residual sum it
    # enters, to the format once: where their float32 values (equal to float32 rounding) round
    # to different neighbours an element moves by one unit, 2u of it. On the premise of
    # ``llm_test_support.logit_resolution`` (every later sum adds terms whose magnitudes add
    # to at most about 1, checked through the logits below 1), such an absolute error reaches
    # a logit at most unchanged: 2 x 2u a layer, 4uL in all (8u here; measured: 0). A dropped
    # padding mask moves the padded row's logits by 58u in bfloat16, 463u in float16.
    assert float(ours.abs().max()) < 1.0
    layers = model.config.num_hidden_layers
    assert (ours - plain).abs().max() <= 4 * layers * unit_roundoff(getattr(torch, dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_an_adapter_change_below_the_weights_spacing_reaches_the_sampler(tmp_path, dtype):
    """A LoRA change mostly below half of W's spacing vanishes when W + s·BA is rounded to
    ``dtype``: the merged copy's policy stays the base's, not the trainer's. The sampler
    generates with the adapter unmerged, so it draws from the trainer's policy."""
    parts = half_parts(tmp_path, dtype)
    team = parts.team
    moved = perturb_agent(team, 0, scale=1e-5, seed=3)
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
    # The sampler's log-probs lie nearer the moved trainer's than the base's, by
    # ``sampler_margin`` (measured: 1.6e-5 and 1.6e-4 of the way; the line is 1/256 and 1/91);
    # the merged copy, the base's policy rounded, would not.
    rollouts = parts.sampler.sample(moved)
    recorded = rollouts.recorded_logps(0, parts.chat.policy)
    assert recorded is not None, "a half-precision sampler records what it drew tokens with"
    to_moved = mean_gap(recorded, parts.sampler.agent_logps(moved, rollouts.episodes, 0))
    to_base = mean_gap(recorded, parts.sampler.agent_logps(team, rollouts.episodes, 0))
    assert to_moved <= sampler_margin(getattr(torch, dtype)) * to_base, (to_moved, to_base)


def test_after_an_update_the_next_draw_is_the_trainers_policy_and_its_mismatch_is_logged(
    tmp_path,
):
    """The draw after an update records log-probs at the updated trainer's, not the old
    policy's: nearer the new policy than the old by ``sampler_margin`` (a draw by the old
    policy would lie the update's own change, mean |log new - log old| ~ 0.08 here, from the
    new; the draw by the new lies 6e-8 from it).
    The update measured every message token of the agent."""
    parts = half_parts(tmp_path, "bfloat16")
    graded = with_rewards(parts.sampler.sample(parts.team), [1.0, 0.0] * 8)
    update = parts.updater.update(parts.team, 0, graded, radius=0.05)
    assert update.accepted and update.kl > 0
    assert update.mismatch is not None and update.mismatch.tokens == update.tokens > 0
    team = parts.team.with_agent(0, update.policy)
    assert not team.agent(0).equal(parts.team.agent(0))
    rollouts = parts.sampler.sample(team)
    recorded = rollouts.recorded_logps(0, parts.chat.policy)
    new = parts.sampler.agent_logps(team, rollouts.episodes, 0)
    old = parts.sampler.agent_logps(parts.team, rollouts.episodes, 0)
    to_new, to_old = mean_gap(recorded, new), mean_gap(recorded, old)
    assert to_new <= sampler_margin(torch.bfloat16) * to_old, (to_new, to_old)


def test_stale_rollouts_are_still_refused_in_half_precision(tmp_path):
    """Rollouts drawn by another policy of the agent (here: its adapter moved far, as many
    updates would) lie far above what rounding to bfloat16 explains: the check refuses them,
    while the same team's own rollouts pass it."""
    parts = half_parts(tmp_path, "bfloat16")
    other = perturb_agent(parts.team, 0, scale=0.5, seed=5)
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
    settings = load_config(config).updater
    ratio_tolerance, cap = settings.ratio_tolerance, settings.tis_cap
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
        # What the figures are to one another (each breaks if a field holds another's or is
        # miscomputed): a mean of |g| is at most its largest; the mean of k3 = e^g - 1 - g at
        # most k3 of the largest |g| (k3 grows with |g| on either side), to double rounding;
        # a share of gaps over a bound is positive exactly when the largest gap is over it.
        largest = figures["max_gap"]
        assert figures["tokens"] > 0 and 0 <= figures["mean_gap"] <= largest
        k3 = max(math.expm1(largest) - largest, math.expm1(-largest) + largest)
        assert 0 <= figures["kl"] <= k3 * (1 + 1e-9) + 1e-300
        assert (figures["over_tolerance"] > 0) == (largest > ratio_tolerance)
        assert (figures["truncated"] > 0) == (largest > math.log(cap))
        assert 0 <= figures["over_tolerance"] <= 1 and 0 <= figures["truncated"] <= 1


def test_a_float32_run_records_the_mismatch_within_ratio_tolerance(tmp_path):
    parts = build(load_config(write_config(tmp_path)))
    graded = with_rewards(parts.sampler.sample(parts.team), [1.0, 0.0] * 8)
    update = parts.updater.update(parts.team, 0, graded, radius=0.05)
    assert update.mismatch is not None and math.isinf(update.mismatch.kl_tolerance)
    assert update.mismatch.tokens == update.tokens > 0  # every message token measured
    # max_gap within ratio_tolerance is the check's own condition (else the update raises:
    # tests/llm/test_llm_updater.py); that "auto" leaves float32 uncorrected is
    # test_each_correction_mode_corrects_in_the_precisions_it_documents's.


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


# -- the correction in the gradient ------------------------------------------------------------


def trainer_logps_of(reference) -> dict[tuple[int, int], torch.Tensor]:
    """Every message's token log-probs as a reference pass of the updater computed them."""
    return {
        ref: chunk.logps[row][chunk.batch.mask[row]]
        for chunk in reference.chunks
        for row, ref in enumerate(chunk.batch.refs)
    }


def token_advantages(chunk) -> torch.Tensor:
    """(M, T) a reference chunk's advantages per token (an uncorrected pass keeps one per
    message: the same for each of its tokens)."""
    advantages = chunk.advantages
    return advantages if advantages.dim() == 2 else advantages.unsqueeze(-1).expand_as(chunk.logps)


def test_each_tokens_advantage_is_weighted_by_its_truncated_ratio(tmp_path):
    """The reference pass, whose loss gives the first step's gradient, weighs token t of a
    message by Â·min(π(y_t)/μ(y_t), C) against the sampler's recorded μ: one message recorded
    as if μ had drawn it likelier (weights e^-0.05 of π/μ), one 1 nat a token less likely (π/μ
    about e, cut at C), the others as the sampler recorded them (weights 1 to rounding)."""
    parts = half_parts(tmp_path, "bfloat16")
    rollouts = with_rewards(parts.sampler.sample(parts.team), [1.0, 0.0] * 8)
    sampled = dict(rollouts.recorded_logps(0, parts.chat.policy))
    likelier, unlikelier = sorted(sampled)[:2]
    sampled[likelier] = sampled[likelier] + 0.05
    sampled[unlikelier] = sampled[unlikelier] - 1.0
    cap = parts.config.updater.tis_cap
    tokens = sum(len(logps) for logps in sampled.values())
    reference = parts.updater._reference_pass(parts.team, 0, rollouts, tokens, sampled, cap)
    seen = set()
    for chunk in reference.chunks:
        advantages = token_advantages(chunk)
        for row, (e, t) in enumerate(chunk.batch.refs):
            mask = chunk.batch.mask[row]
            log_ratio = chunk.logps[row][mask].double() - sampled[(e, t)].double()
            expected = rollouts.advantages[e] * torch.clamp(log_ratio.exp(), max=cap)
            # float32 rounds π - μ (relative u of it), exp (1 ulp) and the products with Â
            # (u each): relative eps·(2 + |log π/μ|) at most; 4 eps·(1 + |log π/μ|) allowed.
            tolerance = 4 * FLOAT32_EPSILON * (1 + float(log_ratio.abs().max()))
            got = advantages[row][mask].double()
            torch.testing.assert_close(got, expected, rtol=tolerance, atol=0)
            seen.add((e, t))
    assert seen == set(sampled)
    # The premise: the two messages' weights really differ from 1 (by far more than rounding).
    shifted = {ref: advantages_of(reference, ref) for ref in (likelier, unlikelier)}
    assert torch.all(shifted[unlikelier].abs() == cap * abs(rollouts.advantages[unlikelier[0]]))
    assert torch.all(shifted[likelier].abs() < 0.96 * abs(rollouts.advantages[likelier[0]]))


def advantages_of(reference, ref: tuple[int, int]) -> torch.Tensor:
    """The token advantages of message ``ref`` in a reference pass."""
    for chunk in reference.chunks:
        if ref in chunk.batch.refs:
            row = chunk.batch.refs.index(ref)
            return token_advantages(chunk)[row][chunk.batch.mask[row]]
    raise KeyError(ref)


def test_the_first_steps_gradient_is_the_corrected_one(tmp_path):
    """μ recorded as the trainer's own log-probs (every weight exp(0) = 1 exactly) except on
    one episode's messages of the agent, recorded 1 nat a token less likely (π/μ = e, cut to
    exactly C = 2): the first step's gradient, Σ_t Â·w_t·∇log π(y_t) over the token mean, is
    then bit for bit that of an uncorrected update with the episode's advantage doubled (the
    same float operations on the same values: 2Â is exact), and differs from the uncorrected
    gradient of the same rollouts by that episode's whole share."""
    parts = half_parts(tmp_path, "bfloat16")
    rollouts = with_rewards(parts.sampler.sample(parts.team), [1.0, 0.0] * 8)
    updater = parts.updater
    tokens = sum(len(logps) for logps in rollouts.recorded_logps(0, parts.chat.policy).values())
    uncorrected = updater._reference_pass(parts.team, 0, rollouts, tokens)
    trainer = trainer_logps_of(uncorrected)
    episode = min(e for e, _ in trainer)
    assert rollouts.advantages[episode] != 0
    recorded = {ref: logps - 1.0 if ref[0] == episode else logps for ref, logps in trainer.items()}
    corrected = updater._reference_pass(parts.team, 0, rollouts, tokens, recorded, cap=2.0)
    advantages = rollouts.advantages.copy()
    advantages[episode] *= 2
    doubled = dataclasses.replace(rollouts, advantages=advantages)
    expected = updater._reference_pass(parts.team, 0, doubled, tokens).first_gradient
    gradient = corrected.first_gradient
    assert gradient is not None and expected is not None
    assert len(gradient) == len(expected)
    for got, want in zip(gradient, expected, strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    moved = [
        float((got - plain).abs().max())
        for got, plain in zip(gradient, uncorrected.first_gradient, strict=True)
        if got is not None
    ]
    assert max(moved) > 0.05 * max(float(g.abs().max()) for g in gradient if g is not None)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def one_token_shifted(request, tmp_path_factory):
    """A team in the precision ``request.param`` and a graded draw of it whose sampler
    recorded one token of agent 0 1 nat less likely than the trainer finds it (π/μ about e)."""
    dtype = request.param
    config = load_config(write_config(tmp_path_factory.mktemp(dtype)))
    parts = build(with_placement(config, "cpu", dtype))
    rollouts = with_rewards(parts.sampler.sample(parts.team), [1.0, 0.0] * 8)
    (e, t), logps = min(rollouts.recorded_logps(0, parts.chat.policy).items())
    shifted = logps.clone()
    shifted[0] -= 1.0
    return dtype, parts, with_sampled_logps(rollouts, e, t, shifted)


@pytest.mark.parametrize("mode", ["auto", "tis", "off"])
def test_each_correction_mode_corrects_in_the_precisions_it_documents(one_token_shifted, mode):
    """``[updater] mismatch_correction``: "tis" corrects in every precision, "off" in none,
    "auto" in half precision only, each with C = ``tis_cap``. Seen in an update whose sampler
    recorded one token 1 nat less likely than the trainer finds it (in float32
    ``ratio_tolerance`` is raised to let the check pass it): a corrected update cuts its
    weight π/μ ~ e at C = 2 (one token truncated), an uncorrected one weighs nothing."""
    dtype, parts, rollouts = one_token_shifted
    settings = dataclasses.replace(
        parts.config.updater, mismatch_correction=mode, ratio_tolerance=2.0
    )
    assert settings.tis_cap == 2.0
    updater = TrustRegionUpdater(parts.chat, settings, score_chunk=parts.updater.score_chunk)
    mismatch = updater.update(parts.team, 0, rollouts, radius=0.05).mismatch
    assert mismatch is not None and mismatch.max_gap >= 1.0 - 1e-3
    corrected = mode == "tis" or (mode == "auto" and dtype != "float32")
    assert mismatch.truncated * mismatch.tokens == pytest.approx(float(corrected), abs=1e-9)


# -- the sampler's model -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_samples_through_the_unmerged_adapter(tmp_path, dtype):
    """The sampler draws from the trainer's own layers (LoRA unmerged), not from a copy with
    W + s·BA merged and rounded to the format: its recorded log-probs lie nearer the
    trainer's than the merged copy's do, by ``sampler_margin`` (derived there from the two
    paths' gaps; measured 1e-4 and 9e-4 of the way, the line at 1/256 and 1/91)."""
    parts = half_parts(tmp_path, dtype)
    team = perturb_agent(parts.team, 0, scale=0.3, seed=3)
    rollouts = parts.sampler.sample(team)
    recorded = rollouts.recorded_logps(0, parts.chat.policy)
    assert recorded is not None, "a half-precision sampler records what it drew tokens with"
    trainer = parts.sampler.agent_logps(team, rollouts.episodes, 0)
    temperature = parts.config.sampler.temperature
    merged = full_pass_logps(
        team.generation_model(0), parts.chat, rollouts.episodes, recorded, temperature
    )

    sampler_gap, merged_gap = mean_gap(recorded, trainer), mean_gap(merged, trainer)
    assert merged_gap > 0
    margin = sampler_margin(getattr(torch, dtype))
    assert sampler_gap <= margin * merged_gap, (sampler_gap, merged_gap)
