"""UpstreamState: interest -> requests, responses -> cache + ACK/NACK, without I/O."""

from __future__ import annotations

from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ABSENT, ResourceCache
from relay.constraints import Locator, params_of
from relay.interest import Interest, InterestIndex
from relay.upstream.responses import Unusable, parse_response
from relay.upstream.state import (
    SETTLE_GRACE,
    Acked,
    Demand,
    Nacked,
    ResponseOutcome,
    UpstreamState,
)
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints, pack
from tests.variants import CANARY


@dataclass(eq=False)
class Sub:
    def __hash__(self) -> int:
        return id(self)

    def resources_changed(self, type_url: str, names: frozenset[str], everything: bool) -> None:
        pass


def make(linger: float = 0.0) -> tuple[UpstreamState, InterestIndex, ResourceCache]:
    cache, index = ResourceCache(), InterestIndex()
    return UpstreamState(base_pb2.Node(id="relay"), cache, linger), index, cache


def response(type_url: str, nonce: str, *items: tuple[str, str, object],
             removed: tuple[str, ...] = ()) -> discovery_pb2.DeltaDiscoveryResponse:
    out = discovery_pb2.DeltaDiscoveryResponse(type_url=type_url, nonce=nonce,
                                               removed_resources=list(removed))
    for name, version, msg in items:
        out.resources.add(name=name, version=version, resource=pack(msg))  # type: ignore[arg-type]
    return out


def receive(state: UpstreamState, message: discovery_pb2.DeltaDiscoveryResponse,
            demand: Demand, now: float = 0.0) -> ResponseOutcome:
    """A response from the origin, parsed and handed to the state as the client does."""
    checked = parse_response(message)
    if isinstance(checked, Unusable):
        return state.on_unusable(checked)
    return state.on_response(checked, demand, now)


def test_interest_becomes_subscribe_and_unsubscribe_requests() -> None:
    state, index, _ = make()
    state.on_connect(index, 0)
    sub = Sub()
    index.update(sub, ENDPOINT, Interest(frozenset({"a", "b"})))
    [request] = state.on_interest_changed(ENDPOINT, index, 0)
    assert list(request.resource_names_subscribe) == ["a", "b"]
    assert request.node.id == "relay"  # the first request of the stream carries the node
    index.update(sub, ENDPOINT, Interest(frozenset({"b"})))
    [request] = state.on_interest_changed(ENDPOINT, index, 0)
    assert list(request.resource_names_unsubscribe) == ["a"]
    assert not request.HasField("node")


def test_wildcard_is_subscribed_explicitly() -> None:
    state, index, _ = make()
    state.on_connect(index, 0)
    index.update(Sub(), CLUSTER, Interest(wildcard=True))
    [request] = state.on_interest_changed(CLUSTER, index, 0)
    assert list(request.resource_names_subscribe) == ["*"]


def test_reconnect_resends_subscriptions_with_initial_versions() -> None:
    state, index, _cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), ENDPOINT, Interest(frozenset({"a", "b"})))
    state.on_interest_changed(ENDPOINT, index, 0)
    receive(state, response(ENDPOINT, "1", ("a", "v1", endpoints("a", 1))), index)
    state.on_disconnect()
    [request] = state.on_connect(index, 1)
    assert list(request.resource_names_subscribe) == ["a", "b"]
    assert dict(request.initial_resource_versions) == {"a": "v1"}
    assert request.node.id == "relay"


def test_no_requests_while_disconnected_but_interest_is_remembered() -> None:
    state, index, _ = make()
    index.update(Sub(), ENDPOINT, Interest(frozenset({"a"})))
    assert state.on_interest_changed(ENDPOINT, index, 0) == []
    [request] = state.on_connect(index, 0)
    assert list(request.resource_names_subscribe) == ["a"]


def test_good_response_is_cached_and_acked() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), CLUSTER, Interest(wildcard=True))
    state.on_interest_changed(CLUSTER, index, 0)
    [ack] = receive(state, response(CLUSTER, "n1", ("a", "v1", cluster("a"))), index).requests
    assert ack.response_nonce == "n1" and not ack.HasField("error_detail")
    assert [r.version for r in cache.resources(CLUSTER)] == ["v1"]
    assert cache.variants(CLUSTER, "other") is ABSENT  # wildcard: the set is complete


def test_a_usable_response_is_acked_with_what_the_cache_was_told() -> None:
    state, index, _ = make()
    state.on_connect(index, 0)
    index.update(Sub(), ENDPOINT, Interest(frozenset({"a"})))
    state.on_interest_changed(ENDPOINT, index, 0)
    assert not state.synced
    outcome = receive(state, response(ENDPOINT, "1", ("a", "v1", endpoints("a", 1)),
                                      ("zz", "1", endpoints("zz", 1))), index, SETTLE_GRACE)
    assert isinstance(outcome, Acked) and state.synced
    [ack] = outcome.requests
    assert ack.response_nonce == "1" and not ack.HasField("error_detail")
    assert outcome.update is not None
    assert [(r.name, r.version) for r in outcome.update.upserts] == [("a", "v1")]
    assert list(outcome.update.answered) == ["a"]  # (a plain name given as its name)


def test_an_unusable_response_is_nacked_with_its_reason_and_nothing_of_it_is_kept() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), CLUSTER, Interest(wildcard=True))
    state.on_interest_changed(CLUSTER, index, 0)
    duplicate = response(CLUSTER, "7", ("a", "1", cluster("a")), ("a", "2", cluster("a")))
    outcome = receive(state, duplicate, index)
    assert isinstance(outcome, Nacked)
    assert outcome.reason == "resource 'a' appears more than once"
    [nack] = outcome.requests
    assert (nack.response_nonce, nack.error_detail.message) == ("7", outcome.reason)
    assert not state.synced and list(cache.resources(CLUSTER)) == []


def test_a_response_for_a_type_no_longer_subscribed_is_acked_and_not_cached() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    outcome = receive(state, response(ENDPOINT, "1", ("a", "1", endpoints("a", 1))), index)
    assert isinstance(outcome, Acked) and outcome.update is None
    [ack] = outcome.requests
    assert ack.response_nonce == "1" and not ack.HasField("error_detail")
    assert list(cache.names(ENDPOINT)) == []


def test_an_origins_state_built_twice_shares_nothing_but_what_it_is_given() -> None:
    # Two origins over one demand: each its own cache, stream, settling and deadlines.
    first, index, first_cache = make(linger=10.0)
    second_cache = ResourceCache()
    second = UpstreamState(base_pb2.Node(id="relay"), second_cache, 10.0)
    sub = Sub()
    index.update(sub, ENDPOINT, Interest(frozenset({"a"})))
    [to_first] = first.on_connect(index, 0)
    [to_second] = second.on_connect(index, 0)
    assert to_first == to_second
    receive(first, response(ENDPOINT, "1", ("a", "1", endpoints("a", 1))), index, SETTLE_GRACE)
    assert first.synced and not second.synced
    assert list(first_cache.names(ENDPOINT)) == ["a"] and list(second_cache.names(ENDPOINT)) == []
    assert first.unanswered_names() == {} and second.unanswered_names() == {ENDPOINT: {"a"}}
    index.remove(sub)
    assert first.on_interest_changed(ENDPOINT, index, 1.0) == []
    assert (first.next_deadline(), second.next_deadline()) == (11.0, None)
    [unsubscribe] = first.on_tick(index, 11.0)
    assert list(unsubscribe.resource_names_unsubscribe) == ["a"]
    assert second.subscription_counts() == {ENDPOINT: 1}


def test_removed_resources_become_absent() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), ENDPOINT, Interest(frozenset({"a"})))
    state.on_interest_changed(ENDPOINT, index, 0)
    receive(state, response(ENDPOINT, "1", ("a", "v1", endpoints("a", 1))), index)
    receive(state, response(ENDPOINT, "2", removed=("a",)), index)
    assert cache.variants(ENDPOINT, "a") is ABSENT


def test_unwanted_names_in_a_response_are_not_cached() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), ENDPOINT, Interest(frozenset({"a"})))
    state.on_interest_changed(ENDPOINT, index, 0)
    receive(state, response(ENDPOINT, "1", ("a", "1", endpoints("a", 1)),
                            ("zz", "1", endpoints("zz", 1))), index)
    assert sorted(cache.names(ENDPOINT)) == ["a"]


def test_type_mismatch_duplicate_and_undecodable_are_nacked_and_not_applied() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), CLUSTER, Interest(wildcard=True))
    state.on_interest_changed(CLUSTER, index, 0)
    mismatch = response(CLUSTER, "1", ("a", "1", endpoints("a", 1)))
    duplicate = response(CLUSTER, "2", ("a", "1", cluster("a")), ("a", "2", cluster("a")))
    undecodable = response(CLUSTER, "3", ("a", "1", cluster("a")))
    undecodable.resources[0].resource.value = b"\xff\xff"
    for bad, reason in ((mismatch, "has type"), (duplicate, "more than once"),
                        (undecodable, "cannot be decoded")):
        [nack] = receive(state, bad, index).requests
        assert nack.response_nonce == bad.nonce
        assert reason in nack.error_detail.message and nack.error_detail.code == 3
    assert list(cache.resources(CLUSTER)) == []
    assert not cache.is_synced(CLUSTER)


def test_last_client_leaving_unsubscribes_and_forgets() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    sub = Sub()
    index.update(sub, ENDPOINT, Interest(frozenset({"a"})))
    state.on_interest_changed(ENDPOINT, index, 0)
    receive(state, response(ENDPOINT, "1", ("a", "1", endpoints("a", 1))), index)
    index.remove(sub)
    [request] = state.on_interest_changed(ENDPOINT, index, 0)
    assert list(request.resource_names_unsubscribe) == ["a"]
    assert list(cache.names(ENDPOINT)) == []
    assert state.subscription_counts() == {}


def test_linger_delays_unsubscribe_and_a_return_keeps_it() -> None:
    state, index, _ = make(linger=10.0)
    state.on_connect(index, 0)
    sub = Sub()
    index.update(sub, ENDPOINT, Interest(frozenset({"a"})))
    state.on_interest_changed(ENDPOINT, index, 0)
    index.remove(sub)
    assert state.on_interest_changed(ENDPOINT, index, 1) == []
    assert state.next_deadline() == 11.0
    assert state.on_tick(index, 5) == []
    [request] = state.on_tick(index, 11)
    assert list(request.resource_names_unsubscribe) == ["a"]
    # Back within the linger period: nothing is sent at all.
    index.update(sub, ENDPOINT, Interest(frozenset({"a"})))
    state.on_interest_changed(ENDPOINT, index, 12)
    index.remove(sub)
    state.on_interest_changed(ENDPOINT, index, 13)
    index.update(sub, ENDPOINT, Interest(frozenset({"a"})))
    assert state.on_interest_changed(ENDPOINT, index, 14) == []
    # Its linger ends all the same (nothing looks it up to cancel it), finding it wanted.
    assert state.next_deadline() == 23.0
    assert state.on_tick(index, 23) == []
    assert state.next_deadline() is None
    assert state.subscription_counts() == {ENDPOINT: 1}


def test_past_linger_names_the_oldest_are_unsubscribed_at_once_and_the_rest_return_free() -> None:
    cache, index = ResourceCache(), InterestIndex()
    state = UpstreamState(base_pb2.Node(id="relay"), cache, linger=10.0, linger_names=2)
    state.on_connect(index, 0)
    sub = Sub()
    index.update(sub, ENDPOINT, Interest(frozenset({"a", "b", "c", "d", "e"})))
    state.on_interest_changed(ENDPOINT, index, 0)
    index.remove(sub)
    assert state.on_interest_changed(ENDPOINT, index, 1) == []  # all five let go
    assert state.next_deadline() == 1.0  # three past the bound: now
    [request] = state.on_tick(index, 1)
    cut = set(request.resource_names_unsubscribe)
    assert len(cut) == 3 and state.subscription_counts() == {ENDPOINT: 2}
    lingering = {"a", "b", "c", "d", "e"} - cut
    # Back within the linger: the two lingering cost nothing, the three cut are asked again.
    index.update(sub, ENDPOINT, Interest(frozenset({"a", "b", "c", "d", "e"})))
    [again] = state.on_interest_changed(ENDPOINT, index, 5)
    assert set(again.resource_names_subscribe) == cut
    assert not set(again.resource_names_subscribe) & lingering
    assert state.next_deadline() == 11.0
    assert state.on_tick(index, 11) == []  # wanted again when their linger ends
    assert state.subscription_counts() == {ENDPOINT: 5}


# -- variants: locators ----------------------------------------------------------

DPC = discovery_pb2.DynamicParameterConstraints


def with_params(*names_params: tuple[str, dict[str, str]]) -> Interest:
    params = frozenset((n, params_of(p)) for n, p in names_params if p)
    return Interest(frozenset(n for n, _ in names_params), False, params)


def variant_response(nonce: str, constraints: DPC,
                     version: str = "1") -> discovery_pb2.DeltaDiscoveryResponse:
    out = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER, nonce=nonce)
    added = out.resources.add(version=version, resource=pack(cluster("c")))
    added.resource_name.name = "c"
    added.resource_name.dynamic_parameter_constraints.CopyFrom(constraints)
    return out


def locators_of(request: discovery_pb2.DeltaDiscoveryRequest, subscribe: bool = True
                ) -> list[tuple[str, dict[str, str]]]:
    located = request.resource_locators_subscribe if subscribe else \
        request.resource_locators_unsubscribe
    return [(loc.name, dict(loc.dynamic_parameters)) for loc in located]


def test_distinct_locators_are_subscribed_once_each() -> None:
    state, index, _ = make()
    state.on_connect(index, 0)
    requests = []
    for params in ({"env": "canary"}, {"env": "canary"}, {"env": "prod"}):
        index.update(Sub(), CLUSTER, with_params(("c", params)))
        requests += state.on_interest_changed(CLUSTER, index, 0)
    subscribed = [loc for r in requests for loc in locators_of(r)]
    assert subscribed == [("c", {"env": "canary"}), ("c", {"env": "prod"})]
    assert all(not r.resource_names_subscribe for r in requests)


def test_parameters_answered_by_a_cached_variant_need_no_subscription() -> None:
    state, index, _cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), CLUSTER, with_params(("c", {"env": "canary"})))
    state.on_interest_changed(CLUSTER, index, 0)
    receive(state, variant_response("1", CANARY), index)
    index.update(Sub(), CLUSTER, with_params(("c", {"env": "canary", "zone": "b"})))
    assert state.on_interest_changed(CLUSTER, index, 0) == []


def test_when_the_subscribing_locator_leaves_answered_parameters_take_over() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    first, second = Sub(), Sub()
    index.update(first, CLUSTER, with_params(("c", {"env": "canary"})))
    state.on_interest_changed(CLUSTER, index, 0)
    receive(state, variant_response("1", CANARY), index)
    index.update(second, CLUSTER, with_params(("c", {"env": "canary", "zone": "b"})))
    state.on_interest_changed(CLUSTER, index, 0)
    index.remove(first)
    [request] = state.on_interest_changed(CLUSTER, index, 0)
    # One request: the new locator in, the old one out, so the variant never lapses.
    assert locators_of(request) == [("c", {"env": "canary", "zone": "b"})]
    assert locators_of(request, subscribe=False) == [("c", {"env": "canary"})]
    assert list(cache.names(CLUSTER)) == ["c"]


def test_a_response_settles_the_locators_subscribed_well_before_it() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    dev = params_of({"env": "dev"})
    index.update(Sub(), CLUSTER, with_params(("c", {"env": "dev"})))
    state.on_interest_changed(CLUSTER, index, 10.0)
    assert not cache.is_answered(CLUSTER, Locator("c", dev))
    receive(state, discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER, nonce="1"), index,
            10.0 + SETTLE_GRACE)
    assert cache.is_answered(CLUSTER, Locator("c", dev))


def test_invariant_6_a_response_right_after_a_subscription_may_not_answer_it() -> None:
    # The origin may have sent it before reading the subscription: settling
    # the locator now would tell its clients their resource does not exist.
    state, index, cache = make()
    state.on_connect(index, 0)
    dev = params_of({"env": "dev"})
    index.update(Sub(), CLUSTER, with_params(("c", {"env": "dev"})))
    state.on_interest_changed(CLUSTER, index, 10.0)
    receive(state, discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER, nonce="1"),
            index, 10.1)
    assert not cache.is_answered(CLUSTER, Locator("c", dev))
    assert state.next_deadline() == 10.0 + SETTLE_GRACE
    assert state.on_tick(index, 10.0 + SETTLE_GRACE - 0.01) == [] and \
        not cache.is_answered(CLUSTER, Locator("c", dev))
    state.on_tick(index, 10.0 + SETTLE_GRACE)
    assert cache.is_answered(CLUSTER, Locator("c", dev))
    assert state.next_deadline() is None


def test_a_locator_never_followed_by_a_response_is_never_settled() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), CLUSTER, with_params(("c", {"env": "dev"})))
    state.on_interest_changed(CLUSTER, index, 10.0)
    assert state.next_deadline() is None
    state.on_tick(index, 100.0)
    assert not cache.is_answered(CLUSTER, Locator("c", params_of({"env": "dev"})))


def test_invalid_constraints_from_the_origin_are_nacked_and_cache_kept() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), CLUSTER, with_params(("c", {"env": "canary"})))
    state.on_interest_changed(CLUSTER, index, 0)
    receive(state, variant_response("1", CANARY), index)
    malformed = DPC(constraint={"key": "env"})  # neither value nor exists
    [nack] = receive(state, variant_response("2", malformed, version="2"), index).requests
    assert nack.response_nonce == "2" and nack.error_detail.code == 3
    assert "invalid dynamic parameter constraints" in nack.error_detail.message
    assert [r.version for r in cache.resources(CLUSTER)] == ["1"]


def test_resource_errors_with_invalid_constraints_or_no_name_are_nacked() -> None:
    state, index, cache = make()
    state.on_connect(index, 0)
    index.update(Sub(), CLUSTER, with_params(("c", {"env": "canary"})))
    state.on_interest_changed(CLUSTER, index, 0)
    bad = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER, nonce="9")
    failed = bad.resource_errors.add(error_detail={"code": 5, "message": "x"})
    failed.resource_name.name = "c"
    failed.resource_name.dynamic_parameter_constraints.CopyFrom(
        DPC(constraint={"key": "env"}))
    [nack] = receive(state, bad, index).requests
    assert nack.response_nonce == "9"
    assert nack.error_detail.message.startswith(
        "resource error for 'c' has invalid dynamic parameter constraints: ")
    assert "'env'" in nack.error_detail.message
    nameless = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER, nonce="10")
    nameless.resource_errors.add(error_detail={"code": 5, "message": "x"})
    [nack] = receive(state, nameless, index).requests
    assert nack.error_detail.message == "a resource error names no resource"
    assert cache.error(CLUSTER, "c", params_of({"env": "canary"})) is None
