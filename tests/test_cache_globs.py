"""ResourceCache and glob collections: the members of each, kept as resources come and go."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ABSENT, UNKNOWN, ResourceCache, Update
from relay.constraints import EMPTY_PARAMS, Locator
from relay.protocol.view import CacheView
from relay.resource import CachedResource
from relay.xds_types import ENDPOINT

EDS = "envoy.config.endpoint.v3.ClusterLoadAssignment"
GLOB = f"xdstp://auth/{EDS}/pool/*"
M1 = f"xdstp://auth/{EDS}/pool/m1"
M2 = f"xdstp://auth/{EDS}/pool/m2"
ZONED = f"xdstp://auth/{EDS}/pool/m3?zone=c"


def res(name: str, version: str = "1") -> CachedResource:
    return CachedResource(ENDPOINT, name, version,
                          discovery_pb2.Resource(name=name, version=version))


def filled(*names: str) -> ResourceCache:
    cache = ResourceCache()
    cache.apply(ENDPOINT, Update([res(n) for n in names]))
    return cache


def test_a_collection_holds_the_names_with_a_variant() -> None:
    cache = filled(M1, M2, ZONED, "classic")
    assert sorted(cache.members(ENDPOINT, GLOB)) == [M1, M2]
    assert cache.members(ENDPOINT, f"xdstp://auth/{EDS}/pool/*?zone=c") == [ZONED]
    cache.apply(ENDPOINT, Update(removed=[M1]))
    assert cache.members(ENDPOINT, GLOB) == [M2]
    cache.apply(ENDPOINT, Update([res(M1, "2")]))
    assert sorted(cache.members(ENDPOINT, GLOB)) == [M1, M2]
    cache.apply(ENDPOINT, Update(removed_variants=[(M1, "")]))
    assert cache.members(ENDPOINT, GLOB) == [M2]


def test_forgetting_a_collection_forgets_its_members_but_those_kept() -> None:
    cache = filled(M1, M2, "classic")
    cache.forget(ENDPOINT, [GLOB], keep={M2})
    assert sorted(cache.names(ENDPOINT)) == ["classic", M2]
    assert cache.members(ENDPOINT, GLOB) == [M2]
    cache.forget(ENDPOINT, [M2])
    assert cache.members(ENDPOINT, GLOB) == []


def test_a_wildcard_ending_keeps_the_members_of_a_kept_collection() -> None:
    cache = filled(M1, ZONED, "classic", "other")
    cache.end_wildcard(ENDPOINT, {GLOB, "classic"})
    assert sorted(cache.names(ENDPOINT)) == ["classic", M1]


def test_a_member_the_answered_collection_lacks_is_absent() -> None:
    cache = filled(M1)
    view = CacheView(cache)
    assert view.lookup(ENDPOINT, M2, EMPTY_PARAMS) is UNKNOWN
    cache.apply(ENDPOINT, Update(answered=[Locator(GLOB, EMPTY_PARAMS)]))
    assert view.lookup(ENDPOINT, M2, EMPTY_PARAMS) is ABSENT
    assert view.lookup(ENDPOINT, M1, EMPTY_PARAMS) == cache.variants(ENDPOINT, M1)[""]  # type: ignore[index]
    assert view.lookup(ENDPOINT, ZONED, EMPTY_PARAMS) is UNKNOWN  # another collection
    assert list(view.members(ENDPOINT, GLOB)) == [M1]
