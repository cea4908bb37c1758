"""Sanity checks of the interop helpers that need no xDS server."""

from __future__ import annotations

import json
from pathlib import Path

from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from tests.interop import grpc_xds


def test_resources_have_what_grpc_requires() -> None:
    res = grpc_xds.xds_resources("svc", 1234, cluster_name="c1", route_name="r1")
    assert set(res) == {
        grpc_xds.LISTENER_TYPE, grpc_xds.ROUTE_TYPE,
        grpc_xds.CLUSTER_TYPE, grpc_xds.ENDPOINT_TYPE,
    }
    assert all(len(v) == 1 and v[0].type_url == k for k, v in res.items())

    lis = listener_pb2.Listener()
    res[grpc_xds.LISTENER_TYPE][0].Unpack(lis)
    hcm = hcm_pb2.HttpConnectionManager()
    assert lis.name == "svc" and lis.api_listener.api_listener.Unpack(hcm)
    assert hcm.rds.route_config_name == "r1" and hcm.rds.config_source.HasField("ads")
    assert hcm.http_filters[-1].typed_config.Is(router_pb2.Router.DESCRIPTOR)

    rc = route_pb2.RouteConfiguration()
    res[grpc_xds.ROUTE_TYPE][0].Unpack(rc)
    assert rc.name == "r1" and rc.virtual_hosts[0].routes[0].route.cluster == "c1"

    cla = endpoint_pb2.ClusterLoadAssignment()
    grpc_xds.endpoints("c1", 4321).Unpack(cla)
    group = cla.endpoints[0]
    assert cla.cluster_name == "c1" and group.HasField("locality")
    assert group.load_balancing_weight.value > 0
    assert group.lb_endpoints[0].endpoint.address.socket_address.port_value == 4321


def test_bootstrap_json() -> None:
    boot = json.loads(grpc_xds.bootstrap_json("127.0.0.1:5", "node-1"))
    server = boot["xds_servers"][0]
    assert server["server_uri"] == "127.0.0.1:5"
    assert server["channel_creds"] == [{"type": "insecure"}]
    assert boot["node"]["id"] == "node-1"

    creds = grpc_xds.tls_channel_creds(Path("ca.pem"), Path("c.pem"), Path("c.key"))
    boot = json.loads(grpc_xds.bootstrap_json("127.0.0.1:5", "node-1", channel_creds=creds))
    assert boot["xds_servers"][0]["channel_creds"] == [{"type": "tls", "config": {
        "ca_certificate_file": "ca.pem", "certificate_file": "c.pem",
        "private_key_file": "c.key"}}]
    assert grpc_xds.tls_channel_creds(Path("ca.pem")) == {
        "type": "tls", "config": {"ca_certificate_file": "ca.pem"}}


async def test_client_process_reaches_backend_directly() -> None:
    server, port = await grpc_xds.start_backend("A")
    try:
        boot = grpc_xds.bootstrap_json("127.0.0.1:1", "unused")
        async with grpc_xds.XdsClientProcess(f"127.0.0.1:{port}", boot) as client:
            result = await client.call()
            assert result.ok and result.backend == "A", client.stderr
            assert (await client.wait_for_backend("A", timeout=2)).backend == "A"
    finally:
        await server.stop(None)
