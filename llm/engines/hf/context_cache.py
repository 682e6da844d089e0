"""Keys and values an unchanged agent computed over its contexts, kept for the next draw.

After agent k's update, TeamTR's resample keeps each dialogue's turns before agent k's first and
regenerates the rest (prefix reuse, THEORY.md Lemma 3.1's setting). Every later speaker j is
unchanged, and in the previous draw it already read the prompt and the kept turns: a decoder's
keys and values at a position depend only on the tokens up to that position and on the weights
(causal attention), so those it computed then are the ones it would compute now. Generation
therefore runs a context only from the end of the longest prefix it shares with a context the
same snapshot read before. No distribution changes, only which float operations compute the
same numbers (tests/llm/test_llm_context_cache.py: the same samples with and without).

On the n-agent chain, where every context holds all turns before it, this is the part of a
resample's prefill that grows with n: the turns before agent k, re-read by each of the n - k
later speakers (docs/stage_cost.md, "The unchanged speakers' keys and values").

What is kept: per speaker snapshot (policy slot and ``AdapterWeights.version``, which is unique
per weights), the contexts of the last draw and where their keys and values lie in the cache
their generation call left (a reference, no copy), within ``[sampler] kept_contexts_mb``. With
the fixed update order every later speaker regenerated in the last draw, so it holds every
useful entry; a snapshot that left the team is dropped at once (it can never speak again). Only
draws that continue one another by prefix reuse share them: a stage's first draw starts from
nothing (``DialogueSampler.drawing``), so a stage depends on nothing kept from the one before
and a run resumed from its checkpoint computes what the straight run computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

LayerTensors = tuple[tuple[torch.Tensor, torch.Tensor], ...]
"""Per decoder layer, (keys, values) of one generation call: [rows, kv heads, positions, dim]."""

SnapshotKey = tuple[int, int]
"""(policy slot, snapshot version): who computed the keys and values."""


@dataclass(frozen=True)
class ContextSource:
    """Where one context's keys and values lie: row ``row`` of ``layers``, at ``positions``
    (one per context token, in order; the cache's padding is skipped)."""

    layers: LayerTensors
    row: int
    positions: torch.Tensor


class _Node:
    """A node of the token trie: the contexts through it share the tokens on its path."""

    __slots__ = ("children", "source")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.source: ContextSource | None = None


class SpeakerContexts:
    """One snapshot's kept contexts, as a trie over their tokens: a lookup walks the longest
    shared prefix in as many steps as it has tokens, however many contexts are kept."""

    def __init__(self) -> None:
        self._root = _Node()
        self.size = 0
        self.caches: dict[int, LayerTensors] = {}
        """The generation calls' caches this snapshot's contexts lie in, by identity."""

    def longest(self, context: Sequence[int]) -> tuple[int, ContextSource | None]:
        """A kept context sharing the longest prefix with ``context``, and that length (at
        most ``len(context) - 1``: generation needs one token of its own to run)."""
        node, length = self._root, 0
        for token in context[: len(context) - 1]:
            child = node.children.get(int(token))
            if child is None:
                break
            node, length = child, length + 1
        return length, node.source

    def keep(self, context: Sequence[int], source: ContextSource) -> None:
        node = self._root
        for token in context:
            node = node.children.setdefault(int(token), _Node())
            if node.source is None:  # every context through a node shares its whole path
                node.source = source
        self.size += 1
        self.caches[id(source.layers)] = source.layers


class ContextCaches:
    """The contexts every speaker snapshot read in the last draw, and in the current one while
    it runs, within at most ``limit_bytes`` of keys and values."""

    def __init__(self, limit_bytes: int = 2**62) -> None:
        self.limit_bytes = limit_bytes
        self._current: dict[SnapshotKey, SpeakerContexts] = {}
        self._previous: dict[SnapshotKey, SpeakerContexts] = {}

    def new_draw(self, snapshots: Sequence[SnapshotKey]) -> None:
        """A draw of a team whose slots hold ``snapshots`` begins: it may read the last draw's
        contexts, except those of snapshots the team no longer holds (they go at once)."""
        alive = set(snapshots)
        self._previous = {key: kept for key, kept in self._current.items() if key in alive}
        self._current = {}

    def end_draw(self) -> None:
        """The draw is over: only its own contexts stay (the next draw continues it, not the
        one before; with the fixed order every later speaker spoke in it). Between draws, while
        the update runs, one draw's keys and values are held, not two."""
        self._previous = {}

    def longest(self, key: SnapshotKey, context: Sequence[int]) -> tuple[int, ContextSource | None]:
        """The longest prefix of ``context`` that snapshot ``key`` read in the last or the
        current draw (at most all but its last token), and where its keys and values lie."""
        best: tuple[int, ContextSource | None] = (0, None)
        for draw in (self._current, self._previous):
            if key in draw:
                found = draw[key].longest(context)
                if found[0] > best[0]:
                    best = found
        return best

    def admits(self, layers: LayerTensors) -> bool:
        """Whether the contexts of a generation call whose cache is ``layers`` may be kept:
        they point into it, so it is held whole, within ``limit_bytes`` in all."""
        held = self._held()
        if id(layers) in held:
            return True
        return sum(map(_nbytes, held.values())) + _nbytes(layers) <= self.limit_bytes

    def keep(self, key: SnapshotKey, context: Sequence[int], source: ContextSource) -> None:
        """Keep that snapshot ``key`` read ``context``, whose keys and values ``source`` holds."""
        self._current.setdefault(key, SpeakerContexts()).keep(context, source)

    def _held(self) -> dict[int, LayerTensors]:
        """The caches the kept contexts point into, by identity (each counted once)."""
        return {
            identity: layers
            for draw in (self._current, self._previous)
            for kept in draw.values()
            for identity, layers in kept.caches.items()
        }

    @property
    def held_bytes(self) -> int:
        """Memory the kept contexts hold: the caches of the generation calls they point into."""
        return sum(map(_nbytes, self._held().values()))

    @property
    def size(self) -> int:
        """Contexts kept, over both draws."""
        return sum(kept.size for draw in (self._current, self._previous) for kept in draw.values())


def _nbytes(layers: LayerTensors) -> int:
    return sum(keys.nbytes + values.nbytes for keys, values in layers)
