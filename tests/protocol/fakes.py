"""An in-memory ResourceView for driving protocol state without a cache."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from operator import countOf

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ABSENT, UNKNOWN, Missing
from relay.constraints import Params
from relay.protocol.xdstp import collection_of
from relay.resource import CachedResource, note_do_not_cache


class FakeView:
    """One type's resources by name -> version; deleted names are ABSENT."""

    def __init__(self, type_url: str, versions: dict[str, str]) -> None:
        self.type_url = type_url
        self.synced = True
        self.complete = False  # like a wildcard-fed cache: missing means absent
        # False: the type's wildcard ended and has yet to be answered again
        self.wildcard_held = True
        self._resources: dict[str, CachedResource] = {}
        self._absent: set[str] = set()
        # the origin's current error per name
        self.errors: dict[str, discovery_pb2.ResourceError] = {}
        for name, version in versions.items():
            self.set(name, version)

    def set(self, name: str, version: str, body: bytes = b"", ttl: int | None = None,
            do_not_cache: bool = False) -> None:
        """Create or change ``name``; ``body`` stands for its content (its size
        for the response's); ``ttl`` in seconds; ``do_not_cache`` marks it so,
        noted as the relay's cache notes it."""
        self._absent.discard(name)
        resource = discovery_pb2.Resource(name=name, version=version)
        if body:
            resource.resource.type_url = self.type_url
            resource.resource.value = body
        if ttl is not None:
            resource.ttl.seconds = ttl
        if do_not_cache:
            resource.cache_control.do_not_cache = True
            note_do_not_cache()
        self._resources[name] = CachedResource(self.type_url, name, version, resource)

    def delete(self, name: str) -> None:
        self._resources.pop(name, None)
        self._absent.add(name)

    def is_synced(self, type_url: str) -> bool:
        return self.synced

    def holds_wildcard(self, type_url: str) -> bool:
        return self.wildcard_held

    def lookup(self, type_url: str, name: str, params: Params) -> CachedResource | Missing:
        if name in self._resources:
            return self._resources[name]
        return ABSENT if name in self._absent or self.complete else UNKNOWN

    def served_to_all(self, type_url: str, names: Iterable[str]) -> dict[str, CachedResource]:
        return {name: self._resources[name] for name in names if name in self._resources}

    def serves_every(self, type_url: str, names: AbstractSet[str]) -> bool:
        return self.synced and self._resources.keys() >= names

    def unknown_to_all(self, type_url: str, names: Sequence[str]) -> int:
        if self.complete:
            return 0
        return len(names) - countOf(map(self._resources.__contains__, names), True) - \
            countOf(map(self._absent.__contains__, names), True)

    def has_errors(self, type_url: str) -> bool:
        return bool(self.errors)

    def error(self, type_url: str, name: str,
              params: Params) -> discovery_pb2.ResourceError | None:
        return self.errors.get(name)

    def names(self, type_url: str) -> Iterable[str]:
        return list(self._resources)

    def members(self, type_url: str, glob: str) -> Iterable[str]:
        return [name for name in self._resources if collection_of(name) == glob]
