"""Checkpoints that hold a run's whole state, written atomically and verified when read.

A checkpoint ``checkpoints/stage_N`` is the state at the start of stage N (position 0 of its
update order, i.e. after N completed stages): resuming from it replays stage N exactly as an
uninterrupted run would. It holds

- ``agent{k}.safetensors``: every agent's adapter weights (its policy);
- ``state.pt``: every agent's Adam state (the trust-region step of ``llm.update.updater`` restarts from
  the configured learning rate at each update, so the optimiser state is the controller's
  whole state) and torch's RNG state;
- ``state.json``: the position (stage N, update position 0), numpy's and Python's global RNG
  states, the sampler's generator (it draws problems, routing seeds and the torch seed of
  every generation, so the router's randomness is restored with it), the metrics lines
  written so far and the run's elapsed seconds (for ``time_budget_minutes``);
- ``manifest.json``, written last: the format version and a SHA-256 of every other file.

The update order needs no state: ``teamtr.stage.stage_order`` draws it from (seed, stage).

Every file is written to a temporary directory, fsynced, and the directory is renamed into
place, so a crash leaves either the whole checkpoint or none. A checkpoint whose manifest is
missing or does not match its files is skipped with a warning and the one before it is used.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from llm.common.command_faults import RunDirectoryError  # noqa: F401 (importable from here)
from llm.models.agents import AdapterWeights, LoraTeam
from llm.training.rng_states import RngStates
from llm.update.updater import TrustRegionUpdater

FORMAT_VERSION = 1
"""Bumped whenever the run directory or checkpoint layout changes incompatibly."""
LEGACY_FORMAT = 0
"""Run directories written before the format was recorded: adapters only, no manifest."""
RUN_MARKER = "teamtr_run.json"
MANIFEST = "manifest.json"
CHECKPOINTS = "checkpoints"
STAGE_PREFIX = "stage_"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """The state of a run at the start of stage ``stage`` (position 0 in its update order)."""

    stage: int
    policies: tuple[AdapterWeights, ...]
    optimizer_states: dict[int, dict[str, Any]]
    rng: RngStates
    metrics_lines: tuple[str, ...]
    elapsed_seconds: float
    finished: bool = False
    """True when the run ended here (its last stage, or its time budget, was reached)."""

    @classmethod
    def capture(
        cls,
        stage: int,
        team: LoraTeam,
        updater: TrustRegionUpdater,
        sampler_rng: np.random.Generator,
        metrics_lines: tuple[str, ...],
        elapsed_seconds: float,
        finished: bool = False,
    ) -> ResumePoint:
        # Adam updates its moments in place: copy them, the snapshot must not move on.
        states = {k: copy.deepcopy(o.state_dict()) for k, o in updater.optimizers.items()}
        rng = RngStates.capture(sampler_rng)
        return cls(stage, team.policies, states, rng, metrics_lines, elapsed_seconds, finished)

    def restore(
        self, team: LoraTeam, updater: TrustRegionUpdater, sampler_rng: np.random.Generator
    ) -> LoraTeam:
        """Put this state into a freshly built run; returns the team to continue from."""
        if len(self.policies) != team.n_agents:
            raise RunDirectoryError(
                f"checkpoint has {len(self.policies)} agents, the config {team.n_agents}"
            )
        restored = LoraTeam(team.backbone, on_backbone_device(team, self.policies))
        restored.activate()
        for agent, state in sorted(self.optimizer_states.items()):
            updater.optimizer_for(restored, agent).load_state_dict(copy.deepcopy(state))
        self.rng.restore(sampler_rng)
        return restored


def on_backbone_device(
    team: LoraTeam, policies: tuple[AdapterWeights, ...]
) -> tuple[AdapterWeights, ...]:
    """``policies`` moved to the device of the slots they belong to (checkpoints are read onto
    the CPU, whatever device wrote them); policies already there are returned as they are."""
    moved = []
    for index, policy in enumerate(policies):
        slot = next(iter(team.backbone.parameters_of(index).values()))
        if all(tensor.device == slot.device for tensor in policy.tensors.values()):
            moved.append(policy)
        else:
            tensors = {key: tensor.to(slot.device) for key, tensor in policy.tensors.items()}
            moved.append(AdapterWeights(tensors))
    return tuple(moved)


# -- atomic files -------------------------------------------------------------------------------
def _write_durably(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data``: temporary file, fsync, rename, fsync of the directory.

    A failed write (a full disk) removes its temporary file and leaves ``path`` as it was.
    """
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        _write_durably(temporary, data)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- run directories ----------------------------------------------------------------------------
def write_run_marker(run_dir: Path) -> None:
    write_atomically(
        run_dir / RUN_MARKER, json.dumps({"format_version": FORMAT_VERSION}).encode() + b"\n"
    )


def run_format(run_dir: Path) -> int:
    """The format version of a run directory; raises RunDirectoryError if it is unusable."""
    if not (run_dir / "config.json").is_file():
        raise RunDirectoryError(f"{run_dir}: not a run directory (no config.json)")
    marker = run_dir / RUN_MARKER
    if not marker.is_file():
        return LEGACY_FORMAT
    try:
        version = json.loads(marker.read_text())["format_version"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RunDirectoryError(f"{marker}: unreadable run marker ({error})") from None
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RunDirectoryError(
            f"{marker}: format_version {version!r} was written by a newer teamtr; "
            f"this one reads versions {LEGACY_FORMAT} to {FORMAT_VERSION}"
        )
    return version


def require_resumable(run_dir: Path) -> None:
    version = run_format(run_dir)
    if version != FORMAT_VERSION:
        raise RunDirectoryError(
            f"{run_dir}: format_version {version} cannot be resumed (it has no full-state "
            f"checkpoints); resuming needs format_version {FORMAT_VERSION}"
        )


def stage_directories(run_dir: Path) -> list[Path]:
    """``checkpoints/stage_N`` directories, oldest first (temporary ones are skipped)."""
    found = []
    for path in (run_dir / CHECKPOINTS).glob(f"{STAGE_PREFIX}*"):
        suffix = path.name.removeprefix(STAGE_PREFIX)
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return [path for _, path in sorted(found)]


# -- writing and reading checkpoints ------------------------------------------------------------
def write_checkpoint(run_dir: Path, point: ResumePoint) -> Path:
    """Write ``point`` as ``checkpoints/stage_{point.stage}``, atomically; returns its path."""
    parent = run_dir / CHECKPOINTS
    parent.mkdir(parents=True, exist_ok=True)
    final = parent / f"{STAGE_PREFIX}{point.stage}"
    temporary = parent / f".{final.name}.tmp-{os.getpid()}"
    if temporary.exists():
        shutil.rmtree(temporary)
    temporary.mkdir()
    try:
        _fill_checkpoint(temporary, point)
    except BaseException:  # a full disk or a signal mid-write: no torn directory stays behind
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    if final.exists():
        # A checkpoint of the same stage (written again after a resume): move it aside first,
        # so that at every moment either it or the new one is complete.
        aside = parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, aside)
        os.replace(temporary, final)
        shutil.rmtree(aside)
    else:
        os.replace(temporary, final)
    _fsync_directory(parent)
    return final


def _fill_checkpoint(temporary: Path, point: ResumePoint) -> None:
    """Write every file of ``point`` into the directory ``temporary``, manifest last."""
    files: dict[str, bytes] = {}
    for index, policy in enumerate(point.policies):
        tensors = {k: v.contiguous().cpu() for k, v in policy.tensors.items()}
        files[f"agent{index}.safetensors"] = save_safetensors(tensors)
    buffer = io.BytesIO()
    saved: dict[str, Any] = {
        "optimizers": point.optimizer_states,
        "torch_rng": point.rng.torch_state,
    }
    if point.rng.cuda_states:
        saved["cuda_rng"] = list(point.rng.cuda_states)
    torch.save(saved, buffer)
    files["state.pt"] = buffer.getvalue()
    state = {
        "format_version": FORMAT_VERSION,
        "position": {"stage": point.stage, "update": 0},
        "rng": {
            "numpy_global": point.rng.numpy_global,
            "python": point.rng.python,
            "sampler": point.rng.sampler,
        },
        "metrics_lines": list(point.metrics_lines),
        "elapsed_seconds": point.elapsed_seconds,
        "finished": point.finished,
    }
    files["state.json"] = json.dumps(state).encode()
    for name, data in files.items():
        _write_durably(temporary / name, data)
    manifest = {
        "format_version": FORMAT_VERSION,
        "files": {name: _sha256(data) for name, data in files.items()},
    }
    _write_durably(temporary / MANIFEST, json.dumps(manifest, indent=1).encode())
    _fsync_directory(temporary)


def _verified_files(directory: Path) -> dict[str, bytes]:
    manifest_path = directory / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        version = manifest["format_version"]
        expected = dict(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RunDirectoryError(f"{manifest_path}: missing or unreadable ({error})") from None
    if version != FORMAT_VERSION:
        raise RunDirectoryError(
            f"{manifest_path}: format_version {version!r}, this teamtr reads {FORMAT_VERSION}"
        )
    files = {}
    for name, digest in expected.items():
        try:
            data = (directory / name).read_bytes()
        except OSError as error:
            raise RunDirectoryError(f"{directory / name}: unreadable ({error})") from None
        if _sha256(data) != digest:
            raise RunDirectoryError(f"{directory / name}: checksum does not match the manifest")
        files[name] = data
    return files


def read_checkpoint(directory: Path) -> ResumePoint:
    """A verified checkpoint; raises RunDirectoryError if it is torn, corrupt or foreign."""
    files = _verified_files(directory)
    try:
        state = json.loads(files["state.json"])
        # Onto the CPU whatever device wrote it: the optimisers move their state to their
        # parameters' device when it is loaded into them.
        tensors = torch.load(io.BytesIO(files["state.pt"]), weights_only=True, map_location="cpu")
        policies = []
        for index in range(len(files)):
            name = f"agent{index}.safetensors"
            if name not in files:
                break
            policies.append(AdapterWeights(load_safetensors(files[name])))
        rng = RngStates(
            torch_state=tensors["torch_rng"],
            numpy_global=state["rng"]["numpy_global"],
            python=state["rng"]["python"],
            sampler=state["rng"]["sampler"],
            cuda_states=tuple(tensors.get("cuda_rng", ())),
        )
        return ResumePoint(
            stage=int(state["position"]["stage"]),
            policies=tuple(policies),
            optimizer_states={int(k): v for k, v in tensors["optimizers"].items()},
            rng=rng,
            metrics_lines=tuple(state["metrics_lines"]),
            elapsed_seconds=float(state["elapsed_seconds"]),
            finished=bool(state["finished"]),
        )
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise RunDirectoryError(f"{directory}: malformed checkpoint ({error})") from None


INTERRUPTED_CHECKPOINT = re.compile(rf"\.({STAGE_PREFIX}\d+)\.(tmp|old)-\d+")
"""``.stage_N.tmp-PID`` (being written) and ``.stage_N.old-PID`` (the same stage's previous
copy, moved aside for a moment): what a killed ``write_checkpoint`` leaves behind."""
INTERRUPTED_FILE = re.compile(r"\..+\.tmp-\d+")
"""``.NAME.tmp-PID``: a file ``write_atomically`` had not yet renamed into place."""


def _verifies(directory: Path) -> bool:
    try:
        read_checkpoint(directory)
    except RunDirectoryError:
        return False
    return True


def recover_interrupted_writes(run_dir: Path) -> list[str]:
    """Clean up what interrupted writes left in ``run_dir``; returns what was done.

    Call only while holding the run's lock (``llm.training.runlock``), so that no live process is
    writing these. For each stage, a complete ``stage_N`` that verifies is kept and its
    leftover copies removed; where ``stage_N`` is missing or does not verify, a leftover copy
    whose manifest verifies takes its place (the ``.tmp`` one first: it is the newer), and
    the rest is removed. Half-written files (``.NAME.tmp-PID``) are removed.
    """
    done: list[str] = []
    for path in run_dir.iterdir():
        if path.is_file() and INTERRUPTED_FILE.fullmatch(path.name):
            path.unlink()
            done.append(f"removed {path.name}")
    parent = run_dir / CHECKPOINTS
    if not parent.is_dir():
        return done
    leftovers: dict[str, list[tuple[str, Path]]] = {}
    for path in parent.iterdir():
        match = INTERRUPTED_CHECKPOINT.fullmatch(path.name)
        if match:
            leftovers.setdefault(match[1], []).append((match[2], path))
    for name, copies in sorted(leftovers.items()):
        final = parent / name
        copies.sort(key=lambda kind_path: kind_path[0] != "tmp")  # .tmp (newer) first
        if not (final.is_dir() and _verifies(final)):
            usable = next((p for _, p in copies if p.is_dir() and _verifies(p)), None)
            if usable is not None:
                if final.exists():
                    shutil.rmtree(final)
                os.replace(usable, final)
                done.append(f"restored {name} from {usable.name}")
        for _, path in copies:
            if path.exists():
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                done.append(f"removed {path.name}")
    _fsync_directory(parent)
    return done


@dataclass(frozen=True)
class LatestCheckpoint:
    """The newest checkpoint that verifies (None: there is none) and the ones skipped over."""

    directory: Path | None
    point: ResumePoint | None
    skipped: tuple[str, ...]
    """``"stage_N: why"`` for each newer checkpoint that was torn or corrupt."""


def latest_checkpoint(run_dir: Path) -> LatestCheckpoint:
    """The newest checkpoint that verifies; corrupt ones are skipped with a warning."""
    skipped: list[str] = []
    for directory in reversed(stage_directories(run_dir)):
        try:
            return LatestCheckpoint(directory, read_checkpoint(directory), tuple(skipped))
        except RunDirectoryError as error:
            log.warning("skipping checkpoint %s: %s; using the one before it", directory, error)
            skipped.append(f"{directory.name}: {error}")
    return LatestCheckpoint(None, None, tuple(skipped))


@dataclass(frozen=True)
class FoundPolicies:
    """The adapters of one checkpoint, which one it is, and the newer ones skipped over."""

    directory: Path
    policies: tuple[AdapterWeights, ...]
    skipped: tuple[str, ...]


def load_policies(
    run_dir: str | Path, step: int | None, n_agents: int
) -> tuple[AdapterWeights, ...]:
    """The adapters of checkpoint ``stage_{step}`` (default: the latest usable one), for eval
    (``llm.load_team`` gives the whole team, ready to play)."""
    return find_policies(run_dir, step, n_agents).policies


def find_policies(run_dir: str | Path, step: int | None, n_agents: int) -> FoundPolicies:
    """The adapters of checkpoint ``stage_{step}`` (default: the latest usable one) and where
    they came from. Legacy run directories (no format marker) are read without checksums."""
    run_dir = Path(run_dir)
    version = run_format(run_dir)
    available = stage_directories(run_dir)
    if not available:
        raise RunDirectoryError(f"{run_dir}: no checkpoints")
    if step is not None:
        wanted = run_dir / CHECKPOINTS / f"{STAGE_PREFIX}{step}"
        if wanted not in available:
            raise RunDirectoryError(
                f"{wanted}: no such checkpoint (have {[p.name for p in available]})"
            )
        candidates = [wanted]
    else:
        candidates = list(reversed(available))
    skipped = []
    for directory in candidates:
        try:
            if version == LEGACY_FORMAT:
                policies = tuple(
                    AdapterWeights(
                        load_safetensors((directory / f"agent{k}.safetensors").read_bytes())
                    )
                    for k in range(n_agents)
                )
            else:
                policies = read_checkpoint(directory).policies
        except (RunDirectoryError, OSError) as error:
            if step is not None:
                raise RunDirectoryError(f"{directory}: {error}") from None
            log.warning("skipping checkpoint %s: %s; using the one before it", directory, error)
            skipped.append(f"{directory.name}: {error}")
            continue
        if len(policies) != n_agents:
            raise RunDirectoryError(
                f"{directory}: has {len(policies)} agents, the run's config {n_agents}"
            )
        return FoundPolicies(directory, policies, tuple(skipped))
    raise RunDirectoryError(f"{run_dir}: no usable checkpoint")
