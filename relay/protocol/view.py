"""The read-only view of the cache that protocol state objects consult."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from cachetools import LRUCache
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ABSENT, UNKNOWN, Missing, ResourceCache
from relay.constraints import UNCONSTRAINED, Locator, Params, select_variant
from relay.resource import CachedResource

log = logging.getLogger("relay.variants")

# How many conflicting sets of variants are remembered as logged.
_LOGGED_SIZE = 4096


class ResourceView(Protocol):
    """What a protocol state object may ask about resources."""

    def is_synced(self, type_url: str) -> bool:
        """Whether the origin has answered for this type at least once."""

    def lookup(self, type_url: str, name: str, params: Params) -> CachedResource | Missing:
        """The variant of ``name`` a subscriber with ``params`` gets, or why there is none."""

    def names(self, type_url: str) -> Iterable[str]:
        """Every name of the type that exists."""

    def has_errors(self, type_url: str) -> bool:
        """Whether the origin reports an error for any resource of the type."""

    def error(self, type_url: str, name: str,
              params: Params) -> discovery_pb2.ResourceError | None:
        """The origin's current error for the variant a subscriber with ``params`` gets."""


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

    def lookup(self, type_url: str, name: str, params: Params) -> CachedResource | Missing:
        found = self._cache.variants(type_url, name)
        if isinstance(found, Missing):
            if found is UNKNOWN and params and \
                    self._cache.is_answered(type_url, Locator(name, params)):
                # The origin answered this subscriber's locator with no variant
                # (the ones it had may have gone with their last subscriber).
                # Plain names keep waiting for the origin to say "removed".
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

    def names(self, type_url: str) -> Iterable[str]:
        return self._cache.names(type_url)

    def has_errors(self, type_url: str) -> bool:
        return self._cache.has_errors(type_url)

    def error(self, type_url: str, name: str,
              params: Params) -> discovery_pb2.ResourceError | None:
        return self._cache.error(type_url, name, params)

    def _ambiguous(self, type_url: str, name: str, variant_keys: frozenset[str]) -> None:
        if self._on_ambiguous is not None:
            self._on_ambiguous(type_url, name)
        key = (type_url, name, variant_keys)
        if self._logged.get(key) is None:
            self._logged[key] = True
            log.warning("origin error: several variants of %s %r match the same parameters "
                        "(%s); serving the one whose constraints mention the most keys",
                        type_url.rsplit(".", 1)[-1], name, ", ".join(sorted(variant_keys)))


class NonceSource:
    """Nonces unique within one stream (shared by all its types)."""

    def __init__(self) -> None:
        self._counter = 0

    def next(self) -> str:
        self._counter += 1
        return str(self._counter)
