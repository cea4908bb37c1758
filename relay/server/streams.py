"""The thin I/O layer around a stream's protocol session: one object per gRPC stream.

A :class:`DownstreamStream` reads requests in one task and hands them to its
:class:`~relay.protocol.session.Session`; the gRPC handler writes whatever the
session says is due. Cache changes only mark names in the session and wake
the writer, so a client that stops reading holds up nobody but itself, and
what waits for it is at most one set of names per type. This module only
moves messages, registers interest, counts and logs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2

from relay.admission import TokenBucket
from relay.authorization import PeerIdentity
from relay.cache import ResourceCache
from relay.interest import InterestIndex
from relay.logs import RateLimitedLog
from relay.protocol.delta import split_request
from relay.protocol.limits import DEFAULT_LIMITS, ORIGIN_REFUSED, LimitExceeded, Limits, shown
from relay.protocol.outcome import ProtocolError, RequestOutcome
from relay.protocol.session import Plan, Request, Session, XdsProtocol
from relay.protocol.snapshot import SessionSnapshot
from relay.protocol.view import CacheView, ClientView
from relay.server.access import REFUSAL_LOG_INTERVAL, Access, Refused
from relay.server.decoding import RequestTooLarge, UndecodableRequest
from relay.server.plans import PlanEncoder, encode_plan
from relay.server.status import client_summary
from relay.telemetry import Metrics
from relay.xds_types import short_name

log = logging.getLogger("relay.downstream")

__all__ = ["DownstreamStream", "ServingContext", "XdsProtocol", "encode_plan"]


# How many of a leaving stream's names the interest index forgets per turn
# of the event loop (see ServingContext.leave).
NAMES_PER_TURN = 2_000


@dataclass
class ServingContext:
    """What every downstream stream shares."""

    cache: ResourceCache
    index: InterestIndex
    metrics: Metrics
    view: CacheView
    batch_window: float = 0.0
    # the largest resource locator (name and parameters, encoded) a client may
    # subscribe to: what the relay can forward to its origin (None: no origin)
    max_locator_size: int | None = None
    # the authorization rules (None: everyone may do everything, as on the
    # private socket between the processes of --workers)
    access: Access | None = None
    # what clients may ask (limits.*)
    limits: Limits = DEFAULT_LIMITS
    # the most bytes a response takes (server.max_response_size; None: any)
    max_response_size: int | None = None
    # streams open per client connection (its peer address)
    per_connection: Counter[str] = field(default_factory=Counter)
    # streams, and connections with a stream, open per client host
    per_host: Counter[str] = field(default_factory=Counter)
    connections_per_host: Counter[str] = field(default_factory=Counter)
    # how fast new streams are taken (None: as fast as they come)
    admission: TokenBucket | None = None
    # lines about bad requests: at most one per kind and client host per interval
    refusal_log: RateLimitedLog = field(
        default_factory=lambda: RateLimitedLog(log, REFUSAL_LOG_INTERVAL, time.monotonic))
    streams: set[DownstreamStream] = field(default_factory=set)
    # set when the relay drains: new streams are refused
    draining: bool = False
    # set while no stream is open
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    encoder: PlanEncoder = field(default_factory=PlanEncoder)
    # streams an origin change concerns, until the batch window closes: one
    # timer for the whole relay, however many streams a push reaches
    _batched: set[DownstreamStream] = field(default_factory=set)
    _batch_timer: asyncio.TimerHandle | None = None
    # streams that left, still being forgotten by the interest index
    _forgetting: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.idle.set()

    def wake_after_batch(self, stream: DownstreamStream) -> None:
        """Wake ``stream`` once the batch window closes, to let the rest of
        the origin's burst arrive first (at once without a window)."""
        if self.batch_window <= 0:
            stream.wake()
            return
        self._batched.add(stream)
        if self._batch_timer is None:
            self._batch_timer = asyncio.get_running_loop().call_later(
                self.batch_window, self._end_batch)

    def admission_error(self, peer: str) -> tuple[str, str] | None:
        """Why a new stream from ``peer`` is refused (the limit, the message), or None."""
        if len(self.streams) >= self.limits.streams:
            return "streams", (f"the relay serves {len(self.streams)} streams, its most "
                               f"(limits.streams); connect to another replica")
        host = client_host(peer)
        # A unix socket's peers cannot be told apart: they share no connection limit.
        if host is None:
            return None
        limits = self.limits
        on_connection = self.per_connection[peer]
        if on_connection >= limits.streams_per_connection:
            return "streams_per_connection", (
                f"this connection has {on_connection} streams open, the most "
                f"(limits.streams_per_connection)")
        if self.per_host[host] >= limits.streams_per_host:
            return "streams_per_host", (
                f"{shown(host, 64)} has {self.per_host[host]} streams open, the most one "
                f"client host may (limits.streams_per_host)")
        if not on_connection and self.connections_per_host[host] >= limits.connections_per_host:
            return "connections_per_host", (
                f"{shown(host, 64)} has {self.connections_per_host[host]} connections with "
                f"streams open, the most one client host may (limits.connections_per_host)")
        return None

    def admission_wait(self, peer: str) -> float | None:
        """How long a new stream from ``peer`` waits for its turn (see
        :class:`~relay.admission.TokenBucket`), or None: refused. A unix
        socket's (the links of ``--workers``) never wait."""
        if self.admission is None or client_host(peer) is None:
            return 0.0
        return self.admission.reserve()

    def join(self, stream: DownstreamStream) -> None:
        """``stream`` opened: count it (see :meth:`admission_error`)."""
        self.streams.add(stream)
        peer = stream.peer
        self.per_connection[peer] += 1
        host = client_host(peer)
        if host is not None:
            self.per_host[host] += 1
            if self.per_connection[peer] == 1:
                self.connections_per_host[host] += 1
        self.idle.clear()

    def warn_limited(self, peer: str, kind: str, message: str, *args: object) -> None:
        """Log a line a client causes (a refusal, a NACK), at most once per kind and
        client host per interval (the port changes with every reconnect; the host
        does not), and a few per kind for all hosts together (see RateLimitedLog)."""
        host = peer.rsplit(":", 1)[0]
        self.refusal_log.warning(kind, message, *args, host=host)

    def leave(self, stream: DownstreamStream) -> None:
        """``stream`` ended: forget it everywhere.

        A stream holding many names is forgotten by the interest index (and
        so by the upstream) in slices, one per turn of the event loop, so that
        a client of 100,000 names leaving holds up nobody; outside an event
        loop, at once.
        """
        if stream in self.streams:
            self.streams.discard(stream)
            peer = stream.peer
            host = client_host(peer)
            self.per_connection[peer] -= 1
            if not self.per_connection[peer]:
                del self.per_connection[peer]
                if host is not None:
                    _take_one(self.connections_per_host, host)
            if host is not None:
                _take_one(self.per_host, host)
        self._batched.discard(stream)
        if not self.streams:
            self.idle.set()
        if self.index.remove(stream, NAMES_PER_TURN):
            return
        try:
            task = asyncio.get_running_loop().create_task(self._forget_slowly(stream))
        except RuntimeError:  # no event loop
            self.index.remove(stream)
            return
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)

    async def _forget_slowly(self, stream: DownstreamStream) -> None:
        while True:
            await asyncio.sleep(0)
            if self.index.remove(stream, NAMES_PER_TURN):
                return

    def _end_batch(self) -> None:
        self._batch_timer = None
        batched, self._batched = self._batched, set()
        for stream in batched:
            stream.wake()

    def subscription_counts(self) -> Counter[tuple[str, ...]]:
        """Streams subscribed to each type, by (protocol, short type name)."""
        counts: Counter[tuple[str, ...]] = Counter()
        # Snapshots (list(...)): the OTLP exporter calls this from its own thread.
        for stream in list(self.streams):
            for type_url in stream.session.types():
                counts[stream.protocol, short_name(type_url)] += 1
        return counts

    def rejection_counts(self) -> Counter[tuple[str, ...]]:
        """Streams whose latest answered response of a type was NACKed, by
        (protocol, short type name): 0 for every pair some stream subscribes to."""
        counts: Counter[tuple[str, ...]] = Counter()
        for stream in list(self.streams):
            for type_url, rejected in stream.session.rejections():
                counts[stream.protocol, short_name(type_url)] += rejected
        return counts

    def close_streams(self, reason: str) -> None:
        """Ask every downstream stream to end (see :meth:`DownstreamStream.close`)."""
        for stream in list(self.streams):
            stream.close(reason)

    def snapshots(self) -> list[tuple[SessionSnapshot, str]]:
        """Every connected client's snapshot and peer, by node id and peer."""
        return sorted(((s.session.snapshot(), s.peer) for s in list(self.streams)),
                      key=lambda item: (item[0].node_id, item[1]))

    def client_statuses(self) -> list[dict[str, Any]]:
        """What ``/clients`` shows of every connected client (see
        :func:`relay.server.status.client_summary`)."""
        return [client_summary(snapshot, peer, self.cache)
                for snapshot, peer in self.snapshots()]

    @classmethod
    def create(cls, cache: ResourceCache, index: InterestIndex, metrics: Metrics,
               batch_window: float = 0.0) -> ServingContext:
        def conflict(type_url: str, name: str) -> None:
            metrics.variant_conflicts.add(1, {"type": short_name(type_url)})

        return cls(cache, index, metrics, CacheView(cache, conflict), batch_window)


class DownstreamStream:
    """One downstream xDS stream, ADS (any type) or per-type (``fixed_type_url``)."""

    def __init__(self, serving: ServingContext, protocol: XdsProtocol, peer: str,
                 fixed_type_url: str | None = None, identity: PeerIdentity | None = None
                 ) -> None:
        self.serving = serving
        self.peer = peer
        self.host = client_host(peer)
        # set when gRPC ends the call (the client left, or its connection died)
        self._ended = False
        # the client's certificate identity, while its first Node awaits the
        # node binding check (None: no check)
        self._unbound = identity
        # what this client sees of the cache: without the Secrets it may not have
        self.view: ClientView = serving.view if serving.access is None else \
            serving.access.client_view(serving.view, identity)
        self.session = Session(protocol, fixed_type_url, serving.max_locator_size,
                               serving.limits, serving.max_response_size)
        # whether something may be due, and the writer's wait for it (an
        # asyncio.Event would do, with a deque per stream that is never used)
        self._woken = False
        self._waiting: asyncio.Future[None] | None = None
        self._closing: tuple[grpc.StatusCode, str] | None = None
        # per type, when the client last changed what it subscribes to: resources
        # received after that are pushes (even if they waited for an ACK), and
        # count towards the push latency; older ones are answers from cache
        self._requested_at: dict[str, float] = {}

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    @property
    def protocol(self) -> XdsProtocol:
        return self.session.protocol

    @property
    def node(self) -> base_pb2.Node | None:
        return self.session.node

    @property
    def node_id(self) -> str:
        return self.session.node_id

    def close(self, reason: str, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        """End the stream with ``code`` (by default UNAVAILABLE: the client
        reconnects) and ``reason``."""
        self._closing = (code, reason)
        self.wake()

    def wake(self) -> None:
        """Look at what is due now."""
        self._woken = True
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(None)

    # -- notifications from the interest index --------------------------------

    def resources_changed(self, type_url: str, names: frozenset[str], everything: bool) -> None:
        coalesced = self.session.resources_changed(type_url, names, everything)
        if coalesced is None:
            return
        if coalesced:
            self.serving.metrics.downstream_coalesced.add(
                self.protocol, short_name(type_url), amount=coalesced)
        self.serving.wake_after_batch(self)

    def heartbeats_received(self, type_url: str, names: frozenset[str]) -> None:
        if self.session.heartbeats_received(type_url, names):
            self.serving.wake_after_batch(self)

    def subscription_refused(self, type_url: str, names: frozenset[str], message: str) -> None:
        """The origin refused names this stream subscribed to: end it with
        RESOURCE_EXHAUSTED saying so. Not a stream of a unix socket (the link
        of a ``--workers`` worker, whose own clients are refused by its own
        relay): it keeps the rest of what it holds."""
        if self.host is None:
            return
        self.serving.metrics.downstream_limited.add(1, {"limit": ORIGIN_REFUSED})
        self.serving.warn_limited(self.peer, ORIGIN_REFUSED, "refusing stream from %s: %s",
                                  self.peer, message)
        self.close(message, grpc.StatusCode.RESOURCE_EXHAUSTED)

    # -- requests ------------------------------------------------------------

    def handle_request(self, request: Request) -> RequestOutcome:
        """Hand one request to the session; register what it changed, count it."""
        received = self.session.receive(request)
        type_url, outcome = received.type_url, received.outcome
        if outcome.interest_changed or type_url not in self._requested_at:
            self._requested_at[type_url] = time.monotonic()
        metrics = self.serving.metrics
        if outcome.nack is not None:
            metrics.downstream_nacks.add(self.protocol, short_name(type_url))
            self.serving.warn_limited(
                self.peer, f"nack {type_url}", "NACK from node=%r peer=%s type=%s nonce=%s: %s",
                shown(self.node_id), self.peer, short_name(type_url), outcome.nack.nonce,
                outcome.nack.message)
        elif outcome.ack_nonce is not None:
            metrics.downstream_acks.add(self.protocol, short_name(type_url))
        for changed_type, change in received.interest:
            self.serving.index.apply(self, changed_type, self.view.admit(changed_type, change),
                                     self.host)
        return outcome

    # -- responses -----------------------------------------------------------

    def ready_responses(self) -> Iterator[bytes]:
        """Encoded responses due now, in the order the session gives."""
        if not self.session.has_work():
            return  # after a write, most often
        due = self.session.due(self.view)
        for type_url, names in due.refetch.items():
            self.serving.index.request_refetch(type_url, names)
        for plan in due.responses:
            yield self._sent(plan)

    def _sent(self, plan: Plan) -> bytes:
        metrics = self.serving.metrics
        metrics.push(self.protocol, plan.type_url)
        if plan.resources:
            newest = max(r.received for r in plan.resources)
            if newest > self._requested_at.get(plan.type_url, 0.0):
                metrics.push_latency.record(time.monotonic() - newest,
                                            short_name(plan.type_url))
        return self.serving.encoder.encode(plan)

    async def serve(self, requests: AsyncIterator[Request],
                    context: grpc.aio.ServicerContext) -> None:
        """Run the stream: the body of a gRPC stream-stream handler.

        Writes with ``context.write`` rather than by yielding: one layer of
        async generators less per message on the fan-out path.
        """
        metrics = self.serving.metrics
        metrics.downstream_streams.add(1, {"protocol": self.protocol})
        self.serving.join(self)
        # gRPC ends the call when its connection dies (keepalive), whether or
        # not the read below ever returns: then the stream ends too. Through a
        # weak reference: gRPC's call objects are freed only by a full garbage
        # collection, and must not keep an ended stream (and all it was sent).
        context.add_done_callback(functools.partial(_call_ended, weakref.ref(self)))
        reader = asyncio.create_task(self._read(requests))
        try:
            while not self._ended:
                if self._closing is not None:
                    await context.abort(*self._closing)
                for response in self.ready_responses():
                    await context.write(response)
                if reader.done():
                    error = reader.exception()
                    if error is not None:
                        code, message = self._status_for(error)
                        await context.abort(code, message)
                    return
                await self._sleep()
        finally:
            reader.cancel()
            self.serving.leave(self)
            metrics.downstream_streams.add(-1, {"protocol": self.protocol})

    def call_ended(self) -> None:
        """gRPC ended the call: stop serving it."""
        self._ended = True
        self.wake()

    def _status_for(self, error: BaseException) -> tuple[grpc.StatusCode, str]:
        """The status that ends a stream whose reader failed: never OK. Counted,
        and logged at most once per kind and client host per interval."""
        metrics = self.serving.metrics
        if isinstance(error, Refused):
            assert self.serving.access is not None
            self.serving.access.refused("node_binding", self.peer, str(error))
            return grpc.StatusCode.PERMISSION_DENIED, str(error)
        if isinstance(error, LimitExceeded | RequestTooLarge):
            metrics.downstream_limited.add(1, {"limit": error.limit})
            self.serving.warn_limited(self.peer, error.limit, "refusing stream from %s: %s",
                                      self.peer, error)
            return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)
        if isinstance(error, ProtocolError | UndecodableRequest):
            metrics.downstream_rejected.add(1, {"protocol": self.protocol})
            self.serving.warn_limited(self.peer, "invalid", "rejecting stream from %s: %s",
                                      self.peer, error)
            return grpc.StatusCode.INVALID_ARGUMENT, str(error)
        log.error("stream from %s failed", self.peer, exc_info=error)
        return grpc.StatusCode.INTERNAL, "the relay failed to read this stream; see its log"

    async def _sleep(self) -> None:
        """Until woken (at once if woken since the last time)."""
        if not self._woken:
            self._waiting = asyncio.get_running_loop().create_future()
            try:
                await self._waiting
            finally:
                self._waiting = None
        self._woken = False

    def _bind_node(self, first: Request) -> None:
        """Check the first request's Node against the client's certificate
        before it subscribes to anything: raises :class:`Refused`."""
        assert self._unbound is not None and self.serving.access is not None
        node = first.node if first.HasField("node") else None
        error = self.serving.access.node_error(self._unbound, node)
        if error is not None:
            raise Refused(error)
        self._unbound = None

    async def _read(self, requests: AsyncIterator[Request]) -> None:
        try:
            async for request in requests:
                if self._unbound is not None:
                    self._bind_node(request)
                pieces = split_request(request) if self.protocol == "delta" else [request]
                if len(pieces) > 1:
                    self.session.check(request)  # refused whole, or applied in pieces
                for number, piece in enumerate(pieces):
                    if number:
                        await asyncio.sleep(0)  # a huge request: let others run
                    self.handle_request(piece)
                    if self.session.has_work():
                        # Not for a plain ACK with nothing waiting: most of them.
                        self.wake()
        finally:
            self.wake()


def client_host(peer: str) -> str | None:
    """The host of a gRPC peer (``ipv4:10.0.0.7:41000``: ``ipv4:10.0.0.7``),
    what per-host limits count by; None for a unix socket, whose peers
    cannot be told apart."""
    if peer.startswith("unix:"):
        return None
    return peer.rsplit(":", 1)[0]


def _take_one(counts: Counter[str], key: str) -> None:
    left = counts[key] - 1
    if left > 0:
        counts[key] = left
    else:
        del counts[key]


def _call_ended(stream: weakref.ref[DownstreamStream], _context: object) -> None:
    ended = stream()
    if ended is not None:
        ended.call_ended()
