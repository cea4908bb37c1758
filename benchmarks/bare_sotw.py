"""The bare server of :mod:`benchmarks.bare`, also answering SotW (``StreamAggregatedResources``).

For :mod:`benchmarks.big_client` ``--variant sotw``: a SotW client asking for
K names gets one pre-encoded ``DiscoveryResponse`` of the K resources, what
the bare delta server does for a delta client, so that the relay's SotW big
client has a baseline of the same kind. Each ``resources`` entry is the
resource's body in an ``Any`` (as the relay's ``CachedResource.sotw_entry``),
and ``version_info`` is a fixed string (the relay's is a digest of what the
client holds: 16 hex digits). A request naming the names the stream already
has (an ACK, whose nonce is not checked) is not answered; any other is
answered with the resources of all its names (the relay sends only those
added: the benchmark's client asks once). Delta streams are served as
:mod:`benchmarks.bare` serves them (the probe of :mod:`benchmarks.big_client`
is one).

Usage: ``python -m benchmarks.bare_sotw [--port 0] [--big K] [--size 1024]``,
controlled on stdin as :mod:`benchmarks.bare` is; the benchmarks start it with
:func:`bare_sotw_process`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from benchmarks.bare import (
    ADS_SERVICE,
    OPTIONS,
    BareProcess,
    BareServer,
    Catalog,
    _control,
    _identity,
    big_names,
    padded_endpoints,
)
from benchmarks.processes import NAME, listening_process
from relay.encoding import length_delimited_field
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, version_of

# ``resources``: field 2 of DiscoveryResponse
_RESOURCES_FIELD = 2
_VERSION = "0123456789abcdef"


class SotwCatalog:
    """The big resources as SotW ``resources`` entries, and responses of them."""

    def __init__(self) -> None:
        self._entries: dict[str, bytes] = {}
        self._responses: dict[tuple[str, ...], bytes] = {}
        self._nonce = 0

    def set(self, name: str, body: bytes) -> None:
        self._entries[name] = length_delimited_field(
            _RESOURCES_FIELD, any_pb2.Any(type_url=ENDPOINT, value=body).SerializeToString())

    def response(self, names: tuple[str, ...]) -> bytes:
        """One DiscoveryResponse of those of ``names`` it has (kept, once built)."""
        kept = self._responses.get(names)
        if kept is None:
            self._nonce += 1
            head = discovery_pb2.DiscoveryResponse(type_url=ENDPOINT, version_info=_VERSION,
                                                   nonce=f"s{self._nonce}")
            entries = self._entries
            kept = self._responses[names] = head.SerializeToString() + b"".join(
                entries[n] for n in names if n in entries)
        return kept


class BareSotwServer(BareServer):
    """:class:`~benchmarks.bare.BareServer` with ``StreamAggregatedResources`` too."""

    def __init__(self, catalog: Catalog, sotw: SotwCatalog) -> None:
        super().__init__(catalog)
        self.sotw = sotw

    async def start(self, port: int) -> int:
        server = grpc.aio.server(options=OPTIONS["relay"])
        delta = grpc.stream_stream_rpc_method_handler(
            self._serve, request_deserializer=discovery_pb2.DeltaDiscoveryRequest.FromString,
            response_serializer=_identity)
        sotw = grpc.stream_stream_rpc_method_handler(
            self._serve_sotw, request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
            response_serializer=_identity)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            ADS_SERVICE, {"DeltaAggregatedResources": delta,
                          "StreamAggregatedResources": sotw})])
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self._server = server
        return int(bound)

    async def _serve_sotw(self, requests: AsyncIterator[Any],
                          context: grpc.aio.ServicerContext) -> None:
        asked: frozenset[str] = frozenset()
        async for request in requests:
            names = tuple(request.resource_names)
            if frozenset(names) != asked:
                asked = frozenset(names)
                await context.write(self.sotw.response(names))


async def serve(port: int, big: int, size: int) -> None:
    catalog, sotw = Catalog(), SotwCatalog()
    small = endpoints(NAME, 1)
    catalog.set(NAME, version_of(small), small.SerializeToString())
    for name, body in padded_endpoints(big_names(big), size):
        sotw.set(name, body)
    if big:
        sotw.response(tuple(big_names(big)))  # encoded before the first client asks
    server = BareSotwServer(catalog, sotw)
    print(f"port {await server.start(port)}", flush=True)
    try:
        await _control(server)
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def bare_sotw_process(big: int = 0, size: int = 1024) -> AsyncIterator[BareProcess]:
    """``python -m benchmarks.bare_sotw`` on a free port, once listening."""
    async with listening_process("benchmarks.bare_sotw", [
            "--big", str(big), "--size", str(size)], ready_within=300) as (process, port):
        yield BareProcess(process, port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--big", type=int, default=0,
                        help="also serve the names big-0 .. big-(K-1)")
    parser.add_argument("--size", type=int, default=1024,
                        help="bytes of each big-N ClusterLoadAssignment (about)")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.big, args.size))


if __name__ == "__main__":
    main()
