"""After a reconnect, the cache ends up holding exactly the origin's current set.

UpstreamState on its own (no I/O): an origin that honours
``initial_resource_versions`` reports removals itself; one that ignores them
(istiod) resends what it has, and the relay removes the rest once the origin
has answered.
"""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ABSENT, CacheChange, ResourceCache
from relay.interest import Interest, InterestIndex
from relay.upstream.resync import PATIENCE
from relay.upstream.state import SETTLE_GRACE, InitialVersions, UpstreamState
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints, pack
from tests.upstream.test_upstream_state import Sub, receive, response


def make(initial_versions: InitialVersions = "auto", max_request_size: int = 1 << 20
         ) -> tuple[UpstreamState, InterestIndex, ResourceCache]:
    cache, index = ResourceCache(), InterestIndex()
    state = UpstreamState(base_pb2.Node(id="relay"), cache,
                          max_request_size=max_request_size, initial_versions=initial_versions)
    return state, index, cache


def clusters(state: UpstreamState, index: InterestIndex, nonce: str, *names: str,
             version: str = "", now: float = 0.0) -> list[discovery_pb2.DeltaDiscoveryRequest]:
    return receive(state, response(CLUSTER, nonce, *((n, version, cluster(n))
                                                  for n in names)), index, now).requests


def synced_wildcard(initial_versions: InitialVersions = "auto", version: str = ""
                    ) -> tuple[UpstreamState, InterestIndex, ResourceCache, list[CacheChange]]:
    """Clusters a, b, c cached through a wildcard subscription; then the stream dropped."""
    state, index, cache = make(initial_versions)
    state.on_connect(index, 0)
    index.update(Sub(), CLUSTER, Interest(wildcard=True))
    state.on_interest_changed(CLUSTER, index, 0)
    clusters(state, index, "1", "a", "b", "c", version=version)
    state.on_disconnect()
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    return state, index, cache, changes


def test_an_origin_without_versions_is_taken_to_ignore_initial_versions() -> None:
    state, _, _, _ = synced_wildcard(version="")
    assert not state.trusts_declarations(CLUSTER)
    honest, _, _, _ = synced_wildcard(version="v1")
    assert honest.trusts_declarations(CLUSTER)


def test_what_an_ignoring_origin_does_not_resend_is_removed_once_it_has_answered() -> None:
    state, index, cache, changes = synced_wildcard(version="")
    state.on_connect(index, 10.0)
    clusters(state, index, "2", "a", "c", now=10.05)  # b was deleted while the relay was away
    assert sorted(cache.names(CLUSTER)) == ["a", "b", "c"]  # the rest may still be coming
    assert changes == []  # the resend of a and c is quiet
    assert state.next_deadline() == pytest.approx(10.05 + SETTLE_GRACE)
    state.on_tick(index, 10.05 + SETTLE_GRACE - 0.01)
    assert sorted(cache.names(CLUSTER)) == ["a", "b", "c"]
    state.on_tick(index, 10.05 + SETTLE_GRACE)
    assert sorted(cache.names(CLUSTER)) == ["a", "c"]
    assert cache.variants(CLUSTER, "b") is ABSENT
    assert changes == [CacheChange(CLUSTER, frozenset({"b"}))]
    assert state.next_deadline() is None


def test_everything_resent_unchanged_removes_and_pushes_nothing() -> None:
    state, index, cache, changes = synced_wildcard(version="")
    state.on_connect(index, 10.0)
    clusters(state, index, "2", "a", "b", "c", now=10.05)
    state.on_tick(index, 11.0)
    assert sorted(cache.names(CLUSTER)) == ["a", "b", "c"]
    assert changes == []


def test_a_slow_origin_gets_the_grace_after_its_first_answer_for_the_rest() -> None:
    state, index, cache, _ = synced_wildcard(version="")
    state.on_connect(index, 10.0)
    clusters(state, index, "2", "a", now=20.0)
    clusters(state, index, "3", "b", now=20.0 + SETTLE_GRACE - 0.01)
    assert sorted(cache.names(CLUSTER)) == ["a", "b", "c"]
    state.on_tick(index, 20.0 + SETTLE_GRACE)
    assert sorted(cache.names(CLUSTER)) == ["a", "b"]


def test_an_honouring_origin_is_trusted_with_what_it_was_told() -> None:
    state, index, cache, changes = synced_wildcard(version="v1")
    [request] = state.on_connect(index, 10.0)
    assert dict(request.initial_resource_versions) == {"a": "v1", "b": "v1", "c": "v1"}
    # It reports b removed and sends nothing about a and c (unchanged).
    receive(state, response(CLUSTER, "2", removed=("b",)), index, 10.05)
    state.on_tick(index, 11.0)
    assert sorted(cache.names(CLUSTER)) == ["a", "c"]
    assert changes == [CacheChange(CLUSTER, frozenset({"b"}))]


def test_a_resend_of_a_declared_resource_shows_the_origin_ignores_declarations() -> None:
    state, index, cache, _ = synced_wildcard(version="v1")
    state.on_connect(index, 10.0)
    clusters(state, index, "2", "a", "c", version="v1", now=10.05)
    assert not state.trusts_declarations(CLUSTER)
    state.on_tick(index, 11.0)
    assert sorted(cache.names(CLUSTER)) == ["a", "c"]


def test_the_setting_overrides_what_the_origin_seems_to_do() -> None:
    # "honoured": declared resources stay even when the origin sends no versions.
    state, index, cache, _ = synced_wildcard("honoured", version="")
    state.on_connect(index, 10.0)
    clusters(state, index, "2", "a", now=10.05)
    state.on_tick(index, 11.0)
    assert sorted(cache.names(CLUSTER)) == ["a", "b", "c"]
    # "ignored": what is not resent goes, even from an origin with versions.
    state, index, cache, _ = synced_wildcard("ignored", version="v1")
    state.on_connect(index, 10.0)
    clusters(state, index, "2", "a", version="v1", now=10.05)
    state.on_tick(index, 11.0)
    assert sorted(cache.names(CLUSTER)) == ["a"]


def test_what_did_not_fit_in_the_declaration_must_be_resent() -> None:
    state, index, cache = make("honoured", max_request_size=16 * 1024)
    state.on_connect(index, 0)
    index.update(Sub(), CLUSTER, Interest(wildcard=True))
    state.on_interest_changed(CLUSTER, index, 0)
    names = [f"cluster-{i:04d}-" + "x" * 40 for i in range(600)]
    clusters(state, index, "1", *names, version="v1")
    state.on_disconnect()
    requests = state.on_connect(index, 10.0)
    declared = set(requests[0].initial_resource_versions)
    assert 0 < len(declared) < len(names)
    assert all(r.ByteSize() <= 16 * 1024 for r in requests)
    # The origin sends what it was not told of (it thinks the relay lacks it),
    # except one name it deleted meanwhile.
    undeclared = [n for n in names if n not in declared]
    clusters(state, index, "2", *undeclared[1:], version="v1", now=10.05)
    state.on_tick(index, 11.0)
    assert sorted(cache.names(CLUSTER)) == sorted(set(names) - {undeclared[0]})


def test_a_name_the_origin_reports_an_error_for_keeps_its_cached_copy() -> None:
    state, index, cache, _ = synced_wildcard(version="")
    state.on_connect(index, 10.0)
    failing = response(CLUSTER, "2", ("a", "", cluster("a")), ("c", "", cluster("c")))
    failing.resource_errors.add(error_detail={"code": 13, "message": "internal"}).\
        resource_name.name = "b"
    receive(state, failing, index, 10.05)
    state.on_tick(index, 11.0)
    assert sorted(cache.names(CLUSTER)) == ["a", "b", "c"]


def test_named_subscriptions_are_reconciled_too() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), ENDPOINT, Interest(frozenset({"a", "b"})))
    state.on_interest_changed(ENDPOINT, index, 0)
    receive(state, response(ENDPOINT, "1", ("a", "", endpoints("a", 1)),
                            ("b", "", endpoints("b", 2))), index, 0)
    state.on_disconnect()
    state.on_connect(index, 10.0)
    receive(state, response(ENDPOINT, "2", ("a", "", endpoints("a", 1))), index, 10.05)
    state.on_tick(index, 11.0)
    assert sorted(cache.names(ENDPOINT)) == ["a"]


def test_nothing_is_reconciled_before_the_origin_answers_or_after_the_stream_drops() -> None:
    state, index, cache, _ = synced_wildcard(version="")
    state.on_connect(index, 10.0)
    assert state.next_deadline() is None  # not answered: no timer
    state.on_tick(index, 100.0)
    assert sorted(cache.names(CLUSTER)) == ["a", "b", "c"]
    clusters(state, index, "2", "a", now=100.05)
    state.on_disconnect()  # dropped before the grace: the next stream starts over
    assert state.next_deadline() is None
    state.on_tick(index, 200.0)
    assert sorted(cache.names(CLUSTER)) == ["a", "b", "c"]


def test_content_changes_under_empty_versions_get_new_derived_versions() -> None:
    state, index, cache, changes = synced_wildcard(version="")
    [before] = [r for r in cache.resources(CLUSTER) if r.name == "a"]
    state.on_connect(index, 10.0)
    receive(state, response(CLUSTER, "2", ("a", "", cluster("a", timeout_s=9))), index, 10.05)
    [after] = [r for r in cache.resources(CLUSTER) if r.name == "a"]
    assert after.version != before.version and after.derived_version
    assert after.origin_version == "" and len(after.version) == 16
    assert changes == [CacheChange(CLUSTER, frozenset({"a"}))]
    # The version is in what delta clients are sent.
    assert discovery_pb2.Resource.FromString(after.resource.SerializeToString()).version == \
        after.version
    assert after.body == pack(cluster("a", timeout_s=9))


def subscribed_by_name(count: int) -> tuple[UpstreamState, InterestIndex, ResourceCache,
                                            list[str], list[CacheChange]]:
    """``count`` endpoints cached from istiod (no versions), requests of 16 KiB
    at most; then the stream dropped."""
    state, index, cache = make(max_request_size=16 * 1024)
    names = [f"ep-{i:04d}-" + "x" * 40 for i in range(count)]
    state.on_connect(index, 0)
    index.update(Sub(), ENDPOINT, Interest(frozenset(names)))
    for request in state.on_interest_changed(ENDPOINT, index, 0):
        answer(state, index, request, names, 0.0)
    state.on_tick(index, 1.0)
    state.on_disconnect()
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    return state, index, cache, names, changes


def answer(state: UpstreamState, index: InterestIndex,
           request: discovery_pb2.DeltaDiscoveryRequest, held: list[str], now: float) -> None:
    """istiod's answer to ``request``: those of its names it ``held``."""
    have = set(held)
    receive(state, response(ENDPOINT, f"n{now}", *((n, "", endpoints(n, 1))
                                                   for n in request.resource_names_subscribe
                                                   if n in have)), index, now)


def test_the_reconcile_waits_for_the_answer_to_each_request_of_the_subscription() -> None:
    """istiod answers a reconnect's first request (a few names and most of the
    declared versions) at once and the rest later: what the later requests
    subscribe is not taken as gone meanwhile, however long after the first
    answer they are answered."""
    state, index, cache, names, changes = subscribed_by_name(600)
    first, *later = state.on_connect(index, 10.0)
    assert later and all(r.resource_names_subscribe for r in later)
    still_there = names[1:]  # (the origin deleted the first meanwhile)
    answer(state, index, first, still_there, 10.05)
    state.on_tick(index, 10.05 + 3 * SETTLE_GRACE)
    for i, request in enumerate(later):
        answer(state, index, request, still_there, 12.0 + i)
        state.on_tick(index, 12.0 + i + SETTLE_GRACE / 2)
    assert len(cache.names(ENDPOINT)) == len(names) and changes == []
    last = 12.0 + len(later) - 1
    assert state.next_deadline() == last + SETTLE_GRACE
    state.on_tick(index, last + SETTLE_GRACE)
    assert sorted(cache.names(ENDPOINT)) == sorted(still_there)
    assert [change.names for change in changes] == [frozenset(names[:1])]


def test_an_origin_that_leaves_a_request_unanswered_is_reconciled_all_the_same() -> None:
    state, index, cache, names, changes = subscribed_by_name(600)
    first, *_ = state.on_connect(index, 10.0)
    answer(state, index, first, names, 10.05)
    patience = 10.05 + PATIENCE * SETTLE_GRACE
    state.on_tick(index, patience - 0.01)
    assert len(cache.names(ENDPOINT)) == len(names) and changes == []
    state.on_tick(index, patience)
    assert sorted(cache.names(ENDPOINT)) == sorted(first.resource_names_subscribe)
