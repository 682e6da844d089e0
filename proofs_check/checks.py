"""Every fact of THEORY.md §2 as a named check: an instance strategy and a slack function.

A check's slack function (``*_slack`` / ``*_slacks``, one module per THEORY.md section, each
mirrored by its hypothesis test file ``proofs_check/test_*.py``) takes an explicit instance and
returns its slack, "bound side minus the quantity it bounds": >= 0 means the fact holds (see
``proofs_check.tolerances``). Its instance strategy draws that instance from a seeded generator.
``teamtr verify`` runs ``check.function(instance_seed)`` on seeds 0 .. N-1; the hypothesis tests
call the same slack functions on instances drawn by ``proofs_check.strategies``. Exact values
come from the independent dense oracle ``proofs_check.oracle``.

A check that returns several slacks (one per update of a stage) counts by its smallest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from proofs_check.episodic import certificate_proxy_slack, episodic_per_step_slacks
from proofs_check.estimators import estimator_unbiased_slack, hoeffding_coverage_slack
from proofs_check.instances import (
    Direction,
    draw_message_pair,
    draw_radius,
    draw_stage0,
    draw_tabular_mdp,
    draw_team,
    random_policy_table,
)
from proofs_check.lemma_3_1 import (
    dialogue_chain_rule_slack,
    lemma_3_1_state_slack,
    message_chain_rule_slack,
)
from proofs_check.occupancy_shift import (
    marginal_shift_slack,
    occupancy_shift_slack,
    occupancy_shift_sup_slack,
    pinsker_slack,
)
from proofs_check.performance_difference import (
    episodic_performance_difference_slack,
    performance_difference_slack,
    sim_evaluation_slack,
)
from proofs_check.stage0 import stage0_feasibility_slack, stage0_optimality_slack
from proofs_check.stage_loop import stage_loop_slacks
from proofs_check.theorem_3_4 import theorem_3_4_slacks
from proofs_check.theorem_3_6 import theorem_3_6_slack
from proofs_check.theorem_3_7 import drift_slacks, stale_penalty_slacks
from proofs_check.traces import Trace, draw_policy_pair, draw_trace

Instance = Callable[[np.random.Generator], tuple[Any, ...]]
"""An instance strategy: the arguments of a slack function, drawn from a seeded generator."""
Slack = Callable[..., float | Sequence[float]]


@dataclass(frozen=True)
class Check:
    """One named fact: ``function(instance_seed)`` returns its slack (>= 0 means it holds)."""

    name: str
    fact: str
    """Where the fact is stated (THEORY.md section and statement)."""
    function: Callable[[int], float]


def seeded(instance: Instance, slack: Slack) -> Callable[[int], float]:
    """``slack`` on the instance that ``instance`` draws from ``default_rng(instance_seed)``."""

    def function(instance_seed: int) -> float:
        value = slack(*instance(np.random.default_rng(instance_seed)))
        return float(min(value)) if isinstance(value, Sequence) else float(value)

    return function


# --- instance strategies (each draws in a fixed order, so seed s is always the same instance) --


def policy_pair(episodic: bool = False, min_horizon: int = 1) -> Instance:
    def draw(rng: np.random.Generator) -> tuple[Any, ...]:
        mdp = draw_tabular_mdp(rng, episodic=episodic, min_horizon=min_horizon)
        return (mdp, *draw_policy_pair(rng, mdp))

    return draw


def pinsker_pair(rng: np.random.Generator) -> tuple[Any, ...]:
    n_actions = int(rng.integers(2, 8))
    p = random_policy_table(rng, 8, n_actions, float(rng.uniform(0.1, 12.0)))
    q = random_policy_table(rng, 8, n_actions, float(rng.uniform(0.1, 12.0)))
    return p, q


def evaluation_instance(rng: np.random.Generator) -> tuple[Any, ...]:
    mdp = draw_tabular_mdp(rng, episodic=bool(rng.random() < 0.5))
    return mdp, draw_team(rng, mdp), bool(rng.random() < 0.5)


def team_and_replacement(rng: np.random.Generator) -> tuple[Any, ...]:
    mdp = draw_tabular_mdp(rng)
    team = draw_team(rng, mdp)
    agent = int(rng.integers(mdp.n_agents))
    return mdp, team, agent, draw_team(rng, mdp)


def message_pair(rng: np.random.Generator) -> tuple[Any, ...]:
    return (draw_message_pair(rng),)


def dialogue_instance(rng: np.random.Generator) -> tuple[Any, ...]:
    # (n_agents, vocab_size, length, logit_scale, closeness, seed) of dialogue_chain_rule_slack
    return (
        int(rng.integers(1, 4)),
        int(rng.integers(2, 4)),
        int(rng.integers(1, 4)),
        float(rng.choice([rng.uniform(0.1, 3.0), rng.uniform(8.0, 14.0)])),
        float(rng.uniform(0.01, 1.5)),
        int(rng.integers(2**32)),
    )


def estimator_sample(estimator: str) -> Instance:
    return lambda rng: (draw_message_pair(rng), estimator, rng)


def drawn_trace(**options: Any) -> Instance:
    """A stage trace of ``draw_trace(rng, **options)``."""
    return lambda rng: (draw_trace(rng, **options),)


def trace_in_form(form: str, **options: Any) -> Instance:
    return lambda rng: (draw_trace(rng, **options), form)


def random_direction(rng: np.random.Generator) -> Direction:
    return "reverse" if rng.random() < 0.5 else "forward"


def trace_in_random_direction(exact: bool) -> Instance:
    def draw(rng: np.random.Generator) -> tuple[Any, ...]:
        direction = random_direction(rng)
        return draw_trace(rng, direction=direction, exact=exact), direction

    return draw


def sampled_surrogate(rng: np.random.Generator) -> tuple[Any, ...]:
    drawn = draw_trace(rng)
    i = int(rng.integers(1, len(drawn.tables)))
    return drawn, i, int(rng.integers(5, 200)), rng


def stage_loop_instance(episodic: bool) -> Instance:
    def draw(rng: np.random.Generator) -> tuple[Any, ...]:
        mdp = draw_tabular_mdp(rng, episodic=episodic)
        direction = random_direction(rng)
        form = "tv" if rng.random() < 0.5 else "kl"
        return mdp, draw_team(rng, mdp), direction, draw_radius(rng), form, int(rng.integers(1000))

    return draw


def stage0_instance(rng: np.random.Generator) -> tuple[Any, ...]:
    return draw_stage0(rng)


def exact_update_slacks(trace: Trace, kl_form: str) -> list[float]:
    """Thm 3.4 for exact-optimal updates: the KL form in the update's direction and the TV form."""
    return theorem_3_4_slacks(trace, kl_form) + theorem_3_4_slacks(trace, "tv")


# --- the registry: name, where THEORY.md states it, instance strategy, slack function ----------

REGISTRY: tuple[tuple[str, str, Instance, Slack], ...] = (
    (
        "performance_difference",
        "§2 performance difference",
        policy_pair(),
        performance_difference_slack,
    ),
    ("occupancy_shift", "§2 occupancy shift, E_d[TV] form", policy_pair(), occupancy_shift_slack),
    (
        "occupancy_shift_sup",
        "§2 occupancy shift, max_s TV form",
        policy_pair(),
        occupancy_shift_sup_slack,
    ),
    ("pinsker", "§1 Pinsker, both directions", pinsker_pair, pinsker_slack),
    (
        "sim_evaluate_exact",
        "§1 exact evaluation in sim/",
        evaluation_instance,
        sim_evaluation_slack,
    ),
    ("lemma_3_1_state", "§2 Lemma 3.1, state level", team_and_replacement, lemma_3_1_state_slack),
    ("lemma_3_1_token", "§2 Lemma 3.1, token chain rule", message_pair, message_chain_rule_slack),
    (
        "lemma_3_1_dialogue",
        "§2 Lemma 3.1, token chain rule on sim.dialogue_mdp",
        dialogue_instance,
        dialogue_chain_rule_slack,
    ),
    ("k1_unbiased", "§2 k1 estimator unbiased", estimator_sample("k1"), estimator_unbiased_slack),
    ("k3_unbiased", "§2 k3 estimator unbiased", estimator_sample("k3"), estimator_unbiased_slack),
    ("thm_3_4_tv", "§2 Thm 3.4, TV form", trace_in_form("tv"), theorem_3_4_slacks),
    (
        "thm_3_4_kl_reverse",
        "§2 Thm 3.4, KL form, KL(new||old)",
        trace_in_form("kl_reverse", direction="reverse"),
        theorem_3_4_slacks,
    ),
    (
        "thm_3_4_kl_forward",
        "§2 Thm 3.4, KL form, KL(old||new)",
        trace_in_form("kl_forward", direction="forward"),
        theorem_3_4_slacks,
    ),
    (
        "thm_3_4_exact_reverse",
        "§2 Thm 3.4, TV and KL forms, exact KL(new||old) updates",
        trace_in_form("kl_reverse", direction="reverse", exact=True),
        exact_update_slacks,
    ),
    (
        "thm_3_4_exact_forward",
        "§2 Thm 3.4, TV and KL forms, exact KL(old||new) updates",
        trace_in_form("kl_forward", direction="forward", exact=True),
        exact_update_slacks,
    ),
    (
        "thm_3_4_hoeffding",
        "§2 Thm 3.4, finite-sample term",
        sampled_surrogate,
        hoeffding_coverage_slack,
    ),
    (
        "thm_3_6_stage",
        "§2 Thm 3.6, random order",
        trace_in_random_direction(False),
        theorem_3_6_slack,
    ),
    (
        "thm_3_6_stage_exact",
        "§2 Thm 3.6, random order, exact updates",
        trace_in_random_direction(True),
        theorem_3_6_slack,
    ),
    (
        "stage_loop_certificate",
        "§2 Thm 3.4/3.6 as teamtr.run_stage certifies them",
        stage_loop_instance(episodic=False),
        stage_loop_slacks,
    ),
    ("thm_3_7_drift", "§2 Thm 3.7, occupancy drift", drawn_trace(min_agents=2), drift_slacks),
    ("thm_3_7_stale_penalty", "§2 Thm 3.7, penalty sums", drawn_trace(), stale_penalty_slacks),
    (
        "episodic_performance_difference",
        "§2 episodic performance difference",
        policy_pair(episodic=True),
        episodic_performance_difference_slack,
    ),
    (
        "episodic_marginal_shift",
        "§2 episodic marginal shift",
        policy_pair(episodic=True, min_horizon=2),
        marginal_shift_slack,
    ),
    (
        "episodic_thm_3_4_per_step",
        "§2 episodic Thm 3.4, per-step form",
        drawn_trace(episodic=True),
        episodic_per_step_slacks,
    ),
    (
        "episodic_thm_3_4_kl",
        "§2 episodic Thm 3.4, KL form",
        trace_in_form("kl_reverse", episodic=True),
        theorem_3_4_slacks,
    ),
    (
        "episodic_thm_3_7_drift",
        "§2 episodic drift",
        drawn_trace(episodic=True, min_agents=2),
        drift_slacks,
    ),
    (
        "episodic_stage_loop_certificate",
        "§2 episodic Thm 3.4/3.6 as teamtr.run_stage certifies them",
        stage_loop_instance(episodic=True),
        stage_loop_slacks,
    ),
    (
        "certificate_proxy",
        "§2 certificate proxy, exact inputs",
        drawn_trace(episodic=True),
        certificate_proxy_slack,
    ),
    (
        "stage0_closed_form",
        "§2 Stage-0 closed form vs scipy",
        stage0_instance,
        stage0_optimality_slack,
    ),
    (
        "stage0_inside_radius",
        "§2 Stage-0 projection feasible",
        stage0_instance,
        stage0_feasibility_slack,
    ),
)

CHECKS: tuple[Check, ...] = tuple(
    Check(name, fact, seeded(instance, slack)) for name, fact, instance, slack in REGISTRY
)
CHECKS_BY_NAME: dict[str, Check] = {check.name: check for check in CHECKS}
"""``CHECKS_BY_NAME[name].function(seed)`` reproduces one instance of ``teamtr verify``."""
