"""Where a run's tensors live and in which precision: ``[run] device`` and ``[run] dtype``.

``device``: "auto" (CUDA when available, else the CPU), "cpu", "cuda" (the current CUDA
device), "cuda:N" or "mps". ``dtype``: "auto" (bfloat16 on CUDA and on a CPU whose torch
kernels use AMX, float32 elsewhere; ``auto_dtype``), "float32", "bfloat16" or "float16". The
dtype is that of the base model's weights; LoRA adapters and their Adam state stay in float32
(PEFT keeps adapters of a half-precision base in float32), and every log-softmax and KL is
computed in float32 whatever the model dtype (``llm.logprobs.scoring``, ``llm.logprobs.losses``).

A CPU run with the defaults on a CPU without AMX is exactly the float32 CPU run it always was:
nothing is moved or cast.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from llm.common.rules import DEVICE_CHOICES, DEVICE_PATTERN

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class DeviceNotAvailableError(RuntimeError):
    """The configured device does not exist on this machine; the message says what does."""


@dataclass(frozen=True)
class Placement:
    """The resolved device and weight dtype of a run."""

    device: torch.device
    dtype: torch.dtype
    dtype_reason: str = ""
    """Why ``dtype`` is what it is (what ``dtype = "auto"`` saw, or that it was asked for)."""

    @property
    def is_cpu_float32(self) -> bool:
        return self.device.type == "cpu" and self.dtype == torch.float32


def cuda_device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Random draws inside seeded with ``seed`` on the CPU and every CUDA device, and torch's
    global generators put back as they were afterwards. Hugging Face ``generate`` and PEFT's
    adapter initialisation draw from the global generators and take no generator of their own:
    this keeps their seeding from reaching any other draw of the process (the one global
    seeding is the run's, ``llm.training.builder.seed_everything``)."""
    with torch.random.fork_rng(devices=range(cuda_device_count())):
        torch.manual_seed(seed)
        yield


def resolve_device(spec: str) -> torch.device:
    """The torch device that ``spec`` names; raises DeviceNotAvailableError if it is absent."""
    if not DEVICE_PATTERN.fullmatch(spec):
        raise DeviceNotAvailableError(f"device {spec!r}: expected {DEVICE_CHOICES}")
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if cuda_device_count() else _cpu()
    if spec == "cpu":
        return _cpu()
    if spec == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceNotAvailableError("device 'mps' requested but MPS is not available here")
        return torch.device("mps")
    count = cuda_device_count()
    if count == 0:
        built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA"
        raise DeviceNotAvailableError(
            f"device {spec!r} requested but no CUDA device is available (torch "
            f'{torch.__version__}, built {built}); use device = "cpu" or "auto"'
        )
    index = torch.cuda.current_device() if spec == "cuda" else int(spec.split(":")[1])
    if index >= count:
        raise DeviceNotAvailableError(
            f"device {spec!r} requested but this machine has {count} CUDA device(s): "
            f"cuda:0 to cuda:{count - 1}"
        )
    return torch.device("cuda", index)


def _cpu() -> torch.device:
    return torch.device("cpu")


CPU_AUTO_DTYPE_VARIABLE = "TEAMTR_CPU_AUTO_DTYPE"
"""Environment variable naming what ``dtype = "auto"`` picks on a CPU, whatever the CPU
("float32" or "bfloat16"): the test suite sets it to float32 so that its results do not depend
on whether the machine that runs it has AMX."""


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str


def auto_cpu_dtype(capability: str, amx_bf16: bool) -> DtypeChoice:
    """What ``dtype = "auto"`` picks on a CPU whose torch kernel level is ``capability``
    (``torch.backends.cpu.get_cpu_capability()``: "AVX512", "AVX2", "DEFAULT", ...) and whose
    cores have AMX's bfloat16 tiles or not (``amx_bf16``).

    bfloat16 where both hold: AMX's bfloat16 products are several times float32's, a stage
    costs markedly less, and with the float32 LoRA sum an update keeps all of float32's change.
    Without AMX the products gain far less and the stage is not worth the rounding (the
    measurements, with their commands: docs/scaling_out.md, "What dtype = "auto" picks").
    ``ATEN_CPU_CAPABILITY=avx2`` (or ``default``) lowers the kernel level: then no AMX."""
    if capability.upper() != "AVX512":
        return DtypeChoice(
            torch.float32, f"CPU, torch kernels at {capability} (AMX needs AVX512): float32"
        )
    if not amx_bf16:
        return DtypeChoice(torch.float32, "CPU without AMX bfloat16 tiles: float32")
    return DtypeChoice(
        torch.bfloat16, "CPU with AMX bfloat16 tiles, torch kernels at AVX512: bfloat16"
    )


def cpu_auto_dtype() -> DtypeChoice:
    """``auto_cpu_dtype`` for this machine as torch sees it, or what ``TEAMTR_CPU_AUTO_DTYPE``
    names."""
    pinned = os.environ.get(CPU_AUTO_DTYPE_VARIABLE, "")
    if pinned:
        if pinned not in ("float32", "bfloat16"):
            raise DeviceNotAvailableError(
                f"{CPU_AUTO_DTYPE_VARIABLE}={pinned!r}: expected float32 or bfloat16"
            )
        return DtypeChoice(DTYPES[pinned], f"CPU, {CPU_AUTO_DTYPE_VARIABLE}={pinned}: {pinned}")
    capabilities = torch.cpu.get_capabilities()
    return auto_cpu_dtype(
        torch.backends.cpu.get_cpu_capability(), bool(capabilities.get("amx_bf16", False))
    )


def auto_dtype(device: torch.device) -> DtypeChoice:
    """What ``dtype = "auto"`` picks on ``device``: bfloat16 on CUDA, ``cpu_auto_dtype`` on the
    CPU, float32 elsewhere."""
    if device.type == "cuda":
        return DtypeChoice(torch.bfloat16, "CUDA: bfloat16")
    if device.type == "cpu":
        return cpu_auto_dtype()
    return DtypeChoice(torch.float32, f"{device.type}: float32")


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``spec`` as a torch dtype; "auto" as ``auto_dtype`` says."""
    return dtype_choice(spec, device).dtype


def dtype_choice(spec: str, device: torch.device) -> DtypeChoice:
    """``spec`` as a torch dtype, with the reason for it."""
    if spec == "auto":
        return auto_dtype(device)
    if spec not in DTYPES:
        raise DeviceNotAvailableError(f"dtype {spec!r}: expected auto or one of {list(DTYPES)}")
    return DtypeChoice(DTYPES[spec], f"dtype = {spec!r} in the config")


def resolve_placement(device: str, dtype: str) -> Placement:
    resolved = resolve_device(device)
    choice = dtype_choice(dtype, resolved)
    return Placement(resolved, choice.dtype, choice.reason)


def agent_devices(
    placement: Placement, n_agents: int, spread: bool, cuda_devices: int | None = None
) -> list[torch.device]:
    """The device of each agent's model: all on ``placement.device``, or, when ``spread`` and
    the run is on CUDA, agent k on ``cuda:(k mod G)`` for the ``cuda_devices`` = G devices."""
    if not spread or placement.device.type != "cuda":
        return [placement.device] * n_agents
    count = cuda_device_count() if cuda_devices is None else cuda_devices
    return [torch.device("cuda", k % count) for k in range(n_agents)]


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter (all of a model's parameters share it here)."""
    return next(model.parameters()).device


def cuda_rng_states() -> list[torch.Tensor]:
    """Every CUDA generator's state (empty where CUDA is not initialised), for checkpoints."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return []
    return [state.cpu() for state in torch.cuda.get_rng_state_all()]


def restore_cuda_rng_states(states: list[torch.Tensor]) -> None:
    """Restore what ``cuda_rng_states`` saved, when this machine has the same CUDA devices.

    Every generation reseeds all generators from the sampler's generator (``llm.sampling.sampler``), so a
    run that resumes on another device (or another number of them) loses nothing by skipping it.
    """
    if states and cuda_device_count() == len(states):
        torch.cuda.set_rng_state_all(states)
