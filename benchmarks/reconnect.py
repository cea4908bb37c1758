"""Reconnect benchmark: an istiod-like origin resending everything, and an outage.

A relay runs as its own process (``xds-relay run``) behind an origin shaped
like istiod (:class:`tests.istiod.IstiodOrigin`: no per-resource versions,
``initial_resource_versions`` ignored, everything resent on every new
stream). Worker processes open N downstream streams (half delta, half SotW,
one connection each) to ClusterLoadAssignments: each subscribes ``ep-0`` and
99 others, so that the relay caches all R resources and each is held by
about ``N * 100 / R`` clients. Every response is decoded and ACKed.

* **Resend** (``--rounds`` times): the origin ends its streams gracefully, as
  istiod does at its maximum connection age; the relay reconnects and gets
  all R resources again, unchanged. Reported: downstream responses the
  clients received (must be 0), the relay's CPU time (all threads, and its
  main thread's, the event loop's: what clients wait on) from the origin's end
  of the stream until the resend is ACKed plus one quiet second, and, as the
  baseline, the CPU a bare ``grpc.aio`` client (its own process, subscribed
  to the same R names on the same origin) spends receiving, decoding and
  ACKing the same resend in the same window; and the worst event loop lag
  the relay sampled meanwhile (its ``xds_relay_event_loop_lag_seconds``,
  every 100 ms, to its bucket: a step that holds the loop is caught when a
  sample falls in it) and its longest cyclic garbage collection
  (``xds_relay_gc_pause_seconds``, where the tree has it).
* **Outage** (``--outages`` times): the origin goes away for ``--outage``
  seconds, and comes back with ``ep-0`` changed. Reported: the time from the
  origin's return until every client has the change, and the relay's
  backoff step in force then (from its log), which should bound it plus 1 s.

The relay runs from ``--relay-src`` (default: this checkout). Given more
than once, each tree is measured in turn (its own relay process and clients,
on the same origin and bare client), ``--repeat`` times, alternating: a
before and an after in one invocation, minutes apart, not hours.

Usage: ``python -m benchmarks.reconnect [--clients 1000] [--resources 10000]
[--rounds 3] [--outages 3] [--outage 20] [--origin-versions]
[--relay-src DIR ...] [--repeat 1]``
Writes a table to stdout and JSON to ``benchmarks/results/reconnect.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import re
import statistics
import tempfile
import time
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from benchmarks.fleet import lag_buckets, lag_text, worst_lag
from benchmarks.processes import cpu_seconds, main_thread_cpu_seconds, relay_process, workers
from benchmarks.report import revision
from relay.xds_types import ENDPOINT
from tests.builders import endpoints
from tests.harness import eventually
from tests.istiod import IstiodOrigin

DELTA_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
SOTW_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
WATCHED = "ep-0"
PER_CLIENT = 100
BARE = ("x-bench-client", "bare")


def stride_of(clients: int, total: int) -> int:
    """How far apart two clients' first names are: 10, or more where 10 would
    leave names nobody holds (fewer clients than a tenth of the names)."""
    stride = max(10, -(-total // clients))
    if stride >= PER_CLIENT:
        raise SystemExit(f"{clients} clients of {PER_CLIENT} names cannot hold {total} "
                         f"resources: at least {-(-total // (PER_CLIENT - 1))} clients")
    return stride


def names_of_client(index: int, total: int, stride: int = 10) -> list[str]:
    """``ep-0`` and 99 names after ``index * stride``: together, every name,
    each held by several clients (see :func:`stride_of`)."""
    return [WATCHED, *(f"ep-{(index * stride + k) % total}" for k in range(1, PER_CLIENT))]


def first_port(body: bytes) -> int:
    cla = endpoint_pb2.ClusterLoadAssignment.FromString(body)
    return int(cla.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value)


# -- client workers (separate processes) ----------------------------------------


def worker_main(conn: Connection, first: int, count: int, target: str, total: int,
                stride: int) -> None:
    asyncio.run(_worker(conn, first, count, target, total, stride))


class _Client:
    """One downstream stream: reads, decodes, ACKs, counts; notes when ``ep-0``
    arrives with the port being watched for."""

    def __init__(self, channel: grpc.aio.Channel, delta: bool, names: list[str]) -> None:
        self.delta = delta
        self.names = names
        request_class: Any = (discovery_pb2.DeltaDiscoveryRequest if delta
                              else discovery_pb2.DiscoveryRequest)
        response_class: Any = (discovery_pb2.DeltaDiscoveryResponse if delta
                               else discovery_pb2.DiscoveryResponse)
        self.request_class = request_class
        self.call = channel.stream_stream(
            DELTA_ADS if delta else SOTW_ADS,
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString)(wait_for_ready=True)
        self.missing = set(names)
        self.synced = asyncio.Event()
        self.responses = 0
        self.watch_port: int | None = None
        self.watch_seen: asyncio.Event = asyncio.Event()
        self.watch_at = 0.0

    async def subscribe(self, node_id: str) -> None:
        if self.delta:
            await self.call.write(self.request_class(
                node={"id": node_id}, type_url=ENDPOINT, resource_names_subscribe=self.names))
        else:
            await self.call.write(self.request_class(
                node={"id": node_id}, type_url=ENDPOINT, resource_names=self.names))

    async def run(self) -> None:
        while True:
            response = await self.call.read()
            if response is grpc.aio.EOF:
                return
            arrived = time.monotonic()
            self.responses += 1
            for resource in response.resources:
                name, body = ((resource.name, resource.resource.value) if self.delta else
                              (None, resource.value))
                port = first_port(body)
                if name is None:
                    name = endpoint_pb2.ClusterLoadAssignment.FromString(body).cluster_name
                self.missing.discard(name)
                if name == WATCHED and port == self.watch_port and not self.watch_seen.is_set():
                    self.watch_at = arrived
                    self.watch_seen.set()
            if not self.missing:
                self.synced.set()
            if self.delta:
                await self.call.write(self.request_class(
                    type_url=ENDPOINT, response_nonce=response.nonce))
            else:
                await self.call.write(self.request_class(
                    type_url=ENDPOINT, response_nonce=response.nonce,
                    version_info=response.version_info, resource_names=self.names))


async def _worker(conn: Connection, first: int, count: int, target: str, total: int,
                  stride: int) -> None:
    loop = asyncio.get_running_loop()
    channels, clients = [], []
    tasks = []
    for i in range(first, first + count):
        channel = grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        channels.append(channel)
        client = _Client(channel, i % 2 == 0, names_of_client(i, total, stride))
        await client.subscribe(f"reconnect-bench-{i}")
        clients.append(client)
        task = asyncio.create_task(client.run())
        tasks.append(task)
        # One at a time: streams gRPC has accepted but the relay has not
        # picked up within 30 s are cancelled, and subscribing thousands of
        # names takes the relay a while (issue 11).
        synced = asyncio.create_task(client.synced.wait())
        await asyncio.wait([synced, task], return_when=asyncio.FIRST_COMPLETED)
        if not synced.done():
            raise RuntimeError(f"a client stream ended: {task.exception()}")
    conn.send("ready")
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command is None:
            break
        if command == "reset":
            for c in clients:
                c.responses = 0
            conn.send("ok")
        elif command == "count":
            conn.send(sum(c.responses for c in clients))
        elif command[0] == "watch":
            for c in clients:
                c.watch_port = command[1]
                c.watch_seen.clear()
            conn.send("ok")
            await asyncio.gather(*(c.watch_seen.wait() for c in clients))
            conn.send([c.watch_at for c in clients])
    for task in tasks:
        task.cancel()
    for channel in channels:
        await channel.close()


# -- the baseline: a bare grpc.aio client of the origin ------------------------


def bare_main(target: str, names: list[str]) -> None:
    asyncio.run(_bare(target, names))


async def _bare(target: str, names: list[str]) -> None:
    """Subscribe ``names`` on the origin; decode and ACK everything; reconnect at once."""
    while True:
        channel = grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        call = channel.stream_stream(
            DELTA_ADS,
            request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)(
                metadata=(BARE,))
        try:
            await call.write(discovery_pb2.DeltaDiscoveryRequest(
                node={"id": "bare"}, type_url=ENDPOINT, resource_names_subscribe=names))
            while (response := await call.read()) is not grpc.aio.EOF:
                for resource in response.resources:
                    endpoint_pb2.ClusterLoadAssignment.FromString(resource.resource.value)
                await call.write(discovery_pb2.DeltaDiscoveryRequest(
                    type_url=ENDPOINT, response_nonce=response.nonce))
        except grpc.aio.AioRpcError:
            pass
        await channel.close()
        await asyncio.sleep(0.05)


# -- the harness ------------------------------------------------------------------


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_RECONNECT = re.compile(r"reconnecting to origin \S+ in ([0-9.]+)s")


GC_PAUSES = "xds_relay_gc_pause_seconds_bucket"


def worst_text(before: dict[float, float], after: dict[float, float]) -> str:
    """:func:`~benchmarks.fleet.worst_lag` of a histogram the relay may not
    have (``-``: an older tree), or may not have recorded into (``none``)."""
    if not after:
        return "-"
    if after.get(math.inf, 0.0) == before.get(math.inf, 0.0):
        return "none"
    return lag_text(worst_lag(before, after))


def relay_log(log: Path) -> list[tuple[float, str]]:
    """The relay's log lines with their wall-clock times."""
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        match = _LOG_TIME.match(line)
        if match is not None:
            when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            lines.append((when, line))
    return lines


def backoff_in_force(log: Path, at: float) -> float | None:
    """The wait of the relay's last reconnect scheduled before wall time ``at``."""
    steps = [float(m.group(1)) for when, line in relay_log(log)
             if when <= at and (m := _RECONNECT.search(line))]
    return steps[-1] if steps else None


def connected_after(log: Path, at: float) -> float | None:
    """Wall time of the relay's first connect to the origin after ``at``."""
    return next((when for when, line in relay_log(log)
                 if when >= at and "connected to origin" in line), None)


async def measure(args: argparse.Namespace, src: Path) -> dict[str, Any]:
    """Resends and outages of the relay from the tree ``src``."""
    total = args.resources
    origin = await IstiodOrigin(versions=args.origin_versions).start()
    origin.set(*(endpoints(f"ep-{i}", 1000 + i % 1000) for i in range(total)))
    port = origin.port
    ctx = mp.get_context("spawn")
    bare = ctx.Process(target=bare_main, args=(f"127.0.0.1:{port}",
                                               [f"ep-{i}" for i in range(total)]))
    bare.start()
    log_path = Path(tempfile.mkstemp(suffix=".log")[1])
    resend: list[dict[str, Any]] = []
    outages: list[dict[str, Any]] = []

    def relay_streams() -> list[Any]:
        return [s for s in origin.streams if s.metadata.get(BARE[0]) != BARE[1]]

    try:
        with log_path.open("wb") as log:  # noqa: ASYNC230 (once, before measuring)
            async with relay_process("reconnect-bench", port, 0, log_level="info",
                                     stderr=log, upstream_extra=args.upstream,
                                     src=src) as relay, \
                    workers(worker_main, args.clients, args.workers, relay.target, total,
                            stride_of(args.clients, total),
                            numbered=True) as clients:
                pid = relay.process.pid
                await asyncio.sleep(1.0)
                for _ in range(args.rounds):
                    clients.send("reset")
                    await clients.next_messages()
                    before = len(relay_streams())
                    lag, pauses = await lag_buckets(relay), await lag_buckets(relay, GC_PAUSES)
                    relay_cpu, bare_cpu = cpu_seconds(pid), cpu_seconds(bare.pid)
                    relay_main = main_thread_cpu_seconds(pid)
                    started = time.monotonic()
                    origin.end_streams()
                    await eventually(lambda b=before: len(relay_streams()) > b and
                                     relay_streams()[-1].resources_sent >= total and
                                     relay_streams()[-1].all_answered(), 60)
                    acked = time.monotonic() - started
                    await asyncio.sleep(1.0)  # whatever the resend causes goes out meanwhile
                    relay_cpu = cpu_seconds(pid) - relay_cpu
                    relay_main = main_thread_cpu_seconds(pid) - relay_main
                    bare_cpu = cpu_seconds(bare.pid) - bare_cpu
                    lag = worst_lag(lag, await lag_buckets(relay))
                    pause = worst_text(pauses, await lag_buckets(relay, GC_PAUSES))
                    clients.send("count")
                    pushed = sum(await clients.next_messages())
                    resend.append({"downstream_responses": pushed,
                                   "relay_cpu_ms": round(relay_cpu * 1000),
                                   "relay_main_thread_cpu_ms": round(relay_main * 1000),
                                   "bare_cpu_ms": round(bare_cpu * 1000),
                                   "acked_after_ms": round(acked * 1000),
                                   "worst_loop_lag": lag_text(lag),
                                   "worst_gc_pause": pause})
                    print(json.dumps({"resend": resend[-1]}), flush=True)
                for round_no in range(args.outages):
                    await origin.stop()
                    await asyncio.sleep(args.outage)
                    new_port = 2000 + round_no
                    origin.set(endpoints(WATCHED, new_port))
                    clients.send(("watch", new_port))
                    await clients.next_messages()
                    back_wall, back = time.time(), time.monotonic()
                    await origin.start(port)
                    arrivals = [t for ts in await clients.next_messages() for t in ts]
                    converged = max(arrivals) - back
                    step = backoff_in_force(log_path, back_wall)
                    connected = connected_after(log_path, back_wall)
                    outages.append({
                        "converged_s": round(converged, 2),
                        "median_client_s": round(statistics.median(arrivals) - back, 2),
                        "backoff_step_s": step,
                        # from the relay's connect (its backoff over) to the last client
                        "connected_to_converged_s": None if connected is None else
                        round(converged - (connected - back_wall), 2)})
                    print(json.dumps({"outage": outages[-1]}), flush=True)
                clients.send(None)
    finally:
        bare.kill()
        await origin.stop()
        with contextlib.suppress(OSError):
            os.unlink(log_path)
    return {"relay_src": str(src), "revision": revision(src), "clients": args.clients,
            "resources": total, "origin_versions": args.origin_versions,
            "outage_s": args.outage, "resend": resend, "outages": outages}


def report(result: dict[str, Any]) -> None:
    """One tree's figures, as a line or two."""
    resend, outages = result["resend"], result["outages"]
    print(f"\nrelay at {result['revision']} ({result['relay_src']}):")
    if resend:
        ratios = [r["relay_cpu_ms"] / max(r["bare_cpu_ms"], 1) for r in resend]
        cpu = [r["relay_cpu_ms"] for r in resend]
        main = [r["relay_main_thread_cpu_ms"] for r in resend]
        print(f"resend of {result['resources']} unchanged resources, {result['clients']} "
              f"clients: downstream responses {[r['downstream_responses'] for r in resend]}; "
              f"relay CPU ms {cpu} (min {min(cpu)}, median {statistics.median(cpu):g}), "
              f"its main thread's (the event loop) {main} (min {min(main)}, median "
              f"{statistics.median(main):g}), "
              f"bare client CPU ms {[r['bare_cpu_ms'] for r in resend]}; relay / bare min "
              f"{min(ratios):.2f}x median {statistics.median(ratios):.2f}x; the relay's worst "
              f"event loop lag sampled (every 100 ms) {[r['worst_loop_lag'] for r in resend]}, "
              f"its worst collector pause {[r['worst_gc_pause'] for r in resend]}")
    if outages:
        print(f"outage of {result['outage_s']:g}s: clients converged "
              f"{[o['converged_s'] for o in outages]} s after the origin was back; relay "
              f"backoff step in force {[o['backoff_step_s'] for o in outages]} s; from the "
              f"relay's connect {[o['connected_to_converged_s'] for o in outages]} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--resources", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--outages", type=int, default=3)
    parser.add_argument("--outage", type=float, default=20.0,
                        help="seconds the origin stays away in each outage")
    parser.add_argument("--origin-versions", action="store_true",
                        help="the origin sends per-resource versions (istiod sends none)")
    parser.add_argument("--upstream", default="",
                        help="extra keys for the relay's upstream section, YAML flow style")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--relay-src", type=Path, action="append", default=None,
                        help="a tree whose relay runs (default: this checkout); more than "
                             "once: each in turn")
    parser.add_argument("--repeat", type=int, default=1,
                        help="how many times each tree is measured, the trees alternating")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/reconnect.json"))
    args = parser.parse_args()
    trees = [src.resolve() for src in args.relay_src or [Path(__file__).resolve().parents[1]]]
    results = []
    for _ in range(args.repeat):
        for src in trees:
            results.append(asyncio.run(measure(args, src)))
            report(results[-1])
    if len(results) > 1:
        print("\nall, in the order measured:")
        for result in results:
            report(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    body = results[0] if len(results) == 1 else {"runs": results}
    args.out.write_text(json.dumps({"cpus": os.cpu_count(), **body}, indent=2))


if __name__ == "__main__":
    main()
