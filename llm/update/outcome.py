"""How a language-model agent's update ended, typed (``teamtr.reports.AgentUpdate`` keeps the
core's meaning; this adds what only this backend knows, instead of status strings in
``extras``)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from llm.update.mismatch import PolicyMismatch
from teamtr.reports import AgentUpdate


class Outcome(enum.Enum):
    """Why the agent's policy is what it is after the update."""

    STEPPED = "stepped"
    """At least one Adam step was admitted inside the trust region."""
    REJECTED = "rejected"
    """Not even the shrunk first step fitted the region: the old policy is kept."""
    NO_SIGNAL = "no signal"
    """Every group's rewards were equal: the surrogate and its gradient are 0, the identity is
    the update, and no forward pass was needed."""
    SILENT = "silent"
    """The agent spoke no token in the rollouts: nothing to learn, nothing changes."""
    NON_FINITE = "non-finite"
    """A loss, gradient, KL, surrogate or HAPPO weight was not finite: parameters and optimiser
    state went back to what they were before the update (``LoraUpdate.non_finite`` says which)."""


@dataclass(frozen=True, kw_only=True)
class LoraUpdate(AgentUpdate):
    """``TrustRegionUpdater.update``'s result: the core's record and how the update ended."""

    outcome: Outcome
    non_finite: str | None = None
    """With ``Outcome.NON_FINITE``: the quantity ("loss", "gradient", "kl", "surrogate",
    "weights")."""
    tokens: int = 0
    """The agent's message tokens in the (global) batch."""
    steps: int = 0
    """Adam steps admitted."""
    effective_sample_size: float = 1.0
    """(sum w)^2 / (N sum w^2) of the batch's episode weights (``effective_sample_size``): 1
    for on-policy rollouts, below 1 where HAPPO reweighted a cached batch."""
    mismatch: PolicyMismatch | None = None
    """The sampler's recorded log-probs against the trainer's pre-update pass
    (``llm.update.mismatch``); None where the sampler did not record them."""

    def __post_init__(self) -> None:
        if (self.outcome is Outcome.NON_FINITE) != (self.non_finite is not None):
            raise ValueError(
                f"LoraUpdate: outcome {self.outcome.value} with non_finite={self.non_finite!r}"
            )
        if self.accepted != (self.outcome is not Outcome.REJECTED and self.non_finite is None):
            raise ValueError(f"LoraUpdate: outcome {self.outcome.value}, accepted={self.accepted}")


def effective_sample_size(weights: np.ndarray) -> float:
    """Kish's effective sample size of importance weights, as a share of the batch:
    (sum w)^2 / (N sum w^2), in (0, 1], 1 exactly when every weight is the same. HAPPO's
    reweighted batch estimates the intermediate team's surrogate from as many independent
    episodes as this share of N would (nan where a weight is not finite)."""
    w = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(w).all():
        return math.nan
    return float(w.sum() ** 2 / (len(w) * np.square(w).sum()))


def lora_update(update: AgentUpdate) -> LoraUpdate:
    """``update`` as this backend's record (the core's stage records hold the core's type)."""
    if not isinstance(update, LoraUpdate):
        raise TypeError(f"expected a LoraUpdate from TrustRegionUpdater, got {type(update)}")
    return update
