"""A trained team written out for the tools everyone else uses: PEFT, transformers and vLLM.

``export_team(trained, out)`` writes a folder that opens without teamtr:

- ``agent{k}/``: one PEFT adapter folder per policy (``adapter_config.json`` with the true ``r``,
  ``lora_alpha`` and adapted modules, ``adapter_model.safetensors`` with PEFT's key names), so
  ``PeftModel.from_pretrained(base, "out/agent0")`` loads it;
- ``tokenizer/``: the tokenizer and its chat template;
- ``team.json``: what a dialogue of the team is (speakers, roles, system prompt, router,
  message lengths, temperature, stop token), the base model and its SHA-256, the teamtr
  version and the checkpoint it came from, and the lines that serve it with vLLM
  (``llm.export.team_json``);
- ``run_config.json``: the run's resolved config, from which ``llm.load_team`` rebuilds it, its
  paths cut to their last part (``llm.export.portable_config``);
- ``README.md``: a short model card (``llm.export.model_card``);
- with ``with_base``: ``base/``, the base model as a safetensors folder, which transformers and
  vLLM load by path (a "tiny" model exists only as a seed; a GGUF source is written as the
  dequantised weights teamtr trained on, since vLLM has no GGUF loader; without ``with_base``
  transformers loads the GGUF file as it is, and the vLLM lines say to export with the base;
  ``llm.export.base_model`` names the base either way);
- with ``merge``: ``merged/agent{k}/``, one plain model per policy with ``W + (alpha / r) B A``
  in every adapted layer, the very weights teamtr samples with (``llm.models.generation``).

The folder is written beside its destination and renamed into place: it is whole or absent.
``docs/examples/exported_team/play_with_peft.py`` plays one dialogue from it with transformers
and PEFT alone; a test holds its greedy dialogue to ``teamtr chat``'s, token for token.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from llm.common.config import ConfigError, RunConfig
from llm.common.progress import library_bars
from llm.export.base_model import BaseModel, name_base
from llm.export.model_card import model_card
from llm.export.portable_config import portable
from llm.export.team_json import LOOPBACK, MERGED_FOLDER, team_description
from llm.export.trained_team import RUN_CONFIG_FILE, TEAM_FILE, TrainedTeam, adapter_folder
from llm.models.adapter_folder import write_adapter
from llm.models.agents import LoraBackbone, LoraTeam, slot_name
from llm.models.generation import MergedGenerationCopy
from llm.models.loading import TINY_ALIAS, load_tokenizer, resolve_source
from llm.problems.task import Task
from llm.training.builder import configured_for_task

SERVED_CLIENT = "play_with_vllm.py"
"""The completions client every export carries (``llm/export/play_with_vllm.py``, standard
library and tokenizer only)."""


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
    base = name_base(trained, plain.model, folder, with_base)
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
