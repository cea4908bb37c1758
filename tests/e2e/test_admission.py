"""End to end: new streams past limits.new_streams_per_second wait their turn
briefly, then are refused with UNAVAILABLE; streams already open never notice."""

from __future__ import annotations

import asyncio

import grpc

from relay.server.services import NEW_STREAMS
from relay.xds_types import CLUSTER
from tests.e2e.test_hostile import limited
from tests.harness import TIMEOUT, ScriptedOrigin, XdsClient, cluster, names_of, node, running_stack


async def outcome(client: XdsClient, name: str) -> str | grpc.aio.AioRpcError:
    """Subscribe to ``a``: the name served, or the error that ended the stream."""
    await client.send(node=node(name), type_url=CLUSTER, resource_names_subscribe=["a"])
    try:
        return ",".join(names_of(await client.recv(TIMEOUT)))
    except grpc.aio.AioRpcError as error:
        return error


async def test_invariant_33_a_storm_past_the_rate_is_turned_away_open_streams_served() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, limits="new_streams_per_second: 1, new_streams_burst: 1"
                             ) as stack:
        # the burst, then (a second later) the rate: the first is served at once
        watcher = stack.client()
        assert await outcome(watcher, "watcher") == "a"
        await watcher.ack(watcher.responses[-1])
        storm = [stack.client() for _ in range(6)]
        results = await asyncio.gather(*(outcome(c, f"storm-{i}") for i, c in enumerate(storm)))
        refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
        served = [r for r in results if r == "a"]
        # One waits its turn (about a second); those that would wait longer are refused.
        assert len(served) + len(refused) == 6
        assert refused and len(served) <= 3
        assert {(e.code(), e.details()) for e in refused} == {
            (grpc.StatusCode.UNAVAILABLE, NEW_STREAMS)}
        assert limited(stack, "new_streams_per_second") == len(refused)
        stack.origin.set(cluster("a", timeout_s=3))
        assert names_of(await watcher.recv()) == ["a"]
