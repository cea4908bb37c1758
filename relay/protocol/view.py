"""The read-only view of the cache that protocol state objects consult."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from relay.cache import ABSENT, Missing, ResourceCache
from relay.resource import CachedResource


class ResourceView(Protocol):
    """What a protocol state object may ask about resources."""

    def is_synced(self, type_url: str) -> bool:
        """Whether the origin has answered for this type at least once."""

    def lookup(self, type_url: str, name: str) -> CachedResource | Missing:
        """The variant of ``name`` this subscriber should see, or why there is none."""

    def names(self, type_url: str) -> Iterable[str]:
        """Every name of the type that exists."""


class CacheView:
    """A :class:`ResourceView` over a :class:`ResourceCache`.

    Picks the variant with no constraints (``variant_key == ""``), the one
    every subscriber gets.
    """

    def __init__(self, cache: ResourceCache) -> None:
        self._cache = cache

    def is_synced(self, type_url: str) -> bool:
        return self._cache.is_synced(type_url)

    def lookup(self, type_url: str, name: str) -> CachedResource | Missing:
        found = self._cache.variants(type_url, name)
        if isinstance(found, Missing):
            return found
        return found.get("", ABSENT)

    def names(self, type_url: str) -> Iterable[str]:
        return self._cache.names(type_url)


class NonceSource:
    """Nonces unique within one stream (shared by all its types)."""

    def __init__(self) -> None:
        self._counter = 0

    def next(self) -> str:
        self._counter += 1
        return str(self._counter)
