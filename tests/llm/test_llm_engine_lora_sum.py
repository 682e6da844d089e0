"""teamtr's vLLM plugin in a real vLLM engine (``make vllm``; skipped without ``.venv-vllm``).

``bench/engine_lora_sum.py`` on the tiny model: one batch, each agent's first update, and every
message token's log-prob teacher-forced under the base and the updated adapter, by teamtr's own
float32 pass (the reference change), by teamtr's bfloat16 model with its exact sums, and by
offline vLLM engines in float32 and bfloat16, with vLLM's own sum and with the plugin's
stochastic one. The tiny model's first step (learning rate 1e-2) is so large that no rounding
loses it (every sum keeps 1.00 of it); SmolLM2's first updates are small against its layers'
outputs, where vLLM's sum loses most of them (0.25 and 0.58 kept on seed 0, docs/scaling_out.md).
The update's B is scaled by ``SCALE`` to bring the tiny model's branch to that size: there
PEFT's sum and vLLM's keep 0.2 to 0.4 of the change.

At that size the change (about 1e-3 nats a token) is no larger than the rounding noise of the
rest of a bfloat16 forward pass (about 1e-3 a token too, and mostly deterministic: more passes
of the stochastic sum do not average it away), so a share is known only to within that noise's
projection: 0.07 and 0.14 (one standard error) for the two agents on an AMD EPYC without AMX,
where the plugin keeps 0.98 and 1.21. The tests compare every share with its own standard
error over the batch's messages, measured in the same run, not with another engine's distance
from 1 (teamtr's bfloat16 model rounds other values, its noise points elsewhere).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import t as student_t

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("TEAMTR_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
SCALE = 2.0**-6
REPEATS = 1
"""One pass of the plugin's sum: its rounding hashes each value's bits (``teamtr_vllm_plugin``),
so a repeat of the same request rounds to the same bits and adds nothing; the noise the checks
allow for is the messages' (clustered standard errors below)."""
CONFIG = """
extends = "{smoke}"
[sampler]
prompts_per_batch = 4
group_size = 4
max_new_tokens = 12
"""
"""The smoke team on a batch of 16 dialogues (up to 384 message tokens), whose first batch holds
a reward signal for both agents, so that both first updates move."""
pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.is_file(), reason="no vLLM environment (`make vllm` builds .venv-vllm)"
)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("lora-sum")
    config = folder / "lora_sum.toml"
    config.write_text(CONFIG.format(smoke=(REPO / "configs" / "smoke.toml").as_posix()))
    out = folder / "lora_sum.json"
    command = [sys.executable, str(REPO / "bench" / "engine_lora_sum.py"), "--config", str(config)]
    command += ["--seeds", "0", "--scale-update", str(SCALE), "--repeats", str(REPEATS)]
    command += ["--vllm-dtypes", "float32", "bfloat16", "--json", str(out)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TEAMTR_VLLM_PYTHON": str(VLLM_PYTHON)}
    result = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    (seed,) = json.loads(out.read_text())["seeds"]
    return seed


PLUGIN = "vllm bfloat16, stochastic sum (teamtr's plugin)"
VLLM_SUM = "vllm bfloat16, vLLM's sum"
FALSE_ALARM = 1e-3
"""The chance that an agent's check fails with a plugin that keeps the change on average."""


def standard_errors(messages: int) -> float:
    """How many of its standard errors an unbiased share may lie from 1 (or a difference from
    0): the estimate's error over its standard error, clustered by message, is t-distributed
    with ``messages`` - 1 degrees of freedom; 4.07 for an agent's 16 messages here."""
    return float(student_t.isf(FALSE_ALARM / 2, messages - 1))


def test_the_plugin_runs_in_the_engine_process_only_where_asked(measured):
    rows = measured["variants"]
    stochastic, plain = rows[PLUGIN], rows[VLLM_SUM]
    # Where the model computed (a function run on the model itself said which process, and
    # what sum its own LoRA layers call), the plugin ran and patched that sum; without it asked
    # for, no process ran it and the model's layers call vLLM's own sum.
    model = stochastic["model_sum"]
    assert model["process"] in stochastic["plugin_processes"], (model, stochastic)
    assert model["wrappers"] and model["patched"], model
    assert plain["plugin_processes"] == [] and not plain["model_sum"]["patched"], plain


def test_bfloat16_with_the_plugin_keeps_the_change_and_without_it_does_not(measured):
    rows = measured["variants"]
    stochastic, plain = rows[PLUGIN], rows[VLLM_SUM]
    for agent in ("0", "1"):
        kept = stochastic[agent]
        bound = standard_errors(kept["messages"])
        allowed = bound * kept["kept_se_messages"]
        # The measurement tells keeping all of the change from keeping none of it ...
        assert allowed < 1, (agent, kept, allowed)
        # ... and the plugin keeps all of it, within its share's noise.
        assert abs(kept["kept"] - 1) <= allowed, (agent, kept, allowed)
        # vLLM's own sum rounds the branch away: it keeps less than the plugin on the same
        # tokens, by more than the noise of that difference. Paired, because the two engines
        # round the same base activations and share much of their noise (the difference's
        # standard error is about half of either share's).
        gain = stochastic["over_vllm_sum"][agent]
        assert gain["gain"] > bound * gain["gain_se_messages"], (agent, gain, plain[agent])


def test_float32_serving_is_untouched_bit_for_bit(measured):
    # The same float32 engine with the plugin asked for: every log-prob the same, to the bit.
    assert measured["float32_untouched_by_plugin"] is True
    # The plugin did run there, in the model's process, with the model's sum patched: it is
    # the patch that leaves float32 alone, not a patch that never ran.
    with_plugin = measured["variants"]["vllm float32, stochastic sum (teamtr's plugin)"]
    assert with_plugin["model_sum"]["process"] in with_plugin["plugin_processes"], with_plugin
    assert with_plugin["model_sum"]["patched"], with_plugin
