"""The read-only view of the cache that protocol state objects consult, and
what one client sees of it (:class:`ScopedView`: without the Secrets it may
not have)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Protocol

from cachetools import LRUCache
from envoy.service.discovery.v3 import discovery_pb2

from relay.authorization import SecretScope
from relay.cache import ABSENT, UNKNOWN, Missing, ResourceCache
from relay.constraints import UNCONSTRAINED, Locator, Params, select_variant
from relay.interest import InterestChange
from relay.protocol.xdstp import PREFIX, collection_of
from relay.resource import CachedResource

log = logging.getLogger("relay.variants")

# How many conflicting sets of variants are remembered as logged.
_LOGGED_SIZE = 4096


class ResourceView(Protocol):
    """What a protocol state object may ask about resources."""

    def is_synced(self, type_url: str) -> bool:
        """Whether the origin has answered for this type at least once."""

    def holds_wildcard(self, type_url: str) -> bool:
        """Whether a wildcard subscriber of the type may be answered now: the
        origin has answered the wildcard, and it has not ended since (see
        :meth:`relay.cache.ResourceCache.holds_wildcard`)."""

    def lookup(self, type_url: str, name: str, params: Params) -> CachedResource | Missing:
        """The variant of ``name`` a subscriber with ``params`` gets, or why there is none."""

    def served_to_all(self, type_url: str, names: Iterable[str]) -> Mapping[str, CachedResource]:
        """Those of ``names`` that every subscriber gets as the same resource,
        whatever its parameters, with it (what :meth:`lookup` gives each); the
        others may be left out. For a response of thousands of names: one
        call, not one per name."""

    def serves_every(self, type_url: str, names: AbstractSet[str]) -> bool:
        """Whether :meth:`served_to_all` gives each of ``names`` (false where it
        cannot tell without a step per name). One call, in C."""

    def unknown_to_all(self, type_url: str, names: Sequence[str]) -> int:
        """How many of ``names`` (distinct) :meth:`lookup` gives UNKNOWN
        for, whatever the subscriber's parameters, at least: together with
        :meth:`served_to_all`, a page whose every name is one or the other is
        plain to see (see ``SubscriptionState._all_new``). One call, in C:
        not one per name."""

    def names(self, type_url: str) -> Iterable[str]:
        """Every name of the type that exists."""

    def members(self, type_url: str, glob: str) -> Iterable[str]:
        """The names that exist in the glob collection ``glob`` (canonical)."""

    def has_errors(self, type_url: str) -> bool:
        """Whether the origin reports an error for any resource of the type."""

    def error(self, type_url: str, name: str,
              params: Params) -> discovery_pb2.ResourceError | None:
        """The origin's current error for the variant a subscriber with ``params`` gets."""


class ClientView(ResourceView, Protocol):
    """What one client sees of the cache, and what it may subscribe to."""

    def admit(self, type_url: str, change: InterestChange) -> InterestChange:
        """The part of a subscription change that is about resources the client
        may see: what the interest index, and so the origin, hears of."""

    def scope_of(self, type_url: str) -> Hashable:
        """What narrows the client's view of ``type_url`` (None: nothing);
        clients with equal scopes see the same resources of it."""


AmbiguityListener = Callable[[str, str], None]


class CacheView:
    """A :class:`ResourceView` over a :class:`ResourceCache`.

    Each subscriber gets the variant whose constraints its parameters match.
    Several matching variants are an origin error; the choice is the
    deterministic one of :func:`relay.constraints.select_variant`, reported
    to ``on_ambiguous(type_url, name)`` and logged once per set of variants.
    """

    def __init__(self, cache: ResourceCache,
                 on_ambiguous: AmbiguityListener | None = None) -> None:
        self._cache = cache
        self._on_ambiguous = on_ambiguous
        # (type, name, variant keys) already logged: bounded, as origins may
        # churn through names (least recently logged forgotten first)
        self._logged: LRUCache[tuple[str, str, frozenset[str]], bool] = LRUCache(_LOGGED_SIZE)

    def is_synced(self, type_url: str) -> bool:
        return self._cache.is_synced(type_url)

    def holds_wildcard(self, type_url: str) -> bool:
        return self._cache.holds_wildcard(type_url)

    def lookup(self, type_url: str, name: str, params: Params) -> CachedResource | Missing:
        # A name holding one plain resource (most names): read from the
        # cache's table of them, with no dict of its variants made for the call
        # (4.3-5.1 -> 2.7-3.1 ms for 10,000 names looked up one by one).
        served = self._cache.served_one(type_url, name)
        if served is not None:
            return served
        found = self._cache.variants(type_url, name)
        if isinstance(found, Missing):
            if found is UNKNOWN and params and \
                    self._cache.is_answered(type_url, Locator(name, params)):
                # The origin answered this subscriber's locator with no variant
                # (the ones it had may have gone with their last subscriber).
                # Plain names keep waiting for the origin to say "removed".
                return ABSENT
            if found is UNKNOWN and name.startswith(PREFIX):
                # The origin answered the collection, and this was not in it.
                glob = collection_of(name)
                if glob is not None and self._cache.is_answered(type_url, Locator(glob, params)):
                    return ABSENT
            return found
        if len(found) == 1:
            [only] = found.values()
            if only.constraints is UNCONSTRAINED or only.constraints.matches(params):
                return only
        else:
            choice, ambiguous = select_variant(
                ((r.constraints, r) for r in found.values()), params)
            if ambiguous:
                self._ambiguous(type_url, name, frozenset(found))
            if choice is not None:
                return choice
        if self._cache.is_complete(type_url) or \
                self._cache.is_answered(type_url, Locator(name, params)):
            return ABSENT
        return UNKNOWN

    def served_to_all(self, type_url: str, names: Iterable[str]) -> Mapping[str, CachedResource]:
        return self._cache.served_to_all(type_url, names)

    def serves_every(self, type_url: str, names: AbstractSet[str]) -> bool:
        return self._cache.serves_every(type_url, names)

    def unknown_to_all(self, type_url: str, names: Sequence[str]) -> int:
        # (no record, no alias, no glob answered: ``lookup``'s every ABSENT needs one)
        return self._cache.unknown_to_all(type_url, names)

    def names(self, type_url: str) -> Iterable[str]:
        return self._cache.names(type_url)

    def members(self, type_url: str, glob: str) -> Iterable[str]:
        return self._cache.members(type_url, glob)

    def has_errors(self, type_url: str) -> bool:
        return self._cache.has_errors(type_url)

    def error(self, type_url: str, name: str,
              params: Params) -> discovery_pb2.ResourceError | None:
        return self._cache.error(type_url, name, params)

    def admit(self, type_url: str, change: InterestChange) -> InterestChange:
        return change  # every resource is there for everyone

    def scope_of(self, type_url: str) -> Hashable:
        return None

    def _ambiguous(self, type_url: str, name: str, variant_keys: frozenset[str]) -> None:
        if self._on_ambiguous is not None:
            self._on_ambiguous(type_url, name)
        key = (type_url, name, variant_keys)
        if self._logged.get(key) is None:
            self._logged[key] = True
            log.warning("origin error: several variants of %s %r match the same parameters "
                        "(%s); serving the one whose constraints mention the most keys",
                        type_url.rsplit(".", 1)[-1], name, ", ".join(sorted(variant_keys)))


class ScopedView:
    """A view in which the resources of ``type_url`` outside ``scope`` do not
    exist: what a client that may not have every Secret sees.

    A name outside the scope is absent (a delta client subscribing to it is
    told it was removed; a SotW client gets nothing), whether or not the
    cache holds it, and so is a name that is an alias of a resource outside
    it; the origin's errors about them are not passed on; a wildcard finds
    only names inside it. :meth:`admit` drops those names from the client's
    subscriptions, so that a client cannot make the relay subscribe to
    Secrets it may not have. A client whose scope is empty knows all of the
    type there is for it, nothing: the type is synced for it from the start.
    """

    __slots__ = ("_scope", "_type_url", "_view")  # one per stream

    def __init__(self, view: ResourceView, type_url: str, scope: SecretScope) -> None:
        self._view = view
        self._type_url = type_url
        self._scope = scope

    def is_synced(self, type_url: str) -> bool:
        return self._view.is_synced(type_url) or \
            (type_url == self._type_url and self._scope.is_empty)

    def holds_wildcard(self, type_url: str) -> bool:
        return self._view.holds_wildcard(type_url) or \
            (type_url == self._type_url and self._scope.is_empty)

    def lookup(self, type_url: str, name: str, params: Params) -> CachedResource | Missing:
        if type_url != self._type_url:
            return self._view.lookup(type_url, name, params)
        if not self._scope.may_read(name):
            return ABSENT
        found = self._view.lookup(type_url, name, params)
        if isinstance(found, CachedResource) and found.name != name and \
                not self._scope.may_read(found.name):
            return ABSENT  # an alias of a Secret the client may not have
        return found

    def served_to_all(self, type_url: str, names: Iterable[str]) -> Mapping[str, CachedResource]:
        served = self._view.served_to_all(type_url, names)
        if type_url != self._type_url:
            return served
        # (a resource under its own name: never an alias of one outside the scope)
        return {name: found for name, found in served.items() if self._scope.may_read(name)}

    def serves_every(self, type_url: str, names: AbstractSet[str]) -> bool:
        # (a name outside the scope is absent: not told apart in C)
        return type_url != self._type_url and self._view.serves_every(type_url, names)

    def unknown_to_all(self, type_url: str, names: Sequence[str]) -> int:
        if type_url == self._type_url:
            return 0  # (a name outside the scope is absent: not told apart in C)
        return self._view.unknown_to_all(type_url, names)

    def names(self, type_url: str) -> Iterable[str]:
        names = self._view.names(type_url)
        if type_url != self._type_url:
            return names
        return [name for name in names if self._scope.may_read(name)]

    def members(self, type_url: str, glob: str) -> Iterable[str]:
        members = self._view.members(type_url, glob)
        if type_url != self._type_url:
            return members
        return [name for name in members if self._scope.may_read(name)]

    def has_errors(self, type_url: str) -> bool:
        return self._view.has_errors(type_url)

    def error(self, type_url: str, name: str,
              params: Params) -> discovery_pb2.ResourceError | None:
        if type_url == self._type_url and not self._scope.may_read(name):
            return None
        return self._view.error(type_url, name, params)

    def admit(self, type_url: str, change: InterestChange) -> InterestChange:
        if type_url != self._type_url:
            return change
        may_read = self._scope.may_read
        return InterestChange(
            {name: params for name, params in change.added.items() if may_read(name)},
            {name: params for name, params in change.removed.items() if may_read(name)},
            # No Secret at all: a wildcard would only make the origin send them.
            None if self._scope.is_empty else change.wildcard,
            frozenset(filter(may_read, change.globs)))

    def scope_of(self, type_url: str) -> Hashable:
        return self._scope if type_url == self._type_url else None


class NonceSource:
    """Nonces unique within one stream (shared by all its types)."""

    def __init__(self) -> None:
        self._counter = 0

    def next(self) -> str:
        self._counter += 1
        return str(self._counter)
