"""CSDS messages computed from stream state, without gRPC."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.admin.v3 import config_dump_shared_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2
from envoy.type.matcher.v3 import node_pb2, string_pb2
from google.rpc import status_pb2

from relay.cache import Update
from relay.constraints import compile_constraints
from relay.core import Core
from relay.resource import CachedResource
from relay.server.serving import ServingContext
from relay.server.status import UnsupportedMatcher, client_config, client_status
from relay.server.streams import DownstreamStream, XdsProtocol
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints, pack

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest
Config = csds_pb2.ClientConfig.GenericXdsConfig
Client = config_dump_shared_pb2.ClientResourceStatus
Status = csds_pb2.ConfigStatus
Failure = config_dump_shared_pb2.UpdateFailureState


def serving() -> ServingContext:
    return Core.create().serving


def put(ctx: ServingContext, msg: Any, version: str) -> None:
    type_url = pack(msg).type_url
    name = getattr(msg, "name", "") or msg.cluster_name
    resource = discovery_pb2.Resource(name=name, version=version, resource=pack(msg))
    # (as the origin answers the relay's wildcard too: wildcard clients here are served)
    ctx.cache.apply(type_url, Update([CachedResource(type_url, name, version, resource)],
                                     wildcard_answered=True))


def open_stream(ctx: ServingContext, protocol: XdsProtocol = "delta",
                node_id: str = "n1") -> DownstreamStream:
    stream = DownstreamStream(ctx, protocol, f"peer-{node_id}")
    ctx.join(stream)
    return stream


def send(stream: DownstreamStream, request: Any) -> None:
    """A request from the stream's client; its first names the node (``n1``, ...)."""
    if stream.node is None:
        request.node.id = stream.peer.removeprefix("peer-")
    stream.handle_request(request)


def sent(stream: DownstreamStream) -> list[Any]:
    cls: Any = (discovery_pb2.DeltaDiscoveryResponse if stream.protocol == "delta"
                else discovery_pb2.DiscoveryResponse)
    return [cls.FromString(b) for b in stream.ready_responses()]


def configs(stream: DownstreamStream, ctx: ServingContext) -> list[Any]:
    return list(client_config(stream.session.snapshot(), ctx.cache).generic_xds_configs)


def acked(type_url: str, name: str, version: str, body: Any) -> Any:
    return Config(type_url=type_url, name=name, version_info=version, xds_config=pack(body),
                  client_status=Client.ACKED, config_status=Status.SYNCED)


# -- delta ---------------------------------------------------------------------


def test_delta_acked_resource_reports_node_version_body_and_acked() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    stream = open_stream(ctx)
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["a"]))
    [response] = sent(stream)
    send(stream, Delta(type_url=CLUSTER, response_nonce=response.nonce))
    assert client_config(stream.session.snapshot(), ctx.cache) == csds_pb2.ClientConfig(
        node=base_pb2.Node(id="n1"), generic_xds_configs=[acked(CLUSTER, "a", "1", cluster("a"))])


def test_delta_resource_sent_but_not_answered_is_stale_with_client_status_unknown() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    stream = open_stream(ctx)
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["a"]))
    sent(stream)
    assert configs(stream, ctx) == [Config(
        type_url=CLUSTER, name="a", version_info="1", xds_config=pack(cluster("a")),
        client_status=Client.UNKNOWN, config_status=Status.STALE)]


def test_delta_nack_marks_only_the_resources_of_the_rejected_response() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    put(ctx, cluster("b"), "7")
    stream = open_stream(ctx)
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["a"]))
    [first] = sent(stream)
    send(stream, Delta(type_url=CLUSTER, response_nonce=first.nonce,
                                resource_names_subscribe=["b"]))
    [second] = sent(stream)
    send(stream, Delta(type_url=CLUSTER, response_nonce=second.nonce,
                                error_detail=status_pb2.Status(code=3, message="bad b")))
    assert configs(stream, ctx) == [
        acked(CLUSTER, "a", "1", cluster("a")),
        Config(type_url=CLUSTER, name="b", version_info="7", xds_config=pack(cluster("b")),
               client_status=Client.NACKED, config_status=Status.ERROR,
               error_state=Failure(details="bad b", version_info="7"))]


def test_delta_name_reported_removed_does_not_exist() -> None:
    ctx = serving()
    ctx.cache.apply(CLUSTER, Update(removed=["gone"]))
    stream = open_stream(ctx)
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["gone"]))
    [response] = sent(stream)
    assert list(response.removed_resources) == ["gone"]
    assert configs(stream, ctx) == [Config(type_url=CLUSTER, name="gone",
                                           client_status=Client.DOES_NOT_EXIST)]


def test_name_subscribed_before_the_origin_answered_is_requested_and_not_sent() -> None:
    ctx = serving()
    stream = open_stream(ctx)
    send(stream, Delta(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    assert sent(stream) == []
    assert configs(stream, ctx) == [Config(type_url=ENDPOINT, name="a",
                                           client_status=Client.REQUESTED,
                                           config_status=Status.NOT_SENT)]


def test_version_no_longer_cached_is_reported_without_its_body() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    stream = open_stream(ctx)
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["a"]))
    [response] = sent(stream)
    send(stream, Delta(type_url=CLUSTER, response_nonce=response.nonce))
    put(ctx, cluster("a", timeout_s=9), "2")  # not yet pushed to the client
    assert configs(stream, ctx) == [Config(type_url=CLUSTER, name="a", version_info="1",
                                           client_status=Client.ACKED,
                                           config_status=Status.SYNCED)]


def test_delta_initial_version_matching_the_cache_is_acked_with_its_body() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    stream = open_stream(ctx)
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["a"],
                                initial_resource_versions={"a": "1", "unsubscribed": "3"}))
    assert sent(stream) == []
    assert configs(stream, ctx) == [acked(CLUSTER, "a", "1", cluster("a"))]


def test_origin_error_passed_on_is_received_error_with_its_message() -> None:
    ctx = serving()
    error = discovery_pb2.ResourceError(
        resource_name=discovery_pb2.ResourceName(name="x"),
        error_detail=status_pb2.Status(code=7, message="not allowed"))
    ctx.cache.apply(ENDPOINT, Update(errors=[error]))
    stream = open_stream(ctx)
    send(stream, Delta(type_url=ENDPOINT, resource_names_subscribe=["x"]))
    [response] = sent(stream)
    assert list(response.resource_errors) == [error]
    assert configs(stream, ctx) == [Config(type_url=ENDPOINT, name="x",
                                           client_status=Client.RECEIVED_ERROR,
                                           error_state=Failure(details="not allowed"))]


# -- SotW ----------------------------------------------------------------------


def test_sotw_acked_then_nacked_response() -> None:
    ctx = serving()
    put(ctx, endpoints("a", 1), "1")
    stream = open_stream(ctx, "sotw")
    send(stream, Sotw(type_url=ENDPOINT, resource_names=["a"]))
    [first] = sent(stream)
    send(stream, Sotw(type_url=ENDPOINT, resource_names=["a"],
                               response_nonce=first.nonce, version_info=first.version_info))
    assert configs(stream, ctx) == [acked(ENDPOINT, "a", "1", endpoints("a", 1))]
    put(ctx, endpoints("a", 2), "2")
    [second] = sent(stream)
    send(stream, Sotw(type_url=ENDPOINT, resource_names=["a"],
                               response_nonce=second.nonce, version_info=first.version_info,
                               error_detail=status_pb2.Status(code=3, message="bad port")))
    assert configs(stream, ctx) == [Config(
        type_url=ENDPOINT, name="a", version_info="2", xds_config=pack(endpoints("a", 2)),
        client_status=Client.NACKED, config_status=Status.ERROR,
        error_state=Failure(details="bad port", version_info="2"))]


def test_sotw_cluster_left_out_of_a_full_state_response_does_not_exist() -> None:
    ctx = serving()
    ctx.cache.replace_type(CLUSTER, [CachedResource(CLUSTER, "a", "1", discovery_pb2.Resource(
        name="a", version="1", resource=pack(cluster("a"))))])
    stream = open_stream(ctx, "sotw")
    send(stream, Sotw(type_url=CLUSTER, resource_names=["a", "b"]))
    [response] = sent(stream)
    send(stream, Sotw(type_url=CLUSTER, resource_names=["a", "b"],
                               response_nonce=response.nonce,
                               version_info=response.version_info))
    assert configs(stream, ctx) == [
        acked(CLUSTER, "a", "1", cluster("a")),
        Config(type_url=CLUSTER, name="b", client_status=Client.DOES_NOT_EXIST)]


def test_sotw_endpoint_never_sent_stays_requested() -> None:
    ctx = serving()
    put(ctx, endpoints("a", 1), "1")
    ctx.cache.apply(ENDPOINT, Update(removed=["gone"]))
    stream = open_stream(ctx, "sotw")
    send(stream, Sotw(type_url=ENDPOINT, resource_names=["a", "gone"]))
    sent(stream)
    assert [(c.name, c.client_status) for c in configs(stream, ctx)] == [
        ("a", Client.UNKNOWN), ("gone", Client.REQUESTED)]


# -- requests ------------------------------------------------------------------


def test_configs_are_sorted_by_type_url_then_name() -> None:
    ctx = serving()
    stream = open_stream(ctx)
    send(stream, Delta(type_url=ENDPOINT, resource_names_subscribe=["b", "a"]))
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["z"]))
    assert [(c.type_url, c.name) for c in configs(stream, ctx)] == [
        (CLUSTER, "z"), (ENDPOINT, "a"), (ENDPOINT, "b")]


def test_exclude_resource_contents_leaves_bodies_out() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    stream = open_stream(ctx)
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["a"]))
    sent(stream)
    response = client_status(csds_pb2.ClientStatusRequest(exclude_resource_contents=True),
                             ctx.snapshots(), ctx.cache)
    [entry] = response.config[0].generic_xds_configs
    assert not entry.HasField("xds_config") and entry.version_info == "1"


def node_ids(ctx: ServingContext, *matchers: Any) -> list[str]:
    request = csds_pb2.ClientStatusRequest(node_matchers=list(matchers))
    return [c.node.id for c in client_status(request, ctx.snapshots(), ctx.cache).config]


def by_id(**pattern: Any) -> Any:
    return node_pb2.NodeMatcher(node_id=string_pb2.StringMatcher(**pattern))


def test_node_matchers_select_clients_by_node_id_any_matcher_matching() -> None:
    ctx = serving()
    for node_id in ("edge-2", "core-1", "edge-1", "Edge-3"):
        send(open_stream(ctx, node_id=node_id), Delta(type_url=CLUSTER))
    assert node_ids(ctx) == ["Edge-3", "core-1", "edge-1", "edge-2"]
    assert node_ids(ctx, by_id(exact="edge-1")) == ["edge-1"]
    assert node_ids(ctx, by_id(prefix="edge-")) == ["edge-1", "edge-2"]
    assert node_ids(ctx, by_id(prefix="edge-", ignore_case=True)) == [
        "Edge-3", "edge-1", "edge-2"]
    assert node_ids(ctx, by_id(suffix="-1"), by_id(contains="re-")) == ["core-1", "edge-1"]
    assert node_ids(ctx, by_id(exact="nobody")) == []


@pytest.mark.parametrize(("matcher", "message"), [
    (by_id(safe_regex={"regex": "edge-.*"}),
     "node_matchers: 'safe_regex' is not supported; use exact, prefix, suffix or contains"),
    (by_id(), "node_matchers: a StringMatcher without a pattern is not supported; "
              "use exact, prefix, suffix or contains"),
    (node_pb2.NodeMatcher(node_metadatas=[{"path": [{"key": "k"}]}]),
     "node_matchers: node_metadatas are not supported; match on node_id"),
])
def test_unsupported_matchers_are_refused_even_with_no_client(matcher: Any, message: str) -> None:
    with pytest.raises(UnsupportedMatcher) as raised:
        node_ids(serving(), matcher)
    assert str(raised.value) == message


# -- /clients: how each type compares with the cache ---------------------------


def sync_of(ctx: ServingContext, type_url: str) -> tuple[str, dict[str, Any]]:
    """The one stream's ``sync`` and ``unsynced`` for ``type_url``, as /clients shows them."""
    [client] = ctx.client_statuses()
    state = client["types"][type_url]
    return state["sync"], state["unsynced"]


def put_variant(ctx: ServingContext, name: str, env: str, version: str) -> None:
    dpc = discovery_pb2.DynamicParameterConstraints(constraint={"key": "env", "value": env})
    resource = discovery_pb2.Resource(name=name, version=version, resource=pack(cluster(name)))
    ctx.cache.apply(CLUSTER, Update([CachedResource(CLUSTER, name, version, resource,
                                                    compile_constraints(dpc))]))


def subscribed_and_acked(ctx: ServingContext, *names: str, protocol: XdsProtocol = "delta",
                         type_url: str = CLUSTER) -> DownstreamStream:
    stream = open_stream(ctx, protocol)
    if protocol == "delta":
        send(stream, Delta(type_url=type_url, resource_names_subscribe=list(names)))
        [response] = sent(stream)
        send(stream, Delta(type_url=type_url, response_nonce=response.nonce))
    else:
        send(stream, Sotw(type_url=type_url, resource_names=list(names)))
        [response] = sent(stream)
        send(stream, Sotw(type_url=type_url, resource_names=list(names),
                          response_nonce=response.nonce, version_info=response.version_info))
    return stream


def test_every_resource_acked_at_the_cached_version_is_synced_and_lists_nothing() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    put(ctx, cluster("b"), "2")
    subscribed_and_acked(ctx, "a", "b")
    assert sync_of(ctx, CLUSTER) == ("synced", {})


def test_a_response_in_flight_is_stale() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    stream = open_stream(ctx)
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["a"]))
    sent(stream)
    assert sync_of(ctx, CLUSTER) == ("stale", {"a": {"status": "sent", "version": "1"}})


def test_a_cache_moved_on_from_what_the_client_acked_is_stale_with_the_cached_version() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    put(ctx, cluster("b"), "1")
    subscribed_and_acked(ctx, "a", "b")
    put(ctx, cluster("a", timeout_s=9), "2")  # not yet pushed
    assert sync_of(ctx, CLUSTER) == ("stale", {
        "a": {"status": "acked", "version": "1", "cached_version": "2"}})


def test_a_resource_the_cache_no_longer_has_is_stale_with_a_null_cached_version() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    subscribed_and_acked(ctx, "a")
    ctx.cache.apply(CLUSTER, Update(removed=["a"]))  # the removal not yet sent
    assert sync_of(ctx, CLUSTER) == ("stale", {
        "a": {"status": "acked", "version": "1", "cached_version": None}})


def test_a_nack_is_nacked_whatever_else_is_stale() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    put(ctx, cluster("b"), "7")
    stream = subscribed_and_acked(ctx, "a")
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["b"]))
    [response] = sent(stream)
    send(stream, Delta(type_url=CLUSTER, response_nonce=response.nonce,
                       error_detail=status_pb2.Status(code=3, message="bad b")))
    put(ctx, cluster("a", timeout_s=9), "2")
    assert sync_of(ctx, CLUSTER) == ("nacked", {
        "a": {"status": "acked", "version": "1", "cached_version": "2"},
        "b": {"status": "nacked", "version": "7"}})


def test_an_ack_after_a_sotw_nack_makes_the_type_synced_again() -> None:
    ctx = serving()
    put(ctx, endpoints("a", 1), "1")
    stream = subscribed_and_acked(ctx, "a", protocol="sotw", type_url=ENDPOINT)
    put(ctx, endpoints("a", 2), "2")
    [rejected] = sent(stream)
    send(stream, Sotw(type_url=ENDPOINT, resource_names=["a"], response_nonce=rejected.nonce,
                      error_detail=status_pb2.Status(code=3, message="bad port")))
    assert sync_of(ctx, ENDPOINT) == ("nacked", {"a": {"status": "nacked", "version": "2"}})
    put(ctx, endpoints("a", 3), "3")
    [accepted] = sent(stream)
    send(stream, Sotw(type_url=ENDPOINT, resource_names=["a"], response_nonce=accepted.nonce,
                      version_info=accepted.version_info))
    assert sync_of(ctx, ENDPOINT) == ("synced", {})


def test_a_cached_name_subscribed_and_not_sent_yet_is_not_sent() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    stream = open_stream(ctx)
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["a"]))  # not yet answered
    assert sync_of(ctx, CLUSTER) == ("not_sent", {
        "a": {"status": "requested", "cached_version": "1"}})


def test_a_wildcard_is_not_sent_a_name_the_cache_just_got() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    subscribed_and_acked(ctx, protocol="sotw")  # CDS: an empty first request is wildcard
    put(ctx, cluster("b"), "4")
    assert sync_of(ctx, CLUSTER) == ("not_sent", {
        "b": {"status": "requested", "cached_version": "4"}})


def test_names_the_origin_has_not_answered_or_says_do_not_exist_or_erred_stay_synced() -> None:
    ctx = serving()
    ctx.cache.apply(ENDPOINT, Update(removed=["gone"], errors=[discovery_pb2.ResourceError(
        resource_name=discovery_pb2.ResourceName(name="erred"),
        error_detail=status_pb2.Status(code=7, message="not allowed"))]))
    stream = open_stream(ctx)
    send(stream, Delta(type_url=ENDPOINT, resource_names_subscribe=["gone", "erred", "new"]))
    [response] = sent(stream)
    send(stream, Delta(type_url=ENDPOINT, response_nonce=response.nonce))
    assert sync_of(ctx, ENDPOINT) == ("synced", {
        "erred": {"status": "received_error", "error": "not allowed"},
        "gone": {"status": "does_not_exist"},
        "new": {"status": "requested"}})


def test_a_variant_is_compared_with_the_variant_sent_not_its_siblings() -> None:
    ctx = serving()
    put_variant(ctx, "a", "canary", "c1")
    put_variant(ctx, "a", "prod", "p1")
    stream = open_stream(ctx)
    send(stream, Delta(type_url=CLUSTER, resource_names_subscribe=["a"], node=base_pb2.Node(
        id="n1", dynamic_parameters={CLUSTER: {"params": {"env": "canary"}}})))
    [response] = sent(stream)
    send(stream, Delta(type_url=CLUSTER, response_nonce=response.nonce))
    put_variant(ctx, "a", "prod", "p2")
    assert sync_of(ctx, CLUSTER) == ("synced", {})
    put_variant(ctx, "a", "canary", "c2")
    assert sync_of(ctx, CLUSTER) == ("stale", {
        "a": {"status": "acked", "version": "c1", "cached_version": "c2"}})
