"""The language-model sampler's held-out groups: no update reads them, the next draw continues
them from the updated agent's first turn, and their pairs measure the update (teamtr.measured)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import llm
from llm.interface.plot import draw, measured_bounds
from llm.problems.task import Dialogue, FormatBonus, Task, TaskError
from llm.problems.tasks import Problem
from llm.sampling.held_out_groups import check_in_range, group_differences
from llm.training.stages.console import certificate_parts
from llm.training.stages.records import StageMetrics
from teamtr import StageConfig, run_stage
from teamtr.measured import ANYTIME, STOPS, lower_bound, sequential_stop
from teamtr.stage import measuring_sampler

TINY = {
    "source": "tiny",
    "n_agents": 2,
    "prompts_per_batch": 2,
    "group_size": 2,
    "turns": 2,
    "max_new_tokens": 4,
    "learning_rate": 1e-2,
    "threads": 1,
}
PROBLEMS = [Problem("1 + 1?", "2"), Problem("2 + 2?", "4")]


def length_mod_three(dialogue: Dialogue) -> float:
    """A reward a random tiny model earns unevenly: the final message's length mod 3, halved."""
    return (len(dialogue.final) % 3) / 2.0


def test_held_out_groups_pair_an_update_with_their_continuation() -> None:
    task = Task(PROBLEMS, reward=length_mod_three)
    team, sampler, updater, _ = llm.build_team(task=task, **TINY, held_out_group_size=2)
    held = sampler.with_held_out(3)
    first = held.sample(team)
    assert first.held_out is not None and first.pairs is None
    assert len(first.held_out.episodes) == 3 * 2 and len(first.episodes) == 2 * 2
    # The updater reads only ``episodes``; the held-out dialogues are others.
    assert not {id(e) for e in first.held_out.episodes} & {id(e) for e in first.episodes}
    update = updater.update(team, 0, first, 0.05)
    assert update.accepted
    new_team = team.with_agent(0, update.policy)
    second = held.sample(new_team, previous=first, updated_agent=0)
    pairs = second.pairs
    assert pairs is not None and pairs.updated_agent == 0 and pairs.reward_width == 1.0
    continued = second.held_out.continued
    for old, new in zip(first.held_out.episodes, continued, strict=True):
        cut = old.first_turn_of(0, sampler.chat.policy_of)
        kept = len(old.turns) if cut is None else cut
        assert new.turns[:kept] == old.turns[:kept] and len(new.turns) == len(old.turns)
        assert new.problem == old.problem
    new_rewards = np.array([task.training_reward(sampler.dialogue(e)) for e in continued])
    expected = group_differences(new_rewards, first.held_out.rewards, 2)
    np.testing.assert_allclose(pairs.differences, expected, rtol=0, atol=1e-12)
    assert pairs.differences.size == 3
    # The continued groups, draws of the new team, are held out again: the next update's
    # pairs (a chain; tests/llm/test_llm_coupled_pairs.py checks their means).
    assert second.held_out.episodes == continued and len(continued) == 6
    assert second.held_out.rewards.tolist() == new_rewards.tolist()


def test_where_a_bound_can_undo_an_update_every_draw_holds_out_fresh_groups() -> None:
    """Under ``accept = "measured"`` whether an update stays, and so whether its held-out
    continuations go on, depends on their rewards: held out again they would be a selected
    sample, not draws of the new team. The stage's sampler holds out fresh groups after every
    draw there, and its sequential draws keep nothing for the next update; otherwise it chains."""
    task = Task(PROBLEMS, reward=length_mod_three)
    team, sampler, updater, _ = llm.build_team(task=task, **TINY)
    config = StageConfig(radius=0.05, certificate_groups=3, accept="measured")
    held = measuring_sampler(sampler, config)
    assert held is not None and not held.chained
    assert measuring_sampler(sampler, dataclasses.replace(config, accept="theory")).chained
    first = held.sample(team)
    update = updater.update(team, 0, first, 0.05)
    new_team = team.with_agent(0, update.policy)
    second = held.sample(new_team, previous=first, updated_agent=0)
    assert second.pairs is not None and second.pairs.differences.size == 3
    assert second.held_out is not None and len(second.held_out.episodes) == 3
    assert not {id(e) for e in second.held_out.episodes} & {
        id(e) for e in second.held_out.continued
    }
    assert held.draw_pairs(team, new_team, 0, 2) is not None and held.reserves == []


def test_by_default_every_held_out_dialogue_is_a_problem_and_a_pair_of_its_own() -> None:
    task = Task(PROBLEMS, reward=length_mod_three)
    team, sampler, updater, _ = llm.build_team(task=task, **TINY)
    held = sampler.with_held_out(5)
    first = held.sample(team)
    assert first.held_out is not None and first.held_out.group_size == 1
    assert len(first.held_out.episodes) == 5 and len(first.episodes) == 2 * 2
    update = updater.update(team, 1, first, 0.05)
    second = held.sample(team.with_agent(1, update.policy), previous=first, updated_agent=1)
    assert second.pairs is not None
    new_rewards = np.array(
        [task.training_reward(sampler.dialogue(e)) for e in second.held_out.continued]
    )
    np.testing.assert_allclose(
        second.pairs.differences, new_rewards - first.held_out.rewards, rtol=0, atol=1e-12
    )


def test_a_stage_records_the_measured_certificate_of_every_kept_update() -> None:
    task = Task(PROBLEMS, reward=length_mod_three)
    team, sampler, updater, penalty = llm.build_team(task=task, **TINY)
    config = StageConfig(radius=0.05, certificate_groups=2, certificate_level=0.9)
    report, _ = run_stage(team, sampler, updater, config, penalty)
    for record in report.records:
        if record.kept:
            assert record.measured is not None and record.measured.n == 2
            assert record.measured.level == 0.9
            assert record.measured.bound >= -1.0
        else:
            assert record.measured is None
    metrics = StageMetrics.of(0, report, 1.0, 1.0)
    assert [u.measured is not None for u in metrics.updates] == [r.kept for r in report.records]
    assert metrics.held_out_tokens > 0
    assert StageMetrics.from_json(metrics.as_json()) == metrics
    if all(r.kept for r in report.records):
        assert report.measured is not None and report.records[-1].resample is None
        assert metrics.measured == report.measured.as_dict()
        line = f"measured: improvement >= {report.measured.bound:+.3g} with 90% confidence"
        assert f"{line} (n = 4 pairs)" in certificate_parts(report)


def test_pairs_drawn_on_are_fresh_groups_of_the_old_team_continued_by_the_new() -> None:
    task = Task(PROBLEMS, reward=length_mod_three)
    team, sampler, updater, _ = llm.build_team(task=task, **TINY)
    first = sampler.sample(team)
    update = updater.update(team, 1, first, 0.05)
    new_team = team.with_agent(1, update.policy)
    assert sampler.take_pair_draw_tokens() == 0
    pairs = sampler.draw_pairs(team, new_team, 1, 3)
    assert pairs is not None and pairs.differences.size == 3 and pairs.updated_agent == 1
    assert np.all(np.isin(pairs.differences, [-1.0, -0.5, 0.0, 0.5, 1.0]))
    assert sampler.take_pair_draw_tokens() > 0 and sampler.take_pair_draw_tokens() == 0


def test_a_stage_with_sequential_draws_records_the_anytime_bound_of_every_pair() -> None:
    task = Task(PROBLEMS, reward=length_mod_three)
    team, sampler, updater, penalty = llm.build_team(task=task, **TINY)
    config = StageConfig(radius=0.05, certificate_groups=2, certificate_batch=2, certificate_cap=12)
    report, _ = run_stage(team, sampler, updater, config, penalty)
    measured = [r.measured for r in report.records if r.measured is not None]
    assert measured and len(measured) == sum(r.kept for r in report.records)
    for certificate in measured:
        d = certificate.differences
        assert certificate.method == ANYTIME and certificate.stop in STOPS and d is not None
        assert 2 <= certificate.n <= 12 and certificate.n % 2 == 0
        assert certificate.bound == lower_bound(d, 1.0, 0.05, ANYTIME)
        # Drawn on, 2 at a time, exactly until the rule stopped (rewards in [0, 1]).
        for looked in range(2, certificate.n, 2):
            assert sequential_stop(d[:looked], 1.0, 0.05, 12) is None
        if certificate.stop != "cap":
            assert sequential_stop(d, 1.0, 0.05, 12) == certificate.stop
    # The tokens of every pair played outside the stage's draws are kept for the records
    # (the last update's continuation at least).
    assert sampler.take_pair_draw_tokens() > 0


def test_the_reward_range_is_declared_checked_and_widened_by_a_format_bonus() -> None:
    assert Task(PROBLEMS).training_range == (0.0, 1.0)
    assert Task(PROBLEMS, bonus=FormatBonus(0.2)).training_range == (0.0, 1.2)
    assert Task(PROBLEMS, bonus=length_mod_three).training_range is None
    with pytest.raises(TaskError, match="reward_range"):
        Task(PROBLEMS, reward_range=(1.0, 1.0))
    with pytest.raises(ValueError, match="outside the task's reward range"):
        check_in_range(np.array([0.2, 1.5]), (0.0, 1.0))


def test_a_configured_reward_knows_its_range_or_declares_it(tmp_path) -> None:
    """The ready-made rewards' ranges add up with their weights (length_penalty lies in
    [-1, 0]); a function of one's own has none until [task] reward_range declares it, and a
    run that measures with it is refused before it starts."""
    from llm.common.config import ConfigError, TaskSettings, load_config
    from llm.problems.configured import build_task
    from llm.rewards.named import weighted_range

    assert weighted_range(["math_verify", "length_penalty"], [1.0, 0.5]) == (-0.5, 1.0)
    assert weighted_range(["exact_match", "format_regex"], [2.0, -1.0]) == (-1.0, 2.0)
    assert weighted_range(["exact_match", "mine:score"]) is None
    listed = TaskSettings(reward=("exact_match", "length_penalty"), reward_weights=(1.0, 0.2))
    assert build_task(listed).training_range == (-0.2, 1.0)
    (tmp_path / "mine.py").write_text("def score(dialogue):\n    return 3.0\n")
    own = TaskSettings(reward="mine:score", directory=str(tmp_path))
    assert build_task(own).training_range is None
    declared = dataclasses.replace(own, reward_range=(0.0, 3.0))
    assert build_task(declared).training_range == (0.0, 3.0)
    config = tmp_path / "measured.toml"
    config.write_text('[task]\nreward = "mine:score"\n[stage]\ncertificate_groups = 4\n')
    with pytest.raises(ConfigError, match="reward_range = \\[low, high\\]"):
        load_config(config)
    config.write_text(config.read_text().replace("[stage]", "reward_range = [0.0, 3.0]\n[stage]"))
    assert load_config(config).task.reward_range == (0.0, 3.0)


def test_plot_draws_the_measured_bound_of_the_stages_that_have_one(tmp_path) -> None:
    records = [
        {"stage": 0, "train_reward": 0.1, "certificate": -0.5, "measured": None},
        {
            "stage": 1,
            "train_reward": 0.2,
            "certificate": -0.4,
            "measured": {"n": 64, "mean": 0.2, "bound": 0.12, "level": 0.95},
        },
    ]
    assert measured_bounds(records) == ([2], [0.12], 0.95)
    assert measured_bounds(records[:1]) == ([], [], None)
    out = tmp_path / "curves.png"
    draw(records, out, "run")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_runs_reporting_sampler_still_reports_when_it_holds_groups_out() -> None:
    """The run wraps its sampler to report every draw; the held-out copy the stage loop asks
    for must be wrapped too, or its draws would go unreported."""
    from llm.training.stages.loop import _ReportingSampler

    task = Task(PROBLEMS, reward=length_mod_three)
    team, sampler, _, _ = llm.build_team(task=task, **TINY)
    seen: list = []
    held = _ReportingSampler(sampler, seen.append).with_held_out(2)
    rollouts = held.sample(team)
    assert seen == [rollouts] and rollouts.held_out is not None
    assert len(rollouts.held_out.episodes) == 2
