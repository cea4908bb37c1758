"""Churning clients cost the origin at most one subscription change per type
per batch window (issue 14, "no amplification").

Fifty delta clients subscribe and unsubscribe random names of one type (a
fixed seed decides which; what each ends up wanting does not depend on
timing), as fast as they can or with random pauses, ACKing everything they
get; then some of them leave. The origin must see at most one subscription
change per window (exactly one, with the relay's clock standing still), and
end up subscribed to exactly the union of what the remaining clients want
(no unsubscribe lost, no subscribe missing), each of which holds every name
it wants.

Run with ``-s`` to see the figures (downstream changes, upstream changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import ENDPOINT
from tests.builders import endpoints
from tests.clock import ManualClock
from tests.harness import (
    ADS,
    DELTA,
    QUIET,
    ScriptedOrigin,
    Stack,
    eventually,
    node,
    running_stack,
)

SEED = 14
CLIENTS = 50
CHANGES = 15  # subscription changes per client
LEAVING = 10  # clients that leave once the churn is over
NAMES = [f"e{i:03d}" for i in range(1000)]
# the most a client thinks between two changes on the real clock, so that
# changes come spread out in time, as from real clients
PAUSE = 0.2


class Churner:
    """A delta client of ``ENDPOINT`` changing its subscription at random
    and ACKing every response."""

    def __init__(self, channel: grpc.aio.Channel, node_id: str, rng: random.Random) -> None:
        self.node_id = node_id
        self.rng = rng
        self.call: Any = channel.stream_stream(
            ADS + "DeltaAggregatedResources", request_serializer=DELTA.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
        self.wanted: set[str] = set()
        # of what it wants, the names it has been sent (and not told removed)
        self.held: set[str] = set()
        self.changes = 0
        self.acks = 0
        self._greeted = False
        self._writing = asyncio.Lock()  # one write at a time on a gRPC call
        self._reader = asyncio.create_task(self._read())

    async def churn(self, changes: int, pause: float = 0.0) -> None:
        """``changes`` random changes; between them, a random pause of up to ``pause``."""
        for _ in range(changes):
            if pause:
                await asyncio.sleep(self.rng.uniform(0, pause))
            if self.wanted and self.rng.random() < 0.5:
                name = self.rng.choice(sorted(self.wanted))
                self.wanted.discard(name)
                self.held.discard(name)
                await self._send(resource_names_unsubscribe=[name])
            else:
                name = self.rng.choice(sorted(set(NAMES) - self.wanted))
                self.wanted.add(name)
                await self._send(resource_names_subscribe=[name])
            self.changes += 1

    async def _send(self, **fields: Any) -> None:
        async with self._writing:
            if not self._greeted:
                self._greeted = True
                fields["node"] = node(self.node_id)
            await self.call.write(DELTA(type_url=ENDPOINT, **fields))

    async def _read(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for response in self.call:
                # A response sent before an unsubscribe may arrive after it.
                self.held.update(r.name for r in response.resources if r.name in self.wanted)
                self.held.difference_update(response.removed_resources)
                await self._send(response_nonce=response.nonce)
                self.acks += 1

    def close(self) -> None:
        self._reader.cancel()
        self.call.cancel()


@dataclass
class Churned:
    """What a churn cost, downstream and upstream."""

    downstream: int  # subscription changes the clients sent
    downstream_acks: int
    upstream: int  # subscription changes the origin got
    upstream_all: int  # every request the origin got (the relay's ACKs too)
    seconds: float  # from the first change until the origin held the union

    def __str__(self) -> str:
        return (f"{self.downstream} downstream subscription changes (+{self.downstream_acks} "
                f"ACKs) -> {self.upstream} upstream subscription changes "
                f"({self.upstream_all} requests with ACKs) in {self.seconds:.2f}s")


def clients(stack: Stack) -> list[Churner]:
    """The churning clients, each with its own seeded choices: what each ends
    up wanting does not depend on timing."""
    rng = random.Random(SEED)
    return [Churner(stack.channel, f"churn-{i}", random.Random(rng.random()))
            for i in range(CLIENTS)]


def union(clients: list[Churner]) -> set[str]:
    return set().union(*(c.wanted for c in clients))


def upstream_changes(origin: ScriptedOrigin) -> list[discovery_pb2.DeltaDiscoveryRequest]:
    return [r for r in origin.subscription_requests() if r.type_url == ENDPOINT]


async def churn(stack: Stack, pause: float = 0.0) -> Churned:
    """Churn, let some clients leave, and wait for the origin and the others
    to agree on what is wanted."""
    origin = stack.origin
    await eventually(lambda: origin.streams)  # what follows is interest, not the connect
    churners = clients(stack)
    try:
        started = time.monotonic()
        await asyncio.gather(*(c.churn(CHANGES, pause) for c in churners))
        for leaving in churners[:LEAVING]:
            leaving.close()
        staying = churners[LEAVING:]
        await eventually(lambda: origin.stream.subscribed.get(ENDPOINT, set()) == union(staying)
                         and all(c.held == c.wanted for c in staying), timeout=20)
        seconds = time.monotonic() - started
    finally:
        for client in churners:
            client.close()
    result = Churned(
        sum(c.changes for c in churners), sum(c.acks for c in churners),
        len(upstream_changes(origin)), len(origin.all_requests()), seconds)
    print(f"\n{result}")
    return result


def churning_origin() -> ScriptedOrigin:
    origin = ScriptedOrigin()
    origin.set(*(endpoints(name, 1) for name in NAMES))
    return origin


async def test_a_churn_within_one_window_is_one_change_for_the_origin() -> None:
    clock = ManualClock()  # time stands still until the test moves it
    window = 0.005
    origin = churning_origin()
    async with running_stack(origin, clock=clock, server=f"batch_window: {window}s") as stack:
        await eventually(lambda: origin.streams)
        churners = clients(stack)
        await asyncio.gather(*(c.churn(CHANGES) for c in churners))
        everyone, staying = union(churners), union(churners[LEAVING:])
        assert everyone != staying  # the leaving clients take names with them

        def relay_wants() -> set[str]:
            return set(stack.relay.index.wanted_locators(ENDPOINT))

        await eventually(lambda: relay_wants() == everyone)
        await asyncio.sleep(QUIET)  # anything still in flight lands in the window too
        assert upstream_changes(origin) == []  # the window is open
        await clock.advance(window)
        await eventually(lambda: upstream_changes(origin))
        await asyncio.sleep(QUIET)
        [change] = upstream_changes(origin)
        assert sorted(change.resource_names_subscribe) == sorted(everyone)
        assert not change.resource_names_unsubscribe
        await eventually(lambda: all(c.held == c.wanted for c in churners))

        for leaving in churners[:LEAVING]:
            leaving.close()
        await eventually(lambda: relay_wants() == staying)
        await asyncio.sleep(QUIET)
        assert len(upstream_changes(origin)) == 1
        await clock.advance(window)
        await eventually(lambda: len(upstream_changes(origin)) == 2)
        await asyncio.sleep(QUIET)
        [_, change] = upstream_changes(origin)
        assert sorted(change.resource_names_unsubscribe) == sorted(everyone - staying)
        assert not change.resource_names_subscribe
        assert origin.stream.subscribed[ENDPOINT] == staying
        for client in churners:
            client.close()


async def test_clients_churning_while_time_moves_cost_one_change_per_window_at_most() -> None:
    clock = ManualClock()
    window = 0.005
    windows = 0

    async def move_time() -> None:
        # Each step closes whatever window is open (they all opened at the
        # time the clock stood at), and at most one: any opened meanwhile
        # closes a window later.
        nonlocal windows
        while True:
            await asyncio.sleep(0.02)
            await clock.advance(window)
            windows += 1

    async with running_stack(churning_origin(), clock=clock,
                             server=f"batch_window: {window}s") as stack:
        mover = asyncio.create_task(move_time())
        try:
            result = await churn(stack)
        finally:
            mover.cancel()
    assert result.downstream == CLIENTS * CHANGES
    assert result.upstream <= windows


async def test_clients_churning_on_the_real_clock_cost_one_change_per_window_at_most(
) -> None:
    window = 0.005  # server.batch_window's default
    async with running_stack(churning_origin(), server=f"batch_window: {window}s") as stack:
        result = await churn(stack, pause=PAUSE)
    assert result.downstream == CLIENTS * CHANGES
    # A window opens no sooner than the previous one closed.
    assert result.upstream <= result.seconds / window + 1


async def test_without_a_window_churning_clients_still_get_exactly_what_they_want() -> None:
    async with running_stack(churning_origin(), server="batch_window: 0s") as stack:
        result = await churn(stack, pause=PAUSE)
    assert result.downstream == CLIENTS * CHANGES
