"""Routers: who speaks at each turn of a shared dialogue (THEORY.md §1, agent(s)).

A router is a function of the episode's routing seed and the transcript so far, never of any
agent's parameters. This is what makes prefix reuse exact: turns before an updated agent's
first turn, and the routing decisions among them, have the same distribution under the old and
the new team (Lemma 3.1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Router(Protocol):
    @property
    def n_agents(self) -> int:
        """How many agents take turns (read-only: routers are frozen values)."""
        ...

    def speaker(
        self, turn: int, route_seed: int, last_message: str | None, last_speaker: int | None
    ) -> int:
        """The agent that speaks at ``turn`` (0-based)."""
        ...


@dataclass(frozen=True)
class FixedOrder:
    """Agents speak in a fixed cyclic order (``order`` defaults to 0, 1, ..., n-1; an agent
    may appear more than once, e.g. [0, 1, 0, 2] gives agent 0 two turns per round)."""

    n_agents: int
    order: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if any(not 0 <= k < self.n_agents for k in self.order):
            raise ValueError(f"order {self.order} names an agent outside 0..{self.n_agents - 1}")

    def speaker(
        self, turn: int, route_seed: int, last_message: str | None, last_speaker: int | None
    ) -> int:
        order = self.order or tuple(range(self.n_agents))
        return order[turn % len(order)]


@dataclass(frozen=True)
class RandomOrder:
    """A fresh random permutation of the agents per episode (drawn from its routing seed)."""

    n_agents: int

    def speaker(
        self, turn: int, route_seed: int, last_message: str | None, last_speaker: int | None
    ) -> int:
        permutation = np.random.default_rng(route_seed).permutation(self.n_agents)
        return int(permutation[turn % self.n_agents])


HANDOFF_PATTERN = re.compile(r"@agent(\d+)")


@dataclass(frozen=True)
class Handoff:
    """The speaker names the next one with ``@agentK`` (the last mention counts); without a
    valid mention of another agent, the turn passes to the next agent in cyclic order."""

    n_agents: int
    first: int = 0

    def speaker(
        self, turn: int, route_seed: int, last_message: str | None, last_speaker: int | None
    ) -> int:
        if turn == 0 or last_speaker is None:
            return self.first
        mentions = [int(m) for m in HANDOFF_PATTERN.findall(last_message or "")]
        valid = [k for k in mentions if 0 <= k < self.n_agents and k != last_speaker]
        return valid[-1] if valid else (last_speaker + 1) % self.n_agents


def make_router(kind: str, n_agents: int, order: tuple[int, ...] = ()) -> Router:
    """A router by name: "fixed", "random" or "handoff"."""
    if kind == "fixed":
        return FixedOrder(n_agents, order)
    if kind == "random":
        return RandomOrder(n_agents)
    if kind == "handoff":
        return Handoff(n_agents, order[0] if order else 0)
    raise ValueError(f"router must be 'fixed', 'random' or 'handoff', got {kind!r}")
