"""The base model as a folder vLLM loads: config, safetensors weights and tokenizer.

vLLM reads Hugging Face folders; it has no GGUF loader (the default model ships as one), and a
"tiny" model exists only as a seed. Both are written once, from the weights teamtr itself
loaded, as a plain model built from the config (transformers refuses ``save_pretrained`` on a
GGUF-loaded model, while a fresh model of the same config loads the dequantized state dict and
saves like any other). The folder is cached by the digest of everything it holds — the weights
and their dtype, the model's config and the tokenizer — so every later run on the same base
reuses it, and a model of the same weights under another config (e.g. more positions) gets a
folder of its own rather than a stale ``config.json``; it is written beside its place and
renamed into it: a folder there is whole.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from llm.common.progress import library_bars
from llm.models.generation import MergedGenerationCopy

CACHE_ENVIRONMENT = "TEAMTR_CACHE"
"""Where teamtr caches what it writes for engines (default ``$XDG_CACHE_HOME/teamtr``)."""


def cache_directory() -> Path:
    chosen = os.environ.get(CACHE_ENVIRONMENT)
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "teamtr"


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of each tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_digest(
    state: dict[str, torch.Tensor], model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> str:
    """SHA-256 of what a base folder holds: the weights (``weights_digest``), the config vLLM
    reads (positions, rotary settings, special tokens) and the tokenizer's vocabulary and chat
    template."""
    digest = hashlib.sha256(weights_digest(state).encode())
    digest.update(model.config.to_json_string(use_diff=False).encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocabulary = (
        backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    )
    digest.update(vocabulary.encode())
    digest.update(str(getattr(tokenizer, "chat_template", None)).encode())
    return digest.hexdigest()


def base_folder(
    model: PeftModel, tokenizer: PreTrainedTokenizerBase, cache: Path | None = None
) -> Path:
    """The folder holding ``model``'s base (no adapters) for an engine, written on first use."""
    plain = MergedGenerationCopy(model).model  # the base's own weights, LoRA layers removed
    state = {name: tensor.detach().cpu() for name, tensor in plain.state_dict().items()}
    dtype = next(iter(state.values())).dtype
    root = (cache or cache_directory()) / "engine-bases"
    digest = folder_digest(state, plain, tokenizer)
    folder = root / f"{digest[:24]}-{str(dtype).removeprefix('torch.')}"
    if (folder / "config.json").is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    return written_whole(folder, lambda target: write_plain_base(plain, tokenizer, target))


def written_whole(folder: Path, write: Callable[[Path], None]) -> Path:
    """``folder``, written by ``write`` into a temporary folder beside it and renamed into
    place, so that a folder there is whole (``config.json`` marks it); where another process
    wrote the same folder first, theirs is as good."""
    temporary = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        write(temporary)
        try:
            os.replace(temporary, folder)
        except OSError:
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return folder


def write_plain_base(
    plain: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path
) -> None:
    """Write ``plain`` (a model without adapters, loaded from any source, a GGUF file included)
    to ``target`` as a Hugging Face folder of safetensors weights, with ``tokenizer`` beside
    them: what vLLM and transformers load by path. ``teamtr export --with-base`` writes its
    ``base/`` with this too, so that an export is served from the very folder an engine is."""
    state = {name: tensor.detach().cpu() for name, tensor in plain.state_dict().items()}
    dtype = next(iter(state.values())).dtype
    config = copy.deepcopy(plain.config)
    # A GGUF-loaded config still names its quantisation; the weights here are plain.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
    fresh.load_state_dict(state, strict=True)
    with library_bars(False):  # no "Writing model shards" bar amid teamtr's own lines
        fresh.save_pretrained(target)
    tokenizer.save_pretrained(target)
