"""The baseline: a bare ``grpc.aio`` Delta-ADS server sending pre-encoded bytes.

Benchmarks report the relay's figures as ratios against this server,
measured in the same run with the same clients. It does the least a real
server must: it decodes every request (``DeltaDiscoveryRequest.FromString``),
answers a subscription with the subscribed resources and writes updates to
the streams subscribed to what changed. Every response is encoded once and
its bytes written as they are (the serializer is the identity), so what is
left is gRPC and the event loop. It runs in its own process, as the relay
does, with the relay's own gRPC server options (``--options relay``, the
default) or with gRPC's defaults (``--options default``: none but the
relay's queue of calls waiting for the event loop, without which gRPC
cancels a storm's calls past 1,000), the two baselines that bound what the
relay's options cost (``--options relay-no-age``: the relay's but for
``server.max_connection_age``, what gRPC's connection ageing costs); with
``--gc relay``, also with the relay's garbage collector settings
(:func:`relay.runtime.tune_gc`; py-spy found 15% of the event loop's time
in ``gc_collect_main`` without them, in a 1,000-stream fan-out's updates);
over TLS with ``--tls-cert`` and ``--tls-key`` (PEM files: the relay's own,
for a like comparison).

A response is what the relay sends for the same resources: a
DeltaDiscoveryResponse with the type URL, a nonce and, per resource, a
``Resource`` with its name, its version and the ClusterLoadAssignment in an
``Any``. Unlike the relay, the server gives a nonce to each encoded
response rather than to each write: every stream gets the same bytes for
an update, and a stream asking twice for the same names the same nonce
(clients only match nonces to ACKs, so this is harmless here).

It serves ``NAME`` (``endpoints(NAME, 1)``, as the benchmarks' scripted
origin does) and, with ``--big K``, the names ``big_names(K)``, each a
ClusterLoadAssignment of about ``--size`` bytes, so that it can also be the
relay's origin. With ``--glob K`` it also serves the glob collection
``GLOB`` (delta only, as xDS TP1 has it): a subscription to ``GLOB`` is
answered with its K members ``glob_members(K)``, each ``endpoints(member, 1)``.
Controlled by lines on stdin, each answered by one line on
stdout (it prints ``port P`` once listening, and exits at the end of stdin):

* ``update NAME PORT``: ``NAME`` becomes ``endpoints(NAME, PORT)``, versioned
  as the tests' ``version_of``, pushed to its subscribers; answers
  ``pushed S`` (S streams);
* ``tick NAME MS``: from now on ``NAME`` changes every MS ms, its version
  ``sent@T`` (T the ``time.monotonic()`` of the push, comparable across
  processes on one machine); answers ``ok``.

Usage: ``python -m benchmarks.bare [--port 0] [--big K] [--size 1024] [--glob K]
[--options relay|relay-no-age|default] [--gc default|relay]
[--tls-cert FILE --tls-key FILE]``; the benchmarks start it with :func:`bare_process`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from benchmarks.processes import NAME, ServerProcess, listening_process
from relay.app import connection_age_options, server_options
from relay.config.models import RelayConfig
from relay.runtime import tune_gc  # the same collector settings, likewise
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, version_of

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
# responses kept encoded per set of names asked for (the oldest dropped first)
_KEPT_RESPONSES = 8
# gRPC server options of each baseline: the relay's own as it runs by default
# (connection ageing, keepalive and limits included: the same options, or the
# comparison is unfair), the same without connection ageing (gRPC's cost of
# server.max_connection_age shows between the two), and gRPC's defaults but
# for the queue of calls not yet taken by the event loop: at its default
# (1,000) gRPC cancels a storm's calls past it, and a 2,000-stream run fails
_RELAY = server_options(RelayConfig.model_validate({"node": {"id": "bare"},
                                                    "upstream": {"address": "127.0.0.1:1"}}))
_AGEING = {key for key, _ in connection_age_options(1.0, 1.0)}
_QUEUE = [(key, value) for key, value in _RELAY
          if key.startswith("grpc.server.max_pending_requests")]
OPTIONS: dict[str, list[tuple[str, Any]]] = {
    "relay": _RELAY,
    "relay-no-age": [(key, value) for key, value in _RELAY if key not in _AGEING],
    "default": _QUEUE}
# the glob collection of the federation benchmark (benchmarks.federation)
GLOB = "xdstp://auth/envoy.config.endpoint.v3.ClusterLoadAssignment/pool/*"


def big_names(count: int) -> list[str]:
    """The names of the big-client benchmark's resources, in the order subscribed."""
    return [f"big-{i}" for i in range(count)]


def glob_members(count: int) -> list[str]:
    """The names of ``GLOB``'s members."""
    return [f"{GLOB[:-1]}m{i}" for i in range(count)]


def padded_endpoints(names: Iterable[str], size: int) -> Iterator[tuple[str, bytes]]:
    """``(name, body)``: each ``endpoints(name, 10000, 10001, ...)``, with as
    many ports as make about ``size`` bytes, serialized.

    Built from two parts (the name, then the endpoints encoded once), which
    is the message's own encoding as protobuf orders fields by number:
    checked against the real thing on the first name.
    """
    ports: list[int] = []
    while len(endpoints("", *ports).SerializeToString()) < size:
        ports.append(10000 + len(ports))
    tail = endpoints("", *ports).SerializeToString()
    checked = False
    for name in names:
        body = endpoint_pb2.ClusterLoadAssignment(cluster_name=name).SerializeToString() + tail
        if not checked:
            assert body == endpoints(name, *ports).SerializeToString()
            checked = True
        yield name, body


class Catalog:
    """Every resource the server has, each encoded once as a response's
    ``resources`` entry, and the responses assembled from those entries."""

    def __init__(self) -> None:
        self._entries: dict[str, bytes] = {}
        # glob collection -> its members' names, which a subscription to it is answered with
        self.collections: dict[str, tuple[str, ...]] = {}
        # names asked for -> (the same as a set, the response)
        self._responses: OrderedDict[tuple[str, ...], tuple[frozenset[str], bytes]] = \
            OrderedDict()
        self._nonce = 0

    def set(self, name: str, version: str, body: bytes) -> None:
        # A response holding only this resource is exactly its entry.
        resource = discovery_pb2.Resource(
            name=name, version=version, resource=any_pb2.Any(type_url=ENDPOINT, value=body))
        self._entries[name] = discovery_pb2.DeltaDiscoveryResponse(
            resources=[resource]).SerializeToString()
        for names in [k for k, (held, _) in self._responses.items() if name in held]:
            del self._responses[names]

    def response(self, names: tuple[str, ...]) -> bytes:
        """The response for ``names`` (those it lacks in ``removed_resources``; a
        collection stands for its members)."""
        kept = self._responses.get(names)
        if kept is not None:
            return kept[1]
        asked = names
        names = tuple(m for n in asked for m in self.collections.get(n, (n,)))
        self._nonce += 1
        entries = self._entries
        head = discovery_pb2.DeltaDiscoveryResponse(
            type_url=ENDPOINT, nonce=f"b{self._nonce}",
            removed_resources=[n for n in names if n not in entries])
        response: bytes = head.SerializeToString() + b"".join(
            entries[n] for n in names if n in entries)
        self._responses[asked] = (frozenset(names), response)
        if len(self._responses) > _KEPT_RESPONSES:
            self._responses.popitem(last=False)
        return response


@dataclass(eq=False)
class _Stream:
    outbox: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    names: set[str] = field(default_factory=set)


class BareServer:
    """The server: a generic handler over a :class:`Catalog`."""

    def __init__(self, catalog: Catalog, options: str = "relay",
                 tls: tuple[Path, Path] | None = None) -> None:
        """``options``: a key of :data:`OPTIONS`; ``tls``: (certificate, key) files."""
        self.catalog = catalog
        self._options = OPTIONS[options]
        self._tls = tls
        self._streams: set[_Stream] = set()
        self._server: grpc.aio.Server | None = None
        self._ticks = 0

    async def start(self, port: int) -> int:
        server = grpc.aio.server(options=self._options)
        handler = grpc.stream_stream_rpc_method_handler(
            self._serve, request_deserializer=discovery_pb2.DeltaDiscoveryRequest.FromString,
            response_serializer=_identity)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            ADS_SERVICE, {"DeltaAggregatedResources": handler})])
        address = f"127.0.0.1:{port}"
        if self._tls is None:
            bound = server.add_insecure_port(address)
        else:
            cert, key = (path.read_bytes() for path in self._tls)
            bound = server.add_secure_port(
                address, grpc.ssl_server_credentials([(key, cert)]))
        await server.start()
        self._server = server
        return int(bound)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)

    def update(self, name: str, version: str, body: bytes) -> int:
        """Change ``name`` and write it to its subscribers; how many there are."""
        self.catalog.set(name, version, body)
        subscribers = [s for s in self._streams if name in s.names]
        if subscribers:
            response = self.catalog.response((name,))
            for stream in subscribers:
                stream.outbox.put_nowait(response)
        return len(subscribers)

    async def tick(self, name: str, interval: float) -> None:
        """Change ``name`` every ``interval`` seconds, the send time in its version."""
        while True:
            await asyncio.sleep(interval)
            self._ticks += 1
            self.update(name, f"sent@{time.monotonic():.6f}",
                        endpoints(name, 1 + self._ticks % 60000).SerializeToString())

    async def _serve(self, requests: AsyncIterator[Any],
                     context: grpc.aio.ServicerContext) -> None:
        stream = _Stream()
        self._streams.add(stream)
        reader = asyncio.create_task(self._read(requests, stream))
        try:
            while (response := await stream.outbox.get()) is not None:
                await context.write(response)
        finally:
            reader.cancel()
            self._streams.discard(stream)

    async def _read(self, requests: AsyncIterator[Any], stream: _Stream) -> None:
        try:
            async for request in requests:
                stream.names.difference_update(request.resource_names_unsubscribe)
                if request.resource_names_subscribe:
                    names = tuple(request.resource_names_subscribe)
                    stream.names.update(names)
                    stream.outbox.put_nowait(self.catalog.response(names))
        finally:
            stream.outbox.put_nowait(None)


def _identity(data: bytes) -> bytes:
    return data


async def _control(server: BareServer) -> None:
    """Follow the commands on stdin until it ends."""
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    ticks: list[asyncio.Task[None]] = []
    while line := (await stdin.readline()).decode():
        match line.split():
            case ["update", name, port]:
                message = endpoints(name, int(port))
                pushed = server.update(name, version_of(message), message.SerializeToString())
                print(f"pushed {pushed}", flush=True)
            case ["tick", name, ms]:
                ticks.append(asyncio.create_task(server.tick(name, int(ms) / 1000)))
                print("ok", flush=True)
            case _:
                print(f"error: unknown command {line.strip()!r}", flush=True)
    for task in ticks:
        task.cancel()


async def serve(port: int, big: int, size: int, glob: int = 0, options: str = "relay",
                tls: tuple[Path, Path] | None = None, gc: str = "default") -> None:
    catalog = Catalog()
    small = endpoints(NAME, 1)
    catalog.set(NAME, version_of(small), small.SerializeToString())
    for name, body in padded_endpoints(big_names(big), size):
        catalog.set(name, hashlib.sha256(body).hexdigest()[:12], body)
    if big:
        catalog.response(tuple(big_names(big)))  # encoded before the first client asks
    if glob:
        for member in glob_members(glob):
            message = endpoints(member, 1)
            catalog.set(member, version_of(message), message.SerializeToString())
        catalog.collections[GLOB] = tuple(glob_members(glob))
    server = BareServer(catalog, options, tls)
    if gc == "relay":
        tune_gc()
    print(f"port {await server.start(port)}", flush=True)
    try:
        await _control(server)
    finally:
        await server.stop()


# -- the harness's side --------------------------------------------------------


class BareProcess(ServerProcess):
    """A running bare server and its control pipe."""

    async def command(self, line: str) -> str:
        """Send one command; its one-line answer."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()
        return (await self.process.stdout.readline()).decode().strip()


@contextlib.asynccontextmanager
async def bare_process(big: int = 0, size: int = 1024, glob: int = 0, *,
                       options: str = "relay", tls: tuple[Path, Path] | None = None,
                       gc: str = "default", env: Mapping[str, str] | None = None
                       ) -> AsyncIterator[BareProcess]:
    """``python -m benchmarks.bare`` on a free port, once listening (with
    ``options``, a key of :data:`OPTIONS`; over TLS with ``tls``, the
    certificate and key files; ``gc="relay"``: the relay's collector
    settings; ``env``: more of its environment, e.g. ``{"PYTHONMALLOC":
    "malloc"}``, the relay's allocator); ended on the way out (end of stdin,
    then SIGKILL after 10 s)."""
    tls_args = ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])] if tls else []
    # (encoding 100,000 resources takes a few seconds)
    async with listening_process("benchmarks.bare", [
            "--big", str(big), "--size", str(size), "--glob", str(glob), "--options", options,
            "--gc", gc, *tls_args], ready_within=300, env=env) as (process, port):
        yield BareProcess(process, port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--big", type=int, default=0,
                        help="also serve the names big-0 .. big-(K-1)")
    parser.add_argument("--size", type=int, default=1024,
                        help="bytes of each big-N ClusterLoadAssignment (about)")
    parser.add_argument("--glob", type=int, default=0,
                        help="also serve the collection GLOB of K members")
    parser.add_argument("--options", choices=sorted(OPTIONS), default="relay",
                        help="gRPC server options: the relay's (without its connection "
                             "ageing), or gRPC's defaults")
    parser.add_argument("--gc", choices=["default", "relay"], default="default",
                        help="the garbage collector's settings: CPython's, or the relay's")
    parser.add_argument("--tls-cert", type=Path, help="serve over TLS: certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, help="serve over TLS: its key (PEM)")
    args = parser.parse_args()
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    tls = (args.tls_cert, args.tls_key) if args.tls_cert else None
    asyncio.run(serve(args.port, args.big, args.size, args.glob, args.options, tls, args.gc))


if __name__ == "__main__":
    main()
