"""What teamtr's engine and its vLLM plugin agree on: the variable that chooses the sum, the line
the plugin prints in each process it patched, and the engine's refusal of a server whose log
lacks that line (``llm/engines/vllm/engine_lora_sum.py``; a real server is refused in
tests/llm/test_llm_engine_vllm.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import teamtr_vllm_plugin
import torch
from teamtr_vllm_plugin import engine_core_fork

from llm.engines.protocol import EngineUnavailable
from llm.engines.vllm import command, engine_lora_sum


def test_the_engine_and_the_plugin_read_one_variable_with_one_set_of_choices():
    assert engine_lora_sum.ENVIRONMENT == teamtr_vllm_plugin.ENVIRONMENT
    assert set(teamtr_vllm_plugin.SUMS) == {"vllm", "stochastic"}


def test_the_engine_asks_the_plugin_for_a_forked_engine_core_by_the_plugins_variable(monkeypatch):
    """On the CPU build only (a GPU's platform is left to choose; whether a server's engine
    core was forked is read from a real server's log in test_llm_engine_vllm_lifecycle.py)."""
    assert command.ENGINE_CORE_ENVIRONMENT == engine_core_fork.ENVIRONMENT
    asked = command.cpu_build_environment()[command.ENGINE_CORE_ENVIRONMENT]
    monkeypatch.setenv(engine_core_fork.ENVIRONMENT, asked)
    assert engine_core_fork.chosen_start() == "fork"
    monkeypatch.setenv(engine_core_fork.ENVIRONMENT, "forkserver")
    with pytest.raises(ValueError, match="one of spawn, fork"):
        engine_core_fork.chosen_start()
    cpu = command.ServeCommand("base", "float32", 8, 2, cpu_build=True, max_model_len=64)
    gpu = command.ServeCommand("base", "float32", 8, 2, max_model_len=64)
    assert cpu.environment()[command.ENGINE_CORE_ENVIRONMENT] == "fork"
    assert command.ENGINE_CORE_ENVIRONMENT not in gpu.environment()


def test_the_line_the_plugin_prints_is_the_one_the_engine_looks_for():
    # The plugin's patch applied to a stand-in punica wrapper class registered under the name
    # the plugin imports, in a fresh interpreter (no vLLM in this environment).
    program = """
import sys, types
module = types.ModuleType("vllm.lora.punica_wrapper.punica_cpu")
class PunicaWrapperCPU:
    def add_expand(self, y, x, lora_b_stacked, output_slices, offset_start=0, add_inputs=True):
        y += x
module.PunicaWrapperCPU = PunicaWrapperCPU
for name in ("vllm", "vllm.lora", "vllm.lora.punica_wrapper"):
    sys.modules[name] = types.ModuleType(name)
sys.modules[module.__name__] = module
import os
os.environ["TEAMTR_VLLM_LORA_SUM"] = "stochastic"
import teamtr_vllm_plugin
teamtr_vllm_plugin.register()
"""
    printed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    ).stdout
    (found,) = engine_lora_sum.RAN.findall(printed)
    assert found[0] == "stochastic" and int(found[1]) > 0


def test_a_server_log_without_the_plugins_line_is_refused_in_half_precision_only(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("INFO api_server.py: Started server process\n")
    with pytest.raises(EngineUnavailable, match="no teamtr plugin"):
        engine_lora_sum.require_plugin(log, torch.bfloat16, "stochastic")
    engine_lora_sum.require_plugin(log, torch.bfloat16, "vllm")  # vLLM's own sum asked for
    engine_lora_sum.require_plugin(log, torch.float32, "stochastic")  # float32: nothing to add
    log.write_text("teamtr_vllm_plugin: LoRA sum 'stochastic' in process 4242 (PunicaWrapperCPU)\n")
    engine_lora_sum.require_plugin(log, torch.bfloat16, "stochastic")


def test_a_starting_server_is_refused_once_its_engine_core_logs_without_the_plugin(tmp_path):
    """While the server starts: too soon to tell before the engine core's first line (vLLM
    loads its plugins in the API server before it starts that process), refused after it."""
    log = tmp_path / "engine.log"
    log.write_text("(APIServer pid=7) INFO non-default args: {}\n")
    engine_lora_sum.require_plugin(log, torch.bfloat16, "stochastic", ready=False)
    with pytest.raises(EngineUnavailable, match="no teamtr plugin"):
        engine_lora_sum.require_plugin(log, torch.bfloat16, "stochastic")
    log.write_text(log.read_text() + "(EngineCore pid=8) INFO Initializing a V1 LLM engine\n")
    with pytest.raises(EngineUnavailable, match="no teamtr plugin"):
        engine_lora_sum.require_plugin(log, torch.bfloat16, "stochastic", ready=False)
    engine_lora_sum.require_plugin(log, torch.bfloat16, "vllm", ready=False)
    log.write_text("teamtr_vllm_plugin: LoRA sum 'stochastic' in process 7 (PunicaWrapperCPU)\n")
    log.write_text(log.read_text() + "(EngineCore pid=8) INFO Initializing a V1 LLM engine\n")
    engine_lora_sum.require_plugin(log, torch.bfloat16, "stochastic", ready=False)


def test_the_server_is_told_the_sum_only_where_it_rounds():
    assert engine_lora_sum.plugin_environment(torch.bfloat16, "stochastic") == (
        ("TEAMTR_VLLM_LORA_SUM", "stochastic"),
    )
    assert engine_lora_sum.plugin_environment(torch.bfloat16, "vllm") == ()
    assert engine_lora_sum.plugin_environment(torch.float32, "stochastic") == ()
