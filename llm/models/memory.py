"""How much memory a run needs, estimated from its config before any model loads.

A run holds its base model(s), a merged copy of one for generation (``[sampler]
merged_generation``), the adapters with their gradients, Adam moments and snapshots, the KV
cache of a rollout batch (``prompts_per_batch x group_size`` dialogues of up to ``turns``
messages) and the logits of one training chunk (``score_chunk`` dialogues over the whole
vocabulary). The estimate is a floor (activations, allocator slack and the libraries' own
buffers come on top); a run whose floor does not fit the memory available is refused at
``--check`` time with a ``ConfigError`` that names the keys that size it, instead of growing
for minutes until the system kills it.

The shapes are known without loading anything for "tiny" models, "smollm2" and a local
directory with a ``config.json``; other sources (a hub id, another ``.gguf`` file) are not
estimated.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from llm.common.config import ConfigError, RunConfig
from llm.models.loading import SMOLLM2_ALIAS, TINY_ALIAS, TINY_SHAPE

PROMPT_TOKENS = 256
"""A prompt's length as the estimate counts it (system message, role prompt, question)."""
TURN_OVERHEAD = 16
"""Header and stop tokens of one message."""
ADAPTER_COPIES = 6
"""float32 copies of each adapter held in a run: weights, gradient, two Adam moments, and the
snapshots of the team before and after an update."""
GIB = 2**30


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    kv_width: int
    """Key (and value) width per layer: key-value heads x head size."""
    tied: bool = True

    @property
    def parameters(self) -> int:
        h, kv, i = self.hidden, self.kv_width, self.intermediate
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * i
        return self.layers * per_layer + self.vocab * h * (1 if self.tied else 2)

    def lora_parameters(self, rank: int) -> int:
        """Adapter parameters on every linear layer of every block (``"all-linear"``)."""
        h, kv, i = self.hidden, self.kv_width, self.intermediate
        return rank * self.layers * ((h + h) * 2 + (h + kv) * 2 + (h + i) * 3)


SMOLLM2_SHAPE = ModelShape(hidden=576, layers=30, intermediate=1536, vocab=49152, kv_width=192)
"""SmolLM2-135M-Instruct: 9 attention heads of 64, 3 key-value heads."""
TINY_VOCAB = 99
"""The tiny models' character tokenizer (``llm.models.loading.tiny_char_tokenizer``)."""


def model_shape(source: str) -> ModelShape | None:
    """The shape of a model source, where it is known without loading the model."""
    if source == TINY_ALIAS:
        width, layers = 32, 2
    elif (match := TINY_SHAPE.fullmatch(source)) is not None:
        width, layers = int(match[1]), int(match[2])
    elif source == SMOLLM2_ALIAS:
        return SMOLLM2_SHAPE
    else:
        return _directory_shape(Path(source).expanduser() / "config.json")
    return ModelShape(width, layers, 2 * width, TINY_VOCAB, width // 2)


def _directory_shape(path: Path) -> ModelShape | None:
    try:
        data = json.loads(path.read_text())
        hidden = int(data["hidden_size"])
        heads = int(data["num_attention_heads"])
        kv_heads = int(data.get("num_key_value_heads", heads))
        head_size = int(data.get("head_dim") or hidden // heads)
        return ModelShape(
            hidden=hidden,
            layers=int(data["num_hidden_layers"]),
            intermediate=int(data.get("intermediate_size", 4 * hidden)),
            vocab=int(data["vocab_size"]),
            kv_width=kv_heads * head_size,
            tied=bool(data.get("tie_word_embeddings", False)),
        )
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None  # not a readable Hugging Face config: not estimated


@dataclass(frozen=True)
class MemoryEstimate:
    parts: dict[str, int]
    """Bytes per part, keyed by a description that names the keys sizing it."""

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        return "; ".join(f"{what} {size / GIB:.2f} GiB" for what, size in self.parts.items())


def estimate(config: RunConfig, weight_bytes: int, processes: int = 1) -> MemoryEstimate | None:
    """The memory ``processes`` ranks of a run need on one machine (None: shapes unknown)."""
    sources = config.model.sources or (config.model.source,)
    shapes = [model_shape(source) for source in sources]
    known = [shape for shape in shapes if shape is not None]
    if len(known) != len(shapes):
        return None
    sampler, team = config.sampler, config.team
    largest = max(known, key=lambda shape: shape.parameters)
    models = sum(shape.parameters for shape in known) * weight_bytes
    if sampler.merged_generation:
        models += largest.parameters * weight_bytes
    adapters = sum(
        known[0 if len(known) == 1 else k].lora_parameters(config.lora.rank)
        for k in range(team.n_policies)
    )
    context = PROMPT_TOKENS + sampler.turns * (sampler.longest_message + TURN_OVERHEAD)
    dialogues = sampler.prompts_per_batch * sampler.group_size
    kv_cache = 2 * largest.layers * largest.kv_width * context * dialogues * weight_bytes
    chunk = min(sampler.score_chunk, dialogues)
    logits = chunk * context * largest.vocab * 4
    return MemoryEstimate(
        {
            "base models ([model] source/sources, [run] dtype, [sampler] merged_generation)": (
                models * processes
            ),
            "adapters ([lora] rank, [team] n_agents)": (adapters * 4 * ADAPTER_COPIES * processes),
            "KV cache ([sampler] prompts_per_batch x group_size x turns x max_new_tokens)": (
                kv_cache * processes
            ),
            "logits of a training chunk ([sampler] score_chunk x turns x max_new_tokens)": (
                logits * processes
            ),
        }
    )


def available_bytes(device: str) -> int | None:
    """Memory free for a run on ``device`` ("cpu", "cuda:N", "mps"); None: unknown."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    if device != "cpu":
        return None
    found = [size for size in (_meminfo_available(), _cgroup_available()) if size is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def _cgroup_available() -> int | None:
    """What a cgroup (v2) memory limit leaves, in a container that has one."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        return max(0, int(limit) - used)
    except (OSError, ValueError):
        return None


def require_memory(
    config: RunConfig, device: str, weight_bytes: int, source: str, processes: int = 1
) -> MemoryEstimate | None:
    """Refuse a run whose estimated memory exceeds what ``device`` has available."""
    needed = estimate(config, weight_bytes, processes)
    available = available_bytes(device)
    if needed is None or available is None or needed.total <= available:
        return needed
    ranks = f" for {processes} processes" if processes > 1 else ""
    raise ConfigError(
        f"{source}: the run needs at least {needed.total / GIB:.1f} GiB of memory{ranks} but "
        f"{device} has {available / GIB:.1f} GiB available ({needed.describe()}); lower the "
        "keys of its largest part"
    )
