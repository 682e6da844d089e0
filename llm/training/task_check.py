"""``check_task``: a task of one's own tried end to end on a tiny random model, in seconds.

What ``teamtr.check_backend`` is for a backend, this is for a task. It draws training problems
(twice, from one seed: the draw must be a function of the generator), reads the test set, plays
a few dialogues of each on a tiny random Llama with the run's roles, and calls the reward, the
bonus and the metric on every one, through the same checked calls a run makes
(``llm.problems.task.Task.returns``): so a reward that raises, returns None, a string, NaN or the
wrong number of per-turn rewards fails here, with the same one line, before any real model
loads. It also checks that the reward is deterministic on a fixed dialogue (the same dialogue
scored twice), that held-out scores lie in [0, 1], and, where the task declares a split, that
no drawn training problem is a test problem. Then it calls the reward on a dialogue of every
training problem, and the metric on one of every test problem (those messages, given each
problem in turn; ``CHECKED_ROWS``, ``CHECK_SECONDS``), so that a reward failing on one row in
fifty fails here, named by its row, and not in the middle of a run.

Random models write random text, so what the reward returns on it says nothing of a trained
team's; what is checked is that it returns something a run can use. The reward's other
branches run on the task's own answers (``llm.problems.answer_check``): a sample of rows'
reference answers, empty messages and a few other answers, whose scores are reported, with a
warning where a reference answer falls short of another answer or of a held-out score of 1,
or where the reward raises on one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llm.common.config import RunConfig
from llm.conversation.dialogue import ChatFormat
from llm.conversation.environment_session import check_environment
from llm.models.loading import TINY_POSITIONS, tiny_char_tokenizer
from llm.problems.answer_check import AnswerScores, try_answers
from llm.problems.task import Dialogue, RewardError, Task, TaskError, reported
from llm.problems.tasks import Problem, identity_of

CHECKED_ROWS = 10_000
"""At most this many problems of each split have their reward (or metric) called."""
CHECK_SECONDS = 30.0
"""...or for at most this long: a reward that asks a judge model must not make a check slow."""
CHECK_MESSAGE_TOKENS = 6
"""The longest message of a checked dialogue: a random model's text, kept short."""


SHOWN_EXAMPLES = 3
"""Drawn training problems shown by the check, each with its answer and rewards."""


@dataclass(frozen=True)
class Example:
    """A drawn problem, its reference answer, and the reward of that answer and of an empty
    final message (each after the same turns a tiny model played)."""

    problem: Problem
    reference_reward: float
    empty_reward: float

    def line(self) -> str:
        question = repr(self.problem.question)[1:-1]  # newlines written out: one line
        if len(question) > 70:  # its end: generators often open every question alike
            question = question[:25] + "..." + question[-42:]
        return (
            f"drawn: {question!r} -> answer {self.problem.answer!r:.40}; reward of that answer "
            f"{self.reference_reward:g}, of an empty message {self.empty_reward:g}"
        )


@dataclass(frozen=True)
class TaskCheck:
    """What ``check_task`` found (every failure raises instead)."""

    task: str
    train_drawn: int
    test_problems: int
    dialogues: int
    per_turn: bool
    """Whether the reward gave one value per turn."""
    reward_range: tuple[float, float]
    score_range: tuple[float, float] | None
    warnings: tuple[str, ...] = field(default=())
    train_problems: int | None = None
    """How many training problems the task holds; None where a function draws them."""
    rows_scored: tuple[int, int] = (0, 0)
    """Training and test problems whose reward (metric) was called on a dialogue of theirs."""
    answers: AnswerScores | None = None
    """The reward of the task's own answers (``llm.problems.answer_check``)."""
    environment_steps: int = 0
    """Steps of the task's environment tried (each twice, from one seed); 0: none."""
    examples: tuple[Example, ...] = ()
    """A few drawn training problems, shown with their answers and what the reward gives."""

    def lines(self) -> list[str]:
        low, high = self.reward_range
        kind = "per-turn" if self.per_turn else "one per dialogue"
        training = (
            f"{self.train_drawn} training problems drawn"
            if self.train_problems is None
            else f"{self.train_problems} training problems ({self.train_drawn} draws checked)"
        )
        lines = [
            f"task {self.task!r}: {training}, {self.test_problems} held out; {self.dialogues} dialogues played on a tiny "
            f"random model; rewards ({kind}) in [{low:g}, {high:g}]"
            + (
                f", held-out scores in [{self.score_range[0]:g}, {self.score_range[1]:g}]"
                if self.score_range
                else ""
            )
        ]
        train_rows, test_rows = self.rows_scored
        lines.append(
            f"reward called on a dialogue of {train_rows} training problems and metric on "
            f"{test_rows} held out (at most {CHECKED_ROWS} each, {CHECK_SECONDS:g} s)"
        )
        if self.environment_steps:
            lines.append(
                f"environment stepped {self.environment_steps} times on odd and random messages, "
                "twice from the same seeds: the same text, rewards and ends"
            )
        lines += [example.line() for example in self.examples]
        if self.answers is not None:
            lines.append(self.answers.line())
        return lines + [f"warning: {w}" for w in self.warnings]


def check_task(
    task: Task,
    config: RunConfig | None = None,
    *,
    draws: int = 200,
    dialogues: int = 4,
    seed: int = 0,
) -> TaskCheck:
    """Check ``task`` with the team of ``config`` (its agents, router, turns and roles; when
    None, the defaults with one agent per role of the task) on a tiny random model; raises
    ``TaskError`` (``RewardError`` for the reward, bonus or metric) with one line naming what
    failed. ``draws``: training problems drawn for the split check; ``dialogues``: dialogues
    played of training and of test problems each."""
    if not isinstance(task, Task):
        raise TaskError(f"check_task: expected an llm.Task, got {type(task).__name__}")
    team = _team_of(task, config)
    train = _reproducible_draw(task, draws, seed)
    train_problems = None if callable(task.train) else len(task.known_train)
    test = list(task.test)
    warnings = _split_warnings(task, train, test)
    if not test:
        warnings.append("no test problems: runs train without a held-out evaluation")
    tiny = _tiny_team(team, dialogues)
    chat = _chat(tiny)
    environment_steps = 0
    if task.environment is not None:
        environment_steps = check_environment(
            task.environment, chat, [*train[:2], *test[:2]], tiny.team.n_agents, tiny.sampler.turns
        )
    train_played = _fitting(tiny, chat, train, "training", warnings)[:1]
    test_played = _fitting(tiny, chat, test, "test", warnings)[:1]
    if not train_played + test_played:
        return _nothing_fits(task, train, test, tiny.sampler.turns, warnings, train_problems)
    played = _played(task, tiny, train_played, test_played, dialogues, seed)
    rewards, scores, per_turn = _scored_twice(task, played)
    texts = [dialogue for _, dialogue in played]
    train_rows = task.known_train or tuple(train)
    rows_scored = (
        _scored_on_every_row(task, texts, train_rows, held_out=False),
        _scored_on_every_row(task, texts, test, held_out=True),
    )
    # A random model's text earns the lowest reward: the task's own answers try the rest.
    answers = try_answers(task, texts, train_rows, test)
    return TaskCheck(
        task=task.name,
        train_drawn=len(train),
        test_problems=len(test),
        dialogues=len(played),
        per_turn=per_turn,
        reward_range=(min(rewards), max(rewards)),
        score_range=(min(scores), max(scores)) if scores else None,
        warnings=(*warnings, *answers.warnings),
        train_problems=train_problems,
        rows_scored=rows_scored,
        answers=answers,
        environment_steps=environment_steps,
        examples=_examples(task, texts[0], train),
    )


def _nothing_fits(
    task: Task,
    train: list[Problem],
    test: list[Problem],
    turns: int,
    warnings: list[str],
    train_problems: int | None,
) -> TaskCheck:
    """What the check finds where no dialogue of ``turns`` turns fits the tiny model: the
    problems it drew and read, and a warning that the reward was not called."""
    warnings.append(
        f"no dialogue of {turns} turns fits the tiny model's {TINY_POSITIONS} "
        "positions: the reward was not called"
    )
    return TaskCheck(
        task.name,
        len(train),
        len(test),
        0,
        False,
        (0.0, 0.0),
        None,
        tuple(warnings),
        train_problems,
    )


def _examples(task: Task, played: Dialogue, train: Sequence[Problem]) -> tuple[Example, ...]:
    """The first ``SHOWN_EXAMPLES`` drawn training problems with an answer, each with the
    reward of that answer and of an empty message after ``played``'s turns (``_example``)."""
    answered = [problem for problem in train if problem.answer.strip()][:SHOWN_EXAMPLES]
    shown = [_example(task, played, problem) for problem in answered]
    return tuple(example for example in shown if example is not None)


def _example(task: Task, played: Dialogue, problem: Problem) -> Example | None:
    """``problem`` with the reward of its reference answer and of an empty message, each the
    final message after ``played``'s earlier turns; None where the reward raises on one (the
    answers' check, ``try_answers``, reports that)."""

    def ending(final: str) -> float:
        return task.returns(
            Dialogue(problem, (*played.messages[:-1], final), played.speakers)
        ).value

    try:
        return Example(problem, ending(problem.answer), ending(""))
    except RewardError:
        return None


def _scored_on_every_row(
    task: Task, played: Sequence[Dialogue], problems: Sequence[Problem], held_out: bool
) -> int:
    """How many ``problems`` (up to ``CHECKED_ROWS``, or ``CHECK_SECONDS``) had their reward
    (their metric, ``held_out``) called on a dialogue of theirs: the messages a tiny model
    played, given each problem in turn. A reward that fails on one row in fifty fails here,
    named by that row, and not fifty stages into a run."""
    started = time.monotonic()
    for index, problem in enumerate(problems[:CHECKED_ROWS]):
        if time.monotonic() - started > CHECK_SECONDS:
            return index
        text = played[index % len(played)]
        dialogue = Dialogue(problem, text.messages, text.speakers)
        if held_out:
            task.score(dialogue)
        else:
            task.training_reward(dialogue)
    return min(len(problems), CHECKED_ROWS)


def _team_of(task: Task, config: RunConfig | None) -> RunConfig:
    """The run's team with the task's roles; without a run, one agent per role, each once."""
    from llm.training.builder import configured_for_task, with_roles

    if config is None:
        config = RunConfig()
        if task.roles is not None and task.roles.role_prompts is not None:
            n = len(task.roles.role_prompts)
            config = configured_for_task(config, {"n_agents": n, "turns": n}, task)
    return with_roles(config, task)


def _reproducible_draw(task: Task, draws: int, seed: int) -> list[Problem]:
    """``draws`` training problems, drawn twice from one seed: a draw must follow the
    generator it is given, or runs neither reproduce nor resume."""
    train = _drawn(task, draws, seed)
    again = _drawn(task, draws, seed)
    if [identity_of(p) for p in train] != [identity_of(p) for p in again]:
        raise TaskError(
            f"task {task.name!r}: two draws from generators of the same seed gave other "
            "problems; draw from the generator given (rng), so that runs reproduce and resume"
        )
    return train


def _tiny_team(config: RunConfig, dialogues: int) -> RunConfig:
    """The run's team on the tiny random model, one group of ``dialogues`` per problem."""
    from llm.training.builder import configured

    return configured(
        config,
        {
            "source": "tiny",
            "sources": (),
            "rank": 4,
            "target_modules": "all-linear",  # the run's may name layers the tiny model lacks
            "dtype": "float32",
            "placement": "together",
            "device": "cpu",
            "rollout_shards": 0,
            # In process, whatever the run's engine: a server engine cannot serve the tiny
            # model (its heads of 8 dimensions), and a check starts no server.
            "engine": "hf",
            "engine_url": "",
            "engine_args": "",
            "engine_key_variable": "",
            "engine_trusted_network": False,
            "max_new_tokens": CHECK_MESSAGE_TOKENS,
            "prompts_per_batch": 1,
            "group_size": max(2, dialogues),
            "signal_groups": 0,
        },
    )


def _played(
    task: Task,
    tiny: RunConfig,
    train: list[Problem],
    test: list[Problem],
    dialogues: int,
    seed: int,
) -> list[tuple[bool, Dialogue]]:
    """``dialogues`` finished dialogues of each problem, each marked held out or not."""
    from llm.training.builder import build

    probe = dataclasses.replace(task, train=tuple(train or test), test=tuple(test))
    parts = build(tiny, progress=False, task=probe)
    started = [
        parts.sampler.open_episode(problem, route_seed)
        for problem in (*train, *test)
        for route_seed in range(dialogues)
    ]
    finished, _ = parts.sampler.play(parts.team, started, seed=seed)
    is_test = [False] * len(train) * dialogues + [True] * len(test) * dialogues
    return [
        (held_out, parts.sampler.dialogue(episode))
        for held_out, episode in zip(is_test, finished, strict=True)
    ]


def _scored_twice(
    task: Task, played: list[tuple[bool, Dialogue]]
) -> tuple[list[float], list[float], bool]:
    """Every dialogue's training reward and (held out) score, its reward computed twice (it
    must be deterministic), and whether the reward is per turn (the same kind for all)."""
    rewards: list[float] = []
    scores: list[float] = []
    per_turn: list[bool] = []
    for held_out, dialogue in played:
        first = task.returns(dialogue)
        second = task.returns(_copy(dialogue))
        if first != second:
            raise RewardError(
                f"reward of task {task.name!r} is not deterministic: it returned {first.value!r} "
                f"then {second.value!r} for the same dialogue ({dialogue.one_line()}); seed any "
                "randomness it uses from the dialogue"
            )
        rewards.append(task.training_reward(dialogue))
        per_turn.append(first.per_turn is not None)
        if held_out:
            scores.append(task.score(dialogue, first))
    if len(set(per_turn)) > 1:
        raise RewardError(
            f"reward of task {task.name!r} returned one float for some dialogues and one per "
            "turn for others; return the same kind for every dialogue"
        )
    return rewards, scores, per_turn[0]


def _drawn(task: Task, count: int, seed: int) -> list[Problem]:
    with reported(f"task {task.name!r}: drawing {count} training problems"):
        problems = task.draw(np.random.default_rng(seed), count)
    if len(problems) != count:
        raise TaskError(
            f"task {task.name!r}: asked for {count} training problems, the draw gave "
            f"{len(problems)}"
        )
    for problem in problems:
        _check_problem(task, problem, "training")
    for problem in task.test:
        _check_problem(task, problem, "test")
    return problems


def _check_problem(task: Task, problem: object, where: str) -> None:
    if not isinstance(problem, Problem):
        raise TaskError(
            f"task {task.name!r}: a {where} problem is {type(problem).__name__} "
            f"{problem!r:.60}; expected llm.Problem(question, answer, ...)"
        )
    if not isinstance(problem.question, str) or not problem.question.strip():
        raise TaskError(f"task {task.name!r}: a {where} problem has no question: {problem!r:.80}")
    if not isinstance(problem.answer, str):
        raise TaskError(
            f"task {task.name!r}: {where} problem {problem.question!r:.60} has answer "
            f"{problem.answer!r:.40} ({type(problem.answer).__name__}); answers are text"
        )
    if not all(isinstance(note, str) for note in problem.notes):
        raise TaskError(
            f"task {task.name!r}: {where} problem {problem.question!r:.60} has notes "
            f"{problem.notes!r:.60}; notes are one string per agent"
        )


def _split_warnings(task: Task, train: Sequence[Problem], test: Sequence[Problem]) -> list[str]:
    """No drawn training problem may be a test problem where the task declares a split; where
    it does not, the overlap is only reported."""
    held_out = {identity_of(p) for p in test}
    shared = sorted({identity_of(p) for p in train} & held_out)
    if shared and task.split is not None:
        raise TaskError(
            f"task {task.name!r} declares a split, but {len(shared)} of its drawn training "
            f"problems are test problems (e.g. {shared[0]!r:.60})"
        )
    if shared:
        return [f"{len(shared)} training problems are also test problems (e.g. {shared[0]!r:.60})"]
    return []


def _fitting(
    config: RunConfig,
    chat: ChatFormat,
    problems: Sequence[Problem],
    where: str,
    warnings: list[str],
) -> list[Problem]:
    """The problems whose dialogue fits the tiny model (its character tokenizer makes long
    questions long: a real model's check is ``teamtr train --check``'s context check)."""
    room = TINY_POSITIONS - config.sampler.turns * (
        max(len(h) for h in chat.headers) + 1 + len(chat.closing) + config.sampler.longest_message
    )
    fitting = [p for p in problems if len(_prompt(chat, p)) <= room]
    if problems and not fitting:
        warnings.append(f"no {where} problem fits the tiny model; none was played")
    return fitting


def _chat(config: RunConfig) -> ChatFormat:
    team = config.team
    return ChatFormat.from_tokenizer(
        tiny_char_tokenizer(), team.n_agents, team.system_prompt, team.role_prompts, team.policy_of
    )


def _prompt(chat: ChatFormat, problem: Problem) -> tuple[int, ...]:
    return tuple(chat.encode_prompt(problem.question))


def _copy(dialogue: Dialogue) -> Dialogue:
    """The same dialogue as a new object (a reward that keeps state per object is caught)."""
    return Dialogue(dialogue.problem, tuple(dialogue.messages), tuple(dialogue.speakers))
