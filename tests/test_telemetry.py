"""What ``/metrics`` labels its series with, and the build-info series."""

from __future__ import annotations

import asyncio
import gc
import platform
from importlib import metadata

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relay.clock import ended
from relay.telemetry import new_metrics, prometheus_provider, watch_gc_pauses


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


async def test_each_gc_collection_is_recorded_by_generation_while_watched() -> None:
    provider, registry = prometheus_provider()
    metrics = new_metrics(provider, registry)
    # a full collection 30 ms, a young one 2 ms (and ticks for one more)
    ticks = iter([10.0, 10.03, 20.0, 20.002, 30.0, 30.001])
    collecting = gc.isenabled()
    gc.disable()  # (only the collections below: none started by allocations)
    try:
        watcher = asyncio.create_task(watch_gc_pauses(metrics.gc_pauses, lambda: next(ticks)))
        await asyncio.sleep(0)  # (installed)
        gc.collect(2)
        gc.collect(0)
        watcher.cancel()
        await ended(watcher)
        gc.collect(1)  # not recorded: no longer watched
    finally:
        if collecting:
            gc.enable()
    text = generate_latest(registry).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples
               if s.name.startswith("xds_relay_gc_pause_seconds")}
    assert samples[("xds_relay_gc_pause_seconds_count", (("generation", "2"),))] == 1
    assert samples[("xds_relay_gc_pause_seconds_bucket", (("generation", "2"), ("le", "0.025")))] \
        == 0
    assert samples[("xds_relay_gc_pause_seconds_bucket", (("generation", "2"), ("le", "0.05")))] \
        == 1
    assert samples[("xds_relay_gc_pause_seconds_bucket", (("generation", "0"), ("le", "0.001")))] \
        == 0
    assert samples[("xds_relay_gc_pause_seconds_bucket", (("generation", "0"), ("le", "0.0025")))] \
        == 1
    assert ("xds_relay_gc_pause_seconds_count", (("generation", "1"),)) not in samples
    assert round(samples[("xds_relay_gc_pause_seconds_sum", (("generation", "2"),))], 6) == 0.03
