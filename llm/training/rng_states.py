"""Every random generator a training run draws from, captured and put back: torch's (CPU and
every CUDA device's), numpy's and Python's global generators, and the sampler's own (problems,
routing seeds, the seed of every generation). A resumed run restores them from its checkpoint
(``llm.training.checkpoint``) and draws what an uninterrupted run would have drawn.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from llm.common.devices import cuda_rng_states, restore_cuda_rng_states


@dataclass(frozen=True)
class RngStates:
    """Every random generator a run draws from."""

    torch_state: torch.Tensor
    numpy_global: list[Any]
    python: list[Any]
    sampler: dict[str, Any]
    cuda_states: tuple[torch.Tensor, ...] = ()
    """Every CUDA generator's state, on the CPU (empty for a run without CUDA)."""

    @classmethod
    def capture(cls, sampler_rng: np.random.Generator) -> RngStates:
        # The legacy global generator is saved because library code may draw from it.
        name, key, position, has_gauss, gauss = np.random.get_state(legacy=True)  # noqa: NPY002
        version, internal, python_gauss = random.getstate()
        return cls(
            torch_state=torch.get_rng_state(),
            numpy_global=[
                name,
                np.asarray(key).tolist(),
                int(position),
                int(has_gauss),
                float(gauss),
            ],
            python=[version, list(internal), python_gauss],
            sampler=copy.deepcopy(dict(sampler_rng.bit_generator.state)),
            cuda_states=tuple(cuda_rng_states()),
        )

    def restore(self, sampler_rng: np.random.Generator) -> None:
        torch.set_rng_state(self.torch_state)
        restore_cuda_rng_states(list(self.cuda_states))
        name, key, position, has_gauss, gauss = self.numpy_global
        key_array = np.asarray(key, dtype=np.uint32)
        np.random.set_state((name, key_array, position, has_gauss, gauss))  # noqa: NPY002
        version, internal, python_gauss = self.python
        random.setstate((version, tuple(internal), python_gauss))
        sampler_rng.bit_generator.state = copy.deepcopy(self.sampler)
