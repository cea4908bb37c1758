"""An origin that behaves like istiod, for end-to-end tests and benchmarks.

:class:`ScriptedOrigin` in :mod:`tests.harness` is the protocol's ideal
control plane. This one does what istiod does instead (the facts are in
issue 9 and istio#41494, istio#42109):

* no per-resource ``version`` (only ``system_version_info``);
* ``initial_resource_versions`` ignored: every (re)subscription is answered
  with everything watched, and nothing is said of what vanished meanwhile;
* CDS and LDS are wildcard and always answered with the full set; other
  types by name: each subscription with the names it adds (one it does not
  have is removed), a new stream's first one with everything;
* optional TLS (certificates made with ``trustme``), a required bearer token
  (a wrong one gets ``UNAUTHENTICATED``), a maximum connection age (a real
  GOAWAY from gRPC's server) and keepalive enforcement.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import trustme
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, message

from relay.xds_types import CLUSTER, LISTENER, WILDCARD
from tests.builders import pack, type_url_of
from tests.harness import OriginServer, pump

DELTA = discovery_pb2.DeltaDiscoveryRequest
SERVER_NAME = "istiod.istio-system.svc"
# Types istiod serves as wildcard, answering with the full set for the node.
FULL_SET_TYPES = frozenset({CLUSTER, LISTENER})


@dataclass(frozen=True)
class OriginTLS:
    """PEM files for an origin's TLS and for a client of it, from one test CA."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_file: Path
    client_key_file: Path
    server_name: str = SERVER_NAME

    @classmethod
    def create(cls, directory: Path, server_name: str = SERVER_NAME) -> OriginTLS:
        ca = trustme.CA()
        server = ca.issue_cert(server_name)
        client = ca.issue_cert("xds-relay.xds-relay.svc")
        files = {
            "ca.pem": ca.cert_pem.bytes(),
            "server.pem": b"".join(blob.bytes() for blob in server.cert_chain_pems),
            "server.key": server.private_key_pem.bytes(),
            "client.pem": b"".join(blob.bytes() for blob in client.cert_chain_pems),
            "client.key": client.private_key_pem.bytes(),
        }
        for name, content in files.items():
            (directory / name).write_bytes(content)
        return cls(directory / "ca.pem", directory / "server.pem", directory / "server.key",
                   directory / "client.pem", directory / "client.key", server_name)


@dataclass
class Watch:
    """What one stream watches of one type."""

    wildcard: bool = False
    names: set[str] = field(default_factory=set)


@dataclass
class IstiodStream:
    """One Delta-ADS stream the origin serves."""

    metadata: dict[str, str]
    requests: asyncio.Queue[DELTA] = field(default_factory=asyncio.Queue)
    outbox: asyncio.Queue[discovery_pb2.DeltaDiscoveryResponse | None] = field(
        default_factory=asyncio.Queue)
    log: list[DELTA] = field(default_factory=list)
    watched: dict[str, Watch] = field(default_factory=dict)
    acks: list[str] = field(default_factory=list)
    nacks: list[str] = field(default_factory=list)
    # the client's certificate identities (mTLS), if it presented one
    peer_identities: list[str] = field(default_factory=list)
    # nonces of the responses sent on this stream, and their resources in all
    sent: list[str] = field(default_factory=list)
    resources_sent: int = 0

    def all_answered(self) -> bool:
        """Whether every response sent on this stream has been ACKed or NACKed."""
        return len(self.acks) + len(self.nacks) >= len(self.sent)


class IstiodOrigin(OriginServer):
    """A Delta-ADS origin shaped like istiod (see the module docstring)."""

    def __init__(self, *, tls: OriginTLS | None = None, token: str | None = None,
                 require_client_cert: bool = False, versions: bool = False,
                 max_age: float | None = None,
                 min_ping_interval: float | None = None) -> None:
        super().__init__()
        self.tls = tls
        self.token = token
        self.require_client_cert = require_client_cert
        # per-resource versions: istiod sends none; a go-control-plane-like origin does
        self.versions = versions
        self.max_age = max_age
        self.min_ping_interval = min_ping_interval
        self.resources: dict[str, dict[str, any_pb2.Any]] = {}
        self.streams: list[IstiodStream] = []
        # the authorization header of every refused stream
        self.refused: list[str] = []
        self._push = 0

    # -- running -------------------------------------------------------------

    def server_options(self) -> list[tuple[str, Any]]:
        options: list[tuple[str, Any]] = []
        if self.max_age is not None:
            options += [("grpc.max_connection_age_ms", int(self.max_age * 1000)),
                        ("grpc.max_connection_age_grace_ms", 1000)]
        if self.min_ping_interval is not None:
            # As istiod's keepalive enforcement: pings more often are strikes,
            # and too many strikes close the connection (GOAWAY too_many_pings).
            options += [("grpc.http2.min_ping_interval_without_data_ms",
                         int(self.min_ping_interval * 1000)),
                        ("grpc.http2.max_ping_strikes", 1)]
        return options

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if self.tls is None:
            return None
        return grpc.ssl_server_credentials(
            [(self.tls.key_file.read_bytes(), self.tls.cert_file.read_bytes())],
            root_certificates=self.tls.ca_file.read_bytes(),
            require_client_auth=self.require_client_cert)

    def end_streams(self) -> None:
        """End every stream with OK, as an origin closing connections gracefully."""
        for stream in self.streams:
            stream.outbox.put_nowait(None)

    # -- configuration changes ------------------------------------------------

    def set(self, *msgs: message.Message) -> None:
        """Create or change resources; push the changed ones to who watches them."""
        by_type: dict[str, list[str]] = {}
        for msg in msgs:
            type_url = type_url_of(msg)
            name = getattr(msg, "name", "") or getattr(msg, "cluster_name", "")
            self.resources.setdefault(type_url, {})[name] = pack(msg)
            by_type.setdefault(type_url, []).append(name)
        for stream in self.streams:
            for type_url, names in by_type.items():
                watch = stream.watched.get(type_url)
                if watch is not None:
                    wanted = [n for n in names if watch.wildcard or n in watch.names]
                    if wanted:
                        self._send(stream, type_url, wanted)

    def remove(self, type_url: str, *names: str) -> None:
        """Delete resources; tell the streams that watch them (while connected)."""
        for name in names:
            self.resources.get(type_url, {}).pop(name, None)
        for stream in self.streams:
            watch = stream.watched.get(type_url)
            if watch is not None:
                gone = [n for n in names if watch.wildcard or n in watch.names]
                if gone:
                    self._send(stream, type_url, [], gone)

    # -- the protocol ---------------------------------------------------------

    async def _serve(self, requests: AsyncIterator[DELTA],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        metadata = {key: value for key, value in context.invocation_metadata()
                    if isinstance(value, str)}
        if self.token is not None and metadata.get("authorization") != f"Bearer {self.token}":
            self.refused.append(metadata.get("authorization", ""))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "authentication failure: no valid bearer token")
        stream = IstiodStream(metadata)
        auth = context.auth_context()
        stream.peer_identities = [value.decode() for value in
                                  auth.get("x509_subject_alternative_name", [])]
        self.streams.append(stream)

        async def read() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                async for request in requests:
                    stream.log.append(request)
                    await stream.requests.put(request)
                    self._handle(stream, request)
            stream.outbox.put_nowait(None)

        async for response in pump(stream.outbox, read()):
            yield response

    def _handle(self, stream: IstiodStream, request: DELTA) -> None:
        type_url = request.type_url
        if request.response_nonce:
            if request.HasField("error_detail"):
                stream.nacks.append(request.error_detail.message)
            else:
                stream.acks.append(request.response_nonce)
        first = type_url not in stream.watched
        watch = stream.watched.setdefault(type_url, Watch())
        added = [n for n in request.resource_names_subscribe if n != WILDCARD]
        if WILDCARD in request.resource_names_subscribe or \
                (first and not added and type_url in FULL_SET_TYPES):
            watch.wildcard = True
        if WILDCARD in request.resource_names_unsubscribe:
            watch.wildcard = False
        watch.names.update(added)
        watch.names.difference_update(request.resource_names_unsubscribe)
        if not (first or request.resource_names_subscribe):
            return  # an ACK or an unsubscribe: nothing to push
        # initial_resource_versions is ignored: answer with everything watched.
        have = self.resources.get(type_url, {})
        if watch.wildcard or type_url in FULL_SET_TYPES:
            self._send(stream, type_url, sorted(have))
        else:
            self._send(stream, type_url, sorted(n for n in added if n in have),
                       [n for n in added if n not in have])

    def _send(self, stream: IstiodStream, type_url: str, names: Iterable[str],
              removed: Iterable[str] = ()) -> None:
        self._push += 1
        response = discovery_pb2.DeltaDiscoveryResponse(
            type_url=type_url, nonce=f"istiod-{self._push}",
            system_version_info=f"2026-11-23T00:00:00Z/{self._push}",
            removed_resources=list(removed))
        have = self.resources.get(type_url, {})
        for name in names:
            body = have[name]
            version = _content_version(body) if self.versions else ""
            response.resources.add(name=name, version=version, resource=body)
        stream.sent.append(response.nonce)
        stream.resources_sent += len(response.resources)
        stream.outbox.put_nowait(response)


def _content_version(body: any_pb2.Any) -> str:
    import hashlib

    return hashlib.sha256(body.value).hexdigest()[:12]
