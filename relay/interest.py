"""Who wants what: the fleet-wide index of what downstream clients subscribe to.

Two jobs, both driven by the same bookkeeping:

* fan a :class:`~relay.cache.CacheChange` out to exactly the subscribers of
  the changed names (and the wildcard subscribers of the type);
* keep the union of all subscriptions per type, for the upstream to read.

Data flows down (origin, upstream, cache, this index, streams). The one way
back up is :class:`Upward`, wired once (see :mod:`relay.core`): the index
tells it when the union for a type changed, and which names clients need a
fresh copy of; the upstream then reads the union from the index.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from relay.cache import CacheChange
from relay.constraints import EMPTY_PARAMS, Locator, Params


class Subscriber(Hashable, Protocol):
    """Something that holds subscriptions: one downstream stream."""

    def resources_changed(self, type_url: str, names: frozenset[str], everything: bool) -> None:
        """Names of ``type_url`` changed in the cache (``everything``: re-check all)."""

    def heartbeats_received(self, type_url: str, names: frozenset[str]) -> None:
        """The origin sent heartbeats for these names (nothing changed)."""


@dataclass(frozen=True)
class Interest:
    """What one subscriber, or everyone together, wants of one type.

    ``params`` gives the dynamic parameters of the names that have any
    (from a ``ResourceLocator`` or the node); other names have none.
    """

    names: frozenset[str] = frozenset()
    wildcard: bool = False
    params: frozenset[tuple[str, Params]] = frozenset()

    def locators(self) -> frozenset[Locator]:
        """Each name with the parameters it is subscribed with."""
        if not self.params:
            return frozenset(Locator(name) for name in self.names)
        by_name = dict(self.params)
        return frozenset(Locator(name, by_name.get(name, EMPTY_PARAMS)) for name in self.names)


class Upward(Protocol):
    """The one way back up, from the clients to the origin side.

    Both calls only say that something is wanted; whoever receives them reads
    the details from the index when it acts (the upstream does so in a later
    turn of the event loop, never inside a client's request).
    """

    def interest_changed(self, type_url: str) -> None:
        """The union of what clients want of ``type_url`` changed."""

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        """Clients need fresh copies of these resources (do-not-cache: the
        cached copy was fetched before they asked)."""


_NOTHING = Interest()


class InterestIndex:
    """Subscriptions of all downstream streams, by type and name."""

    def __init__(self) -> None:
        self._by_name: dict[str, dict[str, set[Subscriber]]] = defaultdict(dict)
        self._wildcard: dict[str, set[Subscriber]] = defaultdict(set)
        self._locators: dict[str, Counter[Locator]] = defaultdict(Counter)
        self._per_subscriber: dict[Subscriber, dict[str, Interest]] = {}
        self._upward: Upward | None = None

    def link(self, upward: Upward) -> None:
        """Tell ``upward`` of interest changes and re-fetches from now on (one only)."""
        self._upward = upward

    def request_refetch(self, type_url: str, names: frozenset[str]) -> None:
        """A subscriber may not be served these (do-not-cache) from cache: fetch again."""
        if self._upward is not None:
            self._upward.refetch(type_url, names)

    # -- downstream side -------------------------------------------------

    def update(self, subscriber: Subscriber, type_url: str, interest: Interest) -> None:
        """Set what ``subscriber`` wants of ``type_url`` (replacing what it wanted before)."""
        per_type = self._per_subscriber.setdefault(subscriber, {})
        old = per_type.get(type_url, _NOTHING)
        per_type[type_url] = interest
        if old == interest:
            return
        union_changed = False
        by_name = self._by_name[type_url]
        for name in interest.names - old.names:
            by_name.setdefault(name, set()).add(subscriber)
        for name in old.names - interest.names:
            holders = by_name[name]
            holders.discard(subscriber)
            if not holders:
                del by_name[name]
        old_locators, new_locators = old.locators(), interest.locators()
        counts = self._locators[type_url]
        for locator in new_locators - old_locators:
            counts[locator] += 1
            union_changed |= counts[locator] == 1
        for locator in old_locators - new_locators:
            counts[locator] -= 1
            if counts[locator] == 0:
                del counts[locator]
                union_changed = True
        if interest.wildcard != old.wildcard:
            wildcard = self._wildcard[type_url]
            before = bool(wildcard)
            if interest.wildcard:
                wildcard.add(subscriber)
            else:
                wildcard.discard(subscriber)
            union_changed |= before != bool(wildcard)
        if union_changed:
            self._interest_changed(type_url)

    def remove(self, subscriber: Subscriber) -> None:
        """Forget every subscription of a subscriber that went away."""
        for type_url in list(self._per_subscriber.get(subscriber, {})):
            self.update(subscriber, type_url, _NOTHING)
        self._per_subscriber.pop(subscriber, None)

    # -- upstream side ---------------------------------------------------

    def wants_wildcard(self, type_url: str) -> bool:
        """Whether any subscriber wants every resource of the type."""
        return bool(self._wildcard.get(type_url))

    def wanted_locators(self, type_url: str) -> dict[str, frozenset[Params]]:
        """Per name, the distinct parameter sets subscribers use for it (a new dict)."""
        out: dict[str, set[Params]] = {}
        for name, params in self._locators.get(type_url, {}):
            out.setdefault(name, set()).add(params)
        return {name: frozenset(params) for name, params in out.items()}

    def wanted_types(self) -> list[str]:
        """Types with at least one name or wildcard subscription."""
        types = {t for t, names in self._by_name.items() if names}
        types |= {t for t, subs in self._wildcard.items() if subs}
        return sorted(types)

    # -- cache side ------------------------------------------------------

    def on_cache_change(self, change: CacheChange) -> None:
        """Tell each affected subscriber which of its names changed."""
        type_url = change.type_url
        if change.became_synced:
            for subscriber, per_type in list(self._per_subscriber.items()):
                if type_url in per_type:
                    subscriber.resources_changed(type_url, change.names, True)
            return
        for subscriber, names in self._affected(type_url, change.names).items():
            subscriber.resources_changed(type_url, frozenset(names), False)
        for subscriber, names in self._affected(type_url, change.heartbeats).items():
            subscriber.heartbeats_received(type_url, frozenset(names))

    def _affected(self, type_url: str, names: frozenset[str]) -> dict[Subscriber, set[str]]:
        """Subscribers of any of ``names`` (and wildcard subscribers), with their names."""
        affected: dict[Subscriber, set[str]] = {}
        if not names:
            return affected
        by_name = self._by_name.get(type_url, {})
        for name in names:
            for subscriber in by_name.get(name, ()):
                affected.setdefault(subscriber, set()).add(name)
        for subscriber in self._wildcard.get(type_url, ()):
            affected[subscriber] = set(names)
        return affected

    def _interest_changed(self, type_url: str) -> None:
        if self._upward is not None:
            self._upward.interest_changed(type_url)
