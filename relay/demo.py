"""``xds-relay demo``: an origin and a relay on loopback, and a client served through them.

The origin is itself a relay in file-source mode, serving a directory of
resource files over Delta ADS; the zone relay follows it over a real
Delta-ADS stream, exactly as it would follow istiod or go-control-plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from relay.app import build_relay
from relay.clock import within
from relay.config import parse_config
from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, message_class, short_name


def _origin_config(resources: Path, port: int) -> str:
    return f"""
node: {{id: demo-origin}}
server: {{address: "127.0.0.1:{port}"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{files: "{resources}", poll_interval: 0.5s}}
"""


def _relay_config(port: int, admin_port: int, origin_port: int) -> str:
    return f"""
node: {{id: demo-relay-zone-a, cluster: xds-relay, locality: {{zone: demo-a}}}}
server: {{address: "127.0.0.1:{port}"}}
admin: {{address: "127.0.0.1:{admin_port}"}}
upstream: {{address: "127.0.0.1:{origin_port}", backoff: {{initial: 0.5s, max: 5s}},
            linger: 5m}}
"""


async def show_client_served(port: int) -> list[str]:
    """Be an ADS client of the relay for a moment; return a line per resource received."""
    lines: list[str] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
        node = {"id": "demo-client", "cluster": "demo"}
        await call.write(discovery_pb2.DiscoveryRequest(type_url=CLUSTER, node=node))
        await call.write(discovery_pb2.DiscoveryRequest(type_url=LISTENER, node=node))
        clusters: list[str] = []
        for _ in range(2):
            response = await within(call.read(), 10)
            names = _names(response)
            if response.type_url == CLUSTER:
                clusters = names
            lines.append(f"{short_name(response.type_url)}: {', '.join(names) or '(none)'}"
                         f"  [version_info {response.version_info}]")
        await call.write(discovery_pb2.DiscoveryRequest(type_url=ENDPOINT,
                                                        resource_names=clusters))
        response = await within(call.read(), 10)
        lines.append(f"{short_name(response.type_url)}: {', '.join(_names(response))}")
        call.cancel()
    return lines


def _names(response: discovery_pb2.DiscoveryResponse) -> list[str]:
    out = []
    for body in response.resources:
        cls = message_class(body.type_url)
        msg = cls.FromString(body.value) if cls else None
        out.append(getattr(msg, "name", "") or getattr(msg, "cluster_name", "") or "?")
    return out


async def run_demo(resources: Path, port: int, admin_port: int, origin_port: int,
                   once: bool = False) -> int:
    """Start the origin and the relay, show a client served, run until interrupted."""
    directory = resources.resolve()  # noqa: ASYNC240 (once, before serving)
    origin = build_relay(parse_config(_origin_config(directory, origin_port), "<demo origin>"))
    await origin.start()
    try:
        # The origin's real port: the relay follows it even when 0 asked for any port.
        relay = build_relay(parse_config(_relay_config(port, admin_port, origin.xds_port),
                                         "<demo relay>"))
        await relay.start()
    except BaseException:
        await origin.stop(0)
        raise
    try:
        await within(relay.upstream.synced_event.wait(), 10)  # type: ignore[union-attr]
        print(f"""
xds-relay demo is running
  origin (files in {resources}/): Delta ADS on 127.0.0.1:{origin.xds_port}
  relay:  xDS clients connect to 127.0.0.1:{relay.xds_port}
          (ADS SotW and delta, and the per-type discovery services)
  console: http://127.0.0.1:{relay.admin_port}/  (open it in a browser)
  admin:  http://127.0.0.1:{relay.admin_port}/metrics  (Prometheus scrape)
          http://127.0.0.1:{relay.admin_port}/config_dump  /clients  /ready  /healthz
""", flush=True)
        for line in await show_client_served(relay.xds_port):
            print(f"  a client received through the relay -> {line}", flush=True)
        if once:
            return 0
        print(f"\nEdit the files in {resources}/ and clients get the change. Ctrl-C to stop.",
              flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        return 0
    finally:
        await relay.stop(0.5)
        await origin.stop(0.5)
