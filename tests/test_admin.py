"""Admin endpoints: routing and content (pure), and one real HTTP round trip."""

from __future__ import annotations

import asyncio
import json

from envoy.service.discovery.v3 import discovery_pb2

from relay.admin import AdminServer, token_refusal
from relay.cache import ResourceCache, Update
from relay.config import AdminConfig
from relay.resource import CachedResource
from relay.telemetry import new_metrics, prometheus_provider
from relay.xds_types import CLUSTER, ENDPOINT, SECRET
from tests.builders import cluster, endpoints, pack


def admin(not_ready: str | None = None) -> tuple[AdminServer, ResourceCache]:
    cache = ResourceCache()
    for msg, type_url, name in ((cluster("a"), CLUSTER, "a"), (endpoints("a", 9), ENDPOINT, "a")):
        cache.apply(type_url, Update([CachedResource(type_url, name, "v1", discovery_pb2.Resource(
            name=name, version="v1", resource=pack(msg)))]))
    provider, registry = prometheus_provider()
    new_metrics(provider).push("delta", CLUSTER)
    return AdminServer(cache, registry, lambda: not_ready), cache


def test_ready_reflects_sync_state() -> None:
    assert admin()[0].route("GET", "/ready").status == 200
    reply = admin("draining")[0].route("GET", "/ready")
    assert (reply.status, reply.body) == (503, b"not ready: draining\n")
    assert admin("draining")[0].route("GET", "/healthz").status == 200


def test_config_dump_lists_resources_with_versions_and_filters() -> None:
    server, _ = admin()
    dump = json.loads(server.route("GET", "/config_dump").body)
    assert sorted(dump["types"]) == [CLUSTER, ENDPOINT]
    [entry] = dump["types"][CLUSTER]["resources"]
    assert entry["name"] == "a" and entry["version"] == "v1"
    assert entry["resource"]["name"] == "a"
    filtered = json.loads(server.route("GET", "/config_dump?type=Cluster&name=a").body)
    assert list(filtered["types"]) == [CLUSTER]
    none = json.loads(server.route("GET", "/config_dump?type=Cluster&name=zz").body)
    assert none["types"][CLUSTER]["resources"] == []


def test_metrics_are_prometheus_text() -> None:
    server, _ = admin()
    reply = server.route("GET", "/metrics")
    assert reply.status == 200 and reply.content_type.startswith("text/plain")
    assert b'xds_relay_downstream_pushes_total{' in reply.body
    assert b'type="Cluster"' in reply.body and b'protocol="delta"' in reply.body


def test_unknown_path_and_method() -> None:
    server, _ = admin()
    assert server.route("GET", "/nope").status == 404
    assert server.route("POST", "/ready").status == 405


def test_unknown_path_names_the_known_ones() -> None:
    reply = admin()[0].route("GET", "/stats")
    assert (reply.status, reply.body) == (
        404, b"not found; the paths are /healthz /ready /clients /origins /config_dump /config "
             b"/logging /metrics\n")


def test_other_methods_are_refused_with_allow() -> None:
    reply = admin()[0].route("DELETE", "/config_dump")
    assert (reply.status, reply.headers) == (405, {"Allow": "GET, HEAD"})
    assert reply.body == b"DELETE is not allowed; use GET or HEAD\n"


def test_head_is_answered_as_get() -> None:
    server, _ = admin()
    assert server.route("HEAD", "/config_dump") == server.route("GET", "/config_dump")


def test_config_dump_of_an_unknown_type_is_a_bad_query() -> None:
    reply = admin()[0].route("GET", "/config_dump?type=Clusters")
    assert reply.status == 400
    assert reply.body.startswith(b"unknown type 'Clusters'; known types: Cluster, ")
    assert b"Secret" in reply.body and reply.body.endswith(b"\n")


def test_config_dump_of_a_known_type_not_cached_lists_it_empty() -> None:
    dump = json.loads(admin()[0].route("GET", "/config_dump?type=Secret").body)
    assert dump == {"types": {SECRET: {"synced": False, "resources": []}}}


def test_config_dump_refuses_unknown_parameters() -> None:
    reply = admin()[0].route("GET", "/config_dump?typ=Cluster")
    assert (reply.status, reply.body) == (
        400, b"unknown parameter 'typ'; /config_dump takes type and name\n")


def test_no_token_configured_lets_everything_through() -> None:
    assert token_refusal("/config_dump", None, None) is None


def test_probes_need_no_token() -> None:
    assert token_refusal("/healthz", None, b"s3cret") is None
    assert token_refusal("/ready", "Bearer wrong", b"s3cret") is None


def test_a_missing_token_is_asked_for() -> None:
    reply = token_refusal("/clients", None, b"s3cret")
    assert reply is not None and reply.status == 401
    assert reply.headers == {"WWW-Authenticate": "Bearer"}


def test_a_wrong_token_or_scheme_is_refused() -> None:
    for header in ("Bearer wrong", "Basic s3cret", "s3cret", "Bearer", "Bearer s3cret2"):
        reply = token_refusal("/metrics", header, b"s3cret")
        assert reply is not None and reply.status == 401, header


def test_the_right_token_passes_whatever_the_scheme_case() -> None:
    assert token_refusal("/metrics", "Bearer s3cret", b"s3cret") is None
    assert token_refusal("/metrics", "bearer  s3cret ", b"s3cret") is None


async def test_real_http_round_trip() -> None:
    server, _ = admin()
    port = await server.start(AdminConfig(address="127.0.0.1:0"))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert raw.startswith(b"HTTP/1.1 200 OK\r\n") and raw.endswith(b"\r\n\r\nready\n")
    finally:
        await server.stop()


def test_hot_histogram_reports_cumulative_buckets_count_and_sum() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from relay.telemetry import HotHistogram

    registry = CollectorRegistry()
    histogram = HotHistogram("lat_seconds", "test", ("type",), (0.1, 1.0))
    registry.register(histogram)
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.record(value, "Cluster")
    text = generate_latest(registry).decode()
    assert 'lat_seconds_bucket{le="0.1",type="Cluster"} 2.0' in text  # le is inclusive
    assert 'lat_seconds_bucket{le="1.0",type="Cluster"} 3.0' in text
    assert 'lat_seconds_bucket{le="+Inf",type="Cluster"} 4.0' in text
    assert 'lat_seconds_count{type="Cluster"} 4.0' in text
    assert 'lat_seconds_sum{type="Cluster"} 3.65' in text
