"""A calculator tool: one agent writes an arithmetic expression, the calculator answers its value
into the shared context, and the next agent states the answer.

``[task] environment = "calculator"`` on any task with numeric answers (the built-in
arithmetic task: ``docs/examples/calculator/``). The calculator reads the *first* arithmetic
expression of the caller's message (digits, + - * / and parentheses; "x" and "×" read as *)
and replies ``calculator: <expression> = <value>``, or says it found none. It evaluates by
walking Python's syntax tree over numbers and the four operations only: no name, call or
attribute is ever evaluated, and an exponent or a number too long is refused, so no message
can make it run code or compute for long. It is deterministic: its seed is unused.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from fractions import Fraction

from llm.problems.environment import Opening, Reply
from llm.problems.tasks import Problem

EXPRESSION = re.compile(r"[\d(][\d\s.+\-*/×x()]*[\d)]|\d")
"""An arithmetic expression: starts with a digit or "(", ends with a digit or ")"."""
MAX_DIGITS = 12
"""The longest number the calculator reads: it refuses to compute with larger ones."""

_OPERATIONS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class CalculatorInputError(ValueError):
    """The message holds no expression the calculator can evaluate."""


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression`` (numbers, + - * /, parentheses)."""
    text = expression.replace("×", "*").replace("x", "*")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorInputError(f"cannot read {expression!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if len(str(node.value).replace(".", "")) > MAX_DIGITS:
            raise CalculatorInputError("a number is too long")
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _value(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATIONS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorInputError("division by zero")
        return _OPERATIONS[type(node.op)](left, right)
    raise CalculatorInputError("only numbers, + - * / and parentheses")


def written(value: Fraction) -> str:
    """``value`` as the calculator writes it: an integer, else a decimal to 6 places."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def calculate(message: str) -> str:
    """The calculator's reply to ``message``."""
    for match in EXPRESSION.finditer(message):
        expression = match.group(0).strip()
        if not re.search(r"[+\-*/×x]", expression):
            continue  # a bare number is no calculation: look further
        try:
            return f"calculator: {expression} = {written(evaluate(expression))}"
        except CalculatorInputError as error:
            return f"calculator: {expression}: {error}"
    return "calculator: no arithmetic expression found"


@dataclass
class Calculator:
    """The calculator environment: agent ``caller`` (default 0) calls it with each of its
    messages; the dialogue ends after agent ``answerer``'s (default: the last agent's) first
    message. The opening is the problem's question. Where the caller is the answerer (a single
    agent, ``n_agents = 1``), its first message calls the calculator and its second answers."""

    caller: int = 0
    answerer: int | None = None
    n_agents: int = 2
    calls: int = field(default=0, init=False)
    """The calculator's replies so far in this dialogue."""

    def reset(self, problem: Problem, seed: int) -> Opening:
        self.calls = 0
        return Opening(problem.question)

    def step(self, speaker: int, message: str) -> Reply:
        answerer = self.n_agents - 1 if self.answerer is None else self.answerer
        if speaker == self.caller and (speaker != answerer or self.calls == 0):
            self.calls += 1
            return Reply(text=calculate(message))
        if speaker == answerer:
            return Reply(done=True)
        return Reply()
