"""gRPC's own xDS clients with a federation bootstrap (gRFC A47) through one relay
that follows a scripted origin per authority (issue 25, "How it is checked").

The client's bootstrap names two authorities and the default server, all of
them the relay::

    {"xds_servers": [RELAY],
     "client_default_listener_resource_name_template":
         "xdstp://a.federation.test/envoy.config.listener.v3.Listener/%s",
     "authorities": {
       "a.federation.test": {"xds_servers": [RELAY], "client_listener_resource_name_template":
                             "xdstp://a.federation.test/envoy.config.listener.v3.Listener/%s"},
       "b.federation.test": {... the same with b ...}}}

``xds:///svc-a`` takes the default template (authority a), ``xds://b.federation.test/svc-b``
takes b's; each Listener, RouteConfiguration, Cluster and ClusterLoadAssignment is an
``xdstp://`` name of that authority. The relay (``authorities:``) sends a's names to origin
a and b's to origin b; its default origin (``upstream:``) must hear of none of them.

What was observed (grpcio 1.85.3, C-core; @grpc/grpc-js-xds 1.14.1)
-------------------------------------------------------------------
* C-core needs no ``GRPC_EXPERIMENTAL_XDS_FEDERATION``: federation has been on by default
  since grpcio 1.55 (grpc/grpc#32711), and 1.85.3 does not read the variable at all (the
  tests below unset it anyway). A target
  ``xds://AUTHORITY/SERVICE`` picks ``authorities[AUTHORITY]``'s template; the data
  plane authority (what the virtual host's ``domains`` match) is ``SERVICE``.
* C-core checks that an xdstp name's TYPE is the type it watches: a Cluster's EDS name
  must be a ``envoy.config.endpoint.v3.ClusterLoadAssignment`` name, so the Cluster sets
  ``eds_cluster_config.service_name`` (a cluster's own name would be of the wrong type).
* An authority the bootstrap does not list fails the channel in the client itself
  (UNAVAILABLE naming the authority); the relay hears nothing of it.
* Load reports (a Cluster with ``lrs_server: {self: {}}``): each client process opened one
  report stream to the relay, its Node first and no stats, then, once answered, one
  request per ``load_reporting_interval`` (asked 1 s, reported ~1.01 s) with the stats of
  the clusters asked for that it uses. The relay sends each stream on to both authorities'
  origins, so each origin sees a stream per client process, with its own clusters' stats
  only (the default origin, without LRS, answers UNIMPLEMENTED and is left out).

@grpc/grpc-js-xds implemented federation in grpc/grpc-node#2463 (2023, behind
``GRPC_EXPERIMENTAL_XDS_FEDERATION=true``) and turned it on by default in 1.14.0
(grpc/grpc-node#3009; ``src/environment.ts`` defaults the variable to ``true``). 1.14.1, the
version ``tests/interop/node/package-lock.json`` pins, passes the same scenario with no
flag (:func:`test_node_federation_through_relay`). It also checks that an authority's
``client_listener_resource_name_template`` starts with ``xdstp://AUTHORITY/``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

from google.protobuf import message
from prometheus_client import CollectorRegistry, generate_latest

from relay.app import Relay, build_relay
from relay.config import parse_config
from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from tests.harness import ScriptedOrigin, eventually
from tests.interop import grpc_xds
from tests.interop.grpc_xds import ClientProcess, XdsClientProcess, bootstrap_json, start_backend
from tests.interop.test_node_xds_through_relay import NodeXdsClient, node_or_skip
from tests.load_reports import LrsOrigin, ReportStream, asking

A = "a.federation.test"
B = "b.federation.test"

_TYPE_PATH = {LISTENER: "envoy.config.listener.v3.Listener",
              ROUTE: "envoy.config.route.v3.RouteConfiguration",
              CLUSTER: "envoy.config.cluster.v3.Cluster",
              ENDPOINT: "envoy.config.endpoint.v3.ClusterLoadAssignment"}


def xdstp(authority: str, type_url: str, name: str) -> str:
    """``xdstp://AUTHORITY/TYPE/NAME``."""
    return f"xdstp://{authority}/{_TYPE_PATH[type_url]}/{name}"


def listener_template(authority: str) -> str:
    return xdstp(authority, LISTENER, "%s")


def federated_names(authority: str, service: str) -> dict[str, str]:
    """The xdstp name of each resource ``xds://AUTHORITY/SERVICE`` needs, by type URL."""
    return {LISTENER: xdstp(authority, LISTENER, service),
            ROUTE: xdstp(authority, ROUTE, f"{service}-route"),
            CLUSTER: xdstp(authority, CLUSTER, f"{service}-cluster"),
            ENDPOINT: xdstp(authority, ENDPOINT, f"{service}-endpoints")}


def federated_messages(authority: str, service: str, port: int, *, reports: bool = False
                       ) -> list[message.Message]:
    """Listener -> RouteConfiguration -> Cluster -> ClusterLoadAssignment, every one an
    xdstp name of ``authority``, sending ``service`` to ``127.0.0.1:port``; with
    ``reports``, the Cluster's load is reported to the server that sent it (LRS, ``self``)."""
    names = federated_names(authority, service)
    cluster = grpc_xds.cluster(names[CLUSTER])
    cluster.eds_cluster_config.service_name = names[ENDPOINT]
    if reports:
        cluster.lrs_server.self.SetInParent()
    return [grpc_xds.listener(names[LISTENER], names[ROUTE]),
            grpc_xds.route_configuration(names[ROUTE], service, names[CLUSTER]),
            cluster,
            grpc_xds.cluster_load_assignment(names[ENDPOINT], port)]


def federation_bootstrap(relay_port: int, node_id: str) -> str:
    """A bootstrap whose default server and both authorities are the relay; names of
    ``xds:///SERVICE`` are a's (the default template), of ``xds://B/SERVICE`` b's."""
    bootstrap: dict[str, Any] = json.loads(bootstrap_json(f"127.0.0.1:{relay_port}", node_id))
    server = bootstrap["xds_servers"]
    bootstrap["client_default_listener_resource_name_template"] = listener_template(A)
    bootstrap["authorities"] = {
        authority: {"xds_servers": server,
                    "client_listener_resource_name_template": listener_template(authority)}
        for authority in (A, B)}
    return json.dumps(bootstrap)


def relay_config(default_port: int, ports: dict[str, int]) -> str:
    authorities = "".join(f'\n  {authority}: {{address: "127.0.0.1:{port}", '
                          f'answer_grace: 0.3s, backoff: {{initial: 0.05s, max: 0.2s}}}}'
                          for authority, port in ports.items())
    return f"""
node: {{id: relay-test, cluster: xds-relay}}
server: {{address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{address: "127.0.0.1:{default_port}", answer_grace: 0.3s,
            backoff: {{initial: 0.05s, max: 0.2s}}}}
authorities:{authorities}
"""


class Federation:
    """Three scripted origins (the default one, a's, b's), a backend each for a and
    b, and a relay following the three. With ``reports``, a's and b's origins serve
    LRS too, each asking for its own cluster's load every second."""

    def __init__(self, reports: bool = False) -> None:
        self.reports = reports
        self.default = ScriptedOrigin()
        self.a: ScriptedOrigin = LrsOrigin(asking(federated_names(A, "svc-a")[CLUSTER]))
        self.b: ScriptedOrigin = LrsOrigin(asking(federated_names(B, "svc-b")[CLUSTER]))
        if not reports:
            self.a, self.b = ScriptedOrigin(), ScriptedOrigin()
        self.backend_ports: dict[str, int] = {}
        self.relay: Relay | None = None

    @property
    def xds_port(self) -> int:
        assert self.relay is not None
        return self.relay.xds_port

    @property
    def registry(self) -> CollectorRegistry:
        assert self.relay is not None
        return self.relay.registry

    def asked(self, origin: ScriptedOrigin) -> set[tuple[str, str]]:
        """Every (type URL, name) ``origin`` was asked to subscribe."""
        return {(request.type_url, name) for request in origin.subscription_requests()
                for name in request.resource_names_subscribe}

    def assert_each_origin_asked_for_its_own_names(self) -> None:
        def expected(authority: str, service: str) -> set[tuple[str, str]]:
            return set(federated_names(authority, service).items())

        assert self.asked(self.a) == expected(A, "svc-a")
        assert self.asked(self.b) == expected(B, "svc-b")
        assert self.asked(self.default) == set()
        # one stream per origin, whatever the clients
        assert (len(self.a.streams), len(self.b.streams)) == (1, 1)


@contextlib.asynccontextmanager
async def federation(reports: bool = False) -> AsyncIterator[Federation]:
    fed = Federation(reports)
    backends = []
    async with contextlib.AsyncExitStack() as stack:
        for label in ("A", "B"):
            server, port = await start_backend(label)
            backends.append(server)
            fed.backend_ports[label] = port
            stack.push_async_callback(server.stop, 0)
        fed.a.set(*federated_messages(A, "svc-a", fed.backend_ports["A"], reports=reports))
        fed.b.set(*federated_messages(B, "svc-b", fed.backend_ports["B"], reports=reports))
        for origin in (fed.default, fed.a, fed.b):
            await origin.start()
            stack.push_async_callback(origin.stop)
        fed.relay = build_relay(parse_config(relay_config(
            fed.default.port, {A: fed.a.port, B: fed.b.port})))
        await fed.relay.start()
        stack.push_async_callback(fed.relay.stop, 0)
        yield fed


@contextlib.contextmanager
def without_federation_flag() -> Iterator[None]:
    """The clients run without ``GRPC_EXPERIMENTAL_XDS_FEDERATION`` (they inherit this
    process's environment): federation must be on by default."""
    saved = os.environ.pop("GRPC_EXPERIMENTAL_XDS_FEDERATION", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["GRPC_EXPERIMENTAL_XDS_FEDERATION"] = saved


async def served_by_each_authority(fed: Federation, client_a: ClientProcess,
                                   client_b: ClientProcess) -> None:
    """``client_a`` (``xds:///svc-a``) reaches backend A, ``client_b``
    (``xds://b/svc-b``) backend B, each origin was asked for its own names only, and a
    change at b reaches b's client."""
    result_a, result_b = await client_a.call(), await client_b.call()
    assert (result_a.ok, result_a.backend) == (True, "A"), \
        f"{result_a}\n{client_a.stderr[-3000:]}"
    assert (result_b.ok, result_b.backend) == (True, "B"), \
        f"{result_b}\n{client_b.stderr[-3000:]}"
    fed.assert_each_origin_asked_for_its_own_names()
    # b moves svc-b to backend A; a's client is not disturbed
    names = federated_names(B, "svc-b")
    fed.b.set(grpc_xds.cluster_load_assignment(names[ENDPOINT], fed.backend_ports["A"]))
    assert (await client_b.wait_for_backend("A", timeout=10)).ok
    assert (await client_a.call()).backend == "A"
    fed.assert_each_origin_asked_for_its_own_names()
    scraped = generate_latest(fed.registry).decode()
    assert "xds_relay_downstream_nacks_total" not in scraped, \
        client_a.stderr[-2000:] + client_b.stderr[-2000:]


async def test_grpc_federation_each_authority_from_its_own_origin() -> None:
    async with federation() as fed:
        bootstrap = federation_bootstrap(fed.xds_port, "grpc-federation")
        with without_federation_flag():
            async with XdsClientProcess("xds:///svc-a", bootstrap) as client_a, \
                    XdsClientProcess(f"xds://{B}/svc-b", bootstrap) as client_b:
                await served_by_each_authority(fed, client_a, client_b)


async def test_node_federation_through_relay() -> None:
    node = node_or_skip()
    async with federation() as fed:
        bootstrap = federation_bootstrap(fed.xds_port, "node-federation")
        with without_federation_flag():
            async with NodeXdsClient(node, "xds:///svc-a", bootstrap) as client_a, \
                    NodeXdsClient(node, f"xds://{B}/svc-b", bootstrap) as client_b:
                await served_by_each_authority(fed, client_a, client_b)


async def test_grpc_federation_an_authority_the_bootstrap_lacks_never_reaches_the_relay(
        ) -> None:
    # The checks above are real ones: xds://c/svc names an authority the bootstrap does
    # not list, and the client fails the channel itself (gRFC A47); nothing is asked.
    async with federation() as fed:
        bootstrap = federation_bootstrap(fed.xds_port, "grpc-federation")
        async with XdsClientProcess("xds://c.federation.test/svc", bootstrap,
                                    rpc_timeout=3.0, wait_for_ready=False) as client:
            result = await client.call()
        assert not result.ok and result.code == "UNAVAILABLE", result
        assert "c.federation.test" in (result.details or ""), result
        assert fed.asked(fed.a) | fed.asked(fed.b) | fed.asked(fed.default) == set()


def reported(origin: ScriptedOrigin) -> dict[str, int]:
    """Per cluster name: the successful requests ``origin`` was told of, all its report
    streams together."""
    assert isinstance(origin, LrsOrigin)
    totals: dict[str, int] = {}
    for stream in origin.report_streams:
        for request in stream.log:
            for cluster_stats in request.cluster_stats:
                done = sum(locality.total_successful_requests
                           for locality in cluster_stats.upstream_locality_stats)
                totals[cluster_stats.cluster_name] = \
                    totals.get(cluster_stats.cluster_name, 0) + done
    return totals


async def test_grpc_federation_load_reports_reach_each_clusters_origin() -> None:
    # Clusters with lrs_server "self": C-core reports their load to the relay, which
    # forwards each cluster's to the origin of its authority. The default origin serves
    # no LRS (UNIMPLEMENTED): with several origins it is left out.
    cluster_a = federated_names(A, "svc-a")[CLUSTER]
    cluster_b = federated_names(B, "svc-b")[CLUSTER]
    async with federation(reports=True) as fed:
        bootstrap = federation_bootstrap(fed.xds_port, "grpc-federation")
        async with XdsClientProcess("xds:///svc-a", bootstrap) as client_a, \
                XdsClientProcess(f"xds://{B}/svc-b", bootstrap) as client_b:
            for _ in range(3):
                assert (await client_a.call()).backend == "A", client_a.stderr[-3000:]
            assert (await client_b.call()).backend == "B", client_b.stderr[-3000:]
            # C-core reports every load_reporting_interval (1 s asked, its least)
            def streams() -> list[ReportStream]:
                return [s for origin in (fed.a, fed.b) if isinstance(origin, LrsOrigin)
                        for s in origin.report_streams]

            await eventually(lambda: reported(fed.a).get(cluster_a, 0) >= 3
                             and reported(fed.b).get(cluster_b, 0) >= 1
                             and all(s.log for s in streams()), timeout=15)
            assert set(reported(fed.a)) == {cluster_a}
            assert set(reported(fed.b)) == {cluster_b}
            # every report stream told its origin who reports (the Node, first)
            assert {s.log[0].node.id for s in streams()} == {"grpc-federation"}
        fed.assert_each_origin_asked_for_its_own_names()
