"""The vLLM engine: one server holding the base model once and one LoRA adapter per agent.

teamtr starts vLLM's OpenAI-compatible server as a child process from vLLM's own environment
(``llm.engines.vllm.server``; its command line is ``llm.engines.vllm.command.ServeCommand``),
listening on a socket file only the run's user can open and letting in only requests with a
key drawn for the run; or it uses a server already running (``[sampler] engine_url``, on this
machine or another, its key from the environment), checked by a probe before training
(``llm.engines.vllm.probe``). The server:

- serves the base written once as a safetensors folder (``llm.models.base_folder``);
- loads each agent's policy at run time as a PEFT adapter folder under a name and path of its
  own, ``<tag>-p<policy>-v<version>``, after unloading the version it replaces. A new name
  for every version is what keeps it exact: a reused name keeps serving the old weights, and
  a name reloaded from the same path leaves the prefix cache serving keys and values the old
  adapter computed (vLLM keys cached blocks by an adapter's name and path; how far off each
  served then, in docs/scaling_out.md, "Rollouts on vLLM"); under a new name nothing cached
  for another version is ever read;
- receives prompts as token ids (teamtr's rendering, each speaker's private notes in its own
  view only), one request per dialogue with a seed of its own (a coupled row's,
  ``TurnRequest.seeds``, where it has one), the stop token, the speaker's
  longest message, and pure sampling at the policy's temperature (no top-k, top-p, min-p or
  penalties, and ``--generation-config vllm`` so that no model default adds any);
- returns each sampled token's log-prob under softmax(logits / T)
  (``--logprobs-mode processed_logprobs``): the sampler's μ, which the trainer's check compares
  with its own pass (in float32 to float32's rounding, measured in docs/scaling_out.md,
  "Rollouts on vLLM"; in half precision the mismatch record and its correction apply as to
  any sampler).

Lifecycle: a guard process (``llm.engines.vllm.guard``) starts the server in a session of
its own and stops the whole group when teamtr closes the pipe between them or dies (``kill
-9`` included); ``close`` (done, error, Ctrl-C, SIGTERM, interpreter exit) closes it and waits.
The server's log is written beside teamtr's run (``engine.log`` in the run directory).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shlex
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
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
    EngineUnavailable,
    TurnRequest,
)
from llm.engines.vllm.command import ServeCommand
from llm.engines.vllm.completions import completion_body
from llm.engines.vllm.engine_lora_sum import plugin_environment, require_plugin, sum_of
from llm.engines.vllm.installation import is_cpu_build, require_servable_heads, vllm_python
from llm.engines.vllm.probe import check_served_adapters, check_served_policy, engine_key
from llm.engines.vllm.server import (
    ADAPTER_FOLDER,
    KV_CACHE_GIB,
    LOG_FOLDER,
    REQUEST_TIMEOUT,
    SOCKET_FOLDER,
    START_TIMEOUT,
    START_TIMEOUT_ENVIRONMENT,
    EngineServer,
    last_error_line,
    owned_folder,
    remove_dead_owners_folders,
)
from llm.engines.vllm.server_address import ServerAddress, ServerRefused
from llm.models.adapter_folder import write_adapter
from llm.models.agents import LoraBackbone, LoraTeam, slot_name, weights_dtype
from llm.models.base_folder import base_folder
from llm.models.precision import HALF_DTYPES

SERVED_BASE = "base"
"""The base model's name on a server the engine starts."""
ENGINE_POSITIONS = 8192
"""The longest context a server engine is started for (its key/value cache holds at least one
of them), unless the model has fewer positions."""


class VLLMEngine:
    """Draws turns on a vLLM server (see the module's docstring)."""

    name = "vllm"

    def __init__(
        self, chat: ChatFormat, settings: SamplerSettings, served: Sequence[str] = ()
    ) -> None:
        self.chat = chat
        self.settings = settings
        self.served = tuple(served)
        """With ``engine_url``: the names the server already serves each policy's adapter under
        (an export's ``agent0``, ...), drawn from as they are, never loaded nor unloaded; empty:
        the engine loads each version of the team's adapters itself."""
        self.server: EngineServer | None = None
        self.address: ServerAddress | None = None
        """Where the server listens and its key: set by ``start``."""
        self._model: PeftModel | None = None
        self._adapters: Path | None = None
        self._loaded: dict[int, tuple[int, str]] = {}
        # Names unique to this engine: a server shared by several runs (``engine_url``) never
        # sees two adapters of one name.
        self._tag = f"t{os.getpid()}{secrets.token_hex(3)}"
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._socket_folder: Path | None = None
        self.base: Path | None = None
        """The base model's folder a server of the run's own serves."""
        if not settings.engine_url:
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
        remove_dead_owners_folders()  # what a run killed before its close left behind
        self._adapters = owned_folder(ADAPTER_FOLDER)
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="engine")
        try:
            if self.settings.engine_url:
                url = self.settings.engine_url.rstrip("/")
                self.address = ServerAddress(url, engine_key(self.settings))
                lora = self._model.peft_config[slot_name(0)]
                assert isinstance(lora, LoraConfig)  # every slot is a LoRA adapter
                load = functools.partial(self._adapter_name, team, 0)
                if self.served:
                    check_served_adapters(self.address, self.served, team, self.chat, self.settings)
                else:
                    check_served_policy(self.address, load, team, self.chat, self.settings, lora.r)
            else:
                self._start_server(team, tokenizer, positions, threads, log)
        except BaseException:
            self.close()
            raise

    def _start_server(
        self,
        team: LoraTeam,
        tokenizer: PreTrainedTokenizerBase,
        positions: int,
        threads: int,
        log: Path | None,
    ) -> None:
        """Start a server of the run's own: on a socket file in a folder only this user opens
        (no port another process could hold or take first), with a key drawn for this run
        (``secrets``) that every request carries."""
        assert self._model is not None
        python = vllm_python()
        require_servable_heads(self._model, python)
        policies = team.n_agents
        lora = self._model.peft_config[slot_name(0)]
        assert isinstance(lora, LoraConfig)  # every slot is a LoRA adapter
        max_model_len = self.context_limit(positions)
        self._socket_folder = owned_folder(SOCKET_FOLDER)
        self.base = base_folder(self._model, tokenizer)
        base = str(self.base)
        dtype = weights_dtype(self._model)
        command = ServeCommand(
            model=base,
            dtype=str(dtype).removeprefix("torch."),
            lora_rank=int(lora.r),
            # One adapter per policy in a batch, and one more as room while versions change.
            max_loras=policies + 1,
            max_cpu_loras=2 * policies + 2,
            runtime_lora=True,
            served_name=SERVED_BASE,
            max_model_len=max_model_len,
            cpu_build=is_cpu_build(python),
            seed=self.settings.seed,
            socket_path=str(self._socket_folder / "engine.sock"),
            key=secrets.token_urlsafe(32),
            extra_arguments=tuple(shlex.split(self.settings.engine_args)),
            # teamtr's vLLM plugin reads its sum from the server's environment.
            extra_environment=plugin_environment(dtype, self.settings.engine_lora_sum),
        )
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
        env.update(command.environment())
        # vLLM limits one model step's time; a batch of prompts prefilled whole on a CPU shared
        # with training and other runs can take longer, and the server stops (docs/scaling_out.md,
        # "Rollouts on vLLM").
        env.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")
        # A shared CPU: the server uses the run's threads, unpinned, as teamtr itself does.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        env["OMP_NUM_THREADS"] = str(max(1, threads or torch.get_num_threads()))
        env.pop("PYTHONPATH", None)  # teamtr's packages must not shadow vLLM's environment's
        if log is None:
            log = owned_folder(LOG_FOLDER) / "engine.log"
        address = ServerAddress(f"unix:{command.socket_path}", command.key)
        self.server = EngineServer(command.module_command(str(python)), env, log, address)
        choice = self.settings.engine_lora_sum
        self.server.wait_ready(
            float(os.environ.get(START_TIMEOUT_ENVIRONMENT, START_TIMEOUT)),
            base,
            check=lambda: require_plugin(log, dtype, choice, ready=False),
        )
        self.address = address
        require_plugin(log, dtype, choice)

    def drawn_by(self, team: LoraTeam) -> str:
        assert self._model is not None, "drawn_by before start"
        dtype = weights_dtype(self._model)
        name = str(dtype).removeprefix("torch.")
        if self.settings.engine_url:  # a server of its own: teamtr cannot see how it sums
            if dtype not in HALF_DTYPES:
                return f"vllm at engine_url, {name}"
            return f"vllm at engine_url, {name}, LoRA sum as that server runs it"
        lora_sum = sum_of(dtype, self.settings.engine_lora_sum)
        return f"vllm, {name}" if lora_sum == "float32" else f"vllm, {name}, LoRA sum {lora_sum}"

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
            self.server = None
        elif self.address is not None and self._loaded:  # a server of its own outlives the run
            for _, name in self._loaded.values():
                with contextlib.suppress(OSError):
                    self._post("/v1/unload_lora_adapter", {"lora_name": name})
        self.address = None
        self._loaded.clear()
        if self._socket_folder is not None:
            shutil.rmtree(self._socket_folder, ignore_errors=True)
            self._socket_folder = None
        if self._adapters is not None:
            shutil.rmtree(self._adapters, ignore_errors=True)
            self._adapters = None

    # -- the Engine protocol ------------------------------------------------------------------
    def shares_prompts(self, prompt_lengths: Sequence[int]) -> bool:
        return False  # each request is a whole context: the server's prefix cache shares them

    @contextlib.contextmanager
    def drawing(self, team: LoraTeam, continues: bool) -> Iterator[None]:
        yield  # the server keeps its own prefix cache, keyed by each adapter's name

    def draw(self, request: TurnRequest) -> Drawn:
        if self.address is None or self._pool is None:
            raise RuntimeError("the vLLM engine was not started (VLLMEngine.start)")
        # One seed a request, from torch's generator, which the sampler seeds once per play:
        # a replayed play (a resumed run) asks for the same seeds as the straight one. Coupled
        # rows bring their own: vLLM seeds the request's generator with it and draws each step's
        # exponential race from it, so a held-out turn and its continuation share the numbers.
        seeds = (
            torch.randint(0, 2**31 - 1, (len(request.contexts),)).tolist()
            if request.seeds is None
            else list(request.seeds)
        )
        name = self._adapter_name(request.team, request.policy)
        greedy = request.temperature == 0
        bodies = [
            completion_body(
                name,
                context,
                request.max_new_tokens,
                request.temperature,
                seed=seed,
                stop_id=self.chat.stop_id,  # the chat's, whatever the tokenizer's end of text
                logprobs=request.record and not greedy,
            )
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
        """The served name of ``policy``'s snapshot in ``team``, loaded on first use in place
        of the version before it (unloaded first: between draws none of its requests is in
        flight). Each version has a name (and folder) of its own: the server keys its prefix
        cache by an adapter's name and folder, so keys and values computed by an earlier
        version are never read for a later one (docs/scaling_out.md, "Rollouts on vLLM")."""
        if self.served:
            return self.served[policy]
        weights = team.agent(policy)
        with self._lock:
            loaded = self._loaded.get(policy)
            if loaded is not None and loaded[0] == weights.version:
                return loaded[1]
            assert self._model is not None and self._adapters is not None
            if loaded is not None:
                self._post("/v1/unload_lora_adapter", {"lora_name": loaded[1]})
                del self._loaded[policy]
                shutil.rmtree(self._adapters / loaded[1], ignore_errors=True)
            name = f"{self._tag}-p{policy}-v{weights.version}"
            folder = self._adapters / name
            write_adapter(folder, self._model, policy, weights)
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
            self._loaded[policy] = (weights.version, name)
            return name

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        """The server's answer to ``body`` at ``path``. A server that refuses the request
        (HTTP 4xx: an unknown adapter, a context too long, a rejected key) or fails it (5xx), or
        gives no answer: ``EngineFailed``, the fault that keeps the run's checkpoint."""
        assert self.address is not None
        try:
            return self.address.request("POST", path, body, timeout=REQUEST_TIMEOUT)
        except ServerRefused as refused:
            if refused.status >= 500:
                raise self._failure(str(refused)) from None
            where = f"; its log: {self.server.log}" if self.server is not None else ""
            raise EngineFailed(f"the vLLM server refused {path}: {refused}{where}") from None
        except OSError as error:
            raise self._failure(str(error)) from None

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
        url = self.address.url if self.address is not None else self.settings.engine_url
        return EngineFailed(f"the vLLM server at {url} stopped answering: {cause}")
