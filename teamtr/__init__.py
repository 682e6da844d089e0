"""teamtr: certified trust-region training of turn-taking teams of agents.

The shared core (numpy only, never torch). Public API:

- protocols: ``TeamPolicy``, ``Rollouts``, ``Sampler``, ``AgentUpdater``; optional, to measure
  updates: ``PairingSampler``, ``PairedRollouts``, ``SequentialPairingSampler``
- the stage loop: ``run_stage``, ``run_stages``, ``stage_order``, ``StageConfig``, ``SCHEMES``
- reports: ``AgentUpdate``, ``UpdateRecord``, ``StageReport``
- the measured certificate (``teamtr.measured``): ``PairedDifferences``, ``MeasuredCertificate``
- penalties of Thm 3.4: ``DiscountedPenalty``, ``EpisodicPenalty``
- a conformance checker for backends: ``check_backend``, ``BackendCheckError``
- math modules: ``teamtr.divergence``, ``teamtr.surrogate``, ``teamtr.turns``,
  ``teamtr.trust_region``, ``teamtr.bounds``, ``teamtr.alignment``
"""

from teamtr.config import SCHEMES, StageConfig
from teamtr.conformance import BackendCheckError, check_backend
from teamtr.measured import MeasuredCertificate, PairedDifferences
from teamtr.penalty import DiscountedPenalty, EpisodicPenalty, PenaltyModel
from teamtr.protocols import (
    AgentUpdater,
    PairedRollouts,
    PairingSampler,
    Rollouts,
    Sampler,
    SequentialPairingSampler,
    TeamPolicy,
)
from teamtr.reports import AgentUpdate, StageReport, UpdateRecord
from teamtr.stage import run_stage, run_stages, stage_order

__all__ = [
    "SCHEMES",
    "AgentUpdate",
    "AgentUpdater",
    "BackendCheckError",
    "DiscountedPenalty",
    "EpisodicPenalty",
    "MeasuredCertificate",
    "PairedDifferences",
    "PairedRollouts",
    "PairingSampler",
    "PenaltyModel",
    "Rollouts",
    "Sampler",
    "SequentialPairingSampler",
    "StageConfig",
    "StageReport",
    "TeamPolicy",
    "UpdateRecord",
    "check_backend",
    "run_stage",
    "run_stages",
    "stage_order",
]
__version__ = "0.1.0"
