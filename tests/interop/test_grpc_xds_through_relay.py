"""gRPC's own xDS client (grpcio's C-core) gets its configuration through the relay."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from tests.certs import RELAY_NAME, Authority, Leaf
from tests.harness import ScriptedOrigin, Stack, eventually, running_stack
from tests.interop import grpc_xds
from tests.interop.grpc_xds import (
    DEFAULT_CLUSTER,
    DEFAULT_ROUTE,
    XdsClientProcess,
    bootstrap_json,
    start_backend,
    tls_channel_creds,
)
from tests.istiod import IstiodOrigin, OriginTLS


@pytest.fixture
async def backends() -> AsyncIterator[tuple[int, int]]:
    """The ports of two backends, answering "A" and "B"."""
    backend_a, port_a = await start_backend("A")
    backend_b, port_b = await start_backend("B")
    try:
        yield port_a, port_b
    finally:
        await backend_a.stop(0)
        await backend_b.stop(0)


async def test_grpc_xds_client_reaches_backend_and_follows_endpoint_change(
        backends: tuple[int, int]) -> None:
    port_a, port_b = backends
    origin = ScriptedOrigin()
    origin.set(*grpc_xds.xds_messages("svc", port_a))
    async with running_stack(origin) as stack:
        bootstrap = bootstrap_json(f"127.0.0.1:{stack.relay.xds_port}", "grpc-interop")
        async with XdsClientProcess("xds:///svc", bootstrap) as client:
            await client.follows_endpoint_move(origin, port_b)

        # The client ACKed what the relay sent and rejected nothing.
        scraped = generate_latest(stack.relay.registry).decode()
        assert 'xds_relay_downstream_acks_total{' in scraped
        assert "xds_relay_downstream_nacks_total" not in scraped, client.stderr[-3000:]

        # The relay asked the origin for each resource exactly once, on one stream.
        assert len(origin.streams) == 1
        subscribed = sorted((r.type_url, n) for r in origin.subscription_requests()
                            for n in r.resource_names_subscribe)
        assert subscribed == [(CLUSTER, DEFAULT_CLUSTER), (ENDPOINT, DEFAULT_CLUSTER),
                              (LISTENER, "svc"), (ROUTE, DEFAULT_ROUTE)]


async def test_grpc_xds_client_through_the_relay_to_an_istiod_shaped_origin(
        tmp_path: Path, backends: tuple[int, int]) -> None:
    # The origin is istiod-shaped: TLS with its own CA, a required bearer
    # token, no per-resource versions, everything resent on a new stream.
    port_a, port_b = backends
    tls = OriginTLS.create(tmp_path)
    token = tmp_path / "istio-token"
    token.write_text("projected-token")
    origin = IstiodOrigin(tls=tls, token="projected-token")
    origin.set(*grpc_xds.xds_messages("svc", port_a))
    upstream = "\n".join([f"tls: {{ca_file: {tls.ca_file}, server_name: {tls.server_name}}}",
                          f"token_file: {token}", "initial_metadata: {clusterid: Kubernetes}"])
    async with running_stack(origin, upstream=upstream, answer_grace="0.2s") as stack:
        bootstrap = bootstrap_json(f"127.0.0.1:{stack.relay.xds_port}", "grpc-interop")
        async with XdsClientProcess("xds:///svc", bootstrap) as client:
            # A change of content with no version from the origin still arrives.
            await client.follows_endpoint_move(origin, port_b)
            # istiod closes the stream (max connection age) and resends it all.
            origin.end_streams()
            await eventually(lambda: len(origin.streams) == 2 and origin.stream.sent
                             and origin.stream.all_answered())
            assert (await client.call()).backend == "B"
        scraped = generate_latest(stack.relay.registry).decode()
        assert "xds_relay_downstream_nacks_total" not in scraped, client.stderr[-3000:]
        assert origin.refused == []
        assert {s.metadata["clusterid"] for s in origin.streams} == {"Kubernetes"}


# -- over TLS and mutual TLS --------------------------------------------------
#
# The bootstrap's channel_creds is {"type": "tls", "config": {...}} (gRFC A65, in C-core
# since grpc/grpc#33234; grpcio 1.85 here): "ca_certificate_file" to verify the relay,
# "certificate_file" + "private_key_file" to present a client certificate. The name the
# client checks is the host of server_uri, 127.0.0.1, which the relay's certificate
# (certs.Authority.relay_leaf) carries as an IP SAN; no override is needed.

ALLOWED = "spiffe://interop.test/ns/apps/sa/grpc-client"
STRANGER = "spiffe://interop.test/ns/apps/sa/stranger"


def server_tls(relay: Leaf, client_ca: Authority | None = None,
               allow: tuple[str, ...] = ()) -> str:
    """``server`` keys (see :func:`relay_config`): serve ``relay``; with ``client_ca``
    require client certificates it signed, of an identity in ``allow``."""
    tls = f"cert_file: {relay.cert_file}, key_file: {relay.key_file}"
    if client_ca is None:
        return f"tls: {{{tls}}}"
    rules = ", ".join(f'"{pattern}"' for pattern in allow)
    return (f"tls: {{{tls}, client_ca_file: {client_ca.cert_file}}}, "
            f"authorization: {{allow: [{rules}]}}")


def refused(stack: Stack, reason: str) -> float:
    """How many xDS calls the relay refused for ``reason``."""
    return stack.relay.registry.get_sample_value(
        "xds_relay_downstream_refused_streams_total", {"reason": reason}) or 0.0


async def served_through_relay(stack: Stack, client: XdsClientProcess,
                               origin: ScriptedOrigin, port_b: int) -> None:
    """``client`` got its config through the relay and follows a change, as in the
    plaintext test, and the relay refused nothing and was NACKed nothing."""
    await client.follows_endpoint_move(origin, port_b)
    scraped = generate_latest(stack.relay.registry).decode()
    assert 'xds_relay_downstream_acks_total{' in scraped
    assert "xds_relay_downstream_nacks_total" not in scraped, client.stderr[-3000:]
    assert refused(stack, "identity") == 0
    assert len(origin.streams) == 1
    assert {(r.type_url, n) for r in origin.subscription_requests()
            for n in r.resource_names_subscribe} == {
        (CLUSTER, DEFAULT_CLUSTER), (ENDPOINT, DEFAULT_CLUSTER), (LISTENER, "svc"),
        (ROUTE, DEFAULT_ROUTE)}


async def test_grpc_xds_client_over_tls(tmp_path: Path, backends: tuple[int, int]) -> None:
    port_a, port_b = backends
    ca = Authority(tmp_path)
    origin = ScriptedOrigin()
    origin.set(*grpc_xds.xds_messages("svc", port_a))
    async with running_stack(origin, server=server_tls(ca.relay_leaf())) as stack:
        # The relay's port speaks only TLS: this client verifies the relay's certificate
        # (CA and the IP SAN 127.0.0.1) and presents none.
        bootstrap = bootstrap_json(f"127.0.0.1:{stack.relay.xds_port}", "grpc-interop",
                                   channel_creds=tls_channel_creds(ca.cert_file))
        async with XdsClientProcess("xds:///svc", bootstrap) as client:
            await served_through_relay(stack, client, origin, port_b)


@pytest.mark.parametrize("wrong", ["name", "authority"])
async def test_grpc_xds_client_over_tls_checks_the_relay_certificate(
        tmp_path: Path, backends: tuple[int, int], wrong: str) -> None:
    # What makes the test above pass is a real check: a relay certificate without the IP
    # SAN 127.0.0.1 (only the DNS name), or one from a CA the client does not trust, and
    # the client never gets its config.
    port_a, _ = backends
    ca = Authority(tmp_path)
    leaf = (ca.issue("relay-dns-only", dns=(RELAY_NAME,)) if wrong == "name"
            else Authority(tmp_path, "other-ca").relay_leaf("relay-other-ca"))
    expected = ("Hostname Verification Check failed" if wrong == "name"
                else "CERTIFICATE_VERIFY_FAILED")
    origin = ScriptedOrigin()
    origin.set(*grpc_xds.xds_messages("svc", port_a))
    async with running_stack(origin, server=server_tls(leaf)) as stack:
        bootstrap = bootstrap_json(f"127.0.0.1:{stack.relay.xds_port}", "grpc-interop",
                                   channel_creds=tls_channel_creds(ca.cert_file))
        async with XdsClientProcess("xds:///svc", bootstrap, rpc_timeout=3.0,
                                    wait_for_ready=False) as client:
            result = await client.call()
        assert not result.ok and result.code == "UNAVAILABLE", result
        assert expected in (result.details or ""), result
        assert origin.subscription_requests() == []


async def test_grpc_xds_client_over_mtls_with_an_allowed_identity(
        tmp_path: Path, backends: tuple[int, int]) -> None:
    port_a, port_b = backends
    ca = Authority(tmp_path)
    client_leaf = ca.issue("grpc-client", spiffe_id=ALLOWED)
    origin = ScriptedOrigin()
    origin.set(*grpc_xds.xds_messages("svc", port_a))
    server = server_tls(ca.relay_leaf(), client_ca=ca, allow=(ALLOWED,))
    async with running_stack(origin, server=server) as stack:
        creds = tls_channel_creds(ca.cert_file, client_leaf.cert_file, client_leaf.key_file)
        bootstrap = bootstrap_json(f"127.0.0.1:{stack.relay.xds_port}", "grpc-interop",
                                   channel_creds=creds)
        async with XdsClientProcess("xds:///svc", bootstrap) as client:
            await served_through_relay(stack, client, origin, port_b)


async def test_grpc_xds_client_over_mtls_with_an_identity_not_allowed_gets_nothing(
        tmp_path: Path, backends: tuple[int, int], caplog: pytest.LogCaptureFixture) -> None:
    port_a, _ = backends
    ca = Authority(tmp_path)
    # Signed by the CA the relay trusts, so the handshake succeeds; only the allow list
    # (which names someone else) refuses it.
    stranger = ca.issue("stranger", spiffe_id=STRANGER)
    origin = ScriptedOrigin()
    origin.set(*grpc_xds.xds_messages("svc", port_a))
    server = server_tls(ca.relay_leaf(), client_ca=ca, allow=(ALLOWED,))
    caplog.set_level(logging.WARNING, logger="relay.access")
    async with running_stack(origin, server=server) as stack:
        creds = tls_channel_creds(ca.cert_file, stranger.cert_file, stranger.key_file)
        bootstrap = bootstrap_json(f"127.0.0.1:{stack.relay.xds_port}", "grpc-interop",
                                   channel_creds=creds)
        rpc_timeout = 3.0
        async with XdsClientProcess("xds:///svc", bootstrap, rpc_timeout=rpc_timeout,
                                    wait_for_ready=False) as client:
            # Not waiting for ready: the RPC fails as soon as the xDS stream does.
            result = await client.call()
        assert not result.ok and result.code == "UNAVAILABLE", result
        assert result.elapsed_ms < rpc_timeout * 1000, result
        # ... with the relay's reason, passed on by the client's xDS resolver.
        assert "PERMISSION_DENIED" in (result.details or ""), result
        assert f"{STRANGER} is not allowed to connect" in (result.details or ""), result

        # The relay counted and logged the refusal (before it aborted the call that the
        # client saw fail, so no waiting here).
        assert refused(stack, "identity") >= 1
        refusals = [r.getMessage() for r in caplog.records if r.name == "relay.access"]
        assert any(STRANGER in message and "(identity)" in message for message in refusals), \
            refusals
        # The relay never asked its origin for anything on the stranger's behalf.
        assert origin.subscription_requests() == []
        assert "xds_relay_downstream_acks_total{" not in \
            generate_latest(stack.relay.registry).decode()
