"""The vLLM engine: one server holding the base model once and one LoRA adapter per agent.

teamtr starts vLLM's OpenAI-compatible server as a child process from vLLM's own environment
(``llm.engines.vllm.server``; its command line is ``llm.engines.vllm.command.ServeCommand``),
or uses a server already running (``[sampler] engine_url``, on this machine or another). The
server:

- serves the base written once as a safetensors folder (``llm.models.base_folder``);
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

Lifecycle: a guard process (``llm.engines.vllm.guard``) starts the server in a session of
its own and stops the whole group when teamtr closes the pipe between them or dies (``kill
-9`` included); ``close`` (done, error, Ctrl-C, SIGTERM, interpreter exit) closes it and waits.
The server's log is written beside teamtr's run (``engine.log`` in the run directory).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel
from transformers import PreTrainedTokenizerBase

from llm.common.settings import SamplerSettings
from llm.conversation.dialogue import ChatFormat
from llm.engines.protocol import (
    Drawn,
    EngineFailed,
    EngineStartFailed,
    EngineUnavailable,
    TurnRequest,
)
from llm.engines.vllm.command import ServeCommand
from llm.engines.vllm.server import (
    KV_CACHE_GIB,
    LOG_FOLDER_PREFIX,
    REQUEST_TIMEOUT,
    START_TIMEOUT,
    START_TIMEOUT_ENVIRONMENT,
    EngineServer,
    free_port,
    healthy,
    is_cpu_build,
    last_error_line,
    require_servable_heads,
    vllm_python,
)
from llm.models.adapter_folder import write_adapter
from llm.models.agents import LoraBackbone, LoraTeam, slot_name, weights_dtype
from llm.models.base_folder import base_folder

SERVED_BASE = "base"
"""The base model's name on a server the engine starts."""
ENGINE_POSITIONS = 8192
"""The longest context a server engine is started for (its key/value cache holds at least one
of them), unless the model has fewer positions."""


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
    def context_limit(self, positions: int) -> int:
        """The context the server is started for: the model's positions, at most
        ``ENGINE_POSITIONS`` (its key/value cache holds at least one context of that length)."""
        return min(positions, ENGINE_POSITIONS)

    def start(
        self,
        team: LoraTeam,
        tokenizer: PreTrainedTokenizerBase,
        positions: int,
        threads: int,
        log: Path | None = None,
    ) -> None:
        """Serve ``team``'s base (or check the server at ``engine_url``) and wait until ready,
        before the run directory exists: a server that cannot start leaves nothing behind but
        its log, which the one error line names. Not installed, or a team it cannot serve:
        ``EngineUnavailable`` (bad input); a server that stops or never answers:
        ``EngineStartFailed`` (an ``OSError``, exit 2 too: the run has not begun)."""
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
        port = free_port()
        policies = team.n_agents
        lora = backbone.model.peft_config[slot_name(0)]
        assert isinstance(lora, LoraConfig)  # every slot is a LoRA adapter
        max_model_len = self.context_limit(positions)
        command = ServeCommand(
            model=str(base_folder(backbone.model, tokenizer)),
            dtype=str(weights_dtype(backbone.model)).removeprefix("torch."),
            lora_rank=int(lora.r),
            # One adapter per policy in a batch, and one more: the version being replaced
            # may still be in flight while its successor loads.
            max_loras=policies + 1,
            max_cpu_loras=2 * policies + 2,
            runtime_lora=True,
            served_name=SERVED_BASE,
            max_model_len=max_model_len,
            cpu_build=is_cpu_build(python),
            seed=self.settings.seed,
            host="127.0.0.1",
            port=port,
            extra_arguments=tuple(shlex.split(self.settings.engine_args)),
        )
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
        env.update(command.environment())
        # vLLM gives one model step 300 s; a batch of prompts prefilled whole on a CPU shared
        # with training and other runs took longer, and the server stopped.
        env.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")
        # A shared CPU: the server uses the run's threads, unpinned, as teamtr itself does.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        env["OMP_NUM_THREADS"] = str(max(1, threads or torch.get_num_threads()))
        env.pop("PYTHONPATH", None)  # teamtr's packages must not shadow vLLM's environment's
        if log is None:
            log = Path(tempfile.mkdtemp(prefix=LOG_FOLDER_PREFIX)) / "engine.log"
        self.server = EngineServer(command.module_command(str(python)), env, log, port)
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
    @contextlib.contextmanager
    def drawing(self, team: LoraTeam, continues: bool) -> Iterator[None]:
        yield  # the server keeps its own prefix cache, keyed by each adapter's name

    def draw(self, request: TurnRequest) -> Drawn:
        if self.url is None or self._pool is None:
            raise RuntimeError("the vLLM engine was not started (VLLMEngine.start)")
        # One seed a request, from torch's generator, which the sampler seeds once per play:
        # a replayed play (a resumed run) asks for the same seeds as the straight one.
        seeds = torch.randint(0, 2**31 - 1, (len(request.contexts),)).tolist()
        name = self._adapter_name(request.team, request.policy)
        greedy = request.temperature == 0
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
            for context, seed in zip(request.contexts, map(int, seeds), strict=True)
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
