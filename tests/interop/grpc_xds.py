"""Drive gRPC's own xDS client (C-core, ``xds:///`` targets) against an xDS server.

What this module gives a test:

* :func:`xds_resources` / :func:`endpoints` -- the Listener, RouteConfiguration, Cluster and
  ClusterLoadAssignment (packed in ``Any``, keyed by type URL) that make ``xds:///{service}``
  reach ``127.0.0.1:{port}``.
* :func:`bootstrap_json` -- the bootstrap that points the client at the xDS server, in
  plaintext or (:func:`tls_channel_creds`) over TLS or mutual TLS.
* :func:`start_backend` -- a gRPC server answering :data:`BACKEND_METHOD` with its label.
* :class:`XdsClientProcess` -- ``python -m tests.interop.xds_client_main`` in a subprocess
  (the C-core xDS client is process-global and the sync API blocks), one RPC per
  :meth:`XdsClientProcess.call`.

Everything below was observed with grpcio 1.85.1 (C-core 58.0.0) against a minimal
hand-written SotW ADS server.

Environment
-----------
No ``GRPC_EXPERIMENTAL_XDS_*`` flag is needed: the xDS resolver is on by default. The
bootstrap comes from ``GRPC_XDS_BOOTSTRAP`` (a file path) or ``GRPC_XDS_BOOTSTRAP_CONFIG``
(the JSON itself); when both are set the file wins, so :func:`client_env` removes
``GRPC_XDS_BOOTSTRAP``. ``server_features`` may be empty; ``"xds_v3"`` is accepted and
harmless. ``GRPC_TRACE=xds_client,xds_resolver`` with ``GRPC_VERBOSITY=debug`` traces the
client on stderr (``XdsClientProcess(trace=True)``); NACK reasons are logged to stderr even
without it.

TLS to the xDS server (gRFC A65)
--------------------------------
``"channel_creds": [{"type": "tls", "config": {"ca_certificate_file": ...,
"certificate_file": ..., "private_key_file": ...}}]`` (the last two together, for mutual
TLS; :func:`tls_channel_creds`). The client checks the server's certificate against the
CA and against the host of ``server_uri``: ``127.0.0.1:PORT`` matches an IP SAN
127.0.0.1 (a certificate with only a DNS name fails "Hostname Verification Check
failed"). A failed handshake, or an xDS call the server refuses (PERMISSION_DENIED)
before any response, makes RPCs that do not wait for ready fail at once with
UNAVAILABLE whose details carry the cause, e.g. ``xDS call failed with no responses
received; status: PERMISSION_DENIED: <the server's message>``.

What the resources must contain (otherwise the client NACKs)
------------------------------------------------------------
* Listener named exactly like the target's path (``xds:///svc`` -> ``svc``) with
  ``api_listener`` = ``HttpConnectionManager``. ``http_filters`` must not be empty
  ("expected at least one HTTP filter") and its last filter must be the terminal router:
  ``typed_config`` = ``envoy.extensions.filters.http.router.v3.Router`` (the filter *name*
  is free). RDS via ``config_source { ads {} }``.
* RouteConfiguration: a virtual host whose ``domains`` match the service name (``"*"``
  works too); route match prefix ``""`` and ``"/"`` both work.
* Cluster: ``type: EDS`` with ``eds_config { ads {} }``; with no ``service_name`` the EDS
  resource name is the cluster name. Default lb policy (round robin) is fine.
* ClusterLoadAssignment: every ``LocalityLbEndpoints`` needs a ``locality`` (any, even
  ``region`` only) *and* a non-zero ``load_balancing_weight``; without the locality the
  client NACKs with ``endpoints[0].locality error:field not present``.

Observed protocol (SotW ADS only, ``StreamAggregatedResources``)
----------------------------------------------------------------
Fresh start, server answering each subscription at once (``ver``/``nonce`` as sent by the
client)::

    -> LDS  [svc]        ver=""  nonce=""   (node set: id, cluster, locality, user agent,
                                             client_features envoy.lb.does_not_support_
                                             overprovisioning, xds.config.resource-in-sotw)
    <- LDS  ver=1 nonce=1
    -> LDS  [svc]        ver="1" nonce="1"  (ACK)
    -> RDS  [route]      ver=""  nonce=""
    <- RDS  ver=1 nonce=2
    -> RDS  [route]      ver="1" nonce="2"  (ACK)
    -> CDS  [cluster]    ver=""  nonce=""
    <- CDS  ver=1 nonce=3
    -> CDS  [cluster]    ver="1" nonce="3"  (ACK)
    -> EDS  [cluster]    ver=""  nonce=""
    <- EDS  ver=1 nonce=4
    -> EDS  [cluster]    ver="1" nonce="4"  (ACK)
    ... later push:  <- EDS ver=2 nonce=5   -> EDS [cluster] ver="2" nonce="5" (ACK)

* Strictly sequential: each type is subscribed only after the response it depends on
  (LDS -> RDS -> CDS -> EDS). Every request names resources explicitly -- LDS and CDS
  are never wildcard. ``node`` is only in the first request of a stream.
* Every response is ACKed, also one that repeats identical content, with the response's
  ``version_info`` and ``nonce`` and the same names. A NACK carries the *last accepted*
  ``version_info`` (``""`` if none), the rejected ``nonce`` and ``error_detail``.
  Responses must not be sent in reply to ACKs (that would loop).
* A subscription change is a new request that repeats the type's last version and nonce
  with the new full name list, so it can only be told from an ACK by its names. When the
  Listener switched to route-b/cluster-b the client sent ``RDS [route-b] ver=1 nonce=2``,
  then ``CDS [cluster-a, cluster-b]`` / ``EDS [cluster-a, cluster-b]`` and, once the new
  cluster was in use, ``CDS [cluster-b]`` / ``EDS [cluster-b]`` (again with the previous
  ver/nonce). The server must answer added names even though the nonce is current.
* Reconnect (server ended the stream; client retried after ~1 s): the new stream resends
  every subscription at once, order LDS, RDS, EDS, CDS, each with ``version_info`` = last
  accepted version and ``nonce=""``; the server must answer them all even though the
  versions may be unchanged.
* SotW deletion is honoured: an LDS response without the subscribed Listener is ACKed and
  the listener "does not exist" -- RPCs then fail. So every LDS/CDS response must carry
  all subscribed resources. A response for a type the client never subscribed to is
  ignored (logged, neither ACKed nor NACKed).
* One ADS stream per channel *target*: a second channel to ``xds:///svc2`` in the same
  process opened a second stream (same node id) instead of adding ``svc2`` to the first
  stream's LDS names. Closing a channel just ends its stream; no unsubscribe is sent.
* A subscribed resource that never arrives is only declared missing after the 15 s
  does-not-exist timer; with ``wait_for_ready`` RPCs hang until their deadline meanwhile.

Timings (loopback, 2-CPU box)
-----------------------------
* Client process start to first successful RPC: ~120 ms (~100 ms of that is Python and
  grpc import; the whole xDS exchange plus the first RPC took ~17 ms).
* EDS push to new backend: the client ACKs within ~1 ms and RPCs reach the new backend
  3-5 ms after the push (round robin builds the new endpoint's subchannel, then swaps the
  picker; no RPC failed in between while the old backend stayed up). An RPC issued in
  that window still reaches the old backend, so tests must poll briefly rather than
  assume the very next RPC switches: :meth:`XdsClientProcess.wait_for_backend`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import any_pb2, message

from tests.interop.xds_client_main import BACKEND_METHOD

__all__ = [
    "BACKEND_METHOD",
    "CLUSTER_TYPE",
    "DEFAULT_CLUSTER",
    "DEFAULT_ROUTE",
    "ENDPOINT_TYPE",
    "LISTENER_TYPE",
    "ROUTE_TYPE",
    "ClientProcess",
    "RpcResult",
    "XdsClientProcess",
    "bootstrap_json",
    "client_env",
    "cluster",
    "cluster_load_assignment",
    "endpoints",
    "listener",
    "pack",
    "route_configuration",
    "start_backend",
    "tls_channel_creds",
    "xds_messages",
    "xds_resources",
]

LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"

DEFAULT_CLUSTER = "interop-cluster"
DEFAULT_ROUTE = "interop-route"

REPO_ROOT = Path(__file__).resolve().parents[2]


# -- resources -----------------------------------------------------------------


def pack(msg: message.Message) -> any_pb2.Any:
    """Wrap a message in ``google.protobuf.Any``."""
    body = any_pb2.Any()
    body.Pack(msg)
    return body


def _ads_source() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
    )


def listener(service_name: str, route_name: str = DEFAULT_ROUTE) -> listener_pb2.Listener:
    """An API listener for ``xds:///{service_name}`` that fetches ``route_name`` over RDS."""
    hcm = hcm_pb2.HttpConnectionManager(
        stat_prefix=service_name,
        rds=hcm_pb2.Rds(config_source=_ads_source(), route_config_name=route_name),
        http_filters=[
            hcm_pb2.HttpFilter(
                name="envoy.filters.http.router", typed_config=pack(router_pb2.Router())
            )
        ],
    )
    return listener_pb2.Listener(
        name=service_name,
        api_listener=api_listener_pb2.ApiListener(api_listener=pack(hcm)),
    )


def route_configuration(
    route_name: str, service_name: str, cluster_name: str = DEFAULT_CLUSTER
) -> route_pb2.RouteConfiguration:
    """One virtual host for ``service_name`` sending every path to ``cluster_name``."""
    route = route_components_pb2.Route(
        match=route_components_pb2.RouteMatch(prefix=""),
        route=route_components_pb2.RouteAction(cluster=cluster_name),
    )
    host = route_components_pb2.VirtualHost(
        name=service_name, domains=[service_name], routes=[route]
    )
    return route_pb2.RouteConfiguration(name=route_name, virtual_hosts=[host])


def cluster(cluster_name: str = DEFAULT_CLUSTER) -> cluster_pb2.Cluster:
    """An EDS cluster whose endpoints come over ADS under the cluster's own name."""
    return cluster_pb2.Cluster(
        name=cluster_name,
        type=cluster_pb2.Cluster.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(eds_config=_ads_source()),
        lb_policy=cluster_pb2.Cluster.ROUND_ROBIN,
    )


def cluster_load_assignment(
    cluster_name: str, port: int, host: str = "127.0.0.1"
) -> endpoint_pb2.ClusterLoadAssignment:
    """One endpoint ``host:port`` in one weighted locality (gRPC rejects a missing locality)."""
    address = address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=host, port_value=port)
    )
    group = endpoint_components_pb2.LocalityLbEndpoints(
        locality=base_pb2.Locality(region="interop", zone="interop-zone"),
        load_balancing_weight={"value": 1},
        lb_endpoints=[
            endpoint_components_pb2.LbEndpoint(
                endpoint=endpoint_components_pb2.Endpoint(address=address)
            )
        ],
    )
    return endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster_name, endpoints=[group])


def endpoints(cluster_name: str, port: int) -> any_pb2.Any:
    """The packed ClusterLoadAssignment sending ``cluster_name`` to ``127.0.0.1:port``."""
    return pack(cluster_load_assignment(cluster_name, port))


def xds_resources(
    service_name: str,
    backend_port: int,
    cluster_name: str = DEFAULT_CLUSTER,
    route_name: str = DEFAULT_ROUTE,
) -> dict[str, list[any_pb2.Any]]:
    """Everything ``xds:///{service_name}`` needs to reach ``127.0.0.1:{backend_port}``.

    Keyed by type URL; one packed resource per type.
    """
    found = xds_messages(service_name, backend_port, cluster_name, route_name)
    return {packed.type_url: [packed] for packed in map(pack, found)}


def xds_messages(
    service_name: str,
    backend_port: int,
    cluster_name: str = DEFAULT_CLUSTER,
    route_name: str = DEFAULT_ROUTE,
) -> list[message.Message]:
    """The resources of :func:`xds_resources`, unpacked: listener, route, cluster,
    endpoints."""
    return [
        listener(service_name, route_name),
        route_configuration(route_name, service_name, cluster_name),
        cluster(cluster_name),
        cluster_load_assignment(cluster_name, backend_port),
    ]


# -- bootstrap -----------------------------------------------------------------


def tls_channel_creds(ca_file: Path, cert_file: Path | None = None,
                      key_file: Path | None = None) -> dict[str, Any]:
    """A bootstrap ``channel_creds`` entry for TLS to the xDS server (gRFC A65):
    trust ``ca_file``; with ``cert_file`` and ``key_file``, present that client
    certificate (mutual TLS)."""
    config = {"ca_certificate_file": str(ca_file)}
    if cert_file is not None or key_file is not None:
        assert cert_file is not None and key_file is not None, "both or neither"
        config |= {"certificate_file": str(cert_file), "private_key_file": str(key_file)}
    return {"type": "tls", "config": config}


def bootstrap_json(
    server_uri: str,
    node_id: str,
    *,
    node_cluster: str = "interop",
    server_features: Sequence[str] = ("xds_v3",),
    channel_creds: dict[str, Any] | None = None,
) -> str:
    """The xDS bootstrap naming one ADS server (``host:port``, no scheme), reached
    with ``channel_creds`` (:func:`tls_channel_creds`; plaintext by default)."""
    return json.dumps({
        "xds_servers": [{
            "server_uri": server_uri,
            "channel_creds": [channel_creds or {"type": "insecure"}],
            "server_features": list(server_features),
        }],
        "node": {
            "id": node_id,
            "cluster": node_cluster,
            "locality": {"region": "interop", "zone": "interop-zone"},
        },
    })


def client_env(bootstrap: str, *, trace: bool = False) -> dict[str, str]:
    """This process's environment with ``bootstrap`` installed for gRPC's xDS client."""
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)  # it would take precedence over the JSON
    env["GRPC_XDS_BOOTSTRAP_CONFIG"] = bootstrap
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    if trace:
        env["GRPC_TRACE"] = "xds_client,xds_resolver"
        env["GRPC_VERBOSITY"] = "debug"
    return env


# -- backend -------------------------------------------------------------------


async def start_backend(label: str) -> tuple[grpc.aio.Server, int]:
    """Start a server on ``127.0.0.1:0`` answering :data:`BACKEND_METHOD` with ``label``.

    Returns the started server (stop it with ``await server.stop(None)``) and its port.
    """
    answer = label.encode()

    async def identify(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return answer

    service, method = BACKEND_METHOD.lstrip("/").split("/")
    handler = grpc.method_handlers_generic_handler(
        service, {method: grpc.unary_unary_rpc_method_handler(identify)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([handler])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


# -- client subprocess -----------------------------------------------------------


@dataclass(frozen=True)
class RpcResult:
    """One RPC made by the client subprocess."""

    ok: bool
    backend: str | None = None
    code: str | None = None
    details: str | None = None
    elapsed_ms: float = 0.0

    @classmethod
    def from_line(cls, line: str) -> RpcResult:
        data = json.loads(line)
        return cls(
            ok=bool(data["ok"]),
            backend=data.get("backend"),
            code=data.get("code"),
            details=data.get("details"),
            elapsed_ms=float(data.get("elapsed_ms", 0.0)),
        )


class Publisher(Protocol):
    """An origin the test publishes resources through."""

    def set(self, *msgs: message.Message) -> object: ...


class ClientProcess:
    """An xDS client in a child process, driven line by line over stdin/stdout.

    Subclasses say how to :meth:`start` the child and how to make one
    :meth:`call`; this class keeps its stderr, waits for a backend and closes
    the child (``quit``, then kill).
    """

    backend_timeout = 5.0

    def __init__(self, target: str, bootstrap: str, *, rpc_timeout: float = 5.0,
                 trace: bool = False) -> None:
        self.target = target
        self.bootstrap = bootstrap
        self.rpc_timeout = rpc_timeout
        self.trace = trace
        self.results: list[RpcResult] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: list[str] = []
        self._stderr_task: asyncio.Task[None] | None = None

    async def start(self) -> Self:
        raise NotImplementedError

    async def call(self) -> RpcResult:
        raise NotImplementedError

    async def _spawn(self, *args: str) -> asyncio.subprocess.Process:
        self._proc = await asyncio.create_subprocess_exec(
            *args,
            cwd=REPO_ROOT,
            env=client_env(self.bootstrap, trace=self.trace),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        return self._proc

    async def _drain_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        async for line in self._proc.stderr:
            self._stderr.append(line.decode(errors="replace"))

    @property
    def stderr(self) -> str:
        """What the child logged so far (NACK reasons, errors, traces)."""
        return "".join(self._stderr)

    async def wait_for_backend(self, label: str, timeout: float | None = None,
                               interval: float = 0.02) -> RpcResult:
        """Call until an RPC is answered by backend ``label``; fail after ``timeout`` s."""
        timeout = self.backend_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        seen: list[RpcResult] = []
        while True:
            result = await self.call()
            if result.ok and result.backend == label:
                return result
            seen.append(result)
            if loop.time() >= deadline:
                raise AssertionError(
                    f"no RPC reached backend {label!r} within {timeout}s; "
                    f"last results: {seen[-3:]}; client stderr:\n{self.stderr[-4000:]}")
            await asyncio.sleep(interval)

    async def follows_endpoint_move(self, origin: Publisher, port_b: int) -> None:
        """The first RPC reaches backend "A"; once ``origin`` moves the default
        cluster's endpoints to ``port_b``, RPCs reach "B"."""
        first = await self.call()
        assert first.ok, f"{first}\n{self.stderr[-3000:]}"
        assert first.backend == "A"
        origin.set(cluster_load_assignment(DEFAULT_CLUSTER, port_b))
        assert (await self.wait_for_backend("B", timeout=10)).ok

    async def close(self) -> int | None:
        """Ask the child to quit (killing it if it does not) and return its exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.stdin is not None and not proc.stdin.is_closing():
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(b"quit\n")
                await proc.stdin.drain()
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        if self._stderr_task is not None:
            await self._stderr_task
        return proc.returncode

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()


class XdsClientProcess(ClientProcess):
    """``tests.interop.xds_client_main --stdin`` running with a given bootstrap.

    Use as ``async with XdsClientProcess("xds:///svc", bootstrap) as client:``; each
    :meth:`call` makes one RPC in the child and returns what happened.
    """

    def __init__(self, target: str, bootstrap: str, *, rpc_timeout: float = 5.0,
                 wait_for_ready: bool = True, trace: bool = False) -> None:
        super().__init__(target, bootstrap, rpc_timeout=rpc_timeout, trace=trace)
        self.wait_for_ready = wait_for_ready

    async def start(self) -> Self:
        """Spawn the child; it connects to the xDS server on its first RPC."""
        await self._spawn(
            sys.executable, "-m", "tests.interop.xds_client_main",
            "--target", self.target, "--stdin",
            "--rpc-timeout", str(self.rpc_timeout),
            "--wait-for-ready" if self.wait_for_ready else "--no-wait-for-ready")
        return self

    async def call(self) -> RpcResult:
        """Make one RPC through the child's channel."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise RuntimeError("XdsClientProcess not started")
        proc.stdin.write(b"call\n")
        await proc.stdin.drain()
        line = await asyncio.wait_for(proc.stdout.readline(), self.rpc_timeout + 10.0)
        if not line:
            raise RuntimeError(f"xds client exited ({proc.returncode}); stderr:\n{self.stderr}")
        result = RpcResult.from_line(line.decode())
        self.results.append(result)
        return result
