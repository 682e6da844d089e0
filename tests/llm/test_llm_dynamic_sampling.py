"""Dynamic sampling (``[sampler] signal_groups``) and the format reward (``[task]
format_reward``) on a tiny random model, with the real sampler and real grading.

A random model's answers rarely hit a reference, but a character model writes a digit often
enough that ``format_reward`` splits many groups into well-formed and unparsable answers: the
reward variance the filter looks for, earned through the task's own grading.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from llm_test_support import SHORT_SYSTEM_PROMPT, make_team, perturb_agent

from llm.common.config import ConfigError, load_config
from llm.conversation.dialogue import ChatFormat, Episode, Turn
from llm.conversation.router import FixedOrder
from llm.problems.rewards import grade
from llm.problems.task import FormatBonus, Task
from llm.problems.tasks import Problem
from llm.sampling.rollouts import DialogueRollouts, group_signal
from llm.sampling.sampler import DialogueSampler, SamplerSettings
from llm.training.distributed import check_world

N_AGENTS = 2


def digit_problems(rng: np.random.Generator, count: int) -> list[Problem]:
    """Single-digit answers: a random model hits one now and then."""
    return [Problem(f"Say {d}.", str(d)) for d in rng.integers(10, size=count)]


def unreachable_problems(rng: np.random.Generator, count: int) -> list[Problem]:
    """Answers longer than any message: no dialogue earns a reward."""
    return [Problem(f"Say {n}.", str(n)) for n in rng.integers(10**6, 10**7, size=count)]


@pytest.fixture
def chat(char_tokenizer) -> ChatFormat:
    return ChatFormat.from_tokenizer(char_tokenizer, N_AGENTS, system_prompt=SHORT_SYSTEM_PROMPT)


@pytest.fixture
def team(char_tokenizer):
    return make_team(len(char_tokenizer), N_AGENTS)


def sampler(chat, problems=digit_problems, format_reward=0.5, **settings) -> DialogueSampler:
    values = {
        "prompts_per_batch": 3,
        "group_size": 3,
        "turns": 2,
        "max_new_tokens": 4,
        "temperature": 1.5,
        "seed": 3,
        **settings,
    }
    task = Task(problems, bonus=FormatBonus(format_reward))
    return DialogueSampler(chat, FixedOrder(N_AGENTS), task, SamplerSettings(**values))


def episode_reward(chat: ChatFormat, episode: Episode, format_reward: float = 0.0) -> float:
    """A finished dialogue's training reward under the default task with ``format_reward``."""
    task = Task([episode.problem], bonus=FormatBonus(format_reward))
    probe = DialogueSampler(chat, FixedOrder(N_AGENTS), task, SamplerSettings())
    return task.training_reward(probe.dialogue(episode))


def groups(rollouts: DialogueRollouts) -> list[tuple]:
    """Each group's problem and dialogues, comparable across samplers."""
    g = rollouts.group_size
    episodes = rollouts.episodes
    return [
        tuple((e.problem, e.route_seed, e.turns) for e in episodes[i : i + g])
        for i in range(0, len(episodes), g)
    ]


def same_rollouts(a: DialogueRollouts, b: DialogueRollouts) -> bool:
    return (
        a.episodes == b.episodes
        and np.array_equal(a.rewards, b.rewards)
        and np.array_equal(a.advantages, b.advantages)
        and (a.generated_tokens, a.reused_turns) == (b.generated_tokens, b.reused_turns)
    )


def test_off_samples_draw_for_draw_as_without_the_keys(chat, team):
    plain = DialogueSampler(
        chat,
        FixedOrder(N_AGENTS),
        digit_problems,
        SamplerSettings(prompts_per_batch=3, group_size=3, turns=2, max_new_tokens=4, seed=3),
    )
    off = sampler(chat, format_reward=0.0, temperature=0.7, signal_groups=0, max_draws=50)
    changed = perturb_agent(team, 1, 0.5, seed=1)
    for s in (plain, off):
        first = s.sample(team)
        s.batches = [first, s.sample(changed, previous=first, updated_agent=1), s.sample(team)]
    for a, b in zip(plain.batches, off.batches, strict=True):
        assert same_rollouts(a, b)
        assert a.groups_drawn == b.groups_drawn == 3
    assert off.batches[1].reused_turns > 0  # prefix reuse is untouched when off
    assert plain.rng.bit_generator.state == off.rng.bit_generator.state


def test_the_batch_is_the_filter_applied_to_the_groups_drawn_one_batch_at_a_time(chat, team):
    """Rounds of ``prompts_per_batch`` groups are the batches the sampler would return when
    off: the kept groups are those batches' groups chosen by signal, every token counted."""
    size = 3
    on = sampler(chat, signal_groups=3, max_draws=12)
    off = sampler(chat, signal_groups=0)
    searched = 0
    for _ in range(4):
        rollouts = on.sample(team)
        rounds = rollouts.groups_drawn // size
        assert rollouts.groups_drawn == rounds * size <= size + 12
        drawn = [off.sample(team) for _ in range(rounds)]
        assert rollouts.generated_tokens == sum(b.generated_tokens for b in drawn)
        every_group = [g for b in drawn for g in groups(b)]
        signal = np.concatenate([group_signal(b.rewards, b.group_size) for b in drawn])
        assert rollouts.groups_with_signal == int(signal.sum())
        wanted = [i for i in np.flatnonzero(signal)][:size]
        wanted += [i for i in np.flatnonzero(~signal)][: size - len(wanted)]
        assert groups(rollouts) == [every_group[i] for i in sorted(wanted)]
        assert len(rollouts.episodes) == size * rollouts.group_size
        assert rollouts.held_signal_groups == min(size, rollouts.groups_with_signal)
        # Stopped at the first round that completed the count, or at the cap.
        found_before_last = signal[: (rounds - 1) * size].sum()
        assert found_before_last < 3 and (signal.sum() >= 3 or rounds == 5)
        # Rewards and advantages are those of the kept groups, graded as when off.
        rewards = np.concatenate([b.rewards for b in drawn]).reshape(-1, rollouts.group_size)
        assert np.array_equal(rollouts.rewards, rewards[sorted(wanted)].reshape(-1))
        assert rollouts.reused_turns == 0
        searched += rounds > 1
    assert searched, "no batch needed a second round: the test would not exercise the search"


def test_the_cap_on_extra_draws_is_respected(chat, team):
    s = sampler(
        chat, problems=unreachable_problems, format_reward=0.0, signal_groups=2, max_draws=4
    )
    twin = sampler(chat, problems=unreachable_problems, format_reward=0.0)
    rollouts = s.sample(team)
    assert (rollouts.groups_drawn, rollouts.groups_with_signal) == (3 + 4, 0)
    assert rollouts.held_signal_groups == 0 and not rollouts.rewards.any()
    # Without signal the batch keeps the first groups drawn, at the batch's size.
    assert groups(rollouts) == groups(twin.sample(team))
    assert rollouts.generated_tokens > twin.sample(team).generated_tokens  # the rest counted
    capped = sampler(
        chat, problems=unreachable_problems, format_reward=0.0, signal_groups=1, max_draws=0
    ).sample(team)
    assert capped.groups_drawn == 3


def test_a_filtered_draw_lends_the_prefixes_of_every_group_it_played(chat, team):
    """The resample of an intermediate team replays the filter over the previous draw's pool:
    each round continues the prefixes of the previous round in its place (cut before the
    updated agent's first turn) and plays fresh groups beyond it."""
    on = sampler(chat, signal_groups=2, max_draws=6)
    changed = perturb_agent(team, 1, 0.5, seed=1)
    first = on.sample(team)
    assert len(first.pool) == first.groups_drawn * 3  # every group played, kept or not
    kept = {id(e) for e in first.episodes}
    assert kept <= {id(e) for e in first.pool}
    again = on.sample(changed, previous=first, updated_agent=1)
    pooled = min(again.groups_drawn, first.groups_drawn) * 3
    # Agent 1 speaks second: each pooled dialogue keeps its first turn, and only that.
    assert again.reused_turns == pooled
    for old, new in zip(first.pool[:pooled], again.pool[:pooled], strict=True):
        assert new.turns[0] == old.turns[0] and new.problem == old.problem
    fresh = sampler(chat, signal_groups=2, max_draws=6).sample(changed)
    turns = 2 * fresh.groups_drawn * 3  # every message of a fresh draw is generated
    assert again.generated_tokens < sum(len(t.message) for e in again.pool for t in e.turns)
    assert fresh.generated_tokens == sum(len(t.message) for e in fresh.pool for t in e.turns)
    assert turns == sum(len(e.turns) for e in fresh.pool)
    assert again.held_signal_groups >= min(2, again.groups_with_signal)


def episode_saying(tokenizer, chat: ChatFormat, text: str, answer: str) -> Episode:
    """A finished two-turn dialogue whose final message is ``text``."""
    message = tuple(tokenizer.encode(text, add_special_tokens=False))
    assert chat.decode(message) == text
    return Episode(Problem("q", answer), (0, 1), 0, (Turn(0, message), Turn(1, message)))


@pytest.mark.parametrize(
    ("text", "answer", "base", "well_formed"),
    [
        ("7", "7", 1.0, True),
        ("The answer is 7", "7", 1.0, True),
        ("12", "7", 0.0, True),
        ("\\frac{1}{2}", "7", 0.0, True),
        ("1/2", "7", 0.0, False),  # an unevaluated quotient, as "3/4" in llm.problems.rewards
        ("89 + 25", "114", 0.0, False),  # restates the question: neither correct nor formed
        ("seven", "7", 0.0, False),
        ("abc", "7", 0.0, False),
        ("", "7", 0.0, False),
    ],
)
def test_the_format_reward_pays_for_a_well_formed_final_answer(
    char_tokenizer, chat, text, answer, base, well_formed
):
    verdict = grade(text, answer)
    assert verdict.well_formed is well_formed
    episode = episode_saying(char_tokenizer, chat, text, answer)
    assert episode_reward(chat, episode) == base
    assert episode_reward(chat, episode, 0.25) == base + 0.25 * well_formed
    # A well-formed wrong answer now scores above an unparsable one.
    assert episode_reward(chat, episode, 0.25) >= episode_reward(
        chat, episode_saying(char_tokenizer, chat, "abc", answer), 0.25
    )


def test_the_format_reward_enters_training_rewards_not_the_evaluation(chat, team):
    from llm.evaluation.held_out_problems import evaluate_team

    with_bonus, without = (sampler(chat, format_reward=f) for f in (0.5, 0.0))
    a, b = with_bonus.sample(team), without.sample(team)
    assert a.episodes == b.episodes
    well_formed = np.array(
        [grade(chat.message_text(e.turns[-1]), e.problem.answer).well_formed for e in a.episodes]
    )
    assert well_formed.any(), "no well-formed answer: the comparison would be vacuous"
    assert np.array_equal(a.rewards, b.rewards + 0.5 * well_formed)
    problems = digit_problems(np.random.default_rng(0), 6)
    evaluations = [evaluate_team(team, s, problems, samples=3) for s in (with_bonus, without)]
    assert evaluations[0] == evaluations[1]
    assert 0.0 <= evaluations[0]["accuracy"] <= 1.0


def write_config(tmp_path, text: str):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "line", "key", "message"),
    [
        ("[task]\nformat_reward = 1.5\n", 2, "[task] format_reward", r"\[0, 1\]"),
        ("[task]\nformat_reward = -0.1\n", 2, "[task] format_reward", r"\[0, 1\]"),
        ("[sampler]\n\nsignal_groups = -1\n", 3, "[sampler] signal_groups", ">= 0"),
        ("[sampler]\nsignal_groups = 5\n", 2, "[sampler] signal_groups", "0..prompts_per_batch"),
        ("[sampler]\nmax_draws = -2\n", 2, "[sampler] max_draws", ">= 0"),
        ("[sampler]\nmax_draws = 1.5\n", 2, "[sampler] max_draws", "integer"),
        (
            "[sampler]\nsignal_groups = 2\n[run]\nrollout_shards = 2\n",
            2,
            "[sampler] signal_groups",
            "sharded",
        ),
    ],
)
def test_bad_keys_name_file_line_and_key(tmp_path, text, line, key, message):
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as error:
        load_config(path)
    assert str(error.value).startswith(f"{path}:{line}: {key}")


def test_good_keys_load_and_data_parallel_sharding_is_refused(tmp_path):
    config = load_config(
        write_config(
            tmp_path, "[task]\nformat_reward = 0.1\n[sampler]\nsignal_groups = 4\nmax_draws = 8\n"
        )
    )
    assert (config.task.format_reward, config.sampler.signal_groups) == (0.1, 4)
    assert config.sampler.max_draws == 8
    assert check_world(config, 1) == 1
    with pytest.raises(ConfigError, match="sharded"):
        check_world(config, 2)
    off = dataclasses.replace(config, sampler=dataclasses.replace(config.sampler, signal_groups=0))
    assert check_world(off, 2) == 2


def test_a_run_records_the_groups_drawn(tmp_path):
    import json
    from pathlib import Path

    from llm.interface.cli import main

    smoke = Path(__file__).resolve().parents[2] / "configs" / "smoke.toml"
    text = smoke.read_text().replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')
    text = text.replace("[sampler]\n", "[sampler]\nsignal_groups = 2\nmax_draws = 4\n")
    text = text.replace("[task]\n", "[task]\nformat_reward = 0.5\n")
    path = write_config(tmp_path, text.replace("stages = 2", "stages = 1"))
    assert main(["train", "--config", str(path), "--name", "r", "--no-progress"]) == 0
    (record,) = [json.loads(x) for x in (tmp_path / "runs" / "r" / "metrics.jsonl").open()]
    calls = len(record["rollout_rewards"])
    assert 2 * calls <= record["groups_drawn"] <= 6 * calls
    assert 0 <= record["groups_with_signal"] <= record["groups_drawn"]
    assert len(record["batch_signal_groups"]) == calls
    assert all(0 <= g <= 2 for g in record["batch_signal_groups"])
    assert record["reused_turns"] == 0


def test_sharded_rollouts_count_groups_and_refuse_the_filter(chat, team):
    from llm.common.collective import Collective
    from llm.training.distributed import ShardedSampler

    settings = SamplerSettings(
        prompts_per_batch=4, group_size=3, turns=2, max_new_tokens=4, temperature=1.5, seed=3
    )
    sharded = ShardedSampler(
        chat,
        FixedOrder(N_AGENTS),
        Task(digit_problems, bonus=FormatBonus(0.5)),
        settings,
        shards=2,
        collective=Collective(),
    )
    rollouts = sharded.sample(team)
    signal = group_signal(rollouts.rewards, rollouts.group_size)
    assert (rollouts.groups_drawn, rollouts.groups_with_signal) == (4, int(signal.sum()))
    assert rollouts.held_signal_groups == int(signal.sum())
    with pytest.raises(ConfigError, match="sharded"):
        ShardedSampler(
            chat,
            FixedOrder(N_AGENTS),
            digit_problems,
            dataclasses.replace(settings, signal_groups=1),
            shards=2,
            collective=Collective(),
        )
