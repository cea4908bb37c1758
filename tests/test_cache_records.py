"""ResourceCache records: a record's errors and TTL deadlines are the shared
empty dicts until it has one, so a big client's cached names cost no dict for
either; whatever is written goes to a record's own dict, and the shared ones
stay empty (counted: which records own a dict, and what the shared ones hold)."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from relay import cache as cache_module
from relay.cache import ABSENT, ResourceCache, Update
from relay.constraints import EMPTY_PARAMS, params_of
from relay.resource import CachedResource
from relay.xds_types import CLUSTER
from tests.allocations import traced
from tests.test_cache import FakeClock, env, res, resource_error, with_ttl


def owned(cache: ResourceCache) -> tuple[list[str], list[str]]:
    """The names whose record has an errors dict of its own, and a deadlines one."""
    records = cache._types[CLUSTER].records
    return (sorted(n for n, r in records.items() if r.errors is not cache_module._NO_ERRORS),
            sorted(n for n, r in records.items() if r.expires is not cache_module._NO_EXPIRES))


def test_only_records_written_an_error_or_a_ttl_own_a_dict_for_it() -> None:
    clock = FakeClock()
    cache = ResourceCache(clock)
    cache.apply(CLUSTER, Update([res(f"n{i}", "1") for i in range(100)]))
    cache.apply(CLUSTER, Update([with_ttl("t", "1", 10), res("v", "1", env("prod"))],
                                errors=[resource_error("e", "canary")], removed=["gone"],
                                heartbeats=[("n1", "", "1")]))
    assert owned(cache) == (["e"], ["t"])
    assert cache.error(CLUSTER, "e", params_of({"env": "canary"})) is not None
    assert cache.next_expiry() == 110.0
    # what pops and clears them (an arrival, a removal, a lapse) reads the shared ones
    cache.apply(CLUSTER, Update([res("e", "1", env("canary")), res("n2", "2")],
                                removed=["n3"], removed_variants=[("v", env("prod").key)]))
    cache.forget_variants(CLUSTER, "n4", [], [EMPTY_PARAMS])
    clock.now = 200.0
    cache.expire()
    assert cache.variants(CLUSTER, "t") is ABSENT and cache.error(
        CLUSTER, "e", params_of({"env": "canary"})) is None
    assert cache_module._NO_ERRORS == {} and cache_module._NO_EXPIRES == {}


def test_a_cached_name_costs_no_empty_dicts() -> None:
    resources = [CachedResource(CLUSTER, f"n{i}", "1", discovery_pb2.Resource())
                 for i in range(2_000)]
    cache = ResourceCache()
    with traced() as held:
        cache.apply(CLUSTER, Update(resources))
        per_name = held() / len(resources)
    # a record (slots), its variants dict and its slots in the records dict
    # and the plain one (served_to_all's): ~315 B; two empty dicts more were ~420
    assert per_name < 350, per_name
    assert owned(cache) == ([], [])
