"""The vLLM engine: one server holding the base model once and one LoRA adapter per agent.

teamtr starts vLLM's OpenAI-compatible server as a child process from vLLM's own environment
(``make vllm`` builds ``.venv-vllm``; vLLM pins a transformers older than teamtr's), or uses a
server already running (``[sampler] engine_url``, on this machine or another). The server:

- serves the base written once as a safetensors folder (``llm.sampling.engine_base``);
- loads each agent's policy at run time as a PEFT adapter folder under a name and path of its
  own, ``<tag>-p<policy>-v<version>``, and unloads the version it replaces. A new name for
  every version is what keeps it exact: a reused name keeps serving the old weights, and an
  in-place reload leaves the prefix cache serving keys and values the old adapter computed
  (measured 1.13 and 0.90 nats off); a new name is a new LoRA id, so nothing cached under
  another version is ever read;
- receives prompts as token ids (teamtr's rendering, each speaker's private notes in its own
  view only), one request per dialogue with a seed of its own, the stop token, the speaker's
  longest message, and pure sampling at the policy's temperature (no top-k, top-p, min-p or
  penalties, and ``--generation-config vllm`` so that no model default adds any);
- returns each sampled token's log-prob under softmax(logits / T)
  (``--logprobs-mode processed_logprobs``): the sampler's μ, which the trainer's check compares
  with its own pass (in float32 within float32 rounding, ~4e-5; in half precision the mismatch
  record and its correction apply as to any sampler).

Lifecycle: a guard process (``llm.sampling.engine_guard``) starts the server in a session of
its own and stops the whole group when teamtr closes the pipe between them or dies (``kill
-9`` included); ``close`` (done, error, Ctrl-C, SIGTERM, interpreter exit) closes it and waits.
The server's log is written beside teamtr's run (``engine.log`` in the run directory).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel
from safetensors.torch import save_file
from transformers import PreTrainedTokenizerBase

from llm.common.settings import SamplerSettings
from llm.conversation.dialogue import ChatFormat
from llm.models.agents import AdapterWeights, LoraBackbone, LoraTeam, slot_name, weights_dtype
from llm.sampling.engine import (
    Drawn,
    Engine,
    EngineFailed,
    EngineStartFailed,
    EngineUnavailable,
    TurnRequest,
)
from llm.sampling.engine_base import base_folder

PYTHON_ENVIRONMENT = "TEAMTR_VLLM_PYTHON"
"""The Python of an environment with vLLM installed (default: ``.venv-vllm`` of the checkout)."""
START_TIMEOUT_ENVIRONMENT = "TEAMTR_ENGINE_START_SECONDS"
START_TIMEOUT = 900.0
"""How long a server may take to answer its health check (about 50 s for a tiny model on two
CPU threads; loading a 7B model on a GPU node can take minutes)."""
REQUEST_TIMEOUT = 1800.0
KV_CACHE_GIB = "1"
"""``VLLM_CPU_KVCACHE_SPACE`` unless set: on a CPU vLLM otherwise reserves most of the memory
for keys and values; 1 GiB holds thousands of SmolLM2-135M tokens."""
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM accepts."""
ADAPTER_FILE = "adapter_model.safetensors"
SERVED_BASE = "base"
LOG_FOLDER_PREFIX = "teamtr-engine-"
"""The temporary folder of a server's log until the run directory exists."""
GUARD = Path(__file__).with_name("engine_guard.py")


def vllm_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds adapters of ``rank``."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), rank)


def vllm_python() -> Path:
    """The Python that runs the server, or ``EngineUnavailable`` saying how to install it."""
    chosen = os.environ.get(PYTHON_ENVIRONMENT)
    if chosen:
        candidates = [Path(chosen).expanduser()]
    else:
        checkout = Path(__file__).resolve().parents[2]  # llm/sampling/ -> the checkout
        candidates = [checkout / ".venv-vllm" / "bin" / "python", Path(".venv-vllm/bin/python")]
    for python in candidates:
        if python.is_file() and _has_vllm(python):
            return python
    where = f"{PYTHON_ENVIRONMENT}={chosen}" if chosen else str(candidates[0].parents[1])
    raise EngineUnavailable(
        f'[sampler] engine = "vllm": no vLLM installed at {where}; run `make vllm` (or set '
        f"{PYTHON_ENVIRONMENT} to the python of an environment that has it, or use "
        'engine = "hf")'
    )


def _has_vllm(python: Path) -> bool:
    # find_spec, not import: importing vllm takes seconds; this takes a fraction of one.
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([str(python), "-c", probe], timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vLLM 0.32's CPU attention supports (``CPUAttentionBackend``); a
model with another fails at its first request, so it is refused before the server starts."""


def require_servable_heads(model: PeftModel, python: Path) -> None:
    config: Any = model.get_base_model().config
    heads = getattr(config, "num_attention_heads", None)
    size = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    if size is None or size in CPU_HEAD_SIZES or not _is_cpu_build(python):
        return
    raise EngineUnavailable(
        f'[sampler] engine = "vllm": the model\'s attention heads have {size} dimensions; '
        f'vLLM\'s CPU attention supports {", ".join(map(str, CPU_HEAD_SIZES))} (the "tiny" '
        'test model has 8: "tiny:128x2" has 32)'
    )


def _is_cpu_build(python: Path) -> bool:
    site = python.parent.parent / "lib"
    return any(site.glob("python3*/site-packages/vllm_cpu-*.dist-info"))


def cpu_build_arguments(max_model_len: int) -> list[str]:
    """Whole prompts in one step on the CPU build. vLLM rewinds a seeded request's generator
    after a step that prefilled only part of its prompt (chunked prefill), and a CPU generator
    cannot rewind ("CPU Generator does not use offset"): the server stops at the first batch
    of prompts larger than one step. Without chunking, no prompt is split."""
    return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_model_len)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


ROOT_CAUSE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)")
WRAPPERS = ("EngineDeadError", "EngineGenerateError", "APIServerError")
"""vLLM's errors that only say another process failed first: the cause lies elsewhere."""


def last_error_line(log: Path) -> str:
    """The server's root cause: its first ``SomethingError: ...`` line that is not one of
    vLLM's wrappers (else its last line), for the one ``error:`` line teamtr prints."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [line for line in lines if line]
    for index, line in enumerate(lines):
        found = ROOT_CAUSE.search(line)
        if found and found[1] not in WRAPPERS and " WARNING " not in line:
            cause = found[0]
            following = lines[index + 1] if index + 1 < len(lines) else ""
            if following and not following.startswith(("(", "File ", "Traceback")):
                cause += f" {following}"  # pydantic's first line names only the class
            return cause[:300]
    return lines[-1][-300:] if lines else "an empty log"


class EngineServer:
    """A vLLM server process behind its guard, its log, its address."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, port: int) -> None:
        self.log = log
        self.url = f"http://127.0.0.1:{port}"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"# {shlex.join(command)}\n")
        self._guard = subprocess.Popen(
            [sys.executable, "-I", str(GUARD), str(log), "--", *command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self._guard.stdout is not None
        line = self._guard.stdout.readline().strip()
        self.server_pid = int(line) if line.isdigit() else None
        """The server's pid, also the id of its process group (tests look for its survivors)."""
        atexit.register(self.stop)

    def exit_code(self) -> int | None:
        return self._guard.poll()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                raise EngineStartFailed(
                    f'[sampler] engine = "vllm": the server stopped before it was ready (exit '
                    f"code {code}): "
                    f"{last_error_line(self.log)}; its log: {self.log}"
                )
            if healthy(self.url):
                return
            time.sleep(0.5)
        self.stop()
        raise EngineStartFailed(
            f'[sampler] engine = "vllm": the server did not answer its health check in '
            f"{timeout:.0f} s "
            f"({START_TIMEOUT_ENVIRONMENT} sets the limit); its log: {self.log}"
        )

    def move_log(self, destination: Path) -> None:
        """Put the log at ``destination`` (the server keeps writing to it: a rename keeps the
        file it writes to); where it cannot move (another file system), a link points at it."""
        if destination == self.log:
            return
        try:
            os.replace(self.log, destination)
            if self.log.parent.name.startswith(LOG_FOLDER_PREFIX):  # the temporary one
                with contextlib.suppress(OSError):
                    self.log.parent.rmdir()
            self.log = destination
        except OSError:
            with contextlib.suppress(OSError):
                destination.symlink_to(self.log)

    def stop(self) -> None:
        """Close the guard's pipe and wait until it has stopped the server's whole group."""
        guard = self._guard
        if guard.stdin is not None and not guard.stdin.closed:
            with contextlib.suppress(OSError):
                guard.stdin.close()
        try:
            guard.wait(timeout=60)
        except subprocess.TimeoutExpired:  # the guard itself is stuck: end it and the group
            if self.server_pid is not None:
                with contextlib.suppress(OSError):
                    os.killpg(self.server_pid, 9)
            guard.kill()
            guard.wait()
        if guard.stdout is not None:
            guard.stdout.close()
        atexit.unregister(self.stop)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def write_adapter(folder: Path, model: PeftModel, policy: int, weights: AdapterWeights) -> None:
    """``weights`` as a PEFT adapter folder (config and safetensors under PEFT's key names),
    written beside ``folder`` and renamed into place."""
    config = copy.deepcopy(model.peft_config[slot_name(policy)])
    assert isinstance(config, LoraConfig)  # every slot is a LoRA adapter
    config.inference_mode = True
    targets = config.target_modules
    if not isinstance(targets, str):  # full module paths; the servers match short names
        config.target_modules = sorted({name.rsplit(".", 1)[-1] for name in targets or ()})
    temporary = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    config.save_pretrained(str(temporary))
    tensors = {
        k: v.detach().to("cpu", torch.float32).contiguous() for k, v in weights.tensors.items()
    }
    save_file(tensors, str(temporary / ADAPTER_FILE), metadata={"format": "pt"})
    os.replace(temporary, folder)


class VLLMEngine:
    """Draws turns on a vLLM server (see the module's docstring)."""

    name = "vllm"

    def __init__(self, chat: ChatFormat, settings: SamplerSettings) -> None:
        self.chat = chat
        self.settings = settings
        self.server: EngineServer | None = None
        self.url = settings.engine_url.rstrip("/") or None
        self._model: PeftModel | None = None
        self._adapters: Path | None = None
        self._loaded: dict[int, tuple[int, str]] = {}
        # Names unique to this engine: a server shared by several runs (``engine_url``) never
        # sees two adapters of one name.
        self._tag = f"t{os.getpid()}{secrets.token_hex(3)}"
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        if self.url is None:
            vllm_python()  # not installed: bad input, said before anything is written

    # -- lifecycle ------------------------------------------------------------------------
    def start(
        self,
        team: LoraTeam,
        tokenizer: PreTrainedTokenizerBase,
        max_model_len: int,
        threads: int,
        log: Path | None = None,
    ) -> None:
        """Serve ``team``'s base (or check the server at ``engine_url``) and wait until ready."""
        backbone = team.backbone
        if not isinstance(backbone, LoraBackbone):
            raise EngineUnavailable(
                '[sampler] engine = "vllm" serves one base model with one adapter per agent; '
                'a team of one model per agent ([model] sources) samples with engine = "hf"'
            )
        self._model = backbone.model
        self._adapters = Path(tempfile.mkdtemp(prefix="teamtr-adapters-"))
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="engine")
        if self.url is not None:
            if not healthy(self.url):
                raise EngineStartFailed(
                    f"[sampler] engine_url = {self.url!r}: no vLLM server answers its health "
                    "check there"
                )
            return
        python = vllm_python()
        require_servable_heads(backbone.model, python)
        folder = base_folder(backbone.model, tokenizer)
        dtype = str(weights_dtype(backbone.model)).removeprefix("torch.")
        port = free_port()
        policies = team.n_agents
        lora = backbone.model.peft_config[slot_name(0)]
        assert isinstance(lora, LoraConfig)  # every slot is a LoRA adapter
        rank = int(lora.r)
        command = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(folder),
            "--served-model-name",
            SERVED_BASE,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            dtype,
            "--max-model-len",
            str(max_model_len),
            "--enable-lora",
            # One adapter per policy in a batch, and one more: the version being replaced
            # may still be in flight while its successor loads.
            "--max-loras",
            str(policies + 1),
            "--max-cpu-loras",
            str(2 * policies + 2),
            "--max-lora-rank",
            str(vllm_rank(rank)),
            "--logprobs-mode",
            "processed_logprobs",
            "--generation-config",
            "vllm",
            "--seed",
            str(self.settings.seed),
            *(cpu_build_arguments(max_model_len) if _is_cpu_build(python) else []),
            *shlex.split(self.settings.engine_args),
        ]
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        # vLLM gives one model step 300 s; a batch of prompts prefilled whole on a CPU shared
        # with training and other runs took longer, and the server stopped.
        env.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")
        # A shared CPU: the server uses the run's threads, unpinned, as teamtr itself does.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        env["OMP_NUM_THREADS"] = str(max(1, threads))
        env.pop("PYTHONPATH", None)  # teamtr's packages must not shadow vLLM's environment's
        if log is None:
            log = Path(tempfile.mkdtemp(prefix=LOG_FOLDER_PREFIX)) / "engine.log"
        self.server = EngineServer(command, env, log, port)
        timeout = float(os.environ.get(START_TIMEOUT_ENVIRONMENT, START_TIMEOUT))
        try:
            self.server.wait_ready(timeout)
        except BaseException:
            self.close()
            raise
        self.url = self.server.url

    def keep_log_in(self, run_dir: Path) -> None:
        """Move the server's log into the run directory, once that exists."""
        if self.server is not None:
            self.server.move_log(run_dir / "engine.log")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.server is not None:
            self.server.stop()
            self.url = None if not self.settings.engine_url else self.url
            self.server = None
        elif self.url is not None and self._loaded:  # a server of its own outlives the run
            for _, name in self._loaded.values():
                with contextlib.suppress(OSError, EngineFailed, RuntimeError):
                    self._post("/v1/unload_lora_adapter", {"lora_name": name})
        self._loaded.clear()
        if self._adapters is not None:
            shutil.rmtree(self._adapters, ignore_errors=True)
            self._adapters = None

    # -- the Engine protocol ------------------------------------------------------------------
    def row_seeds(self, rows: int) -> list[int]:
        # From torch's generator, which the sampler seeds once per play: a resumed run asks
        # for the same seeds as a straight one.
        return [int(s) for s in torch.randint(0, 2**31 - 1, (rows,)).tolist()]

    def draw(self, request: TurnRequest) -> Drawn:
        if self.url is None or self._pool is None:
            raise RuntimeError("the vLLM engine was not started (VLLMEngine.start)")
        name = self._adapter_name(request.team, request.policy)
        greedy = request.temperature == 0
        seeds = request.seeds or [0] * len(request.contexts)
        bodies = [
            {
                "model": name,
                "prompt": list(context),
                "max_tokens": request.max_new_tokens,
                "temperature": request.temperature,
                "top_p": 1.0,
                "top_k": -1,
                "min_p": 0.0,
                "repetition_penalty": 1.0,
                "seed": seed,
                "stop_token_ids": [self.chat.stop_id],
                # The stop token is the chat's, whatever the tokenizer calls end of text.
                "ignore_eos": True,
                "return_token_ids": True,
                "skip_special_tokens": False,
                **({} if greedy or not request.record else {"logprobs": 0}),
            }
            for context, seed in zip(request.contexts, seeds, strict=True)
        ]
        answers = list(self._pool.map(lambda body: self._post("/v1/completions", body), bodies))
        messages: list[tuple[int, ...]] = []
        logps: list[torch.Tensor] | None = [] if request.record and not greedy else None
        stop = self.chat.stop_id
        for answer in answers:
            choice = answer["choices"][0]
            tokens = [int(t) for t in choice["token_ids"]]
            cut = tokens.index(stop) + 1 if stop in tokens else len(tokens)
            messages.append(tuple(tokens[:cut]))
            if logps is not None:
                values = choice["logprobs"]["token_logprobs"][:cut]
                logps.append(torch.tensor(values, dtype=torch.float32))
        return Drawn(messages, logps)

    # -- adapters -----------------------------------------------------------------------------
    def _adapter_name(self, team: LoraTeam, policy: int) -> str:
        """The served name of ``policy``'s snapshot in ``team``, loaded on first use; the
        version it replaces is unloaded."""
        weights = team.agent(policy)
        with self._lock:
            loaded = self._loaded.get(policy)
            if loaded is not None and loaded[0] == weights.version:
                return loaded[1]
            assert self._model is not None and self._adapters is not None
            name = f"{self._tag}-p{policy}-v{weights.version}"
            folder = self._adapters / name
            write_adapter(folder, self._model, policy, weights)
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
            self._loaded[policy] = (weights.version, name)
            if loaded is not None:
                self._post("/v1/unload_lora_adapter", {"lora_name": loaded[1]})
                shutil.rmtree(self._adapters / loaded[1], ignore_errors=True)
            return name

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        assert self.url is not None
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:500]
            if error.code >= 500:
                raise self._failure(f"HTTP {error.code}: {detail}") from None
            raise RuntimeError(
                f"the vLLM server refused {path}: HTTP {error.code}: {detail}"
            ) from None
        except OSError as error:
            raise self._failure(str(getattr(error, "reason", error))) from None
        try:
            return json.loads(text) if text.strip() else {}
        except json.JSONDecodeError:
            return {"text": text}

    def _failure(self, cause: str) -> EngineFailed:
        server = self.server
        if server is not None:
            code = server.exit_code()
            if code is None:  # give a dying server a moment to be seen dead
                time.sleep(1.0)
                code = server.exit_code()
            state = f"stopped (exit code {code})" if code is not None else "failed"
            cause = last_error_line(server.log) if "500" in cause or code is not None else cause
            return EngineFailed(f"the vLLM server {state}: {cause}; its log: {server.log}")
        return EngineFailed(f"the vLLM server at {self.url} stopped answering: {cause}")


ENGINE_POSITIONS = 8192
"""The longest context a server engine is started for (its key/value cache holds at least one
of them), unless the model has fewer positions."""


def start_engine(
    engine: Engine,
    team: LoraTeam,
    tokenizer: PreTrainedTokenizerBase,
    positions: int,
    threads: int,
) -> None:
    """Start a server engine (``[sampler] engine = "vllm"``), before the run directory exists:
    a server that cannot start leaves nothing behind but its log, which the one error line
    names. Not installed, or a team it cannot serve: ``EngineUnavailable`` (bad input); a
    server that stops or never answers: ``EngineStartFailed`` (an ``OSError``, exit 2 too:
    the run has not begun). ``threads``: the server's CPU threads (0: torch's count)."""
    if isinstance(engine, VLLMEngine):
        engine.start(
            team, tokenizer, min(positions, ENGINE_POSITIONS), threads or torch.get_num_threads()
        )
