"""/metrics of --workers: origin-facing series from the hub, client-facing ones summed."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relay.telemetry import Metrics, new_metrics, prometheus_provider
from relay.workers.metrics import merge_metrics
from relay.xds_types import CLUSTER, ENDPOINT


def page(record: object) -> str:
    """The /metrics text of a fresh relay's instruments after ``record(metrics)``."""
    provider, registry = prometheus_provider()
    metrics = new_metrics(provider, registry)
    record(metrics)  # type: ignore[operator]
    return generate_latest(registry).decode()


def samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset((k, v) for k, v in s.labels.items()
                               if not k.startswith("otel_scope_"))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples}


def hub(metrics: Metrics) -> None:
    metrics.upstream_connected.add(1)
    metrics.upstream_responses.add(3, {"type": "Cluster", "outcome": "ack"})
    metrics.downstream_streams.add(2, {"protocol": "delta"})  # its two workers
    metrics.worker_restarts.add(1)


def worker(streams: int, latency: float) -> object:
    def record(metrics: Metrics) -> None:
        metrics.downstream_streams.add(streams, {"protocol": "delta"})
        metrics.push("delta", CLUSTER)
        metrics.push_latency.record(latency, "Cluster")
        metrics.upstream_connected.add(1)  # its stream to the hub
    return record


def test_origin_facing_series_are_the_hubs_and_client_facing_ones_the_workers_sum() -> None:
    merged = samples(merge_metrics(page(hub), [page(worker(3, 0.002)), page(worker(4, 0.2))]))
    delta = frozenset({("protocol", "delta")})
    assert merged[("xds_relay_upstream_connected", frozenset())] == 1
    assert merged[("xds_relay_upstream_responses_total",
                   frozenset({("type", "Cluster"), ("outcome", "ack")}))] == 3
    assert merged[("xds_relay_worker_restarts_total", frozenset())] == 1
    assert merged[("xds_relay_downstream_streams", delta)] == 7
    assert merged[("xds_relay_downstream_pushes_total",
                   frozenset({("protocol", "delta"), ("type", "Cluster")}))] == 2
    cluster = ("type", "Cluster")
    assert merged[("xds_relay_push_latency_seconds_count", frozenset({cluster}))] == 2
    assert merged[("xds_relay_push_latency_seconds_bucket",
                   frozenset({cluster, ("le", "0.0025")}))] == 1
    assert merged[("xds_relay_push_latency_seconds_bucket",
                   frozenset({cluster, ("le", "+Inf")}))] == 2
    assert merged[("xds_relay_push_latency_seconds_sum", frozenset({cluster}))] == 0.202


def test_a_worker_that_did_not_answer_is_left_out() -> None:
    merged = samples(merge_metrics(page(hub), []))
    assert ("xds_relay_upstream_connected", frozenset()) in merged
    assert not any(name.startswith("xds_relay_downstream_") for name, _ in merged)


def test_merged_page_has_one_help_and_type_per_family() -> None:
    def endpoints(metrics: Metrics) -> None:
        metrics.push("sotw", ENDPOINT)

    text = merge_metrics(page(hub), [page(endpoints), page(endpoints)]).decode()
    types = [line for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
    assert "# TYPE xds_relay_downstream_pushes_total counter" in types
