"""Held-out evaluation of a team: accuracy, parse failures, length; pass@K and majority vote."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
from math_verify import parse, verify

from llm.agents import LoraTeam
from llm.collective import Collective
from llm.dialogue import Episode
from llm.progress import CountProgress
from llm.rewards import Grade, grade
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
    collective: Collective | None = None,
) -> dict[str, float]:
    """One greedy dialogue per problem, or ``samples`` sampled ones (then pass@K, majority).

    ``standard_error`` is the standard error of ``accuracy`` over the problems (binomial for
    greedy evaluation). With a ``collective`` (data parallelism, ``llm.distributed``) each rank
    plays a contiguous share of the problems and the grades are gathered in order, so every
    rank returns the numbers of the whole set.
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
    # Progress is counted in messages, advanced after every generated batch of one turn: even
    # a single batch of questions moves the bar H times, with an ETA.
    if collective is None:
        mine = len(problems)
    else:
        first, last = _share_of(len(problems), collective)
        mine = last - first  # this rank's bar counts the dialogues it plays
    bar = CountProgress(mine * samples * sampler.settings.turns, "msg", "evaluating", progress)
    started = time.perf_counter()
    if collective is None:
        finished: list[Episode] = []
        tokens = 0
        for start in range(0, len(episodes), batch_size):
            done, generated = sampler.play(
                team,
                episodes[start : start + batch_size],
                temperature=temperature,
                on_messages=bar.advance,
            )
            finished.extend(done)
            tokens += generated
        grades = [grade(sampler.chat.message_text(e.turns[-1]), e.problem.answer) for e in finished]
    else:
        grades, tokens = _evaluate_share(
            team, sampler, problems, episodes, samples, batch_size, collective, bar.advance
        )
        grades = [g for share in collective.gather(grades) for g in share]
        tokens = int(collective.sum(tokens))
    bar.close(f"{len(problems)} questions in {time.perf_counter() - started:.1f} s")
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
        "mean_tokens": tokens / len(grades),
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
    samples: int,
    batch_size: int,
    collective: Collective,
    on_messages: Callable[[int], None] | None = None,
) -> tuple[list[Grade], int]:
    """This rank's contiguous share of the problems, played and graded.

    The sampler's generator advances by one seed per batch of the whole set, as in one process,
    so that training goes on from the same generator state whatever the number of ranks.
    """
    first, last = _share_of(len(problems), collective)
    seeds = [int(sampler.rng.integers(2**31)) for _ in range(0, len(episodes), batch_size)]
    temperature = 0.0 if samples == 1 else sampler.settings.temperature
    share = episodes[first * samples : last * samples]
    grades: list[Grade] = []
    tokens = 0
    for batch, start in enumerate(range(0, len(share), batch_size)):
        done, generated = sampler.play(
            team,
            share[start : start + batch_size],
            temperature=temperature,
            seed=seeds[batch],
            on_messages=on_messages,
        )
        grades.extend(grade(sampler.chat.message_text(e.turns[-1]), e.problem.answer) for e in done)
        tokens += generated
    return grades, tokens
