"""What ``/metrics`` labels its series with, and the build-info series."""

from __future__ import annotations

import platform
from importlib import metadata

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relay.telemetry import new_metrics, prometheus_provider


def _scraped() -> list[tuple[str, dict[str, str], float]]:
    provider, registry = prometheus_provider()
    metrics = new_metrics(provider, registry)
    metrics.downstream_rejected.add(1, {"protocol": "sotw"})
    metrics.downstream_nacks.add("rest", "Cluster")
    text = generate_latest(registry).decode()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def test_no_series_carries_the_exporters_scope_labels() -> None:
    samples = _scraped()
    assert ("xds_relay_downstream_rejected_streams_total", {"protocol": "sotw"}, 1.0) in samples
    assert ("xds_relay_downstream_nacks_total", {"protocol": "rest", "type": "Cluster"},
            1.0) in samples
    assert [(name, labels) for name, labels, _ in samples
            if any(label.startswith("otel_scope_") for label in labels)] == []


def test_build_info_is_one_labelled_with_the_versions() -> None:
    assert [(labels, value) for name, labels, value in _scraped()
            if name == "xds_relay_build_info"] == [
        ({"version": metadata.version("xds-relay"), "python": platform.python_version(),
          "grpc": metadata.version("grpcio")}, 1.0)]


def test_the_streams_gauge_goes_down_to_zero_as_streams_leave_and_is_a_gauge() -> None:
    provider, registry = prometheus_provider()
    metrics = new_metrics(provider, registry)
    for protocol in ("delta", "delta", "sotw"):
        metrics.downstream_streams.add(protocol)
    metrics.downstream_streams.add("delta", amount=-1)
    metrics.downstream_streams.add("sotw", amount=-1)
    families = {family.name: family for family in
                text_string_to_metric_families(generate_latest(registry).decode())}
    streams = families["xds_relay_downstream_streams"]
    assert streams.type == "gauge"
    assert sorted((s.labels["protocol"], s.value) for s in streams.samples) == [
        ("delta", 1.0), ("sotw", 0.0)]
