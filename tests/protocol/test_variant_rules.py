"""The variant rules of dynamic-parameters.md through the real state objects (no I/O).

Requests go in through :class:`DownstreamStream` (node parameters are the
stream's business) and origin responses through :class:`UpstreamState`; both
share one real cache, subscription index and :class:`CacheView`, wired as the
relay wires them, so only gRPC is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.cache import ABSENT, Missing, ResourceCache, Update
from relay.constraints import Locator, compile_constraints, params_of
from relay.core import Core
from relay.resource import CachedResource
from relay.server.serving import ServingContext
from relay.server.streams import DownstreamStream
from relay.telemetry import new_metrics, prometheus_provider
from relay.upstream.state import SETTLE_GRACE, UpstreamState
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import pack
from tests.upstream.test_upstream_state import receive
from tests.variants import CANARY, NO_ENV, PROD, label_of, unwrapped

# The generated messages carry no type information (see relay/upstream/state.py).
DPC: TypeAlias = discovery_pb2.DynamicParameterConstraints
Delta: TypeAlias = discovery_pb2.DeltaDiscoveryRequest
Sotw: TypeAlias = discovery_pb2.DiscoveryRequest
DeltaResponse: TypeAlias = discovery_pb2.DeltaDiscoveryResponse
SotwResponse: TypeAlias = discovery_pb2.DiscoveryResponse
ResourceName: TypeAlias = discovery_pb2.ResourceName


def both(*constraints: DPC) -> DPC:
    return DPC(and_constraints={"constraints": list(constraints)})


def has(key: str, value: str) -> DPC:
    return DPC(constraint={"key": key, "value": value})


def body(label: str) -> any_pb2.Any:
    """Cluster "c" whose alt_stat_name says which variant it is."""
    return pack(cluster_pb2.Cluster(name="c", alt_stat_name=label))


def origin_resource(label: str, constraints: DPC | None,
                    version: str = "1") -> discovery_pb2.Resource:
    """Variant ``label`` of cluster "c" as the origin sends it."""
    resource = discovery_pb2.Resource(version=version, resource=body(label))
    if constraints is None:
        resource.name = "c"
    else:
        resource.resource_name.name = "c"
        resource.resource_name.dynamic_parameter_constraints.CopyFrom(constraints)
    return resource


def variant(label: str, constraints: DPC | None, version: str = "1") -> CachedResource:
    return CachedResource(CLUSTER, "c", version, origin_resource(label, constraints, version),
                          compile_constraints(constraints))


def variant_name(constraints: DPC) -> ResourceName:
    return ResourceName(name="c", dynamic_parameter_constraints=constraints)


def node(params: dict[str, dict[str, str]] | None = None) -> base_pb2.Node:
    """A node with ``params`` per type URL as its dynamic parameters."""
    out = base_pb2.Node(id="client")
    for type_url, pairs in (params or {}).items():
        out.dynamic_parameters[type_url].params.update(pairs)
    return out


def on_cds(env: str) -> base_pb2.Node:
    return node({CLUSTER: {"env": env}})


@dataclass
class Relay:
    """A relay without gRPC: origin responses in, downstream responses out.

    It is the index's way back up (:class:`relay.interest.Upward`), acting at
    once where the real client acts in the next turn of the event loop.
    """

    serving: ServingContext
    upstream: UpstreamState
    now: float = 0.0
    # every request the relay sent the origin
    to_origin: list[Delta] = field(default_factory=list)

    @property
    def cache(self) -> ResourceCache:
        return self.serving.cache

    def interest_changed(self, type_url: str, names: Iterable[str]) -> None:
        self.to_origin.extend(self.upstream.on_interest_changed(
            type_url, self.serving.index, self.now, set(names)))

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        self.to_origin.extend(self.upstream.on_refetch(type_url, names))

    def tick(self, now: float) -> list[Delta]:
        return self.upstream.on_tick(self.serving.index, now)

    def from_origin(self, response: DeltaResponse) -> list[Delta]:
        """The origin sends a response: what the relay answers (ACK or NACK first).

        The origin takes its time (SETTLE_GRACE), so the relay takes the
        response as the answer to what it subscribed before.
        """
        self.now += SETTLE_GRACE
        answers = receive(self.upstream, response, self.serving.index, self.now).requests
        self.to_origin.extend(answers)
        return answers

    def subscriptions_sent(self) -> list[Delta]:
        """Requests to the origin that change its subscription (not ACKs)."""
        return [r for r in self.to_origin
                if r.resource_names_subscribe or r.resource_names_unsubscribe
                or r.resource_locators_subscribe or r.resource_locators_unsubscribe]

    def stream(self, variant: str = "delta") -> DownstreamStream:
        return DownstreamStream(self.serving, "delta" if variant == "delta" else "sotw",
                                "peer")


def relay(*cached: CachedResource, linger: float = 0.0,
          serving: ServingContext | None = None) -> Relay:
    """A connected relay whose cache holds ``cached`` (as if the origin had sent them)."""
    if serving is None:
        serving = Core.create().serving
    made = Relay(serving, UpstreamState(base_pb2.Node(id="relay"), serving.cache, linger))
    made.to_origin.extend(made.upstream.on_connect(serving.index, 0.0))
    serving.index.link(made)
    if cached:
        serving.cache.apply(CLUSTER, Update(list(cached)))
    return made


def three_variants() -> Relay:
    return relay(variant("canary", CANARY), variant("prod", PROD), variant("default", NO_ENV))


def delta_out(stream: DownstreamStream) -> list[DeltaResponse]:
    return [DeltaResponse.FromString(b) for b in stream.ready_responses()]


def sotw_out(stream: DownstreamStream) -> list[SotwResponse]:
    return [SotwResponse.FromString(b) for b in stream.ready_responses()]


def delta_ack(stream: DownstreamStream, response: DeltaResponse) -> None:
    stream.handle_request(Delta(type_url=response.type_url, response_nonce=response.nonce))


def sotw_ack(stream: DownstreamStream, response: SotwResponse, **fields: Any) -> None:
    stream.handle_request(Sotw(type_url=response.type_url, response_nonce=response.nonce,
                               version_info=response.version_info, **fields))


def only(responses: list[Any]) -> Any:
    assert len(responses) == 1, responses
    return responses[0]


def delta_labels(response: DeltaResponse) -> list[str]:
    return [label_of(r) for r in response.resources]


def sotw_labels(response: SotwResponse) -> list[str]:
    return [label_of(r) for r in response.resources]


def origin_response(nonce: str, *resources: discovery_pb2.Resource,
                    removed: tuple[str, ...] = (),
                    removed_names: tuple[ResourceName, ...] = ()) -> DeltaResponse:
    return DeltaResponse(type_url=CLUSTER, nonce=nonce, resources=list(resources),
                         removed_resources=list(removed),
                         removed_resource_names=list(removed_names))


def locators(request: Delta, subscribe: bool = True) -> list[tuple[str, dict[str, str]]]:
    located = request.resource_locators_subscribe if subscribe else \
        request.resource_locators_unsubscribe
    return [(loc.name, dict(loc.dynamic_parameters)) for loc in located]


# -- which parameters apply ----------------------------------------------------


def test_invariant_30_a_locators_own_parameters_win_over_the_node_parameters() -> None:
    r = three_variants()
    delta, sotw = r.stream("delta"), r.stream("sotw")
    prod = [{"name": "c", "dynamic_parameters": {"env": "prod"}}]
    delta.handle_request(Delta(type_url=CLUSTER, node=on_cds("canary"),
                               resource_locators_subscribe=prod))
    sotw.handle_request(Sotw(type_url=CLUSTER, node=on_cds("canary"), resource_locators=prod))
    sent = only(delta_out(delta))
    assert delta_labels(sent) == ["prod"]
    assert sent.resources[0].resource_name == variant_name(PROD)
    assert sotw_labels(only(sotw_out(sotw))) == ["prod"]


def test_invariant_30_node_parameters_given_for_another_type_count_as_empty() -> None:
    r = three_variants()
    delta, sotw = r.stream("delta"), r.stream("sotw")
    elsewhere = node({ENDPOINT: {"env": "canary"}})
    delta.handle_request(Delta(type_url=CLUSTER, node=elsewhere, resource_names_subscribe=["c"]))
    sotw.handle_request(Sotw(type_url=CLUSTER, node=elsewhere, resource_names=["c"]))
    # Empty parameters: the default (no "env"), not the canary variant.
    assert delta_labels(only(delta_out(delta))) == ["default"]
    assert sotw_labels(only(sotw_out(sotw))) == ["default"]


# -- parameter changes -----------------------------------------------------------


def canary_client(r: Relay) -> DownstreamStream:
    """A delta client of "c" with env=canary on its node; the origin has answered
    its locator with the canary variant (not yet read from the stream)."""
    stream = r.stream("delta")
    stream.handle_request(Delta(type_url=CLUSTER, node=on_cds("canary"),
                                resource_names_subscribe=["c"]))
    r.from_origin(origin_response("o1", origin_resource("canary", CANARY)))
    return stream


def bystander(r: Relay) -> DownstreamStream:
    """A prod client: its locator keeps the other variants of "c" in the cache.

    (For when nothing else does, see the test of the only holder below.)
    """
    stream = r.stream("delta")
    stream.handle_request(Delta(type_url=CLUSTER, node=on_cds("prod"),
                                resource_names_subscribe=["c"]))
    assert delta_labels(only(delta_out(stream))) == ["prod"]
    return stream


def test_invariant_13_31_a_change_to_parameters_matching_nothing_removes_the_variant() -> None:
    r = three_variants()
    bystander(r)
    stream = r.stream("delta")
    stream.handle_request(Delta(type_url=CLUSTER, node=on_cds("canary"),
                                resource_names_subscribe=["c"]))
    delta_ack(stream, only(delta_out(stream)))
    stream.handle_request(Delta(type_url=CLUSTER, node=on_cds("dev")))
    # The origin may still have a variant for env=dev: nothing yet.
    assert delta_out(stream) == []
    r.cache.apply(CLUSTER, Update(answered=[Locator("c", params_of({"env": "dev"}))]))
    gone = only(delta_out(stream))
    assert list(gone.resources) == [] and list(gone.removed_resources) == []
    assert list(gone.removed_resource_names) == [variant_name(CANARY)]


def test_invariant_14_31_sotw_cds_omits_a_name_whose_new_parameters_match_nothing() -> None:
    r = three_variants()
    bystander(r)
    stream = r.stream("sotw")
    stream.handle_request(Sotw(type_url=CLUSTER, node=on_cds("canary"), resource_names=["c"]))
    first = only(sotw_out(stream))
    assert sotw_labels(first) == ["canary"]
    sotw_ack(stream, first, node=on_cds("dev"), resource_names=["c"])
    assert sotw_out(stream) == []  # absence would be deletion: wait for the origin
    r.cache.apply(CLUSTER, Update(answered=[Locator("c", params_of({"env": "dev"}))]))
    emptied = only(sotw_out(stream))
    assert list(emptied.resources) == []
    assert emptied.version_info != first.version_info


def test_invariant_13_31_the_only_holder_of_a_variant_is_told_when_it_matches_nothing() -> None:
    r = relay()
    stream = canary_client(r)
    delta_ack(stream, only(delta_out(stream)))
    stream.handle_request(Delta(type_url=CLUSTER, node=on_cds("dev")))
    assert delta_out(stream) == []
    # The origin has no variant for env=dev: it answers the new locator with nothing.
    r.from_origin(origin_response("o2"))
    gone = only(delta_out(stream))
    assert list(gone.resources) == [] and list(gone.removed_resources) == []
    assert list(gone.removed_resource_names) == [variant_name(CANARY)]


def test_invariant_31_sotw_plain_names_follow_a_node_parameter_change_mid_stream() -> None:
    r = three_variants()
    stream = r.stream("sotw")
    stream.handle_request(Sotw(type_url=CLUSTER, node=on_cds("canary"), resource_names=["c"]))
    first = only(sotw_out(stream))
    assert sotw_labels(first) == ["canary"]
    # The ACK carries the new node; the names are the same (no resubscription).
    sotw_ack(stream, first, node=on_cds("prod"), resource_names=["c"])
    moved = only(sotw_out(stream))
    assert sotw_labels(moved) == ["prod"]
    assert moved.version_info != first.version_info
    sotw_ack(stream, moved, resource_names=["c"])
    assert sotw_out(stream) == []


def test_a_delta_locator_resubscribed_with_new_parameters_moves_in_one_update() -> None:
    r = three_variants()
    stream = r.stream("delta")
    stream.handle_request(Delta(type_url=CLUSTER, resource_locators_subscribe=[
        {"name": "c", "dynamic_parameters": {"env": "canary"}}]))
    first = only(delta_out(stream))
    assert delta_labels(first) == ["canary"]
    stream.handle_request(Delta(type_url=CLUSTER, response_nonce=first.nonce,
                                resource_locators_subscribe=[
                                    {"name": "c", "dynamic_parameters": {"env": "prod"}}]))
    moved = only(delta_out(stream))
    assert delta_labels(moved) == ["prod"]
    assert moved.resources[0].resource_name == variant_name(PROD)
    assert list(moved.removed_resources) == [] and list(moved.removed_resource_names) == []
    delta_ack(stream, moved)
    assert delta_out(stream) == []


def test_invariant_13_a_locator_resubscribed_to_match_nothing_removes_by_constraints() -> None:
    r = three_variants()
    bystander(r)
    stream = r.stream("delta")
    stream.handle_request(Delta(type_url=CLUSTER, resource_locators_subscribe=[
        {"name": "c", "dynamic_parameters": {"env": "canary"}}]))
    first = only(delta_out(stream))
    stream.handle_request(Delta(type_url=CLUSTER, response_nonce=first.nonce,
                                resource_locators_subscribe=[
                                    {"name": "c", "dynamic_parameters": {"env": "dev"}}]))
    assert delta_out(stream) == []
    r.cache.apply(CLUSTER, Update(answered=[Locator("c", params_of({"env": "dev"}))]))
    gone = only(delta_out(stream))
    assert list(gone.resources) == [] and list(gone.removed_resources) == []
    assert list(gone.removed_resource_names) == [variant_name(CANARY)]


# -- atomic re-partition -----------------------------------------------------------


def test_sotw_cds_repartition_in_one_origin_response_is_one_response_of_the_new_variant(
        ) -> None:
    r = relay()
    stream = r.stream("sotw")
    params = {"env": "canary", "zone": "b"}
    locator = [{"name": "c", "dynamic_parameters": params}]
    stream.handle_request(Sotw(type_url=CLUSTER, resource_locators=locator))
    r.from_origin(origin_response("o1", origin_resource("canary", CANARY)))
    first = only(sotw_out(stream))
    assert sotw_labels(first) == ["canary"]
    sotw_ack(stream, first, resource_locators=locator)
    # The origin splits canary by zone: old variant out, new ones in, in one response.
    zone_b = both(CANARY, has("zone", "b"))
    zone_not_b = both(CANARY, DPC(not_constraints=has("zone", "b")))
    [ack] = r.from_origin(origin_response(
        "o2", origin_resource("canary-b", zone_b, "2"),
        origin_resource("canary-not-b", zone_not_b, "2"), removed_names=(variant_name(CANARY),)))
    assert not ack.HasField("error_detail")
    moved = only(sotw_out(stream))
    assert [unwrapped(e).resource_name for e in moved.resources] == [
        ResourceName(name="c", dynamic_parameter_constraints=zone_b)]
    assert sotw_labels(moved) == ["canary-b"]
    sotw_ack(stream, moved, resource_locators=locator)
    assert sotw_out(stream) == []


# -- constraints on the wire --------------------------------------------------------


def test_delta_resources_carry_their_variants_constraints() -> None:
    r = three_variants()
    stream = r.stream("delta")
    stream.handle_request(Delta(type_url=CLUSTER, node=on_cds("prod"),
                                resource_names_subscribe=["c"]))
    [sent] = only(delta_out(stream)).resources
    assert sent.resource_name == variant_name(PROD)
    assert sent.version == "1" and label_of(sent) == "prod"


def test_sotw_locator_clients_get_a_resource_wrapping_with_the_constraints() -> None:
    r = three_variants()
    located, plain = r.stream("sotw"), r.stream("sotw")
    located.handle_request(Sotw(type_url=CLUSTER, resource_locators=[
        {"name": "c", "dynamic_parameters": {"env": "prod"}}]))
    plain.handle_request(Sotw(type_url=CLUSTER, node=on_cds("prod"), resource_names=["c"]))
    [wrapped] = only(sotw_out(located)).resources
    resource = unwrapped(wrapped)
    assert resource.resource_name == variant_name(PROD) and resource.version == "1"
    assert label_of(resource) == "prod"
    # A plain-name SotW client gets the bare resource, as any SotW client expects.
    [bare] = only(sotw_out(plain)).resources
    assert bare.type_url == CLUSTER and label_of(bare) == "prod"


# -- ambiguity ----------------------------------------------------------------------


def test_several_matching_variants_are_resolved_counted_per_lookup_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    provider, registry = prometheus_provider()
    serving = Core.create(new_metrics(provider, registry)).serving
    eu = both(CANARY, DPC(constraint={"key": "region", "exists": {}}))
    # Listed with the less specific variant last: the choice does not follow the order.
    r = relay(variant("canary-eu", eu), variant("canary", CANARY), serving=serving)
    params = params_of({"env": "canary", "region": "eu"})
    with caplog.at_level(logging.WARNING, logger="relay.variants"):
        picks = [serving.view.lookup(CLUSTER, "c", params) for _ in range(3)]
        stream = r.stream("delta")
        stream.handle_request(Delta(type_url=CLUSTER, resource_locators_subscribe=[
            {"name": "c", "dynamic_parameters": dict(params)}]))
        sent = only(delta_out(stream))
    # The variant whose constraints mention the most keys, every time.
    assert {p.variant_key for p in picks if isinstance(p, CachedResource)} == {
        compile_constraints(eu).key}
    assert delta_labels(sent) == ["canary-eu"]
    assert registry.get_sample_value("xds_relay_variant_conflicts_total",
                                     {"type": "Cluster"}) == 4
    [record] = caplog.records
    assert record.levelname == "WARNING"
    assert "several variants of Cluster 'c' match the same parameters" in record.getMessage()


def test_a_new_set_of_conflicting_variants_is_logged_again(
        caplog: pytest.LogCaptureFixture) -> None:
    r = relay(variant("canary", CANARY), variant("canary-eu", both(
        CANARY, DPC(constraint={"key": "region", "exists": {}}))))
    params = params_of({"env": "canary", "region": "eu"})
    with caplog.at_level(logging.WARNING, logger="relay.variants"):
        r.serving.view.lookup(CLUSTER, "c", params)
        r.cache.apply(CLUSTER, Update([variant("eu", has("region", "eu"))]))
        r.serving.view.lookup(CLUSTER, "c", params)
        r.serving.view.lookup(CLUSTER, "c", params)
    assert len(caplog.records) == 2


# -- what the origin sends -----------------------------------------------------------


def test_invariant_26_invalid_constraints_in_a_removal_are_nacked_and_the_cache_kept() -> None:
    r = relay()
    stream = canary_client(r)
    delta_ack(stream, only(delta_out(stream)))
    malformed = ResourceName(name="c", dynamic_parameter_constraints=DPC(
        constraint={"key": "env"}))  # neither value nor exists
    [nack] = r.from_origin(origin_response("o2", origin_resource("canary", CANARY, "2"),
                                           removed_names=(malformed,)))
    assert nack.response_nonce == "o2" and nack.error_detail.code == 3
    assert nack.error_detail.message == (
        "removed resource 'c' has invalid dynamic parameter constraints: "
        "constraint: key 'env' has neither value nor exists")
    # Nothing of it applied: the cached variant and what the client holds stay.
    cached = r.cache.variants(CLUSTER, "c")
    assert not isinstance(cached, Missing)
    assert [(v.variant_key, v.version) for v in cached.values()] == [
        (compile_constraints(CANARY).key, "1")]
    assert delta_out(stream) == []


def test_invariant_30_a_removal_listing_and_children_in_another_order_removes_the_variant(
        ) -> None:
    r = relay()
    stream = r.stream("delta")
    params = {"env": "canary", "zone": "b"}
    stream.handle_request(Delta(type_url=CLUSTER, resource_locators_subscribe=[
        {"name": "c", "dynamic_parameters": params}]))
    as_sent = both(CANARY, has("zone", "b"))
    r.from_origin(origin_response("o1", origin_resource("canary-b", as_sent)))
    delta_ack(stream, only(delta_out(stream)))
    reordered = variant_name(both(has("zone", "b"), CANARY))
    [ack] = r.from_origin(origin_response("o2", removed_names=(reordered,)))
    assert not ack.HasField("error_detail")
    assert r.cache.variants(CLUSTER, "c") is ABSENT
    gone = only(delta_out(stream))
    # Removed as the client knows it: with the constraints it was sent.
    assert list(gone.removed_resource_names) == [variant_name(as_sent)]
    assert list(gone.resources) == [] and list(gone.removed_resources) == []


def test_invariant_13_a_plain_removal_reaches_each_holder_by_its_variants_constraints(
        ) -> None:
    r = relay()
    canary, prod = r.stream("delta"), r.stream("delta")
    canary.handle_request(Delta(type_url=CLUSTER, node=on_cds("canary"),
                                resource_names_subscribe=["c"]))
    prod.handle_request(Delta(type_url=CLUSTER, node=on_cds("prod"),
                              resource_names_subscribe=["c"]))
    r.from_origin(origin_response("o1", origin_resource("canary", CANARY),
                                  origin_resource("prod", PROD)))
    for stream in (canary, prod):
        delta_ack(stream, only(delta_out(stream)))
    r.from_origin(origin_response("o2", removed=("c",)))
    for stream, constraints in ((canary, CANARY), (prod, PROD)):
        gone = only(delta_out(stream))
        assert list(gone.removed_resource_names) == [variant_name(constraints)]
        assert list(gone.removed_resources) == [] and list(gone.resources) == []


def test_invariant_30_a_plain_named_resource_is_served_to_clients_with_parameters() -> None:
    r = relay()
    first = r.stream("delta")
    first.handle_request(Delta(type_url=CLUSTER, resource_names_subscribe=["c"]))
    r.from_origin(origin_response("o1", origin_resource("plain", None)))
    assert delta_labels(only(delta_out(first))) == ["plain"]
    assert [list(s.resource_names_subscribe) for s in r.subscriptions_sent()] == [["c"]]
    located, by_node, sotw = r.stream("delta"), r.stream("delta"), r.stream("sotw")
    canary = [{"name": "c", "dynamic_parameters": {"env": "canary"}}]
    located.handle_request(Delta(type_url=CLUSTER, resource_locators_subscribe=canary))
    by_node.handle_request(Delta(type_url=CLUSTER, node=on_cds("canary"),
                                 resource_names_subscribe=["c"]))
    sotw.handle_request(Sotw(type_url=CLUSTER, resource_locators=canary))
    for stream in (located, by_node):
        [sent] = only(delta_out(stream)).resources
        assert sent.name == "c" and not sent.HasField("resource_name")
        assert label_of(sent) == "plain"
    [wrapped] = only(sotw_out(sotw)).resources
    assert unwrapped(wrapped).name == "c" and label_of(wrapped) == "plain"
    # Served from cache: the plain resource answers every parameter set.
    assert len(r.subscriptions_sent()) == 1


# -- upstream locators follow the clients ----------------------------------------------


def test_invariant_25_31_a_parameter_change_swaps_the_upstream_locator() -> None:
    r = relay()
    stream = canary_client(r)
    [subscribe] = r.subscriptions_sent()
    assert locators(subscribe) == [("c", {"env": "canary"})]
    assert locators(subscribe, subscribe=False) == []
    stream.handle_request(Delta(type_url=CLUSTER, node=on_cds("prod")))
    [_, swap] = r.subscriptions_sent()
    assert locators(swap) == [("c", {"env": "prod"})]
    assert locators(swap, subscribe=False) == [("c", {"env": "canary"})]
    assert list(swap.resource_names_subscribe) == []
    assert list(swap.resource_names_unsubscribe) == []


def test_invariant_25_31_with_linger_the_old_locator_goes_only_after_the_linger() -> None:
    r = relay(linger=10.0)
    stream = canary_client(r)
    r.now = 1.0
    stream.handle_request(Delta(type_url=CLUSTER, node=on_cds("prod")))
    [_, subscribe] = r.subscriptions_sent()
    assert locators(subscribe) == [("c", {"env": "prod"})]
    assert locators(subscribe, subscribe=False) == []
    assert r.upstream.next_deadline() == 11.0
    assert r.tick(10.5) == []
    [unsubscribe] = r.tick(11.0)
    assert locators(unsubscribe, subscribe=False) == [("c", {"env": "canary"})]
    assert locators(unsubscribe) == []
    assert r.upstream.next_deadline() is None
