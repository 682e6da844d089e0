"""Held-out evaluation of a team: accuracy, parse failures, length; pass@K and majority vote."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

import numpy as np
from math_verify import parse, verify

from llm.agents import LoraTeam
from llm.dialogue import Episode
from llm.progress import CountProgress
from llm.rewards import grade
from llm.sampler import DialogueSampler
from llm.tasks import Problem


def evaluate_team(
    team: LoraTeam,
    sampler: DialogueSampler,
    problems: Sequence[Problem],
    *,
    samples: int = 1,
    batch_size: int = 32,
    progress: bool = False,
) -> dict[str, float]:
    """One greedy dialogue per problem, or ``samples`` sampled ones (then pass@K, majority).

    ``standard_error`` is the standard error of ``accuracy`` over the problems (binomial for
    greedy evaluation).
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    temperature = 0.0 if samples == 1 else sampler.settings.temperature
    rng = np.random.default_rng(0)
    episodes = [
        Episode(p, tuple(sampler.chat.encode_prompt(p.question)), int(rng.integers(2**31)))
        for p in problems
        for _ in range(samples)
    ]
    finished: list[Episode] = []
    tokens = 0
    # Counted in messages, advanced after every generated batch of one turn: even a single
    # batch of questions moves the bar H times, with an ETA.
    bar = CountProgress(len(episodes) * sampler.settings.turns, "msg", "evaluating", progress)
    started = time.perf_counter()
    for start in range(0, len(episodes), batch_size):
        done, generated = sampler.play(
            team,
            episodes[start : start + batch_size],
            temperature=temperature,
            on_messages=bar.advance,
        )
        finished.extend(done)
        tokens += generated
    bar.close(f"{len(problems)} questions in {time.perf_counter() - started:.1f} s")
    grades = [grade(sampler.chat.message_text(e.turns[-1]), e.problem.answer) for e in finished]
    correct = np.array([g.correct for g in grades], dtype=float)
    parsed = np.array([g.parsed for g in grades], dtype=float)
    result = {
        "accuracy": float(correct.mean()),
        "n": float(len(problems)),
        # Problems are the independent units (samples of one problem are correlated).
        "standard_error": float(
            correct.reshape(len(problems), samples).mean(axis=1).std() / np.sqrt(len(problems))
        ),
        "parse_failure_rate": float(1.0 - parsed.mean()),
        "mean_tokens": tokens / len(finished),
        "samples": float(samples),
    }
    if samples > 1:
        per_problem = correct.reshape(len(problems), samples)
        result[f"pass@{samples}"] = float(per_problem.max(axis=1).mean())
        votes = []
        for index, problem in enumerate(problems):
            answers = [
                g.extracted for g in grades[index * samples : (index + 1) * samples] if g.parsed
            ]
            if not answers:
                votes.append(0.0)
                continue
            winner = Counter(answers).most_common(1)[0][0]
            votes.append(float(bool(verify(parse(problem.answer), parse(winner)))))
        result["majority_vote"] = float(np.mean(votes))
    return result
