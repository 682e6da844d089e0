"""Every batch names what drew it (``Engine.drawn_by``), and each update's record carries it
beside the mismatch record it explains: the engine, the precision and the LoRA sum, the sum
whose rounding decides whether the sampling policy carries an update's small first steps."""

from __future__ import annotations

import pytest
import torch

from llm.common.config import load_config, parse_override
from llm.training.builder import build
from llm.training.stages.records import UpdateMetrics
from teamtr.config import StageConfig
from teamtr.penalty import EpisodicPenalty
from teamtr.stage import run_stage


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ([], "hf, float32"),
        (["run.dtype=bfloat16"], "hf, bfloat16, LoRA sum float32"),
        (["run.dtype=bfloat16", "lora.half_precision_sum=peft"], "hf, bfloat16, LoRA sum peft"),
    ],
    ids=["float32", "bfloat16", "bfloat16-peft"],
)
def test_a_batch_and_its_updates_record_name_the_engine_and_the_sum(overrides, named):
    config = load_config("smoke", [parse_override(f"{o}") for o in ["run.threads=1", *overrides]])
    parts = build(config, progress=False)
    torch.manual_seed(0)
    report, _ = run_stage(
        parts.team,
        parts.sampler,
        parts.updater,
        StageConfig(radius=0.05, order=(0,)),
        EpisodicPenalty(config.sampler.turns),
    )
    (record,) = report.records  # one update, of agent 0, on the batch the sampler drew for it
    assert record.rollouts.drawn_by == named
    assert UpdateMetrics.of(record).drawn_by == named
