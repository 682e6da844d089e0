"""Agents as LoRA adapters on one shared base model, and the team value the core trains.

An agent's policy is a frozen snapshot of its adapter weights (``AdapterWeights``). A team is a
tuple of such snapshots over one ``LoraBackbone`` (the base model with one adapter slot per
agent). Teams are values, as the core's ``TeamPolicy`` protocol requires: ``with_agent``
returns a new team in O(n) without copying any tensor; the backbone's slots are loaded with a
team's weights only when that team is used (``LoraTeam.activate``), and a slot that already
holds the right snapshot is not copied again.

For sampling, ``LoraTeam.generation_model`` gives the speaker's policy merged into a plain copy
of the base model (``llm.generation``): the same policy up to float rounding, at the bare
model's speed, without touching the backbone's weights.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel

from llm.generation import MergedGenerationCopy

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


@dataclass(frozen=True)
class LoraSettings:
    """LoRA hyper-parameters shared by every agent's adapter."""

    rank: int = 16
    """r, the rank of each low-rank update."""
    alpha: float = 32.0
    """lora_alpha; the update is scaled by alpha / r."""
    target_modules: str | tuple[str, ...] = "all-linear"
    """Which linear layers get an adapter ("all-linear": every one except the output head)."""

    def peft_config(self) -> LoraConfig:
        targets = (
            self.target_modules
            if isinstance(self.target_modules, str)
            else list(self.target_modules)
        )
        # Dropout is 0 so that the training forward pass is the sampling policy exactly:
        # ratios must be 1 before an update (issue 4, "Sampler").
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=0.0,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )


class LoraBackbone:
    """A base model with one LoRA adapter slot per agent; only the speaker's slot is enabled."""

    def __init__(self, model: PeftModel, n_agents: int) -> None:
        self.model = model
        self.n_agents = n_agents
        self._slot_parameters: list[dict[str, torch.nn.Parameter]] = []
        for index in range(n_agents):
            marker = f".{slot_name(index)}."
            self._slot_parameters.append(
                {
                    name.replace(marker, "."): parameter
                    for name, parameter in model.named_parameters()
                    if marker in name
                }
            )
        self._loaded: list[int | None] = [None] * n_agents
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
        torch.manual_seed(seed)
        model = get_peft_model(base, config, adapter_name=slot_name(0))
        for index in range(1, n_agents):
            torch.manual_seed(seed + index)
            model.add_adapter(slot_name(index), config)
        model.eval()
        return cls(model, n_agents)

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
        if parameters.keys() != weights.tensors.keys():
            raise ValueError("adapter weights do not match the slot's parameters")
        with torch.no_grad():
            for key, parameter in parameters.items():
                parameter.copy_(weights.tensors[key])
        self._loaded[index] = weights.version

    def mark_modified(self, index: int) -> None:
        """Slot ``index`` is being trained in place: it no longer holds any snapshot."""
        self._loaded[index] = None

    def speak_as(self, index: int) -> None:
        """Enable only agent ``index``'s adapter (PEFT also makes only it trainable)."""
        if self._active != index:
            self.model.set_adapter(slot_name(index))
            self._active = index

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

    def initial_team(self) -> LoraTeam:
        return LoraTeam(self, tuple(self.snapshot(k) for k in range(self.n_agents)))


@dataclass(frozen=True, eq=False)
class LoraTeam:
    """A team of LoRA agents: implements ``teamtr.protocols.TeamPolicy``."""

    backbone: LoraBackbone
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
        """The backbone, loaded with this team and speaking as agent ``index``."""
        self.activate()
        self.backbone.speak_as(index)
        return self.backbone.model

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
