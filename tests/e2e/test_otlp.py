"""Optional OTLP push: the relay's metrics reach a collector over OTLP/HTTP (JSON)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from relay.app import build_relay
from relay.config import ConfigError, parse_config
from tests.harness import ScriptedOrigin, cluster, eventually, relay_config


class Collector:
    """An OTLP/HTTP receiver on loopback that keeps what it is sent."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, dict[str, Any]]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                collector.posts.append(
                    (self.path, self.headers.get("Content-Type", ""), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def gauges(self) -> dict[str, list[float]]:
        """Every gauge and sum data point received, by metric name."""
        out: dict[str, list[float]] = {}
        for _, _, body in self.posts:
            for resource in body.get("resourceMetrics", []):
                for scope in resource.get("scopeMetrics", []):
                    for metric in scope.get("metrics", []):
                        data = metric.get("sum") or metric.get("gauge") or {}
                        for point in data.get("dataPoints", []):
                            value = point.get("asInt", point.get("asDouble", 0))
                            out.setdefault(metric["name"], []).append(float(value))
        return out


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.server.shutdown()


async def test_metrics_are_pushed_to_the_configured_collector(collector: Collector) -> None:
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"))
    config = relay_config(origin.port) + f"""
metrics:
  otlp: {{endpoint: "http://127.0.0.1:{collector.port}/v1/metrics", interval: 0.2s}}
"""
    relay = build_relay(parse_config(config, "otlp.yaml"))
    await relay.start()
    try:
        await eventually(lambda: relay.not_ready_reason() is None)
        await eventually(lambda: collector.gauges().get("xds_relay_upstream_connected",
                                                        [])[-1:] == [1.0])
    finally:
        await relay.stop(0)
        await origin.stop()
    path, content_type, _ = collector.posts[0]
    assert (path, content_type) == ("/v1/metrics", "application/json")


def test_otlp_endpoint_must_be_an_http_url() -> None:
    text = relay_config(1) + "metrics: {otlp: {endpoint: collector:4318}}\n"
    line = text.splitlines().index("metrics: {otlp: {endpoint: collector:4318}}") + 1
    with pytest.raises(ConfigError) as error:
        parse_config(text, "r.yaml")
    assert str(error.value) == (f"r.yaml:{line}: metrics.otlp.endpoint: expected an http:// "
                                "or https:// URL, got 'collector:4318'")


def test_otlp_endpoint_without_a_path_gets_the_metrics_path() -> None:
    for endpoint in ("http://collector:4318", "http://collector:4318/"):
        config = parse_config(
            relay_config(1) + f"metrics: {{otlp: {{endpoint: {endpoint!r}}}}}\n", "r.yaml")
        assert config.metrics.otlp is not None
        assert config.metrics.otlp.endpoint == "http://collector:4318/v1/metrics"
