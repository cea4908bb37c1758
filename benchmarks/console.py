"""Console benchmark: what ``/`` and its data endpoint cost at 10,000 clients,
the fan-out figure with a console open, and the console's screenshot.

**Cost** (the default): an admin server with the console, on a real port,
in this process, whose clients are ``--clients`` *simulated* streams: a
real :class:`~relay.cache.ResourceCache` (``--resources`` clusters) and, per
stream, a real :class:`~relay.protocol.snapshot.SessionSnapshot` (CDS and
EDS, 5 names each; 1 % NACKing, 2 % with a response in flight), turned
into ``/clients`` records by :func:`relay.server.status.client_summary`
whenever the console builds its list, as a relay does. 10,000 real gRPC
streams are more than this 2-core machine can open next to the relay it
measures; the records are the same, what is left out is each stream's
``Session.snapshot()`` (a copy of its protocol state). Over HTTP, with
the time each request took and the bytes it carried:

* the page's first load (``/`` and its three files);
* a refresh that builds the list (every ``max(MIN_AGE, cost / DUTY)``
  seconds while a console is open: see :mod:`relay.console.source`), one
  that reuses it, a search, a page deep in the list, another sort, a
  client's page; a refresh asks only for the chart points it lacks;
* the history sampler's reading of a relay (once a second, console or not).

**Fan-out** (``--fanout N``): :mod:`benchmarks.fanout`'s figures for a relay
process with N streams, with no console and with one polling
``/console/data`` once a second, runs alternating.

**/clients** (``--wildcard STREAMSxCLUSTERS``, e.g. ``200x5000``): a real
:class:`~relay.server.serving.ServingContext` with STREAMS delta streams
(:class:`~relay.server.streams.DownstreamStream`, no gRPC: each request
handled and each response ACKed in this process) subscribed to the wildcard
of CLUSTERS clusters, and an admin server whose ``/clients`` lists them as a
relay's does (``iter_client_statuses``). While ``/clients`` is asked and
read over HTTP (by a process of its own: read in a thread of this one, the
thread's share of the GIL showed as holds of 150-250 ms that were not the
relay's), a 1 ms timer measures every time the event loop was held: the
longest, p90 and median hold of ``--runs`` requests (wall time, and the CPU
time the loop's thread spent in each: the code's own, whatever the
machine's load), and how long each took. ``--relay-src DIR`` runs it with
the ``relay`` package of another tree (an export of an older commit) and
this checkout's benchmark, for a before and after.

**Screenshot** (``--screenshot PATH``): a relay with a few real gRPC
clients (one NACKing, one not answering yet) in headless Chromium, as the
console tests drive it (:mod:`tests.console.browser`), saved as PNG.

Usage: ``python -m benchmarks.console [--clients 10000] [--resources 200]
[--refreshes 5] [--fanout 1000 --runs 3] [--screenshot docs/images/console.png]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.admin import AdminServer
from relay.cache import ResourceCache, Update
from relay.config import AdminConfig
from relay.console.history import relay_reading
from relay.console.source import DUTY, MIN_AGE, LocalSource
from relay.protocol.outcome import Nack
from relay.protocol.snapshot import ResourceState, ResourceStatus, SessionSnapshot, TypeSnapshot
from relay.resource import CachedResource
from relay.runtime import tune_gc
from relay.server.status import client_summary
from relay.telemetry import new_metrics, prometheus_provider
from relay.xds_types import CLUSTER, ENDPOINT

NAMES_PER_TYPE = 5


# -- cost at N simulated clients ----------------------------------------------------


def simulated_cache(resources: int) -> ResourceCache:
    cache = ResourceCache()
    for type_url in (CLUSTER, ENDPOINT):
        cache.apply(type_url, Update([
            CachedResource(type_url, f"svc-{i}", "v2",
                           discovery_pb2.Resource(name=f"svc-{i}", version="v2"))
            for i in range(resources)], complete=True))
    return cache


def simulated_snapshots(clients: int, resources: int) -> list[tuple[SessionSnapshot, str]]:
    """One snapshot per stream: 1 % NACKing CDS, 2 % with CDS in flight, the rest ACKed."""
    snapshots = []
    for c in range(clients):
        types = []
        for type_url in (CLUSTER, ENDPOINT):
            names = tuple(f"svc-{(c + k) % resources}" for k in range(NAMES_PER_TYPE))
            nacked = type_url == CLUSTER and c % 100 == 7
            in_flight = "9" if type_url == CLUSTER and c % 50 == 3 else None
            status = ResourceStatus.NACKED if nacked else ResourceStatus.ACKED
            held = tuple(ResourceState(n, status, "v2", "", n) for n in names)
            nack = Nack("8", f"cluster svc-{c % resources}: unknown load balancing policy",
                        3, "v2") if nacked else None
            types.append(TypeSnapshot(type_url, names, False, tuple((n, "v2") for n in names),
                                      "v1" if nacked else "v2", in_flight, nack, held))
        node = base_pb2.Node(id=f"envoy-{c:05d}.zone-a.example", cluster="frontend")
        snapshots.append((SessionSnapshot(node, "delta" if c % 3 else "sotw", tuple(types)),
                          f"ipv4:10.{c // 65536}.{c // 256 % 256}.{c % 256}:{40000 + c % 20000}"))
    return snapshots


@contextlib.asynccontextmanager
async def console_server(clients: int, resources: int) -> AsyncIterator[tuple[int, LocalSource]]:
    """An admin server with the console, its clients simulated; its port."""
    cache = simulated_cache(resources)
    snapshots = simulated_snapshots(clients, resources)
    provider, registry = prometheus_provider()
    metrics = new_metrics(provider, registry)
    source = LocalSource(  # one record at a time, as ServingContext.iter_client_statuses
        lambda: (client_summary(snapshot, peer, cache) for snapshot, peer in snapshots),
        lambda: relay_reading(lambda: clients, metrics.downstream_pushes,
                              metrics.downstream_nacks, metrics.push_latency, metrics.loop_lag))
    admin = AdminServer(cache, registry, lambda: None, lambda: [], lambda: "simulated",
                        console=source)
    port = await admin.start(AdminConfig(address="127.0.0.1:0"))
    tune_gc()  # as a relay does once started: the simulated streams are not walked again
    try:
        yield port, source
    finally:
        await admin.stop()


class LoopWatch:
    """The longest the event loop went without running a 1 ms timer: what a
    client of the relay would have waited while the console worked; every
    such wait in ``holds``, and in ``cpu_holds`` the CPU time this thread
    spent in it (on a loaded machine a wait is also the time the process
    was not running at all: the CPU time is the code's own)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.holds: list[float] = []
        self.cpu_holds: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before, cpu = loop.time(), time.thread_time()
            await asyncio.sleep(0.001)
            held = max(0.0, loop.time() - before - 0.001)
            self.holds.append(held)
            self.cpu_holds.append(time.thread_time() - cpu)
            self.longest = max(self.longest, held)

    def __enter__(self) -> LoopWatch:
        self._task = asyncio.create_task(self._watch())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def timed(session: aiohttp.ClientSession, url: str) -> tuple[float, int, Any]:
    """Milliseconds the request took, bytes of the body, and the body (JSON when it is)."""
    started = time.perf_counter()
    async with session.get(url) as response:
        body = await response.read()
        assert response.status == 200, (url, response.status, body[:200])
    elapsed = (time.perf_counter() - started) * 1000
    decoded: Any = json.loads(body) if response.content_type == "application/json" else None
    return elapsed, len(body), decoded


async def cost(clients: int, resources: int, refreshes: int) -> dict[str, Any]:
    async with console_server(clients, resources) as (port, source), \
            aiohttp.ClientSession() as session:
        base = f"http://127.0.0.1:{port}"
        page_ms = page_bytes = 0.0
        for path in ("/", "/console/static/console.css", "/console/static/console.js",
                     "/console/static/icon.svg"):
            ms, size, _ = await timed(session, base + path)
            page_ms, page_bytes = page_ms + ms, page_bytes + size
        await asyncio.sleep(2.5)  # a few chart points
        first_ms, first_bytes, data = await timed(session, base + "/console/data")
        built, reused, built_bytes, reused_bytes, blocked = [], [], [], [], []
        since = ""

        def last_point(data: dict[str, Any], since: str) -> str:
            points = data["history"]["points"]
            return str(points[-1][0]) if points else since

        for _ in range(refreshes):
            since = last_point(data, since)
            # the list is old enough to be built again (as a 1 s poll finds it at 10,000)
            source._built = -1e9  # the benchmark ages the list
            with LoopWatch() as watch:
                ms, size, data = await timed(session, f"{base}/console/data?since={since}")
            blocked.append(watch.longest * 1000)
            built.append(ms)
            built_bytes.append(size)
            await asyncio.sleep(1.0)
            since = last_point(data, since)
            ms, size, data = await timed(session, f"{base}/console/data?since={since}")
            reused.append(ms)
            reused_bytes.append(size)
        build_cost = source.build_cost
        search_ms, _, found = await timed(session, base + "/console/data?q=envoy-0421")
        deep_ms, _, _ = await timed(session, base + f"/console/data?offset={clients - 50}")
        sort_ms, _, _ = await timed(session, base + "/console/data?sort=peer&order=desc")
        row = data["clients"]["rows"][0]
        query = urllib.parse.urlencode({"node": row["node_id"], "peer": row["peer"]})
        client_ms, client_bytes, _ = await timed(session, f"{base}/console/client?{query}")
        nacked = data["clients"]["states"]["nacked"]
    provider, registry = prometheus_provider()
    metrics = new_metrics(provider, registry)
    for _ in range(100_000):
        metrics.push("delta", CLUSTER)
        metrics.push_latency.record(0.002, "Cluster")
    started = time.perf_counter()
    for _ in range(1000):
        relay_reading(lambda: clients, metrics.downstream_pushes, metrics.downstream_nacks,
                      metrics.push_latency, metrics.loop_lag)
    reading_us = (time.perf_counter() - started) * 1000
    return {
        "clients": clients, "nacked": nacked,
        "page_load_ms": round(page_ms, 1), "page_load_bytes": int(page_bytes),
        "first_data_ms": round(first_ms, 1), "first_data_bytes": first_bytes,
        "refresh_building_list_ms": round(statistics.median(built), 1),
        "refresh_building_list_bytes": int(statistics.median(built_bytes)),
        "refresh_reusing_list_ms": round(statistics.median(reused), 1),
        "refresh_reusing_list_bytes": int(statistics.median(reused_bytes)),
        "list_build_s": round(build_cost, 3),
        "loop_blocked_at_most_ms": round(max(blocked), 1),
        "list_rebuilt_every_s": round(max(MIN_AGE, build_cost / DUTY), 2),
        "search_ms": round(search_ms, 1), "search_matched": found["clients"]["matched"],
        "last_page_ms": round(deep_ms, 1), "new_sort_ms": round(sort_ms, 1),
        "client_page_ms": round(client_ms, 1), "client_page_bytes": client_bytes,
        "sampler_reading_us": round(reading_us, 1),
    }


COST_LABELS = {
    "page_load": "page load: / and its 3 files",
    "first_data": "first /console/data (builds the list, all chart points)",
    "refresh_building_list": "refresh that builds the list again",
    "refresh_reusing_list": "refresh that reuses the list",
    "search": "search (list reused)",
    "last_page": "the last page (list reused)",
    "new_sort": "another sort, first time (list reused)",
    "client_page": "a client's page",
}


def print_cost(result: dict[str, Any]) -> None:
    print(f"\n{result['clients']:,} simulated clients ({result['nacked']} NACKing)\n")
    print("| request | ms | bytes |\n|---|---:|---:|")
    for key, text in COST_LABELS.items():
        size = result.get(f"{key}_bytes")
        print(f"| {text} | {result[f'{key}_ms']} | {'' if size is None else f'{size:,}'} |")
    print(f"\nlist build: {result['list_build_s']} s of the event loop; while a console is "
          f"open it is built again every {result['list_rebuilt_every_s']} s "
          f"(max({MIN_AGE}, cost / {DUTY})), in chunks: the loop waited at most "
          f"{result['loop_blocked_at_most_ms']} ms for it; sampler reading: "
          f"{result['sampler_reading_us']} us a second")


# -- /clients of big wildcard streams ---------------------------------------------------------


def wildcard_streams(streams: int, clusters: int) -> tuple[Any, Any]:
    """A serving context whose cache has ``clusters`` clusters and ``streams``
    delta streams holding all of them (wildcard, every response ACKed)."""
    from relay.core import Core
    from relay.server.streams import DownstreamStream

    serving = Core.create().serving
    serving.cache.apply(CLUSTER, Update([
        CachedResource(CLUSTER, f"cluster-{i:05d}", "v1",
                       discovery_pb2.Resource(name=f"cluster-{i:05d}", version="v1"))
        for i in range(clusters)], complete=True))
    for number in range(streams):
        stream = DownstreamStream(serving, "delta", f"ipv4:10.0.{number // 256}.{number % 256}:1")
        serving.join(stream)
        stream.handle_request(discovery_pb2.DeltaDiscoveryRequest(
            node=base_pb2.Node(id=f"envoy-{number:03d}"), type_url=CLUSTER,
            resource_names_subscribe=["*"]))
        while True:
            responses = [discovery_pb2.DeltaDiscoveryResponse.FromString(body)
                         for body in stream.ready_responses()]
            if not responses:
                break
            for response in responses:
                stream.handle_request(discovery_pb2.DeltaDiscoveryRequest(
                    type_url=CLUSTER, response_nonce=response.nonce))
    return serving, serving.cache


# /clients read, timed and counted by a process of its own: its reading and
# decoding take no share of the relay's loop (nor of its GIL)
_READER = """
import json, sys, time, urllib.request
started = time.perf_counter()
with urllib.request.urlopen(sys.argv[1], timeout=600) as reply:
    body = reply.read()
ms = (time.perf_counter() - started) * 1000
print(json.dumps({"ms": ms, "bytes": len(body), "clients": len(json.loads(body)["clients"])}))
"""


def relay_dir() -> str:
    """Where the relay package measured is (another tree's, with --relay-src)."""
    return str(Path(sys.modules["relay"].__file__ or "").resolve().parent)


async def read_clients(url: str) -> dict[str, Any]:
    """Milliseconds ``url`` took to read, its bytes and the clients it lists."""
    reader = await asyncio.create_subprocess_exec(sys.executable, "-c", _READER, url,
                                                  stdout=subprocess.PIPE)
    out, _ = await reader.communicate()
    assert reader.returncode == 0, reader.returncode
    read: dict[str, Any] = json.loads(out)
    return read


async def clients_lag(streams: int, clusters: int, runs: int) -> dict[str, Any]:
    """``/clients`` of ``streams`` wildcard streams of ``clusters`` clusters:
    how long the loop was held while it was built, and how long it took."""
    started = time.perf_counter()
    serving, cache = wildcard_streams(streams, clusters)
    setup_s = time.perf_counter() - started
    admin = AdminServer(cache, None, lambda: None, serving.iter_client_statuses,
                        lambda: "simulated")
    port = await admin.start(AdminConfig(address="127.0.0.1:0"))
    tune_gc()
    holds: list[float] = []
    cpu_holds: list[float] = []
    longest: list[float] = []
    took: list[float] = []
    size = 0

    try:
        for _ in range(runs):
            with LoopWatch() as watch:
                await asyncio.sleep(0.01)
                read = await read_clients(f"http://127.0.0.1:{port}/clients")
            assert read["clients"] == streams, read
            took.append(read["ms"])
            size = read["bytes"]
            holds += watch.holds
            cpu_holds += watch.cpu_holds
            longest.append(watch.longest * 1000)
    finally:
        await admin.stop()

    def figures(kind: str, waits: list[float]) -> dict[str, Any]:
        ordered = sorted(waits)
        return {f"{kind}_max_ms": round(ordered[-1] * 1000, 1),
                f"{kind}_p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 1),
                f"{kind}_median_ms": round(statistics.median(ordered) * 1000, 2),
                f"{kind}s_over_50ms": sum(1 for held in ordered if held > 0.05)}

    return {"relay": relay_dir(), "streams": streams, "clusters": clusters, "runs": runs,
            "setup_s": round(setup_s, 1), "clients_bytes": size,
            "clients_ms": [round(ms) for ms in took],
            "hold_max_per_run_ms": [round(ms, 1) for ms in longest],
            **figures("hold", holds), **figures("cpu_hold", cpu_holds)}


# -- fan-out with a console open ------------------------------------------------------------


async def fanout(streams: int, runs: int, rounds: int, worker_count: int) -> dict[str, Any]:
    from benchmarks.fanout import Server, measure
    from benchmarks.processes import relay_process
    from tests.builders import endpoints
    from tests.harness import ScriptedOrigin

    def server(console: bool) -> Callable[[], contextlib.AbstractAsyncContextManager[Server]]:
        @contextlib.asynccontextmanager
        async def start() -> AsyncIterator[Server]:
            from benchmarks.processes import NAME

            origin = await ScriptedOrigin().start()
            origin.set(endpoints(NAME, 1))
            try:
                async with relay_process("bench-relay", origin.port, drain_period=0) as relay:
                    async def change(port: int) -> None:
                        origin.set(endpoints(NAME, port))

                    poller = asyncio.create_task(poll(relay.admin_port)) if console else None
                    try:
                        yield Server("relay", relay.process.pid, relay.target, change,
                                     lambda: len(origin.all_requests()))
                    finally:
                        if poller is not None:
                            poller.cancel()
            finally:
                await origin.stop()

        return start

    results: dict[str, list[dict[str, Any]]] = {"no console": [], "console open": []}
    for run in range(runs):
        order = [False, True] if run % 2 == 0 else [True, False]
        for console in order:
            result = await measure(server(console), streams, rounds, worker_count, 1)
            results["console open" if console else "no console"].append(result)
            print(json.dumps({"streams": streams, "console": console, "run": run, **result}),
                  flush=True)
    return results


async def poll(admin_port: int) -> None:
    """What an open console asks: /console/data once a second, points since the last."""
    since = ""
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(f"http://127.0.0.1:{admin_port}/console/data?since={since}"
                                   ) as response:
                data = await response.json()
            points = data["history"]["points"]
            if points:
                since = str(points[-1][0])
            await asyncio.sleep(1.0)


def print_fanout(streams: int, results: dict[str, list[dict[str, Any]]]) -> None:
    print(f"\nfan-out, {streams:,} streams: median of {len(results['no console'])} runs\n")
    print("| figure | no console | console open |\n|---|---:|---:|")
    for key in ("update_all_ms", "update_median_stream_ms", "cpu_ms_per_update",
                "storm_all_ms"):
        cells = [statistics.median(run[key] for run in results[kind])
                 for kind in ("no console", "console open")]
        print(f"| {key} | {cells[0]} | {cells[1]} |")


# -- the screenshot -----------------------------------------------------------------------------


async def screenshot(path: Path) -> None:
    from tests.builders import cluster
    from tests.console.browser import Zone, browser, zone
    from tests.harness import XdsClient

    nacking, silent = "envoy-checkout-5c4b-qq1w", "envoy-search-66f8-kd2l"

    async def answer(relay: Zone, name: str, client: XdsClient) -> None:
        """ACK every response, as a healthy client does; NACK, or stay silent."""
        while True:
            if name == nacking:
                await relay.nack(client, "cluster c3: unknown load balancing policy "
                                         "RING_HASHX; rejecting the whole update")
            elif name != silent:
                await relay.ack(client)
            await client.recv(timeout=60)

    async with zone(clusters=8) as relay, browser() as opened:
        page = opened.page
        await page.goto(relay.console)
        tasks = []
        try:
            for i, (name, delta) in enumerate([
                    ("envoy-frontend-7d9f-2xkq", True), ("envoy-frontend-7d9f-8mzt", True),
                    (nacking, True), ("grpc-go-payments-0", False), (silent, True),
                    ("envoy-frontend-7d9f-x81c", False), ("envoy-frontend-7d9f-q4zr", True)]):
                client = await relay.connect(name, *(f"c{k}" for k in range(i % 3, i % 3 + 4)),
                                             delta=delta, own_connection=True)
                tasks.append(asyncio.create_task(answer(relay, name, client)))
                await asyncio.sleep(0.6)  # the clients chart climbs
            for version in range(8):  # the origin changes a cluster now and then
                relay.origin.set(cluster(f"c{version % 4}"), version=f"v{version + 2}")
                await asyncio.sleep(0.8)
            await page.locator("#clients tbody tr").first.wait_for()
            await page.screenshot(path=str(path), full_page=True)
        finally:
            for task in tasks:
                task.cancel()
        if opened.errors:
            raise SystemExit(f"the console reported errors: {opened.errors}")
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--resources", type=int, default=200)
    parser.add_argument("--refreshes", type=int, default=5)
    parser.add_argument("--fanout", type=int, default=0, metavar="STREAMS",
                        help="compare benchmarks.fanout's figures without and with a console")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--screenshot", type=Path, help="only save the console's screenshot")
    parser.add_argument("--json", type=Path, help="write the figures there too")
    parser.add_argument("--wildcard", metavar="STREAMSxCLUSTERS",
                        help="the loop's holds while /clients lists STREAMS wildcard "
                             "streams of CLUSTERS clusters (e.g. 200x5000)")
    parser.add_argument("--relay-src", type=Path, default=None,
                        help="with --wildcard: the relay package of this tree (default: this "
                             "checkout's)")
    args = parser.parse_args()
    if args.relay_src is not None and RERUN not in os.environ:
        sys.exit(rerun_from(args.relay_src.resolve(), "benchmarks.console"))
    if args.screenshot is not None:
        asyncio.run(screenshot(args.screenshot))
        return
    results: dict[str, Any] = {}
    if args.wildcard:
        streams, clusters = (int(n) for n in args.wildcard.split("x"))
        results["clients"] = asyncio.run(clients_lag(streams, clusters, args.runs))
        print(json.dumps(results["clients"]), flush=True)
    elif args.fanout:
        results["fanout"] = asyncio.run(fanout(args.fanout, args.runs, args.rounds,
                                               args.workers))
        print_fanout(args.fanout, results["fanout"])
    else:
        results["cost"] = asyncio.run(cost(args.clients, args.resources, args.refreshes))
        print(json.dumps(results["cost"]), flush=True)
        print_cost(results["cost"])
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


#: Set in a benchmark run again by :func:`rerun_from` (it does not run itself again).
RERUN = "XDS_RELAY_BENCHMARK_RERUN"


def rerun_from(src: Path, module: str) -> int:
    """The benchmark ``module`` again, with this process's arguments, in a
    process whose ``relay`` is ``src``'s and whose ``benchmarks`` and
    ``tests`` are this checkout's: first on its path a directory holding
    a link to ``src/relay`` only, then this checkout (``-P``: not the
    working directory). For benchmarks that measure the relay in their own
    process."""
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as shim:
        (Path(shim) / "relay").symlink_to(src / "relay")
        env = {**os.environ, RERUN: "1", "PYTHONPATH": os.pathsep.join((shim, str(root)))}
        return subprocess.call([sys.executable, "-P", "-m", module, *sys.argv[1:]], env=env,
                               cwd=root)


if __name__ == "__main__":
    main()
