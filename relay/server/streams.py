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
import logging
import operator
import time
from collections.abc import AsyncIterator, Iterator

import grpc
from envoy.config.core.v3 import base_pb2

from relay.authorization import PeerIdentity
from relay.node_groups import Group
from relay.protocol.delta import read_in_pieces
from relay.protocol.limits import ORIGIN_REFUSED, LimitExceeded, shown
from relay.protocol.outcome import ProtocolError, RequestOutcome
from relay.protocol.session import Plan, Request, Session, XdsProtocol
from relay.protocol.view import ClientView
from relay.server.access import ANONYMOUS, Refused
from relay.server.decoding import RequestTooLarge, UndecodableRequest
from relay.server.plans import encode_plan
from relay.server.serving import ServingContext, client_host
from relay.server.status import StreamTimes
from relay.xds_types import short_name

log = logging.getLogger("relay.downstream")

_RECEIVED = operator.attrgetter("received")

__all__ = ["DownstreamStream", "XdsProtocol", "encode_plan"]


class DownstreamStream:
    """One downstream xDS stream, ADS (any type) or per-type (``fixed_type_url``)."""

    # Slotted: thousands are open at once, most of them idle, and an
    # instance dict is one more block each (issue 27: RSS per idle stream).
    __slots__ = ("__weakref__", "_closing", "_grouped", "_identity", "_times", "_unbound",
                 "_waiting", "_woken", "cache", "connected_since", "group", "host", "index",
                 "peer", "serving", "session", "view")

    def __init__(self, serving: ServingContext, protocol: XdsProtocol, peer: str,
                 fixed_type_url: str | None = None, identity: PeerIdentity | None = None
                 ) -> None:
        self.serving = serving
        self.peer = peer
        self.host = client_host(peer)
        # the client's certificate identity, while its first Node awaits the
        # node binding check (None: no check)
        self._unbound = identity
        # what this client sees of the cache: without the Secrets it may not have
        settings = serving.settings
        self._identity = identity
        self.view: ClientView = serving.anonymous_view \
            if settings.access is None or identity is None or identity == ANONYMOUS \
            else settings.access.client_view(serving.view, identity)
        # where its interest goes and its resources come from: the relay's, or
        # those of its node group (joined at its first request; see _join_group)
        self.index = serving.index
        self.cache = serving.cache
        self.group: Group | None = None
        self._grouped = settings.groups is None
        self.session = Session(protocol, fixed_type_url, settings.max_locator_size,
                               settings.limits, settings.max_response_size)
        # whether something may be due, and the writer's wait for it (an
        # asyncio.Event would do, with a deque per stream that is never used)
        self._woken = False
        self._waiting: asyncio.Future[None] | None = None
        self._closing: tuple[grpc.StatusCode, str] | None = None
        # per type, when the client last changed what it subscribes to, and
        # last ACKed and NACKed (see _TypeTimes); and what /clients shows of
        # when the stream started (wall time, Unix seconds)
        self._times: dict[str, _TypeTimes] = {}
        self.connected_since = time.time()

    # (hashed and compared by identity, object's own: in C, not a Python
    # __hash__ called on every set and dict operation of the fan-out)

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
        coalesced = self.session.mark_changed(type_url, names, everything)
        if coalesced is None:
            return
        if coalesced:
            self.serving.metrics.downstream_coalesced.add(
                self.protocol, short_name(type_url), amount=coalesced)
        # (a cold join's names all in: the rest of the burst is not for it)
        self.serving.wake_after_batch(
            self, now=self.session.first_answers_ready(type_url, self.view))

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
        times = self._times.get(type_url)
        if times is None:
            times = self._times[type_url] = _TypeTimes(time.monotonic())
        elif outcome.interest_changed:
            times.requested = time.monotonic()
        metrics = self.serving.metrics
        if outcome.nack is not None:
            times.nacked = time.time()
            metrics.downstream_nacks.add(self.protocol, short_name(type_url))
            self.serving.warn_limited(
                self.peer, f"nack {type_url}", "NACK from node=%r peer=%s type=%s nonce=%s: %s",
                shown(self.node_id), self.peer, short_name(type_url), outcome.nack.nonce,
                outcome.nack.message)
        elif outcome.ack_nonce is not None:
            times.acked = time.time()
            metrics.downstream_acks.add(self.protocol, short_name(type_url))
        for changed_type, change in received.interest:
            self.index.apply(self, changed_type, self.view.admit(changed_type, change),
                             self.host)
        return outcome

    def times(self) -> StreamTimes:
        """When the stream opened, and per type its client's last ACK and NACK."""
        return StreamTimes(self.connected_since,
                           {type_url: (times.acked, times.nacked)
                            for type_url, times in self._times.items()
                            if times.acked is not None or times.nacked is not None})

    # -- responses -----------------------------------------------------------

    def ready_responses(self) -> Iterator[bytes]:
        """Encoded responses due now, in the order the session gives."""
        if not self.session.has_work():
            return  # after a write, most often
        due = self.session.due(self.view)
        for type_url, names in due.refetch.items():
            self.index.request_refetch(type_url, names)
        for plan in due.responses:
            yield self._sent(plan)

    def _sent(self, plan: Plan) -> bytes:
        metrics, type_url, resources = self.serving.metrics, plan.type_url, plan.resources
        metrics.push(self.session.protocol, type_url)
        if resources:
            # (one resource, each stream's push of the fan-out: no pass over them)
            newest = resources[0].received if len(resources) == 1 else \
                max(map(_RECEIVED, resources))
            times = self._times.get(type_url)
            if newest > (times.requested if times is not None else 0.0):
                metrics.push_latency.record(time.monotonic() - newest, short_name(type_url))
        return self.serving.encoder.encode(plan)

    async def serve(self, requests: AsyncIterator[Request],
                    context: grpc.aio.ServicerContext) -> None:
        """Run the stream: the body of a gRPC stream-stream handler.

        Writes with ``context.write`` rather than by yielding: one layer of
        async generators less per message on the fan-out path.
        """
        serving = self.serving
        metrics = serving.metrics
        metrics.downstream_streams.add(self.protocol)
        serving.join(self)
        # When gRPC ends the call (the client left, or its connection died:
        # keepalive), it cancels the task running this handler, whether or
        # not the read below ever returns: the stream ends with it, through
        # the ``finally`` below. (A done callback on ``context`` did the same,
        # at ~0.5 KiB of RSS per stream.)
        reader = asyncio.create_task(self._read(requests))
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self._closing is not None:
                    _end_call(context, *self._closing)
                    return
                # In an open batch window, even when a request woke it: its
                # client's ACK could otherwise let half a burst out (a
                # removal before the change that makes it safe).
                if self not in serving.batched:
                    for response in self.ready_responses():
                        await context.write(response)
                response = b""  # not kept while the stream sleeps (a push: each its own)
                if reader.done():
                    error = reader.exception()
                    if error is not None:
                        _end_call(context, *self._status_for(error))
                        # what the request held (its traceback has it) goes with the stream
                        self.serving.let_go()
                    return
                # Asleep until woken (at once if woken since the last time):
                # awaited here, not in a coroutine of its own, which an idle
                # stream would hold as one more frame.
                if not self._woken:
                    waiting = self._waiting = loop.create_future()
                    await waiting
                    self._waiting = None
                self._woken = False
        finally:
            reader.cancel()
            self.serving.leave(self)
            if self.group is not None and self.serving.settings.groups is not None:
                self.serving.settings.groups.leave(self.group)
                self.group = None
            metrics.downstream_streams.add(self.protocol, amount=-1)

    def _status_for(self, error: BaseException) -> tuple[grpc.StatusCode, str]:
        """The status that ends a stream whose reader failed: never OK. Counted,
        and logged at most once per kind and client host per interval."""
        metrics = self.serving.metrics
        if isinstance(error, Refused):
            assert self.serving.settings.access is not None
            self.serving.settings.access.refused("node_binding", self.peer, str(error))
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

    def _bind_node(self, first: Request) -> None:
        """Check the first request's Node against the client's certificate
        before it subscribes to anything: raises :class:`Refused`."""
        access = self.serving.settings.access
        assert self._unbound is not None and access is not None
        node = first.node if first.HasField("node") else None
        error = access.node_error(self._unbound, node)
        if error is not None:
            raise Refused(error)
        self._unbound = None

    def _join_group(self, first: Request) -> None:
        """Serve the stream from its node group's core from now on (before it
        subscribes to anything): raises GroupKeyError or LimitExceeded."""
        groups = self.serving.settings.groups
        assert groups is not None
        self._grouped = True
        group = self.group = groups.join(first.node if first.HasField("node") else None)
        core = group.core
        self.index, self.cache = core.index, core.cache
        access = self.serving.settings.access
        self.view = core.view if access is None else \
            access.client_view(core.view, self._identity)

    async def _read(self, requests: AsyncIterator[Request]) -> None:
        try:
            async for request in requests:
                if self._unbound is not None:
                    self._bind_node(request)
                if not self._grouped:
                    self._join_group(request)
                # (a big delta request's names read out of it once: for the
                # check and for each piece, see read_in_pieces)
                pieces, whole = read_in_pieces(request) if self.protocol == "delta" else \
                    ([request], request)
                if len(pieces) > 1:
                    self.session.check(whole)  # refused whole, or applied in pieces
                # The request once split, and each piece once applied, are let
                # go: a client of 100,000 names held its names in the request
                # and again in ~50 pieces until the last was applied, at the
                # peak of its subscription.
                del request, whole
                pieces.reverse()
                first = True
                while pieces:
                    if not first:
                        await asyncio.sleep(0)  # a huge request: let others run
                    first = False
                    self.handle_request(pieces.pop())
                # Once the whole request is applied (a request in pieces is one
                # change for its client: answered after its first piece, a
                # client of 10,000 names took two responses, and two ACKs,
                # where one does); not for a plain ACK with nothing waiting:
                # most of them.
                if self.session.has_work():
                    self.wake()
        finally:
            self.wake()


class _TypeTimes:
    """A stream's times for one type, in one object (one dict a stream, not
    one per kind of time).

    ``requested``: when its client last changed what it subscribes to
    (monotonic): resources received after that are pushes (even if they
    waited for an ACK), and count towards the push latency; older ones are
    answers from cache. ``acked``, ``nacked``: when the client last ACKed and
    NACKed a response of the type, for /clients (wall time, Unix seconds;
    None: never).
    """

    __slots__ = ("acked", "nacked", "requested")

    def __init__(self, requested: float) -> None:
        self.requested = requested
        self.acked: float | None = None
        self.nacked: float | None = None


def _end_call(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    """End the call with ``code`` and ``message`` once the handler returns.

    Not ``context.abort``: the exception it raises, and with it the handler's
    frames (the stream, the request that broke a limit: megabytes for a
    refused Node), stays referenced by gRPC after the call, where no
    collection frees it."""
    context.set_code(code)
    context.set_details(message)
