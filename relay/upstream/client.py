"""The gRPC loop around :class:`~relay.upstream.state.UpstreamState`.

Opens the one ``DeltaAggregatedResources`` stream to the origin, sends what
the state says, hands every response to it and writes back the ACK or NACK.
When the stream breaks it waits (jittered exponential backoff, reset once the
origin has answered on a new stream) and reconnects; the cache, and so every
downstream client, keeps its resources meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, TypeAlias

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from relay.telemetry import Metrics
from relay.upstream.backoff import Backoff
from relay.upstream.state import UpstreamState
from relay.xds_types import short_name

log = logging.getLogger("relay.upstream")

DELTA_ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"

# The generated messages carry no type information; this names what flows.
Request: TypeAlias = Any  # discovery_pb2.DeltaDiscoveryRequest


class UpstreamClient:
    """Keeps one Delta-ADS stream to ``target`` open for as long as it runs."""

    def __init__(self, target: str, state: UpstreamState, backoff: Backoff,
                 metrics: Metrics) -> None:
        self.target = target
        self.state = state
        self.backoff = backoff
        self.metrics = metrics
        self.streams_opened = 0
        self._outbox: asyncio.Queue[Request] | None = None
        self._timer_changed = asyncio.Event()
        self.connected_event = asyncio.Event()
        self.ever_connected = False
        state.index.add_interest_listener(self.interest_changed)
        state.index.add_refetch_listener(self.refetch)

    def interest_changed(self, type_url: str) -> None:
        """Called by the subscription index when the union for a type changes."""
        self._send(self.state.on_interest_changed(type_url, time.monotonic()))
        self._timer_changed.set()

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        """Called by the subscription index when a client needs a fresh copy."""
        self._send(self.state.on_refetch(type_url, names))

    def _send(self, requests: list[Request]) -> None:
        if self._outbox is not None:
            for request in requests:
                self._outbox.put_nowait(request)

    async def run(self) -> None:
        """Connect, serve, reconnect; until cancelled."""
        linger = asyncio.create_task(self._linger_timer())
        try:
            async with grpc.aio.insecure_channel(self.target) as channel:
                open_stream = channel.stream_stream(
                    DELTA_ADS_METHOD,
                    request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                    response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)
                while True:
                    await self._one_stream(channel, open_stream)
                    delay = self.backoff.next_delay()
                    log.info("reconnecting to origin %s in %.2fs", self.target, delay)
                    await asyncio.sleep(delay)
        finally:
            linger.cancel()

    async def _one_stream(self, channel: grpc.aio.Channel,
                          open_stream: grpc.aio.StreamStreamMultiCallable) -> None:
        outbox: asyncio.Queue[Request] = asyncio.Queue()
        call = open_stream(wait_for_ready=False)
        self.streams_opened += 1
        if self.streams_opened > 1:
            self.metrics.upstream_reconnects.add(1)
        self._outbox = outbox
        for request in self.state.on_connect(time.monotonic()):
            outbox.put_nowait(request)
        writer = asyncio.create_task(self._write(call, outbox))
        watcher = asyncio.create_task(self._mark_connected(channel))
        answered = False
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    log.warning("origin %s closed the stream", self.target)
                    return
                if not answered:
                    # Only an answer proves the origin serves us: reset backoff now.
                    answered = True
                    self.backoff.reset()
                replies = self.state.on_response(response, time.monotonic())
                outcome = "nack" if replies[0].HasField("error_detail") else "ack"
                self.metrics.upstream_responses.add(
                    1, {"type": short_name(response.type_url), "outcome": outcome})
                for reply in replies:
                    outbox.put_nowait(reply)
                self._timer_changed.set()  # the response may have set a deadline
        except grpc.aio.AioRpcError as error:
            log.warning("origin stream to %s failed: %s %s", self.target,
                        error.code().name, error.details())
        finally:
            self._outbox = None
            self.state.on_disconnect()
            writer.cancel()
            watcher.cancel()
            call.cancel()
            if self.connected_event.is_set():
                self.connected_event.clear()
                self.metrics.upstream_connected.add(-1)
                log.info("disconnected from origin %s", self.target)

    async def _mark_connected(self, channel: grpc.aio.Channel) -> None:
        await channel.channel_ready()
        self.ever_connected = True
        self.connected_event.set()
        self.metrics.upstream_connected.add(1)
        log.info("connected to origin %s", self.target)

    @staticmethod
    async def _write(call: grpc.aio.StreamStreamCall, outbox: asyncio.Queue[Request]) -> None:
        try:
            while True:
                await call.write(await outbox.get())
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return  # the read side sees the failure and reconnects

    async def _linger_timer(self) -> None:
        """Send unsubscribes when lingering subscriptions run out."""
        while True:
            deadline = self.state.next_deadline()
            self._timer_changed.clear()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(self._timer_changed.wait(), timeout)
            except TimeoutError:
                self._send(self.state.on_tick(time.monotonic()))
