"""Held-out evaluation of a team: accuracy, parse failures, length; pass@K and majority vote;
accuracy per phrasing template and difficulty; the transcripts of every dialogue.

The mean held-out score is ``accuracy`` where the task's metric grades answers right or wrong,
else ``score`` (``llm.problems.task.Task.measure``), for the whole set and per group."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm.common.collective import Collective
from llm.common.progress import CountProgress
from llm.conversation.dialogue import Episode, Turn
from llm.conversation.environment_session import environment_record
from llm.models.agents import LoraTeam
from llm.problems.phrasings import TEMPLATES
from llm.problems.private_notes import CHAIN_TEMPLATES, NOTES_TEMPLATES, RELAY_TEMPLATES
from llm.problems.rewards import Grade
from llm.problems.task import verdict_of
from llm.problems.tasks import Problem
from llm.rewards.answers import normalised
from llm.sampling.sampler import DialogueSampler

EVAL_ONLY_TEMPLATES = frozenset(
    t.id
    for family in (TEMPLATES, NOTES_TEMPLATES, RELAY_TEMPLATES, CHAIN_TEMPLATES)
    for t in family
    if t.eval_only
)
"""Templates never drawn for training (``llm.problems.phrasings``, ``llm.problems.private_notes``)."""


@dataclass(frozen=True)
class Evaluation:
    """The numbers of an evaluation, and the dialogues and grades behind them (in the order
    of the problems, ``samples`` consecutive dialogues per problem)."""

    metrics: dict[str, float]
    episodes: list[Episode]
    grades: list[Grade]
    scores: list[float] = field(default_factory=list)
    """Each dialogue's held-out score (the task's metric; ``accuracy`` or ``score`` is their
    mean)."""
    rewards: list[float] = field(default_factory=list)
    """Each dialogue's reward (the task's own, without the training-only bonus)."""
    measure: str = "accuracy"
    """What the mean of ``scores`` is reported as (``llm.problems.task.Task.measure``)."""


def evaluate_team(
    team: LoraTeam,
    sampler: DialogueSampler,
    problems: Sequence[Problem],
    *,
    samples: int = 1,
    batch_size: int = 32,
    progress: bool = False,
    collective: Collective | None = None,
) -> dict[str, float]:
    """One greedy dialogue per problem, or ``samples`` sampled ones (then pass@K, majority).

    ``standard_error`` is the standard error of ``accuracy`` over the problems (binomial for
    greedy evaluation). With a ``collective`` (data parallelism, ``llm.training.distributed``) each rank
    plays a contiguous share of the problems and the grades are gathered in order, so every
    rank returns the numbers of the whole set. Per template and difficulty the accuracy, the
    number of problems and the standard error are flat keys (``group_metrics``), so that the
    periodic evaluation's record stays a table of scalars.
    """
    return _evaluate(team, sampler, problems, samples, batch_size, progress, collective).metrics


def evaluate_team_with_episodes(
    team: LoraTeam,
    sampler: DialogueSampler,
    problems: Sequence[Problem],
    *,
    samples: int = 1,
    batch_size: int = 32,
    progress: bool = False,
) -> Evaluation:
    """``evaluate_team`` in one process, returning the finished dialogues and their grades
    too (for transcripts)."""
    return _evaluate(team, sampler, problems, samples, batch_size, progress, None)


def _evaluate(
    team: LoraTeam,
    sampler: DialogueSampler,
    problems: Sequence[Problem],
    samples: int,
    batch_size: int,
    progress: bool,
    collective: Collective | None,
) -> Evaluation:
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    temperature = 0.0 if samples == 1 else sampler.settings.temperature
    # The evaluation's own generator, never the sampler's: evaluating a team must not change
    # how it trains afterwards (a run that evaluates every stage trains as one that never
    # does), and the same team evaluated twice gets the same dialogues, sampled ones included.
    rng = np.random.default_rng(0)
    episodes = [
        sampler.open_episode(p, int(rng.integers(2**31))) for p in problems for _ in range(samples)
    ]
    seeds = [int(rng.integers(2**31)) for _ in range(0, len(episodes), batch_size)]
    # Progress is counted in messages, advanced after every generated batch of one turn: even
    # a single batch of questions moves the bar H times, with an ETA.
    if collective is None:
        mine = len(problems)
    else:
        first, last = _share_of(len(problems), collective)
        mine = last - first  # this rank's bar counts the dialogues it plays
    bar = CountProgress(mine * samples * sampler.settings.turns, "msg", "evaluating", progress)
    started = time.perf_counter()
    finished: list[Episode] = []
    if collective is None:
        tokens = 0
        for batch, start in enumerate(range(0, len(episodes), batch_size)):
            done, generated = sampler.play(
                team,
                episodes[start : start + batch_size],
                temperature=temperature,
                seed=seeds[batch],
                on_messages=bar.advance,
            )
            finished.extend(done)
            tokens += generated
        grades, scores, credits, rewards, answers = _scored(sampler, finished)
    else:
        grades, scores, credits, rewards, answers, tokens = _evaluate_share(
            team, sampler, problems, episodes, seeds, samples, batch_size, collective, bar.advance
        )
        grades = [g for share in collective.gather(grades) for g in share]
        scores = [x for share in collective.gather(scores) for x in share]
        credits = [c for share in collective.gather(credits) for c in share]
        rewards = [r for share in collective.gather(rewards) for r in share]
        answers = [a for share in collective.gather(answers) for a in share]
        tokens = int(collective.sum(tokens))
    bar.close(f"{len(problems)} questions in {time.perf_counter() - started:.1f} s")
    measure = sampler.task.measure(problems)
    result = _record(problems, samples, grades, scores, credits, tokens, measure, answers)
    return Evaluation(result, finished, grades, list(scores), list(rewards), measure)


def _record(
    problems: Sequence[Problem],
    samples: int,
    grades: Sequence[Grade],
    scores: Sequence[float],
    credits: Sequence[float | None],
    tokens: int,
    measure: str = "accuracy",
    answers: Sequence[str | None] | None = None,
) -> dict[str, float]:
    """The evaluation's record: ``measure`` (the task's metric's mean: ``accuracy`` or
    ``score``), its standard error over
    problems, parse failures, tokens; with samples, pass@k and the majority vote; with a
    per-turn reward, the turn credit; per template and difficulty, the group metrics."""
    correct = np.array(scores, dtype=float)  # the task's metric (math-verify by default)
    parsed = np.array([g.parsed for g in grades], dtype=float)
    result = {
        measure: float(correct.mean()),
        "n": float(len(problems)),
        # Problems are the independent units (samples of one problem are correlated).
        "standard_error": float(
            correct.reshape(len(problems), samples).mean(axis=1).std() / np.sqrt(len(problems))
        ),
        "parse_failure_rate": float(1.0 - parsed.mean()),
        "mean_tokens": tokens / len(grades),
        "samples": float(samples),
    }
    if samples > 1:
        per_problem = correct.reshape(len(problems), samples)
        result[f"pass@{samples}"] = float(per_problem.max(axis=1).mean())
        votes = []
        keys = (
            list(answers)
            if answers is not None
            else [g.extracted if g.parsed else None for g in grades]
        )
        for index in range(len(problems)):
            mine = range(index * samples, (index + 1) * samples)
            cast = [keys[k] for k in mine if keys[k] is not None]
            if not cast:
                votes.append(0.0)
                continue
            # The answer most dialogues gave (the first given, on a tie), scored by the task's
            # own metric, as the dialogue that first gave it was: what the rows say of it.
            winner = Counter(cast).most_common(1)[0][0]
            votes.append(float(correct[next(k for k in mine if keys[k] == winner)]))
        result["majority_vote"] = float(np.mean(votes))
    if all(c is not None for c in credits):
        # A per-turn reward, held out (for the chain: the share of turns that state the
        # running total, ``llm.problems.builtin.running_sum_credits``), which moves long before
        # the final answer is right: the mean return, without the training-only bonus.
        per_problem = np.array(credits, dtype=float).reshape(len(problems), samples).mean(axis=1)
        result["turn_credit"] = float(per_problem.mean())
        result["turn_credit_standard_error"] = float(per_problem.std() / np.sqrt(len(problems)))
    per_problem_score = correct.reshape(len(problems), samples).mean(axis=1)
    result.update(group_metrics(problems, per_problem_score, measure))
    return result


def _scored(
    sampler: DialogueSampler, finished: Sequence[Episode]
) -> tuple[list[Grade], list[float], list[float | None], list[float], list[str | None]]:
    """Per finished dialogue: its final answer's math-verify grade, its held-out score (the
    task's metric), where the task's reward is per turn its return (else None), its reward
    (the task's own) and the answer it votes for (``vote_key``)."""
    grades, scores, credits, rewards, answers = [], [], [], [], []
    for episode in finished:
        dialogue = sampler.dialogue(episode)
        verdict = verdict_of(dialogue)
        grades.append(verdict)
        returns = sampler.task.returns(dialogue)
        scores.append(sampler.task.score(dialogue, returns))
        credits.append(returns.value if returns.per_turn is not None else None)
        rewards.append(returns.value)
        answers.append(vote_key(verdict, dialogue.final))
    return grades, scores, credits, rewards, answers


def vote_key(verdict: Grade, final: str) -> str | None:
    """The answer a dialogue votes for in a majority vote: math-verify's reading of its final
    message where the reference is one math-verify reads, else the message as answers are
    compared (``llm.rewards.answers.normalised``); None for no answer."""
    if verdict.extracted is not None:
        return verdict.extracted if verdict.parsed else None
    text = normalised(final)
    return text or None


def _summary(scores: np.ndarray, measure: str) -> dict[str, float]:
    """Accuracy (or score), count and standard error (over problems, as for the whole set)."""
    return {
        measure: float(scores.mean()),
        "n": float(len(scores)),
        "standard_error": float(scores.std() / np.sqrt(len(scores))),
    }


def group_metrics(
    problems: Sequence[Problem], scores: np.ndarray, measure: str = "accuracy"
) -> dict[str, float]:
    """Per-problem scores (the fraction of its dialogues graded correct) summarised by group:
    ``template/<id>/<stat>``, ``difficulty/<d>/<stat>``, and ``seen_templates/<stat>`` and
    ``eval_only_templates/<stat>`` (templates trained on or held out for evaluation), for
    stat in ``measure`` (accuracy or score), n, standard_error. Problems without a template
    (read from a file) or a
    difficulty (0) are in no group; empty groups are left out."""
    groups: dict[str, list[int]] = {}
    for index, problem in enumerate(problems):
        if problem.template:
            groups.setdefault(f"template/{problem.template}", []).append(index)
            held_out = problem.template in EVAL_ONLY_TEMPLATES
            kind = "eval_only_templates" if held_out else "seen_templates"
            groups.setdefault(kind, []).append(index)
        if problem.difficulty:
            groups.setdefault(f"difficulty/{problem.difficulty}", []).append(index)
    table: dict[str, float] = {}
    for name in sorted(groups):
        for stat, value in _summary(scores[groups[name]], measure).items():
            table[f"{name}/{stat}"] = value
    return table


def transcript_records(
    evaluation: Evaluation, samples: int, message_text: Callable[[Turn], str]
) -> list[dict[str, Any]]:
    """One JSON-ready record per dialogue: the problem (question, reference answer, notes,
    template, difficulty), each turn (agent and decoded text), math-verify's parse of the
    final answer, and what the task made of it: ``reward`` (its reward), ``score`` (its
    held-out metric, whose mean is the reported accuracy or score) and ``correct`` (score 1,
    where the metric grades right or wrong; else None). So the rows add up to the report."""
    records = []
    scores = evaluation.scores or [g.reward for g in evaluation.grades]
    rewards = evaluation.rewards or [g.reward for g in evaluation.grades]
    grading = evaluation.measure == "accuracy"
    for index, (episode, verdict, score, reward) in enumerate(
        zip(evaluation.episodes, evaluation.grades, scores, rewards, strict=True)
    ):
        problem = episode.problem
        records.append(
            {
                "problem": index // samples,
                "sample": index % samples,
                "question": problem.question,
                "reference_answer": problem.answer,
                "notes": list(problem.notes),
                "template": problem.template,
                "difficulty": problem.difficulty,
                "turns": [transcript_turn(turn, message_text(turn)) for turn in episode.turns],
                "parsed_answer": verdict.extracted,
                "parsed": verdict.parsed,
                "reward": reward,
                "correct": score == 1.0 if grading else None,
                "score": score,
            }
        )
    return records


def transcript_turn(turn: Turn, text: str) -> dict[str, Any]:
    """One turn of a transcript: the agent's message, and apart from it what the environment
    said after it (``environment``: each text with whom it was shown to), where it said any."""
    record: dict[str, Any] = {"agent": turn.agent, "text": text}
    if turn.replies:
        record["environment"] = environment_record(turn)
    return record


def _share_of(n: int, collective: Collective) -> tuple[int, int]:
    """The contiguous range of the ``n`` problems this rank plays."""
    return collective.rank * n // collective.world_size, (
        collective.rank + 1
    ) * n // collective.world_size


def _evaluate_share(
    team: LoraTeam,
    sampler: DialogueSampler,
    problems: Sequence[Problem],
    episodes: list[Episode],
    seeds: Sequence[int],
    samples: int,
    batch_size: int,
    collective: Collective,
    on_messages: Callable[[int], None] | None = None,
) -> tuple[list[Grade], list[float], list[float | None], list[float], list[str | None], int]:
    """This rank's contiguous share of the problems, played and graded (``_scored``: grades,
    held-out scores, per-turn returns, rewards) and the tokens generated.

    ``seeds`` holds one generation seed per batch of the whole set (``_evaluate``'s own
    generator); this rank's batches take theirs in order.
    """
    first, last = _share_of(len(problems), collective)
    temperature = 0.0 if samples == 1 else sampler.settings.temperature
    share = episodes[first * samples : last * samples]
    finished: list[Episode] = []
    tokens = 0
    for batch, start in enumerate(range(0, len(share), batch_size)):
        done, generated = sampler.play(
            team,
            share[start : start + batch_size],
            temperature=temperature,
            seed=seeds[batch],
            on_messages=on_messages,
        )
        finished.extend(done)
        tokens += generated
    return (*_scored(sampler, finished), tokens)
