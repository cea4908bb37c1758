"""gRFC A71's rule, without I/O: which server next, what counts as cached, what a
probe asks; and what a client with fallback servers says of itself before it runs."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ResourceCache, Update
from relay.constraints import EMPTY_PARAMS, Locator, compile_constraints, params_of
from relay.interest import Interest, InterestIndex
from relay.resource import CachedResource
from relay.telemetry import new_metrics, prometheus_provider
from relay.upstream.backoff import Backoff
from relay.upstream.client import UpstreamClient, UpstreamStatus
from relay.upstream.dial import Dialer
from relay.upstream.fallback import (
    Failover,
    Next,
    is_cached,
    probe_requests,
    watches_uncached,
)
from relay.upstream.state import DEFAULT_MAX_REQUEST_SIZE, UpstreamState
from relay.xds_types import CLUSTER, ENDPOINT, LISTENER
from tests.builders import cluster, pack
from tests.upstream.test_upstream_state import Sub
from tests.variants import CANARY

NODE = base_pb2.Node(id="relay")


def cached(type_url: str, name: str, constraints: discovery_pb2.DynamicParameterConstraints
           | None = None) -> CachedResource:
    resource = discovery_pb2.Resource(name=name, version="v1", resource=pack(cluster(name)))
    if constraints is None:
        return CachedResource.from_origin(type_url, name, resource)
    return CachedResource.from_origin(type_url, name, resource, compile_constraints(constraints))


# -- which server next ----------------------------------------------------------


def test_it_starts_on_the_primary() -> None:
    failover = Failover(3)
    assert failover.in_use == 0 and not failover.on_fallback


def test_an_unreachable_server_with_something_uncached_gives_way_to_the_next_at_once() -> None:
    failover = Failover(3)
    assert failover.after_attempt(answered=False, uncached=True) == Next(1, wait=False)
    assert failover.on_fallback
    assert failover.after_attempt(answered=False, uncached=True) == Next(2, wait=False)


def test_after_the_last_server_the_primary_again_after_a_backoff_step() -> None:
    failover = Failover(2)
    failover.after_attempt(answered=False, uncached=True)
    assert failover.after_attempt(answered=False, uncached=True) == Next(0, wait=True)
    assert not failover.on_fallback


def test_an_unreachable_server_with_everything_cached_is_retried_after_a_backoff_step() -> None:
    failover = Failover(3)
    assert failover.after_attempt(answered=False, uncached=False) == Next(0, wait=True)
    failover.after_attempt(answered=False, uncached=True)
    assert failover.after_attempt(answered=False, uncached=False) == Next(1, wait=True)


def test_a_server_that_answered_is_reconnected_to_whatever_is_cached() -> None:
    failover = Failover(3)
    assert failover.after_attempt(answered=True, uncached=True) == Next(0, wait=False)
    failover.after_attempt(answered=False, uncached=True)
    assert failover.after_attempt(answered=True, uncached=True) == Next(1, wait=False)


def test_a_lone_server_never_moves() -> None:
    failover = Failover(1)
    assert failover.after_attempt(answered=False, uncached=True) == Next(0, wait=True)


def test_the_primary_answering_brings_it_back_from_any_fallback() -> None:
    failover = Failover(3)
    failover.after_attempt(answered=False, uncached=True)
    failover.after_attempt(answered=False, uncached=True)
    assert failover.primary_answered()
    assert failover.in_use == 0
    assert not failover.primary_answered()  # already there


def test_an_origin_has_a_server() -> None:
    with pytest.raises(ValueError, match="at least one server"):
        Failover(0)


def test_a_fresh_backoff_starts_over_with_the_same_steps() -> None:
    backoff = Backoff(1.0, 8.0, rand=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    probes = backoff.fresh()
    assert [probes.next_delay() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert backoff.next_delay() == 8.0  # the first goes on where it was


# -- what counts as cached (A71: "does not exist" counts) ---------------------------


def test_a_name_is_cached_when_present_or_absent_and_not_when_unknown() -> None:
    cache = ResourceCache()
    cache.apply(CLUSTER, Update([cached(CLUSTER, "a")], removed=["gone"]))
    assert is_cached(cache, CLUSTER, "a", EMPTY_PARAMS)
    assert is_cached(cache, CLUSTER, "gone", EMPTY_PARAMS)
    assert not is_cached(cache, CLUSTER, "never-sent", EMPTY_PARAMS)
    assert not is_cached(cache, ENDPOINT, "a", EMPTY_PARAMS)  # a type never answered


def test_a_name_the_origin_answered_without_sending_it_is_cached() -> None:
    cache = ResourceCache()
    cache.apply(CLUSTER, Update(answered=[Locator("quiet")]))
    assert is_cached(cache, CLUSTER, "quiet", EMPTY_PARAMS)


def test_a_variant_is_cached_for_the_parameters_it_fits() -> None:
    cache = ResourceCache()
    cache.apply(CLUSTER, Update([cached(CLUSTER, "a", CANARY)]))
    canary, prod = params_of({"env": "canary"}), params_of({"env": "prod"})
    assert is_cached(cache, CLUSTER, "a", canary)
    assert not is_cached(cache, CLUSTER, "a", prod)
    cache.apply(CLUSTER, Update(answered=[Locator("a", prod)]))
    assert is_cached(cache, CLUSTER, "a", prod)  # the origin has none for prod


def test_what_clients_watch_is_looked_up_whole_or_by_the_names_that_changed() -> None:
    cache, index = ResourceCache(), InterestIndex()
    cache.apply(CLUSTER, Update([cached(CLUSTER, "a")]))
    index.update(Sub(), CLUSTER, Interest(frozenset({"a"})))
    assert not watches_uncached(cache, index)
    index.update(Sub(), CLUSTER, Interest(frozenset({"b"})))
    assert watches_uncached(cache, index)
    assert not watches_uncached(cache, index, {CLUSTER: {"a"}})
    assert watches_uncached(cache, index, {CLUSTER: {"a", "b"}})
    assert not watches_uncached(cache, index, {CLUSTER: {"no-longer-wanted"}})


def test_a_wildcard_watch_is_cached_once_the_type_has_a_resource_or_is_complete() -> None:
    cache, index = ResourceCache(), InterestIndex()
    index.update(Sub(), CLUSTER, Interest(wildcard=True))
    assert watches_uncached(cache, index)
    cache.apply(CLUSTER, Update(complete=True))  # the origin has no clusters at all
    assert not watches_uncached(cache, index)
    index.update(Sub(), LISTENER, Interest(wildcard=True))
    assert watches_uncached(cache, index, {LISTENER: set()})
    cache.apply(LISTENER, Update([cached(LISTENER, "l")]))
    assert not watches_uncached(cache, index)


def test_nothing_watched_is_nothing_uncached() -> None:
    assert not watches_uncached(ResourceCache(), InterestIndex())


# -- what a probe of the primary asks ---------------------------------------------------


def test_a_probe_asks_one_name_per_type_preferring_one_the_cache_holds() -> None:
    cache, index = ResourceCache(), InterestIndex()
    cache.apply(CLUSTER, Update([cached(CLUSTER, "held")]))
    index.update(Sub(), CLUSTER, Interest(frozenset({"asked", "held"})))
    index.update(Sub(), ENDPOINT, Interest(frozenset({"e2", "e1"})))
    first, second = probe_requests(NODE, cache, index, DEFAULT_MAX_REQUEST_SIZE)
    assert (first.type_url, list(first.resource_names_subscribe)) == (CLUSTER, ["held"])
    assert first.node.id == "relay" and not first.initial_resource_versions
    assert (second.type_url, list(second.resource_names_subscribe)) == (ENDPOINT, ["e1"])
    assert not second.HasField("node")


def test_a_probe_of_a_wildcard_type_asks_a_cached_name_else_the_wildcard() -> None:
    cache, index = ResourceCache(), InterestIndex()
    index.update(Sub(), CLUSTER, Interest(wildcard=True))
    [request] = probe_requests(NODE, cache, index, DEFAULT_MAX_REQUEST_SIZE)
    assert list(request.resource_names_subscribe) == ["*"]
    cache.apply(CLUSTER, Update([cached(CLUSTER, "d"), cached(CLUSTER, "c")]))
    [request] = probe_requests(NODE, cache, index, DEFAULT_MAX_REQUEST_SIZE)
    assert list(request.resource_names_subscribe) == ["c"]


def test_a_probe_asks_a_name_with_the_parameters_a_client_wants_it_with() -> None:
    cache, index = ResourceCache(), InterestIndex()
    index.update(Sub(), CLUSTER, Interest(frozenset({"a"}),
                                          params={"a": params_of({"env": "canary"})}))
    [request] = probe_requests(NODE, cache, index, DEFAULT_MAX_REQUEST_SIZE)
    [locator] = request.resource_locators_subscribe
    assert locator.name == "a" and dict(locator.dynamic_parameters) == {"env": "canary"}


def test_nothing_watched_is_nothing_to_probe_with() -> None:
    assert probe_requests(NODE, ResourceCache(), InterestIndex(), DEFAULT_MAX_REQUEST_SIZE) == []


# -- the client's status and series, before it runs ----------------------------------


def test_a_client_states_its_servers_and_starts_its_series_at_the_primary() -> None:
    provider, registry = prometheus_provider()
    cache, index = ResourceCache(), InterestIndex()
    client = UpstreamClient(
        [Dialer("primary:18000"), Dialer("backup:18000", key="upstream.fallback[0]")],
        UpstreamState(NODE, cache), index, Backoff(), new_metrics(provider, registry),
        origin="east.example.com", wall=lambda: 1_700_000_000.0)
    status = client.status()
    assert (status.server, status.on_fallback, status.connected, status.since) == (
        "primary:18000", False, False, None)
    assert client.target == "primary:18000" and client.dialer.key == "upstream"
    assert status.to_json() == {
        "origin": "east.example.com", "server": "primary:18000", "fallback": 0,
        "servers": ["primary:18000", "backup:18000"], "connected": False, "since": None,
        "reconnects": 0, "last_response": {}}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in registry.collect() for s in family.samples
               if s.name.startswith("xds_relay_upstream")}
    origin = ("origin", "east.example.com")
    assert samples == {
        ("xds_relay_upstream_connected", (origin,)): 0,
        ("xds_relay_upstream_reconnects_total", (origin,)): 0,
        ("xds_relay_upstream_server", (("fallback", "0"), origin,
                                       ("server", "primary:18000"))): 1,
        ("xds_relay_upstream_server", (("fallback", "1"), origin,
                                       ("server", "backup:18000"))): 0}


def test_a_status_says_which_fallback_is_in_use_and_when_each_type_last_came() -> None:
    status = UpstreamStatus("default", ("primary:18000", "backup:18000"), 1, True,
                            1_700_000_000.0, 3, {ENDPOINT: 1_700_000_001.0, CLUSTER: 5.0})
    assert (status.server, status.on_fallback) == ("backup:18000", True)
    assert status.to_json()["last_response"] == {
        "Cluster": 5.0, "ClusterLoadAssignment": 1_700_000_001.0}


def test_invariant_38_a_new_server_is_declared_nothing_once_and_learned_afresh() -> None:
    """After a switch of server the relay declares no versions (the same
    version string may mean other content there), and forgets what it had
    learned of the last server's handling of declarations; the stream after
    declares again."""
    from relay.upstream.responses import Unusable, parse_response
    from relay.upstream.state import UpstreamState
    from relay.xds_types import ENDPOINT
    from tests.builders import endpoints, pack

    cache, index = ResourceCache(), InterestIndex()
    state = UpstreamState(base_pb2.Node(id="relay"), cache)

    class Holder:
        def resources_changed(self, type_url: str, names: frozenset[str],
                              everything: bool) -> None:
            pass

    state.on_connect(index, 0)
    index.update(Holder(), ENDPOINT, Interest(frozenset({"a"})))
    state.on_interest_changed(ENDPOINT, index, 0)
    # an origin resending what it was told is unchanged: taken as ignoring declarations
    first = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce="1")
    first.resources.add(name="a", version="", resource=pack(endpoints("a", 1)))
    checked = parse_response(first)
    assert not isinstance(checked, Unusable)
    state.on_response(checked, index, 0)
    assert not state.trusts_declarations(ENDPOINT)
    state.on_disconnect()
    state.on_server_changed()
    [request] = state.on_connect(index, 1)
    assert list(request.resource_names_subscribe) == ["a"]
    assert dict(request.initial_resource_versions) == {}
    assert state.trusts_declarations(ENDPOINT)
    state.on_disconnect()
    [again] = state.on_connect(index, 2)
    assert list(again.initial_resource_versions) == ["a"]
