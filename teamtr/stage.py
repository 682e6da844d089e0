"""The stage loop, once for every scheme and both backends (ARCHITECTURE.md, "One stage").

One stage of sequential trust-region training, THEORY.md §1–2:

    pi_hat^0 = pi_cur
    for i, k = sigma(i):
        rollouts  <- fresh samples of pi_hat^{i-1}      (teamtr: intermediate occupancy)
                     or the stage-start cache of pi_cur  (stale / joint; happo reweights it)
        update    <- the updater's trust-region step for agent k on those rollouts
        keep it only if accepted and E_d[KL_i] <= delta_i          (the radius is enforced)
        certificate_i = L_i - C_i sqrt(KL_i)                         (Thm 3.4, KL form)
        pi_hat^i  = pi_hat^{i-1} with agent k replaced               (joint: all at the end)
    stage certificate = sum_i certificate_i                          (Thm 3.6)

Measured certificate (``teamtr.measured``, teamtr scheme with a pairing sampler): after a
kept update the loop draws pi_hat^i at once, continuing pi_hat^{i-1}'s held-out groups; their
pairs bound J(pi_hat^i) - J(pi_hat^{i-1}) at level 1 - alpha, and the draw serves update i+1.
After the stage's last update only the held-out groups are continued.
With ``certificate_batch`` > 0 the pairs are drawn on: fresh held-out groups of pi_hat^{i-1}
continued by pi_hat^i, a batch at a time, until the anytime bound decides (sequential draws).
Under ``accept = "measured"`` an update whose bound is below 0 is undone: the team stays
pi_hat^{i-1}, that draw is discarded and pi_hat^{i-1} is drawn afresh (its earlier held-out
groups decided the undo, so they measure nothing more).

For `joint` the stage bound is Thm 3.4 applied to the whole team move: by Lemma 3.1 the team's
divergence at s is that of the agent active in s, so the team's expected KL is the sum of the
agents' and its surrogate the sum of theirs, all under d_{pi_cur}.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, TypeVar, cast

import numpy as np

from teamtr.config import StageConfig
from teamtr.evaluations import PerTeamCache
from teamtr.measured import (
    ANYTIME,
    MeasuredCertificate,
    PairedDifferences,
    measure,
    sequential_measure,
    stage_measured,
)
from teamtr.penalty import PenaltyModel
from teamtr.protocols import (
    AgentUpdater,
    PairingSampler,
    Rollouts,
    Sampler,
    SequentialPairingSampler,
    TeamPolicy,
)
from teamtr.reports import AgentUpdate, StageReport, UpdateRecord
from teamtr.schemes import RolloutSource
from teamtr.trust_region import admitted

TeamT = TypeVar("TeamT", bound=TeamPolicy)
"""The backend's own team type: a stage returns the same type it was given."""

Evaluator = Callable[[TeamPolicy], float]
"""Exact J of a team, where the backend has it (sim); None for language models."""


def stage_order(config: StageConfig, n_agents: int, stage_index: int = 0) -> tuple[int, ...]:
    """The update order sigma of stage ``stage_index`` (Thm 3.6 holds for any order).

    An explicit order may name any distinct agents: ``(k,)`` updates agent k alone (the sum of
    Thm 3.6 then runs over that one update; the other agents stay as they are).
    """
    if isinstance(config.order, tuple):
        if any(k >= n_agents for k in config.order):
            raise ValueError(f"order {config.order} names an agent outside a team of {n_agents}")
        return config.order
    if config.order == "random":
        rng = np.random.default_rng([config.seed, stage_index])
        return tuple(int(k) for k in rng.permutation(n_agents))
    return tuple(range(n_agents))


def update_penalty(update: AgentUpdate, penalty: PenaltyModel, form: str) -> float:
    """The Thm 3.4 penalty of one update, in the configured form."""
    if form == "tv":
        if update.tv is None:
            raise ValueError("penalty_form='tv' needs updates that report their expected TV")
        return penalty.tv_penalty(update.advantage_bound, update.tv)
    return penalty.kl_penalty(update.advantage_bound, update.kl)


def inside_radius(update: AgentUpdate, radius: float, tolerance: float) -> bool:
    """Whether an update may enter the team: accepted, finite, and E_d[KL_i] <= delta_i
    (``teamtr.trust_region.admitted`` with the config's ``kl_tolerance``)."""
    finite = all(math.isfinite(x) for x in (update.kl, update.surrogate, update.advantage_bound))
    return update.accepted and finite and admitted(update.kl, radius, tolerance)


def measuring_sampler(sampler: Sampler, config: StageConfig) -> Sampler | None:
    """The sampler that holds out ``config.certificate_groups`` groups, where the scheme's
    resample can continue them and the sampler pairs; None where nothing is measured."""
    if config.certificate_groups == 0 or config.scheme != "teamtr":
        return None
    if not isinstance(sampler, PairingSampler):
        if config.accept == "measured":
            raise ValueError(
                "accept='measured' needs a sampler that pairs held-out groups "
                f"(teamtr.protocols.PairingSampler); {type(sampler).__name__} has no with_held_out"
            )
        return None
    if config.certificate_batch and not isinstance(sampler, SequentialPairingSampler):
        raise ValueError(
            "certificate_batch > 0 draws held-out pairs in batches, which needs a sampler that "
            f"draws fresh pairs (teamtr.protocols.SequentialPairingSampler); "
            f"{type(sampler).__name__} has no draw_pairs"
        )
    # An update undone by its bound would select the continuations it kept going on.
    return sampler.with_held_out(config.certificate_groups, chained=config.accept != "measured")


def measured_update(
    pairs: PairedDifferences | None,
    agent: int,
    config: StageConfig,
    more_pairs: Callable[[int], PairedDifferences | None] | None = None,
) -> MeasuredCertificate | None:
    """The measured certificate of the update of ``agent`` from the pairs of its held-out
    groups' continuation; None (not measured) where there are none, e.g. a backend that cannot
    bound a task's returns, which ``accept = "measured"`` refuses. With
    ``config.certificate_batch`` > 0, ``more_pairs(count)`` draws fresh pairs after those
    until the anytime bound decides (``teamtr.measured.sequential_measure``)."""
    if pairs is None or pairs.differences.size == 0:
        if config.accept == "measured":
            raise ValueError(
                f"accept='measured': the continuation after agent {agent}'s update carries no "
                "paired differences (teamtr.protocols.PairedRollouts)"
            )
        return None
    if pairs.updated_agent is not None and pairs.updated_agent != agent:
        raise ValueError(f"pairs measure agent {pairs.updated_agent}'s update, not agent {agent}'s")
    if config.certificate_batch and more_pairs is not None:
        return sequential_measure(
            pairs,
            more_pairs,
            config.certificate_level,
            config.certificate_batch,
            config.certificate_cap,
            config.certificate_futility,
        )
    return measure(pairs, config.certificate_level, config.certificate_bound)


def update_bound_method(config: StageConfig) -> str:
    """The bound each measured update of the stage carries: the anytime one for sequential
    draws, else ``certificate_bound``."""
    return ANYTIME if config.certificate_batch else config.certificate_bound


def run_stage(
    team: TeamT,
    sampler: Sampler,
    updater: AgentUpdater,
    config: StageConfig,
    penalty: PenaltyModel,
    evaluator: Evaluator | None = None,
    keep_teams: bool = False,
    stage_index: int = 0,
    on_update: Callable[[UpdateRecord], None] | None = None,
) -> tuple[StageReport, TeamT]:
    """Run one stage of ``config.scheme`` from ``team``; return its report and pi_bar.

    ``on_update`` is called with every update's record as soon as it is made; each record says
    what the update did and what it used: its starting team (``base``) and its rollouts.
    """
    order = stage_order(config, team.n_agents, stage_index)
    radii = config.radii(team.n_agents)  # delta_i per agent, checked when config was built
    held_out_sampler = measuring_sampler(sampler, config)
    source = RolloutSource(config.scheme, held_out_sampler or sampler)
    source.start(team)
    parts = _StageParts(
        updater, source, held_out_sampler, config, penalty, _cached_values(evaluator)
    )
    start_team = team
    teams: list[TeamT] = [team]
    records: list[UpdateRecord] = []
    last_updated: int | None = None

    for position, agent in enumerate(order):
        base = start_team if source.simultaneous else team
        last = position == len(order) - 1
        record, after = _update_agent(
            parts, base, position, agent, radii[agent], last_updated, last
        )
        records.append(record)
        if on_update is not None:
            on_update(record)
        if not source.simultaneous:
            team = after
            teams.append(team)
        last_updated = agent if record.kept else None

    if source.simultaneous:
        team, certificate = _apply_jointly(start_team, records, penalty, config.penalty_form)
        teams.append(team)
    else:
        certificate = sum(r.certificate for r in records)

    report = StageReport(
        scheme=config.scheme,
        order=order,
        records=tuple(records),
        certificate=certificate,
        j_start=parts.evaluate(start_team),
        j_end=parts.evaluate(team),
        teams=tuple(teams) if keep_teams else (),
        measured=stage_bound(records, config) if held_out_sampler is not None else None,
    )
    return report, team


class _StageParts(NamedTuple):
    """What every update of one stage uses (``_update_agent``)."""

    updater: AgentUpdater
    source: RolloutSource
    """Where each update's rollouts come from, as its scheme says."""
    held_out_sampler: Sampler | None
    """The sampler whose held-out groups measure each kept update; None: not measured."""
    config: StageConfig
    penalty: PenaltyModel
    evaluate: Callable[[TeamPolicy], float | None]
    """Exact J of a team (``_cached_values``); None without an evaluator."""


def _update_agent(
    parts: _StageParts,
    base: TeamT,
    position: int,
    agent: int,
    radius: float,
    last_updated: int | None,
    last: bool,
) -> tuple[UpdateRecord, TeamT]:
    """Update i = ``position`` of the stage, of ``agent`` from the team ``base``: its rollouts
    (fresh samples of ``base`` for teamtr, Thm 3.4; the stage-start cache for stale and joint,
    Thm 3.7), its trust-region step, kept only inside the radius (and, where measured, while
    its bound allows), and its certificate L_i - penalty(epsilon_i, KL_i). Returns the update's
    record and the team after it (``base`` where the update is not kept)."""
    config = parts.config
    rollouts, fresh = parts.source.for_update(base, last_updated)
    update = parts.updater.update(base, agent, rollouts, radius)
    kept = inside_radius(update, radius, config.kl_tolerance)
    after = cast(TeamT, base.with_agent(agent, update.policy)) if kept else base
    measured = _NOT_MEASURED
    if kept and parts.held_out_sampler is not None:
        measured = _measure_kept(
            parts.held_out_sampler, parts.source, base, after, rollouts, agent, last, config
        )
        if measured.undone:  # accept = "measured" and its bound is below 0
            kept, after = False, base
    charged = update_penalty(update, parts.penalty, config.penalty_form) if kept else 0.0
    record = UpdateRecord(
        position=position,
        agent=agent,
        radius=radius,
        update=update,
        kept=kept,
        penalty=charged,
        certificate=update.surrogate - charged if kept else 0.0,
        j_before=parts.evaluate(base),
        j_after=parts.evaluate(after),
        base=base,
        rollouts=rollouts,
        fresh_rollouts=fresh,
        measured=measured.certificate,
        undone=measured.undone,
        resample=measured.resample,
    )
    return record, after


def _cached_values(evaluator: Evaluator | None) -> Callable[[TeamPolicy], float | None]:
    """Exact J of a team, each team evaluated once (``PerTeamCache``); None without an
    evaluator."""
    values = PerTeamCache(evaluator) if evaluator is not None else None

    def evaluate(team: TeamPolicy) -> float | None:
        return float(values(team)) if values is not None else None

    return evaluate


class _KeptUpdateMeasured(NamedTuple):
    """What the held-out groups say of a kept update (``_measure_kept``)."""

    certificate: MeasuredCertificate | None
    """Its measured certificate (``measured_update``); None where nothing is measured."""
    resample: Rollouts | None
    """The draw of the updated team that the next update needs (None after the last)."""
    undone: bool
    """``accept = "measured"`` undid the update: its bound is below 0."""


_NOT_MEASURED = _KeptUpdateMeasured(None, None, False)


def _measure_kept(
    held_out_sampler: Sampler,
    source: RolloutSource,
    base: TeamT,
    after: TeamT,
    rollouts: Rollouts,
    agent: int,
    last: bool,
    config: StageConfig,
) -> _KeptUpdateMeasured:
    """Agent ``agent``'s kept update measured: ``after`` continues ``base``'s held-out groups,
    alone after the stage's last update, else in the draw the next update needs. Under
    ``accept = "measured"`` a bound below 0 undoes it, and ``base`` is drawn afresh (its
    earlier held-out groups decided the undo, so they measure nothing more)."""
    resample: Rollouts | None = None
    if last:  # no update follows: continue the held-out groups alone
        assert isinstance(held_out_sampler, PairingSampler)
        pairs = held_out_sampler.continue_held_out(after, rollouts, agent)
    else:  # the draw the next update needs, continuing them too
        resample = source.resample(after, agent)
        pairs = getattr(resample, "pairs", None)

    def more_pairs(count: int) -> PairedDifferences | None:
        assert isinstance(held_out_sampler, SequentialPairingSampler)
        return held_out_sampler.draw_pairs(base, after, agent, count)

    measured = measured_update(pairs, agent, config, more_pairs)
    undone = config.accept == "measured" and measured is not None and measured.bound < 0
    if undone and not last:
        source.redraw(base)
    return _KeptUpdateMeasured(measured, resample, undone)


def stage_bound(records: Sequence[UpdateRecord], config: StageConfig) -> MeasuredCertificate | None:
    """The stage's measured bound: its updates' bounds at alpha/m, summed over the kept ones."""
    return stage_measured(
        [r.measured for r in records],
        [r.kept for r in records],
        config.certificate_level,
        update_bound_method(config),
    )


def _apply_jointly(
    start_team: TeamT, records: Sequence[UpdateRecord], penalty: PenaltyModel, form: str
) -> tuple[TeamT, float]:
    """Swap every kept update in at once; certify the team move with Thm 3.4 (Lemma 3.1)."""
    team = start_team
    kept = [r for r in records if r.kept]
    for record in kept:
        team = cast(TeamT, team.with_agent(record.agent, record.update.policy))
    if not kept:
        return team, 0.0
    surrogate = sum(r.update.surrogate for r in kept)
    epsilon = max(r.update.advantage_bound for r in kept)
    joint = AgentUpdate(
        policy=None,
        surrogate=surrogate,
        kl=sum(r.update.kl for r in kept),
        advantage_bound=epsilon,
        # A missing TV must not count as 0: leave it None so update_penalty refuses the TV form.
        tv=None
        if any(r.update.tv is None for r in kept)
        else sum(r.update.tv for r in kept if r.update.tv is not None),
    )
    return team, surrogate - update_penalty(joint, penalty, form)


def run_stages(
    team: TeamT,
    sampler: Sampler,
    updater: AgentUpdater,
    config: StageConfig,
    penalty: PenaltyModel,
    n_stages: int,
    evaluator: Evaluator | None = None,
    keep_teams: bool = False,
) -> Iterator[tuple[StageReport, TeamT]]:
    """Run ``n_stages`` consecutive stages, yielding each report and the team after it."""
    if n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    for stage_index in range(n_stages):
        report, team = run_stage(
            team, sampler, updater, config, penalty, evaluator, keep_teams, stage_index
        )
        yield report, team
