"""A wildcard subscriber waits while the cache does not hold the type's
wildcard set (``ResourceView.holds_wildcard``); subscribers by name do not."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import CacheChange, ResourceCache, Update
from relay.protocol.delta import DeltaSubscription
from relay.protocol.sotw import SotwSubscription
from relay.protocol.view import NonceSource
from relay.resource import CachedResource
from relay.upstream.scoped import ScopedCache
from relay.xds_types import CLUSTER, ENDPOINT
from tests.protocol.fakes import FakeView

Sotw = discovery_pb2.DiscoveryRequest
Delta = discovery_pb2.DeltaDiscoveryRequest


def names(plan: object) -> list[str]:
    return [r.name for r in plan.resources]  # type: ignore[attr-defined]


def test_a_sotw_wildcard_waits_for_the_wildcard_and_a_named_subscriber_does_not() -> None:
    view, nonces = FakeView(CLUSTER, {"a": "1"}), NonceSource()
    view.complete = True
    view.wildcard_held = False
    wildcard, named = SotwSubscription(CLUSTER), SotwSubscription(CLUSTER)
    wildcard.on_request(Sotw(type_url=CLUSTER, resource_names=["*"]))
    named.on_request(Sotw(type_url=CLUSTER, resource_names=["a"]))
    assert wildcard.next_response(view, nonces) is None  # (a short CDS: deletions)
    plan = named.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a"]
    view.set("b", "1")
    view.wildcard_held = True
    wildcard.mark_changed(frozenset({"b"}), True)
    plan = wildcard.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a", "b"]


def test_a_delta_wildcard_waits_for_the_wildcard_and_a_named_subscriber_does_not() -> None:
    view, nonces = FakeView(ENDPOINT, {"a": "1"}), NonceSource()
    view.wildcard_held = False
    wildcard, named = DeltaSubscription(ENDPOINT), DeltaSubscription(ENDPOINT)
    wildcard.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["*"]))
    named.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    assert wildcard.next_response(view, nonces) is None
    plan = named.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a"]
    view.wildcard_held = True
    wildcard.mark_changed(frozenset(), True)  # (the answer changed nothing cached)
    plan = wildcard.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a"]


def plain(name: str) -> CachedResource:
    return CachedResource(ENDPOINT, name, "1", discovery_pb2.Resource(name=name, version="1"))


def test_the_cache_holds_the_wildcard_once_answered_until_it_ends() -> None:
    cache = ResourceCache()
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    assert not cache.holds_wildcard(ENDPOINT)  # (nothing yet)
    cache.apply(ENDPOINT, Update([plain("a")]))  # (an answer to a name: synced, not the wildcard)
    assert cache.is_synced(ENDPOINT) and not cache.holds_wildcard(ENDPOINT)
    changes.clear()
    cache.apply(ENDPOINT, Update([plain("b")], complete=True, wildcard_answered=True))
    assert cache.holds_wildcard(ENDPOINT)
    assert changes == [CacheChange(ENDPOINT, frozenset({"b"}), wildcard_held=True)]
    changes.clear()
    cache.apply(ENDPOINT, Update([plain("c")], wildcard_answered=True))
    assert changes == [CacheChange(ENDPOINT, frozenset({"c"}))]  # (held already)
    cache.end_wildcard(ENDPOINT, keep={"a"})
    assert not cache.holds_wildcard(ENDPOINT)
    assert cache.names(ENDPOINT) == ["a"]
    cache.apply(ENDPOINT, Update([plain("d")]))
    assert not cache.holds_wildcard(ENDPOINT)
    changes.clear()
    cache.apply(ENDPOINT, Update(wildcard_answered=True))  # (an empty answer)
    assert cache.holds_wildcard(ENDPOINT)
    assert changes == [CacheChange(ENDPOINT, frozenset(), wildcard_held=True)]
    cache.end_wildcard(ENDPOINT, keep=())
    cache.replace_type(ENDPOINT, [plain("a")])  # (a file source: the whole type)
    assert cache.holds_wildcard(ENDPOINT)


def test_an_origin_wildcards_do_not_go_to_prunes_its_names_and_the_wildcard_stays_held() -> None:
    """With several origins, one that reconnects forgets its names no client
    wants (prune_once ends "its wildcard"): the default origin's wildcard
    set is still held."""
    cache = ResourceCache()
    cache.apply(ENDPOINT, Update([plain("a"), plain("xdstp://other/x")], wildcard_answered=True))
    other = ScopedCache(cache, lambda name: name.startswith("xdstp://other/"))
    other.end_wildcard(ENDPOINT, keep=())
    assert cache.names(ENDPOINT) == ["a"] and cache.holds_wildcard(ENDPOINT)
    default = ScopedCache(cache, lambda name: not name.startswith("xdstp://"),
                          takes_wildcard=True)
    default.end_wildcard(ENDPOINT, keep=())
    assert not cache.holds_wildcard(ENDPOINT)
