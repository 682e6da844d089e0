"""One cache of per-team quantities (J, or a backend's whole exact evaluation).

Teams are immutable values (``TeamPolicy.with_agent`` returns a new team), so anything computed
from a team can be computed once per team object. The stage loop caches J with it; experiments
cache whole exact evaluations (J, V, Q, A, d) the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

ValueT = TypeVar("ValueT")


class PerTeamCache(Generic[ValueT]):
    """``compute(team)``, computed once per team object."""

    def __init__(self, compute: Callable[[Any], ValueT]) -> None:
        self.compute = compute
        # id -> (team, value): holding the team keeps its id from being reused by another object.
        self._values: dict[int, tuple[Any, ValueT]] = {}

    def __call__(self, team: Any) -> ValueT:
        hit = self._values.get(id(team))
        if hit is None or hit[0] is not team:
            hit = (team, self.compute(team))
            self._values[id(team)] = hit
        return hit[1]

    def __len__(self) -> int:
        """How many teams have been computed (each exactly once)."""
        return len(self._values)
