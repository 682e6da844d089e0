"""``dtype = "auto"`` on a CPU: bfloat16 where torch's kernels run at AVX512 on cores with AMX
bfloat16 tiles, float32 elsewhere (``llm.common.devices.auto_dtype``), and the run records
which it picked and why. The rest of the suite pins float32 (tests/conftest.py); these tests
lift the pin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from llm_test_support import SMOKE

from llm.common.devices import (
    CPU_AUTO_DTYPE_VARIABLE,
    DeviceNotAvailableError,
    auto_cpu_dtype,
    auto_dtype,
    resolve_placement,
)
from llm.interface.cli import main


@pytest.mark.parametrize(
    ("capability", "amx_bf16", "expected"),
    [
        ("AVX512", True, torch.bfloat16),
        ("AVX512", False, torch.float32),
        ("AVX2", True, torch.float32),  # ATEN_CPU_CAPABILITY=avx2 on an AMX CPU
        ("DEFAULT", True, torch.float32),
        ("SVE256", False, torch.float32),
    ],
)
def test_auto_picks_bfloat16_only_on_amx_at_avx512(capability, amx_bf16, expected):
    choice = auto_cpu_dtype(capability, amx_bf16)
    assert choice.dtype == expected
    assert str(expected).removeprefix("torch.") in choice.reason


def test_cuda_stays_bfloat16_and_other_devices_float32():
    assert auto_dtype(torch.device("cuda", 0)).dtype == torch.bfloat16
    assert auto_dtype(torch.device("mps")).dtype == torch.float32


def _auto_in_fresh_process(**environment: str) -> str:
    """What ``dtype = "auto"`` resolves to on the CPU in a fresh interpreter (torch reads
    ATEN_CPU_CAPABILITY once, when it loads), without the suite's pin."""
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY",)}
    env.pop(CPU_AUTO_DTYPE_VARIABLE, None)
    env.update(environment)
    script = (
        "from llm.common.devices import resolve_placement\n"
        "p = resolve_placement('cpu', 'auto')\n"
        "print(str(p.dtype).removeprefix('torch.'), '|', p.dtype_reason)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _cpuinfo_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo to compare torch's view with")
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("/proc/cpuinfo lists no flags")


def test_this_cpu_as_torch_sees_it_and_avx2_kernels_mean_no_amx():
    """The real detection, both ways on one machine: at torch's own kernel level, bfloat16
    exactly where the kernel's cpuinfo lists amx_bf16 (an x86 CPU with AMX has AVX-512);
    under ATEN_CPU_CAPABILITY=avx2, float32 whatever the CPU."""
    flags = _cpuinfo_flags()
    native = _auto_in_fresh_process()
    expected = "bfloat16" if {"amx_bf16", "avx512f"} <= flags else "float32"
    assert native.split(" | ")[0] == expected, native
    lowered = _auto_in_fresh_process(ATEN_CPU_CAPABILITY="avx2")
    assert lowered.startswith("float32 | "), lowered
    if "avx2" in flags:
        assert "AVX2" in lowered


def test_the_pin_overrides_the_cpu_and_is_checked(monkeypatch):
    # tests/conftest.py pins the suite under this very name (a typo there would leave every
    # test on an AMX machine in bfloat16).
    assert os.environ.get(CPU_AUTO_DTYPE_VARIABLE) == "float32"
    monkeypatch.setenv(CPU_AUTO_DTYPE_VARIABLE, "bfloat16")
    assert resolve_placement("cpu", "auto").dtype == torch.bfloat16
    monkeypatch.setenv(CPU_AUTO_DTYPE_VARIABLE, "float32")
    assert resolve_placement("cpu", "auto").dtype == torch.float32
    assert resolve_placement("cpu", "bfloat16").dtype == torch.bfloat16  # asked for: kept
    monkeypatch.setenv(CPU_AUTO_DTYPE_VARIABLE, "float64")
    with pytest.raises(DeviceNotAvailableError, match="float64"):
        resolve_placement("cpu", "auto")


def test_a_run_records_the_dtype_auto_picked_and_why(tmp_path, monkeypatch):
    """The tiny smoke run with ``dtype = "auto"``, the CPU's choice set to bfloat16: its
    started event names bfloat16 and the reason, and the resumed run says it again."""
    config = tmp_path / "smoke.toml"
    text = SMOKE.read_text().replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')
    config.write_text(text.replace("stages = 2", "stages = 1"))
    monkeypatch.setenv(CPU_AUTO_DTYPE_VARIABLE, "bfloat16")
    assert main(["train", "--config", str(config), "--name", "r", "--no-progress"]) == 0
    run_dir = tmp_path / "runs" / "r"
    assert json.loads((run_dir / "config.json").read_text())["run"]["dtype"] == "auto"
    monkeypatch.setenv(CPU_AUTO_DTYPE_VARIABLE, "float32")  # resumed on a CPU without AMX
    resume = ["train", "--resume", str(run_dir), "--no-progress", "--set", "stage.stages=2"]
    assert main(resume) == 0
    logged = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    started = next(e for e in logged if e["event"] == "started")
    assert (started["device"], started["dtype"]) == ("cpu", "bfloat16")
    assert CPU_AUTO_DTYPE_VARIABLE in started["dtype_reason"]
    resumed = next(e for e in logged if e["event"] == "resumed")
    assert resumed["dtype"] == "float32"
