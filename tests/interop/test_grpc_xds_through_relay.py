"""gRPC's own xDS client (grpcio's C-core) gets its configuration through the relay."""

from __future__ import annotations

from prometheus_client import generate_latest

from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from tests.harness import ScriptedOrigin, running_stack
from tests.interop import grpc_xds
from tests.interop.grpc_xds import (
    DEFAULT_CLUSTER,
    DEFAULT_ROUTE,
    XdsClientProcess,
    bootstrap_json,
    start_backend,
)


async def test_grpc_xds_client_reaches_backend_and_follows_endpoint_change() -> None:
    backend_a, port_a = await start_backend("A")
    backend_b, port_b = await start_backend("B")
    origin = ScriptedOrigin()
    origin.set(*grpc_xds.xds_messages("svc", port_a))
    try:
        async with running_stack(origin) as stack:
            bootstrap = bootstrap_json(f"127.0.0.1:{stack.relay.xds_port}", "grpc-interop")
            async with XdsClientProcess("xds:///svc", bootstrap) as client:
                first = await client.call()
                assert first.ok, f"{first}\n{client.stderr[-3000:]}"
                assert first.backend == "A"

                origin.set(grpc_xds.cluster_load_assignment(DEFAULT_CLUSTER, port_b))
                moved = await client.wait_for_backend("B", timeout=10)
                assert moved.ok

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
    finally:
        await backend_a.stop(0)
        await backend_b.stop(0)
