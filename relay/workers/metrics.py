"""``/metrics`` of a relay run with ``--workers``: one page from several processes.

The hub's own series say how the origin stream and the cache are; its
"downstream" series would count the workers, not the clients. The workers'
downstream series count the clients, but their "upstream" series describe
their streams to the hub. So the page takes the origin-facing families
(``xds_relay_upstream_*``, ``xds_relay_cache_*``, ``xds_relay_source_*`` and
the hub's ``xds_relay_worker_*``) from the hub, and every other family from
the workers, each sample labelled with its ``worker`` (1..N). The series
of a process as such (``process_*``, ``python_*``, the event loop's lag)
come from every process: the hub's labelled ``worker="hub"``.

Labelled rather than summed: a worker that restarts starts its counters
from zero, which Prometheus takes as a reset of that worker's series alone;
in a sum it would read as a drop of the whole counter. Queries that sum
(``sum(rate(xds_relay_downstream_pushes_total[1m]))``) read the same as for
a single process.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

__all__ = ["HUB_FAMILIES", "HUB_WORKER", "PROCESS_FAMILIES", "merge_metrics"]

#: Family name prefixes served from the hub alone.
HUB_FAMILIES = ("xds_relay_upstream_", "xds_relay_cache_", "xds_relay_source_",
                "xds_relay_worker_", "xds_relay_ready")
#: Family name prefixes of what each process measures of itself.
PROCESS_FAMILIES = ("process_", "python_", "xds_relay_event_loop_")
#: The ``worker`` label of the hub's own process series.
HUB_WORKER = "hub"


def merge_metrics(hub: str, workers: Mapping[int, str]) -> bytes:
    """One Prometheus text page from the hub's page and each worker's, by worker index
    (a worker that did not answer is left out)."""
    families: list[Metric] = []
    labelled: dict[str, Metric] = {}

    def label(family: Metric, worker: str) -> None:
        merged = labelled.get(family.name)
        if merged is None:
            merged = labelled[family.name] = Metric(family.name, family.documentation,
                                                    family.type)
        for sample in family.samples:
            merged.add_sample(sample.name, {**sample.labels, "worker": worker}, sample.value)

    for family in text_string_to_metric_families(hub):
        if _from_hub(family.name):
            families.append(family)
        elif family.name.startswith(PROCESS_FAMILIES):
            label(family, HUB_WORKER)
    for index, page in sorted(workers.items()):
        for family in text_string_to_metric_families(page):
            if not _from_hub(family.name):
                label(family, str(index))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed([*families, *labelled.values()]))
    return generate_latest(registry)


def _from_hub(name: str) -> bool:
    return name.startswith(HUB_FAMILIES)


class _Fixed(Collector):
    """A collector that reports the families it was given."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
