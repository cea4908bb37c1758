"""The cold baseline: a bare forwarder, the fastest a relay hop can be.

A relay that holds nothing yet (a *cold* relay) must fetch what a client
asks for from its origin before it can answer, so it cannot match a server
that already holds the bytes (:mod:`benchmarks.bare`). This server bounds it
from the other side: a ``grpc.aio`` server in its own process holding one
Delta ADS stream to the same origin, which does the least a hop must:

* it decodes each client request (as the bare server does) and writes every
  request that subscribes to something, its bytes as they came, to the
  origin on its one stream; a plain ACK goes no further;
* it writes each origin response, undecoded (the bytes as they came, its
  nonce the origin's), to the client streams subscribed to the response's
  first resource name: the client that asked, for an origin that answers
  each subscription with what it asked for (as the bare server does); and
  ACKs it to the origin. To find the name, the nonce and the type URL it
  walks the response's outer fields, skipping each resource's bytes by
  their length, and stops once it has them: no resource is decoded, no
  Python object made for one.

Nothing is cached, checked, versioned or unsubscribed at the origin (a
client's names leave the routes when it unsubscribes or its stream ends).
The server has the relay's gRPC options (``--options default``: gRPC's),
the origin channel no message size limit.

Usage: ``python -m benchmarks.forwarder --origin HOST:PORT [--port 0]
[--options relay|default]``; it prints ``port P`` once listening and exits
at the end of stdin. Benchmarks start it with :func:`forwarder_process`::

    async with bare_process(k) as origin, forwarder_process(origin.target) as forwarder:
        ...  # clients connect to forwarder.target; its CPU is cpu_seconds(forwarder.pid)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from benchmarks.bare import ADS_SERVICE, OPTIONS
from benchmarks.processes import DELTA_ADS, ServerProcess, listening_process

# DeltaDiscoveryResponse's fields read here (numbers from discovery.proto)
_RESOURCES, _TYPE_URL, _NONCE, _REMOVED = 2, 4, 5, 6
# Resource.name
_RESOURCE_NAME = 3
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and where the next field starts."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int]]:
    """``(number, start, stop)`` of each length-delimited field in
    ``data[pos:end]`` (others are skipped), in wire order."""
    while pos < end:
        key, pos = _varint(data, pos)
        wire = key & 7
        if wire == _LEN:
            length, pos = _varint(data, pos)
            yield key >> 3, pos, pos + length
            pos += length
        elif wire == _VARINT:
            _, pos = _varint(data, pos)
        elif wire == _I64:
            pos += 8
        elif wire == _I32:
            pos += 4
        else:
            raise ValueError(f"wire type {wire} in a DeltaDiscoveryResponse")


def peek(response: bytes) -> tuple[str | None, str, str]:
    """A response's first resource name (of ``resources`` or, before them,
    ``removed_resources``; None if neither), nonce and type URL, from its
    outer fields only."""
    name: str | None = None
    nonce = type_url = ""
    for number, start, stop in _fields(response, 0, len(response)):
        if number == _RESOURCES and name is None:
            for inner, s, e in _fields(response, start, stop):
                if inner == _RESOURCE_NAME:
                    name = response[s:e].decode()
                    break
        elif number == _REMOVED and name is None:
            name = response[start:stop].decode()
        elif number == _NONCE:
            nonce = response[start:stop].decode()
        elif number == _TYPE_URL:
            type_url = response[start:stop].decode()
        if name is not None and nonce and type_url:
            break
    return name, nonce, type_url


@dataclass(eq=False)
class _Stream:
    outbox: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    names: set[str] = field(default_factory=set)


class Forwarder:
    """The server and its one stream to ``origin``."""

    def __init__(self, origin: str, options: str = "relay") -> None:
        self._origin = origin
        self._options = OPTIONS[options]
        # name -> the client streams subscribed to it
        self._routes: dict[str, set[_Stream]] = {}
        self._upstream: asyncio.Queue[bytes] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None

    async def start(self, port: int) -> int:
        self._channel = grpc.aio.insecure_channel(self._origin, options=[
            ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        await self._channel.channel_ready()
        call = self._channel.stream_stream(DELTA_ADS, request_serializer=_identity,
                                           response_deserializer=_identity)()
        self._tasks = [asyncio.create_task(self._write_upstream(call)),
                       asyncio.create_task(self._read_upstream(call))]
        server = grpc.aio.server(options=self._options)
        handler = grpc.stream_stream_rpc_method_handler(
            self._serve, request_deserializer=_identity, response_serializer=_identity)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            ADS_SERVICE, {"DeltaAggregatedResources": handler})])
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self._server = server
        return int(bound)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            await self._server.stop(0)
        if self._channel is not None:
            await self._channel.close()

    async def _write_upstream(self, call: Any) -> None:
        while True:
            await call.write(await self._upstream.get())

    async def _read_upstream(self, call: Any) -> None:
        async for response in call:
            name, nonce, type_url = peek(response)
            for stream in self._routes.get(name, ()) if name is not None else ():
                stream.outbox.put_nowait(response)
            self._upstream.put_nowait(discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, response_nonce=nonce).SerializeToString())

    async def _serve(self, requests: AsyncIterator[bytes],
                     context: grpc.aio.ServicerContext) -> None:
        stream = _Stream()
        reader = asyncio.create_task(self._read(requests, stream))
        try:
            while (response := await stream.outbox.get()) is not None:
                await context.write(response)
        finally:
            reader.cancel()
            self._unroute(stream, stream.names)

    async def _read(self, requests: AsyncIterator[bytes], stream: _Stream) -> None:
        try:
            async for raw in requests:
                request = discovery_pb2.DeltaDiscoveryRequest.FromString(raw)
                gone = set(request.resource_names_unsubscribe)
                if gone:
                    self._unroute(stream, gone)
                if request.resource_names_subscribe:
                    for name in request.resource_names_subscribe:
                        self._routes.setdefault(name, set()).add(stream)
                    stream.names.update(request.resource_names_subscribe)
                    self._upstream.put_nowait(raw)
        finally:
            stream.outbox.put_nowait(None)

    def _unroute(self, stream: _Stream, names: set[str]) -> None:
        for name in names:
            routed = self._routes.get(name)
            if routed is not None:
                routed.discard(stream)
                if not routed:
                    del self._routes[name]
        stream.names.difference_update(names)


def _identity(data: bytes) -> bytes:
    return data


async def serve(origin: str, port: int, options: str) -> None:
    forwarder = Forwarder(origin, options)
    print(f"port {await forwarder.start(port)}", flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    try:
        await stdin.read()  # until the end of stdin
    finally:
        await forwarder.stop()


# -- the harness's side --------------------------------------------------------


@contextlib.asynccontextmanager
async def forwarder_process(origin: str, options: str = "relay"
                            ) -> AsyncIterator[ServerProcess]:
    """``python -m benchmarks.forwarder`` in front of ``origin`` (``host:port``)
    on a free port, once listening and connected to it; ended on the way out
    (end of stdin, then SIGKILL after 10 s)."""
    async with listening_process("benchmarks.forwarder", [
            "--origin", origin, "--options", options], ready_within=60) as (process, port):
        yield ServerProcess(process, port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--origin", required=True, help="the origin's host:port")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--options", choices=sorted(OPTIONS), default="relay",
                        help="gRPC server options: the relay's, or gRPC's defaults")
    args = parser.parse_args()
    asyncio.run(serve(args.origin, args.port, args.options))


if __name__ == "__main__":
    main()
