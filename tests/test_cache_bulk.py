"""ResourceCache.apply's bulk path: a plain resource made from its encoding
(relay.upstream.bulk) of a name new to the cache gets a record in one loop.
What readers and listeners see is what the general path (``_upsert``)
gives, and the general path is not called for it."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.cache import ABSENT, CacheChange, ResourceCache, Update
from relay.constraints import EMPTY_PARAMS, Locator, compile_constraints
from relay.encoding import length_delimited_field
from relay.resource import CachedResource
from relay.xds_types import ENDPOINT
from tests.builders import endpoints
from tests.variants import CANARY

MEMBER = "xdstp://auth/envoy.config.endpoint.v3.ClusterLoadAssignment/pool/m1"


def made(name: str, version: str = "1", general: bool = False,
         **fields: Any) -> CachedResource:
    """A resource as the origin sent it; a plain one as the bulk check makes
    it (from its encoding), unless ``general``."""
    resource = discovery_pb2.Resource(name=name, version=version, resource=any_pb2.Any(
        type_url=ENDPOINT, value=endpoints(name, 80).SerializeToString()), **fields)
    if general or fields:
        return CachedResource(ENDPOINT, name, version, resource)
    return CachedResource.from_encoded(ENDPOINT, name, version, length_delimited_field(
        2, resource.SerializeToString()), received=1.0)


def scenario(general: bool) -> tuple[ResourceCache, list[CacheChange], list[frozenset[str]]]:
    """The same writes, with the plain resources taken in bulk or not."""
    cache = ResourceCache(clock=lambda: 100.0)
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    results = []
    cache.members(ENDPOINT, MEMBER.rsplit("/", 1)[0] + "/*")  # (the collection index built)
    results.append(cache.apply(ENDPOINT, Update(removed=["gone"], answered=[
        Locator("answered", EMPTY_PARAMS)])))
    error = discovery_pb2.ResourceError(resource_name=discovery_pb2.ResourceName(name="erred"))
    results.append(cache.apply(ENDPOINT, Update(errors=[error])))
    canary = CachedResource(ENDPOINT, "c", "1", made("c").resource, compile_constraints(CANARY))
    upserts = [made(name, general=general)
               for name in ("new", "gone", "answered", "erred", MEMBER, "twice")]
    upserts += [made("twice", "2", general=general), canary,
                made("aliased", general=general, aliases=["al"]),
                made("ttl", general=general, ttl={"seconds": 5})]
    results.append(cache.apply(ENDPOINT, Update(upserts, answered=[
        Locator("new", EMPTY_PARAMS)])))
    results.append(cache.apply(ENDPOINT, Update([made("new", "3", general=general)])))
    return cache, changes, results


def state(cache: ResourceCache) -> list[object]:
    names = ["new", "gone", "answered", "erred", MEMBER, "twice", "c", "aliased", "al", "ttl",
             "never"]
    found = []
    for name in names:
        variants = cache.variants(ENDPOINT, name)
        found.append((name, variants if not isinstance(variants, dict) else
                      {k: (v.name, v.version) for k, v in variants.items()},
                      cache.is_answered(ENDPOINT, Locator(name, EMPTY_PARAMS)),
                      cache.error(ENDPOINT, name, EMPTY_PARAMS)))
    return [found, cache.members(ENDPOINT, MEMBER.rsplit("/", 1)[0] + "/*"),
            cache.has_errors(ENDPOINT), cache.expiry(ENDPOINT, "ttl", ""),
            cache.counts(), sorted(cache.names(ENDPOINT))]


def test_the_bulk_path_leaves_what_the_general_path_leaves() -> None:
    bulk_cache, bulk_changes, bulk_results = scenario(general=False)
    general_cache, general_changes, general_results = scenario(general=True)
    assert state(bulk_cache) == state(general_cache)
    assert bulk_changes == general_changes
    assert bulk_results == general_results
    assert bulk_cache.variants(ENDPOINT, "gone") != ABSENT  # (it came back)
    assert not bulk_cache.has_errors(ENDPOINT)  # (the error cleared)


def test_a_plain_resource_of_a_new_name_is_written_without_the_general_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    upsert = ResourceCache._upsert

    def counting(self: ResourceCache, type_url: str, entry: Any, resource: CachedResource,
                 *args: Any) -> None:
        calls.append(resource.name)
        upsert(self, type_url, entry, resource, *args)

    monkeypatch.setattr(ResourceCache, "_upsert", counting)
    cache = ResourceCache()
    cache.apply(ENDPOINT, Update(removed=["gone"]))
    names = [f"r{i}" for i in range(1_000)]
    changed = cache.apply(ENDPOINT, Update([made(name) for name in names] + [
        made("gone"), made("r7", "2"), made("ttl", ttl={"seconds": 5})]))
    assert changed == frozenset([*names, "gone", "ttl"])
    # only a name the cache knew, a name twice and a resource with a TTL go the general way
    assert calls == ["gone", "r7", "ttl"]
    resent = cache.apply(ENDPOINT, Update([made(name) for name in names[:10]]))
    assert resent == {"r7"}  # (the others resent unchanged: no news; r7 was at "2")
    assert len(calls) == 13
