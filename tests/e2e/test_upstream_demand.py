"""End to end: no client's subscriptions cut the zone off its origin.

What clients make the relay subscribe upstream is bounded in all and per
client host (limits.upstream_names, limits.upstream_names_per_host): a
request past a bound is refused with RESOURCE_EXHAUSTED (REST: 429) and the
origin never sees it. An origin that refuses the relay's subscription anyway
(another relay, at its limits.names_per_stream) costs the clients whose names
it refused their streams, and nobody else anything: no reconnect loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import grpc
import pytest

from relay.app import Relay, build_relay
from relay.config import parse_config
from relay.xds_types import CLUSTER, ENDPOINT
from tests.harness import (
    ADS,
    TIMEOUT,
    ScriptedOrigin,
    XdsClient,
    cluster,
    eventually,
    names_of,
    node,
    relay_config,
    running_stack,
)

DELTA_ADS = ADS + "DeltaAggregatedResources"


async def refusal(client: XdsClient) -> grpc.aio.AioRpcError:
    """The error that ends ``client``'s stream before any response."""
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await client.recv()
    return error.value


def subscribed_upstream(origin: ScriptedOrigin) -> set[str]:
    """Every name the relay ever subscribed on the origin stream."""
    return {name for request in origin.all_requests()
            for name in request.resource_names_subscribe}


async def test_a_stream_past_the_upstream_total_is_refused_before_the_origin_sees_it() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, limits="upstream_names: 3") as stack:
        watcher = stack.client()
        await watcher.send(node=node("watcher"), type_url=CLUSTER, resource_names_subscribe=["a"])
        await watcher.ack(await watcher.recv())
        greedy = stack.client(delta=True)
        await greedy.send(node=node("greedy"), type_url=ENDPOINT,
                          resource_names_subscribe=["x1", "x2", "x3"])
        error = await refusal(greedy)
        assert (error.code(), error.details()) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "subscribing 3 more names would have the relay ask its origin for 4, more "
            "than it may (limits.upstream_names: 3)")
        assert subscribed_upstream(origin) == {"a"}
        # The watcher is served as before, on the same origin stream.
        stack.origin.set(cluster("a", timeout_s=4))
        assert names_of(await watcher.recv()) == ["a"]
        assert len(origin.streams) == 1


async def test_a_rest_poll_past_its_host_share_gets_429_before_the_origin_sees_it() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, limits="upstream_names_per_host: 2",
                             rest='address: "127.0.0.1:0"') as stack:
        url = f"http://127.0.0.1:{stack.relay.rest_port}/v3/discovery:endpoints"
        body = {"node": {"id": "poller"}, "resource_names": ["x1", "x2", "x3"]}
        async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == "1"
            assert await response.text() == (
                "clients at ipv4:127.0.0.1 would hold 3 names, more than one host may "
                "(limits.upstream_names_per_host: 2)\n")
        assert subscribed_upstream(origin) == set()


@asynccontextmanager
async def chained(origin_limits: str) -> AsyncIterator[tuple[ScriptedOrigin, Relay, Relay]]:
    """origin -> an upstream relay with ``origin_limits`` -> the relay under test."""
    origin = await ScriptedOrigin().start()
    upper = build_relay(parse_config(relay_config(origin.port, limits=origin_limits)))
    await upper.start()
    relay = build_relay(parse_config(relay_config(upper.xds_port)))
    await relay.start()
    try:
        yield origin, upper, relay
    finally:
        await relay.stop(0)
        await upper.stop(0)
        await origin.stop()


async def test_an_origin_refusing_the_subscription_costs_only_the_clients_it_refused() -> None:
    async with chained("names_per_stream: 6") as (origin, upper, relay):
        origin.set(cluster("a"), cluster("b"))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}") as channel:
            watcher = XdsClient(channel, DELTA_ADS, True)
            await watcher.send(node=node("watcher"), type_url=CLUSTER,
                               resource_names_subscribe=["a", "b"])
            first = await watcher.recv()
            assert sorted(names_of(first)) == ["a", "b"]
            await watcher.ack(first)
            # Six more names: the upper relay ends the relay's stream for them.
            greedy = XdsClient(channel, DELTA_ADS, True)
            made_up = [f"made-up-{i}" for i in range(6)]
            await greedy.send(node=node("greedy"), type_url=ENDPOINT,
                              resource_names_subscribe=made_up)
            error = await refusal(greedy)
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error.details().startswith(
                "the origin refused the relay's subscription to this stream's names (")
            # One new stream to the upper relay, without the refused names.
            await eventually(lambda: relay.upstream is not None
                             and relay.upstream.connected_event.is_set()
                             and relay.upstream.streams_opened == 2)
            assert relay.index.wanted_locators(ENDPOINT) == {}
            await eventually(lambda: len(upper.serving.streams) == 1)
            # The watcher kept its config and gets what changes.
            origin.set(cluster("a", timeout_s=7), cluster("b"))
            update = await watcher.recv(TIMEOUT)
            assert names_of(update) == ["a"]
            await watcher.ack(update)
            # Asking again is refused at once, and breaks nothing.
            again = XdsClient(channel, DELTA_ADS, True)
            await again.send(node=node("greedy"), type_url=ENDPOINT,
                             resource_names_subscribe=made_up[:1])
            error = await refusal(again)
            assert (error.code(), error.details()) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "the origin refused the relay's subscription to ClusterLoadAssignment "
                "'made-up-0' lately; not asked again for 60s")
            await watcher.expect_nothing()
            assert relay.upstream is not None and relay.upstream.streams_opened == 2
            for client in (watcher, greedy, again):
                client.close()
