"""The GPU check: device tests, two stages of the default config, the throughput bench.

On a CUDA machine (``--device cuda``, the default) it runs, each part in its own process and
with its own time limit, and keeps going after a part fails (the failure is recorded):

1. ``device_tests``: the unit tests that touch devices, with their models on the GPU
   (``TEAMTR_TEST_DEVICE=cuda``);
2. ``train``: ``python -m teamtr train`` on ``configs/reference.toml`` (SmolLM2, the default batch
   sizes) for two stages in bfloat16, evaluated after the second stage;
3. ``throughput``: ``bench/llm_throughput.py --sections generation stage``: sampler tokens/s
   against raw ``generate`` on the same prompts, and one stage's wall time (teamtr vs stale);
4. ``distributed``: ``python -m teamtr train --nproc 1`` (NCCL, one rank) on the tiny model,
   when the machine has CUDA;

and, asked for by name (``--parts mismatch seeds``: each needs its own few minutes):

5. ``mismatch``: ``bench/behaviour_logp_gap.py`` in float32, bfloat16 and float16: how far the
   sampler's log-probs lie from the trainer's on the device (max, mean, KL per token against
   the precision's tolerance), with the sampler's own generation and with the merged copy;
6. ``seeds``: the precision comparison of docs/scaling_out.md ("Half precision") on the
   device: the default relay for 2 stages, seeds 0, 1, 2, in bfloat16 and float16
   (``teamtr seed-study``), for the GPU's row of the table that decides ``dtype = "auto"``;
7. ``diagnosis``: ``bench/precision_diagnosis.py`` on seed 0's first updates, float16 included:
   which rounding costs an update its signal on the device (docs/scaling_out.md, "Where
   bfloat16 loses its signal");
8. ``engine_lora_sum``: ``bench/engine_lora_sum.py`` on seed 0's first updates: the share of
   float32's change vLLM keeps in bfloat16 and float16, with vLLM's sum and teamtr's plugin's,
   on the device's own LoRA kernels (``make vllm`` first; docs/scaling_out.md, "vLLM in half
   precision").

It writes ``gpu_environment.json``, ``gpu_device_tests.json``, ``gpu_train.json``,
``gpu_throughput.json``, ``gpu_distributed.json`` and ``gpu_summary.json`` into the output
directory and prints a summary. ``--device cpu --quick`` runs the same parts on the CPU with the
tiny model (the check of the check). It needs no network and no installed package: run it from
the repository root (``bench/gpu_check.sh OUT_DIR`` sets ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEVICE_TESTS = (
    "tests/llm/test_llm_devices.py",
    # A device that does not exist, seen by the launcher and by a rank (fast, no process group).
    "tests/llm/test_llm_distributed.py::test_the_launcher_checks_the_setup_before_starting_any_rank",
    "tests/llm/test_llm_distributed.py::test_a_bad_setup_stops_every_rank_with_exit_2_and_rank_0_says_why",
)


def run_part(name: str, command: list[str], limit: float, env: dict[str, str]) -> dict[str, Any]:
    """Run one part in a child process; its status, exit code, time and the tail of its output."""
    print(f"[gpu_check] {name}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=limit
        )
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code = -1
        output = f"timed out after {limit:.0f} s\n" + _text(expired.stdout) + _text(expired.stderr)
    seconds = time.perf_counter() - started
    status = "ok" if code == 0 else "failed"
    print(f"[gpu_check] {name}: {status} (exit {code}) in {seconds:.1f} s", flush=True)
    if code != 0:
        print(output[-3000:], flush=True)
    return {"status": status, "exit_code": code, "seconds": seconds, "output_tail": output[-4000:]}


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def environment(device: str) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "cuda_available": torch.cuda.is_available(),
        "requested_device": device,
        "cpu_count": os.cpu_count(),
    }
    if torch.cuda.is_available():
        info["cuda_devices"] = [
            torch.cuda.get_device_name(k) for k in range(torch.cuda.device_count())
        ]
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
    return info


def pytest_counts(junit: Path) -> dict[str, int]:
    if not junit.is_file():
        return {}
    suite = ElementTree.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}


def device_tests(out: Path, device: str, env: dict[str, str], limit: float) -> dict[str, Any]:
    junit = out / "gpu_device_tests.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DEVICE_TESTS]
    command += [f"--junitxml={junit}", "--timeout=120"]
    result = run_part("device_tests", command, limit, {**env, "TEAMTR_TEST_DEVICE": device})
    result["test_device"] = device
    result["counts"] = pytest_counts(junit)
    return result


def train_config(out: Path, runs: Path, device: str, quick: bool) -> Path:
    """Two stages of the reference (arithmetic) config (tiny model with --quick), in bfloat16
    on ``device``."""
    lines = [
        f"extends = {json.dumps(str(REPO / 'configs' / 'reference.toml'))}",
        "[stage]",
        "stages = 2",
        "[run]",
        f"output_dir = {json.dumps(str(runs))}",
        'name = "default_two_stages"',
        f'device = "{device}"',
        'dtype = "bfloat16"',
        "eval_every = 2",
        "checkpoint_every = 2",
    ]
    if quick:
        lines += ["[model]", 'source = "tiny"', "[task]", "eval_size = 8"]
    path = out / "gpu_train.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def train(out: Path, runs: Path, device: str, quick: bool, env: dict[str, str], limit: float):
    config = train_config(out, runs, device, quick)
    command = [sys.executable, "-m", "teamtr", "train", "--config", str(config), "--no-progress"]
    result = run_part("train", command, limit, env)
    result["config"] = config.read_text()
    metrics = runs / "default_two_stages" / "metrics.jsonl"
    if metrics.is_file():
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        result["stages"] = [
            {
                key: record.get(key)
                for key in (
                    "stage",
                    "wall_seconds",
                    "sampling_seconds",
                    "generated_tokens",
                    "train_reward",
                    "certificate",
                    "eval",
                )
            }
            | {"kept": [u["kept"] for u in record["updates"]]}
            for record in records
        ]
    return result


def throughput(out: Path, device: str, quick: bool, env: dict[str, str], limit: float):
    path = out / "gpu_throughput_bench.json"
    command = [sys.executable, "bench/llm_throughput.py", "--sections", "generation", "stage"]
    command += ["--device", device, "--dtype", "auto", "--json", str(path)]
    if quick:
        command += ["--source", "tiny", "--rounds", "2"]
    result = run_part("throughput", command, limit, env)
    if path.is_file():
        result["bench"] = json.loads(path.read_text())
    return result


def distributed(
    out: Path, runs: Path, device: str, env: dict[str, str], limit: float
) -> dict[str, Any]:
    """One rank through the torch.distributed path (NCCL on CUDA, gloo on the CPU)."""
    config = out / "gpu_distributed.toml"
    config.write_text(
        "\n".join(
            [
                f"extends = {json.dumps(str(REPO / 'configs' / 'smoke.toml'))}",
                "[run]",
                f"output_dir = {json.dumps(str(runs))}",
                'name = "distributed_one_rank"',
                f'device = "{device}"',
            ]
        )
        + "\n"
    )
    command = [sys.executable, "-m", "teamtr", "train", "--config", str(config), "--nproc", "1"]
    result = run_part("distributed", command + ["--no-progress"], limit, env)
    metrics = runs / "distributed_one_rank" / "metrics.jsonl"
    if metrics.is_file():
        result["metrics_lines"] = len(metrics.read_text().splitlines())
    return result


def mismatch(out: Path, quick: bool, env: dict[str, str], limit: float) -> dict[str, Any]:
    """The sampler's log-probs against the trainer's, per precision (the run's device)."""
    result: dict[str, Any] = {"status": "ok", "exit_code": 0, "seconds": 0.0, "dtypes": {}}
    for dtype in ("float32", "bfloat16", "float16"):
        path = out / f"gpu_mismatch_{dtype}.json"
        command = [sys.executable, "bench/behaviour_logp_gap.py", "--dtype", dtype]
        command += ["--generation", "sampler", "merged", "--json", str(path)]
        command += ["--quick"] if quick else []
        part = run_part(f"mismatch {dtype}", command, limit / 3, env)
        result["seconds"] += part["seconds"]
        if part["status"] != "ok":
            result.update(status="failed", exit_code=part["exit_code"])
        result["dtypes"][dtype] = json.loads(path.read_text()) if path.is_file() else part
    return result


def seeds(out: Path, runs: Path, quick: bool, env: dict[str, str], limit: float):
    """Seeds 0-2 of the precision comparison's relay in bfloat16 and float16."""
    methods = []
    for dtype in ("bfloat16", "float16"):
        config = out / f"gpu_seeds_{dtype}.toml"
        lines = [
            f"extends = {json.dumps(str(REPO / 'configs' / 'precision' / 'relay_float32.toml'))}"
        ]
        lines += ["[run]", f'dtype = "{dtype}"']
        if quick:
            lines += ["[model]", 'source = "tiny"', "[task]", "eval_size = 8"]
        config.write_text("\n".join(lines) + "\n")
        methods += ["--method", f"{dtype}={config}"]
    command = [sys.executable, "-m", "teamtr", "seed-study", "--results", str(out / "gpu_seeds")]
    command += ["--runs", str(runs / "seeds"), "--jobs", "1", "--seeds", "0", "1", "2", *methods]
    result = run_part("seeds", command, limit, env)
    aggregate = out / "gpu_seeds.json"
    if aggregate.is_file():
        result["aggregate"] = json.loads(aggregate.read_text())
    return result


def diagnosis(out: Path, quick: bool, env: dict[str, str], limit: float) -> dict[str, Any]:
    """Where half precision loses an update's signal, on the device (seed 0's first updates):
    bench/precision_diagnosis.py with every variant, float16's included."""
    path = out / "gpu_diagnosis.json"
    command = [sys.executable, "bench/precision_diagnosis.py", "--seeds", "0", "--json", str(path)]
    command += ["--config", "smoke" if quick else "default", "--variants", *DIAGNOSIS_VARIANTS]
    result = run_part("diagnosis", command, limit, env)
    if path.is_file():
        result["summary"] = json.loads(path.read_text()).get("summary")
    return result


def engine_lora_sum(out: Path, quick: bool, env: dict[str, str], limit: float) -> dict[str, Any]:
    """Whether vLLM's policy carries seed 0's first updates on the device, where its LoRA
    kernels are others than the CPU's: bench/engine_lora_sum.py with vLLM in float32, bfloat16
    and float16, each half precision with vLLM's sum and teamtr's plugin's (needs ``make
    vllm`` on the GPU node, which installs the CUDA vllm package and the plugin)."""
    path = out / "gpu_engine_lora_sum.json"
    command = [sys.executable, "bench/engine_lora_sum.py", "--seeds", "0", "--json", str(path)]
    command += ["--config", "smoke" if quick else "default"]
    command += ["--vllm-dtypes", "float32", "bfloat16", "float16"]
    result = run_part("engine_lora_sum", command, limit, env)
    if path.is_file():
        result["seeds"] = json.loads(path.read_text()).get("seeds")
    return result


DIAGNOSIS_VARIANTS = (
    "float32",
    "bfloat16",
    "bf16-round-once",
    "bf16-float32-sum",
    "float16-float32-sum",
)


def write(out: Path, name: str, data: dict[str, Any]) -> None:
    (out / name).write_text(json.dumps(data, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the gpu_*.json results")
    parser.add_argument("--device", default="cuda", help='"cuda" (default), "cuda:N" or "cpu"')
    parser.add_argument("--quick", action="store_true", help="tiny model instead of SmolLM2")
    parser.add_argument(
        "--keep-runs", action="store_true", help="keep the run directories (checkpoints: ~0.3 GB)"
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["device_tests", "train", "throughput", "distributed"],
        choices=[
            "device_tests",
            "train",
            "throughput",
            "distributed",
            "mismatch",
            "seeds",
            "diagnosis",
            "engine_lora_sum",
        ],
    )
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONHASHSEED": "0", "HYPOTHESIS_PROFILE": "quick"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    # Run directories (SmolLM2 checkpoints are large) go to scratch space, not into ``out``.
    runs = Path(tempfile.mkdtemp(prefix="teamtr_gpu_check_"))
    started = time.perf_counter()
    summary: dict[str, Any] = {"device": args.device, "quick": args.quick, "parts": {}}
    try:
        write(out, "gpu_environment.json", environment(args.device))
    except Exception as error:  # recorded; the parts below still run
        summary["environment_error"] = repr(error)
    # Time limits (seconds): the whole check stays under ten minutes on one GPU.
    limits = {"device_tests": 120, "train": 240, "throughput": 150, "distributed": 90}
    limits |= {"mismatch": 300, "seeds": 540, "diagnosis": 400, "engine_lora_sum": 400}
    for part in args.parts:
        if part == "device_tests":
            result = device_tests(out, args.device, env, limits[part])
        elif part == "train":
            result = train(out, runs, args.device, args.quick, env, limits[part])
        elif part == "throughput":
            result = throughput(out, args.device, args.quick, env, limits[part])
        elif part == "mismatch":
            result = mismatch(out, args.quick, env, limits[part])
        elif part == "seeds":
            result = seeds(out, runs, args.quick, env, limits[part])
        elif part == "diagnosis":
            result = diagnosis(out, args.quick, env, limits[part])
        elif part == "engine_lora_sum":
            result = engine_lora_sum(out, args.quick, env, limits[part])
        else:
            result = distributed(out, runs, args.device, env, limits[part])
        write(out, f"gpu_{part}.json", result)
        summary["parts"][part] = {k: result[k] for k in ("status", "exit_code", "seconds")}
    summary["total_seconds"] = time.perf_counter() - started
    if args.keep_runs:
        summary["runs"] = str(runs)
    else:
        shutil.rmtree(runs, ignore_errors=True)
    write(out, "gpu_summary.json", summary)
    print_summary(out, summary)
    return 0 if all(p["status"] == "ok" for p in summary["parts"].values()) else 1


def print_summary(out: Path, summary: dict[str, Any]) -> None:
    print(f"\n[gpu_check] summary ({summary['total_seconds']:.0f} s, results in {out}):")
    for part, result in summary["parts"].items():
        print(f"  {part:<13} {result['status']:<7} {result['seconds']:6.1f} s")
    details = {
        name: json.loads(path.read_text())
        for name in ("device_tests", "train", "throughput")
        if (path := out / f"gpu_{name}.json").is_file()
    }
    if "device_tests" in details:
        print(f"  device tests: {details['device_tests'].get('counts')}")
    for stage in details.get("train", {}).get("stages", []):
        print(
            f"  stage {stage['stage']}: {stage['wall_seconds']:.1f} s, "
            f"{stage['generated_tokens']} tokens, reward {stage['train_reward']:.3f}, "
            f"kept {stage['kept']}, eval {stage.get('eval')}"
        )
    generation = details.get("throughput", {}).get("bench", {}).get("generation")
    if generation:
        print(
            f"  sampler {generation['sampler_tokens_per_s']:.0f} tok/s, raw generate "
            f"{generation['raw_generate_tokens_per_s']:.0f} tok/s, ratio "
            f"{generation['ratio_sampler_over_raw']:.3f}"
        )
    stage_costs = details.get("throughput", {}).get("bench", {}).get("stage")
    if stage_costs:
        print(
            f"  bench stage wall: teamtr {stage_costs['teamtr']['wall_seconds']:.1f} s, "
            f"stale {stage_costs['stale']['wall_seconds']:.1f} s"
        )


if __name__ == "__main__":
    raise SystemExit(main())
