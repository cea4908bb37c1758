"""End to end: HTTP/2 rapid reset (CVE-2023-44487) against the xDS port, from
a raw HTTP/2 client (the ``h2`` package), since no gRPC client sends it.

The relay advertises ``limits.streams_per_connection`` as
MAX_CONCURRENT_STREAMS, so a connection opening and resetting streams in a
loop never has more than that many calls in the relay at once, and a client
subscribed meanwhile keeps getting its updates.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter

import h2.config
import h2.connection
import h2.events
import h2.settings

from relay.server.streams import DownstreamStream
from relay.xds_types import CLUSTER
from tests.harness import (
    ADS,
    TIMEOUT,
    ScriptedOrigin,
    cluster,
    eventually,
    names_of,
    node,
    running_stack,
)

DELTA_ADS_PATH = ADS + "DeltaAggregatedResources"
REQUEST_HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", DELTA_ADS_PATH),
                   (":authority", "relay"), ("content-type", "application/grpc"),
                   ("te", "trailers")]


def reset_flood(port: int, streams: int, seconds: float) -> int | None:
    """Open and at once reset ``streams`` streams on one connection (within
    ``seconds``); the MAX_CONCURRENT_STREAMS the server advertised."""
    advertised: int | None = None
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        connection.initiate_connection()
        sock.sendall(connection.data_to_send())
        deadline = time.monotonic() + seconds
        stream_id = 1
        while stream_id < 2 * streams and time.monotonic() < deadline:
            for _ in range(100):
                connection.send_headers(stream_id, REQUEST_HEADERS)
                connection.reset_stream(stream_id)
                stream_id += 2
            sock.sendall(connection.data_to_send())
            sock.setblocking(False)
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                data = None
            finally:
                sock.setblocking(True)
            if data == b"":
                break
            for event in connection.receive_data(data or b""):
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    changed = event.changed_settings.get(
                        h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
                    if changed is not None:
                        advertised = changed.new_value
            sock.sendall(connection.data_to_send())
    return advertised


async def test_a_reset_flood_holds_no_more_calls_than_the_connection_limit() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, limits="streams_per_connection: 8") as stack:
        serving = stack.relay.serving
        watcher = stack.client()
        await watcher.send(node=node("watcher"), type_url=CLUSTER, resource_names_subscribe=["a"])
        await watcher.ack(await watcher.recv())
        # The most streams of the flood's connection the relay held at once.
        most: Counter[str] = Counter()
        join = serving.join

        def counting_join(stream: DownstreamStream) -> None:
            join(stream)
            most[stream.peer] = max(most[stream.peer], serving.per_connection[stream.peer])

        serving.join = counting_join  # type: ignore[method-assign]
        advertised = await asyncio.to_thread(reset_flood, stack.relay.xds_port, 20_000, 20.0)
        assert advertised == 8
        stack.origin.set(cluster("a", timeout_s=7))
        update = await watcher.recv()
        assert names_of(update) == ["a"]
        await watcher.ack(update)
        # (Most flood calls end before the relay reads them: those that
        # reached it were never more than the limit at once.)
        assert all(count <= 8 for count in most.values())
        await eventually(lambda: len(serving.streams) == 1)
