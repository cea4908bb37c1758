"""Load reporting (LRS) on loopback, for tests of the relay's forwarding:
an origin that serves LRS beside Delta ADS, and a client report stream.

:class:`LrsOrigin` answers the first request of each report stream with
``answer`` (None: the test answers with :meth:`ReportStream.respond`),
records every request and the stream's metadata, and can end a stream with
a status, as a control plane would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import load_report_pb2
from envoy.service.load_stats.v3 import lrs_pb2
from google.protobuf import duration_pb2

from tests.harness import TIMEOUT, ScriptedOrigin, eventually

LRS_SERVICE = "envoy.service.load_stats.v3.LoadReportingService"
LRS_METHOD = f"/{LRS_SERVICE}/StreamLoadStats"


def asking(*clusters: str, seconds: int = 1, send_all: bool = False
           ) -> lrs_pb2.LoadStatsResponse:
    """A response asking for reports of ``clusters`` every ``seconds``."""
    return lrs_pb2.LoadStatsResponse(
        clusters=list(clusters), send_all_clusters=send_all,
        load_reporting_interval=duration_pb2.Duration(seconds=seconds))


def stats(cluster: str, dropped: int = 0, successful: int = 0) -> load_report_pb2.ClusterStats:
    """A cluster's report: ``dropped`` requests dropped, ``successful`` served in one
    locality."""
    report = load_report_pb2.ClusterStats(cluster_name=cluster,
                                          total_dropped_requests=dropped)
    if successful:
        report.upstream_locality_stats.add(
            locality=base_pb2.Locality(region="r", zone="z"),
            total_successful_requests=successful)
    return report


@dataclass
class ReportStream:
    """One report stream the origin serves."""

    metadata: dict[str, str]
    requests: asyncio.Queue[lrs_pb2.LoadStatsRequest] = field(default_factory=asyncio.Queue)
    log: list[lrs_pb2.LoadStatsRequest] = field(default_factory=list)
    outbox: asyncio.Queue[lrs_pb2.LoadStatsResponse | tuple[grpc.StatusCode, str] | None] = \
        field(default_factory=asyncio.Queue)
    # set once the stream is over (the relay ended or cancelled it, or the origin did)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def respond(self, response: lrs_pb2.LoadStatsResponse) -> None:
        self.outbox.put_nowait(response)

    def end(self, code: grpc.StatusCode, details: str) -> None:
        """End the stream with ``code`` (OK: ends it normally)."""
        self.outbox.put_nowait(None if code is grpc.StatusCode.OK else (code, details))

    async def next_request(self, timeout: float = TIMEOUT) -> lrs_pb2.LoadStatsRequest:
        return await asyncio.wait_for(self.requests.get(), timeout)


class LrsOrigin(ScriptedOrigin):
    """A scripted origin (Delta ADS) that serves LoadReportingService too."""

    def __init__(self, answer: lrs_pb2.LoadStatsResponse | None = None) -> None:
        super().__init__()
        self.answer = answer
        self.report_streams: list[ReportStream] = []
        # statuses that end the next report streams at once, one each
        self.refusals: list[tuple[grpc.StatusCode, str]] = []

    def more_handlers(self) -> list[grpc.GenericRpcHandler]:
        handler = grpc.stream_stream_rpc_method_handler(
            self._reports, request_deserializer=lrs_pb2.LoadStatsRequest.FromString,
            response_serializer=lrs_pb2.LoadStatsResponse.SerializeToString)
        return [grpc.method_handlers_generic_handler(LRS_SERVICE, {"StreamLoadStats": handler})]

    async def report_stream(self, index: int = 0, timeout: float = TIMEOUT) -> ReportStream:
        """The ``index``-th report stream, once it opened."""
        await eventually(lambda: len(self.report_streams) > index, timeout)
        return self.report_streams[index]

    async def _reports(self, requests: AsyncIterator[lrs_pb2.LoadStatsRequest],
                       context: grpc.aio.ServicerContext) -> AsyncIterator[
                           lrs_pb2.LoadStatsResponse]:
        stream = ReportStream({k: v for k, v in context.invocation_metadata() or ()
                               if isinstance(v, str)})
        self.report_streams.append(stream)
        if self.refusals:
            stream.ended.set()
            await context.abort(*self.refusals.pop(0))

        async def read() -> None:
            async for request in requests:
                stream.log.append(request)
                await stream.requests.put(request)
                if len(stream.log) == 1 and self.answer is not None:
                    stream.respond(self.answer)
            await stream.outbox.put(None)  # the relay is done: so is the origin

        reader = asyncio.create_task(read())
        try:
            while (item := await stream.outbox.get()) is not None:
                if isinstance(item, tuple):
                    await context.abort(*item)
                yield item
        finally:
            reader.cancel()
            stream.ended.set()


class ReportClient:
    """A client's report stream to the relay, read in the background (as
    :class:`tests.harness.XdsClient` reads discovery streams)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = channel.stream_stream(
            LRS_METHOD, request_serializer=lrs_pb2.LoadStatsRequest.SerializeToString,
            response_deserializer=lrs_pb2.LoadStatsResponse.FromString)()
        self._inbox: asyncio.Queue[lrs_pb2.LoadStatsResponse | grpc.aio.AioRpcError | None] = \
            asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                await self._inbox.put(response)
            await self._inbox.put(None)
        except grpc.aio.AioRpcError as error:
            await self._inbox.put(error)

    async def send(self, request: lrs_pb2.LoadStatsRequest) -> None:
        """Write ``request``; a stream the relay ended already takes nothing (read
        its status with :meth:`ended`)."""
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self.call.write(request)

    async def recv(self, timeout: float = TIMEOUT) -> lrs_pb2.LoadStatsResponse:
        """The next response; raises the stream's error if it failed."""
        item = await asyncio.wait_for(self._inbox.get(), timeout)
        if isinstance(item, grpc.aio.AioRpcError):
            raise item
        assert item is not None, "the stream ended (OK)"
        return item

    async def ended(self, timeout: float = TIMEOUT) -> tuple[grpc.StatusCode, str]:
        """Wait for the stream's end, skipping responses: its status and details."""
        while True:
            item = await asyncio.wait_for(self._inbox.get(), timeout)
            if item is None:
                return grpc.StatusCode.OK, ""
            if isinstance(item, grpc.aio.AioRpcError):
                return item.code(), item.details() or ""

    def close(self) -> None:
        self._reader.cancel()
        self.call.cancel()
