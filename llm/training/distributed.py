"""Data-parallel training on ``torch.distributed``: one team replicated on N processes.

``torchrun --nproc-per-node N -m teamtr train --config ...`` (or ``teamtr train --nproc N``,
which starts torchrun) runs the same stage loop on every rank, gloo on the CPU and NCCL on CUDA:

- **Rollouts are sharded by whole GRPO groups.** The global batch of ``prompts_per_batch``
  problems is drawn identically on every rank from the shared sampler generator and cut into
  ``S`` rollout shards (``[run] rollout_shards``; 0 = one per process); rank r plays the shards
  ``r*S/N .. (r+1)*S/N - 1``, each seeded by its own draw. Group normalisation needs no
  communication because no group is split. The result depends on ``S``, not on N: a one-process
  run with ``rollout_shards = 2`` samples exactly the episodes of a two-process run.
- **Every update decision is global.** The updater (``llm.update.updater``, through
  ``llm.common.collective``) sums token counts and LoRA gradients over the ranks and gathers the
  per-episode KLs and surrogates, so the trust-region statistic, every backtrack and the
  accept / reject decision are computed from the global batch, identically on every rank; the
  adapters and Adam states therefore stay replicated (checked after every stage).
- **Rank 0 alone writes** metrics, TensorBoard, events and checkpoints. All ranks read a
  checkpoint when resuming (the run directory must be on a filesystem all ranks see), and a
  run resumes only with the world size it was started with.
- **Evaluation is sharded** by problems and gathered in order, giving the one-process numbers.

The numpy core (``teamtr``) sees none of this: it talks to a sampler and an updater as always.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from llm.common.collective import Collective
from llm.common.command_faults import (  # noqa: F401 (importable from here as before)
    DistributedSetupError,
    launched_by_torchrun,
    leave_the_report_to_rank_zero,
    rank_from_environment,
)
from llm.common.config import ConfigError, RunConfig
from llm.models.agents import AdapterWeights
from llm.sampling.rollouts import DialogueRollouts, group_signal, prefixes_reusable
from llm.sampling.sampler import DialogueSampler

RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets for every worker; ``init_process_group("env://")`` needs all of them."""
WORLD_FILE = "distributed.json"
"""Run-directory file recording the world size and rollout shards a run was started with."""
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""A rank that waits this long for the others fails instead of hanging."""


@dataclass(frozen=True)
class WorldSpec:
    """The rendezvous variables of this process, validated."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> WorldSpec:
        environ = dict(os.environ) if environ is None else environ
        missing = [name for name in RENDEZVOUS_VARIABLES if not environ.get(name)]
        if missing:
            raise DistributedSetupError(
                f"torch.distributed: the rendezvous variable(s) {', '.join(missing)} are not set "
                "(a partial launch); start the run with `torchrun --nproc-per-node N -m teamtr "
                "train ...` or `teamtr train --nproc N ...`"
            )
        try:
            rank, world, local = (int(environ[n]) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
        except ValueError:
            raise DistributedSetupError(
                "torch.distributed: RANK, WORLD_SIZE and LOCAL_RANK must be integers, got "
                f"{[environ[n] for n in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')]}"
            ) from None
        if world < 1 or not 0 <= rank < world or local < 0:
            raise DistributedSetupError(
                f"torch.distributed: RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local} "
                "do not describe a valid process"
            )
        return cls(rank, world, local)


SHARDED_SIGNAL_MESSAGE = (
    "[sampler] signal_groups (dynamic sampling) is not supported with sharded rollouts "
    "(more than one process, or [run] rollout_shards > 1): set signal_groups = 0, or run "
    "one process with rollout_shards = 0 or 1"
)


def effective_shards(config: RunConfig, world_size: int) -> int:
    """The number of rollout shards: ``[run] rollout_shards``, or one per process."""
    return config.run.rollout_shards or world_size


def check_world(config: RunConfig, world_size: int, source: str = "") -> int:
    """That ``world_size`` processes can share the config's batches; returns the shard count."""
    where = f"{source}: " if source else ""
    if world_size > 1 and config.run.placement == "spread":
        raise ConfigError(
            f'{where}[run] placement = "spread" spreads one process\'s agents over the GPUs; '
            f'with {world_size} processes each owns one GPU: use "together"'
        )
    shards = effective_shards(config, world_size)
    if config.sampler.signal_groups and shards > 1:
        raise ConfigError(f"{where}{SHARDED_SIGNAL_MESSAGE}")
    batch = config.sampler.prompts_per_batch
    if shards % world_size:
        raise ConfigError(
            f"{where}[run] rollout_shards = {shards} cannot be split over {world_size} processes "
            "(it must be a multiple of the world size)"
        )
    if batch % shards:
        raise ConfigError(
            f"{where}[sampler] prompts_per_batch = {batch} is not divisible by "
            f"{'the world size' if not config.run.rollout_shards else '[run] rollout_shards'} "
            f"{shards}: every process samples whole GRPO groups of the same number of problems"
        )
    return shards


def record_world(run_dir: Path, world_size: int, shards: int) -> None:
    from llm.training.checkpoint import write_atomically

    text = json.dumps({"world_size": world_size, "rollout_shards": shards}) + "\n"
    write_atomically(run_dir / WORLD_FILE, text.encode())


def recorded_world(run_dir: Path) -> int:
    """The world size a run directory was trained with (1 for a single-process run)."""
    path = run_dir / WORLD_FILE
    if not path.is_file():
        return 1
    try:
        return int(json.loads(path.read_text())["world_size"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DistributedSetupError(f"{path}: unreadable ({error})") from None


def require_same_world(run_dir: Path, world_size: int) -> None:
    recorded = recorded_world(run_dir)
    if recorded != world_size:
        how = (
            "`teamtr train --resume DIR` (one process)"
            if recorded == 1
            else f"`torchrun --nproc-per-node {recorded} -m teamtr train --resume DIR` (or "
            f"`teamtr train --resume DIR --nproc {recorded}`)"
        )
        raise DistributedSetupError(
            f"{run_dir}: was trained by {recorded} process(es) but is being resumed by "
            f"{world_size}; the rollout shards and the replicated state are laid out for "
            f"{recorded}: resume it with {how}"
        )


# -- the process group -------------------------------------------------------------------------
def start_process_group(spec: WorldSpec, device_setting: str) -> None:
    """Join the run's process group: NCCL when the run is on CUDA, with rank r on
    ``cuda:LOCAL_RANK`` (one GPU per process), gloo otherwise."""
    use_cuda = device_setting.startswith("cuda") or (
        device_setting == "auto" and torch.cuda.is_available()
    )
    if use_cuda:
        if device_setting in ("auto", "cuda"):
            per_node = int(os.environ.get("LOCAL_WORLD_SIZE", spec.local_rank + 1))
            count = torch.cuda.device_count()
            if per_node > count:
                raise DistributedSetupError(
                    f"torch.distributed: {per_node} processes on this node but {count} CUDA "
                    "device(s); NCCL needs one GPU per process (--nproc-per-node at most "
                    f'{count}), or set [run] device = "cpu" for gloo'
                )
            torch.cuda.set_device(spec.local_rank)
        else:
            torch.cuda.set_device(torch.device(device_setting))
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)


def stop_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class ProcessGroupCollective(Collective):
    """``Collective`` over the default ``torch.distributed`` process group."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.backend = dist.get_backend()

    def gather(self, value: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def sum_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        # A rank whose shard holds none of the agent's messages contributes zeros.
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for parameter, grad in zip(parameters, grads, strict=True):
            parameter.grad = flat[offset : offset + grad.numel()].view_as(grad).clone()
            offset += grad.numel()


def agree(collective: Collective, error: Exception | None) -> None:
    """Raise on every rank when any rank failed a check (the lowest failing rank's message), so
    that no rank goes on to wait for one that has stopped."""
    messages = collective.gather(None if error is None else (type(error).__name__, str(error)))
    failed = [m for m in messages if m is not None]
    if not failed:
        return
    if error is not None and error.args and str(error) == failed[0][1]:
        raise error
    raise DistributedSetupError(failed[0][1])


def replicas_agree(collective: Collective, policies: Sequence[AdapterWeights]) -> None:
    """Check that every rank holds the same adapters (they are updated by identical steps)."""
    if collective.world_size == 1:
        return
    # By key: a checkpoint's tensors come back in an order that may differ between processes.
    fingerprint = [
        (key, float(t.double().sum()), float(t.double().square().sum()))
        for policy in policies
        for key, t in sorted(policy.tensors.items())
    ]
    prints = collective.gather(fingerprint)
    if any(p != prints[0] for p in prints[1:]):
        raise RuntimeError("the ranks' adapters diverged: data-parallel replicas must agree")


# -- sharded sampling --------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardedRollouts(DialogueRollouts):
    """One rank's shard of the rollouts, with the global batch's rewards for the metrics."""

    all_rewards: np.ndarray = field(default_factory=lambda: np.zeros(0))
    all_parsed: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def mean_reward(self) -> float:
        return float(self.all_rewards.mean())

    @property
    def parse_failure_rate(self) -> float:
        return float(1.0 - self.all_parsed.mean())

    @property
    def held_signal_groups(self) -> int:
        return int(group_signal(self.all_rewards, self.group_size).sum())


class ShardedSampler(DialogueSampler):
    """A ``DialogueSampler`` that plays this rank's rollout shards of every batch.

    Every rank draws the whole batch (problems, routing seeds) and every shard's generation
    seed from the shared generator, so the generators stay equal on all ranks; a shard is whole
    GRPO groups, played with its own seed. Prefix reuse works per episode, as in one process.
    Dynamic sampling (``[sampler] signal_groups``) is not sharded: its rounds would need every
    rank's rewards before the next draw, and its kept groups moved between ranks.
    """

    def __init__(self, *args: Any, shards: int, collective: Collective, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.settings.signal_groups:
            raise ConfigError(SHARDED_SIGNAL_MESSAGE)
        self.shards = shards
        self.collective = collective
        per_rank = shards // collective.world_size
        self.local_shards = range(collective.rank * per_rank, (collective.rank + 1) * per_rank)
        self.shard_episodes = (self.settings.prompts_per_batch // shards) * self.settings.group_size

    def sample(
        self,
        team,
        *,
        previous: DialogueRollouts | None = None,
        updated_agent: int | None = None,
    ) -> DialogueRollouts:
        started = time.perf_counter()
        reusable = prefixes_reusable(team, previous, updated_agent)
        size = self.shard_episodes
        reused = 0
        if not reusable:
            batch = self.new_episodes()
            local = [batch[s * size : (s + 1) * size] for s in self.local_shards]
        else:
            assert previous is not None and updated_agent is not None
            truncated, reused = self.reusable_prefixes(previous, updated_agent)
            local = [truncated[i * size : (i + 1) * size] for i in range(len(self.local_shards))]
        seeds = [int(self.rng.integers(2**31)) for _ in range(self.shards)]
        episodes = []
        generated = 0
        # Each rank's engine keeps the contexts of its own shards.
        with self.engine.drawing(team, continues=reusable):
            for shard, shard_episodes in zip(self.local_shards, local, strict=True):
                played, tokens = self.play(team, shard_episodes, seed=seeds[shard])
                episodes.extend(played)
                generated += tokens
        rollouts = self.finish(team, episodes, generated, reused, started)
        together = self.collective
        values = {f.name: getattr(rollouts, f.name) for f in dataclasses.fields(DialogueRollouts)}
        # The metrics describe the global batch: every rank's tokens and rewards, in rank order.
        values["generated_tokens"] = int(together.sum(generated))
        values["reused_turns"] = int(together.sum(reused))
        values["groups_drawn"] = int(together.sum(rollouts.groups_drawn))
        values["groups_with_signal"] = int(together.sum(rollouts.groups_with_signal))
        return ShardedRollouts(
            **values,
            all_rewards=together.concatenate(rollouts.rewards),
            all_parsed=together.concatenate(rollouts.parsed),
        )


# -- the launcher ------------------------------------------------------------------------------
@contextmanager
def launch_temporary_directory() -> Iterator[Path]:
    """A temporary directory of the launch's own, the launcher's and the ranks' ``TMPDIR``
    (torchrun makes a ``torchelastic_*`` directory there for each launch and leaves it behind),
    removed when the launch ends however it ends."""
    directory = Path(tempfile.mkdtemp(prefix="teamtr-launch-"))
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = str(directory)
    tempfile.tempdir = str(directory)
    try:
        yield directory
    finally:
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
        shutil.rmtree(directory, ignore_errors=True)


def launch(nproc: int, argv: list[str]) -> int:
    """``teamtr train ... --nproc N``: start N local ranks with torchrun (standalone rendezvous)
    and return 2 if any rank exited with 2 (bad input), 130 if interrupted, else torchrun's."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    arguments = ["--standalone", f"--nproc-per-node={nproc}", "-m", "teamtr", "train", *argv]
    try:
        with launch_temporary_directory():
            run(get_args_parser().parse_args(arguments))
    except ChildFailedError as failure:
        codes = {f.exitcode for f in failure.failures.values()}
        if 2 in codes:
            return 2
        if 130 in codes:
            return 130
        print(f"error: a rank failed (exit codes {sorted(codes)})", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SignalException):  # the ranks got the signal too and saved
        return 130
    return 0
