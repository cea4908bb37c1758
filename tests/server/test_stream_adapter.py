"""DownstreamStream without gRPC: what the adapter adds to its session.

It registers interest in the index, sends re-fetches up through it, encodes
responses, counts and logs; the protocol rules themselves are the session's
(tests/protocol/test_session.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ResourceCache, Update
from relay.constraints import EMPTY_PARAMS
from relay.core import Core
from relay.interest import InterestIndex
from relay.resource import CachedResource
from relay.server.serving import NAMES_PER_TURN, ServingContext
from relay.server.streams import DownstreamStream
from relay.telemetry import new_metrics
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints, pack

Delta = discovery_pb2.DeltaDiscoveryRequest


def serving() -> ServingContext:
    return Core.create().serving


def put(ctx: ServingContext, type_url: str, name: str, msg: object, version: str = "1",
        do_not_cache: bool = False) -> None:
    resource = discovery_pb2.Resource(name=name, version=version, resource=pack(msg))  # type: ignore[arg-type]
    resource.cache_control.do_not_cache = do_not_cache
    ctx.cache.apply(type_url, Update([CachedResource(type_url, name, version, resource)]))


def decoded(stream: DownstreamStream) -> list[discovery_pb2.DeltaDiscoveryResponse]:
    return [discovery_pb2.DeltaDiscoveryResponse.FromString(b) for b in stream.ready_responses()]


@dataclass
class Up:
    refetches: list[tuple[str, frozenset[str]]] = field(default_factory=list)

    def interest_changed(self, type_url: str, names: Iterable[str]) -> None:
        pass

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        self.refetches.append((type_url, names))


def test_subscriptions_reach_the_index_and_leave_with_the_stream() -> None:
    ctx = serving()
    stream = DownstreamStream(ctx, "sotw", "peer")
    stream.handle_request(discovery_pb2.DiscoveryRequest(type_url=ENDPOINT,
                                                         resource_names=["a", "b"]))
    assert ctx.index.wanted_locators(ENDPOINT) == {"a": frozenset({EMPTY_PARAMS}),
                                                   "b": frozenset({EMPTY_PARAMS})}
    ctx.index.remove(stream)
    assert ctx.index.wanted_locators(ENDPOINT) == {}


def test_cache_changes_reach_the_stream_through_the_index() -> None:
    ctx = serving()
    stream = DownstreamStream(ctx, "delta", "peer")
    stream.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    put(ctx, ENDPOINT, "a", endpoints("a"))
    [response] = decoded(stream)
    assert [r.name for r in response.resources] == ["a"]
    put(ctx, CLUSTER, "a", cluster("a"))
    assert decoded(stream) == []


def test_refetches_go_up_through_the_index() -> None:
    ctx = serving()
    up = Up()
    ctx.index.link(up)
    put(ctx, ENDPOINT, "a", endpoints("a"), do_not_cache=True)
    stream = DownstreamStream(ctx, "delta", "peer")
    stream.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    assert decoded(stream) == []
    assert up.refetches == [(ENDPOINT, frozenset({"a"}))]


def test_acks_nacks_and_pushes_are_counted() -> None:
    ctx = serving()
    put(ctx, CLUSTER, "a", cluster("a"))
    stream = DownstreamStream(ctx, "delta", "peer")
    stream.handle_request(Delta(type_url=CLUSTER, resource_names_subscribe=["a"]))
    [first] = decoded(stream)
    stream.handle_request(Delta(type_url=CLUSTER, response_nonce=first.nonce))
    put(ctx, CLUSTER, "a", cluster("a", timeout_s=2), version="2")
    [second] = decoded(stream)
    stream.handle_request(Delta(type_url=CLUSTER, response_nonce=second.nonce,
                                error_detail={"code": 3, "message": "no"}))
    metrics = ctx.metrics
    assert metrics.downstream_pushes.counts == {("delta", "Cluster"): 2}
    assert metrics.downstream_acks.counts == {("delta", "Cluster"): 1}
    assert metrics.downstream_nacks.counts == {("delta", "Cluster"): 1}


async def test_a_stream_holding_many_names_is_forgotten_over_several_turns() -> None:
    serving = ServingContext.create(ResourceCache(), InterestIndex(), new_metrics())
    stream = DownstreamStream(serving, "delta", "peer")
    names = [f"n{i}" for i in range(2 * NAMES_PER_TURN + 1)]
    stream.handle_request(discovery_pb2.DeltaDiscoveryRequest(
        type_url=ENDPOINT, resource_names_subscribe=names))
    serving.leave(stream)
    # One slice went at once; the rest go a slice per turn of the event loop.
    assert len(serving.index.wanted_locators(ENDPOINT)) == NAMES_PER_TURN + 1
    left = []
    for _ in range(6):
        await asyncio.sleep(0)
        left.append(len(serving.index.wanted_locators(ENDPOINT)))
    assert sorted(set(left), reverse=True) == [NAMES_PER_TURN + 1, 1, 0]
