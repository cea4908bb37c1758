"""``/metrics`` of a relay run with ``--workers``: one relay's series, from several processes.

The hub's own series say how the origin stream and the cache are; its
"downstream" series would count the workers, not the clients. The workers'
downstream series count the clients, but their "upstream" series describe
their streams to the hub. So the merged page takes the origin-facing
families (``xds_relay_upstream_*``, ``xds_relay_cache_*``,
``xds_relay_source_*`` and the hub's ``xds_relay_worker_*``) from the hub, and
every other family summed over the workers, sample by sample (gauges,
counters and histogram buckets all add up). Names and labels are those of a
single-process relay, so dashboards and alerts need no change.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

__all__ = ["HUB_FAMILIES", "merge_metrics"]

#: Family name prefixes served from the hub alone.
HUB_FAMILIES = ("xds_relay_upstream_", "xds_relay_cache_", "xds_relay_source_",
                "xds_relay_worker_")


def merge_metrics(hub: str, workers: Sequence[str]) -> bytes:
    """One Prometheus text page from the hub's page and each worker's."""
    families = [f for f in text_string_to_metric_families(hub) if _from_hub(f.name)]
    summed: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for page in workers:
        for family in text_string_to_metric_families(page):
            if _from_hub(family.name):
                continue
            if family.name not in summed:
                summed[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            totals = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                totals[key] = totals.get(key, 0.0) + sample.value
    for name, family in summed.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
        families.append(family)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    return generate_latest(registry)


def _from_hub(name: str) -> bool:
    return name.startswith(HUB_FAMILIES)


class _Fixed(Collector):
    """A collector that reports the families it was given."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
