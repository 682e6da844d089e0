"""Theorems 3.4 and 3.6 as ``teamtr.run_stage`` certifies them, on ``sim``'s exact backend."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from proofs_check import oracle
from proofs_check.instances import Direction, TabularMDP
from proofs_check.tolerances import float_allowance, value_scale
from proofs_check.traces import to_sim

FloatArray = NDArray[np.float64]


def stage_loop_slacks(
    mdp: TabularMDP,
    start: FloatArray,
    direction: Direction,
    radius: float,
    penalty_form: str = "kl",
    order_seed: int = 0,
) -> list[float]:
    """Thm 3.6 as the library runs it: one ``teamtr.run_stage`` of the ``teamtr`` scheme with
    ``sim``'s exact sampler and updater in a random order. Slacks: realised gain minus
    certificate for every kept update (Thm 3.4), and for the stage (Thm 3.6), J exact."""
    from sim.rollouts import ExactSampler
    from sim.team import TabularTeam
    from sim.updates import ExactUpdater
    from teamtr.config import StageConfig
    from teamtr.stage import run_stage

    sim_mdp = to_sim(mdp)
    evaluate = oracle.discounted if mdp.horizon is None else oracle.episodic
    config = StageConfig(
        scheme="teamtr",
        radius=radius,
        order="random",
        seed=order_seed,
        penalty_form=penalty_form,  # type: ignore[arg-type]
    )
    report, _ = run_stage(
        TabularTeam(start, mdp.agent_of_state, n_agents=mdp.n_agents),
        ExactSampler(sim_mdp),
        ExactUpdater(sim_mdp, direction=direction),
        config,
        sim_mdp.penalty_model(),
        evaluator=lambda team: evaluate(mdp, np.asarray(team.table)).J,  # type: ignore[attr-defined]
    )
    allowance = float_allowance(value_scale(mdp) * len(report.records))
    slacks = []
    for record in report.records:
        if record.kept:
            assert record.realised_gain is not None
            slacks.append(record.realised_gain - record.certificate + allowance)
    assert report.realised_gain is not None
    slacks.append(report.realised_gain - report.certificate + allowance)
    return slacks
