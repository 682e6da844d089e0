"""Team formats and per-agent views on the tiny model: per-agent message lengths, repeated
speakers, private notes that only their holder sees, and one adapter shared by every role."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from llm_test_support import SHORT_SYSTEM_PROMPT, log_prob_resolution, make_team, perturb_agent

from llm.common.config import ConfigError, config_from_dict
from llm.conversation.dialogue import ChatFormat, Episode, Turn
from llm.conversation.router import FixedOrder
from llm.logprobs.scoring import message_logits
from llm.problems.tasks import Problem
from llm.sampling.sampler import DialogueSampler, SamplerSettings

REPO = Path(__file__).resolve().parents[2]
NOTES = ("Your number is 7.", "Your number is 5.")
OTHER_NOTE = "Your private number is 31, keep it."


def two_agent_chat(char_tokenizer, policy_of=()) -> ChatFormat:
    return ChatFormat.from_tokenizer(
        char_tokenizer, 2, SHORT_SYSTEM_PROMPT, ("Solve.", "Answer."), policy_of
    )


def noted_problems(notes: tuple[str, ...]):
    def draw(rng, count):
        return [Problem(f"Add {i}.", "12", "notes", 1, notes) for i in range(count)]

    return draw


def sampler_for(chat, notes=NOTES, **settings) -> DialogueSampler:
    values = {"prompts_per_batch": 2, "group_size": 2, "turns": 2, "max_new_tokens": 5}
    return DialogueSampler(
        chat, FixedOrder(2), noted_problems(notes), SamplerSettings(**{**values, **settings})
    )


def contains(haystack: list[int], needle: list[int]) -> bool:
    return any(
        haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1)
    )


def log_prob_tolerance(team, chat, episodes, batch, temperature: float) -> float:
    """How far two float32 scorings of these messages may put a log-prob apart:
    ``log_prob_resolution`` over the longest view scored (its premise, raw logits below 1,
    checked). 3.2e-4 to 3.5e-4 here."""
    positions = max(len(chat.context(e, a)) for e in episodes for a in range(team.n_agents))
    max_logit = float(batch.logits.abs().max()) * temperature  # batch.logits are divided by T
    assert max_logit < 1
    config = team.backbone.model.config
    return log_prob_resolution(config, positions, max_logit, temperature)


def test_per_agent_message_lengths_hold(char_tokenizer):
    chat = two_agent_chat(char_tokenizer)
    team = make_team(len(char_tokenizer), 2)
    sampler = sampler_for(chat, notes=(), max_new_tokens=(6, 2), turns=4)
    rollouts = sampler.sample(team)
    lengths = {0: [], 1: []}
    for episode in rollouts.episodes:
        assert [t.agent for t in episode.turns] == [0, 1, 0, 1]
        for turn in episode.turns:
            lengths[turn.agent].append(len(turn.message))
    assert max(lengths[1]) <= 2
    assert max(lengths[0]) <= 6
    # A random tiny model rarely stops early: the solver's longer limit is used.
    assert max(lengths[0]) > 2


def test_a_repeated_speaker_takes_several_turns_and_reuse_cuts_at_its_first(char_tokenizer):
    chat = ChatFormat.from_tokenizer(char_tokenizer, 2, SHORT_SYSTEM_PROMPT)
    team = make_team(len(char_tokenizer), 2)
    settings = SamplerSettings(prompts_per_batch=1, group_size=2, turns=4, max_new_tokens=3)
    sampler = DialogueSampler(chat, FixedOrder(2, (1, 0, 0)), noted_problems(()), settings)
    rollouts = sampler.sample(team)
    assert all([t.agent for t in e.turns] == [1, 0, 0, 1] for e in rollouts.episodes)
    changed = perturb_agent(team, 0, 0.5, seed=1)
    again = sampler.sample(changed, previous=rollouts, updated_agent=0)
    assert again.reused_turns == 2  # each episode keeps agent 1's opening turn only
    for old, new in zip(rollouts.episodes, again.episodes, strict=True):
        assert new.turns[0] == old.turns[0]


def test_a_note_is_in_its_holders_view_only(char_tokenizer):
    chat = two_agent_chat(char_tokenizer)
    episode = Episode(Problem("Add.", "12", notes=NOTES), tuple(chat.encode_prompt("Add.")), 0)
    spoken = episode.with_turns([Turn(0, tuple(chat.encode_prompt("7")[:3]))])
    note_0 = list(char_tokenizer.encode(NOTES[0], add_special_tokens=False))
    note_1 = list(char_tokenizer.encode(NOTES[1], add_special_tokens=False))
    own = chat.context(episode, 0)
    assert contains(own, note_0) and not contains(own, note_1)
    other = chat.context(spoken, 1)
    assert contains(other, note_1) and not contains(other, note_0)
    public, _ = chat.assemble(spoken)
    assert not contains(public, note_0) and not contains(public, note_1)


@pytest.mark.parametrize("share_prompt", [True, False])
def test_no_agents_log_probs_move_when_anothers_note_changes(char_tokenizer, share_prompt):
    """The no-leak test: perturb agent 0's note and agent 1's log-probs of the same messages stay
    bit-identical; perturb agent 1's own note and they move (the test has power)."""
    chat = two_agent_chat(char_tokenizer)
    team = perturb_agent(make_team(len(char_tokenizer), 2), 1, 0.5, seed=3)
    rollouts = sampler_for(chat).sample(team)

    tolerances = []

    def agent_logps(notes: tuple[str, ...], agent: int) -> torch.Tensor:
        episodes = [
            dataclasses.replace(e, problem=dataclasses.replace(e.problem, notes=notes))
            for e in rollouts.episodes
        ]
        with torch.no_grad():
            batch = message_logits(
                team.use(agent), chat, episodes, agent, range(len(episodes)), 0.7, share_prompt
            )
        assert batch is not None
        tolerances.append(log_prob_tolerance(team, chat, episodes, batch, 0.7))
        return batch.token_logps()[batch.mask]

    reference = agent_logps(NOTES, 1)
    assert torch.equal(agent_logps((OTHER_NOTE, NOTES[1]), 1), reference)
    assert torch.equal(agent_logps(("", NOTES[1]), 1), reference)
    # Its own note moves them by more than float32 rounding could (by 0.5 nats at most here).
    moved = agent_logps((NOTES[0], OTHER_NOTE), 1)
    assert (moved - reference).abs().max() > max(tolerances)
    # And symmetrically for agent 0, whose message comes first.
    first = agent_logps(NOTES, 0)
    assert torch.equal(agent_logps((NOTES[0], OTHER_NOTE), 0), first)


def test_sampled_log_probs_match_scoring_in_the_speakers_view(char_tokenizer):
    """The behaviour log-probs recorded when sampling are those of each speaker's own view:
    scoring them again reproduces them, and the two scoring paths agree."""
    chat = two_agent_chat(char_tokenizer)
    team = perturb_agent(make_team(len(char_tokenizer), 2), 0, 0.5, seed=5)
    sampler = sampler_for(chat)
    rollouts = sampler.sample(team)
    for agent in (0, 1):
        with torch.no_grad():
            shared = message_logits(
                team.use(agent), chat, rollouts.episodes, agent, range(4), 0.7, True
            )
            per_row = message_logits(
                team.use(agent), chat, rollouts.episodes, agent, range(4), 0.7, False
            )
        assert shared is not None and per_row is not None
        # The prompt scored once for its group or once per row, and the log-probs recorded
        # while sampling: the same sums in other batch shapes. The derived tolerance (3.2e-4) is
        # looser than the former 1e-5 and 1e-6; measured: 4.8e-7 and 0 natively on AVX-512, 0
        # and 0 with ATEN_CPU_CAPABILITY=default and avx2.
        tolerance = log_prob_tolerance(team, chat, rollouts.episodes, shared, 0.7)
        torch.testing.assert_close(
            shared.token_logps(), per_row.token_logps(), atol=tolerance, rtol=0
        )
        for row, (e, t) in enumerate(shared.refs):
            recorded = rollouts.old_logps[e][t]
            torch.testing.assert_close(
                shared.token_logps()[row][shared.mask[row]], recorded, atol=tolerance, rtol=0
            )


def test_a_shared_adapter_speaks_every_role_and_is_trained_on_all_of_them(char_tokenizer):
    chat = two_agent_chat(char_tokenizer, policy_of=(0, 0))
    team = make_team(len(char_tokenizer), 1)
    sampler = sampler_for(chat, notes=())
    rollouts = sampler.sample(team)
    assert all([t.agent for t in e.turns] == [0, 1] for e in rollouts.episodes)
    with torch.no_grad():
        batch = message_logits(team.use(0), chat, rollouts.episodes, 0, range(4), 0.7)
    assert batch is not None
    assert len(batch.refs) == sum(1 for e in rollouts.episodes for t in e.turns if t.message)
    # Each role keeps its own header although one adapter speaks for both.
    assert chat.headers[0] != chat.headers[1]
    assert chat.speakers_of(0) == (0, 1)


def test_a_shared_adapter_team_runs_a_stage(tmp_path):
    import llm
    from teamtr import StageConfig, run_stage

    parts = llm.build_team(
        source="tiny",
        n_agents=2,
        shared_adapter=True,
        role_prompts=("Solve.", "Answer."),
        max_new_tokens=(4, 2),
        turns=2,
        prompts_per_batch=1,
        group_size=2,
    )
    assert parts.team.n_agents == 1
    assert parts.sampler.chat.policy_of == (0, 0)
    report, _ = run_stage(
        parts.team, parts.sampler, parts.updater, StageConfig(radius=0.1), parts.penalty
    )
    assert [r.agent for r in report.records] == [0]
    # The shared adapter's update was scored on both roles' messages.
    assert report.records[0].rollouts is not None


def base_config(**team_and_sampler):
    team = {k: v for k, v in team_and_sampler.items() if k in ("n_agents", "shared_adapter")}
    sampler = {k: v for k, v in team_and_sampler.items() if k not in team}
    return {"model": {"source": "tiny"}, "team": team, "sampler": sampler}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (base_config(n_agents=2, max_new_tokens=[8, 4, 2]), "[sampler] max_new_tokens"),
        (base_config(n_agents=2, max_new_tokens=[8, 0]), "must be >= 1"),
        (
            {**base_config(n_agents=2, shared_adapter=True), "stage": {"radius": [0.1, 0.1]}},
            "one shared adapter",
        ),
        (
            {
                "model": {"source": "tiny", "sources": ["tiny", "tiny"]},
                "team": {"n_agents": 2, "shared_adapter": True},
            },
            "[team] shared_adapter",
        ),
        (base_config(n_agents=2, shared_adapter="yes"), "expected true or false"),
        (
            {
                "team": {"n_agents": 3, "role_prompts": []},
                "sampler": {"max_new_tokens": 8},
                "task": {"kind": "private_notes", "note_holders": 2},
            },
            "[task] note_holders",
        ),
        (
            {**base_config(n_agents=2), "task": {"kind": "private_notes", "note_answer": "max"}},
            "[task] note_answer",
        ),
    ],
)
def test_bad_format_keys_name_their_key(data, message):
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data, "run.toml")
    assert message in str(caught.value)


def test_good_format_keys_load():
    config = config_from_dict(
        {
            "team": {"n_agents": 2, "shared_adapter": True, "speaking_order": [0, 0, 1]},
            "sampler": {"max_new_tokens": [40, 8], "turns": 3},
        },
        "run.toml",
    )
    assert config.team.n_policies == 1
    assert config.sampler.max_tokens_of(1) == 8
    assert config.sampler.longest_message == 40


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--resume", "some_run", "--seed", "1"], "cannot be combined with --resume"),
        (["--resume", "some_run", "--output-dir", "x"], "cannot be combined with --resume"),
        (["--config", "configs/smoke.toml", "--seed", "-1"], "--seed: must lie in"),
    ],
)
def test_seed_and_output_dir_options_refuse_what_they_cannot_do(arguments, message, capsys):
    from llm.interface.cli import main

    assert main(["train", *arguments, "--check"]) == 2
    assert message in capsys.readouterr().err


def test_seed_and_output_dir_set_both_seeds_and_the_parent(tmp_path):
    from llm.interface.cli import main

    smoke = tmp_path / "smoke.toml"
    smoke.write_text(
        (REPO / "configs" / "smoke.toml").read_text().replace("stages = 2", "stages = 1")
    )
    arguments = ["train", "--config", str(smoke), "--name", "r", "--seed", "7"]
    assert main([*arguments, "--output-dir", str(tmp_path / "out"), "--no-progress"]) == 0
    config = json.loads((tmp_path / "out" / "r" / "config.json").read_text())
    assert (config["run"]["seed"], config["sampler"]["seed"]) == (7, 7)
