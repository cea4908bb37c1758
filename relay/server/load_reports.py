"""Load reports (LRS), forwarded to the origins that serve the clusters.

A Cluster whose ``lrs_server`` is ``self`` has its client report load
(``envoy.service.load_stats.v3.LoadReportingService/StreamLoadStats``) to the
server that sent the Cluster: the relay. gRPC clients accept no other
``lrs_server``, so a relay that refused would leave them no way to report.
The relay keeps no reports: it forwards each client's report stream to its
origins, as each would have served the client directly.

* **One origin stream per client stream and origin**, opened and closed
  with the client's, carrying the origin's token as it is at that moment
  (see :class:`~relay.upstream.dial.Dialer`). An origin sees as many report
  streams as it would without the relay, over few connections: the streams
  to an origin share channels, :data:`STREAMS_PER_CHANNEL` to each
  (:class:`_Channels`; measured: 58 KiB of the relay's memory per forwarded
  stream, 87 with a channel each).
* **Requests**: each cluster's stats go to the origin that serves the
  cluster's name (:meth:`~relay.upstream.origins.Routes.origin_of`; with one
  origin, all of them), the client's Node to every origin. gRPC keeps one
  report stream per xDS server, whatever the authority of the clusters on
  it, so with several origins (``authorities:``) one client stream is
  several origin streams.
* **Responses**: an origin's response reaches the client as it is. With
  several origins, the client (which keeps one set of instructions) gets them
  merged: every cluster any origin asks for, ``send_all_clusters`` if one
  asks it, the shortest ``load_reporting_interval``.
* **Ends**: the first origin stream to end ends the client's with that
  origin's status, the message saying which origin; the client reconnects
  as it would to the origin. With several origins, one that answers
  UNIMPLEMENTED (it serves no LRS: istiod, for one) is left out instead,
  while another still serves the stream. A client that ends its stream
  ends its origin streams. (gRPC Python may report an origin's end as its
  own INTERNAL when a write raced it, grpc/grpc#36066: an origin stream
  that ends so before answering is opened again, once.)

``limits.load_report_streams`` bounds the client streams forwarded at once
(each holding a stream to each origin): what clients make the relay open
upstream is bounded whatever they do. A relay that serves files has no
origin to forward to, and says so (UNIMPLEMENTED). Reports are admitted as
xDS streams are (``server.authorization``: the identity, and the first
Node's binding to it), since the relay forwards them with its own.

:class:`ReportFanOut` is the rule without I/O; :class:`LoadReports` is the
gRPC service that runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from envoy.service.load_stats.v3 import lrs_pb2
from google.protobuf import duration_pb2

from relay.authorization import PeerIdentity
from relay.clock import ended
from relay.errors import RelayError
from relay.protocol.limits import shown
from relay.server.decoding import RequestTooLarge, UndecodableRequest, request_decoder
from relay.server.serving import ServingContext
from relay.upstream.dial import Dialer, DialError

if TYPE_CHECKING:
    from relay.upstream.origins import Origins, Routes

log = logging.getLogger("relay.downstream")

__all__ = ["LRS_SERVICE", "NO_ORIGIN", "STREAMS_PER_CHANNEL", "LoadReports", "OriginEnded",
           "ReportFanOut", "load_report_handlers"]

LRS_SERVICE = "envoy.service.load_stats.v3.LoadReportingService"
_METHOD = "StreamLoadStats"
_PATH = f"/{LRS_SERVICE}/{_METHOD}"

#: The status message of a report stream to a relay that serves files.
NO_ORIGIN = ("the relay serves files (upstream.files) and has no origin to forward load "
             "reports to; send them to a load reporting server directly (Envoy: "
             "cluster_manager.load_stats_config), or leave the Cluster's lrs_server unset")
# ... of one refused while the relay drains (as xDS streams are).
_DRAINING = "the relay is draining; connect to another replica"


# -- the rule, without I/O -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class OriginEnded:
    """An origin's stream ended, and with it the client's: with ``code``."""

    origin: str
    code: grpc.StatusCode


def _shorter(a: duration_pb2.Duration, b: duration_pb2.Duration) -> duration_pb2.Duration:
    return a if (a.seconds, a.nanos) <= (b.seconds, b.nanos) else b


class ReportFanOut:
    """One client's report stream as its origins see it, and the other way round.

    ``origins`` are the origins a stream goes to (every one the relay
    follows); ``owner`` names the origin that serves a cluster (None: none
    does, and its stats go nowhere).
    """

    def __init__(self, origins: Sequence[str],
                 owner: Callable[[str], str | None]) -> None:
        # every origin whose stream is live, and its latest response (None: none yet)
        self._latest: dict[str, lrs_pb2.LoadStatsResponse | None] = dict.fromkeys(origins)
        self._owner = owner

    @property
    def live(self) -> list[str]:
        """The origins whose streams are still live."""
        return list(self._latest)

    def request(self, request: lrs_pb2.LoadStatsRequest) -> dict[str, lrs_pb2.LoadStatsRequest]:
        """What each live origin is sent of the client's ``request``.

        Each cluster's stats go to the origin that serves it; the Node, and a
        request with no stats at all ("nothing to report"), to every origin.
        An origin that has nothing in a request is sent nothing.
        """
        if len(self._latest) == 1 and all(
                self._owner(stats.cluster_name) in self._latest
                for stats in request.cluster_stats):
            return {next(iter(self._latest)): request}  # one origin: the request as it is
        parts: dict[str, lrs_pb2.LoadStatsRequest] = {}
        if request.HasField("node") or not request.cluster_stats:
            for origin in self._latest:
                part = parts[origin] = lrs_pb2.LoadStatsRequest()
                if request.HasField("node"):
                    part.node.CopyFrom(request.node)
        for stats in request.cluster_stats:
            owner = self._owner(stats.cluster_name)
            if owner is not None and owner in self._latest:
                parts.setdefault(owner, lrs_pb2.LoadStatsRequest()).cluster_stats.append(stats)
        return parts

    def response(self, origin: str, response: lrs_pb2.LoadStatsResponse
                 ) -> lrs_pb2.LoadStatsResponse:
        """What the client is sent when ``origin`` sends ``response``."""
        self._latest[origin] = response
        return self._merged()

    def ended(self, origin: str, code: grpc.StatusCode
              ) -> OriginEnded | lrs_pb2.LoadStatsResponse | None:
        """``origin``'s stream ended with ``code``: the client's ends with it
        (:class:`OriginEnded`), or, an origin without LRS among several, the
        stream goes on without it (the response the client is sent now that
        the origin's part is gone, or None: it had sent none)."""
        if code is not grpc.StatusCode.UNIMPLEMENTED or len(self._latest) < 2:
            return OriginEnded(origin, code)
        had = self._latest.pop(origin, None)
        if had is None or not any(r is not None for r in self._latest.values()):
            return None
        return self._merged()

    def _merged(self) -> lrs_pb2.LoadStatsResponse:
        answered = [r for r in self._latest.values() if r is not None]
        if len(answered) == 1:
            return answered[0]  # the origin's own
        merged = lrs_pb2.LoadStatsResponse(
            clusters=list(dict.fromkeys(c for r in answered for c in r.clusters)),
            send_all_clusters=any(r.send_all_clusters for r in answered),
            report_endpoint_granularity=any(r.report_endpoint_granularity for r in answered))
        intervals = [r.load_reporting_interval for r in answered
                     if r.HasField("load_reporting_interval")]
        if intervals:
            shortest = intervals[0]
            for interval in intervals[1:]:
                shortest = _shorter(shortest, interval)
            merged.load_reporting_interval.CopyFrom(shortest)
        return merged


# -- the service ---------------------------------------------------------------


class _End(RelayError):
    """The client's stream ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


#: The most report streams forwarded on one channel to an origin: below the
#: streams a server commonly takes on one connection (100 for many, the
#: relay's own limits.streams_per_connection among them, when relays are
#: chained), since a stream beyond it would wait, unanswered, for a slot.
STREAMS_PER_CHANNEL = 50


@dataclass(eq=False, slots=True)
class _Shared:
    """A channel to an origin and the report streams using it."""

    channel: grpc.aio.Channel
    users: int = 0
    # a stream on it failed UNAVAILABLE: it takes no new streams
    stale: bool = False


class _Channels:
    """The channels to each origin that the report streams forwarded to it share,
    :data:`STREAMS_PER_CHANNEL` at most on each.

    A channel is opened when a stream finds none with room and closed with its
    last stream, so an idle relay holds none. One on which a stream failed
    UNAVAILABLE (the connection, most likely) takes no new streams: the next
    one dials afresh, reading the TLS files again, as the origin stream does on
    reconnect.
    """

    def __init__(self, dialer_of: Callable[[str], Dialer]) -> None:
        self._dialer_of = dialer_of
        self._open: dict[str, list[_Shared]] = {}

    def take(self, origin: str) -> _Shared:
        """The channel a new stream to ``origin`` uses (raises DialError)."""
        channels = self._open.setdefault(origin, [])
        shared = next((c for c in channels
                       if not c.stale and c.users < STREAMS_PER_CHANNEL), None)
        if shared is None:
            shared = _Shared(self._dialer_of(origin).channel())
            channels.append(shared)
        shared.users += 1
        return shared

    async def give_back(self, origin: str, shared: _Shared, failed: bool) -> None:
        """A stream on ``shared`` ended (``failed``: UNAVAILABLE)."""
        shared.users -= 1
        shared.stale = shared.stale or failed
        if shared.users:
            return
        channels = self._open.get(origin, [])
        channels.remove(shared)
        if not channels:
            self._open.pop(origin, None)
        await shared.channel.close()

    def counts(self) -> dict[str, int]:
        """Channels open per origin."""
        return {origin: len(channels) for origin, channels in self._open.items()}


class LoadReports:
    """The relay's LoadReportingService: each client stream forwarded to the
    origins of ``routes``, each reached with ``dialer_of(origin)``."""

    def __init__(self, serving: ServingContext, routes: Routes,
                 dialer_of: Callable[[str], Dialer]) -> None:
        self._serving = serving
        self._routes = routes
        self._dialer_of = dialer_of
        self._channels = _Channels(dialer_of)
        # client streams forwarded now (limits.load_report_streams)
        self._open = 0

    def handler(self) -> grpc.RpcMethodHandler:
        """The ``StreamLoadStats`` method's handler."""
        return grpc.stream_stream_rpc_method_handler(
            self._serve, request_deserializer=request_decoder(
                lrs_pb2.LoadStatsRequest, self._serving.settings.limits.request_size),
            response_serializer=lrs_pb2.LoadStatsResponse.SerializeToString)

    async def _serve(self, requests: AsyncIterator[lrs_pb2.LoadStatsRequest],
                     context: grpc.aio.ServicerContext) -> None:
        serving = self._serving
        if serving.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, _DRAINING)
        limit = serving.settings.limits.load_report_streams
        if self._open >= limit:
            message = (f"the relay forwards {self._open} load report streams, its most "
                       f"(limits.load_report_streams); report to another replica")
            serving.metrics.downstream_limited.add(1, {"limit": "load_report_streams"})
            serving.warn_limited(context.peer(), "load_report_streams",
                                 "refusing load report stream from %s: %s",
                                 context.peer(), message)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        access = serving.settings.access
        identity = None if access is None else await access.admit(context)
        self._open += 1
        try:
            await _Forwarding(self, context).run(requests, identity)
        except _End as end:
            if end.code is not grpc.StatusCode.OK:
                await context.abort(end.code, end.details)
        finally:
            self._open -= 1

    def _who(self, origin: str) -> str:
        """An origin as messages name it: "the origin" when it is the only one."""
        who = f"origin {origin}" if self._routes.several else "the origin"
        return f"{who} at {self._dialer_of(origin).target}"


def _status_lost(error: grpc.aio.AioRpcError) -> bool:
    """Whether gRPC Python replaced an origin's status with its own INTERNAL: a
    write that raced the origin's end (grpc/grpc#36066; seen with grpcio 1.85)."""
    return (error.code() is grpc.StatusCode.INTERNAL
            and "execute_batch" in (error.debug_error_string() or ""))


@dataclass(eq=False, slots=True)
class _OriginStream:
    """The stream to one origin on behalf of one client stream."""

    call: grpc.aio.StreamStreamCall
    channel: _Shared
    # whether the origin has answered on it, and whether it failed UNAVAILABLE
    answered: bool = False
    unavailable: bool = False


class _Forwarding:
    """One client report stream, forwarded: its origin streams and the tasks
    moving messages between them and the client."""

    def __init__(self, service: LoadReports, context: grpc.aio.ServicerContext) -> None:
        self._service = service
        self._context = context
        routes = service._routes
        self._fan = ReportFanOut(routes.origins(), routes.origin_of)
        self._origins: dict[str, _OriginStream] = {}
        # the client's first request (its Node): what a stream opened again is sent first
        self._first: lrs_pb2.LoadStatsRequest | None = None
        self._write_lock = asyncio.Lock()  # the origins' readers take turns writing
        self._end: asyncio.Future[_End] = asyncio.get_running_loop().create_future()

    async def run(self, requests: AsyncIterator[lrs_pb2.LoadStatsRequest],
                  identity: PeerIdentity | None) -> None:
        """Forward until an end (raised as :class:`_End`)."""
        tasks: list[asyncio.Task[None]] = []
        try:
            for origin in self._fan.live:
                self._origins[origin] = self._open(origin)
            tasks = [asyncio.create_task(self._from_client(requests, identity))]
            tasks += [asyncio.create_task(self._from_origin(origin)) for origin in self._origins]
            raise await self._end
        finally:
            for task in tasks:
                task.cancel()
            for stream in self._origins.values():
                stream.call.cancel()
            for task in tasks:
                await ended(task)
            for origin, stream in self._origins.items():
                await self._service._channels.give_back(origin, stream.channel,
                                                        stream.unavailable)

    def _open(self, origin: str) -> _OriginStream:
        """A report stream to ``origin``, on the channel shared by those to it."""
        dialer = self._service._dialer_of(origin)
        try:
            metadata = dialer.metadata()
            shared = self._service._channels.take(origin)
        except DialError as error:
            raise _End(grpc.StatusCode.UNAVAILABLE,
                       f"the relay cannot forward load reports to "
                       f"{self._service._who(origin)}: {error}") from None
        method = shared.channel.stream_stream(
            _PATH, request_serializer=lrs_pb2.LoadStatsRequest.SerializeToString,
            response_deserializer=lrs_pb2.LoadStatsResponse.FromString)
        return _OriginStream(method(metadata=metadata), shared)

    def _finish(self, end: _End) -> None:
        if not self._end.done():
            self._end.set_result(end)

    async def _from_client(self, requests: AsyncIterator[lrs_pb2.LoadStatsRequest],
                           identity: PeerIdentity | None) -> None:
        serving = self._service._serving
        peer = self._context.peer()
        try:
            async for request in requests:
                if self._first is None:
                    if not await self._admit_node(request, identity):
                        return
                    self._first = request
                for origin, part in self._fan.request(request).items():
                    await self._write(origin, part)
        except RequestTooLarge as error:
            serving.metrics.downstream_limited.add(1, {"limit": error.limit})
            serving.warn_limited(peer, error.limit, "refusing load reports from %s: %s",
                                 peer, error)
            self._finish(_End(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)))
            return
        except UndecodableRequest as error:
            serving.warn_limited(peer, "invalid", "rejecting load reports from %s: %s",
                                 peer, error)
            self._finish(_End(grpc.StatusCode.INVALID_ARGUMENT, str(error)))
            return
        # The client is done reporting: so is every origin stream, which ends in its turn.
        for origin in self._fan.live:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await self._origins[origin].call.done_writing()

    async def _write(self, origin: str, request: lrs_pb2.LoadStatsRequest) -> None:
        # A stream that ended takes nothing; its reader tells how it ended.
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._origins[origin].call.write(request)

    async def _admit_node(self, request: lrs_pb2.LoadStatsRequest,
                          identity: PeerIdentity | None) -> bool:
        """Whether the first request's Node may report (server.authorization.node_binding)."""
        access = self._service._serving.settings.access
        if access is None:
            return True
        node = request.node if request.HasField("node") else None
        error = access.node_error(identity, node)
        if error is None:
            return True
        access.refused("node_binding", self._context.peer(), error)
        self._finish(_End(grpc.StatusCode.PERMISSION_DENIED, error))
        return False

    async def _from_origin(self, origin: str) -> None:
        """Pass ``origin``'s responses on until its stream ends, then act on the end."""
        reopened = False
        while True:
            stream = self._origins[origin]
            try:
                async for response in stream.call:
                    stream.answered = True
                    await self._to_client(self._fan.response(origin, response))
                code, details = await stream.call.code(), await stream.call.details()
            except grpc.aio.AioRpcError as error:
                if _status_lost(error) and not stream.answered and not reopened:
                    # The origin ended the stream before answering, and how is lost:
                    # ask again, once, to learn it (or to be served after all).
                    reopened = True
                    if await self._reopen(origin):
                        continue
                    return
                code, details = error.code(), error.details() or ""
            break
        stream.unavailable = code is grpc.StatusCode.UNAVAILABLE
        outcome = self._fan.ended(origin, code)
        if isinstance(outcome, OriginEnded):
            self._ended(origin, code, details)
        elif outcome is not None:
            await self._to_client(outcome)

    async def _reopen(self, origin: str) -> bool:
        """Open ``origin``'s stream again, sent the client's first request if it
        came; whether it opened (else the client's stream ends)."""
        old = self._origins[origin]
        try:
            self._origins[origin] = self._open(origin)
        except _End as end:
            self._finish(end)
            return False
        await self._service._channels.give_back(origin, old.channel, False)
        if self._first is not None:
            await self._write(origin, self._fan.request(self._first).get(
                origin, lrs_pb2.LoadStatsRequest()))
        return True

    async def _to_client(self, response: lrs_pb2.LoadStatsResponse) -> None:
        async with self._write_lock:
            await self._context.write(response)

    def _ended(self, origin: str, code: grpc.StatusCode, details: str) -> None:
        if code is grpc.StatusCode.OK:
            self._finish(_End(code, ""))
            return
        who = self._service._who(origin)
        peer = self._context.peer()
        self._service._serving.warn_limited(
            peer, "load_reports", "load reports of %s: %s ended the stream with %s: %s",
            peer, who, code.name, shown(details))
        self._finish(_End(code, f"the relay forwards load reports to {who}, whose stream "
                                f"ended with {code.name}: {shown(details, 1024)}"))


def load_report_handlers(serving: ServingContext, origins: Origins | None
                         ) -> grpc.GenericRpcHandler:
    """The LoadReportingService: forwarding to ``origins``, or, with none (files),
    refusing with UNIMPLEMENTED and :data:`NO_ORIGIN`."""
    if origins is not None:
        clients = origins.clients
        # the server the relay follows the origin on (see UpstreamClient)
        handler = LoadReports(serving, origins.routes,
                              lambda origin: clients[origin].dialer).handler()
    else:
        async def refuse(requests: AsyncIterator[lrs_pb2.LoadStatsRequest],
                         context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_ORIGIN)

        handler = grpc.stream_stream_rpc_method_handler(
            refuse, request_deserializer=lrs_pb2.LoadStatsRequest.FromString,
            response_serializer=lrs_pb2.LoadStatsResponse.SerializeToString)
    return grpc.method_handlers_generic_handler(LRS_SERVICE, {_METHOD: handler})

