"""What the updater, the sampler and the evaluation agree on across processes.

``Collective`` is the single-process case: every operation returns its input. The
data-parallel run (``llm.training.distributed.ProcessGroupCollective``) implements the same operations
with ``torch.distributed``, so that every rank reaches the same accept / reject / backtrack
decision from the same global numbers. All reductions are done in rank order on every rank
(gather, then combine locally), so each rank computes bit-identical results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


class Collective:
    """One process: nothing to exchange."""

    rank = 0
    world_size = 1

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run's files (rank 0)."""
        return self.rank == 0

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        return [value]

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        return value

    def sum_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by the sum over ranks (missing ones count as 0)."""

    def any(self, flag: bool) -> bool:
        return any(self.gather(bool(flag)))

    def max(self, value: float) -> float:
        return max(self.gather(float(value)))

    def sum(self, value: float) -> float:
        total = 0.0
        for part in self.gather(float(value)):  # in rank order: the same float on every rank
            total += part
        return total

    def concatenate(self, array: np.ndarray) -> np.ndarray:
        """The ranks' 1-D arrays joined in rank order (per-episode values of the global batch)."""
        parts = self.gather(np.asarray(array))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
