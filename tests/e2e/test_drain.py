"""Graceful drain: readiness off, new streams refused, open ones closed spread out."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from relay.app import drain_schedule
from relay.server.services import DRAINING
from relay.xds_types import CLUSTER
from tests.clock import ManualClock
from tests.harness import ScriptedOrigin, XdsClient, cluster, eventually, node, running_stack


def test_drain_schedule_spreads_closes_evenly_from_the_start() -> None:
    assert drain_schedule(4, 2.0) == [0.0, 0.5, 1.0, 1.5]
    assert drain_schedule(1, 10.0) == [0.0]
    assert drain_schedule(0, 10.0) == []


async def closed(client: XdsClient) -> bool:
    """Whether the relay has ended this client's stream (for the drain)."""
    try:
        response = await client.recv(timeout=0.05)
    except TimeoutError:
        return False
    except grpc.aio.AioRpcError as error:
        assert (error.code(), error.details()) == (grpc.StatusCode.UNAVAILABLE, DRAINING)
        return True
    raise AssertionError(f"unexpected response: {response}")


async def test_drain_refuses_new_streams_and_closes_open_ones_spread_over_the_period() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), version="v1")
    clock = ManualClock()
    async with running_stack(origin, clock=clock) as stack:
        clients = [stack.client(delta=True) for _ in range(4)]
        for i, client in enumerate(clients):
            await client.send(node=node(f"n{i}"), type_url=CLUSTER)
            await client.ack(await client.recv())
        health = health_pb2_grpc.HealthStub(stack.channel)
        status = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        drain = asyncio.create_task(stack.relay.drain(period=2.0))
        # The first stream goes at once; the drain then sleeps until the next.
        await eventually(lambda: len(stack.relay.serving.streams) == 3 and clock.sleepers())
        assert stack.relay.admin.route("GET", "/ready").status == 503
        assert stack.relay.admin.route("GET", "/ready").body == b"not ready: draining\n"
        status = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING

        # Refused as it opens, before its first request is read. No request is
        # written: a write racing the refusal fails locally and gRPC then
        # reports its own INTERNAL status in place of the relay's.
        late = stack.client(delta=True)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await late.recv()
        assert (refused.value.code(), refused.value.details()) == (
            grpc.StatusCode.UNAVAILABLE, DRAINING)

        # Clients still connected keep getting the origin's updates.
        still_open = [c for c in clients if not await closed(c)]
        assert len(still_open) == 3
        origin.set(cluster("a", timeout_s=2), version="v2")
        for client in still_open:
            update = await client.recv()
            assert [r.version for r in update.resources] == ["v2"]
            await client.ack(update)
        # One stream every period / 4 = 0.5 s of the drain's clock, none sooner.
        for left in (2, 1, 0):
            await clock.advance(0.25)
            assert len(stack.relay.serving.streams) == left + 1
            await clock.advance(0.25)
            await eventually(lambda n=left: len(stack.relay.serving.streams) == n)
        await drain
        assert all([await closed(c) for c in still_open])
        assert stack.relay.serving.streams == set()
