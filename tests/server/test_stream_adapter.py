"""DownstreamStream without gRPC: requests in, encoded responses out, in order."""

from __future__ import annotations

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import Update
from relay.core import Core
from relay.interest import Interest
from relay.protocol.outcome import ProtocolError
from relay.resource import CachedResource
from relay.server.streams import DownstreamStream, ServingContext
from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE, RUNTIME
from tests.builders import cluster, endpoints, listener, pack, route

Delta = discovery_pb2.DeltaDiscoveryRequest


def serving() -> ServingContext:
    return Core.create().serving


def put(ctx: ServingContext, type_url: str, name: str, msg: object, version: str = "1") -> None:
    resource = discovery_pb2.Resource(name=name, version=version, resource=pack(msg))  # type: ignore[arg-type]
    ctx.cache.apply(type_url, Update([CachedResource(type_url, name, version, resource)]))


def decoded(stream: DownstreamStream) -> list[discovery_pb2.DeltaDiscoveryResponse]:
    return [discovery_pb2.DeltaDiscoveryResponse.FromString(b) for b in stream.ready_responses()]


def test_invariant_20_types_go_out_in_make_before_break_order() -> None:
    ctx = serving()
    stream = DownstreamStream(ctx, "delta", "peer")
    for type_url, names in ((RUNTIME, ["rt"]), (ROUTE, ["x"]), (LISTENER, []),
                            (ENDPOINT, ["x"]), (CLUSTER, [])):
        stream.handle_request(Delta(type_url=type_url, resource_names_subscribe=names))
    # One origin change touching every type arrives before the stream writes.
    for type_url, name, msg in ((ROUTE, "x", route("x")), (RUNTIME, "rt", cluster("rt")),
                                (LISTENER, "l", listener("l")), (ENDPOINT, "x", endpoints("x")),
                                (CLUSTER, "x", cluster("x"))):
        put(ctx, type_url, name, msg)
    order = [r.type_url for r in decoded(stream)]
    assert order == [CLUSTER, ENDPOINT, LISTENER, ROUTE, RUNTIME]


def test_invariant_24_node_of_first_request_is_kept() -> None:
    ctx = serving()
    stream = DownstreamStream(ctx, "delta", "peer")
    stream.handle_request(Delta(type_url=CLUSTER, node={"id": "first"}))
    stream.handle_request(Delta(type_url=ENDPOINT, node={"id": "second"},
                                resource_names_subscribe=["a"]))
    assert stream.node_id == "first"


def test_invariant_19_no_response_for_unsubscribed_type() -> None:
    ctx = serving()
    stream = DownstreamStream(ctx, "delta", "peer")
    stream.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    put(ctx, CLUSTER, "a", cluster("a"))
    put(ctx, ENDPOINT, "b", endpoints("b"))
    assert decoded(stream) == []


def test_subscriptions_reach_the_index_and_leave_with_the_stream() -> None:
    ctx = serving()
    stream = DownstreamStream(ctx, "sotw", "peer")
    stream.handle_request(discovery_pb2.DiscoveryRequest(type_url=ENDPOINT,
                                                         resource_names=["a", "b"]))
    assert ctx.index.wanted(ENDPOINT) == Interest(frozenset({"a", "b"}))
    ctx.index.remove(stream)
    assert ctx.index.wanted(ENDPOINT) == Interest()


@pytest.mark.parametrize("fixed,type_url,problem", [
    (None, "", "type_url is required"),
    (CLUSTER, LISTENER, "sent on the discovery service for"),
])
def test_malformed_requests_raise_protocol_errors(fixed: str | None, type_url: str,
                                                  problem: str) -> None:
    stream = DownstreamStream(serving(), "delta", "peer", fixed)
    with pytest.raises(ProtocolError, match=problem):
        stream.handle_request(Delta(type_url=type_url))


def test_per_type_stream_accepts_empty_type_url() -> None:
    ctx = serving()
    put(ctx, CLUSTER, "a", cluster("a"))
    stream = DownstreamStream(ctx, "delta", "peer", CLUSTER)
    stream.handle_request(Delta())
    [response] = decoded(stream)
    assert response.type_url == CLUSTER and [r.name for r in response.resources] == ["a"]
