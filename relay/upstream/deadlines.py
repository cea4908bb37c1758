"""The upstream's deadlines: one typed record per kind, all in one heap.

Five things come due on the origin stream's side, each its own record:
lingering subscriptions of a type may go (:class:`LingerEnds`), a type's
lingering wildcard may go (:class:`WildcardLingerEnds`), locators a response
followed too soon count as answered (:class:`SettleDue`), a type's cache
is reconciled after a reconnect (:class:`ReconcileDue`), and a wildcard the
origin has not answered counts as answered (:class:`WildcardAnswerDue`). A record names a
type and a moment, not a name: every entry of the type due at that moment
shares it, so a client leaving 100,000 names sets one deadline, not 100,000.

Nothing is taken out of the heap when what a deadline was for is cancelled
or moved: when a deadline comes up, the object that set it says whether it
still stands (see :meth:`Deadlines.next`), and one that does not is dropped.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LingerEnds:
    """Subscriptions of ``type_url`` nobody wants any more may go at ``at``."""

    type_url: str
    at: float


@dataclass(frozen=True, slots=True)
class WildcardLingerEnds:
    """The wildcard subscription of ``type_url``, wanted no more, may go at ``at``."""

    type_url: str
    at: float


@dataclass(frozen=True, slots=True)
class SettleDue:
    """Locators of ``type_url`` a response followed too soon count as answered at ``at``."""

    type_url: str
    at: float


@dataclass(frozen=True, slots=True)
class ReconcileDue:
    """What the origin has not confirmed of ``type_url`` since a reconnect goes at ``at``."""

    type_url: str
    at: float


@dataclass(frozen=True, slots=True)
class WildcardAnswerDue:
    """The wildcard of ``type_url``, subscribed on the stream and not answered,
    counts as answered with what the cache holds at ``at``."""

    type_url: str
    at: float


Deadline = LingerEnds | WildcardLingerEnds | SettleDue | ReconcileDue | WildcardAnswerDue


class Deadlines:
    """Every deadline set on one origin stream's side, soonest first."""

    def __init__(self) -> None:
        # (when, order set, the deadline): the order breaks ties, records never compare
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, deadline: Deadline) -> None:
        heapq.heappush(self._heap, (deadline.at, next(self._order), deadline))

    def drop_due(self, now: float) -> None:
        """Forget every deadline up to ``now``: the caller is doing what was due."""
        while self._heap and self._heap[0][0] <= now:
            heapq.heappop(self._heap)

    def next(self, stands: Callable[[Deadline], bool]) -> float | None:
        """When the soonest deadline that ``stands`` comes due; those before it
        that no longer stand (cancelled or moved) are dropped on the way."""
        while self._heap:
            at, _, deadline = self._heap[0]
            if stands(deadline):
                return at
            heapq.heappop(self._heap)
        return None
