"""Agents as LoRA adapters, on one shared base model or on one model each, and the team value
the core trains.

An agent's policy is a frozen snapshot of its adapter weights (``AdapterWeights``). A team is a
tuple of such snapshots over a backbone: a ``LoraBackbone`` (one base model with one adapter
slot per agent, only the speaker's enabled) or a ``SeparateBackbone`` (one base model per
agent, for heterogeneous teams; each model carries its agent's adapter). Teams are values, as
the core's ``TeamPolicy`` protocol requires: ``with_agent`` returns a new team in O(n) without
copying any tensor; the backbone's slots are loaded with a team's weights only when that team
is used (``LoraTeam.activate``), and a slot that already holds the right snapshot is not
copied again.

For sampling, ``LoraTeam.generation_model`` gives the speaker's policy merged into a plain copy
of the base model (``llm.models.generation``): the same policy up to float rounding, at the bare
model's speed, without touching the backbone's weights.
"""

from __future__ import annotations

import itertools
import typing
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel

from llm.common.devices import seeded
from llm.common.settings import LoraSettings
from llm.models.generation import MergedGenerationCopy
from llm.models.half_precision_sum import install_lora_sum
from llm.models.precision import is_half

GRADIENT_CHECKPOINTING_NOTICE = r"`is_gradient_checkpointing` is deprecated"
"""transformers' FutureWarning when PEFT reads that property of every model it wraps; nothing
here uses gradient checkpointing, so it is silenced where the adapters are created."""


def wrap_in_peft(base: PreTrainedModel, config: LoraConfig, adapter_name: str) -> PeftModel:
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=GRADIENT_CHECKPOINTING_NOTICE, category=FutureWarning
        )
        return get_peft_model(base, config, adapter_name=adapter_name)


def weights_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of ``model``'s (base) weights, read off its input embeddings."""
    embeddings = typing.cast(PreTrainedModel, model).get_input_embeddings()
    return typing.cast(torch.Tensor, embeddings.weight).dtype


def is_half_precision(model: torch.nn.Module) -> bool:
    """Whether ``model``'s (base) weights are bfloat16 or float16."""
    return is_half(weights_dtype(model))


_versions = itertools.count()


def slot_name(index: int) -> str:
    """The PEFT adapter name of agent ``index``'s slot."""
    return f"agent{index}"


@dataclass(frozen=True, eq=False)
class AdapterWeights:
    """One agent's policy: its LoRA weights, keyed independently of the slot they sit in."""

    tensors: Mapping[str, torch.Tensor]
    version: int = field(default_factory=lambda: next(_versions))
    """A unique id; two snapshots with the same version hold the same weights."""

    def parameter_count(self) -> int:
        return sum(tensor.numel() for tensor in self.tensors.values())

    def equal(self, other: AdapterWeights) -> bool:
        """Bit-identical weights (not just close)."""
        return self.tensors.keys() == other.tensors.keys() and all(
            torch.equal(self.tensors[key], other.tensors[key]) for key in self.tensors
        )


class AdapterSlots:
    """One LoRA adapter slot per agent, and which snapshot each slot holds.

    The bookkeeping shared by both backbones: snapshots are taken from and loaded into the live
    adapter parameters, and a slot that already holds a snapshot is not copied again.
    """

    def __init__(self, slot_parameters: list[dict[str, torch.nn.Parameter]]) -> None:
        self._slot_parameters = slot_parameters
        self.n_agents = len(slot_parameters)
        self._loaded: list[int | None] = [None] * self.n_agents

    @staticmethod
    def adapter_parameters(model: PeftModel, index: int) -> dict[str, torch.nn.Parameter]:
        """Slot ``index``'s parameters in ``model``, keyed without the slot name."""
        marker = f".{slot_name(index)}."
        return {
            name.replace(marker, "."): parameter
            for name, parameter in model.named_parameters()
            if marker in name
        }

    def parameters_of(self, index: int) -> dict[str, torch.nn.Parameter]:
        """The live adapter parameters of slot ``index`` (slot-independent keys)."""
        return self._slot_parameters[index]

    def snapshot(self, index: int) -> AdapterWeights:
        """A frozen copy of slot ``index``'s current weights; the slot is marked as holding it."""
        weights = AdapterWeights(
            {key: p.detach().clone() for key, p in self._slot_parameters[index].items()}
        )
        self._loaded[index] = weights.version
        return weights

    def load(self, index: int, weights: AdapterWeights) -> None:
        """Put ``weights`` into slot ``index`` (no copy when it already holds them)."""
        if self._loaded[index] == weights.version:
            return
        parameters = self._slot_parameters[index]
        if parameters.keys() != weights.tensors.keys() or any(
            parameters[key].shape != weights.tensors[key].shape for key in parameters
        ):
            raise ValueError(f"adapter weights do not match agent {index}'s slot parameters")
        with torch.no_grad():
            for key, parameter in parameters.items():
                parameter.copy_(weights.tensors[key])
        self._loaded[index] = weights.version

    def mark_modified(self, index: int) -> None:
        """Slot ``index`` is being trained in place: it no longer holds any snapshot."""
        self._loaded[index] = None

    def initial_team(self) -> LoraTeam:
        # Only the two backbones subclass AdapterSlots, so ``self`` is a Backbone here.
        backbone = typing.cast("Backbone", self)
        return LoraTeam(backbone, tuple(self.snapshot(k) for k in range(self.n_agents)))


class LoraBackbone(AdapterSlots):
    """A base model with one LoRA adapter slot per agent; only the speaker's slot is enabled."""

    def __init__(self, model: PeftModel, n_agents: int) -> None:
        super().__init__([self.adapter_parameters(model, k) for k in range(n_agents)])
        self.model = model
        self._active: int | None = None
        self._generation_copy: MergedGenerationCopy | None = None

    @classmethod
    def create(
        cls, base: PreTrainedModel, n_agents: int, settings: LoraSettings, *, seed: int = 0
    ) -> LoraBackbone:
        """Wrap ``base`` with ``n_agents`` freshly initialised adapters (B = 0: all start as base)."""
        if n_agents < 1:
            raise ValueError(f"n_agents must be >= 1, got {n_agents}")
        config = settings.peft_config()
        with seeded(seed):
            model = wrap_in_peft(base, config, slot_name(0))
        for index in range(1, n_agents):
            with seeded(seed + index):
                model.add_adapter(slot_name(index), config)
        install_lora_sum(model, settings.half_precision_sum)
        model.eval()
        return cls(model, n_agents)

    def speak_as(self, index: int) -> None:
        """Enable only agent ``index``'s adapter (PEFT also makes only it trainable)."""
        if self._active != index:
            self.model.set_adapter(slot_name(index))
            self._active = index

    def training_model(self, index: int) -> PeftModel:
        """The model that computes agent ``index``'s log-probs with whatever its slot holds."""
        self.speak_as(index)
        return self.model

    def generation_model(self, index: int, weights: AdapterWeights) -> PreTrainedModel:
        """A plain copy of the base model with ``weights`` merged in as slot ``index``'s policy.

        The copy (one extra base model) is made on first use and rewritten only when another
        snapshot speaks; the backbone's own weights are read, never written.
        """
        if self._generation_copy is None:
            self._generation_copy = MergedGenerationCopy(self.model)
        return self._generation_copy.speaking(weights.tensors, weights.version, slot_name(index))

    @property
    def generation_merges(self) -> int:
        """How many times the generation copy's weights were computed (0 before first use)."""
        return 0 if self._generation_copy is None else self._generation_copy.merges

    @property
    def half_precision(self) -> bool:
        """Whether the base weights are bfloat16 or float16 (the adapters are float32 always)."""
        return is_half_precision(self.model)


class SeparateBackbone(AdapterSlots):
    """One base model per agent, each with its own LoRA adapter: a heterogeneous team.

    The agents may be different models (other weights, other sizes, other architectures) as long
    as they read one shared transcript, i.e. share one tokenizer (``require_shared_tokenizer``).
    Agent k's adapter lives on model k as slot ``agent{k}``, so checkpoints, swaps and the
    updater treat both backbones alike. Each model has its own merged generation copy, so a
    change of speaker never re-merges weights (at the cost of one more model of memory each).
    """

    def __init__(self, models: Sequence[PeftModel]) -> None:
        super().__init__([self.adapter_parameters(m, k) for k, m in enumerate(models)])
        self.models = list(models)
        self._generation_copies: list[MergedGenerationCopy | None] = [None] * len(self.models)

    @classmethod
    def create(
        cls, bases: Sequence[PreTrainedModel], settings: LoraSettings, *, seed: int = 0
    ) -> SeparateBackbone:
        """Give each base model its own freshly initialised adapter (B = 0: each starts as its base).

        Adapter k is drawn with seed ``seed + k``, as in ``LoraBackbone.create``: a separate team of
        identical bases starts from exactly the shared-base team.
        """
        if not bases:
            raise ValueError("a team needs at least one model")
        if len({id(base) for base in bases}) != len(bases):
            raise ValueError("each agent needs its own model object (load one per agent)")
        models = []
        for index, base in enumerate(bases):
            with seeded(seed + index):
                model = wrap_in_peft(base, settings.peft_config(), slot_name(index))
            install_lora_sum(model, settings.half_precision_sum)
            model.eval()
            models.append(model)
        return cls(models)

    def speak_as(self, index: int) -> None:
        """Nothing to switch: agent ``index`` has a model of its own."""

    def training_model(self, index: int) -> PeftModel:
        return self.models[index]

    def generation_model(self, index: int, weights: AdapterWeights) -> PreTrainedModel:
        copy = self._generation_copies[index]
        if copy is None:
            copy = self._generation_copies[index] = MergedGenerationCopy(self.models[index])
        return copy.speaking(weights.tensors, weights.version, slot_name(index))

    @property
    def half_precision(self) -> bool:
        """Whether any agent's base weights are bfloat16 or float16."""
        return any(is_half_precision(model) for model in self.models)

    @property
    def generation_merges(self) -> int:
        return sum(copy.merges for copy in self._generation_copies if copy is not None)


Backbone = LoraBackbone | SeparateBackbone
"""Where a team's adapters live: one shared base model, or one model per agent."""


@dataclass(frozen=True, eq=False)
class LoraTeam:
    """A team of LoRA agents: implements ``teamtr.protocols.TeamPolicy``."""

    backbone: Backbone
    policies: tuple[AdapterWeights, ...]

    def __post_init__(self) -> None:
        if len(self.policies) != self.backbone.n_agents:
            raise ValueError(
                f"team has {len(self.policies)} policies for {self.backbone.n_agents} slots"
            )

    @property
    def n_agents(self) -> int:
        return len(self.policies)

    def agent(self, index: int) -> AdapterWeights:
        return self.policies[index]

    def with_agent(self, index: int, policy: AdapterWeights) -> LoraTeam:
        policies = list(self.policies)
        policies[index] = policy
        return replace(self, policies=tuple(policies))

    def activate(self) -> None:
        """Load this team's weights into the backbone (only slots that differ are copied)."""
        for index, policy in enumerate(self.policies):
            self.backbone.load(index, policy)

    def use(self, index: int) -> PeftModel:
        """The model of agent ``index``, loaded with this team and speaking as that agent."""
        self.activate()
        return self.backbone.training_model(index)

    def generation_model(self, index: int) -> PreTrainedModel:
        """Agent ``index``'s policy merged into the backbone's generation copy, for sampling.

        Unlike ``use``, it leaves the backbone's slots as they are.
        """
        return self.backbone.generation_model(index, self.policies[index])

    def differing_agents(self, other: LoraTeam) -> tuple[int, ...]:
        """Agents whose policy differs (by snapshot identity) between two teams."""
        return tuple(
            k
            for k, (mine, theirs) in enumerate(zip(self.policies, other.policies, strict=True))
            if mine.version != theirs.version
        )
