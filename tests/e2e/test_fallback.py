"""Fallback servers of an origin (gRFC A71), over real gRPC on loopback.

A relay follows a primary and a fallback, both scripted origins (or a port
nobody listens on, for a primary that is down): it moves to the fallback
only when the primary is unreachable and a client wants something the cache
lacks, goes back to the primary (closing the fallback's stream) as soon as
the primary answers, and resyncs at each move as after a reconnect.

The relay is given its servers as the --workers hub hook does (``origin``
of :func:`~relay.app.build_relay`), so that these tests exercise the client
whatever builds its servers from ``upstream.fallback``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import grpc

from relay.app import Relay, build_relay
from relay.clock import Clock
from relay.config import parse_config
from relay.upstream.dial import Dialer
from relay.xds_types import CLUSTER, ENDPOINT, WILDCARD
from tests.clock import ManualClock
from tests.e2e.test_metrics import labels, scrape, series
from tests.harness import (
    ADS,
    ScriptedOrigin,
    XdsClient,
    cluster,
    endpoints,
    eventually,
    names_of,
    node,
    relay_config,
    serving_relay,
)
from tests.ports import free_port

DELTA_ADS = ADS + "DeltaAggregatedResources"
PATIENCE = 10.0
# relay_config's backoff: {initial: 0.05s, max: 0.5s}
BACKOFF_MAX = 0.5


class EndingOrigin(ScriptedOrigin):
    """A scripted origin that tells the streams still open (the relay closes them)."""

    def open_streams(self) -> int:
        return sum(not stream.ended.is_set() for stream in self.streams)


@contextlib.asynccontextmanager
async def following(primary_port: int, fallback_port: int, clock: Clock | None = None
                    ) -> AsyncIterator[tuple[Relay, grpc.aio.Channel]]:
    """A relay whose origin is the server on ``primary_port``, then the one on
    ``fallback_port`` (its timers on ``clock``); and a channel to it."""
    servers = [Dialer(f"127.0.0.1:{primary_port}", connect_timeout=2.0),
               Dialer(f"127.0.0.1:{fallback_port}", connect_timeout=2.0,
                      key="upstream.fallback[0]")]
    # With a clock the test moves, no batch window to move past as well.
    config = relay_config(primary_port, server="batch_window: 0s" if clock else "")
    relay = build_relay(parse_config(config), clock, origin=servers)
    async with serving_relay(relay) as channel:
        yield relay, channel


def in_use(relay: Relay) -> str:
    assert relay.upstream is not None
    return relay.upstream.status().server


async def test_invariant_38_primary_down_at_start_fallback_serves_until_primary_answers() -> None:
    primary_port = free_port()  # nobody listens there yet
    fallback = await EndingOrigin().start()
    fallback.set(cluster("a"), version="v1")
    primary = EndingOrigin()
    primary.set(cluster("a"), cluster("b"), version="v1")
    async with following(primary_port, fallback.port) as (relay, channel):
        assert relay.upstream is not None
        client = XdsClient(channel, DELTA_ADS, delta=True)
        await client.send(node=node("d"), type_url=CLUSTER, resource_names_subscribe=[WILDCARD])
        first = await client.recv(PATIENCE)
        assert [(r.name, r.version) for r in first.resources] == [("a", "v1")]
        await client.ack(first)
        status = relay.upstream.status()
        assert (status.in_use, status.server, status.on_fallback) == (
            1, f"127.0.0.1:{fallback.port}", True)
        assert status.connected and status.since is not None
        assert CLUSTER in status.last_response
        on_fallback = await scrape(relay.admin_port)

        await primary.start(primary_port)
        await eventually(lambda: in_use(relay) == f"127.0.0.1:{primary_port}", PATIENCE)
        # Back on the primary: the fallback's stream is closed, and the client
        # gets what the primary has more, not what it holds unchanged.
        await eventually(lambda: fallback.open_streams() == 0)
        second = await client.recv(PATIENCE)
        assert [(r.name, r.version) for r in second.resources] == [("b", "v1")]
        assert list(second.removed_resources) == []
        await client.ack(second)
        await client.expect_nothing()
        on_primary = await scrape(relay.admin_port)
        status = relay.upstream.status()
        client.close()
        await primary.stop()
    await fallback.stop()

    assert (status.in_use, status.on_fallback, status.connected) == (0, False, True)
    assert status.reconnects >= 2  # the primary's failed attempts, the fallback, the primary
    primary_server = labels(origin="default", server=f"127.0.0.1:{primary_port}", fallback="0")
    fallback_server = labels(origin="default", server=f"127.0.0.1:{fallback.port}",
                             fallback="1")
    assert series(on_fallback, "xds_relay_upstream_server") == {
        primary_server: 0, fallback_server: 1}
    assert series(on_primary, "xds_relay_upstream_server") == {
        primary_server: 1, fallback_server: 0}


async def test_invariant_38_primary_down_all_cached_not_left_until_a_client_needs_more(
        ) -> None:
    primary = await EndingOrigin().start()
    primary.set(cluster("a"), cluster("b"), version="v1")
    fallback = await EndingOrigin().start()
    fallback.set(cluster("a"), endpoints("e", 1001), version="v1")
    async with following(primary.port, fallback.port) as (relay, channel):
        assert relay.upstream is not None
        watcher = XdsClient(channel, DELTA_ADS, delta=True)
        await watcher.send(node=node("w"), type_url=CLUSTER, resource_names_subscribe=[WILDCARD])
        held = await watcher.recv(PATIENCE)
        assert sorted(names_of(held)) == ["a", "b"]
        await watcher.ack(held)

        await primary.stop()
        opened = relay.upstream.streams_opened
        # Several attempts on the primary fail: what clients watch is cached,
        # so the relay keeps to the primary (A71) and clients keep theirs.
        await eventually(lambda: relay.upstream is not None and
                         relay.upstream.streams_opened >= opened + 3, PATIENCE)
        assert fallback.streams == []
        assert in_use(relay) == f"127.0.0.1:{primary.port}"
        await watcher.expect_nothing()

        # A client wants what the cache lacks: now the fallback, at once.
        newcomer = XdsClient(channel, DELTA_ADS, delta=True)
        await newcomer.send(node=node("n"), type_url=ENDPOINT, resource_names_subscribe=["e"])
        assert names_of(await newcomer.recv(PATIENCE)) == ["e"]
        assert in_use(relay) == f"127.0.0.1:{fallback.port}"
        # The fallback has no "b": it goes from the watcher; "a" is unchanged
        # and not sent again.
        update = await watcher.recv(PATIENCE)
        assert (names_of(update), list(update.removed_resources)) == ([], ["b"])
        await watcher.ack(update)
        await watcher.expect_nothing()
        watcher.close()
        newcomer.close()
    await fallback.stop()


async def test_invariant_38_on_the_fallback_the_primary_is_probed_once_per_backoff_step() -> None:
    clock = ManualClock()
    primary = await EndingOrigin().start()
    primary.drop_first_streams = 1_000  # it refuses every stream: unreachable
    primary.set(cluster("a"), version="v1")
    fallback = await EndingOrigin().start()
    fallback.set(cluster("a"), version="v1")
    async with following(primary.port, fallback.port, clock) as (relay, channel):
        client = XdsClient(channel, DELTA_ADS, delta=True)
        await client.send(node=node("d"), type_url=CLUSTER, resource_names_subscribe=["a"])
        await client.ack(await client.recv(PATIENCE))
        assert in_use(relay) == f"127.0.0.1:{fallback.port}"
        for _ in range(3):
            tried = len(primary.streams)
            await client.expect_nothing()  # time stands still: no probe
            assert len(primary.streams) == tried
            await clock.advance(BACKOFF_MAX)  # a backoff step (0.5s at most): one probe
            await eventually(lambda tried=tried: len(primary.streams) == tried + 1)
            assert in_use(relay) == f"127.0.0.1:{fallback.port}"
        primary.drop_first_streams = 0  # the primary serves again
        await _step_until(clock, lambda: in_use(relay) == f"127.0.0.1:{primary.port}")
        await eventually(lambda: fallback.open_streams() == 0)
        await client.expect_nothing()  # "a" is the same on both: nothing to send
        client.close()
    await primary.stop()
    await fallback.stop()


async def _step_until(clock: ManualClock, done: Callable[[], bool], steps: int = 5) -> None:
    """Advance ``clock`` a backoff step at a time until ``done()``, giving the
    relay 2 s after each: the relay may set its next probe's deadline only
    after the test moved the clock for the last refused probe (under load,
    once in a full run), and then it waits for one more step."""
    for _ in range(steps):
        await clock.advance(BACKOFF_MAX)
        with contextlib.suppress(AssertionError):
            await eventually(done, timeout=2)
            return
    raise AssertionError(f"not done after {steps} backoff steps")
