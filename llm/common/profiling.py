"""Where a run's CPU time goes: named sections and counters, recorded only while asked for.

Code marks its parts with ``with section("train backward"):`` and counts work with
``count("generated tokens", n)``. Nothing is recorded unless a ``recording()`` block is active:
then each section accumulates its *exclusive* CPU time (``time.process_time``, minus the time of
the sections nested inside it, so that the parts of a profile add up to its total without double
counting) and its number of calls. Outside ``recording()`` a section is one global lookup and a
shared no-op context manager, so the marks stay in the production code at no cost.

``time.process_time`` counts every thread of the process: with one torch thread (the setting
of the profile) it is the CPU time of the work itself, independent of other load on the machine.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType


class Profile:
    """Exclusive CPU seconds and calls per section, counters, and the recorded total."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.counts: dict[str, float] = defaultdict(float)
        self.total_seconds = 0.0
        self._open: list[_Timed] = []

    @property
    def attributed_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def unattributed_seconds(self) -> float:
        """CPU time of the recorded block outside every section."""
        return self.total_seconds - self.attributed_seconds

    def to_dict(self) -> dict[str, object]:
        return {
            "total_cpu_seconds": self.total_seconds,
            "unattributed_cpu_seconds": self.unattributed_seconds,
            "parts": {
                name: {"cpu_seconds": self.seconds[name], "calls": self.calls[name]}
                for name in sorted(self.seconds, key=self.seconds.__getitem__, reverse=True)
            },
            "counts": dict(sorted(self.counts.items())),
        }


class _Timed:
    __slots__ = ("profile", "name", "started", "nested")

    def __init__(self, profile: Profile, name: str) -> None:
        self.profile = profile
        self.name = name
        self.started = 0.0
        self.nested = 0.0

    def __enter__(self) -> None:
        self.profile._open.append(self)
        self.started = time.process_time()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        elapsed = time.process_time() - self.started
        profile = self.profile
        profile._open.pop()
        profile.seconds[self.name] += elapsed - self.nested
        profile.calls[self.name] += 1
        if profile._open:
            profile._open[-1].nested += elapsed


class _Off:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_exc: object) -> None:
        return None


_OFF = _Off()
_active: Profile | None = None
_prefix = ""


def section(name: str) -> _Timed | _Off:
    """A context manager that charges its exclusive CPU time to ``name`` while recording (to
    ``prefix + name`` inside a ``prefixed(prefix)`` block)."""
    profile = _active
    if profile is None:
        return _OFF
    return _Timed(profile, _prefix + name)


@contextmanager
def prefixed(prefix: str) -> Iterator[None]:
    """Charge every section opened inside the block to ``prefix + name`` (e.g. the tries of a
    backtracked step after its first: ``"backtrack kl measurement"``), so that repeated work is
    told apart from the first time it is done without passing a label through every call."""
    global _prefix
    outer = _prefix
    _prefix = outer + prefix
    try:
        yield
    finally:
        _prefix = outer


def count(name: str, amount: float) -> None:
    """Add ``amount`` to counter ``name`` while recording (tokens generated, scored, ...)."""
    profile = _active
    if profile is not None:
        profile.counts[name] += amount


def active() -> bool:
    return _active is not None


@contextmanager
def recording() -> Iterator[Profile]:
    """Record every section and counter inside the block into a fresh ``Profile``."""
    global _active
    if _active is not None:
        raise RuntimeError("a profile is already being recorded")
    profile = Profile()
    _active = profile
    started = time.process_time()
    try:
        yield profile
    finally:
        profile.total_seconds = time.process_time() - started
        _active = None
