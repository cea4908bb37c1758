"""Metrics: every instrument the relay records, named in one place.

Instruments come from an OpenTelemetry ``MeterProvider``; :func:`prometheus_provider`
makes one whose readings are served at ``/metrics``. Labels are bounded: type
URLs (short names), wire protocol (sotw or delta), outcome. Never a client or resource name.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import inspect
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import HistogramMetricFamily

from relay.version import build_info
from relay.xds_types import short_name

# Seconds; from a same-host push (sub-millisecond) to a large fan-out (seconds).
PUSH_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                        1.0, 2.5, 5.0, 10.0)
# Seconds the event loop ran late: a few ms is a busy loop, 100 ms+ is every
# client waiting (a huge request decoded, a collection of a large heap).
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Seconds one cyclic garbage collection held the process (the event loop with
# it): a young one a few ms; one walking 50,000 cached resources ~50 ms on a
# slow core; a full one of a big heap, more.
GC_PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Seconds; a Redis round trip on the same host (sub-millisecond) to a large
# batch over a slow link.
SNAPSHOT_WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                          2.5, 5.0, 10.0)
# Streams per node group: one client to a zone's whole fleet.
GROUP_CLIENT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
# How often the loop's lag is sampled.
LOOP_LAG_INTERVAL = 0.1
#: ``metrics.otlp.interval`` when not configured: seconds between OTLP pushes.
DEFAULT_OTLP_INTERVAL = 15.0


class HotCounter:
    """A monotonic counter for per-message paths, read by the exporter on scrape.

    ``Counter.add`` of the SDK hashes its attributes on every call, which costs
    more than the rest of a push; this keeps a plain tally per label tuple and
    reports it through an observable counter instead.
    """

    def __init__(self, meter: Meter, name: str, description: str,
                 label_names: tuple[str, ...]) -> None:
        self.label_names = label_names
        self.counts: Counter[tuple[str, ...]] = Counter()
        self._register(meter)(name, callbacks=[self._observe], description=description)

    @staticmethod
    def _register(meter: Meter) -> Callable[..., object]:
        """The meter's call that makes this kind of observable instrument."""
        return meter.create_observable_counter

    def add(self, *labels: str, amount: int = 1) -> None:
        self.counts[labels] += amount

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        for labels, value in list(self.counts.items()):
            yield Observation(value, dict(zip(self.label_names, labels, strict=True)))


class HotGauge(HotCounter):
    """:class:`HotCounter` that also goes down (an up-down counter): how many
    of something there are now, counted where they come and go.

    The SDK's ``UpDownCounter.add`` hashes its attributes on every call as
    ``Counter.add`` does: a storm of 2,000 streams spent 4.5 % of its samples
    there, two calls a stream.
    """

    @staticmethod
    def _register(meter: Meter) -> Callable[..., object]:
        return meter.create_observable_up_down_counter


class HotHistogram:
    """A histogram for per-message paths: plain tallies, served on ``/metrics``.

    The SDK's ``Histogram.record`` added a quarter to the relay's CPU per
    stream in ``benchmarks.fanout`` (1000 streams, one record per push); this
    bisects into fixed buckets and counts per label tuple, and reports as a
    Prometheus collector on the relay's registry. Being outside the SDK, it
    is not part of the OTLP push.
    """

    def __init__(self, name: str, description: str, label_names: tuple[str, ...],
                 bounds: tuple[float, ...]) -> None:
        self.name = name
        self.description = description
        self.label_names = label_names
        self.bounds = bounds
        # per label tuple: a count per bucket (the last is +Inf), then the sum
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def record(self, value: float, *labels: str) -> None:
        counts = self._counts.get(labels)
        if counts is None:
            counts = self._counts[labels] = [0] * (len(self.bounds) + 1)
        counts[bisect.bisect_left(self.bounds, value)] += 1
        self._sums[labels] = self._sums.get(labels, 0.0) + value

    def collect(self) -> Iterable[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.description,
                                       labels=list(self.label_names))
        for labels, counts in list(self._counts.items()):
            buckets, total = [], 0
            for bound, count in zip((*map(str, self.bounds), "+Inf"), counts, strict=True):
                total += count
                buckets.append((bound, float(total)))
            family.add_metric(list(labels), buckets, self._sums[labels])
        yield family


class SizesHistogram:
    """A histogram of sizes read at scrape time (one observation per thing
    counted, e.g. the streams of each node group): a distribution over things
    whose number is unbounded, without a label per thing."""

    def __init__(self, name: str, description: str, bounds: tuple[float, ...],
                 sizes: Callable[[], Iterable[int]]) -> None:
        self.name, self.description, self.bounds, self._sizes = name, description, bounds, sizes

    def collect(self) -> Iterable[HistogramMetricFamily]:
        counts = [0] * (len(self.bounds) + 1)
        total = 0
        for size in self._sizes():
            counts[bisect.bisect_left(self.bounds, size)] += 1
            total += size
        buckets, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), counts, strict=True):
            running += count
            buckets.append((bound, float(running)))
        family = HistogramMetricFamily(self.name, self.description)
        family.add_metric([], buckets, float(total))
        yield family


class Metrics:
    """The relay's instruments."""

    def __init__(self, meter: Meter, registry: CollectorRegistry | None = None) -> None:
        self._meter = meter
        self._add_downstream(meter)
        self._add_upstream(meter)
        self._add_latencies(registry)
        self.worker_restarts = meter.create_counter(
            "xds_relay_worker_restarts",
            description="Worker processes restarted after they exited (run --workers)")
        self._add_snapshot(meter)
        info = build_info()
        self.observe("xds_relay_build_info",
                     "1, labelled with the relay's version and the Python and grpcio it runs on",
                     tuple(info), lambda: {tuple(info.values()): 1})

    def _add_downstream(self, meter: Meter) -> None:
        """What clients' streams do: connected, pushed to, ACKing, refused."""
        self.downstream_streams = HotGauge(
            meter, "xds_relay_downstream_streams", "Connected downstream xDS streams",
            ("protocol",))
        self.downstream_pushes = HotCounter(
            meter, "xds_relay_downstream_pushes", "Responses sent to downstream clients",
            ("protocol", "type"))
        self.downstream_acks = HotCounter(
            meter, "xds_relay_downstream_acks", "Downstream ACKs received", ("protocol", "type"))
        self.downstream_nacks = HotCounter(
            meter, "xds_relay_downstream_nacks", "Downstream NACKs received",
            ("protocol", "type"))
        self.downstream_coalesced = HotCounter(
            meter, "xds_relay_downstream_coalesced_updates",
            "Updates to a client superseded by a newer one before they were sent",
            ("protocol", "type"))
        self.downstream_rejected = meter.create_counter(
            "xds_relay_downstream_rejected_streams",
            description="Downstream streams ended for a protocol error")
        self.downstream_refused = meter.create_counter(
            "xds_relay_downstream_refused_streams",
            description="Downstream calls refused by server.authorization, by reason "
                        "(identity, node_binding, debug)")
        self.downstream_limited = meter.create_counter(
            "xds_relay_downstream_limited_streams",
            description="Downstream streams refused or ended for going beyond a limit, by "
                        "limit (the limits.* key)")

    def _add_upstream(self, meter: Meter) -> None:
        """Where resources come from: the origin stream, and what it or the files sent."""
        self.upstream_connected = meter.create_up_down_counter(
            "xds_relay_upstream_connected", description="1 while the origin stream is up")
        self.upstream_reconnects = meter.create_counter(
            "xds_relay_upstream_reconnects", description="Origin streams opened after the first")
        self.upstream_responses = meter.create_counter(
            "xds_relay_upstream_responses", description="Origin responses by outcome")
        self.upstream_server = meter.create_up_down_counter(
            "xds_relay_upstream_server",
            description="1 for the server each origin is followed at, 0 for its others (by "
                        "address, and fallback: 0 the primary, n the n-th fallback server)")
        self.variant_conflicts = meter.create_counter(
            "xds_relay_variant_conflicts",
            description="Lookups where several variants matched one client (an origin error)")
        self.source_errors = meter.create_counter(
            "xds_relay_source_errors", description="Unusable files or origin responses")

    def _add_latencies(self, registry: CollectorRegistry | None) -> None:
        """The histograms recorded on hot paths, served from ``registry`` (not pushed)."""
        self.push_latency = HotHistogram(
            "xds_relay_push_latency_seconds",
            "From receiving an origin update to sending it to a client, per pushed response",
            ("type",), PUSH_LATENCY_BUCKETS)
        self.loop_lag = HotHistogram(
            "xds_relay_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 100 ms: the time every client "
            "waited for this process to get to it", (), LOOP_LAG_BUCKETS)
        self.gc_pauses = HotHistogram(
            "xds_relay_gc_pause_seconds",
            "How long each cyclic garbage collection held the process, by the oldest "
            "generation it collected (0 young, 2 full): a cause of event loop lag",
            ("generation",), GC_PAUSE_BUCKETS)
        if registry is not None:
            registry.register(self.push_latency)
            registry.register(self.loop_lag)
            registry.register(self.gc_pauses)

    def _add_snapshot(self, meter: Meter) -> None:
        """The persisted snapshot: writes, and what a start restored of it."""
        self.snapshot_writes = meter.create_counter(
            "xds_relay_snapshot_writes",
            description="Writes of the persisted snapshot, by outcome (ok, failed)")
        self.snapshot_write_seconds = meter.create_histogram(
            "xds_relay_snapshot_write_seconds", unit="s",
            description="Time to write one batch of changes to the snapshot store",
            # the SDK's default buckets are for milliseconds (5 to 10,000)
            explicit_bucket_boundaries_advisory=SNAPSHOT_WRITE_BUCKETS)
        self.snapshot_restored = meter.create_counter(
            "xds_relay_snapshot_restored_resources",
            description="Resource variants loaded from the snapshot at start")
        self.snapshot_skipped = meter.create_counter(
            "xds_relay_snapshot_skipped",
            description="Snapshot entries not loaded, by reason (expired, corrupt, format)")

    def push(self, protocol: str, type_url: str) -> None:
        self.downstream_pushes.add(protocol, short_name(type_url))

    def observe_state(self, cache_counts: Callable[[], Mapping[str, tuple[int, int]]],
                      downstream_counts: Callable[[], Mapping[tuple[str, ...], int]],
                      upstream_counts: Callable[[], Mapping[tuple[str, str], int]] | None
                      ) -> None:
        """The gauges read from the relay's state: ``cache_counts`` gives (names,
        variants) per type URL, ``downstream_counts`` streams per (protocol, short
        type), ``upstream_counts`` locators per (origin, type URL) (None for a file
        source).

        They may be called from the OTLP exporter's thread: each takes a
        snapshot of what it counts rather than iterating live collections.
        """
        def per_type(counts: Mapping[str, int]) -> dict[tuple[str, ...], int]:
            return {(short_name(type_url),): n for type_url, n in counts.items()}

        self.observe("xds_relay_cache_resources", "Resource names cached", ("type",),
                     lambda: per_type({t: n for t, (n, _) in cache_counts().items()}))
        self.observe("xds_relay_cache_variants",
                     "Resource variants cached (a name without variants counts one)",
                     ("type",),
                     lambda: per_type({t: v for t, (_, v) in cache_counts().items()}))
        self.observe("xds_relay_downstream_subscriptions",
                     "Downstream streams subscribed to a type", ("protocol", "type"),
                     downstream_counts)
        if upstream_counts is not None:
            self.observe("xds_relay_upstream_subscriptions",
                         "Resource locators subscribed on each origin's stream (a wildcard "
                         "counts one)", ("origin", "type"),
                         lambda: {(origin, short_name(type_url)): n
                                  for (origin, type_url), n in upstream_counts().items()})

    def observe_node_groups(self, sizes: Callable[[], list[int]],
                            registry: CollectorRegistry | None) -> None:
        """The node groups open (``sizes``: the streams each serves): how many, and
        how many streams each serves as a histogram (never a label per group)."""
        self.observe("xds_relay_node_groups",
                     "Node groups open (upstream.node_groups), each with its own origin streams",
                     (), lambda: {(): len(sizes())})
        if registry is not None:
            registry.register(SizesHistogram(
                "xds_relay_node_group_clients",
                "Streams served per open node group, one observation per group, at scrape "
                "time", GROUP_CLIENT_BUCKETS, sizes))

    def observe(self, name: str, description: str, label_names: tuple[str, ...],
                read: Callable[[], Mapping[tuple[str, ...], int]]) -> None:
        """A gauge read from the relay's state at scrape time (``read`` gives
        a value per label tuple), for what is cheaper to count than to track."""
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            for labels, value in read().items():
                yield Observation(value, dict(zip(label_names, labels, strict=True)))

        self._meter.create_observable_gauge(name, callbacks=[callback], description=description)


async def watch_loop_lag(histogram: HotHistogram,
                         interval: float = LOOP_LAG_INTERVAL) -> None:
    """Record into ``histogram``, every ``interval``, how late the running
    loop woke a timer: what any work that holds the loop costs every client.

    The loop's own clock, not an injected one: this measures the process.
    """
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        histogram.record(max(0.0, loop.time() - due))


async def watch_gc_pauses(histogram: HotHistogram,
                          clock: Callable[[], float] = time.perf_counter) -> None:
    """Record into ``histogram`` how long each cyclic garbage collection takes,
    by generation, until cancelled (a ``gc.callbacks`` entry meanwhile).

    The relay collects rarely (:mod:`relay.runtime`), so each collection
    walks more: what one costs shows here, beside the loop's lag. ``clock``:
    the process's own, as for :func:`watch_loop_lag` (tests give another).
    """
    started = 0.0

    def timed(phase: str, info: dict[str, int]) -> None:
        nonlocal started
        if phase == "start":
            started = clock()
        else:
            histogram.record(clock() - started, str(info["generation"]))

    gc.callbacks.append(timed)
    try:
        await asyncio.Event().wait()
    finally:
        gc.callbacks.remove(timed)


def prometheus_provider(otlp_endpoint: str | None = None,
                        otlp_interval: float = DEFAULT_OTLP_INTERVAL
                        ) -> tuple[MeterProvider, CollectorRegistry]:
    """A meter provider whose readings a private Prometheus registry serves,
    and, with ``otlp_endpoint``, are also pushed there every ``otlp_interval``
    seconds (OTLP/HTTP, JSON).

    The registry is private, so that several relays in one process (tests,
    the demo) keep apart.
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics.export import MetricReader

    registry = CollectorRegistry()
    # The series every Prometheus user expects of a process (process_*: CPU,
    # memory, file descriptors; python_*: the collector's work and the version).
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    readers: list[MetricReader] = [PrometheusMetricReader(**_reader_options(registry))]
    if otlp_endpoint is not None:
        # The JSON exporter, not the protobuf one: that one needs the
        # opentelemetry-proto package, whose modules clash with the older
        # copies xds-protos ships under the same names.
        from opentelemetry.exporter.otlp.json.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=otlp_endpoint),
            export_interval_millis=otlp_interval * 1000))
    return SdkMeterProvider(metric_readers=readers), registry


def _reader_options(registry: CollectorRegistry) -> dict[str, Any]:
    """The Prometheus reader's options: the relay's registry, and no labels
    of the exporter's own. Its newer versions put ``otel_scope_name``,
    ``otel_scope_version`` and ``otel_scope_schema_url`` on every series
    unless told not to (older ones neither do nor take the option)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    options: dict[str, Any] = {"disable_target_info": True, "registry": registry}
    if "scope_info_enabled" in inspect.signature(PrometheusMetricReader).parameters:
        options["scope_info_enabled"] = False
    return options


def new_metrics(provider: MeterProvider | None = None,
                registry: CollectorRegistry | None = None) -> Metrics:
    """Instruments from ``provider`` (a no-op provider when none is given)."""
    if provider is None:
        from opentelemetry.metrics import NoOpMeterProvider

        provider = NoOpMeterProvider()
    return Metrics(provider.get_meter("xds-relay"), registry)
