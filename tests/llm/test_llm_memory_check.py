"""A run that cannot fit in memory is refused at ``--check`` time, with the keys that size it."""

from __future__ import annotations

import pytest
import torch
from test_llm_config_ranges import check, smoke_with

from llm.common.config import load_config
from llm.models.agents import LoraBackbone, LoraSettings
from llm.models.loading import tiny_llama
from llm.models.memory import available_bytes, estimate, model_shape


def test_the_estimated_shapes_match_the_models_that_load():
    model = tiny_llama(99, hidden=64, layers=3)
    real = sum(p.numel() for p in model.parameters())
    shape = model_shape("tiny:64x3")
    assert shape is not None and abs(shape.parameters - real) <= 0.01 * real  # norms aside
    backbone = LoraBackbone.create(model, 1, LoraSettings(rank=4), seed=0)
    adapter = sum(v.numel() for v in backbone.parameters_of(0).values())
    assert shape.lora_parameters(4) == adapter


def test_the_smoke_run_fits_and_counts_every_part(tmp_path):
    config = load_config(smoke_with(tmp_path, "run", "seed = 1"))
    needed = estimate(config, torch.float32.itemsize)
    assert needed is not None and all(size > 0 for size in needed.parts.values())
    assert needed.total < 64 * 2**20
    two = estimate(config, torch.float32.itemsize, processes=2)
    assert two is not None and two.total == 2 * needed.total


@pytest.mark.parametrize(
    ("section", "lines", "key"),
    [
        ("model", 'source = "tiny:8192x64"', "[model] source"),  # ~150 GiB of weights
        ("sampler", "prompts_per_batch = 100000\ngroup_size = 1000", "prompts_per_batch"),
    ],
)
def test_a_run_too_large_for_the_memory_is_refused(tmp_path, capsys, section, lines, key):
    path = smoke_with(tmp_path, section, lines)
    path.write_text(path.read_text().replace("[run]\n", '[run]\ndevice = "cpu"\n'))
    _skip_unless_it_exceeds_this_machine(path)
    code, err = check(path, capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {path}: the run needs at least ")
    assert "GiB available" in err and key in err
    assert not (tmp_path / "runs").exists()


def test_many_separate_models_are_refused_before_any_loads(tmp_path, capsys):
    sources = ", ".join(['"tiny:2048x32"'] * 8)
    path = smoke_with(tmp_path, "team", "n_agents = 8\nrole_prompts = []")
    text = path.read_text().replace("turns = 2\n", "turns = 8\n")
    path.write_text(text.replace("[model]\n", f"[model]\nsources = [{sources}]\n"))
    _skip_unless_it_exceeds_this_machine(path)
    code, err = check(path, capsys)
    assert code == 2 and "[model] source/sources" in err and "[team] n_agents" in err


def _skip_unless_it_exceeds_this_machine(path) -> None:
    """Skip only where the example is not too large: where this machine's free memory is
    unknown, or larger than the example's own estimate (float32 weights)."""
    from llm.common.config import load_config

    available = available_bytes("cpu")
    needed = estimate(load_config(path), 4)
    if available is None or needed is None or needed.total <= available:
        pytest.skip("this machine's free memory is unknown or holds the example")
