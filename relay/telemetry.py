"""Metrics: every instrument the relay records, named in one place.

Instruments come from an OpenTelemetry ``MeterProvider``; :func:`prometheus_provider`
makes one whose readings are served at ``/metrics``. Labels are bounded: type
URLs (short names), stream variant, outcome. Never a client or resource name.
"""

from __future__ import annotations

from opentelemetry.metrics import Meter, MeterProvider
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from prometheus_client import CollectorRegistry

from relay.xds_types import short_name


class Metrics:
    """The relay's instruments."""

    def __init__(self, meter: Meter) -> None:
        self.downstream_streams = meter.create_up_down_counter(
            "xds_relay_downstream_streams", description="Connected downstream xDS streams")
        self.downstream_pushes = meter.create_counter(
            "xds_relay_downstream_pushes", description="Responses sent to downstream clients")
        self.downstream_acks = meter.create_counter(
            "xds_relay_downstream_acks", description="Downstream ACKs received")
        self.downstream_nacks = meter.create_counter(
            "xds_relay_downstream_nacks", description="Downstream NACKs received")
        self.downstream_rejected = meter.create_counter(
            "xds_relay_downstream_rejected_streams",
            description="Downstream streams ended for a protocol error")
        self.upstream_connected = meter.create_up_down_counter(
            "xds_relay_upstream_connected", description="1 while the origin stream is up")
        self.upstream_reconnects = meter.create_counter(
            "xds_relay_upstream_reconnects", description="Origin streams opened after the first")
        self.upstream_responses = meter.create_counter(
            "xds_relay_upstream_responses", description="Origin responses by outcome")
        self.upstream_subscriptions = meter.create_up_down_counter(
            "xds_relay_upstream_subscriptions", description="Names subscribed upstream")
        self.source_errors = meter.create_counter(
            "xds_relay_source_errors", description="Unusable files or origin responses")

    def push(self, variant: str, type_url: str) -> None:
        self.downstream_pushes.add(1, {"variant": variant, "type": short_name(type_url)})


def prometheus_provider() -> tuple[MeterProvider, CollectorRegistry]:
    """A meter provider whose readings a private Prometheus registry serves.

    Private, so that several relays in one process (tests, the demo) keep apart.
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(disable_target_info=True, registry=registry)
    return SdkMeterProvider(metric_readers=[reader]), registry


def new_metrics(provider: MeterProvider | None = None) -> Metrics:
    """Instruments from ``provider`` (a no-op provider when none is given)."""
    if provider is None:
        from opentelemetry.metrics import NoOpMeterProvider

        provider = NoOpMeterProvider()
    return Metrics(provider.get_meter("xds-relay"))
