"""gRPC's own xDS client (grpcio's C-core) gets its configuration through the relay."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from tests.harness import ScriptedOrigin, eventually, running_stack
from tests.interop import grpc_xds
from tests.interop.grpc_xds import (
    DEFAULT_CLUSTER,
    DEFAULT_ROUTE,
    XdsClientProcess,
    bootstrap_json,
    start_backend,
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
