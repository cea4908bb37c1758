"""What to subscribe on the origin stream: what clients want, what lingers.

Subscriptions are *locators*: a name plus the dynamic parameters a client
needs it with (none for a plain name). The relay subscribes the distinct
locators its clients use (read from a :class:`Demand`), except where a cached
variant, obtained through a locator already subscribed, also fits the new
parameters: that client is served from cache with no upstream round trip. A
subscription nobody wants any more *lingers* ``linger`` seconds before it
goes (see "linger" in ``docs/glossary.md``). What is no longer subscribed is
dropped from the cache, which nothing would keep current.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Container, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Protocol

from relay.constraints import EMPTY_PARAMS, Locator, Params
from relay.protocol.xdstp import PREFIX, collection_of
from relay.upstream.deadlines import Deadlines, LingerEnds, WildcardLingerEnds
from relay.upstream.requests import SubscriptionChange
from relay.upstream.scoped import OriginCache

Locators = dict[str, Set[Params]]
#: The parameter sets of a plain name as subscribed: one frozenset for every
#: such name (a set of its own costs 216 bytes a name; a client of 100,000
#: names would cost 20 MiB here alone).
_PLAIN: frozenset[Params] = frozenset({EMPTY_PARAMS})


class Demand(Protocol):
    """What downstream clients want of the origin: all the upstream reads from below.

    :class:`relay.interest.InterestIndex` provides it.
    """

    def wanted_types(self) -> list[str]:
        """Types with at least one name or wildcard subscription."""

    def wanted_locators(self, type_url: str) -> dict[str, frozenset[Params]]:
        """Per name, the distinct parameter sets clients want it with (a new dict)."""

    def wanted_params(self, type_url: str, name: str) -> frozenset[Params]:
        """The distinct parameter sets clients want one name with (empty: none)."""

    def wants_wildcard(self, type_url: str) -> bool:
        """Whether any client wants every resource of the type."""

    def origin_refused(self, type_url: str, names: Iterable[str], message: str) -> int:
        """The origin refused a subscription carrying ``names``: clients may
        not have them (for a while); how many clients held them."""


def subscribes(cache: OriginCache, type_url: str, name: str, names: Container[str]) -> bool:
    """Whether a subscription to ``names`` covers the cached ``name``, by itself,
    by the glob collection it is a member of, or by an alias."""
    return name in names or in_collection(name, names) or \
        any(alias in names for alias in cache.aliases_of(type_url, name))


def in_collection(name: str, names: Container[str]) -> bool:
    """Whether ``name`` is a member of a glob collection among ``names`` (see
    :mod:`relay.protocol.xdstp`): what the origin sends of a collection is
    as subscribed as the collection."""
    if not name.startswith(PREFIX):
        return False  # a classic name
    glob = collection_of(name)
    return glob is not None and glob in names


def locators_of(locators: Mapping[str, Iterable[Params]]) -> Iterator[Locator]:
    return (Locator(name, params) for name, params_set in locators.items()
            for params in params_set)


def _params_order(params: Params) -> list[tuple[str, str]]:
    return sorted(params)


@dataclass
class TypeSubscription:
    """What the origin has been asked for of one type on the current stream."""

    locators: dict[str, frozenset[Params]] = field(default_factory=dict)
    wildcard: bool = False

    def count(self) -> int:
        """Locators subscribed, a wildcard counting one."""
        # A snapshot (list(...)): the OTLP exporter calls this from its own thread.
        return sum(len(params) for params in list(self.locators.values())) + self.wildcard


class Lingering:
    """What nobody wants any more, per type, until it may go: per name and
    parameter set, and the wildcard.

    One :class:`LingerEnds` stands for every entry of a type ending at the
    same time; ``_ending`` counts them, so that the deadline stands exactly
    as long as one of them is left.
    """

    def __init__(self, deadlines: Deadlines) -> None:
        self._deadlines = deadlines
        self._until: dict[str, dict[str, dict[Params, float]]] = {}
        self._ending: dict[str, Counter[float]] = {}
        self._wildcard: dict[str, float] = {}

    def types(self) -> set[str]:
        """Types with something lingering."""
        return {*(t for t, names in self._until.items() if names), *self._wildcard}

    def of_type(self, type_url: str) -> Mapping[str, Mapping[Params, float]]:
        """Per name, each lingering parameter set with when it may go (do not keep)."""
        return self._until.get(type_url, {})

    def wildcard_lingers(self, type_url: str, now: float) -> bool:
        return self._wildcard.get(type_url, -math.inf) > now

    def start(self, type_url: str, name: str, params: Params, until: float) -> None:
        """``name`` with ``params`` may go at ``until``, unless it already lingers."""
        waiting = self._until.setdefault(type_url, {}).setdefault(name, {})
        if params in waiting:
            return
        waiting[params] = until
        ending = self._ending.get(type_url)
        if ending is None:
            ending = self._ending[type_url] = Counter()
        ending[until] += 1
        if ending[until] == 1:  # the first entry ending then
            self._deadlines.add(LingerEnds(type_url, until))

    def start_wildcard(self, type_url: str, until: float) -> None:
        if type_url not in self._wildcard:
            self._wildcard[type_url] = until
            self._deadlines.add(WildcardLingerEnds(type_url, until))

    def cancel(self, type_url: str, name: str, wanted: Iterable[Params]) -> None:
        """Clients want ``name`` with ``wanted`` again: those stay subscribed."""
        lingering = self._until.get(type_url, {})
        waiting = lingering.get(name)
        if waiting:
            for params in wanted:
                if params in waiting:
                    self._end(type_url, waiting.pop(params))
            if not waiting:
                del lingering[name]  # the type's map stays: callers may be reading it

    def cancel_wildcard(self, type_url: str) -> None:
        self._wildcard.pop(type_url, None)

    def expire(self, type_url: str, now: float, names: Collection[str] | None) -> None:
        """Forget what of ``names`` (None: all) may go by ``now``."""
        lingering = self._until.get(type_url, {})
        for name in list(lingering) if names is None else [n for n in names if n in lingering]:
            waiting = lingering[name]
            for params in [p for p, until in waiting.items() if until <= now]:
                self._end(type_url, waiting.pop(params))
            if not waiting:
                del lingering[name]
        if not lingering:
            self._until.pop(type_url, None)
        if self._wildcard.get(type_url, math.inf) <= now:
            del self._wildcard[type_url]

    def due(self, now: float) -> list[tuple[str, list[str]]]:
        """Per type with something that may go by ``now``: the names that may."""
        found = []
        for type_url in sorted(self.types()):
            names = [name for name, waiting in self._until.get(type_url, {}).items()
                     if min(waiting.values()) <= now]
            if names or self._wildcard.get(type_url, math.inf) <= now:
                found.append((type_url, names))
        return found

    def stands(self, deadline: LingerEnds | WildcardLingerEnds) -> bool:
        if isinstance(deadline, WildcardLingerEnds):
            return self._wildcard.get(deadline.type_url) == deadline.at
        ending = self._ending.get(deadline.type_url)
        return ending is not None and ending[deadline.at] > 0

    def _end(self, type_url: str, until: float) -> None:
        ending = self._ending[type_url]
        ending[until] -= 1
        if not ending[until]:
            del ending[until]
            if not ending:
                del self._ending[type_url]


class Targets:
    """Per type, the locators (and wildcard) subscribed on the current stream,
    brought in line with what clients want and what lingers."""

    def __init__(self, cache: OriginCache, linger: float, deadlines: Deadlines) -> None:
        self.cache = cache
        self.linger = linger
        self.lingering = Lingering(deadlines)
        self._subscribed: dict[str, TypeSubscription] = {}
        # names re-subscribed to get a fresh do-not-cache copy, per type
        self._refetching: dict[str, set[str]] = {}
        # whether what the current stream does not subscribe to was forgotten
        self._pruned = True

    def subscription(self, type_url: str) -> TypeSubscription | None:
        return self._subscribed.get(type_url)

    def has_subscriptions(self) -> bool:
        return bool(self._subscribed)

    def subscription_counts(self) -> dict[str, int]:
        """Per type URL: locators subscribed on the stream (a wildcard counts one)."""
        return {type_url: sub.count() for type_url, sub in list(self._subscribed.items())}

    # -- a new stream ---------------------------------------------------------

    def new_stream(self, demand: Demand) -> list[str]:
        """A new stream, nothing subscribed on it yet: the types to subscribe."""
        self._subscribed = {}
        self._pruned = False
        return sorted({*demand.wanted_types(), *self.lingering.types()})

    def resubscribe(self, type_url: str, demand: Demand, now: float) -> TypeSubscription | None:
        """Subscribe on a new stream everything wanted of the type (None: nothing is)."""
        target, wildcard = self.target(type_url, demand, now, None)
        if not target and not wildcard:
            return None
        sub = self._subscribed[type_url] = TypeSubscription(
            {n: _PLAIN if ps == _PLAIN else frozenset(ps) for n, ps in target.items()}, wildcard)
        return sub

    def prune_once(self) -> None:
        """The origin answered a new stream: forget what its subscription does
        not cover (once per stream). The origin will neither confirm nor
        remove it, so it would go stale (names a restored snapshot holds that
        no client wants). A type the cache held whole is not whole without a
        wildcard subscription."""
        if self._pruned:
            return
        self._pruned = True
        for type_url in self.cache.type_urls():
            sub = self._subscribed.get(type_url, TypeSubscription())
            if sub.wildcard:
                continue
            names = self.cache.names(type_url)
            keep = {name for name in names
                    if subscribes(self.cache, type_url, name, sub.locators)}
            if len(keep) < len(names) or self.cache.is_complete(type_url):
                self.cache.end_wildcard(type_url, keep)

    # -- interest ---------------------------------------------------------------

    def interest_changed(self, type_url: str, demand: Demand, now: float,
                         names: Collection[str] | None) -> Collection[str]:
        """Whatever of ``names`` (None: every name) nobody wants any more
        starts lingering; what is wanted again stops. The names to sync."""
        sub = self._subscribed.get(type_url, TypeSubscription())
        lingering = self.lingering.of_type(type_url)
        if names is None:
            names = {*sub.locators, *demand.wanted_locators(type_url), *lingering}
        until = now + self.linger
        for name in names:
            wanted = demand.wanted_params(type_url, name)
            subscribed = sub.locators.get(name)
            if subscribed:
                for params in subscribed - wanted:
                    self.lingering.start(type_url, name, params, until)
            if wanted and name in lingering:
                self.lingering.cancel(type_url, name, wanted)
        if demand.wants_wildcard(type_url):
            self.lingering.cancel_wildcard(type_url)
        elif sub.wildcard:
            self.lingering.start_wildcard(type_url, until)
        return names

    def sync(self, type_url: str, demand: Demand, now: float,
             names: Collection[str] | None = None) -> SubscriptionChange:
        """Bring the subscription of ``names`` (None: every name) and of the
        wildcard in line with what is needed: the change, and what is no
        longer subscribed dropped from the cache."""
        self.lingering.expire(type_url, now, names)
        target, wildcard = self.target(type_url, demand, now, names)
        sub = self._subscribed.setdefault(type_url, TypeSubscription())
        subscribe, unsubscribe = _replace(sub, target, names is None)
        for name, dropped in unsubscribe.items():
            self._forget(type_url, name, target.get(name, set()), dropped, wildcard,
                         sub.locators)
        was_wildcard = sub.wildcard
        if was_wildcard and not wildcard:
            self.cache.end_wildcard(type_url, sub.locators.keys())
        sub.wildcard = wildcard
        if not sub.locators and not sub.wildcard:
            del self._subscribed[type_url]
        return SubscriptionChange(type_url, subscribe, unsubscribe,
                                  wildcard=None if was_wildcard == wildcard else wildcard)

    def refetch(self, type_url: str, names: frozenset[str]) -> SubscriptionChange | None:
        """Subscribe these names again so the origin resends them (do-not-cache).

        A name already being refetched is not asked for twice; the next
        response for the type ends the wait (:meth:`responded`).
        """
        sub = self._subscribed.get(type_url)
        if sub is None:
            return None
        asking = self._refetching.setdefault(type_url, set())
        fresh = {n: set(sub.locators[n]) for n in names if n in sub.locators and n not in asking}
        if not fresh:
            return None
        asking.update(fresh)
        return SubscriptionChange(type_url, fresh)

    def responded(self, type_url: str) -> None:
        """A response of the type: what was being refetched has come (or will not)."""
        self._refetching.pop(type_url, None)

    # -- targets ------------------------------------------------------------------

    def target(self, type_url: str, demand: Demand, now: float,
               names: Collection[str] | None) -> tuple[Locators, bool]:
        """The locators to be subscribed to: what is needed and not served
        from cache already, for ``names`` (None: every name), and whether the
        wildcard is."""
        lingering = self.lingering.of_type(type_url)
        wildcard = demand.wants_wildcard(type_url) or \
            self.lingering.wildcard_lingers(type_url, now)
        needed: dict[str, frozenset[Params]]
        if names is None:
            needed = demand.wanted_locators(type_url)
            names = {*needed, *lingering}
        else:
            needed = {name: demand.wanted_params(type_url, name) for name in names}
        for name in names:
            waiting = lingering.get(name)
            if waiting:
                live = {params for params, until in waiting.items() if until > now}
                needed[name] = needed.get(name, frozenset()) | live
        current = self._subscribed.get(type_url, TypeSubscription()).locators
        target: Locators = {}
        for name, params_set in needed.items():
            subscribed = current.get(name)
            if subscribed is None and len(params_set) == 1:
                # The common case: one plain name, new. Nothing subscribed
                # for it can serve it from cache: it is subscribed as it is.
                target[name] = params_set
                continue
            chosen = set() if subscribed is None else set(subscribed & params_set)
            for params in sorted(params_set - chosen, key=_params_order):
                if not self._served_from_cache(type_url, name, params, chosen):
                    chosen.add(params)
            target[name] = chosen
        return target, wildcard

    def _served_from_cache(self, type_url: str, name: str, params: Params,
                           chosen: set[Params]) -> bool:
        """Whether a cached variant, obtained through ``chosen``, also fits ``params``."""
        if not chosen:
            return False  # nothing subscribed for the name brings a variant
        found = self.cache.variants(type_url, name)
        if not isinstance(found, Mapping):
            return False
        return any(variant.constraints.matches(params) and
                   any(variant.constraints.matches(q) for q in chosen)
                   for variant in found.values())

    def _forget(self, type_url: str, name: str, kept: Set[Params], dropped: Set[Params],
                wildcard: bool, still_subscribed: Container[str]) -> None:
        """Drop cached variants that no remaining subscription keeps current."""
        if wildcard:
            return  # the wildcard subscription still brings every variant
        if not kept:
            self.cache.forget(type_url, [name], keep=still_subscribed)
            return
        found = self.cache.variants(type_url, name)
        keep = [key for key, variant in found.items()
                if any(variant.constraints.matches(p) for p in kept)] \
            if isinstance(found, Mapping) else []
        self.cache.forget_variants(type_url, name, keep, dropped)


def _replace(sub: TypeSubscription, target: Locators, whole: bool) -> tuple[Locators, Locators]:
    """Subscribe ``target`` for its names (``whole``: and nothing else): what
    is subscribed and what unsubscribed, by name."""
    scope = {*target, *sub.locators} if whole else set(target)
    subscribe: Locators = {}
    unsubscribe: Locators = {}
    for name in sorted(scope):
        new, old = target.get(name, set()), sub.locators.get(name, frozenset())
        if new - old:
            subscribe[name] = new - old
        if old - new:
            unsubscribe[name] = old - new
        if new:
            sub.locators[name] = _PLAIN if new == _PLAIN else frozenset(new)
        else:
            sub.locators.pop(name, None)
    return subscribe, unsubscribe
