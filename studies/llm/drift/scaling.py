"""``teamtr llm-scaling``: the n^2 versus n drift (Thm 3.7) measured on language-model teams.

The counterpart of the tabular ``teamtr scaling``. For every team size n and seed, a team of n
SmolLM2 agents (one LoRA adapter each) plays the running-sum chain (``llm.problems.private_notes``,
``answer = "chain"``: speaker k adds its private number to the total the speaker before it
said; every turn earns a share of the reward). From the same starting team and the same first
batch, one stage of ``stale`` and one of ``teamtr`` update the n agents in speaking order with
the same per-agent radius, both on dynamically sampled batches (each holds a group with
differing rewards where one is found: whether an update moves must not depend on how often a
scheme's batches happen to hold a reward). Each stage keeps its intermediate teams pi_hat^0 ..
pi_hat^n; plain measurement batches of them are drawn afterwards. On them, with the exact
full-vocabulary per-token KLs of Lemma 3.1 (``llm.update.drift.dialogue_kls``):

- ``D_stale``  = sum_i KL(P_{pi_hat^{i-1}} || P_{pi_cur}): how far the team an update is applied
  to has moved from the one whose rollouts stale trains it on;
- ``D_teamtr`` = sum_i KL(P_{pi_hat^i} || P_{pi_hat^{i-1}}): the shift each update causes, which
  TeamTR's resampling re-measures before the next update;
- the train-vs-true mismatch sum_i KL(P_{pi_hat^{i-1}} || P_{behaviour of update i's rollouts}):
  D_stale's terms for stale, exactly 0 for teamtr (its rollouts are samples of pi_hat^{i-1});
- the stale gap of stale's update i: its surrogate L_i on the rollouts it was trained on minus
  the same surrogate on a fresh batch of pi_hat^{i-1}, the team it is applied to. It holds the
  update's overfitting to its own batch (the whole gap of the first update, whose team has not
  moved) plus the occupancy shift; the shift gap keeps the shift alone: L_i on a fresh batch of
  pi_cur minus L_i on the fresh batch of pi_hat^{i-1}. TeamTR trains every update on samples of
  the team it is applied to, so its shift gap is 0 by construction and is not sampled.

KL between dialogue distributions is additive over the agents that differ, so with per-update
shifts kappa the KL drifts count terms: ~ kappa n(n-1)/2 for stale, kappa n for teamtr. Each
term's Pinsker bound sqrt(2 KL) bounds the occupancy's L1 distance (``llm.update.drift.l1_bound``),
the unit of the tabular study: ``drift_l1`` sums those, ~ sqrt(kappa) n^{3/2} for stale
against sqrt(kappa) n for teamtr. The exponent alpha of every metric against n is fitted on
log-log axes with a bootstrap over seeds (``teamtr.fitting``).

Every finished (n, seed) unit is written at once to its own file under ``--runs``, and a
rerun skips the units already there: a killed study loses at most the unit in progress, and
several processes can share the work (``--agents``, ``--seeds``, ``--first-seed``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from studies import options
from teamtr.config import SchemeName
from teamtr.fitting import finite_or_none, fit_exponent

SCHEMES: tuple[SchemeName, ...] = ("stale", "teamtr")
PAPERS_ALPHA = {"stale": 1.94, "teamtr": 1.07}
FORMAT = "teamtr.llm_scaling/3"
DIRECT_MAX = 4
"""Team sizes up to which each D_stale term is also measured on a batch of its own team (the
check of the chain identity the study uses for every n)."""

DEFINITIONS: dict[str, str] = {
    "drift_kl": (
        "The headline metric in KL. stale: D_stale = sum_i KL(P_{pi_hat^{i-1}} || P_{pi_cur}); "
        "teamtr: D_teamtr = sum_i KL(P_{pi_hat^i} || P_{pi_hat^{i-1}}); P_team is the "
        "distribution of whole dialogues, each KL the mean over a measurement batch of the exact "
        "per-token full-vocabulary KLs summed over the dialogue (Lemma 3.1), in nats."
    ),
    "drift_l1": (
        "The same sums of sqrt(2 KL) per term: Pinsker's bound on each term's occupancy L1 "
        "distance ||d - d'||_1, the unit of the tabular study's drift."
    ),
    "train_true_mismatch_kl": (
        "sum_i KL(P_{pi_hat^{i-1}} || P_{behaviour of update i's rollouts}): D_stale's terms "
        "for stale, exactly 0 for teamtr (no agent differs, nothing is scored)."
    ),
    "stale_drift_kl": (
        "sum_i KL(P_{pi_hat^{i-1}} || P_{pi_cur}) of this scheme's own teams, = sum_i sum_{k<i-1} "
        "kappa_k (the chain identity, see measure_unit)."
    ),
    "step_kl": (
        "sum_i kappa_{i-1}, kappa_k = KL(P_{pi_hat^{k+1}} || P_{pi_hat^k}) = E_{pi_hat^n}[agent "
        "k's message KL(new || old)], measured on one fresh batch of pi_hat^n."
    ),
    "mean_update_kl": "step_kl / kept updates: the dialogue KL one update causes.",
    "stale_gap": (
        "stale: sum_i (L_i on the rollouts update i trained on - L_i on a fresh batch of "
        "pi_hat^{i-1}) over kept updates (overfitting plus shift); teamtr: not measured (0)."
    ),
    "stale_gap_abs": "The same sum of |gap_i|.",
    "shift_gap": (
        "sum_i (L_i on a fresh batch of the team whose rollouts update i trained on - L_i on a "
        "fresh batch of pi_hat^{i-1}): the stale gap without the overfitting to one batch, the "
        "surrogate error the occupancy shift alone causes; 0 for teamtr by construction."
    ),
    "stale_drift_kl_direct": (
        "stale_drift_kl with every term measured on a batch of pi_hat^{i-1} itself (team sizes "
        "up to DIRECT_MAX), the check of the chain identity; nan where not measured."
    ),
    "stage_cpu_seconds": "CPU seconds of the stage itself (sampling and updates, no measurement).",
    "stage_generated_tokens": "Tokens the stage generated (prefix reuse: reused turns cost 0).",
    "kept_updates": "Updates inside the trust region that entered the team.",
    "signal_updates": "Updates whose rollouts held differing rewards in some group.",
}
METRICS = (
    "drift_kl",
    "drift_l1",
    "train_true_mismatch_kl",
    "stale_drift_kl",
    "stale_drift_kl_direct",
    "step_kl",
    "mean_update_kl",
    "stale_gap",
    "stale_gap_abs",
    "shift_gap",
    "stage_cpu_seconds",
    "stage_generated_tokens",
    "kept_updates",
    "signal_updates",
)
FITTED = ("drift_kl", "drift_l1", "stale_drift_kl", "step_kl", "mean_update_kl")


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """Everything a unit's numbers depend on (a unit file written under other settings is
    refused, not mixed in)."""

    source: str = "smollm2"
    radius: float = 0.04
    """delta_i, per agent; in ``radius_unit``."""
    radius_unit: Literal["message", "turn"] = "message"
    """"message": delta_i bounds the KL of agent i's own message (its share of the dialogue
    KL), the same budget for every n: the stage radius is delta_i / n on the turn-level scale
    of ``[stage] radius`` (mean over the H = n turns). "turn": delta_i is ``[stage] radius``
    itself, so an agent's message may move n delta_i."""
    learning_rate: float = 2e-4
    steps: int = 1
    prompts: int = 2
    group: int = 4
    message_tokens: int = 6
    note_max: int = 5
    temperature: float = 0.7
    lora_rank: int = 16
    signal_groups: int = 1
    """Dynamic sampling for both schemes' training batches (``[sampler] signal_groups``):
    every batch an update trains on holds a group with differing rewards where one is found
    within ``max_draws`` extra groups, so that neither scheme's drift depends on how often its
    batches happen to hold a reward. The measurement batches are plain samples."""
    max_draws: int = 6

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def stage_radius(self, n_agents: int) -> float:
        """The ``StageConfig`` radius (turn-level: mean KL over the dialogue's n turns)."""
        return self.radius / n_agents if self.radius_unit == "message" else self.radius


def chain_system_prompt(n_agents: int) -> str:
    return (
        f"{n_agents} teammates keep a running total together. Each holds a private number "
        "that only they can see."
    )


def unit_config(settings: StudySettings, n_agents: int, seed: int):
    """The run config of one unit: the chain task for ``n_agents`` speakers, in order."""
    from llm.common.config import RunConfig
    from llm.problems.private_notes import chain_role_prompts
    from llm.training.builder import configured

    config = configured(
        RunConfig(),
        {
            "source": settings.source,
            "rank": settings.lora_rank,
            "alpha": 2.0 * settings.lora_rank,
            "n_agents": n_agents,
            "router": "fixed",
            "speaking_order": (),
            "role_prompts": chain_role_prompts(n_agents),
            "system_prompt": chain_system_prompt(n_agents),
            "kind": "private_notes",
            "note_answer": "chain",
            "note_max": settings.note_max,
            "phrasing": "plain",
            "eval_size": 1,  # the study evaluates no held-out accuracy
            "prompts_per_batch": settings.prompts,
            "group_size": settings.group,
            "turns": n_agents,
            "max_new_tokens": settings.message_tokens,
            "temperature": settings.temperature,
            "signal_groups": settings.signal_groups,
            "max_draws": settings.max_draws,
            "learning_rate": settings.learning_rate,
            "steps": settings.steps,
        },
    )
    # "seed" names two sections: the sampler's draws and the run's global generators.
    return dataclasses.replace(
        config,
        sampler=dataclasses.replace(config.sampler, seed=seed),
        run=dataclasses.replace(config.run, seed=seed),
    )


def measure_unit(
    settings: StudySettings, n_agents: int, seed: int, direct_max: int = DIRECT_MAX
) -> dict[str, Any]:
    """One stage of each scheme from the same starting team; every metric of both."""
    from llm.conversation.router import make_router
    from llm.sampling.sampler import DialogueSampler
    from llm.training.builder import build
    from llm.update.drift import agent_message_kls, surrogate_on
    from llm.update.outcome import Outcome, lora_update
    from llm.update.updater import TrustRegionUpdater
    from teamtr import StageConfig
    from teamtr.penalty import EpisodicPenalty
    from teamtr.stage import run_stage

    config = unit_config(settings, n_agents, seed)
    parts = build(config, progress=False)
    chat, start = parts.chat, parts.team
    task = parts.sampler.task  # the chain's problems and its per-turn reward
    chunk = config.sampler.score_chunk
    router = make_router("fixed", n_agents)
    temperature = config.sampler.temperature
    radius = settings.stage_radius(n_agents)
    schemes: dict[str, Any] = {}
    for scheme in SCHEMES:
        # The same seeds for both schemes: the same first batch from the same team.
        sampler = DialogueSampler(chat, router, task, config.sampler)
        updater = TrustRegionUpdater(chat, config.updater, score_chunk=chunk)
        stage_config = StageConfig(scheme=scheme, radius=radius, order="fixed")
        cpu = time.process_time()
        report, _ = run_stage(
            start, sampler, updater, stage_config, EpisodicPenalty(n_agents), keep_teams=True
        )
        stage_cpu = time.process_time() - cpu
        generated = sum(r.generated_tokens for r in report.sampled_rollouts)
        teams = report.teams
        cpu = time.process_time()
        # Measurement batches, independent of the stage's. Stale: pi_hat^0, then each next team
        # from the previous batch with prefix reuse (exact samples, llm.sampling.sampler), up to
        # pi_hat^n, for the surrogate of every update where it is applied. TeamTR trains each
        # update where it is applied (its gaps are 0 by construction): one batch of pi_hat^n.
        plain = dataclasses.replace(config.sampler, signal_groups=0)  # samples of P_team
        probe = DialogueSampler(
            chat, router, task, dataclasses.replace(plain, seed=seed + 1_000_003)
        )
        checker = DialogueSampler(
            chat, router, task, dataclasses.replace(plain, seed=seed + 2_000_003)
        )
        chained = scheme == "stale"
        batches = [probe.sample(teams[0] if chained else teams[-1])]
        for i, record in enumerate(report.records if chained else (), start=1):
            batches.append(
                probe.sample(teams[i], previous=batches[-1], updated_agent=record.agent)
                if record.kept
                else batches[-1]
            )
        # kappa_k = E_{pi_hat^n}[agent k's message KL(new_k || old_k)]. In a chain where agent k
        # speaks once, at turn k, its context follows agents 0..k-1 alone, the same under every
        # pi_hat^j with j > k: so kappa_k is the dialogue KL of update k+1, KL(P_{pi_hat^{k+1}}
        # || P_{pi_hat^k}), and KL(P_{pi_hat^{i-1}} || P_{pi_cur}) = sum_{k < i-1} kappa_k
        # (chain rule, Lemma 3.1). One batch of pi_hat^n measures every term.
        kappa = agent_message_kls(
            chat,
            teams[-1],
            teams[0],
            batches[-1].episodes,
            temperature=temperature,
            chunk_size=chunk,
        ).mean(axis=0)
        updates = []
        for i, record in enumerate(report.records, start=1):
            agent = record.agent
            from_start = float(kappa[:agent].sum())
            direct = None
            if chained and n_agents <= direct_max and i > 1:
                # The same KL measured the long way, on a batch of pi_hat^{i-1} itself, drawn
                # afresh (the chained measurement batches share the earlier agents' turns).
                direct = float(
                    agent_message_kls(
                        chat,
                        teams[i - 1],
                        teams[0],
                        checker.sample(teams[i - 1]).episodes,
                        temperature=temperature,
                        chunk_size=chunk,
                    )
                    .sum(axis=1)
                    .mean()
                )
            gap = shift_gap = None
            if not chained:
                shift_gap = 0.0  # trained on samples of pi_hat^{i-1}, the team it is applied to
            elif record.kept:
                # L_i where the update is applied (a fresh batch of pi_hat^{i-1}), against L_i
                # on the batch it trained on (the stale gap: overfitting plus occupancy shift)
                # and on a fresh batch of the team that batch came from (the shift alone).
                applied = surrogate_on(chat, batches[i - 1], agent, teams[i], chunk_size=chunk)
                gap = record.update.surrogate - applied
                source = record.rollouts.behaviour
                trained_on = next(
                    j for j, team in enumerate(teams) if not team.differing_agents(source)
                )
                if trained_on == i - 1:  # the first update: pi_hat^0 is the team it trained on
                    shift_gap = 0.0
                else:
                    moved = teams[trained_on].with_agent(agent, record.update.policy)
                    elsewhere = surrogate_on(
                        chat, batches[trained_on], agent, moved, chunk_size=chunk
                    )
                    shift_gap = elsewhere - applied
            updates.append(
                {
                    "agent": agent,
                    "kept": record.kept,
                    "signal": lora_update(record.update).outcome is not Outcome.NO_SIGNAL,
                    "update_kl": finite_or_none(record.update.kl),
                    "surrogate": finite_or_none(record.update.surrogate),
                    "from_start_kl": from_start,
                    "from_start_kl_direct": direct,
                    "step_kl": float(kappa[agent]),
                    "mismatch_kl": _mismatch(teams, i, record.rollouts.behaviour, kappa),
                    "stale_gap": gap,
                    "shift_gap": shift_gap,
                    "train_reward": float(record.rollouts.mean_reward),
                    "groups_drawn": int(record.rollouts.groups_drawn),
                    "groups_with_signal": int(record.rollouts.groups_with_signal),
                }
            )
        schemes[scheme] = {
            "updates": updates,
            "metrics": unit_metrics(scheme, updates, stage_cpu, generated),
            "measurement_rewards": [float(b.mean_reward) for b in batches],
            "measurement_cpu_seconds": time.process_time() - cpu,
        }
    return {
        "format": FORMAT,
        "n": n_agents,
        "seed": seed,
        "settings": settings.as_json(),
        "schemes": schemes,
    }


def _mismatch(teams: Sequence[Any], i: int, behaviour: Any, kappa: np.ndarray) -> float:
    """KL(P_{pi_hat^{i-1}} || P_behaviour) for a behaviour team among ``teams`` (the chain
    identity again): the kappa_k of the agents updated between the two."""
    trained_on = next(j for j, team in enumerate(teams) if not team.differing_agents(behaviour))
    if trained_on > i - 1:
        raise ValueError(f"update {i} trained on rollouts of a later team pi_hat^{trained_on}")
    return float(kappa[trained_on : i - 1].sum())


def unit_metrics(
    scheme: str, updates: Sequence[dict[str, Any]], cpu: float, tokens: int
) -> dict[str, float]:
    """The stage's metrics from its per-update measurements (see ``DEFINITIONS``)."""
    from_start = [u["from_start_kl"] for u in updates]
    step = [u["step_kl"] for u in updates]
    terms = from_start if scheme == "stale" else step
    kept = sum(u["kept"] for u in updates)
    gaps = [u["stale_gap"] for u in updates if u["stale_gap"] is not None]
    shifts = [u["shift_gap"] for u in updates if u.get("shift_gap") is not None]
    direct = [u.get("from_start_kl_direct") for u in updates[1:]]
    return {
        "drift_kl": float(sum(terms)),
        "drift_l1": float(sum(math.sqrt(2.0 * max(t, 0.0)) for t in terms)),
        "train_true_mismatch_kl": float(sum(u["mismatch_kl"] for u in updates)),
        "stale_drift_kl": float(sum(from_start)),
        "stale_drift_kl_direct": float(sum(d for d in direct if d is not None))
        if direct and all(d is not None for d in direct)
        else math.nan,
        "step_kl": float(sum(step)),
        "mean_update_kl": float(sum(step) / kept) if kept else math.nan,
        "stale_gap": float(sum(gaps)),
        "stale_gap_abs": float(sum(abs(g) for g in gaps)),
        "shift_gap": float(sum(shifts)),
        "stage_cpu_seconds": float(cpu),
        "stage_generated_tokens": float(tokens),
        "kept_updates": float(kept),
        "signal_updates": float(sum(u["signal"] for u in updates)),
    }


# -- results --------------------------------------------------------------------------------------
def unit_path(runs: Path, n_agents: int, seed: int) -> Path:
    return runs / f"n{n_agents}_seed{seed}.json"


def write_atomically(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(partial, path)


def read_units(runs: Path, settings: StudySettings) -> list[dict[str, Any]]:
    """Every finished unit under ``runs``; a unit of other settings is an error."""
    units = []
    for path in sorted(runs.glob("n*_seed*.json")):
        unit = json.loads(path.read_text())
        if unit.get("format") != FORMAT:
            raise ValueError(f"{path}: not a {FORMAT} unit")
        if unit["settings"] != settings.as_json():
            raise ValueError(
                f"{path}: measured with other settings ({unit['settings']}); use another "
                "--runs directory or the same options"
            )
        units.append(unit)
    return units


def summarise(
    units: Sequence[dict[str, Any]], settings: StudySettings, n_bootstrap: int = 1000
) -> dict[str, Any]:
    """Per scheme and n: every metric's per-seed values, mean and standard error; the fitted
    exponents of ``FITTED`` against n, with bootstrap intervals."""
    sizes = sorted({u["n"] for u in units})
    summary: dict[str, Any] = {
        "format": FORMAT,
        "settings": settings.as_json(),
        "definitions": DEFINITIONS,
        "papers_alpha": PAPERS_ALPHA,
        "agents": sizes,
        "seeds": sorted({u["seed"] for u in units}),
        "schemes": {},
    }
    for scheme in SCHEMES:
        per_n: dict[str, Any] = {}
        for n in sizes:
            rows = [u["schemes"][scheme]["metrics"] for u in units if u["n"] == n]
            per_n[str(n)] = {
                metric: _mean_and_error([row[metric] for row in rows]) for metric in METRICS
            }
        alphas = {}
        if len(sizes) >= 2:
            for metric in FITTED:
                samples = [
                    [u["schemes"][scheme]["metrics"][metric] for u in units if u["n"] == n]
                    for n in sizes
                ]
                alphas[metric] = fit_exponent(sizes, samples, n_bootstrap).as_json()
        summary["schemes"][scheme] = {"per_n": per_n, "alpha": alphas}
    summary["cost_ratio"] = {str(n): _cost_ratio([u for u in units if u["n"] == n]) for n in sizes}
    return summary


def _mean_and_error(values: Sequence[float]) -> dict[str, Any]:
    finite = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    mean = float(finite.mean()) if finite.size else math.nan
    error = float(finite.std(ddof=1) / math.sqrt(finite.size)) if finite.size > 1 else math.nan
    return {
        "values": [finite_or_none(v) if v is not None else None for v in values],
        "mean": finite_or_none(mean),
        "stderr": finite_or_none(error),
    }


def prefix_reuse_token_ratio(n_agents: int) -> float:
    """TeamTR's generated tokens over stale's in one stage of the chain when every draw plays
    the same groups, messages have equal lengths and agents are updated in speaking order
    (docs/llm_scaling.md, "Cost"): the first draw, then after updating agent k < n - 1 the
    turns from agent k's on, n - k of n: 1 + sum_k (n - k)/n = 1 + (n + 1)/2 - 1/n."""
    if n_agents < 1:
        raise ValueError(f"a team has at least one agent, got n_agents={n_agents}")
    return 1.0 + (n_agents + 1) / 2.0 - 1.0 / n_agents


def groups_per_draw(unit: dict[str, Any], scheme: str) -> float | None:
    """Groups a draw of ``scheme``'s stage played, on average: stale's updates all train on the
    stage-start draw (one draw), each of TeamTR's on its own. None for units recorded before
    ``groups_drawn`` was."""
    drawn = [u.get("groups_drawn") for u in unit["schemes"][scheme].get("updates", [])]
    if not drawn or any(d is None for d in drawn):
        return None
    return float(drawn[0]) if scheme == "stale" else float(np.mean(drawn))


def _cost_ratio(units: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """TeamTR's stage over stale's, summed over the seeds of one n (side by side: each unit ran
    both stages in one process, one after the other). ``tokens_per_group`` divides out how many
    groups the draws played: the tokens ratio had every TeamTR draw played as many groups as
    stale's, which is what ``prefix_reuse_bound`` assumes (dynamic sampling's extra rounds
    are chance draws of the stopping rule, not the cost of resampling)."""

    def total(scheme: str, metric: str) -> float:
        return sum(u["schemes"][scheme]["metrics"][metric] for u in units)

    def per_draw(scheme: str) -> float | None:
        counts = [groups_per_draw(u, scheme) for u in units]
        known = [c for c in counts if c is not None]
        return float(np.mean(known)) if known and len(known) == len(counts) else None

    tokens = total("teamtr", "stage_generated_tokens") / total("stale", "stage_generated_tokens")
    stale_groups, teamtr_groups = per_draw("stale"), per_draw("teamtr")
    per_group = (
        None
        if stale_groups is None or teamtr_groups is None
        else finite_or_none(tokens * stale_groups / teamtr_groups)
    )
    return {
        "tokens": finite_or_none(tokens),
        "cpu": finite_or_none(
            total("teamtr", "stage_cpu_seconds") / total("stale", "stage_cpu_seconds")
        ),
        "groups_per_draw_stale": stale_groups,
        "groups_per_draw_teamtr": teamtr_groups,
        "tokens_per_group": per_group,
        "prefix_reuse_bound": prefix_reuse_token_ratio(units[0]["n"]) if units else None,
    }


# -- the command ----------------------------------------------------------------------------------
def _sizes(text: str) -> list[int]:
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--agents takes 'A,B,C', got {text!r}") from None
    if not values or min(values) < 2 or max(values) > 16:
        raise argparse.ArgumentTypeError(f"--agents: team sizes must lie in 2..16, got {text!r}")
    return values


def build_parser(prog: str) -> argparse.ArgumentParser:
    defaults = StudySettings()
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "One stage of stale and one of teamtr on language-model teams of n = 2..8 agents "
            "(the running-sum chain): dialogue-distribution drift from exact per-token KLs "
            "(Lemma 3.1), train-vs-true mismatch, stale gap and stage cost against n, with "
            "fitted log-log exponents (Thm 3.7)."
        ),
    )
    options.add_json(parser, "write the summary here")
    options.add_plot(parser)
    parser.add_argument(
        "--runs",
        type=Path,
        default=None,
        help="one file per finished (n, seed) unit; reruns skip them (default: beside --json)",
    )
    parser.add_argument("--agents", type=_sizes, default=[2, 3, 4, 6, 8], help="e.g. 2,3,4,6,8")
    options.add_seed_count(parser, 3, "seeds per team size")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first..first+seeds-1")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    parser.add_argument(
        "--summarise-only",
        action="store_true",
        help="measure nothing: summarise and plot the units already under --runs",
    )
    parser.add_argument("--source", default=defaults.source, help='"smollm2", "tiny", a dir')
    options.add_radius(parser, defaults.radius, "delta_i, per agent (nats)")
    parser.add_argument(
        "--radius-unit",
        choices=("message", "turn"),
        default=defaults.radius_unit,
        help="message: delta_i bounds the KL of the agent's own message (the same budget for "
        "every n; stage radius delta_i / n); turn: delta_i is the [stage] radius (mean over "
        "the n turns), so a message may move n delta_i",
    )
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--steps", type=int, default=defaults.steps, help="Adam steps an update")
    parser.add_argument("--prompts", type=int, default=defaults.prompts, help="problems a batch")
    parser.add_argument("--group", type=int, default=defaults.group, help="dialogues a problem")
    parser.add_argument("--message-tokens", type=int, default=defaults.message_tokens)
    parser.add_argument("--note-max", type=int, default=defaults.note_max)
    parser.add_argument(
        "--signal-groups",
        type=int,
        default=defaults.signal_groups,
        help="dynamic sampling of the training batches: groups with differing rewards a batch "
        "should hold (0: plain batches)",
    )
    parser.add_argument(
        "--max-draws", type=int, default=defaults.max_draws, help="extra groups a batch may draw"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resamples for alpha's CI")
    parser.add_argument(
        "--tabular",
        type=Path,
        action="append",
        default=[],
        help="a `teamtr scaling --json` result whose exponents the figure draws beside these",
    )
    return parser


def _validate(args: argparse.Namespace) -> str | None:
    own = [
        (
            math.isfinite(args.learning_rate) and args.learning_rate > 0,
            f"--learning-rate must be > 0, got {args.learning_rate}",
        ),
        (1 <= args.steps <= 100, f"--steps must lie in 1..100, got {args.steps}"),
        (1 <= args.prompts <= 256, f"--prompts must lie in 1..256, got {args.prompts}"),
        (2 <= args.group <= 256, f"--group must lie in 2..256, got {args.group}"),
        (1 <= args.message_tokens <= 256, "--message-tokens must lie in 1..256"),
        (1 <= args.note_max <= 1000, f"--note-max must lie in 1..1000, got {args.note_max}"),
        (
            0 <= args.signal_groups <= args.prompts,
            f"--signal-groups must lie in 0..--prompts ({args.prompts}), got {args.signal_groups}",
        ),
        (0 <= args.max_draws <= 1000, f"--max-draws must lie in 0..1000, got {args.max_draws}"),
        (0 <= args.threads <= 256, f"--threads must lie in 0..256, got {args.threads}"),
        (1 <= args.bootstrap <= 100_000, "--bootstrap must lie in 1..100000"),
        (
            args.json is not None or args.runs is not None,
            "give --json or --runs: a study this long must write what it measures",
        ),
    ]
    return options.first_problem(
        options.seed_count_problem(args.seeds, args.first_seed),
        options.radius_problem(args.radius),
        *(None if ok else message for ok, message in own),
        options.output_problem(args.json, "--json"),
        options.output_problem(args.plot, "--plot"),
    )


PROG = "teamtr llm-scaling"


def run(args: argparse.Namespace) -> int:
    """Measure the units not yet under ``--runs``, then summarise, print and plot them all."""
    prog = PROG  # the messages name the command as the user typed it
    problem = _validate(args)
    if problem is not None:
        return options.refuse(prog, problem)
    settings = StudySettings(
        source=args.source,
        radius=args.radius,
        radius_unit=args.radius_unit,
        learning_rate=args.learning_rate,
        steps=args.steps,
        prompts=args.prompts,
        group=args.group,
        message_tokens=args.message_tokens,
        note_max=args.note_max,
        signal_groups=args.signal_groups,
        max_draws=args.max_draws,
    )
    runs = args.runs or args.json.with_name(args.json.stem + "_runs")
    try:
        read_units(runs, settings)  # refuse a directory of other settings before any work
    except (ValueError, json.JSONDecodeError) as error:
        return options.refuse(prog, str(error))
    if not args.summarise_only:
        import torch
        from tqdm import tqdm

        if args.threads:
            torch.set_num_threads(args.threads)
        todo = [
            (n, seed)
            for seed in range(args.first_seed, args.first_seed + args.seeds)
            for n in args.agents
            if not unit_path(runs, n, seed).exists()
        ]
        bar = tqdm(todo, desc="llm-scaling", unit="unit", file=sys.stderr)
        for n, seed in bar:
            bar.set_postfix_str(f"n={n} seed={seed}")
            write_atomically(unit_path(runs, n, seed), measure_unit(settings, n, seed))
    units = read_units(runs, settings)
    if not units:
        return options.refuse(prog, f"no finished unit under {runs}")
    summary = summarise(units, settings, args.bootstrap)
    print(markdown(summary) if args.markdown else format_table(summary))
    if args.json is not None:
        write_atomically(args.json, summary)
    if args.plot is not None:
        from studies.llm.drift.scaling_plot import plot_llm_scaling

        tabular = [json.loads(path.read_text()) for path in args.tabular]
        plot_llm_scaling(summary, args.plot, tabular)
        print(f"figure: {args.plot}")
    return 0


def format_table(summary: dict[str, Any]) -> str:
    lines = [
        "scheme  metric                  alpha [95% CI]          "
        + "  ".join(f"n={n:<8}" for n in summary["agents"])
    ]
    for scheme in SCHEMES:
        block = summary["schemes"][scheme]
        for metric in ("drift_kl", "drift_l1", "stale_gap"):
            fit = block["alpha"].get(metric)
            alpha = (
                ""
                if fit is None or fit["alpha"] is None
                else (f"{fit['alpha']:.2f} [{_num(fit['ci95'][0])}, {_num(fit['ci95'][1])}]")
            )
            cells = "  ".join(
                f"{_num(block['per_n'][str(n)][metric]['mean']):<10}" for n in summary["agents"]
            )
            lines.append(f"{scheme:<7} {metric:<23} {alpha:<23} {cells}")
    ratios = "  ".join(
        f"n={n}: {_num(r['tokens'])}x tokens ({_num(r.get('tokens_per_group'))}x per group "
        f"played, bound {_num(r.get('prefix_reuse_bound'))}), {_num(r['cpu'])}x CPU"
        for n, r in summary["cost_ratio"].items()
    )
    lines.append(f"teamtr stage / stale stage: {ratios}")
    return "\n".join(lines)


def markdown(summary: dict[str, Any]) -> str:
    """The summary as markdown: per n, mean ± standard error over seeds; then the exponents."""

    def cell(scheme: str, n: int, metric: str) -> str:
        stats = summary["schemes"][scheme]["per_n"][str(n)][metric]
        if stats["mean"] is None:
            return "–"
        error = "" if stats["stderr"] is None else f" ± {stats['stderr']:.2g}"
        return f"{stats['mean']:.3g}{error}"

    lines = [
        "| n | D_stale (KL) | D_teamtr (KL) | D_stale (Σ√2KL) | D_teamtr (Σ√2KL) "
        "| one update's KL, stale / teamtr | stale gap | shift gap | tokens teamtr/stale "
        "| CPU teamtr/stale |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in summary["agents"]:
        ratio = summary["cost_ratio"][str(n)]
        lines.append(
            f"| {n} | {cell('stale', n, 'drift_kl')} | {cell('teamtr', n, 'drift_kl')} | "
            f"{cell('stale', n, 'drift_l1')} | {cell('teamtr', n, 'drift_l1')} | "
            f"{cell('stale', n, 'mean_update_kl')} / {cell('teamtr', n, 'mean_update_kl')} | "
            f"{cell('stale', n, 'stale_gap')} | {cell('stale', n, 'shift_gap')} | "
            f"{_num(ratio['tokens'])} | {_num(ratio['cpu'])} |"
        )
    lines += ["", "| metric | α stale [95% CI] | α TeamTR [95% CI] |", "|---|---|---|"]
    for metric in FITTED:
        cells = []
        for scheme in SCHEMES:
            fit = summary["schemes"][scheme]["alpha"].get(metric)
            cells.append(
                "–"
                if not fit or fit["alpha"] is None
                else f"{fit['alpha']:.2f} [{_num(fit['ci95'][0])}, {_num(fit['ci95'][1])}]"
            )
        lines.append(f"| {metric} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "nan" if x is None else f"{x:.3g}"


if __name__ == "__main__":
    raise SystemExit(run(build_parser(PROG).parse_args()))
