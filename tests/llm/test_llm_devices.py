"""Devices and precision: ``[run] device`` / ``[run] dtype``, device-clean runs and checkpoints.

The tests run on the CPU; ``TEAMTR_TEST_DEVICE=cuda`` (``bench/gpu_check.sh``) runs the same
tests with their models on a CUDA device instead, so a GPU machine checks the same claims.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from llm_test_support import gamma, with_rewards

from llm.common.config import RunConfig, load_config
from llm.common.devices import Placement, agent_devices, resolve_device, resolve_dtype
from llm.interface.cli import main
from llm.logprobs.scoring import chunks, message_logits, output_logits
from llm.training.builder import Components, build
from llm.training.checkpoint import ResumePoint, read_checkpoint, write_checkpoint
from teamtr.config import StageConfig
from teamtr.penalty import EpisodicPenalty
from teamtr.stage import run_stage

TEST_DEVICE = os.environ.get("TEAMTR_TEST_DEVICE", "cpu")
"""Where the device tests put their models: "cpu" here, "cuda" on a GPU machine."""

CONFIG = """
[model]
source = "tiny"
[lora]
rank = 4
[team]
n_agents = 2
system_prompt = "Solve."
[task]
kind = "jsonl"
train_file = "{data}"
test_file = "{data}"
eval_size = 4
[sampler]
prompts_per_batch = 4
group_size = 4
turns = 2
max_new_tokens = 20
[updater]
learning_rate = 1e-2
steps = 2
[stage]
radius = 0.05
update_order = "fixed"
stages = 1
[run]
output_dir = "{runs}"
eval_every = 1
checkpoint_every = 1
threads = 1
{extra}
"""


def write_config(directory: Path, extra: str = "") -> Path:
    """A tiny team on a task whose answers are all "2": the random model says it now and then,
    so rewards differ within groups and the adapters really move."""
    data = directory / "say_two.jsonl"
    data.write_text("".join(f'{{"question": "Say two ({i})", "answer": "2"}}\n' for i in range(20)))
    path = directory / "devices.toml"
    path.write_text(CONFIG.format(data=data, runs=directory / "runs", extra=extra))
    return path


def with_placement(config: RunConfig, device: str, dtype: str) -> RunConfig:
    return dataclasses.replace(
        config, run=dataclasses.replace(config.run, device=device, dtype=dtype)
    )


def one_stage(parts: Components):
    torch.manual_seed(0)
    return run_stage(
        parts.team,
        parts.sampler,
        parts.updater,
        StageConfig(scheme="teamtr", radius=0.05, order="fixed"),
        EpisodicPenalty(parts.config.sampler.turns),
    )


def test_device_and_dtype_resolve_as_documented():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason='"auto" means CUDA on this machine')
def test_explicit_cpu_float32_is_bit_identical_to_the_default(tmp_path):
    """Without a GPU, "auto" must train exactly what explicit CPU float32 trains. The same stage
    in CPU bfloat16 trains something else: the comparison would catch "auto" resolving to
    another precision (or device) rather than comparing a configuration with itself."""
    default = load_config(write_config(tmp_path))
    assert (default.run.device, default.run.dtype) == ("auto", "auto")
    runs = []
    # The bfloat16 control runs under every CPU kernel set: half precision's attention is
    # float32 (``llm.models.precision``), so torch's bfloat16 attention, which forced AVX2
    # kernels refuse on an AVX-512 CPU, is never called.
    placements = [default, with_placement(default, "cpu", "float32")]
    placements.append(with_placement(default, "cpu", "bfloat16"))
    for config in placements:
        parts = build(config)
        model = parts.team.backbone.model
        base = {p.dtype for n, p in model.named_parameters() if "lora_" not in n}
        report, team = one_stage(parts)
        runs.append((base, report, team))

    def outcome(report):
        return [(r.kept, r.update.kl, r.update.surrogate) for r in report.records]

    (base_a, first, team_a), (base_b, second, team_b) = runs[:2]
    assert base_a == base_b == {torch.float32}
    assert any(r.kept and r.update.kl > 0 for r in first.records), "nothing was trained"
    assert outcome(first) == outcome(second)
    assert all(a.equal(b) for a, b in zip(team_a.policies, team_b.policies, strict=True))
    # the other placement is seen by the same comparisons
    base_c, third, team_c = runs[2]
    assert base_c == {torch.bfloat16}
    assert outcome(third) != outcome(first)
    assert not all(a.equal(c) for a, c in zip(team_a.policies, team_c.policies, strict=True))


def test_a_half_precision_stage_keeps_adapters_log_softmax_and_kl_in_float32(tmp_path):
    config = with_placement(load_config(write_config(tmp_path)), TEST_DEVICE, "bfloat16")
    parts = build(config)
    model = parts.team.backbone.model
    base = [p for n, p in model.named_parameters() if "lora_" not in n]
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    assert {p.dtype for p in base} == {torch.bfloat16}
    assert {p.dtype for p in adapters} == {torch.float32}
    assert {p.device.type for p in model.parameters()} == {torch.device(TEST_DEVICE).type}

    rollouts = parts.sampler.sample(parts.team)
    batch = message_logits(
        parts.team.use(0), parts.chat, rollouts.episodes, 0, chunks(range(8), 8)[0], 0.7
    )
    assert batch is not None
    assert batch.logits.dtype == torch.float32 and batch.token_logps().dtype == torch.float32
    # The float32 head sees what a bfloat16 head rounds away (steps of 2^-8 relative).
    hidden = torch.randn(3, model.config.hidden_size, device=batch.logits.device)
    head = model.get_base_model().lm_head
    exact = hidden.double() @ head.weight.double().T
    ours = output_logits(head, hidden.bfloat16()).double()
    rounded_head = torch.nn.functional.linear(hidden.bfloat16(), head.weight).double()
    exact_on_bf16_input = hidden.bfloat16().double() @ head.weight.double().T
    # A float32 product of H = hidden_size terms, in whatever order the kernel sums them: within
    # gamma_H of the terms' absolute sum (llm_test_support.gamma), which the bfloat16 head's
    # rounding of its outputs (up to 2^-8 relative) exceeds.
    terms = hidden.bfloat16().double().abs() @ head.weight.double().abs().T
    tolerance = gamma(model.config.hidden_size) * terms
    assert ((ours - exact_on_bf16_input).abs() <= tolerance).all()
    assert not ((rounded_head - exact_on_bf16_input).abs() <= tolerance).all()
    assert (ours - exact).abs().max() < 0.1  # only the input's own rounding remains

    report, team = one_stage(parts)
    assert len(report.records) == 2 and all(
        r.update.kl <= 0.05 * (1 + 1e-6) for r in report.records
    )
    assert all(t.dtype == torch.float32 for p in team.policies for t in p.tensors.values())
    # Whatever the stage's own rewards were, an update with a signal moves the adapter inside
    # the radius, measured by a float32 KL on bfloat16 forward passes.
    graded = with_rewards(parts.sampler.sample(team), [1.0, 0.0] * 8)
    update = parts.updater.update(team, 0, graded, radius=0.05)
    assert update.accepted and 0 < update.kl <= 0.05
    assert update.steps >= 1


def test_generation_copy_lives_on_the_run_device_and_merges_in_float32(tmp_path):
    config = with_placement(load_config(write_config(tmp_path)), TEST_DEVICE, "bfloat16")
    parts = build(config)
    team = parts.team
    generator = torch.Generator().manual_seed(1)
    tensors = {
        k: (torch.randn(v.shape, generator=generator).to(v) * 0.1 if "lora_B" in k else v)
        for k, v in team.agent(1).tensors.items()
    }
    from llm.models.agents import AdapterWeights

    team = team.with_agent(1, AdapterWeights(tensors))
    copy = team.generation_model(1)
    assert {p.device.type for p in copy.parameters()} == {torch.device(TEST_DEVICE).type}
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    peft = team.backbone.model
    name = "model.layers.0.self_attn.q_proj"
    layer = peft.get_base_model().get_submodule(name)
    key = f"base_model.model.{name}"
    expected = layer.base_layer.weight.float() + layer.scaling["agent1"] * (
        tensors[f"{key}.lora_B.weight"] @ tensors[f"{key}.lora_A.weight"]
    )
    merged = copy.get_submodule(name).weight
    # The float32 sum W + s B A (r products, r - 1 additions, the scaling and the add of W: at
    # most r + 2 roundings a term, in any order) is within delta = gamma_{r+2} (|W| + s |B| |A|)
    # of the exact one, e; rounded once to bfloat16 (8 significant bits: unit roundoff 2^-8) it
    # moves by 2^-8 of itself at most, so |merged - e| <= 2^-8 (|e| + delta) + delta.
    lora_b = tensors[f"{key}.lora_B.weight"].double()
    lora_a = tensors[f"{key}.lora_A.weight"].double()
    scaling = layer.scaling["agent1"]
    base = layer.base_layer.weight.double()
    exact = base + scaling * (lora_b @ lora_a)
    rank = lora_a.shape[0]
    delta = gamma(rank + 2) * (base.abs() + abs(scaling) * (lora_b.abs() @ lora_a.abs()))
    bound = 2.0**-8 * (exact.abs() + delta) + delta
    assert ((merged.double() - exact).abs() <= bound).all()
    rounded_first = layer.base_layer.weight + (
        layer.scaling["agent1"]
        * (tensors[f"{key}.lora_B.weight"] @ tensors[f"{key}.lora_A.weight"])
    ).to(torch.bfloat16)
    assert (merged.float() - expected).abs().sum() <= (rounded_first.float() - expected).abs().sum()


def test_a_checkpoint_written_on_the_test_device_resumes_on_the_cpu(tmp_path):
    config = with_placement(load_config(write_config(tmp_path)), TEST_DEVICE, "float32")
    parts = build(config)
    _, team = one_stage(parts)
    # Whatever the stage's rewards were on this device, an update with a signal moves agent 0
    # and gives Adam moments to carry over.
    graded = with_rewards(parts.sampler.sample(team), [1.0, 0.0] * 8)
    update = parts.updater.update(team, 0, graded, radius=0.05)
    assert update.accepted
    team = team.with_agent(0, update.policy)
    assert any(
        not torch.equal(a.tensors[k], b.tensors[k])
        for a, b in zip(team.policies, parts.team.policies, strict=True)
        for k in a.tensors
    ), "nothing moved any adapter"
    point = ResumePoint.capture(1, team, parts.updater, parts.sampler.rng, ("{}",), 1.0)
    directory = write_checkpoint(tmp_path / "run", point)
    read = read_checkpoint(directory)
    assert all(t.device.type == "cpu" for p in read.policies for t in p.tensors.values())

    on_cpu = build(with_placement(config, "cpu", "float32"))
    restored = read.restore(on_cpu.team, on_cpu.updater, on_cpu.sampler.rng)
    for mine, original in zip(restored.policies, team.policies, strict=True):
        for key, tensor in mine.tensors.items():
            assert tensor.device.type == "cpu"
            assert torch.equal(tensor, original.tensors[key].cpu())
    for agent, optimizer in on_cpu.updater.optimizers.items():
        state = parts.updater.optimizers[agent].state_dict()["state"]
        for index, moments in optimizer.state_dict()["state"].items():
            for name, value in moments.items():
                if name == "step":
                    continue
                assert value.device.type == "cpu"
                assert torch.equal(value, state[index][name].cpu())
    report, _ = one_stage(dataclasses.replace(on_cpu, team=restored))
    assert len(report.records) == 2  # the resumed run trains on


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('device = "gpu"', '[run] device: must be "auto", "cpu", "cuda", "cuda:N" or "mps"'),
        ('device = "cuda:99"', "[run] device: device 'cuda:99' requested but"),
        ('dtype = "float8"', "[run] dtype: expected one of"),
    ],
)
def test_a_bad_or_absent_device_or_dtype_exits_2_naming_the_key(tmp_path, capsys, extra, message):
    config = write_config(tmp_path, extra)
    assert main(["train", "--config", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and message in err and "devices.toml" in err
    assert not (tmp_path / "runs").exists()


def test_the_run_config_records_device_and_dtype(tmp_path, capsys):
    config = write_config(tmp_path, f'device = "{TEST_DEVICE}"\ndtype = "float32"')
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 0
    saved = json.loads((tmp_path / "runs" / "r" / "config.json").read_text())
    assert (saved["run"]["device"], saved["run"]["dtype"]) == (TEST_DEVICE, "float32")


def test_spread_placement_maps_agent_k_to_gpu_k_mod_g_and_is_a_no_op_on_the_cpu():
    on_cuda = Placement(torch.device("cuda", 0), torch.bfloat16)
    assert agent_devices(on_cuda, 5, spread=True, cuda_devices=2) == [
        torch.device("cuda", k) for k in (0, 1, 0, 1, 0)
    ]
    assert agent_devices(on_cuda, 3, spread=False, cuda_devices=2) == [on_cuda.device] * 3
    on_cpu = Placement(torch.device("cpu"), torch.float32)
    assert agent_devices(on_cpu, 3, spread=True, cuda_devices=4) == [on_cpu.device] * 3


def test_a_spread_heterogeneous_team_trains_with_each_model_on_its_device(tmp_path):
    extra = f'device = "{TEST_DEVICE}"\nplacement = "spread"'
    text = write_config(tmp_path, extra).read_text()
    text = text.replace('source = "tiny"', 'sources = ["tiny", "tiny:16x1"]')
    config = tmp_path / "spread.toml"
    config.write_text(text)
    parts = build(load_config(config))
    expected = agent_devices(Placement(resolve_device(TEST_DEVICE), torch.float32), 2, spread=True)
    for model, device in zip(parts.team.backbone.models, expected, strict=True):
        assert {p.device for p in model.parameters()} == {device}
    graded = with_rewards(parts.sampler.sample(parts.team), [1.0, 0.0] * 8)
    for agent in (0, 1):
        update = parts.updater.update(parts.team, agent, graded, radius=0.05)
        assert update.accepted and 0 < update.kl <= 0.05
        assert {t.device for t in update.policy.tensors.values()} == {expected[agent]}


def test_spread_placement_needs_one_model_per_agent(tmp_path, capsys):
    config = write_config(tmp_path, 'placement = "spread"')
    assert main(["train", "--config", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "[run] placement" in err and "needs [model] sources" in err


def test_a_run_pinned_to_an_absent_device_resumes_with_device_override(tmp_path, capsys):
    # A run trained elsewhere on "cuda:99" (its config.json says so), stopped after stage 1.
    config = write_config(tmp_path, 'device = "cpu"').read_text()
    path = tmp_path / "two.toml"
    path.write_text(config.replace("stages = 1", "stages = 2"))
    assert main(["train", "--config", str(path), "--name", "r", "--no-progress"]) == 0
    run_dir = tmp_path / "runs" / "r"
    finished = {
        f.name: f.read_bytes() for f in (run_dir / "checkpoints" / "stage_2").glob("agent*")
    }
    shutil.rmtree(run_dir / "checkpoints" / "stage_2")
    saved = json.loads((run_dir / "config.json").read_text())
    saved["run"]["device"] = "cuda:99"
    (run_dir / "config.json").write_text(json.dumps(saved))
    capsys.readouterr()

    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "config.json: [run] device" in err and "cuda:99" in err
    assert main(["train", "--resume", str(run_dir), "--device", "cpu", "--no-progress"]) == 0
    resumed = {f.name: f.read_bytes() for f in (run_dir / "checkpoints" / "stage_2").glob("agent*")}
    assert resumed == finished  # the same stage 2, bit for bit
    assert main(["train", "--resume", str(run_dir), "--device", "gpu"]) == 2
    assert "--device: must be" in capsys.readouterr().err
