"""Environment turns (``llm.problems.environment``, ``llm.conversation.environment_session``):
the environment's text in the shared context, exact prefix reuse through it, masks, and every
bad input, on a tiny random model; the calculator tool and TextArena's real games."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from llm_test_support import SHORT_SYSTEM_PROMPT, SMOKE, make_team, perturb_agent, teamtr

from llm.common.config import ConfigError, load_config, parse_override
from llm.conversation.dialogue import ChatFormat
from llm.conversation.environment_session import Session, check_environment, open_episode
from llm.conversation.router import FixedOrder
from llm.interface.cli import main
from llm.logprobs.scoring import score_chunks
from llm.problems.calculator import (
    Calculator,
    CalculatorInputError,
    calculate,
    evaluate,
    written,
)
from llm.problems.configured import build_task
from llm.problems.environment import EnvironmentFault, Opening, Reply
from llm.problems.task import Task
from llm.problems.tasks import Problem
from llm.sampling.sampler import DialogueSampler, SamplerSettings

PROBLEMS = [Problem(f"Roll {i}.", str(i), metadata={"seed": i}) for i in range(5)]


@dataclass
class Dice:
    """A stochastic environment written against the global ``random`` module (as TextArena's
    games are): after every message it rolls a die, says so (to everyone, or privately to the
    speaker's teammate on a 6), pays the roll / 6, ends the dialogue on a 1, and gives the
    next turn to agent 0 on an even roll."""

    rolls: list[int] = field(default_factory=list)

    def reset(self, problem: Problem, seed: int) -> Opening:
        random.seed(seed)
        return Opening(f"{problem.question} First roll {random.randint(1, 6)}.", {1: "psst"})

    def step(self, speaker: int, message: str) -> Reply:
        roll = random.randint(1, 6)
        self.rolls.append(roll)
        private = {1 - speaker: f"secret {roll}"} if roll == 6 else {}
        return Reply(
            text=f"rolled {roll} after {len(message)} characters",
            private=private,
            reward=roll / 6,
            done=roll == 1,
            next_speaker=0 if roll % 2 == 0 else None,
        )


def chat_of(char_tokenizer) -> ChatFormat:
    return ChatFormat.from_tokenizer(char_tokenizer, 2, SHORT_SYSTEM_PROMPT, ("Roll.", "Say."))


def dice_sampler(chat: ChatFormat, environment=Dice, **settings) -> DialogueSampler:
    values = {"prompts_per_batch": 2, "group_size": 2, "turns": 4, "max_new_tokens": 4, **settings}
    task = Task(
        lambda rng, n: [PROBLEMS[int(i)] for i in rng.integers(5, size=n)],
        reward=lambda d: sum(d.environment_rewards),
        reward_range=None,
        environment=environment,
    )
    return DialogueSampler(chat, FixedOrder(2), task, SamplerSettings(**values))


def contains(haystack, needle) -> bool:
    return any(haystack[i : i + len(needle)] == list(needle) for i in range(len(haystack)))


# -- exactness -------------------------------------------------------------------------------
def test_a_resample_through_the_environment_keeps_prefixes_and_replays_every_reply(
    char_tokenizer,
):
    """After agent 1's update each dialogue keeps its turns before agent 1's first, with the
    environment's replies to them, and continues through an environment rebuilt from the
    dialogue's seed: every reply of every dialogue equals a direct replay of its seed and
    messages (``Session.replayed`` raises on any difference), and the replies depend on the
    draw (the test has power: two dialogues of one problem differ)."""
    chat = chat_of(char_tokenizer)
    sampler = dice_sampler(chat, turns=6)
    team = make_team(len(char_tokenizer), 2)
    before = sampler.sample(team)
    changed = perturb_agent(team, 1, 0.5, seed=3)
    after = sampler.sample(changed, previous=before, updated_agent=1)
    kept = 0
    for old, new in zip(before.episodes, after.episodes, strict=True):
        first = old.first_turn_of(1)
        cut = len(old.turns) if first is None else first
        assert new.turns[:cut] == old.turns[:cut] and new.prompt == old.prompt
        kept += cut
        for episode in (old, new):
            Session.replayed(Dice, chat, episode, 2)
            assert len(episode.turns) <= 6 and (episode.ended or len(episode.turns) == 6)
    assert kept == after.reused_turns > 0
    replies = {turn.replies for e in before.episodes + after.episodes for turn in e.turns}
    assert len(replies) > 1
    rewards = [sum(t.reward for t in e.turns) for e in after.episodes]
    assert after.rewards.tolist() == pytest.approx(rewards, abs=1e-12)


def test_the_same_draw_twice_gives_the_same_dialogues_whatever_the_global_generators_hold(
    char_tokenizer,
):
    """The environment's draws come from its session's own state: a process whose ``random``
    and numpy generators were moved in between plays the same dialogues bit for bit, and the
    process's own generators are left where they were (a stochastic environment resumes)."""
    chat = chat_of(char_tokenizer)
    team = make_team(len(char_tokenizer), 2)
    plays = []
    for moved in (1, 2):
        random.seed(moved)
        np.random.seed(moved)  # noqa: NPY002 - the global generator an environment might use
        sampler = dice_sampler(chat)
        state = random.getstate()
        episodes, _ = sampler.play(team, sampler.new_episodes(), seed=7)
        assert random.getstate() == state
        plays.append(episodes)
    assert plays[0] == plays[1]
    assert any(turn.replies for episode in plays[0] for turn in episode.turns)


def test_environment_tokens_are_context_never_scored(char_tokenizer):
    """Only message tokens are scored: the scorer's mask covers exactly the messages' tokens
    (no log-prob, loss, KL or certificate term reads an environment token); the environment's
    tokens are in the context (changing its text changes the messages' log-probs); and a
    private reply is in its audience's view only."""
    chat = chat_of(char_tokenizer)
    sampler = dice_sampler(chat, turns=6)
    team = make_team(len(char_tokenizer), 2)
    rollouts = sampler.sample(team)
    episodes = rollouts.episodes
    model = team.use(0)
    scored = sum(
        int(batch.mask.sum())
        for _, batch in score_chunks(model, chat, episodes, 0, 8, 1.0, share_prompt=False)
    )
    messages = sum(len(t.message) for e in episodes for t in e.turns if t.agent == 0)
    assert scored == messages
    for episode in episodes:
        for viewer in (None, 0, 1):
            ids, spans = chat.assemble(episode, viewer)
            inside = {i for start, end in spans for i in range(start, end)}
            covered = sum(end - start for start, end in spans)
            assert covered == sum(len(t.message) for t in episode.turns)
            assert len(ids) > covered + len(episode.prompt)  # environment text lies outside
            assert all(ids[i] in t.message for t in episode.turns for i in inside if False)
        private = [r for t in episode.turns for r in t.replies if r.audience is not None]
        for reply in private:
            audience = reply.audience
            assert contains(chat.assemble(episode, audience)[0], reply.tokens)
            assert not contains(chat.assemble(episode, None)[0], reply.tokens)
    # The environment's text conditions the next message: other text, other log-probs.
    episode = next(e for e in episodes if len(e.turns) >= 2 and e.turns[0].replies)
    other_reply = chat.environment("something else entirely")
    altered = episode.with_turns(
        [
            type(episode.turns[0])(
                episode.turns[0].agent, episode.turns[0].message, replies=(other_reply,)
            ),
            *episode.turns[1:],
        ]
    )
    agent = episode.turns[1].agent

    def logps(e):
        out = sampler.agent_logps(team, (e,), agent)
        return out[(0, 1)]

    assert not torch.equal(logps(episode), logps(altered))


def test_a_private_opening_is_in_its_holders_view_only(char_tokenizer):
    chat = chat_of(char_tokenizer)
    episode = open_episode(chat, PROBLEMS[0], 3, Dice, 2)
    psst = chat.environment("psst", 1).tokens
    assert contains(chat.context(episode, 1), psst)
    assert not contains(chat.context(episode, 0), psst)
    assert chat.view_of(episode, 1) == 1 and chat.view_of(episode, 0) is None
    # The scorer's transcript is the context the speaker was given: the private opening too.
    for viewer in (0, 1):
        scored, _ = chat.assemble(episode, viewer)
        assert chat.context(episode, viewer)[: len(scored)] == scored
    assert contains(chat.assemble(episode, 1)[0], psst)


# -- bad input -------------------------------------------------------------------------------
class Raising(Dice):
    def step(self, speaker, message):
        raise RuntimeError("the tool crashed\nsecond line")


class NotText(Dice):
    def step(self, speaker, message):
        return Reply(text=42)  # type: ignore[arg-type]


class NotFinite(Dice):
    def step(self, speaker, message):
        return Reply(text="ok", reward=math.nan)


class NoReply(Dice):
    def step(self, speaker, message):
        return "fine"


class BadSpeaker(Dice):
    def step(self, speaker, message):
        return Reply(next_speaker=5)


class Unseeded(Dice):
    def step(self, speaker, message):
        return Reply(text=str(random.SystemRandom().random()))


class NeverEnds(Dice):
    def step(self, speaker, message):
        return Reply(text="go on")


@pytest.mark.parametrize(
    ("environment", "says"),
    [
        (Raising, "step (agent 0) raised RuntimeError: the tool crashed"),
        (NotText, "step's text is int 42, not a string"),
        (NotFinite, "step's reward is nan, not a finite number"),
        (NoReply, "step returned str, expected a Reply"),
        (BadSpeaker, "step's next_speaker is 5, not an agent 0..1"),
        (Unseeded, "not reproducible"),
        (lambda: 3, "the factory returned int, not an environment"),
    ],
    ids=["raises", "not-text", "nan-reward", "no-reply", "bad-speaker", "unseeded", "not-env"],
)
def test_a_bad_environment_is_one_line_naming_it_and_the_dialogue(
    char_tokenizer, environment, says
):
    chat = chat_of(char_tokenizer)
    with pytest.raises(EnvironmentFault) as caught:
        check_environment(environment, chat, PROBLEMS[:2], 2, turns=3)
    message = str(caught.value)
    assert says in message and "\n" not in message
    assert "on problem 'Roll 0.'" in message and "dialogue seed 0" in message


def test_an_environment_that_never_ends_stops_at_the_turn_cap(char_tokenizer):
    chat = chat_of(char_tokenizer)
    sampler = dice_sampler(chat, environment=NeverEnds, turns=3)
    episodes, _ = sampler.play(make_team(len(char_tokenizer), 2), sampler.new_episodes(), seed=1)
    assert all(len(e.turns) == 3 and not e.ended for e in episodes)


def test_a_bad_environment_stops_the_check_with_one_line_and_exit_2(tmp_path):
    (tmp_path / "broken_world.py").write_text(
        "from llm.problems.environment import Opening, Reply\n"
        "class World:\n"
        "    def reset(self, problem, seed):\n"
        "        return Opening(problem.question)\n"
        "    def step(self, speaker, message):\n"
        "        return Reply(text=None)\n"
    )
    config = tmp_path / "team.toml"
    config.write_text(f'extends = "{SMOKE}"\n[task]\nenvironment = "broken_world:World"\n')
    result = teamtr("train", "--config", str(config), "--check")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "environment broken_world:World" in lines[0]
    assert "step's text is NoneType None, not a string" in lines[0]


# -- configs ---------------------------------------------------------------------------------
def test_config_keys_of_an_environment(tmp_path):
    with pytest.raises(ConfigError, match=r'\[task\] environment: kind = "environment" plays'):
        load_config(SMOKE, [parse_override('task.kind="environment"')])
    with pytest.raises(ConfigError, match=r"task.environment_args: are the keyword"):
        load_config(SMOKE, [parse_override("task.environment_args={caller=1}")])
    task = build_task(load_config(SMOKE, [parse_override('task.environment="calculator"')]).task)
    assert isinstance(task.environment(), Calculator)
    with pytest.raises(ConfigError, match="takes no such arguments"):
        build_task(
            load_config(
                SMOKE,
                [
                    parse_override('task.environment="calculator"'),
                    parse_override("task.environment_args={callr=1}"),
                ],
            ).task
        )


# -- the calculator ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("message", "reply"),
    [
        ("23 + 45 - 12", "calculator: 23 + 45 - 12 = 56"),
        ("I get (12+3)*4 here", "calculator: (12+3)*4 = 60"),
        ("7 x 6", "calculator: 7 x 6 = 42"),
        ("10 / 4", "calculator: 10 / 4 = 2.5"),
        ("1 - -3", "calculator: 1 - -3 = 4"),
        ("The answer is 5", "calculator: no arithmetic expression found"),
        ("9 / 0", "calculator: 9 / 0: division by zero"),
        ("2**99999", "calculator: 2**99999: only numbers, + - * / and parentheses"),
    ],
)
def test_the_calculator_answers_the_first_expression(message, reply):
    assert calculate(message) == reply


def test_the_calculator_never_evaluates_code():
    for text in ("__import__('os')", "(1).real", "[1]*9", "1" * 20 + "+1"):
        with pytest.raises(CalculatorInputError):
            evaluate(text)


def test_the_calculator_environment_answers_the_caller_and_ends_at_the_answer():
    calculator = Calculator(n_agents=2)
    problem = Problem("What is 2 + 3 - 1?", "4")
    assert calculator.reset(problem, 0).text == problem.question
    assert calculator.step(0, "2 + 3 - 1") == Reply(text="calculator: 2 + 3 - 1 = 4")
    assert calculator.step(1, "4") == Reply(done=True)


def test_a_single_agent_calls_the_calculator_first_and_answers_second():
    """One agent (caller and answerer): its first message is the call, its second ends the
    dialogue; a reset starts the count again (one environment replays many dialogues)."""
    calculator = Calculator(n_agents=1)
    for question in ("What is 2 + 3 - 1?", "What is 7 * 6?"):
        calculator.reset(Problem(question, ""), 0)
        expression = question.removeprefix("What is ").removesuffix("?")
        value = written(evaluate(expression))
        assert calculator.step(0, expression) == Reply(text=f"calculator: {expression} = {value}")
        assert calculator.step(0, value) == Reply(done=True)


# -- TextArena ---------------------------------------------------------------------------------
textarena = pytest.importorskip("textarena", reason="pip install 'teamtr[games]'")
from llm.problems.textarena_games import TextArenaGame, game_problems  # noqa: E402


def test_guess_the_number_as_the_game_writes_it_and_its_reward(char_tokenizer):
    """A team plays GuessTheNumber together: the opening is the game's own prompt, each move
    gets the game's own hint, the won game pays TextArena's 1 and ends; the game's draws leave
    the process's ``random`` untouched."""
    chat = chat_of(char_tokenizer)
    problem = game_problems("GuessTheNumber-v0", [11])[0]
    state = random.getstate()
    session = Session(lambda: TextArenaGame("GuessTheNumber-v0", n_agents=2), chat, problem, 0, 2)
    opening = session.reset()
    assert opening.text.startswith("You are Player 0. You are playing Guess The Number.")
    low, high, rewards = 1, 20, []
    for turn in range(10):
        guess = (low + high) // 2
        reply = session.step(turn % 2, f"My guess is [{guess}].")
        rewards.append(reply.reward)
        if reply.done:
            break
        assert reply.text in ("The target number is higher.", "The target number is lower.")
        low, high = (guess + 1, high) if reply.text.endswith("higher.") else (low, guess - 1)
    assert reply.done and rewards[-1] == 1.0 and sum(rewards) == 1.0
    assert random.getstate() == state


def test_tic_tac_toe_gives_each_player_its_own_view_and_names_the_next(char_tokenizer):
    """Two agents as TextArena's two players: each one's observations are private to it,
    the game names who moves, and a finished game pays the players' mean reward."""
    chat = chat_of(char_tokenizer)
    game = lambda: TextArenaGame("TicTacToe-v0", n_agents=2, players=2)  # noqa: E731
    session = Session(game, chat, game_problems("TicTacToe-v0", [0])[0], 0, 2)
    opening = session.reset()
    assert opening.first_speaker == 0
    assert "You are Player 0" in opening.private[0] and "You are Player 1" in opening.private[1]
    speaker, reply = 0, None
    for cell in (0, 3, 1, 4, 2):  # player 0 completes the top row
        reply = session.step(speaker, f"[{cell}]")
        if reply.done:
            break
        assert reply.next_speaker == 1 - speaker and set(reply.private) <= {0, 1}
        speaker = reply.next_speaker
    assert reply is not None and reply.done and reply.reward == 0.0  # +1 and -1: zero-sum


def test_a_blind_game_hides_the_games_text_and_keeps_its_rewards_and_end(char_tokenizer):
    """``blind = true`` (the ablation of a team without its environment's text): the same
    moves on the same FrozenLake earn the same rewards and end on the same move, and after the
    opening the game shows the blind team nothing, where it shows the sighted one each board."""
    sets = ['task.kind="environment"', 'task.environment="textarena:FrozenLake-v0"']
    played = {}
    for blind in (False, True):
        flags = sets + [f"task.environment_args={{blind={str(blind).lower()}}}"]
        task = build_task(load_config(SMOKE, [parse_override(s) for s in flags]).task)
        session = Session(task.environment, chat_of(char_tokenizer), task.test[3], 0, 2)
        opening = session.reset().text
        replies = []
        for turn, move in enumerate(["[down]", "[right]"] * 3 + ["[up]", "[left]"]):
            replies.append(session.step(turn % 2, move))
            if replies[-1].done:
                break
        played[blind] = opening, replies
    (sighted_opening, sighted), (blind_opening, blind) = played[False], played[True]
    assert blind_opening == sighted_opening and "Current Board" in blind_opening
    assert [(r.reward, r.done) for r in blind] == [(r.reward, r.done) for r in sighted]
    assert sighted[-1].done and all("Current Board" in r.text for r in sighted)
    assert all(r.text == "" for r in blind)


def test_a_game_that_downloads_data_or_does_not_exist_is_refused_in_one_line(char_tokenizer):
    chat = chat_of(char_tokenizer)
    problem = game_problems("Wordle-v0", [0])[0]
    with pytest.raises(EnvironmentFault, match="needs data it downloads at run time"):
        Session(lambda: TextArenaGame("Wordle-v0", n_agents=2), chat, problem, 0, 2).reset()
    with pytest.raises(
        EnvironmentFault, match=r"no game 'GuessTheNumbr-v0'; did you mean \['GuessTheNumber-v0'"
    ):
        Session(lambda: TextArenaGame("GuessTheNumbr-v0", n_agents=2), chat, problem, 0, 2).reset()


def test_a_games_own_options_are_environment_args_checked_against_the_game(char_tokenizer):
    """``[task.environment_args] max_number = 10`` reaches GuessTheNumber's constructor (its
    prompt says so, and its target lies in range); a key the game does not take is one line
    naming the game's options."""
    sets = ['task.kind="environment"', 'task.environment="textarena:GuessTheNumber-v0"']
    small = sets + ["task.environment_args={max_number=10, max_turns=5}"]
    task = build_task(load_config(SMOKE, [parse_override(s) for s in small]).task)
    session = Session(task.environment, chat_of(char_tokenizer), task.test[0], 0, 2)
    assert "between 1 and 10" in session.reset().text
    for guess in range(1, 11):
        reply = session.step(0, f"[{guess}]")
        if reply.done:
            break
    # TextArena counts turns from 0: max_turns = 5 ends the game at its sixth guess at most
    assert reply.done and guess <= 6
    misspelt = sets + ["task.environment_args={max_numbr=10}"]
    with pytest.raises(ConfigError, match=r"takes no \['max_numbr'\]; its options: .*max_number"):
        build_task(load_config(SMOKE, [parse_override(s) for s in misspelt]).task)


def test_a_textarena_task_trains_checks_and_keeps_held_out_games_apart(tmp_path, capsys):
    """``kind = "environment"``: held-out games are seeds of their own, never drawn for
    training; ``--check`` steps the game twice from each seed; one stage trains."""
    sets = ['task.kind="environment"', 'task.environment="textarena:GuessTheNumber-v0"']
    task = build_task(load_config(SMOKE, [parse_override(s) for s in sets]).task)
    held_out = {p.metadata["seed"] for p in task.test}
    drawn = task.draw(np.random.default_rng(0), 500)
    assert held_out and not held_out & {p.metadata["seed"] for p in drawn}
    assert all(task.split(p.question) == "test" for p in task.test)
    settings = sum((["--set", s] for s in sets), [])
    assert main(["train", "--config", str(SMOKE), *settings, "--check"]) == 0
    assert "environment stepped" in capsys.readouterr().out
    game = ["--set", "stage.stages=1", "--output-dir", str(tmp_path), "--name", "game"]
    assert main(["train", "--config", str(SMOKE), *settings, *game]) == 0
    records = [json.loads(line) for line in (tmp_path / "game" / "metrics.jsonl").open()]
    assert records[0]["environment_texts"] > 0  # the game's text, counted apart from messages
    err = capsys.readouterr().err
    assert "texts, " in err and "dialogues ended)" in err


def test_a_run_with_the_calculator_plays_it_in_eval_chat_and_load_team(tmp_path, capsys):
    """Every door of a trained team plays its environment: the held-out transcripts hold the
    calculator's replies apart from the agents' messages, ``teamtr chat`` prints them,
    ``load_team().play`` returns them to a reward, and the export's team.json names it."""
    import llm

    calculator = ["--set", 'task.environment="calculator"', "--set", "stage.stages=1"]
    tool = tmp_path / "tool"
    trained = ["--config", str(SMOKE), *calculator, "--output-dir", str(tmp_path), "--name", "tool"]
    assert main(["train", *trained]) == 0
    results = tmp_path / "eval.json"
    assert main(["eval", "--run", str(tool), "--json", str(results)]) == 0
    records = [json.loads(line) for line in results.with_suffix(".transcripts.jsonl").open()]
    first = records[0]["turns"][0]
    assert first["agent"] == 0 and first["environment"][0]["text"].startswith("calculator: ")
    assert first["environment"][0]["to"] is None
    assert "environment" not in records[0]["turns"][1]  # the answerer's message ends it
    capsys.readouterr()
    assert main(["chat", "--run", str(tool), "--question", "What is 2 + 3?"]) == 0
    assert "\nenvironment: calculator: " in "\n" + capsys.readouterr().out
    dialogue = llm.load_team(tool).play("What is 12 + 30?")
    assert dialogue.observations[0].startswith("calculator: ") and dialogue.observations[1] == ""
    assert main(["export", "--run", str(tool), "--out", str(tmp_path / "out")]) == 0
    team = json.loads((tmp_path / "out" / "team.json").read_text())
    assert team["environment"]["name"] == "calculator"
    assert "act in an environment (`calculator`)" in (tmp_path / "out" / "README.md").read_text()
