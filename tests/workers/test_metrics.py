"""/metrics of --workers: origin-facing series from the hub, client-facing ones per worker."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relay.telemetry import Metrics, new_metrics, prometheus_provider
from relay.workers.metrics import merge_metrics
from relay.xds_types import CLUSTER

Labels = frozenset[tuple[str, str]]


def page(record: Callable[[Metrics], None]) -> str:
    """The /metrics text of a fresh relay's instruments after ``record(metrics)``."""
    provider, registry = prometheus_provider()
    record(new_metrics(provider, registry))
    return generate_latest(registry).decode()


def samples(text: bytes) -> dict[tuple[str, Labels], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples}


def labels(**pairs: str) -> Labels:
    return frozenset(pairs.items())


def hub(metrics: Metrics) -> None:
    metrics.upstream_connected.add(1)
    metrics.upstream_responses.add(3, {"type": "Cluster", "outcome": "ack"})
    metrics.downstream_streams.add("delta", amount=2)  # its two workers
    metrics.worker_restarts.add(1)


def worker(streams: int, latency: float) -> Callable[[Metrics], None]:
    def record(metrics: Metrics) -> None:
        metrics.downstream_streams.add("delta", amount=streams)
        metrics.push("delta", CLUSTER)
        metrics.push_latency.record(latency, "Cluster")
        metrics.upstream_connected.add(1)  # its stream to the hub
    return record


def test_origin_facing_series_are_the_hubs_and_client_facing_ones_each_workers() -> None:
    merged = samples(merge_metrics(page(hub), {1: page(worker(3, 0.002)),
                                               2: page(worker(4, 0.2))}))
    assert merged[("xds_relay_upstream_connected", labels())] == 1
    assert merged[("xds_relay_upstream_responses_total",
                   labels(type="Cluster", outcome="ack"))] == 3
    assert merged[("xds_relay_worker_restarts_total", labels())] == 1
    streams = {key: value for key, value in merged.items()
               if key[0] == "xds_relay_downstream_streams"}
    assert streams == {("xds_relay_downstream_streams", labels(protocol="delta", worker="1")): 3,
                       ("xds_relay_downstream_streams", labels(protocol="delta", worker="2")): 4}
    assert merged[("xds_relay_downstream_pushes_total",
                   labels(protocol="delta", type="Cluster", worker="2"))] == 1
    assert merged[("xds_relay_push_latency_seconds_bucket",
                   labels(type="Cluster", le="0.0025", worker="1"))] == 1
    assert merged[("xds_relay_push_latency_seconds_bucket",
                   labels(type="Cluster", le="0.0025", worker="2"))] == 0
    assert merged[("xds_relay_push_latency_seconds_count", labels(type="Cluster", worker="2"))] \
        == 1


def test_a_worker_that_did_not_answer_is_left_out() -> None:
    merged = samples(merge_metrics(page(hub), {2: page(worker(4, 0.2))}))
    assert ("xds_relay_upstream_connected", labels()) in merged
    workers = {dict(key[1]).get("worker") for key in merged
               if key[0].startswith("xds_relay_downstream_")}
    assert workers == {"2"}


def test_merged_page_has_one_help_and_type_per_family() -> None:
    text = merge_metrics(page(hub), {1: page(worker(1, 0.1)), 2: page(worker(1, 0.1))})
    types = [line for line in text.decode().splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
    assert "# TYPE xds_relay_downstream_pushes_total counter" in types
    assert "# TYPE xds_relay_push_latency_seconds histogram" in types


def test_process_series_come_from_every_process_the_hubs_labelled_hub() -> None:
    merged = samples(merge_metrics(page(hub), {1: page(worker(1, 0.1)),
                                               2: page(worker(1, 0.1))}))
    rss = {dict(key[1])["worker"] for key in merged
           if key[0] == "process_resident_memory_bytes"}
    assert rss == {"hub", "1", "2"}
    collections = {dict(key[1])["worker"] for key in merged
                   if key[0] == "python_gc_collections_total"}
    assert collections == {"hub", "1", "2"}


def test_readiness_is_the_hubs_alone() -> None:
    def ready(value: int) -> Callable[[Metrics], None]:
        def record(metrics: Metrics) -> None:
            metrics.observe("xds_relay_ready", "ready", (), lambda: {(): value})
        return record

    merged = samples(merge_metrics(page(ready(0)), {1: page(ready(1))}))
    assert {key: v for key, v in merged.items() if key[0] == "xds_relay_ready"} == \
        {("xds_relay_ready", labels()): 0}
