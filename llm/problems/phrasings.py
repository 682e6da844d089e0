"""Phrasing templates of the built-in arithmetic task: plain expressions and short word problems.

Each template has an id (``d<difficulty>.<name>``), a difficulty (1: a±b; 2: three operands or
a*b+c; 3: (a+b)*c-d) and draws one question with its integer answer from a generator. Templates
marked ``eval_only`` are never drawn for training, so that held-out accuracy can be measured
on phrasings the training set did not use. Word problems count things, so their operands are
drawn such that no count is ever negative (a shop cannot sell more than it has).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Draw = Callable[[np.random.Generator], tuple[str, int]]


@dataclass(frozen=True)
class Template:
    """One way of asking a question of one difficulty."""

    id: str
    difficulty: int
    eval_only: bool
    draw: Draw


def _ints(rng: np.random.Generator, low: int, high: int, count: int) -> list[int]:
    """``count`` integers in [low, high)."""
    return [int(x) for x in rng.integers(low, high, size=count)]


def _ordered_pair(rng: np.random.Generator) -> tuple[int, int]:
    """Two counts 1..99, the larger first, so that taking the second away leaves >= 0."""
    a, b = _ints(rng, 1, 100, 2)
    return max(a, b), min(a, b)


def _sum_or_difference(rng: np.random.Generator) -> tuple[str, int]:
    """``a + b`` or ``a - b`` with a, b in 0..99, as the plain questions draw them."""
    a, b = _ints(rng, 0, 100, 2)
    if rng.random() < 0.5:
        return f"{a} + {b}", a + b
    return f"{a} - {b}", a - b


def _three_operands(rng: np.random.Generator) -> tuple[str, int]:
    """``a + b - c`` (1..49 each) or ``a * b + c`` (a, b in 2..12), as the plain questions."""
    a, b, c = _ints(rng, 1, 50, 3)
    if rng.random() < 0.5:
        return f"{a} + {b} - {c}", a + b - c
    a, b = _ints(rng, 2, 13, 2)
    return f"{a} * {b} + {c}", a * b + c


def _grouped(rng: np.random.Generator) -> tuple[str, int]:
    """``(a + b) * c - d`` with all four in 1..19."""
    a, b, c, d = _ints(rng, 1, 20, 4)
    return f"({a} + {b}) * {c} - {d}", (a + b) * c - d


EXPRESSIONS: dict[int, Callable[[np.random.Generator], tuple[str, int]]] = {
    1: _sum_or_difference,
    2: _three_operands,
    3: _grouped,
}


def _expression(difficulty: int, phrase: Callable[[str], str]) -> Draw:
    def draw(rng: np.random.Generator) -> tuple[str, int]:
        expression, answer = EXPRESSIONS[difficulty](rng)
        return phrase(expression), answer

    return draw


def _shop_sold(rng: np.random.Generator) -> tuple[str, int]:
    had, sold = _ordered_pair(rng)
    return f"A shop had {had} apples and sold {sold}. How many are left?", had - sold


def _bus_on(rng: np.random.Generator) -> tuple[str, int]:
    people, more = _ints(rng, 1, 100, 2)
    return (
        f"A bus has {people} people and {more} more get on. How many people are on the bus now?",
        people + more,
    )


def _birds_land(rng: np.random.Generator) -> tuple[str, int]:
    birds, more = _ints(rng, 1, 100, 2)
    return (
        f"There are {birds} birds on a tree and {more} more land on it. "
        "How many birds are on the tree now?",
        birds + more,
    )


def _marbles_given(rng: np.random.Generator) -> tuple[str, int]:
    had, given = _ordered_pair(rng)
    return (
        f"Tom has {had} marbles. He gives {given} of them to a friend. "
        "How many marbles does Tom have now?",
        had - given,
    )


def _take_away(rng: np.random.Generator) -> tuple[str, int]:
    whole, part = _ordered_pair(rng)
    return f"What do you get when you take {part} away from {whole}?", whole - part


def _pens_in_boxes(rng: np.random.Generator) -> tuple[str, int]:
    boxes, per_box = _ints(rng, 2, 13, 2)
    (loose,) = _ints(rng, 1, 50, 1)
    return (
        f"There are {boxes} boxes with {per_box} pens in each, and {loose} loose pens. "
        "How many pens are there in total?",
        boxes * per_box + loose,
    )


def _train_stop(rng: np.random.Generator) -> tuple[str, int]:
    riding, getting_on = _ints(rng, 1, 50, 2)
    (getting_off,) = _ints(rng, 1, riding + getting_on + 1, 1)
    return (
        f"A train has {riding} passengers. At the next stop {getting_on} get on and "
        f"{getting_off} get off. How many passengers are on the train now?",
        riding + getting_on - getting_off,
    )


def _library_books(rng: np.random.Generator) -> tuple[str, int]:
    books, bought = _ints(rng, 1, 50, 2)
    (lent,) = _ints(rng, 1, books + bought + 1, 1)
    return (
        f"A library had {books} books. It bought {bought} more and lent out {lent}. "
        "How many books are in the library now?",
        books + bought - lent,
    )


def _garden_rows(rng: np.random.Generator) -> tuple[str, int]:
    rows, per_row = _ints(rng, 2, 13, 2)
    (extra,) = _ints(rng, 1, 50, 1)
    return (
        f"A garden has {rows} rows of {per_row} flowers and {extra} more flowers by the gate. "
        "How many flowers are in the garden?",
        rows * per_row + extra,
    )


def _marble_bags(rng: np.random.Generator) -> tuple[str, int]:
    red, blue, bags = _ints(rng, 1, 20, 3)
    total = (red + blue) * bags
    (lost,) = _ints(rng, 1, min(20, total + 1), 1)
    return (
        f"Each bag holds {red} red and {blue} blue marbles. There are {bags} bags, and "
        f"{lost} marbles get lost. How many marbles are left?",
        total - lost,
    )


def _class_stickers(rng: np.random.Generator) -> tuple[str, int]:
    boys, girls, each = _ints(rng, 1, 20, 3)
    total = (boys + girls) * each
    (torn,) = _ints(rng, 1, min(20, total + 1), 1)
    return (
        f"A class has {boys} boys and {girls} girls. Each child gets {each} stickers, and "
        f"{torn} stickers are torn. How many stickers are not torn?",
        total - torn,
    )


def _expression_templates(difficulty: int) -> list[Template]:
    phrases: list[tuple[str, bool, Callable[[str], str]]] = [
        ("what_is", False, lambda e: f"What is {e}?"),
        ("compute", False, lambda e: f"Compute {e}."),
        ("equals", False, lambda e: f"{e} = ?"),
        ("evaluate", True, lambda e: f"Evaluate the expression {e}."),
    ]
    return [
        Template(f"d{difficulty}.{name}", difficulty, eval_only, _expression(difficulty, phrase))
        for name, eval_only, phrase in phrases
    ]


def _word(difficulty: int, name: str, eval_only: bool, draw: Draw) -> Template:
    return Template(f"d{difficulty}.{name}", difficulty, eval_only, draw)


TEMPLATES: tuple[Template, ...] = (
    *_expression_templates(1),
    _word(1, "shop_sold", False, _shop_sold),
    _word(1, "bus_on", False, _bus_on),
    _word(1, "birds_land", False, _birds_land),
    _word(1, "take_away", True, _take_away),
    _word(1, "marbles_given", True, _marbles_given),
    *_expression_templates(2),
    _word(2, "pens_in_boxes", False, _pens_in_boxes),
    _word(2, "train_stop", False, _train_stop),
    _word(2, "library_books", True, _library_books),
    _word(2, "garden_rows", True, _garden_rows),
    *_expression_templates(3),
    _word(3, "marble_bags", False, _marble_bags),
    _word(3, "class_stickers", True, _class_stickers),
)
"""Every template; ``d<k>.what_is`` asks exactly the questions of the "plain" phrasing."""

TEMPLATE_BY_ID = {template.id: template for template in TEMPLATES}


def templates_of(difficulty: int, *, eval_only: bool | None = None) -> list[Template]:
    """The templates of one difficulty (only training or only eval-only ones if asked)."""
    return [
        t
        for t in TEMPLATES
        if t.difficulty == difficulty and (eval_only is None or t.eval_only == eval_only)
    ]
