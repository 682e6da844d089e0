"""``[task] kind = "reasoning_gym"``: the procedural generators of reasoning-gym as a task.

reasoning-gym (``pip install 'teamtr[reasoning]'``) holds ~100 seeded generators, each with
its own verifier ``score_answer(answer, entry)``. A problem is one generated entry: the
generator named in ``[task] datasets``, built with its options (``[task.dataset_args.<name>]``)
and a seed of its own, ``size = 1``; its entry at index 0 is the problem (every generator
seeds its entry ``idx`` from ``seed + idx``, so a problem is a function of its seed alone). A
generator whose construction reads no seed is built once and given each problem's seed
(``reseedable`` checks that it writes the entries of one built anew).

- held-out problems: ``eval_size`` distinct questions from seeds ``eval_seed``,
  ``eval_seed + 1``, ... (a seed that repeats a held-out question is skipped), shared among the
  datasets in proportion to their weights (``held_out_counts``);
- training problems: a dataset drawn by weight, then a seed drawn from [0, 2**31) outside the
  held-out seeds, and a question that is a held-out question is drawn again (two seeds can
  write one question where a generator has few): the splits are disjoint by seed and by text,
  and the task declares its split, so ``llm.check_task`` checks it on every draw;
- reward: the dataset's own ``score_answer`` on the answer taken from the team's final message
  (``answer_in``); it may give partial credit (most give len(reference)/len(answer) to an
  answer that contains the reference);
- held-out metric: whether that score is 1 (the dataset's verifier accepts the answer in full),
  reported as accuracy.

Every failure to build the task (a dataset or an option reasoning-gym does not have, an option
its generator rejects) is one ``ConfigError`` line naming the closest names.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from llm.common.config import ConfigError, TaskSettings
from llm.problems.task import Dialogue, Task, first_line
from llm.problems.tasks import Problem

SEED_LIMIT = 2**31
"""Training seeds are drawn from [0, SEED_LIMIT) (``[task] eval_seed``'s range)."""
RESERVED_OPTIONS = ("seed", "size")
"""Options every generator has that the task sets itself: each problem's seed, one entry."""
REDRAWS = 1000
"""A training draw gives up after this many held-out questions in a row (a generator whose
every question is held out cannot train)."""
INSTALL = "pip install 'teamtr[reasoning]' (reasoning-gym)"

# -- the answer in a message ---------------------------------------------------------------------
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*:?\s*(.+)", re.IGNORECASE)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
PLAIN_NUMBER = re.compile(r"\s*-?\d+(?:\.\d+)?\s*")
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
ENUMERATOR = re.compile(r"(?m)^[ \t]*\d+[.)][ \t]+(?=\S)")
"""A list item's number at the start of a line ("2. The text is ..."): it counts the steps, it
does not answer; a trained model that numbered its lines would otherwise be read as answering
1, 2, 3 (the answers most counting problems have). A line that is only a number ("12.") keeps it."""
WRAPPERS = "*`\"' \t\n"


def answer_span(message: str) -> str:
    """Where a message states its answer, the first rule that applies: the last
    ``<answer>...</answer>`` (reasoning-gym's own format); the last ``\\boxed{...}``; the
    rest of the last line that says "answer is" or "answer:"; else the last non-empty line.
    Markdown bold, backticks and quotes around it are dropped."""
    for pattern in (ANSWER_TAG, BOXED):
        found = pattern.findall(message)
        if found:
            return found[-1].strip(WRAPPERS)
    lines = [line for line in message.splitlines() if line.strip()]
    for line in reversed(lines):
        said = ANSWER_LINE.search(line)
        if said:
            return said.group(1).strip(WRAPPERS)
    return lines[-1].strip(WRAPPERS) if lines else ""


def answer_in(message: str, reference: str) -> str:
    """The answer a message gives: its ``answer_span``, and where the reference answer is a
    plain number (all of an arithmetic dataset's are), the last number in that span (commas
    between thousands dropped), so that "There are 12 legs." answers 12; a span without a
    number (a message cut after "So") gives the message's last number. Numbers that only
    number a list's items are not answers (``ENUMERATOR``)."""
    span = answer_span(message)
    if PLAIN_NUMBER.fullmatch(reference):
        for text in (span, message):
            numbers = NUMBER.findall(THOUSANDS.sub("", ENUMERATOR.sub("", text)))
            if numbers:
                return numbers[-1]
    return span


def _candidates(answer: str) -> tuple[str, ...]:
    """The answer, and without a trailing full stop ("12." and "olleh." end sentences)."""
    shorter = answer.rstrip().removesuffix(".").rstrip()
    return (answer, shorter) if shorter and shorter != answer else (answer,)


# -- the generators ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Generator:
    """One dataset of reasoning-gym with its options: problems by seed, and its verifier."""

    name: str
    options: Mapping[str, Any]
    weight: float
    dataset: Any
    """The generator built with ``options`` (its ``score_answer`` scores every problem)."""
    reseeds: bool = False
    """Whether a problem's generator is ``dataset`` with its seed replaced rather than built
    anew (``reseedable``): spell_backward filters a word list of 150,000 lines each time it
    is built, 39 ms a problem."""

    def problem(self, seed: int) -> Problem:
        """The entry of ``seed`` as a problem (its reference answer "" where the generator
        has none: such a dataset is scored by its verifier alone)."""
        entry = self.seeded(seed)[0]
        answer = entry.get("answer")
        return Problem(
            question=str(entry["question"]).strip(),
            answer="" if answer is None else str(answer),
            metadata={"dataset": self.name, "seed": seed, "entry": entry},
            origin=f"{self.name} seed {seed}",
        )

    def seeded(self, seed: int) -> Any:
        """The generator of ``seed``'s problem (one entry)."""
        return (reseeded if self.reseeds else built_anew)(self.dataset, seed)


def built_anew(dataset: Any, seed: int) -> Any:
    """``dataset``'s generator built for ``seed``, one entry: what every problem's is."""
    return type(dataset)(config=dataclasses.replace(dataset.config, seed=seed, size=1))


def reseeded(dataset: Any, seed: int) -> Any:
    """``dataset`` with ``seed`` and one entry in place of its own, the rest of its state
    shared: what ``built_anew`` gives where its construction uses no seed (``reseedable``)."""
    fresh = copy.copy(dataset)
    fresh.config = dataclasses.replace(dataset.config, seed=seed, size=1)
    fresh.seed, fresh.size = seed, 1
    return fresh


PROBED_SEEDS = (0, 1, 7919, SEED_LIMIT - 1)
"""The seeds at which ``reseedable`` compares a generator built anew with one reseeded."""
OWN_STATE = ("config", "seed", "size")
"""What reasoning-gym's base class sets from a generator's config (``ProceduralDataset``)."""


def reseedable(dataset: Any) -> bool:
    """Whether ``reseeded`` stands for ``built_anew``: at every probed seed the generator built
    anew holds the same state as ``dataset`` beside its config, seed and size (its
    construction reads no seed) and writes the same entry as the one reseeded, and writing
    entries leaves ``dataset``'s shared state as it was. Any doubt (a state that cannot be
    compared or copied) builds every problem's generator anew."""

    def state(generator: Any) -> dict[str, Any]:
        return {k: v for k, v in vars(generator).items() if k not in OWN_STATE}

    try:
        before = copy.deepcopy(state(dataset))
        for seed in PROBED_SEEDS:
            built = built_anew(dataset, seed)
            if bool(state(built) != before) or bool(built[0] != reseeded(dataset, seed)[0]):
                return False
        return bool(state(dataset) == before)
    except Exception:
        return False


def generators(settings: TaskSettings) -> tuple[Generator, ...]:
    """The datasets of ``[task] datasets``, built with their options and weights;
    ``ConfigError`` of one line for a name or an option reasoning-gym does not have."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise ConfigError(f'[task] kind = "reasoning_gym" needs reasoning-gym: {INSTALL}') from None
    for name in settings.dataset_args:
        if name not in settings.datasets:
            raise ConfigError(
                f"[task] dataset_args: {name!r} is not one of [task] datasets "
                f"{list(settings.datasets)}{_closest(name, settings.datasets)}"
            )
    weights = settings.dataset_weights or (1.0,) * len(settings.datasets)
    built = []
    for name, weight in zip(settings.datasets, weights, strict=True):
        if name not in DATASETS:
            raise ConfigError(
                f"[task] datasets: reasoning-gym has no dataset {name!r}{_closest(name, DATASETS)}"
            )
        dataset_class, config_class = DATASETS[name]
        options = dict(settings.dataset_args.get(name, {}))
        known = [f.name for f in dataclasses.fields(config_class) if f.name not in RESERVED_OPTIONS]
        for option in options:
            if option in RESERVED_OPTIONS:
                raise ConfigError(
                    f"[task] dataset_args.{name}.{option}: set by the task (each problem's seed, "
                    "one entry each; [task] eval_seed fixes the held-out ones)"
                )
            if option not in known:
                raise ConfigError(
                    f"[task] dataset_args.{name}: {name} has no option {option!r}"
                    f"{_closest(option, known)} (its options: {', '.join(known)})"
                )
        try:
            config = config_class(**options, seed=0, size=1)
            dataset = dataset_class(config=config)
            dataset[0]  # a generator that fails on its options fails here, not mid-run
        except Exception as error:  # reasoning-gym validates with assert and ValueError
            text = first_line(error) or type(error).__name__
            raise ConfigError(
                f"[task] dataset_args.{name}: {name} rejects the options {options!r}: {text}"[:400]
            ) from None
        built.append(Generator(name, options, float(weight), dataset, reseedable(dataset)))
    return tuple(built)


def _closest(written: str, known: Sequence[str] | Mapping[str, Any]) -> str:
    """``"; closest: 'a', 'b'"`` for the known names nearest a misspelt one, else ""."""
    close = difflib.get_close_matches(written, list(known), n=3, cutoff=0.5)
    return f"; closest: {', '.join(repr(c) for c in close)}" if close else ""


def held_out_counts(weights: Sequence[float], total: int) -> list[int]:
    """``total`` held-out problems shared in proportion to ``weights`` (largest remainders:
    the counts add up to ``total`` and each is within 1 of its exact share)."""
    shares = np.asarray(weights, dtype=float) / float(np.sum(weights)) * total
    counts = np.floor(shares).astype(int)
    for index in np.argsort(-(shares - counts), kind="stable")[: total - int(counts.sum())]:
        counts[index] += 1
    return [int(c) for c in counts]


# -- the task ------------------------------------------------------------------------------------
def reasoning_gym_task(settings: TaskSettings) -> Task:
    """The task of ``[task] kind = "reasoning_gym"`` (see the module's docstring)."""
    built = generators(settings)
    by_name = {generator.name: generator for generator in built}
    weights = np.array([generator.weight for generator in built])
    test, held_out_seeds = held_out_problems(built, settings.eval_seed, settings.eval_size)
    held_out = frozenset(problem.question for problem in test)

    def draw(rng: np.random.Generator, count: int) -> list[Problem]:
        problems: list[Problem] = []
        for index in rng.choice(len(built), size=count, p=weights / weights.sum()):
            problems.append(_training_problem(built[int(index)], rng, held_out_seeds, held_out))
        return problems

    def verifier_score(dialogue: Dialogue) -> float:
        problem = dialogue.problem
        generator = by_name[problem.metadata["dataset"]]
        answer = answer_in(dialogue.final, problem.answer)
        entry = problem.metadata["entry"]
        return max(float(generator.dataset.score_answer(a, entry)) for a in _candidates(answer))

    def solved(dialogue: Dialogue) -> float:
        """1 when the dataset's verifier gives the answer its full score."""
        return float(verifier_score(dialogue) >= 1.0)

    reward = verifier_score if settings.partial_credit else solved

    solved.grading = True  # type: ignore[attr-defined]
    return Task(
        train=draw,
        test=test,
        reward=reward,
        metric=solved,
        name="reasoning_gym:" + "+".join(settings.datasets),
        split=lambda question: "test" if question in held_out else "train",
        grading=True,
    )


def held_out_problems(
    built: Sequence[Generator], eval_seed: int, eval_size: int
) -> tuple[list[Problem], range]:
    """``eval_size`` held-out problems of distinct questions, each dataset's share
    (``held_out_counts``) from the next seeds upward of ``eval_seed`` (a seed whose question is
    already held out is skipped), and the range of every seed so used: training draws none."""
    test: list[Problem] = []
    questions: set[str] = set()
    seed = eval_seed
    weights = [generator.weight for generator in built]
    for generator, count in zip(built, held_out_counts(weights, eval_size), strict=True):
        kept = 0
        for _ in range(count * REDRAWS):
            if kept == count:
                break
            problem = generator.problem(seed)
            seed += 1
            if problem.question not in questions:
                questions.add(problem.question)
                test.append(problem)
                kept += 1
        if kept < count:
            raise ConfigError(
                f"[task] eval_size: {generator.name} wrote {kept} distinct questions for its "
                f"{count} held-out problems; lower eval_size or widen its [task.dataset_args]"
            )
    return test, range(eval_seed, seed)


def _training_problem(
    generator: Generator, rng: np.random.Generator, held_out_seeds: range, held_out: frozenset[str]
) -> Problem:
    """A problem of ``generator`` from a seed outside ``held_out_seeds`` whose question is not
    a held-out question."""
    for _ in range(REDRAWS):
        seed = int(rng.integers(SEED_LIMIT))
        if seed in held_out_seeds:
            continue
        problem = generator.problem(seed)
        if problem.question not in held_out:
            return problem
    raise ConfigError(
        f"[task] datasets: {generator.name} wrote {REDRAWS} held-out questions in a row: with "
        "these options it has too few distinct questions to keep any for training; lower "
        "[task] eval_size or widen its [task.dataset_args]"
    )
