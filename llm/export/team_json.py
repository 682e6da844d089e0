"""``team.json`` of an export: everything a dialogue of the team depends on, and the vLLM lines
that serve it, for teamtr and for a script that plays the team without teamtr."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import teamtr
from llm.common.config import RunConfig
from llm.engines.vllm.command import KEY_ENVIRONMENT, ServeCommand
from llm.engines.vllm.engine_lora_sum import plugin_environment
from llm.export.base_model import BaseModel
from llm.export.chat_messages import chat_description
from llm.export.trained_team import RUN_CONFIG_FILE, TrainedTeam, adapter_folder

FORMAT_VERSION = 1
MERGED_FOLDER = "merged"
LOOPBACK = "127.0.0.1"
"""Where the serving lines listen unless ``teamtr export --host`` says otherwise: this machine
only (vLLM's default, every interface, lets anyone who reaches the machine use the team)."""


VLLM_CPU_KV_CACHE = {"VLLM_CPU_KVCACHE_SPACE": "4"}
"""A CPU server's key/value cache in GiB; unset, vLLM's CPU build reserves most of the memory.
GPU builds ignore it."""


def vllm_commands(
    trained: TrainedTeam, base: BaseModel, dtype: str, host: str = LOOPBACK
) -> dict[str, str]:
    """The lines that serve every adapter of the team on its base, run from the export's folder
    (every path in them relative to it): ``"module"`` with any vLLM distribution's Python
    (``vllm-cpu`` included), ``"serve"`` with the ``vllm`` package's command. Both render the
    engine's own description of a server (``llm.engines.vllm.command.ServeCommand``), so the
    export serves the policy the run drew from (``--generation-config vllm``: no sampling
    default of the base's is added). They listen on ``host`` and stop before vLLM starts
    unless the shell holds the key in ``VLLM_API_KEY``, where vLLM reads it: never on the
    command line, which every user of the machine can read. The adapters are fixed
    (``--lora-modules``): no run-time loading."""
    if base.folder is not None:
        served = f"./{base.folder}"
    elif base.location is not None:
        served = base.location
    elif base.gguf_file is not None:
        served = f"<base: export again with --with-base (vLLM cannot load {base.gguf_file})>"
    else:
        served = "<base: export again with --with-base>"
    policies = trained.team.n_agents
    command = ServeCommand(
        model=served,
        dtype=dtype,
        lora_rank=trained.config.lora.rank,
        max_loras=policies,
        host=host,
        key_from_shell=True,
        lora_modules=tuple((adapter_folder(p), f"./{adapter_folder(p)}") for p in range(policies)),
        # In half precision, teamtr's vLLM plugin adds each branch without losing it (the
        # card's "In half precision" says what vLLM's own sum drops).
        extra_environment=plugin_environment(getattr(torch, dtype), "stochastic"),
    )
    return {"module": command.module_line(VLLM_CPU_KV_CACHE), "serve": command.serve_line()}


RENDERING = (
    "prompt = chat_template([system: system_prompt, user: question]); each turn = "
    "header + message + closing, header = chat_template([system: note + '\\n' + "
    "role_prompt]) (either part left out when empty) + the assistant generation prompt; "
    "a speaker's note appears only in its own headers, in its own view"
)
"""``team.json``'s ``rendering``: how a transcript is made of the chat template's parts."""


def team_description(
    trained: TrainedTeam, base: BaseModel, merged: bool, dtype: str, host: str = LOOPBACK
) -> dict[str, Any]:
    """``team.json``: everything a dialogue of the team depends on, for teamtr and for a
    script that plays it without teamtr."""
    config, chat = trained.config, trained.chat
    team, sampler = config.team, config.sampler
    serving = vllm_commands(trained, base, dtype, host)
    agents = _agent_entries(trained, merged)
    order = list(team.speaking_order or range(team.n_agents))
    return {
        "format": "teamtr-team",
        "format_version": FORMAT_VERSION,
        "system_prompt": team.system_prompt,
        "agents": agents,
        "router": {"kind": team.router, "speaking_order": order},
        "turns": sampler.turns,
        **_environment_entry(config),
        "generation": {
            "temperature": sampler.temperature,
            "greedy": "teamtr chat and eval play greedily (argmax); log-probs are of "
            "softmax(logits / temperature), the policy trained",
            "stop_token_id": chat.stop_id,
            "closing_token_ids": list(chat.closing),
        },
        "rendering": RENDERING,
        "chat": chat_description(
            chat, trained.tokenizer, team.system_prompt, team.role_prompts, agents, order
        ),
        "tokenizer": "tokenizer",
        "lora": {
            "r": config.lora.rank,
            "lora_alpha": config.lora.alpha,
            "scaling": config.lora.alpha / config.lora.rank,
        },
        "base": base.description(),
        "teamtr": _checkpoint_entry(trained),
        "vllm": serving["module"],
        "vllm_serve": serving["serve"],
        "vllm_url": f"http://{_url_host(host)}:8000",
        "vllm_key_variable": KEY_ENVIRONMENT,
    }


def _agent_entries(trained: TrainedTeam, merged: bool) -> list[dict[str, Any]]:
    """``team.json``'s ``agents``: per speaker, the adapter (and merged model) that speaks
    for it, its role prompt and its longest message."""
    team, sampler, chat = trained.config.team, trained.config.sampler, trained.chat
    return [
        {
            "speaker": k,
            "adapter": adapter_folder(chat.policy(k)),
            "merged": f"{MERGED_FOLDER}/{adapter_folder(chat.policy(k))}" if merged else None,
            "role_prompt": team.role_prompts[k] if team.role_prompts else "",
            "max_new_tokens": sampler.max_tokens_of(k),
        }
        for k in range(team.n_agents)
    ]


def _checkpoint_entry(trained: TrainedTeam) -> dict[str, Any]:
    """``team.json``'s ``teamtr``: the version, and the run's name and checkpoint, not where
    the run lay on the exporting machine."""
    checkpoint = Path(trained.checkpoint).name
    stage = int(checkpoint.removeprefix("stage_")) if checkpoint.startswith("stage_") else None
    where = Path(trained.checkpoint).parts[-3:] if stage is not None else (trained.checkpoint,)
    return {
        "version": teamtr.__version__,
        "checkpoint": "/".join(where),
        "stage": stage,
        "run_config": RUN_CONFIG_FILE,
    }


def _url_host(host: str) -> str:
    """``host`` as a URL writes it: loopback for every interface, brackets for IPv6."""
    if host in ("0.0.0.0", "::"):
        return LOOPBACK
    return f"[{host}]" if ":" in host else host


def _environment_entry(config: RunConfig) -> dict[str, Any]:
    """team.json's ``environment``: the world the team was trained to act in, where it had one."""
    task = config.task
    if not task.environment:
        return {}
    return {
        "environment": {
            "name": task.environment,
            "args": dict(task.environment_args),
            "rendering": "after a message, the environment's text is a user message of the chat "
            "template (chat_template([user: text]) without the system message), shown to every "
            "agent or, when private, in its addressee's view only; it is never sampled",
        }
    }
