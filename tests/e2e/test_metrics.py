"""/metrics after known traffic: the named series and their exact values."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import urllib.request
from collections.abc import Callable

from google.rpc import status_pb2
from prometheus_client.parser import text_string_to_metric_families

from relay.app import build_relay
from relay.config import parse_config
from relay.server.access import REFUSAL_REASONS
from relay.xds_types import ADS_SERVICE, CLUSTER, ENDPOINT, WILDCARD
from tests.harness import (
    ScriptedOrigin,
    Stack,
    cluster,
    endpoints,
    eventually,
    node,
    relay_config,
    running_stack,
)
from tests.ports import free_port

Labels = frozenset[tuple[str, str]]


async def scrape(admin_port: int) -> dict[tuple[str, Labels], float]:
    """Every sample of /metrics, fetched over real HTTP, keyed by name and labels."""
    def fetch() -> str:
        url = f"http://127.0.0.1:{admin_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return str(reply.read().decode())

    text = await asyncio.get_running_loop().run_in_executor(None, fetch)
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def series(samples: dict[tuple[str, Labels], float], name: str) -> dict[Labels, float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def answered(stack: Stack, *node_ids: str) -> Callable[[], bool]:
    """Whether the relay has read every answer of these clients' streams."""
    def check() -> bool:
        streams = [s for s in stack.relay.serving.streams if s.node_id in node_ids]
        return len(streams) == len(node_ids) and all(
            state.in_flight is None for s in streams for state in s.session.snapshot().types)
    return check


def labels(**pairs: str) -> Labels:
    return frozenset(pairs.items())


async def test_metrics_count_known_traffic_exactly() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), cluster("b"), endpoints("a", 1001), version="v1")
    async with running_stack(origin) as stack:
        delta, sotw = stack.client(delta=True), stack.client(delta=False)
        await delta.send(node=node("d"), type_url=CLUSTER, resource_names_subscribe=[WILDCARD])
        await delta.ack(await delta.recv())
        await delta.send(type_url=ENDPOINT, resource_names_subscribe=["a"])
        await delta.ack(await delta.recv())
        await sotw.send(node=node("s"), type_url=CLUSTER)
        first = await sotw.recv()
        await sotw.ack(first)
        # Wait for the relay to read the ACKs: whether a response is a push or
        # an answer depends on which came first, the ACK or the origin's update.
        await eventually(answered(stack, "d", "s"))

        # One origin update reaches both clients as a push.
        origin.set(cluster("a", timeout_s=2), version="v2")
        await delta.ack(await delta.recv())
        rejected = await sotw.recv()
        await eventually(answered(stack, "d"))

        # Both clients now hold back their answer: of three more updates the
        # first goes out to the delta client at once, the last waits, and the
        # ones in between are coalesced (one for delta, two for SotW).
        origin.set(cluster("a", timeout_s=3), version="v3")
        held_back = await delta.recv()
        for version, timeout in (("v4", 4), ("v5", 5)):
            # Each update is applied (the relay ACKs it) before the next comes.
            [sent] = origin.set(cluster("a", timeout_s=timeout), version=version)
            await eventually(lambda nonce=sent: origin.acked(nonce))
        await delta.ack(held_back)
        latest = await delta.recv()
        assert [r.version for r in latest.resources] == ["v5"]
        await delta.ack(latest)
        await sotw.send(type_url=CLUSTER, response_nonce=rejected.nonce,
                        version_info=first.version_info,
                        error_detail=status_pb2.Status(code=3, message="bad cluster"))
        await sotw.ack(await sotw.recv())
        await eventually(answered(stack, "d", "s"))

        samples = await scrape(stack.relay.admin_port)

    assert series(samples, "xds_relay_upstream_connected") == {labels(origin="default"): 1}
    assert series(samples, "xds_relay_upstream_subscriptions") == {
        labels(origin="default", type="Cluster"): 1,
        labels(origin="default", type="ClusterLoadAssignment"): 1}
    assert series(samples, "xds_relay_cache_resources") == {
        labels(type="Cluster"): 2, labels(type="ClusterLoadAssignment"): 1}
    assert series(samples, "xds_relay_cache_variants") == {
        labels(type="Cluster"): 2, labels(type="ClusterLoadAssignment"): 1}
    assert series(samples, "xds_relay_downstream_streams") == {
        labels(protocol="delta"): 1, labels(protocol="sotw"): 1}
    assert series(samples, "xds_relay_downstream_subscriptions") == {
        labels(protocol="delta", type="Cluster"): 1,
        labels(protocol="delta", type="ClusterLoadAssignment"): 1,
        labels(protocol="sotw", type="Cluster"): 1}
    assert series(samples, "xds_relay_downstream_pushes_total") == {
        labels(protocol="delta", type="Cluster"): 4,   # first fetch, v2, v3, v5
        labels(protocol="delta", type="ClusterLoadAssignment"): 1,
        labels(protocol="sotw", type="Cluster"): 3}    # from cache, v2, v5
    assert series(samples, "xds_relay_downstream_acks_total") == {
        labels(protocol="delta", type="Cluster"): 4,
        labels(protocol="delta", type="ClusterLoadAssignment"): 1,
        labels(protocol="sotw", type="Cluster"): 2}
    assert series(samples, "xds_relay_downstream_nacks_total") == {
        labels(protocol="sotw", type="Cluster"): 1}
    # the SotW client ACKed the response after the one it NACKed: nobody rejects now
    assert series(samples, "xds_relay_downstream_nacked_streams") == {
        labels(protocol="delta", type="Cluster"): 0,
        labels(protocol="delta", type="ClusterLoadAssignment"): 0,
        labels(protocol="sotw", type="Cluster"): 0}
    assert series(samples, "xds_relay_downstream_coalesced_updates_total") == {
        labels(protocol="delta", type="Cluster"): 1, labels(protocol="sotw", type="Cluster"): 2}
    assert series(samples, "xds_relay_upstream_responses_total") == {
        labels(origin="default", type="Cluster", outcome="ack"): 5,
        labels(origin="default", type="ClusterLoadAssignment", outcome="ack"): 1}
    assert series(samples, "xds_relay_upstream_server") == {
        labels(origin="default", server=f"127.0.0.1:{stack.origin.port}", fallback="0"): 1}
    # Push latency counts responses carrying a resource received after the
    # client last changed its subscription: every delta Cluster response (its
    # first fetch waited for the origin; v5 waited for the ACK, and counts),
    # the endpoints, and SotW's v2 and v5. SotW's first answer came from cache.
    assert series(samples, "xds_relay_push_latency_seconds_count") == {
        labels(type="Cluster"): 6, labels(type="ClusterLoadAssignment"): 1}
    assert series(samples, "xds_relay_push_latency_seconds_sum")[labels(type="Cluster")] > 0


async def test_metrics_have_the_process_series_readiness_and_limits() -> None:
    origin = ScriptedOrigin()  # it has nothing to send yet: the relay is not ready
    async with running_stack(origin, limits="streams: 7, names_per_request: 500") as stack:
        before = await scrape(stack.relay.admin_port)
        origin.set(cluster("a"), version="v1")
        await eventually(lambda: stack.relay.not_ready_reason() is None)
        after = await scrape(stack.relay.admin_port)

    assert series(before, "xds_relay_ready") == {labels(): 0}
    assert series(after, "xds_relay_ready") == {labels(): 1}
    limits = series(after, "xds_relay_limit")
    assert limits[labels(limit="streams")] == 7
    assert limits[labels(limit="names_per_request")] == 500
    assert limits[labels(limit="request_size")] == 16 * 1024 * 1024
    # What Prometheus users expect of any process (prometheus_client's collectors).
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                 "process_open_fds", "process_max_fds", "process_start_time_seconds"):
        assert series(after, name)[labels()] > 0, name
    assert set(series(after, "python_gc_collections_total")) == {
        labels(generation=str(g)) for g in range(3)}


async def test_nacked_streams_count_clients_still_rejecting_their_latest_response() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), version="v1")
    async with running_stack(origin) as stack:
        clients = [stack.client(delta=False) for _ in range(2)]
        for number, client in enumerate(clients):
            await client.send(node=node(f"s{number}"), type_url=CLUSTER)
            await client.ack(await client.recv())
        origin.set(cluster("a", timeout_s=2), version="v2")
        for client in clients:
            pushed = await client.recv()
            # s0 NACKs, s1 ACKs
            if client is clients[0]:
                await client.send(type_url=CLUSTER, response_nonce=pushed.nonce,
                                  error_detail=status_pb2.Status(code=3, message="no"))
            else:
                await client.ack(pushed)
        await eventually(answered(stack, "s0", "s1"))
        rejecting = series(await scrape(stack.relay.admin_port),
                           "xds_relay_downstream_nacked_streams")
        origin.set(cluster("a", timeout_s=3), version="v3")
        for client in clients:
            await client.ack(await client.recv())
        await eventually(answered(stack, "s0", "s1"))
        after = series(await scrape(stack.relay.admin_port),
                       "xds_relay_downstream_nacked_streams")

    assert rejecting == {labels(protocol="sotw", type="Cluster"): 1}
    assert after == {labels(protocol="sotw", type="Cluster"): 0}


async def test_series_alerts_take_increase_of_start_at_zero() -> None:
    # An origin that never answers: nothing has been counted yet.
    relay = build_relay(parse_config(relay_config(free_port())))
    await relay.start()
    try:
        samples = await scrape(relay.admin_port)
    finally:
        await relay.stop(0)

    assert series(samples, "xds_relay_upstream_connected") == {labels(origin="default"): 0}
    assert series(samples, "xds_relay_upstream_reconnects_total") == {
        labels(origin="default"): 0}
    assert series(samples, "xds_relay_downstream_limited_streams_total") == {
        labels(limit=limit): 0 for limit in (
            "streams", "streams_per_connection", "streams_per_host", "connections_per_host",
            "new_streams_per_second", "leases_per_host", "request_size", "names_per_request",
            "names_per_stream", "name_length", "node_size", "dynamic_parameters",
            "upstream_names", "upstream_names_per_host", "load_report_streams", "origin")}
    assert series(samples, "xds_relay_downstream_refused_streams_total") == {
        labels(reason=reason): 0 for reason in REFUSAL_REASONS}
    assert series(samples, "xds_relay_ready") == {labels(): 0}


async def test_event_loop_lag_records_a_blocked_loop() -> None:
    async with running_stack() as stack:
        lag = stack.relay.metrics.loop_lag
        await eventually(lambda: bool(lag._counts))  # the watcher has ticked
        # Hold the loop for 0.3 s: the tick due within 0.1 s of the start runs
        # at least 0.2 s late, however busy the machine.
        time.sleep(0.3)  # noqa: ASYNC251 - blocking the loop is the point
        await asyncio.sleep(0.15)  # the late tick, and the next, are recorded
        samples = await scrape(stack.relay.admin_port)

    buckets = series(samples, "xds_relay_event_loop_lag_seconds_bucket")
    assert buckets[labels(le="0.1")] < buckets[labels(le="+Inf")]
    assert series(samples, "xds_relay_event_loop_lag_seconds_sum")[labels()] >= 0.2


async def test_a_running_relay_records_its_gc_pauses() -> None:
    async with running_stack() as stack:
        await eventually(lambda: bool(stack.relay.metrics.loop_lag._counts))  # (all started)
        gc.collect()
        samples = await scrape(stack.relay.admin_port)
    assert series(samples, "xds_relay_gc_pause_seconds_count")[labels(generation="2")] >= 1


async def test_clients_endpoint_shows_each_client_subscriptions_acks_and_nacks() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), cluster("b"), endpoints("a", 1001), version="v1")
    async with running_stack(origin) as stack:
        delta, sotw = stack.client(delta=True), stack.client(delta=False)
        await delta.send(node=node("delta-1"), type_url=ENDPOINT, resource_names_subscribe=["a"])
        answer = await delta.recv()
        await delta.ack(answer)
        await sotw.send(node=node("sotw-1"), type_url=CLUSTER)
        first = await sotw.recv()
        await sotw.ack(first)
        origin.set(cluster("a", timeout_s=2), version="v2")
        rejected = await sotw.recv()
        await sotw.send(type_url=CLUSTER, response_nonce=rejected.nonce,
                        version_info=first.version_info,
                        error_detail=status_pb2.Status(code=3, message="bad cluster"))
        await eventually(answered(stack, "delta-1", "sotw-1"))

        def fetch() -> bytes:
            url = f"http://127.0.0.1:{stack.relay.admin_port}/clients"
            with urllib.request.urlopen(url, timeout=5) as reply:
                return bytes(reply.read())

        clients = json.loads(await asyncio.get_running_loop().run_in_executor(None, fetch))
    for client in clients["clients"]:
        assert client.pop("peer").startswith("ipv4:127.0.0.1:")
        # when it connected and was answered (Unix seconds; see tests/server/test_client_times)
        since, acked_at, nacked_at = (client.pop(key) for key in (
            "connected_since", "acked_at", "nacked_at"))
        assert since <= acked_at
        for state in client["types"].values():  # one type each: the stream's latest
            assert (state.pop("acked_at"), state.pop("nacked_at")) == (acked_at, nacked_at)
    assert clients == {"clients": [
        {"node_id": "delta-1", "protocol": "delta", "service": ADS_SERVICE, "types": {ENDPOINT: {
            "subscribed": ["a"], "wildcard": False, "versions": {"a": "v1"},
            "acked": answer.nonce, "in_flight": None, "last_nack": None,
            "sync": "synced", "unsynced": {}}}},
        {"node_id": "sotw-1", "protocol": "sotw", "service": ADS_SERVICE, "types": {CLUSTER: {
            "subscribed": [], "wildcard": True, "versions": {"a": "v2", "b": "v1"},
            "acked": first.version_info, "in_flight": None,
            "last_nack": {"nonce": rejected.nonce, "version": rejected.version_info,
                          "message": "bad cluster"},
            # SotW: every name of the type shares the fate of the rejected response
            "sync": "nacked", "unsynced": {"a": {"status": "nacked", "version": "v2"},
                                           "b": {"status": "nacked", "version": "v1"}}}}},
    ]}
