"""End to end: a client's first answers go out as soon as the last of them is
in, not when the batch window closes; changes to what clients hold still wait
for it (the rest of the origin's burst may change what goes out, and in which
order: invariant 20).

The window is a minute long, so a push that waited for it would not come
within the test's timeout. The upstream's own window and the settling of
names run on a manual clock, moved by the test only to let the relay
subscribe: no name the origin has not sent is ever taken as absent.
"""

from __future__ import annotations

import asyncio

import pytest

from relay.xds_types import CLUSTER, ENDPOINT
from tests.clock import ManualClock
from tests.harness import (
    TIMEOUT,
    ScriptedOrigin,
    cluster,
    endpoints,
    eventually,
    names_of,
    node,
    running_stack,
)

WINDOW = "60s"


async def subscribed_upstream(origin: ScriptedOrigin, clock: ManualClock, type_url: str,
                              name: str) -> None:
    """Move the clock past the upstream's window until the relay subscribes
    ``name`` at the origin (the window's timer may not be set yet)."""
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while not any(name in stream.subscribed.get(type_url, ()) for stream in origin.streams):
        assert asyncio.get_running_loop().time() < deadline, f"{name} never subscribed"
        await clock.advance(60)
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("delta", [True, False], ids=["delta", "sotw"])
async def test_first_answers_go_out_once_the_last_is_in_updates_wait_for_the_window(
        delta: bool) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), version="v1")
    clock = ManualClock()
    async with running_stack(origin, clock=clock, server=f"batch_window: {WINDOW}") as stack:
        client = stack.client(delta=delta)
        if delta:
            await client.send(node=node(), type_url=CLUSTER, resource_names_subscribe=["a", "b"])
        else:
            await client.send(node=node(), type_url=CLUSTER, resource_names=["a", "b"])
        await subscribed_upstream(origin, clock, CLUSTER, "b")
        await eventually(lambda: "a" in stack.relay.cache.names(CLUSTER))
        # a is in, b is not: the client waits for both, and the window holds a
        await client.expect_nothing()

        origin.set(cluster("b"), version="v1")
        first = await client.recv()  # (within the timeout: long before the window)
        assert (first.type_url, sorted(names_of(first))) == (CLUSTER, ["a", "b"])
        if delta:
            assert [r.version for r in first.resources] == ["v1", "v1"]
            await client.ack(first)
        else:
            await client.ack(first, resource_names=["a", "b"])

        # An update of what the client holds waits for the rest of the burst.
        origin.set(cluster("a", timeout_s=3), version="v2")
        await eventually(lambda: stack.relay.cache.variants(CLUSTER, "a")[""].version == "v2")
        await client.expect_nothing()


async def test_first_answers_wait_for_the_window_while_another_type_has_changes() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), version="v1")
    clock = ManualClock()
    async with running_stack(origin, clock=clock, server=f"batch_window: {WINDOW}") as stack:
        client = stack.client(delta=True)
        await client.send(node=node(), type_url=CLUSTER, resource_names_subscribe=["a"])
        await subscribed_upstream(origin, clock, CLUSTER, "a")
        first = await client.recv()  # (the relay's very first answer of the type)
        assert sorted(names_of(first)) == ["a"]
        await client.ack(first)
        await client.send(type_url=ENDPOINT, resource_names_subscribe=["e"])
        await subscribed_upstream(origin, clock, ENDPOINT, "e")
        # The cluster changes, then the awaited endpoints come: the change of
        # what the client holds is marked, so the endpoints wait with it.
        origin.set(cluster("a", timeout_s=3), version="v2")
        await eventually(lambda: stack.relay.cache.variants(CLUSTER, "a")[""].version == "v2")
        origin.set(endpoints("e", 1001), version="v1")
        await eventually(lambda: "e" in stack.relay.cache.names(ENDPOINT))
        await client.expect_nothing()
