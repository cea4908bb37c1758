"""End to end: the xDS port over TLS and mutual TLS, authorization, debug
access and redaction, with real gRPC clients and certificates made here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relay.certificates import load_key_pair
from relay.xds_types import CLUSTER, SECRET
from tests.certs import Authority, Leaf, tls_channel
from tests.clock import ManualClock
from tests.harness import (
    ADS,
    ScriptedOrigin,
    Stack,
    XdsClient,
    cluster,
    names_of,
    node,
    running_stack,
)

DELTA_ADS = ADS + "DeltaAggregatedResources"
SOTW_ADS = ADS + "StreamAggregatedResources"
CLIENT_ID = "spiffe://mesh.test/ns/app/sa/frontend"
ISTIO_NODE = "sidecar~10.0.0.7~frontend-1.app~app.svc.cluster.local"


@pytest.fixture
def pki(tmp_path: Path) -> Authority:
    return Authority(tmp_path)


def tls_keys(ca: Authority, relay: Leaf, mutual: bool) -> str:
    keys = f"cert_file: '{relay.cert_file}', key_file: '{relay.key_file}'"
    if mutual:
        keys += f", client_ca_file: '{ca.cert_file}'"
    return f"tls: {{{keys}}}"


@contextlib.asynccontextmanager
async def tls_stack(ca: Authority, *, mutual: bool = True, authorization: str = "",
                    clock: ManualClock | None = None,
                    origin: ScriptedOrigin | None = None) -> AsyncIterator[Stack]:
    relay_leaf = ca.relay_leaf()
    server = tls_keys(ca, relay_leaf, mutual)
    if authorization:
        server += f", authorization: {{{authorization}}}"
    origin = origin or ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, clock=clock, server=server) as stack:
        yield stack


@contextlib.asynccontextmanager
async def channel(stack: Stack, ca: Authority, client: Leaf | None = None
                  ) -> AsyncIterator[grpc.aio.Channel]:
    opened = tls_channel(stack.relay.xds_port, ca, client)
    try:
        yield opened
    finally:
        await opened.close()


async def served(chan: grpc.aio.Channel, node_id: str = "client-1") -> list[str]:
    """Subscribe to cluster ``a`` over delta ADS; the names of the first response."""
    client = XdsClient(chan, DELTA_ADS, delta=True)
    try:
        await client.send(node=node(node_id), type_url=CLUSTER, resource_names_subscribe=["a"])
        return names_of(await client.recv())
    finally:
        client.close()


async def refusal(chan: grpc.aio.Channel, node_id: str | None = None) -> grpc.aio.AioRpcError:
    """The error that ends a delta ADS stream: one that writes nothing (a
    refused connection or identity is refused before any request), or, with
    ``node_id``, one subscribing to ``a`` as that node. (A write racing the
    relay's refusal could read gRPC's INTERNAL instead: grpc/grpc#36066.)"""
    client = XdsClient(chan, DELTA_ADS, delta=True)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as error:  # when writing, or reading
            if node_id is not None:
                await client.send(node=node(node_id), type_url=CLUSTER,
                                  resource_names_subscribe=["a"])
            await client.recv()
        return error.value
    finally:
        client.close()


def metric(stack: Stack, name: str, **labels: str) -> float:
    """The sum of a series' samples with ``labels``, as /metrics shows them."""
    families = text_string_to_metric_families(generate_latest(stack.relay.registry).decode())
    return sum(sample.value for family in families for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def refused_count(stack: Stack, reason: str) -> float:
    return metric(stack, "xds_relay_downstream_refused_streams_total", reason=reason)


# -- TLS and mutual TLS --------------------------------------------------------


async def test_tls_clients_are_served_and_plaintext_ones_are_not(pki: Authority) -> None:
    async with tls_stack(pki, mutual=False) as stack:
        async with channel(stack, pki) as chan:
            assert await served(chan) == ["a"]
        # The harness's own channel is plaintext: the TLS port does not speak it.
        error = await refusal(stack.channel)
        assert error.code() == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_serves_a_client_with_a_certificate_of_the_ca(pki: Authority) -> None:
    async with tls_stack(pki) as stack:
        client = pki.issue("frontend", spiffe_id=CLIENT_ID)
        async with channel(stack, pki, client) as chan:
            assert await served(chan) == ["a"]
            # the SotW variant and a per-type service too
            sotw = XdsClient(chan, SOTW_ADS, delta=False)
            await sotw.send(node=node("sotw"), type_url=CLUSTER, resource_names=["a"])
            assert names_of(await sotw.recv()) == ["a"]
            sotw.close()


@pytest.mark.parametrize("case", ["no certificate", "untrusted CA", "expired"])
async def test_mutual_tls_refuses_a_client_at_the_handshake(pki: Authority, tmp_path: Path,
                                                            case: str) -> None:
    """gRPC refuses these before the relay sees a call: the client's call fails
    UNAVAILABLE, the relay's streams never open."""
    if case == "no certificate":
        client = None
    elif case == "untrusted CA":
        client = Authority(tmp_path, "other-ca").issue("stranger", spiffe_id=CLIENT_ID)
    else:
        client = pki.issue("old", spiffe_id=CLIENT_ID, expired=True)
    async with tls_stack(pki) as stack:
        async with channel(stack, pki, client) as chan:
            error = await refusal(chan)
            assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert stack.relay.serving.streams == set()
        # ... while a client with a good certificate is served by the same relay
        async with channel(stack, pki, pki.issue("good", spiffe_id=CLIENT_ID)) as chan:
            assert await served(chan) == ["a"]


# -- authorization ---------------------------------------------------------------


async def test_an_identity_not_allowed_is_refused_with_a_reason_a_metric_and_one_log_line(
        pki: Authority, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    allow = "allow: ['spiffe://mesh.test/ns/app/sa/*', {prefix: 'ops.'}]"
    async with tls_stack(pki, authorization=allow, clock=clock) as stack:
        allowed = pki.issue("frontend", spiffe_id=CLIENT_ID)
        by_dns = pki.issue("ops", dns=("ops.mesh.test",))
        stranger = pki.issue("stranger", spiffe_id="spiffe://mesh.test/ns/other/sa/frontend",
                             dns=("stranger.mesh.test",))
        async with channel(stack, pki, allowed) as chan:
            assert await served(chan) == ["a"]
        async with channel(stack, pki, by_dns) as chan:
            assert await served(chan) == ["a"]
        caplog.set_level(logging.WARNING, "relay.access")
        async with channel(stack, pki, stranger) as chan:
            errors = [await refusal(chan) for _ in range(3)]
        assert {(e.code(), e.details()) for e in errors} == {(
            grpc.StatusCode.PERMISSION_DENIED,
            "client identity spiffe://mesh.test/ns/other/sa/frontend / stranger.mesh.test is "
            "not allowed to connect (server.authorization.allow)")}
        assert refused_count(stack, "identity") == 3
        lines = [r.getMessage() for r in caplog.records if r.name == "relay.access"]
        assert len(lines) == 1 and "refused ipv4:127.0.0.1:" in lines[0]
        assert lines[0].endswith("(identity): " + errors[0].details())
        # After the interval, the next refusal is logged with what was left out.
        await clock.advance(10)
        async with channel(stack, pki, stranger) as chan:
            await refusal(chan)
        lines = [r.getMessage() for r in caplog.records if r.name == "relay.access"]
        assert len(lines) == 2
        assert lines[1].endswith("(2 more like it in the 10s since the last one logged)")
        assert stack.relay.serving.streams == set()


async def test_the_fetch_method_is_authorized_too(pki: Authority) -> None:
    allow = f"allow: ['{CLIENT_ID}']"
    async with tls_stack(pki, authorization=allow) as stack:
        # A stream holds `a` in the cache meanwhile: a fetch is answered from it.
        warm = XdsClient(tls_channel(stack.relay.xds_port, pki,
                                     pki.issue("warm", spiffe_id=CLIENT_ID)), DELTA_ADS, True)
        stack.clients.append(warm)
        await warm.send(node=node("warm"), type_url=CLUSTER, resource_names_subscribe=["a"])
        await warm.recv()
        fetch = "/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters"
        request = discovery_pb2.DiscoveryRequest(node=node("n"), type_url=CLUSTER,
                                                 resource_names=["a"])
        for leaf, code in ((pki.issue("frontend", spiffe_id=CLIENT_ID), None),
                           (pki.issue("other", spiffe_id="spiffe://mesh.test/ns/x/sa/y"),
                            grpc.StatusCode.PERMISSION_DENIED)):
            async with channel(stack, pki, leaf) as chan:
                call = chan.unary_unary(
                    fetch, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                    response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
                if code is None:
                    assert names_of(await call(request, timeout=5)) == ["a"]
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as error:
                        await call(request, timeout=5)
                    assert error.value.code() == code


async def test_a_node_in_another_namespace_than_its_certificate_is_refused(
        pki: Authority) -> None:
    origin = ScriptedOrigin()
    async with tls_stack(pki, authorization="node_binding: namespace", origin=origin) as stack:
        client = pki.issue("frontend", spiffe_id=CLIENT_ID)
        async with channel(stack, pki, client) as chan:
            liar = "sidecar~10.0.0.7~db-1.payments~payments.svc.cluster.local"
            error = await refusal(chan, liar)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED
            assert error.details() == (
                f"node {liar!r} is in namespace 'payments' but its certificate {CLIENT_ID} is "
                f"for namespace 'app' (server.authorization.node_binding: namespace)")
            assert refused_count(stack, "node_binding") == 1
            # Refused before it subscribed: nothing was asked of the origin.
            assert stack.relay.index.wanted_locators(CLUSTER) == {}
            assert origin.stream.requests.empty()
            assert await served(chan, ISTIO_NODE) == ["a"]


async def test_a_node_id_must_be_an_identity_of_its_certificate(pki: Authority) -> None:
    async with tls_stack(pki, authorization="node_binding: id") as stack:
        client = pki.issue("edge", dns=("edge-7.mesh.test",))
        async with channel(stack, pki, client) as chan:
            assert await served(chan, "edge-7.mesh.test") == ["a"]
            error = await refusal(chan, "edge-8.mesh.test")
        assert (error.code(), error.details()) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "node id 'edge-8.mesh.test' is not the identity of its certificate "
            "(edge-7.mesh.test) (server.authorization.node_binding: id)")


# -- rotation --------------------------------------------------------------------


def replace(leaf: Leaf, target: Leaf, *, key: bool = True) -> None:
    """Write ``leaf``'s files over ``target``'s, each whole (as a rename)."""
    pairs = [(leaf.cert_pem, target.cert_file)] + ([(leaf.key_pem, target.key_file)]
                                                  if key else [])
    for data, path in pairs:
        temporary = path.with_suffix(".new")
        temporary.write_bytes(data)
        os.replace(temporary, path)


async def test_a_rotated_certificate_serves_new_connections_while_open_streams_go_on(
        pki: Authority, tmp_path: Path) -> None:
    """The relay's certificate is replaced by one from a new CA: new clients
    that trust only the new CA connect, clients that trust only the old one
    no longer can, and a stream opened before keeps receiving updates."""
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    relay_leaf = pki.relay_leaf()
    async with running_stack(origin, server=tls_keys(pki, relay_leaf, False)) as stack:
        old_channel = tls_channel(stack.relay.xds_port, pki)
        before = XdsClient(old_channel, DELTA_ADS, delta=True)
        await before.send(node=node("before"), type_url=CLUSTER,
                          resource_names_subscribe=["a"])
        await before.ack(await before.recv())

        (tmp_path / "new").mkdir()
        new_ca = Authority(tmp_path / "new", "new-ca")
        relay_leaf.cert_file.with_suffix(".old").write_bytes(relay_leaf.cert_pem)
        # Half rotated: the new certificate with the old key is not served.
        replace(new_ca.relay_leaf("new-relay"), relay_leaf, key=False)
        async with channel(stack, pki) as chan:
            assert await served(chan) == ["a"]
        expiry = "xds_relay_tls_certificate_expiry_timestamp_seconds"
        assert metric(stack, expiry) == int(load_key_pair(
            relay_leaf.cert_file.with_suffix(".old"), relay_leaf.key_file).not_after.timestamp())
        # Whole: new connections get the new certificate.
        rotated = new_ca.issue("new-relay-2", dns=("relay.test",), ips=("127.0.0.1",))
        replace(rotated, relay_leaf)
        async with channel(stack, new_ca) as chan:
            assert await served(chan) == ["a"]
        assert metric(stack, expiry) == int(
            load_key_pair(rotated.cert_file, rotated.key_file).not_after.timestamp())
        async with channel(stack, pki) as chan:
            assert (await refusal(chan)).code() == grpc.StatusCode.UNAVAILABLE

        origin.set(cluster("a", timeout_s=7))
        update = await before.recv()
        assert names_of(update) == ["a"] and update.resources[0].version
        before.close()
        await old_channel.close()


# -- debug access and redaction ----------------------------------------------------


async def csds(chan: grpc.aio.Channel) -> csds_pb2.ClientStatusResponse:
    stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(chan)
    response: csds_pb2.ClientStatusResponse = await stub.FetchClientStatus(
        csds_pb2.ClientStatusRequest(), timeout=5)
    return response


async def list_services(chan: grpc.aio.Channel) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(chan)
    call = stub.ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    response = await call.read()
    call.cancel()
    return [s.name for s in response.list_services_response.service]


async def test_csds_and_reflection_answer_only_debug_identities(pki: Authority) -> None:
    debug_id = "spiffe://mesh.test/ns/ops/sa/debug"
    rules = f"debug: ['{debug_id}'], debug_loopback: false"
    async with tls_stack(pki, authorization=rules) as stack:
        client = pki.issue("frontend", spiffe_id=CLIENT_ID)
        async with channel(stack, pki, client) as chan:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await csds(chan)
            assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert error.value.details() == (
                "CSDS and reflection answer only the identities in server.authorization.debug; "
                f"{CLIENT_ID} is not one of them (the admin listener's /clients shows every "
                "client)")
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await list_services(chan)
            assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
            # ... while it is still served xDS
            assert await served(chan) == ["a"]
        assert refused_count(stack, "debug") == 2
        async with channel(stack, pki, pki.issue("debug", spiffe_id=debug_id)) as chan:
            assert (await csds(chan)).config == []
            assert "envoy.service.status.v3.ClientStatusDiscoveryService" in \
                await list_services(chan)


async def test_csds_from_a_loopback_peer_needs_no_identity(pki: Authority) -> None:
    async with tls_stack(pki, mutual=False) as stack, channel(stack, pki) as chan:
        assert (await csds(chan)).config == []


@contextlib.asynccontextmanager
async def sidecar(port: int) -> AsyncIterator[int]:
    """A TCP proxy on 127.0.0.1 that connects to ``port`` from 127.0.0.6, as
    Istio's sidecar does for every inbound connection; yields its own port."""
    pipes: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        inner_reader, inner_writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=("127.0.0.6", 0))
        for piped in (pipe(reader, inner_writer), pipe(inner_reader, writer)):
            task = asyncio.create_task(piped)
            pipes.add(task)
            task.add_done_callback(pipes.discard)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in list(pipes):
            task.cancel()


async def test_csds_through_a_sidecar_is_refused_though_it_comes_from_loopback() -> None:
    """Behind a sidecar every client of the mesh connects from 127.0.0.6: not
    this host, or CSDS would answer them all."""
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        assert (await csds(stack.channel)).config == []  # from 127.0.0.1: this host
        async with sidecar(stack.relay.xds_port) as port:
            through = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            try:
                assert await served(through) == ["a"]  # xDS, as any client
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await csds(through)
            finally:
                await through.close()
        assert (error.value.code(), error.value.details()) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "CSDS and reflection answer only processes on the relay's host (127.0.0.1, ::1, a "
            "unix socket) and the identities in server.authorization.debug; a client without a "
            "certificate identity (no SPIFFE ID or DNS SAN) is not one of them (the admin "
            "listener's /clients shows every client)")
        assert refused_count(stack, "debug") == 1


async def test_a_cached_secret_never_appears_in_csds(pki: Authority) -> None:
    key = b"-----BEGIN PRIVATE KEY-----\nTOP-SECRET-KEY-MATERIAL\n-----END PRIVATE KEY-----\n"
    secret = secret_pb2.Secret(name="server-cert", tls_certificate=common_pb2.TlsCertificate(
        certificate_chain={"inline_string": "PUBLIC-CHAIN"},
        private_key={"inline_bytes": key}))
    origin = ScriptedOrigin()
    origin.set(secret)
    # A client with a certificate: without server.authorization.secrets, it
    # may have every Secret (one without a certificate has none).
    gateway = pki.issue("gateway", spiffe_id="spiffe://mesh.test/ns/edge/sa/gateway")
    async with tls_stack(pki, origin=origin) as stack, channel(stack, pki, gateway) as chan:
        client = XdsClient(chan, DELTA_ADS, delta=True)
        await client.send(node=node("gateway"), type_url=SECRET,
                          resource_names_subscribe=["server-cert"])
        response = await client.recv()
        # the client itself gets its key, untouched
        assert b"TOP-SECRET-KEY-MATERIAL" in response.resources[0].resource.value
        await client.ack(response)
        answer: Any = None
        for _ in range(100):
            answer = await csds(chan)
            if answer.config and answer.config[0].generic_xds_configs[0].HasField("xds_config"):
                break
        held = secret_pb2.Secret()
        answer.config[0].generic_xds_configs[0].xds_config.Unpack(held)
        assert held.tls_certificate.private_key.inline_bytes == b"[redacted]"
        assert held.tls_certificate.certificate_chain.inline_string == "PUBLIC-CHAIN"
        assert b"TOP-SECRET" not in answer.SerializeToString()
        client.close()


async def test_the_fetch_method_checks_the_node_binding(pki: Authority) -> None:
    async with tls_stack(pki, authorization="node_binding: id") as stack:
        leaf = pki.issue("edge", dns=("edge-7.mesh.test",))
        async with channel(stack, pki, leaf) as chan:
            fetch = chan.unary_unary(
                "/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters",
                request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await fetch(discovery_pb2.DiscoveryRequest(
                    node=node("edge-8.mesh.test"), type_url=CLUSTER, resource_names=["a"]),
                    timeout=5)
        assert (error.value.code(), error.value.details()) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "node id 'edge-8.mesh.test' is not the identity of its certificate "
            "(edge-7.mesh.test) (server.authorization.node_binding: id)")
        assert refused_count(stack, "node_binding") == 1
