"""A trained team taken out of its run: found in a run directory or an export, loaded, played.

``load_team(path, step=None)`` reads a run directory of ``teamtr train`` (the adapters of one
checkpoint, verified against its manifest) or a folder written by ``teamtr export`` /
``llm.save_team`` (one PEFT adapter folder per agent), and returns a ``TrainedTeam``: the run's
base model, adapters, roles, system prompt, router and message lengths, ready to ``play`` a
question of one's own. Finding (``locate_team``) reads only small files and the adapters, so
the command line refuses a bad run, step or note before any model loads.

The dialogues are those the run's own evaluation plays: the same chat format, views and
sampler (``llm.sampling.sampler.DialogueSampler.play``), greedy unless ``sample``. The
adapters of a run are read through ``llm.training.checkpoint`` (the format's one reader).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerBase

from llm.common.config import ConfigError, Override, RunConfig, load_config
from llm.conversation.dialogue import ChatFormat, Episode
from llm.conversation.router import make_router
from llm.engines.vllm.client import VLLMEngine
from llm.models.adapter_folder import ADAPTER_FILE
from llm.models.agents import AdapterWeights, LoraTeam
from llm.problems.configured import environment_factory
from llm.problems.task import Dialogue, Task, TaskError
from llm.problems.tasks import Problem
from llm.sampling.sampler import DialogueSampler
from llm.training.builder import build_backbone
from llm.training.checkpoint import RunDirectoryError, find_policies, on_backbone_device
from llm.training.rundir import EVENTS

TEAM_FILE = "team.json"
"""An export's description of its team (``llm.export.export_folder``), read by teamtr and by the
example script that plays it without teamtr."""
RUN_CONFIG_FILE = "run_config.json"
"""An export's copy of the run's resolved config: what teamtr rebuilds the team from."""
BASE_FOLDER = "base"
"""An export's base model in Hugging Face layout (``--with-base``), when it has one."""


def adapter_folder(policy: int) -> str:
    """The PEFT adapter folder of policy ``policy`` in an export."""
    return f"agent{policy}"


@dataclass(frozen=True)
class TeamSource:
    """A team found on disk and checked, before any model is loaded."""

    config: RunConfig
    policies: tuple[AdapterWeights, ...]
    checkpoint: str
    """Where the adapters came from: ``<run>/checkpoints/stage_N`` (as a path string)."""
    base_folder: Path | None = None
    """An export's own copy of the base model, loaded in place of ``[model] source``."""

    @property
    def n_agents(self) -> int:
        """Speakers of a dialogue (roles), each with its role prompt and private note."""
        return self.config.team.n_agents

    def load(self, device: str | None = None) -> TrainedTeam:
        """The team on ``device`` (default: the run's ``[run] device``)."""
        config = self.config
        if self.base_folder is not None:
            model = dataclasses.replace(config.model, source=str(self.base_folder))
            config = dataclasses.replace(config, model=model)
        if device is not None:
            config = dataclasses.replace(config, run=dataclasses.replace(config.run, device=device))
        return TrainedTeam.assemble(config, self.policies, self.checkpoint)


def locate_team(
    path: str | Path, step: int | None = None, overrides: Sequence[Override] = ()
) -> TeamSource:
    """The team of a run directory (checkpoint ``stage_{step}``, default the latest usable one)
    or of an export; a ``RunDirectoryError`` names the path and what is wrong. ``overrides``
    (``--set``) change keys of the run's config as it is read, checked as its keys are."""
    path = Path(path)
    if not path.is_dir():
        raise RunDirectoryError(f"{path}: no such directory (expected a run directory or export)")
    if (path / TEAM_FILE).is_file():
        return _exported_team(path, step, overrides)
    if not (path / "config.json").is_file():
        raise RunDirectoryError(
            f"{path}: neither a run directory (no config.json) nor an export (no {TEAM_FILE})"
        )
    config = with_trained_dtype(load_config(path / "config.json", overrides), path)
    found = find_policies(path, step, config.team.n_policies)
    return TeamSource(config, found.policies, str(found.directory))


def with_trained_dtype(config: RunConfig, run_dir: Path) -> RunConfig:
    """``config`` with ``dtype = "auto"`` pinned to the precision the run last trained in (its
    ``started`` or ``resumed`` event in ``events.jsonl``): "auto" resolves by the machine
    (bfloat16 on a CPU with AMX, float32 on another), and a team played, evaluated or exported
    on another machine than it trained on must keep its own. A dtype the config or ``--set``
    names is kept; a run that recorded none (older ones) keeps "auto"."""
    if config.run.dtype != "auto":
        return config
    trained = None
    try:
        lines = (run_dir / EVENTS).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:  # a line cut short by a crash
            continue
        if isinstance(event, dict) and event.get("event") in ("started", "resumed"):
            trained = event.get("dtype", trained)
    if trained not in ("float32", "bfloat16", "float16"):
        return config
    return dataclasses.replace(config, run=dataclasses.replace(config.run, dtype=trained))


def _exported_team(path: Path, step: int | None, overrides: Sequence[Override]) -> TeamSource:
    try:
        team = json.loads((path / TEAM_FILE).read_text())
        checkpoint = str(team["teamtr"]["checkpoint"])
        stage = team["teamtr"].get("stage")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RunDirectoryError(f"{path / TEAM_FILE}: unreadable ({error})") from None
    if step is not None and step != stage:
        raise RunDirectoryError(
            f"{path}: an export holds one checkpoint ({Path(checkpoint).name}); --step {step} "
            "names another (export that step from its run directory)"
        )
    config = load_config(path / RUN_CONFIG_FILE, overrides)
    policies = []
    for policy in range(config.team.n_policies):
        file = path / adapter_folder(policy) / ADAPTER_FILE
        try:
            policies.append(AdapterWeights(load_file(str(file))))
        except (OSError, ValueError) as error:
            raise RunDirectoryError(f"{file}: unreadable adapter ({error})") from None
    base = path / BASE_FOLDER
    return TeamSource(config, tuple(policies), checkpoint, base if base.is_dir() else None)


def load_team(
    path: str | Path,
    step: int | None = None,
    *,
    device: str | None = None,
    url: str | None = None,
    key_variable: str = "",
):
    """The trained team of a run directory or an export, ready to ``play``.

    ``step``: the checkpoint ``stage_N`` of a run (default: its latest usable one); ``device``:
    where the models go (default: the run's ``[run] device``, "auto"); ``url``: play through
    the server there, which serves the team's adapters under the export's names
    (``TrainedTeam.served_at``; its key in the environment variable ``key_variable``).
    """
    team = locate_team(path, step).load(device)
    return team.served_at(url, key_variable) if url else team


def _never_trains(rng: np.random.Generator, count: int) -> list[Problem]:
    raise TaskError("a loaded team plays the questions it is given; it draws no training problems")


@dataclass(frozen=True)
class TrainedTeam:
    """A trained team with everything its dialogues need: adapters on the base model, chat
    format (roles, system prompt, notes' views), router and message lengths."""

    config: RunConfig
    team: LoraTeam
    sampler: DialogueSampler
    checkpoint: str
    """Where the adapters came from (a run's ``checkpoints/stage_N``, or a description)."""
    tokenizer: PreTrainedTokenizerBase

    @classmethod
    def assemble(
        cls, config: RunConfig, policies: Sequence[AdapterWeights], checkpoint: str
    ) -> TrainedTeam:
        """Build the base model(s) of ``config`` and put ``policies`` on them."""
        tokenizer, backbone, _ = build_backbone(config, progress=False)
        initial = backbone.initial_team()
        if len(policies) != initial.n_agents:
            raise RunDirectoryError(
                f"{checkpoint}: {len(policies)} adapters for a team of {initial.n_agents}"
            )
        trained = LoraTeam(backbone, on_backbone_device(initial, tuple(policies)))
        return cls.of_team(config, trained, tokenizer, checkpoint)

    @classmethod
    def of_team(
        cls,
        config: RunConfig,
        team: LoraTeam,
        tokenizer: PreTrainedTokenizerBase,
        checkpoint: str,
    ) -> TrainedTeam:
        """``team`` (already on its models) with the dialogues ``config`` describes."""
        settings = config.team
        chat = ChatFormat.from_tokenizer(
            tokenizer,
            settings.n_agents,
            settings.system_prompt,
            settings.role_prompts,
            settings.policy_of,
        )
        router = make_router(settings.router, settings.n_agents, settings.speaking_order)
        # The sampler plays; it draws no problems. It plays in the run's environment, if any.
        environment = (
            environment_factory(config.task, settings.n_agents) if config.task.environment else None
        )
        task = Task(_never_trains, name="play", environment=environment)
        # A trained team plays in process: a run's server engine was the run's.
        in_process = dataclasses.replace(
            config.sampler, engine="hf", engine_url="", engine_key_variable="", engine_args=""
        )
        sampler = DialogueSampler(chat, router, task, in_process)
        return cls(config, team, sampler, checkpoint, tokenizer)

    def served_at(self, url: str, key_variable: str = "") -> TrainedTeam:
        """This team playing through the OpenAI-compatible (vLLM) server at ``url``, which serves
        policy k's adapter under the export's name ``agent{k}`` (the export's vLLM line serves
        them so): every message is drawn there by the vLLM engine's client (token ids as teamtr
        renders them, to ``/v1/completions``), once the server lists every name and answers
        a probe question under each greedily as this process's policy does
        (``llm.engines.vllm.probe.check_served_adapters``). The key, where the server wants
        one, is read from the environment variable ``key_variable``, never given as text.
        ``close`` lets the server go."""
        settings = dataclasses.replace(
            self.config.sampler,
            engine="vllm",
            engine_url=url,
            engine_key_variable=key_variable,
            engine_args="",
        )
        names = [adapter_folder(policy) for policy in range(self.team.n_agents)]
        engine = VLLMEngine(self.chat, settings, served=names)
        # Positions and threads size a server the engine starts; one at a URL runs as it is.
        engine.start(self.team, self.tokenizer, positions=0, threads=0)
        sampler = copy.copy(self.sampler)  # its chat, router and lengths; the server draws
        sampler.engine = engine
        return dataclasses.replace(self, sampler=sampler)

    def close(self) -> None:
        """Let the engine go (a served team's connection pool; nothing for one in process)."""
        self.sampler.close()

    @property
    def chat(self) -> ChatFormat:
        return self.sampler.chat

    @property
    def n_agents(self) -> int:
        """Speakers of a dialogue (each with its role prompt and private note)."""
        return self.config.team.n_agents

    def problem(
        self, question: str, notes: Sequence[str] = (), metadata: Mapping[str, Any] | None = None
    ) -> Problem:
        """A question of one's own as the team's dialogues take it; ``notes``: none, or one
        private note per speaker (note k is shown to speaker k only)."""
        if not isinstance(question, str) or not question.strip():
            raise ConfigError(f"the question must be non-empty text, got {question!r:.40}")
        notes = tuple(notes)
        if notes and len(notes) != self.n_agents:
            raise ConfigError(
                f"{len(notes)} notes for a team of {self.n_agents} agents: give none, or one "
                'per agent ("" for an agent without one)'
            )
        return Problem(question.strip(), "", notes=notes, metadata=dict(metadata or {}))

    def episodes(
        self, problems: Sequence[Problem], *, sample: bool = False, seed: int = 0
    ) -> list[Episode]:
        """One finished dialogue per problem, as token ids: greedy (the run's evaluation), or
        sampled at the policy's temperature; ``seed`` fixes the routes and the samples."""
        rng = np.random.default_rng(seed)
        started = [self.sampler.open_episode(p, int(rng.integers(2**31))) for p in problems]
        temperature = None if sample else 0.0
        done, _ = self.sampler.play(self.team, started, temperature=temperature, seed=seed)
        return done

    def play(
        self,
        question: str,
        notes: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        *,
        sample: bool = False,
        seed: int = 0,
    ) -> Dialogue:
        """One dialogue of the team about ``question`` (greedy unless ``sample``)."""
        return self.play_all([self.problem(question, notes, metadata)], sample=sample, seed=seed)[0]

    def play_all(
        self, problems: Sequence[Problem], *, sample: bool = False, seed: int = 0
    ) -> list[Dialogue]:
        """One dialogue per problem, played together in batches (greedy unless ``sample``)."""
        return [self.sampler.dialogue(e) for e in self.episodes(problems, sample=sample, seed=seed)]

    def message_logps(self, episodes: Sequence[Episode]) -> list[list[torch.Tensor]]:
        """Per episode, per turn: the log-probability of each message token under its speaker's
        policy, softmax(logits / T), as training computes it (its own view of the transcript)."""
        table: dict[tuple[int, int], torch.Tensor] = {}
        for policy in range(self.team.n_agents):
            table.update(self.sampler.agent_logps(self.team, episodes, policy))
        return [
            [table.get((e, t), torch.zeros(0)) for t in range(len(episode.turns))]
            for e, episode in enumerate(episodes)
        ]
