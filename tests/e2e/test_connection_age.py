"""End to end: connections retired for their age (server.max_connection_age).

A retired connection's streams end with UNAVAILABLE after the grace; the
client reconnects, and what it declares it holds is not sent again, nor asked
of the origin again.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from relay.app import connection_age_options
from relay.xds_types import CLUSTER
from tests.harness import TIMEOUT, ScriptedOrigin, cluster, names_of, node, running_stack


def test_the_age_becomes_gRPC_options_and_zero_turns_it_off() -> None:
    assert connection_age_options(1800.0, 10.0) == [
        ("grpc.max_connection_age_ms", 1_800_000), ("grpc.max_connection_age_grace_ms", 10_000)]
    assert connection_age_options(0.0, 10.0) == []


@pytest.mark.parametrize("delta", [True, False], ids=["delta", "sotw"])
async def test_invariant_32_a_retired_connection_ends_its_streams_and_the_client_comes_back(
        delta: bool) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, linger="30s",
                             server="max_connection_age: 1s, max_connection_age_grace: 300ms"
                             ) as stack:
        client = stack.client(delta=delta)
        subscribe = {"resource_names_subscribe": ["a"]} if delta else {"resource_names": ["a"]}
        await client.send(node=node("aged"), type_url=CLUSTER, **subscribe)
        first = await client.recv()
        assert names_of(first) == ["a"]
        await client.ack(first, **({} if delta else {"resource_names": ["a"]}))
        asked = len(origin.subscription_requests())
        opened = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await client.recv(TIMEOUT)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        # the age (±10 %) and the grace, give or take the scheduling of a busy machine
        assert time.monotonic() - opened < 1.1 + 0.3 + 2.0
        again = stack.client(delta=delta)
        if delta:
            version = first.resources[0].version
            await again.send(node=node("aged"), type_url=CLUSTER, resource_names_subscribe=["a"],
                             initial_resource_versions={"a": version})
            await again.expect_nothing()
        else:
            await again.send(node=node("aged"), type_url=CLUSTER, resource_names=["a"],
                             version_info=first.version_info)
            answer = await again.recv()  # SotW: from cache, all there is
            assert names_of(answer) == ["a"]
        assert len(origin.subscription_requests()) == asked
        await asyncio.sleep(0)
