"""End to end: Envoy-style REST-JSON polling (api_type: REST) against a real
relay and a scripted origin, with a real aiohttp client; over HTTPS and
mutual TLS with certificates made here."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import re
import signal
import socket
import ssl
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import json_format
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relay.app import build_relay
from relay.config import parse_config
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints, pack
from tests.certs import Authority, Leaf
from tests.clock import ManualClock
from tests.harness import ScriptedOrigin, Stack, eventually, names_of, node, running_stack
from tests.test_web import connect, one_reply, until_closed
from tests.variants import ENV_VARIANTS, PORTS, label_of

CLUSTERS = "/v3/discovery:clusters"
ENDPOINTS = "/v3/discovery:endpoints"
CLIENT_ID = "spiffe://mesh.test/ns/app/sa/frontend"
REPO = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def rest_stack(origin: ScriptedOrigin | None = None, *, rest: str = "",
                     **config: Any) -> AsyncIterator[Stack]:
    """``running_stack`` with REST polling on a port of its own."""
    keys = 'address: "127.0.0.1:0"' + (f", {rest}" if rest else "")
    async with running_stack(origin, rest=keys, **config) as stack:
        yield stack


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def poll(http: aiohttp.ClientSession, stack: Stack, path: str, body: Any, *,
               method: str = "POST", scheme: str = "http",
               ssl_context: ssl.SSLContext | None = None
               ) -> tuple[int, bytes, dict[str, str]]:
    """Send one request; its status, body and headers. A dict is sent as JSON."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    async with http.request(method, f"{scheme}://127.0.0.1:{stack.relay.rest_port}{path}",
                            data=data, ssl=ssl_context if ssl_context is not None else True,
                            headers={"Content-Type": "application/json"}) as response:
        return response.status, await response.read(), dict(response.headers)


def response_json(version: str, type_url: str, *messages: Any) -> dict[str, Any]:
    """The JSON of a DiscoveryResponse as REST polling writes it (no nonce)."""
    return json_format.MessageToDict(discovery_pb2.DiscoveryResponse(
        version_info=version, type_url=type_url, resources=[pack(m) for m in messages]))


def metric(stack: Stack, name: str, **labels: str) -> float:
    families = text_string_to_metric_families(generate_latest(stack.relay.registry).decode())
    return sum(sample.value for family in families for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


# ------------------------------------------------------------------------------ serving


async def test_a_first_poll_returns_the_resources_with_the_version_a_sotw_stream_gets(
        http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), cluster("b"))
    async with rest_stack(origin) as stack:
        status, body, headers = await poll(http, stack, CLUSTERS, {
            "node": {"id": "n1"}, "resourceNames": ["a", "b"]})
        client = stack.client(delta=False)
        await client.send(node=node("n1"), type_url=CLUSTER, resource_names=["a", "b"])
        sotw = await client.recv()
        assert (status, headers["Content-Type"]) == (200, "application/json")
        assert json.loads(body) == response_json(sotw.version_info, CLUSTER,
                                                 cluster("a"), cluster("b"))


async def test_a_poll_with_the_version_it_holds_gets_304_and_no_body(
        http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with rest_stack(origin) as stack:
        request = {"node": {"id": "n1"}, "resourceNames": ["a"]}
        _, body, _ = await poll(http, stack, CLUSTERS, request)
        version = json.loads(body)["versionInfo"]
        status, body, headers = await poll(http, stack, CLUSTERS,
                                           {**request, "versionInfo": version})
        assert (status, body) == (304, b"")
        assert "Content-Type" not in headers
        # A 200 is a push, a 304 what a SotW client's ACK says: it holds the current version.
        assert metric(stack, "xds_relay_downstream_pushes_total", protocol="rest",
                      type="Cluster") == 1
        assert metric(stack, "xds_relay_downstream_acks_total", protocol="rest",
                      type="Cluster") == 1


async def test_after_the_origin_changes_a_resource_the_next_poll_returns_the_change(
        http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("e1", 1))
    async with rest_stack(origin) as stack:
        request = {"node": {"id": "n1"}, "resourceNames": ["e1"]}
        _, body, _ = await poll(http, stack, ENDPOINTS, request)
        first = json.loads(body)["versionInfo"]
        [nonce] = origin.set(endpoints("e1", 2))
        await eventually(lambda: origin.acked(nonce))
        status, body, _ = await poll(http, stack, ENDPOINTS, {**request, "versionInfo": first})
        assert status == 200
        changed = json.loads(body)
        assert changed["versionInfo"] != first
        assert changed == response_json(changed["versionInfo"], ENDPOINT, endpoints("e1", 2))


async def test_a_poll_for_names_no_stream_wants_subscribes_them_until_the_lease_lapses(
        http: aiohttp.ClientSession) -> None:
    clock = ManualClock()
    origin = ScriptedOrigin()
    origin.set(endpoints("e1", 1))
    async with rest_stack(origin, clock=clock, rest="lease: 60s") as stack:
        request = {"node": {"id": "n1"}, "resourceNames": ["e1"]}
        status, body, _ = await poll(http, stack, ENDPOINTS, request)
        assert (status, json.loads(body)["resources"][0]["clusterName"]) == (200, "e1")
        assert origin.stream.subscribed[ENDPOINT] == {"e1"}
        assert metric(stack, "xds_relay_fetch_leases", type="ClusterLoadAssignment") == 1
        await clock.advance(59)
        status, _, _ = await poll(http, stack, ENDPOINTS, {
            **request, "versionInfo": json.loads(body)["versionInfo"]})
        assert status == 304  # and renewed: 60 s from now
        await asyncio.sleep(0.05)  # what the renewal woke goes back to sleep
        await clock.advance(59)
        await asyncio.sleep(0.05)
        assert origin.stream.subscribed[ENDPOINT] == {"e1"}
        await clock.advance(2)
        await eventually(lambda: not origin.stream.subscribed[ENDPOINT])
        assert [list(r.resource_names_unsubscribe) for r in origin.subscription_requests()
                if r.type_url == ENDPOINT] == [[], ["e1"]]
        assert metric(stack, "xds_relay_fetch_leases") == 0


async def test_names_the_origin_says_do_not_exist_are_left_out(
        http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("e1", 1), cluster("a"))
    async with rest_stack(origin) as stack:
        _, body, _ = await poll(http, stack, ENDPOINTS, {"resourceNames": ["e1", "nope"]})
        assert [r["clusterName"] for r in json.loads(body)["resources"]] == ["e1"]
        status, body, _ = await poll(http, stack, ENDPOINTS, {"resourceNames": ["nope"]})
        assert (status, json.loads(body)) == (
            200, {"versionInfo": "0000000000000000", "typeUrl": ENDPOINT})
        _, body, _ = await poll(http, stack, CLUSTERS, {"resourceNames": ["a", "nope"]})
        assert [r["name"] for r in json.loads(body)["resources"]] == ["a"]


async def test_the_variant_follows_the_nodes_dynamic_parameters_as_for_sotw(
        http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    for label, constraints in ENV_VARIANTS.items():
        origin.set_variant(endpoints("svc", PORTS[label]), constraints, f"{label}-1")
    async with rest_stack(origin) as stack:
        prod = {"id": "n1", "dynamicParameters": {ENDPOINT: {"params": {"env": "prod"}}}}
        status, body, _ = await poll(http, stack, ENDPOINTS,
                                     {"node": prod, "resourceNames": ["svc"]})
        served = json_format.ParseDict(json.loads(body), discovery_pb2.DiscoveryResponse())
        client = stack.client(delta=False)
        await client.send(node=json_format.ParseDict(prod, node()), type_url=ENDPOINT,
                          resource_names=["svc"])
        sotw = await client.recv()
        assert status == 200
        assert [label_of(r) for r in served.resources] == ["prod"]
        assert served.version_info == sotw.version_info


async def test_a_relay_serving_files_answers_polls_from_them(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        '"@type": type.googleapis.com/envoy.config.cluster.v3.Cluster\n'
        "name: a\ntype: EDS\nconnect_timeout: 1s\n")
    relay = build_relay(parse_config(f"""
node: {{id: files}}
server: {{address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{files: "{tmp_path}"}}
rest: {{address: "127.0.0.1:0"}}
"""))
    await relay.start()
    try:
        url = f"http://127.0.0.1:{relay.rest_port}{CLUSTERS}"
        async with http.post(url, json={}) as response:
            assert response.status == 200
            served = json.loads(await response.read())
        assert served == response_json(served["versionInfo"], CLUSTER, cluster("a"))
        async with http.post(url, json={"resourceNames": ["nope"]}) as response:
            assert (response.status, json.loads(await response.read())) == (
                200, {"versionInfo": "0000000000000000", "typeUrl": CLUSTER})
    finally:
        await relay.stop(0)


async def test_a_grpc_fetch_for_names_no_stream_wants_is_served_too() -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("e1", 1))
    async with rest_stack(origin) as stack:
        fetch = stack.channel.unary_unary(
            "/envoy.service.endpoint.v3.EndpointDiscoveryService/FetchEndpoints",
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
        response = await fetch(discovery_pb2.DiscoveryRequest(node=node(),
                                                              resource_names=["e1"]))
        assert names_of(response) == ["e1"]
        assert origin.stream.subscribed[ENDPOINT] == {"e1"}


async def test_an_envoy_request_body_is_served(http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("e1", 1))
    # As Envoy's HttpSubscriptionImpl writes it (MessageUtil::getJsonStringFromMessage).
    body = (
        b'{"versionInfo":"stale","node":{"id":"envoy-1","cluster":"edge",'
        b'"userAgentName":"envoy","userAgentBuildVersion":{"version":{"majorNumber":1,'
        b'"minorNumber":31},"metadata":{"revision.status":"Clean","build.type":"RELEASE",'
        b'"ssl.version":"BoringSSL"}},"extensions":[{"name":"envoy.filters.http.router",'
        b'"category":"envoy.filters.http","typeUrls":["type.googleapis.com/envoy.extensions.'
        b'filters.http.router.v3.Router"]}],"clientFeatures":["envoy.lb.does_not_support_'
        b'overprovisioning","envoy.lrs.supports_send_all_clusters"]},"resourceNames":["e1"],'
        b'"typeUrl":"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",'
        b'"responseNonce":""}')
    async with rest_stack(origin) as stack:
        status, response, _ = await poll(http, stack, ENDPOINTS, body)
        assert status == 200
        served = json.loads(response)
        assert served == response_json(served["versionInfo"], ENDPOINT, endpoints("e1", 1))


async def test_nothing_from_the_origin_in_time_is_503_with_retry_after(
        http: aiohttp.ClientSession) -> None:
    clock = ManualClock()
    origin = ScriptedOrigin(auto=False)
    async with rest_stack(origin, clock=clock, rest="wait: 500ms") as stack:
        polled = asyncio.ensure_future(poll(http, stack, ENDPOINTS, {"resourceNames": ["e1"]}))
        request = await origin.next_request()
        while list(request.resource_names_subscribe) != ["e1"]:
            request = await origin.next_request()
        await clock.advance(0.5)
        status, body, headers = await polled
        assert (status, headers["Retry-After"]) == (503, "1")
        assert body == (b"the relay has not yet received 1 of these ClusterLoadAssignment "
                        b"resources from its origin (the first: 'e1'); it has subscribed to "
                        b"them: ask again shortly\n")


async def test_a_draining_relay_answers_503(http: aiohttp.ClientSession) -> None:
    async with rest_stack() as stack:
        await stack.relay.drain(0)
        status, body, _ = await poll(http, stack, CLUSTERS, {})
        assert (status, body) == (503, b"the relay is draining; poll another replica\n")


async def test_with_workers_each_worker_serves_rest_on_the_shared_port(
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    origin = await ScriptedOrigin().start()
    origin.set(endpoints("e1", 1))
    config = tmp_path / "relay.yaml"
    config.write_text(f"""
node: {{id: relay-test}}
server: {{address: "127.0.0.1:0", workers: 2}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{address: "127.0.0.1:{origin.port}", backoff: {{initial: 0.05s, max: 0.5s}}}}
rest: {{address: "127.0.0.1:0"}}
""")
    log = tmp_path / "relay.log"
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "relay", "run", "--config", str(config), cwd=REPO,
            stderr=stderr)
    try:
        # (three processes start: on a busy 2-core machine a worker took over
        # 10 s to import, so the bound is generous; it ends at once when done)
        await eventually(lambda: log.read_text().count("serving REST polling") == 2 or
                         process.returncode is not None, 60)
        # port 0: the hub picked one and holds it, and both workers serve it
        [port] = set(re.findall(r"serving REST polling on http://127\.0\.0\.1:(\d+)",
                                log.read_text()))
        assert f"workers serve REST polling on 127.0.0.1:{port}" in log.read_text()
        url = f"http://127.0.0.1:{port}{ENDPOINTS}"
        versions = set()
        for number in range(4):  # a connection each: the kernel spreads them
            async with aiohttp.ClientSession() as fresh, fresh.post(url, json={
                    "node": {"id": f"n{number}"}, "resourceNames": ["e1"]}) as response:
                assert response.status == 200, log.read_text()
                versions.add(json.loads(await response.read())["versionInfo"])
        assert len(versions) == 1
        admin = int(re.findall(r"admin on 127\.0\.0\.1:(\d+)", log.read_text())[0])
        async with http.get(f"http://127.0.0.1:{admin}/metrics") as response:
            page = (await response.read()).decode()
        pushes = [sample for family in text_string_to_metric_families(page)
                  for sample in family.samples
                  if sample.name == "xds_relay_downstream_pushes_total" and
                  sample.labels.get("protocol") == "rest"]
        assert sum(sample.value for sample in pushes) == 4
        assert {sample.labels["worker"] for sample in pushes} <= {"1", "2"}
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            await asyncio.wait_for(process.wait(), 15)
        await origin.stop()


# ------------------------------------------------------------------------------ bad requests


async def test_bad_json_is_400_saying_why_and_counted(http: aiohttp.ClientSession) -> None:
    async with rest_stack() as stack:
        assert (await poll(http, stack, CLUSTERS, b'{"node": '))[:2] == (
            400, b"the body is not JSON: Expecting value: line 1 column 10 (char 9)\n")
        assert metric(stack, "xds_relay_downstream_rejected_streams_total",
                      protocol="rest") == 1


async def test_a_json_object_with_an_unknown_field_is_400(
        http: aiohttp.ClientSession) -> None:
    async with rest_stack() as stack:
        status, body, _ = await poll(http, stack, CLUSTERS, {"resourceNames": [], "names": []})
        assert status == 400
        assert body.startswith(b'the body is not a DiscoveryRequest: Message type '
                               b'"envoy.service.discovery.v3.DiscoveryRequest" has no field '
                               b'named "names"')


async def test_a_type_url_other_than_the_paths_is_400(http: aiohttp.ClientSession) -> None:
    async with rest_stack() as stack:
        assert (await poll(http, stack, CLUSTERS, {"typeUrl": ENDPOINT}))[:2] == (
            400, f"type_url {ENDPOINT!r} sent to POST {CLUSTERS}, which serves "
                 f"{CLUSTER!r}\n".encode())


async def test_an_unknown_path_is_404_and_get_is_405(http: aiohttp.ClientSession) -> None:
    async with rest_stack() as stack:
        status, body, _ = await poll(http, stack, "/v3/discovery:cluster", {})
        assert status == 404
        assert body.startswith(b"not found; REST polling is served on /v3/discovery:clusters ")
        status, body, headers = await poll(http, stack, CLUSTERS, b"", method="GET")
        assert (status, body, headers["Allow"]) == (
            405, b"GET is not allowed; POST a JSON DiscoveryRequest\n", "POST")


async def test_a_body_over_request_size_is_413_and_counted(
        http: aiohttp.ClientSession) -> None:
    async with rest_stack(limits="request_size: 16KiB") as stack:
        big = {"resourceNames": ["x" * 100] * 200}
        status, body, _ = await poll(http, stack, CLUSTERS, big)
        assert (status, body) == (413, b"a request of more than 16384 bytes; the relay takes "
                                       b"requests of at most 16384 (limits.request_size)\n")

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as read
            for _ in range(20):
                yield b" " * 1024

        async with http.post(f"http://127.0.0.1:{stack.relay.rest_port}{CLUSTERS}",
                             data=chunks()) as response:
            assert response.status == 413
        assert metric(stack, "xds_relay_downstream_limited_streams_total",
                      limit="request_size") == 2


async def test_a_request_beyond_a_limit_is_400_naming_it_and_counted(
        http: aiohttp.ClientSession) -> None:
    async with rest_stack(limits="names_per_request: 2") as stack:
        assert (await poll(http, stack, CLUSTERS, {"resourceNames": ["a", "b", "c"]}))[:2] == (
            400, b"the request names 3 resources; at most 2 per request "
                 b"(limits.names_per_request)\n")
        assert metric(stack, "xds_relay_downstream_limited_streams_total",
                      limit="names_per_request") == 1


# ------------------------------------------------------------------------------ TLS


@pytest.fixture
def pki(tmp_path: Path) -> Authority:
    return Authority(tmp_path)


@contextlib.asynccontextmanager
async def tls_stack(ca: Authority, *, mutual: bool, authorization: str = ""
                    ) -> AsyncIterator[Stack]:
    relay = ca.relay_leaf()
    keys = f"cert_file: '{relay.cert_file}', key_file: '{relay.key_file}'"
    if mutual:
        keys += f", client_ca_file: '{ca.cert_file}'"
    server = f"tls: {{{keys}}}" + (f", authorization: {{{authorization}}}"
                                   if authorization else "")
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with rest_stack(origin, server=server) as stack:
        yield stack


def client_context(ca: Authority, leaf: Leaf | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca.cert_file)
    if leaf is not None:
        context.load_cert_chain(leaf.cert_file, leaf.key_file)
    return context


async def test_https_is_served_with_the_xds_ports_certificate(
        http: aiohttp.ClientSession, pki: Authority) -> None:
    async with tls_stack(pki, mutual=False) as stack:
        status, body, _ = await poll(http, stack, CLUSTERS, {"resourceNames": ["a"]},
                                     scheme="https", ssl_context=client_context(pki))
        assert status == 200
        assert [r["name"] for r in json.loads(body)["resources"]] == ["a"]


async def test_an_allowed_identity_is_served_and_another_refused_403_and_counted(
        http: aiohttp.ClientSession, pki: Authority) -> None:
    async with tls_stack(pki, mutual=True, authorization=f"allow: ['{CLIENT_ID}']") as stack:
        allowed = client_context(pki, pki.issue("frontend", spiffe_id=CLIENT_ID))
        status, _, _ = await poll(http, stack, CLUSTERS, {"resourceNames": ["a"]},
                                  scheme="https", ssl_context=allowed)
        assert status == 200
        other = client_context(pki, pki.issue("other", spiffe_id="spiffe://mesh.test/ns/x/sa/y"))
        assert (await poll(http, stack, CLUSTERS, {"resourceNames": ["a"]}, scheme="https",
                           ssl_context=other))[:2] == (
            403, b"client identity spiffe://mesh.test/ns/x/sa/y is not allowed to connect "
                 b"(server.authorization.allow)\n")
        assert metric(stack, "xds_relay_downstream_refused_streams_total",
                      reason="identity") == 1


async def test_without_a_client_certificate_the_handshake_fails(
        http: aiohttp.ClientSession, pki: Authority) -> None:
    async with tls_stack(pki, mutual=True) as stack:
        with pytest.raises(aiohttp.ClientError):
            await poll(http, stack, CLUSTERS, {"resourceNames": ["a"]}, scheme="https",
                       ssl_context=client_context(pki))


async def test_a_node_its_certificate_does_not_bind_is_refused_403(
        http: aiohttp.ClientSession, pki: Authority) -> None:
    async with tls_stack(pki, mutual=True, authorization="node_binding: id") as stack:
        edge = client_context(pki, pki.issue("edge", dns=("edge-7.mesh.test",)))
        status, body, _ = await poll(http, stack, CLUSTERS, {
            "node": {"id": "edge-8.mesh.test"}, "resourceNames": ["a"]}, scheme="https",
            ssl_context=edge)
        assert (status, body) == (
            403, b"node id 'edge-8.mesh.test' is not the identity of its certificate "
                 b"(edge-7.mesh.test) (server.authorization.node_binding: id)\n")
        assert metric(stack, "xds_relay_downstream_refused_streams_total",
                      reason="node_binding") == 1
        status, _, _ = await poll(http, stack, CLUSTERS, {
            "node": {"id": "edge-7.mesh.test"}, "resourceNames": ["a"]}, scheme="https",
            ssl_context=edge)
        assert status == 200


async def test_a_rotated_certificate_is_served_to_new_connections(pki: Authority) -> None:
    async with tls_stack(pki, mutual=False) as stack:
        renewed = pki.relay_leaf("renewed")
        tls = stack.relay.config.server.tls
        assert tls is not None
        tls.key_file.write_bytes(renewed.key_pem)
        tls.cert_file.write_bytes(renewed.cert_pem)
        _, writer = await asyncio.open_connection("127.0.0.1", stack.relay.rest_port,
                                                  ssl=client_context(pki))
        try:
            served = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        finally:
            writer.close()
        assert ssl.DER_cert_to_PEM_cert(served).encode() == renewed.cert_pem


# ------------------------------------------------------------------------ the listener's limits


def post_head(length: int | None, path: str = CLUSTERS) -> bytes:
    """A poll's request line and headers: a Content-Length, or chunked."""
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"POST {path} HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\n"
            f"{framing}\r\n\r\n").encode()


def padded_poll(size: int) -> bytes:
    """A poll for cluster ``a``, ``size`` bytes long (JSON allows the trailing spaces)."""
    body = b'{"resourceNames": ["a"]}'
    return body + b" " * (size - len(body))


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_a_slow_body_is_408_after_body_timeout_and_its_bytes_given_back(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "relay.downstream")
    async with rest_stack(rest="body_timeout: 200ms") as stack:
        assert stack.relay.rest is not None
        reader, writer = await connect(stack.relay.rest_port)
        writer.write(post_head(1000) + b'{"resourceNames"')  # and no more
        answer = await until_closed(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert answer.endswith(b"\r\n\r\nthe body took more than 0.2s to come "
                               b"(rest.body_timeout)\n")
        assert stack.relay.rest.body_budget.held == 0
    port = writer.get_extra_info("sockname")[1]
    assert [r.getMessage() for r in caplog.records if r.name == "relay.downstream"] == [
        f"refusing REST poll from ipv4:127.0.0.1:{port}: the body took more than 0.2s to "
        f"come (rest.body_timeout)"]


async def test_bodies_past_max_buffered_body_are_503_while_the_others_are_served() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    size = 16 * 1024
    async with rest_stack(origin, limits="request_size: 16KiB",
                          rest="max_buffered_body: 40KiB") as stack:
        rest = stack.relay.rest
        assert rest is not None
        # Two polls of 16 KiB each, all but their last 1,000 bytes sent: 30 KiB and more held.
        holders = [await connect(stack.relay.rest_port) for _ in range(2)]
        for n, (_, writer) in enumerate(holders, 1):
            writer.write(post_head(size) + padded_poll(size)[:-1000])
            await eventually(lambda n=n: rest.body_budget.held == n * (size - 1000))
        # A third, declaring 16 KiB that would not fit: refused before a byte is read.
        reader, writer = await connect(stack.relay.rest_port)
        writer.write(post_head(size) + padded_poll(size))
        answer = await until_closed(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert b"\r\nRetry-After: 1\r\n" in answer
        assert answer.endswith(b"\r\n\r\nthe relay holds as many request bodies as it may at "
                               b"once (40KiB, rest.max_buffered_body); retry\n")
        # A chunked one, taken as its chunks come: the first fits, the second does not.
        reader, writer = await connect(stack.relay.rest_port)
        writer.write(post_head(None) + chunk(b" " * 8000))
        await eventually(lambda: rest.body_budget.held == 2 * (size - 1000) + 8000)
        writer.write(chunk(b" " * 8000))
        assert (await until_closed(reader)).startswith(b"HTTP/1.1 503 ")
        writer.close()
        # The first two are served once their bodies are whole.
        for reader, writer in holders:
            writer.write(padded_poll(size)[-1000:])
            status, body = await one_reply(reader)
            assert status == b"HTTP/1.1 200 OK"
            assert json.loads(body)["resources"] == json.loads(json_format.MessageToJson(
                discovery_pb2.DiscoveryResponse(resources=[pack(cluster("a"))])))["resources"]
            writer.close()
        assert rest.body_budget.held == 0


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
async def test_a_poll_dropped_mid_body_logs_no_error_and_gives_its_bytes_back(
        reset: bool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with rest_stack() as stack:
        rest = stack.relay.rest
        assert rest is not None
        _, writer = await connect(stack.relay.rest_port)
        writer.write(post_head(100_000) + b" " * 5_000)
        await eventually(lambda: rest.body_budget.held == 5_000)
        if reset:  # an RST rather than a FIN
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        await eventually(lambda: rest.body_budget.held == 0)
        lines = [r for r in caplog.records if r.name.startswith("relay.rest")]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []
    assert any(r.getMessage().endswith(": the client left before its whole body came")
               for r in lines)


async def test_the_rest_listener_applies_its_connection_and_header_limits() -> None:
    async with rest_stack(rest="header_timeout: 200ms, connections_per_host: 1") as stack:
        reader, writer = await connect(stack.relay.rest_port)
        writer.write(b"POST /v3/discovery:clusters HTTP/1.1\r\n")  # and no more
        refused_reader, refused_writer = await connect(stack.relay.rest_port)
        assert (await until_closed(refused_reader)).endswith(
            b"at most 1 at once from one host (rest.connections_per_host)\n")
        refused_writer.close()
        assert (await until_closed(reader)).endswith(
            b"the request's headers took more than 0.2s (rest.header_timeout)\n")
        writer.close()


async def test_a_poller_expecting_100_continue_is_told_to_go_on() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with rest_stack(origin) as stack:
        reader, writer = await connect(stack.relay.rest_port)
        body = b'{"resourceNames": ["a"]}'
        writer.write(post_head(len(body))[:-2] + b"Expect: 100-continue\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == \
            b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        status, answer = await one_reply(reader)
        writer.close()
        assert status == b"HTTP/1.1 200 OK"
        assert [r["name"] for r in json.loads(answer)["resources"]] == ["a"]


async def test_a_body_whose_chunks_break_off_is_408_after_body_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with rest_stack(rest="body_timeout: 200ms") as stack:
        rest = stack.relay.rest
        assert rest is not None
        reader, writer = await connect(stack.relay.rest_port)
        writer.write(post_head(None) + chunk(b"{"))
        await eventually(lambda: rest.body_budget.held == 1)  # the body is being read
        # aiohttp stops parsing and never ends this body: its timeout does
        writer.write(b"not-a-chunk-size\r\n")
        answer = await until_closed(reader)
        writer.close()
        assert rest.body_budget.held == 0
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []


async def test_a_compressed_body_is_not_inflated() -> None:
    async with rest_stack() as stack:
        reader, writer = await connect(stack.relay.rest_port)
        bomb = gzip.compress(b'{"resourceNames": []}' + b" " * 50_000_000)  # 48 KiB
        writer.write(post_head(len(bomb))[:-2] + b"Content-Encoding: gzip\r\n\r\n" + bomb)
        status, body = await one_reply(reader)
        writer.close()
    assert status == b"HTTP/1.1 400 Bad Request"
    assert body.startswith(b"the body is not JSON: ")
