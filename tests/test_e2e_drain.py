"""Graceful drain: readiness off, new streams refused, open ones closed spread out."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from relay.app import drain_schedule
from relay.server.services import DRAINING
from relay.xds_types import CLUSTER
from tests.harness import ScriptedOrigin, XdsClient, cluster, node, running_stack


def test_drain_schedule_spreads_closes_evenly_from_the_start() -> None:
    assert drain_schedule(4, 2.0) == [0.0, 0.5, 1.0, 1.5]
    assert drain_schedule(1, 10.0) == [0.0]
    assert drain_schedule(0, 10.0) == []


async def _closed_at(client: XdsClient, updates: list[str]) -> float:
    """When the relay ended this client's stream; records versions received meanwhile."""
    while True:
        try:
            response = await client.recv(timeout=10)
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert error.details() == DRAINING
            return asyncio.get_running_loop().time()
        updates.extend(r.version for r in response.resources)
        await client.ack(response)


async def test_drain_refuses_new_streams_and_closes_open_ones_spread_over_the_period() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), version="v1")
    async with running_stack(origin) as stack:
        clients = [stack.client(delta=True) for _ in range(4)]
        for i, client in enumerate(clients):
            await client.send(node=node(f"n{i}"), type_url=CLUSTER)
            await client.ack(await client.recv())
        loop = asyncio.get_running_loop()
        started = loop.time()
        health = health_pb2_grpc.HealthStub(stack.channel)
        status = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        drain = asyncio.create_task(stack.relay.drain(period=2.0))
        await asyncio.sleep(0.05)
        assert stack.relay.admin.route("GET", "/ready").status == 503
        assert stack.relay.admin.route("GET", "/ready").body == b"not ready: draining\n"
        health = health_pb2_grpc.HealthStub(stack.channel)
        status = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING

        late = stack.client(delta=True)
        await late.send(node=node("late"), type_url=CLUSTER)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await late.recv()
        assert (refused.value.code(), refused.value.details()) == (
            grpc.StatusCode.UNAVAILABLE, DRAINING)

        # Clients still connected keep getting the origin's updates.
        updates: list[list[str]] = [[] for _ in clients]
        closing = [asyncio.create_task(_closed_at(c, u))
                   for c, u in zip(clients, updates, strict=True)]
        await asyncio.sleep(0.2)
        origin.set(cluster("a", timeout_s=2), version="v2")
        closed = sorted(t - started for t in await asyncio.gather(*closing))
        await drain
        assert closed[0] < 0.4, closed                # the first goes at once
        assert 1.3 < closed[-1] < 2.5, closed         # the last near the period's end
        assert closed[-1] - closed[0] > 1.0, closed   # not all at once
        assert sum(u == ["v2"] for u in updates) >= 2, updates
        assert stack.relay.serving.streams == set()
