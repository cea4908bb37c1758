"""Snapshot benchmark: what the last-known-good snapshot costs, against bare Redis and gRPC.

Both parts use one real ``redis-server`` (:mod:`tests.redis_server`) started
for the invocation, and N Clusters shaped like istiod's outbound EDS clusters
(about 500 bytes each encoded: EDS over ADS, circuit breakers, outlier
detection, Istio metadata), for each N of ``--sizes``.

**Write cost per origin response** (in this process). A ``ResourceCache``
holding the N Clusters, a ``SnapshotWriter`` over a ``RedisStore`` listening
to it, as the relay wires them. An origin response is an ``Update`` applied
to the cache (not timed); timed is ``await writer.write_pending()`` right
after it: building the batch (an entry per changed name) and writing it
(one ``MULTI``/``EXEC`` pipeline), as wall time and as CPU time of this
thread (``time.thread_time``: the event loop's share; Redis has its own
process), and as the event loop's worst stall meanwhile (the longest a task
waking every ms waited for its turn: how long a relay's clients would wait
behind the write; the writer yields every ``NAMES_PER_STEP`` names while
it builds, not while redis-py packs the pipeline). Cases, per run:

* all N changed, not yet sent to any client: the writer is the first to
  encode each resource's ``delta_entry``;
* all N changed, already sent to a client (``delta_entry`` encoded
  beforehand, as in a relay with a wildcard subscriber that was served
  first): the writer copies bytes;
* one changed, the cache still holding N: should be flat in N.

``store.write`` is also timed alone (a wrapper around the store), so that
the batch building is the rest. The baseline ("bare"): the same entry
bytes, encoded beforehand, written by a plain redis-py client to the same
Redis in one ``MULTI``/``EXEC`` pipeline of ``HSET key mapping`` (plus the
meta hash's ``HSET``, as the store does): all N entries against the
all-changed cases, the one entry against the one-changed case.

**Start to the first client configured from the snapshot.** Redis holds a
snapshot of the N Clusters (written by an in-process ``SnapshotWriter``,
complete as after a wildcard CDS subscription). A relay is spawned
(``python -m relay run --config ...``, as :mod:`benchmarks.processes` does)
with ``persistence`` on that Redis and its origin a closed port (down for
the whole run). A client (its own process, started beforehand) tries every
10 ms a Delta ADS stream with a wildcard CDS subscription (``*``), reading
and ACKing until one stream has all N names. Timed from just before the
spawn to the response that completed them (``time.monotonic``, one clock
for every process on the machine); also when the successful stream was
opened (about when the port started accepting: the relay restores before
it listens), the server's CPU time and resident memory by then. Baseline:
this module's bare server (``--serve-bare``), spawned the same way: it
reads the same Redis hash with one ``HGETALL``, concatenates the entries'
encoded resources (sliced out, nothing decoded) into one response and
serves it to any subscriber from :class:`benchmarks.bare.BareServer`'s
``grpc.aio`` server (the relay's server options). Like
:mod:`benchmarks.bare`, it imports ``relay.app`` for those options, so
the interpreter's and the common imports' start-up is in both.

Runs alternate which goes first (relay or bare). Each figure is min and
median over runs, with relay / bare (see :mod:`benchmarks.report`).

Usage: ``python -m benchmarks.snapshot [--sizes 10,1000,10000] [--runs 5]
[--parts write,start] [--load-timeout 1] [--timeout 20]``
Writes a table per N to stdout and JSON to ``benchmarks/results/snapshot.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from benchmarks.bare import BareServer, Catalog
from benchmarks.processes import DELTA_ADS, Workers, cpu_seconds, stop_process, workers
from benchmarks.report import Comparison, compare, table, values, write_results
from relay.cache import ResourceCache, Update
from relay.persistence.entries import FORMAT, encode_entry
from relay.persistence.stores import RedisStore, SnapshotBatch, SnapshotStore, StoredSnapshot
from relay.persistence.writer import SnapshotWriter
from relay.resource import CachedResource
from relay.telemetry import new_metrics, prometheus_provider
from relay.xds_types import CLUSTER, WILDCARD
from tests.ports import free_port
from tests.redis_server import RedisServer

# how often the client tries a stream while the server is not listening yet
POLL_S = 0.01
# how often a task notes the event loop's turns while a write is timed
STALL_TICK_S = 0.001
NAMESPACES = 40


# -- the resources ----------------------------------------------------------------


def cluster_message(index: int, generation: int) -> cluster_pb2.Cluster:
    """Cluster ``index``, as istiod's outbound EDS clusters look (TLS aside);
    ``generation`` changes its content."""
    namespace = f"ns-{index % NAMESPACES}"
    host = f"svc-{index}.{namespace}.svc.cluster.local"
    name = f"outbound|8080||{host}"
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS,
                            lb_policy=cluster_pb2.Cluster.LEAST_REQUEST)
    c.connect_timeout.seconds = 10
    eds = c.eds_cluster_config
    eds.service_name = name
    eds.eds_config.ads.SetInParent()
    eds.eds_config.initial_fetch_timeout.SetInParent()
    eds.eds_config.resource_api_version = config_source_pb2.V3
    limits = c.circuit_breakers.thresholds.add()
    for field in (limits.max_connections, limits.max_pending_requests, limits.max_requests,
                  limits.max_retries):
        field.value = 4294967295
    limits.track_remaining = True
    c.common_lb_config.locality_weighted_lb_config.SetInParent()
    outliers = c.outlier_detection
    outliers.consecutive_5xx.value = 5
    outliers.interval.seconds = 10
    outliers.base_ejection_time.seconds = 30
    outliers.max_ejection_percent.value = 10 + generation % 90
    c.metadata.filter_metadata["istio"].update({
        "default_original_port": 8080, "generation": generation,
        "services": [{"host": host, "name": f"svc-{index}", "namespace": namespace}]})
    return c


def origin_resources(indices: Sequence[int], generation: int) -> list[discovery_pb2.Resource]:
    """The ``Resource`` of each Cluster in ``indices``, as an origin sends them (versioned)."""
    resources = []
    for index in indices:
        body = any_pb2.Any()
        body.Pack(cluster_message(index, generation))
        resources.append(discovery_pb2.Resource(
            name=cluster_name(index), version=f"g{generation}", resource=body))
    return resources


def cluster_name(index: int) -> str:
    return f"outbound|8080||svc-{index}.ns-{index % NAMESPACES}.svc.cluster.local"


def cached(resources: Sequence[discovery_pb2.Resource]) -> list[CachedResource]:
    """What the relay caches of ``resources`` (copies: nothing encoded yet is shared)."""
    return [CachedResource.from_origin(CLUSTER, r.name, discovery_pb2.Resource.FromString(
        r.SerializeToString())) for r in resources]


def entries_of(resources: Sequence[CachedResource]) -> dict[str, bytes]:
    """The snapshot entry of each resource, encoded as the writer encodes it."""
    return {r.name: encode_entry(r.name, [(r, None)]) for r in resources}


def meta_fields() -> dict[str, str]:
    """The meta hash as the store writes it (one type, complete)."""
    return {"format": str(FORMAT), "written_at": repr(time.time()),
            f"type:{CLUSTER}": json.dumps({"complete": True})}


# -- part 1: the write per origin response (in this process) -----------------------


class TimedStore:
    """A store that times each ``write`` of the one it wraps."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store
        self.description = store.description
        self.last_write = 0.0

    async def load(self) -> StoredSnapshot | None:
        return await self.store.load()

    async def write(self, batch: SnapshotBatch) -> None:
        started = time.perf_counter()
        await self.store.write(batch)
        self.last_write = time.perf_counter() - started

    async def close(self) -> None:
        await self.store.close()


async def timed(work: Any) -> tuple[float, float, float]:
    """Wall and this thread's CPU time of awaiting ``work()``, and the longest
    the event loop went without a turn meanwhile (a task waking every
    ``STALL_TICK_S`` notes it), in ms."""
    gc.collect()
    stall = 0.0

    async def watch() -> None:
        nonlocal stall
        last = time.perf_counter()
        while True:
            await asyncio.sleep(STALL_TICK_S)
            now = time.perf_counter()
            stall = max(stall, now - last - STALL_TICK_S)
            last = now

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)  # the watcher is waiting
    wall, cpu = time.perf_counter(), time.thread_time()
    await work()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    watcher.cancel()
    return wall * 1000, cpu * 1000, stall * 1000


async def measure_writes(redis_url: str, n: int, runs: int) -> list[dict[str, Any]]:
    """``runs`` runs of each case against N cached Clusters; their figures (ms)."""
    import redis.asyncio

    provider, registry = prometheus_provider()
    store = TimedStore(RedisStore(redis_url, f"bench-write-{n}", timeout=30.0))
    cache = ResourceCache()
    writer = SnapshotWriter(cache, store, new_metrics(provider, registry))
    cache.add_listener(writer.on_cache_change)
    bare = redis.asyncio.Redis.from_url(redis_url)
    bare_prefix = f"bench-write-bare-{n}:v{FORMAT}:"
    indices = range(n)

    async def bare_write(entries: dict[str, bytes]) -> None:
        pipe = bare.pipeline(transaction=True)
        pipe.hset(f"{bare_prefix}type:{CLUSTER}", mapping=entries)  # type: ignore[arg-type]
        pipe.hset(f"{bare_prefix}meta", mapping=meta_fields())  # type: ignore[arg-type]
        await pipe.execute()

    def change(resources: list[CachedResource]) -> None:
        cache.apply(CLUSTER, Update(resources, complete=True))
        assert writer.pending() == len(resources), writer.pending()

    async def relay_write() -> None:
        assert await writer.write_pending()

    try:
        # the snapshot as it is before the runs: both hold N entries
        first = origin_resources(indices, 0)
        change(cached(first))
        await relay_write()
        await bare_write(entries_of(cached(first)))
        results = []
        for run in range(runs):
            figures: dict[str, Any] = {"run": run}
            generation = 1 + 3 * run
            order = ("relay", "bare") if run % 2 == 0 else ("bare", "relay")
            for kind in order:
                if kind == "bare":
                    all_entries = entries_of(cached(origin_resources(indices, generation)))
                    one_entry = entries_of(cached(origin_resources([0], generation + 1)))
                    figures["all_ms"], figures["all_cpu_ms"], figures["all_stall_ms"] = \
                        await timed(lambda e=all_entries: bare_write(e))
                    figures["one_ms"], figures["one_cpu_ms"], _ = \
                        await timed(lambda e=one_entry: bare_write(e))
                    continue
                # all N, nothing encoded yet
                change(cached(origin_resources(indices, generation)))
                figures["cold_all_ms"], figures["cold_all_cpu_ms"], \
                    figures["cold_all_stall_ms"] = await timed(relay_write)
                figures["cold_store_write_ms"] = store.last_write * 1000
                # all N, each delta entry encoded already (served to a client first)
                served = cached(origin_resources(indices, generation + 1))
                for resource in served:
                    _ = resource.delta_entry
                change(served)
                figures["warm_all_ms"], figures["warm_all_cpu_ms"], \
                    figures["warm_all_stall_ms"] = await timed(relay_write)
                figures["warm_store_write_ms"] = store.last_write * 1000
                # one of N
                change(cached(origin_resources([0], generation + 2)))
                figures["relay_one_ms"], figures["relay_one_cpu_ms"], _ = \
                    await timed(relay_write)
            results.append({key: round(value, 3) if isinstance(value, float) else value
                            for key, value in figures.items()})
            print(json.dumps({"clusters": n, "part": "write", **results[-1]}), flush=True)
        return results
    finally:
        await store.close()
        await bare.aclose()


# -- part 2: start to the first client configured (separate processes) -------------


def client_main(conn: Connection, _count: int) -> None:
    asyncio.run(_client(conn))


async def _client(conn: Connection) -> None:
    """Says ``"ready"``; for each ``(target, count, timeout)`` it is sent, tries
    streams until one has ``count`` names and sends when; stops on None."""
    loop = asyncio.get_running_loop()
    conn.send("ready")
    while (command := await loop.run_in_executor(None, conn.recv)) is not None:
        target, count, timeout = command
        try:
            reply = await asyncio.wait_for(first_full_response(target, count), timeout)
        except TimeoutError:
            reply = {"error": f"no stream had all {count} names within {timeout:g}s"}
        conn.send(reply)


async def first_full_response(target: str, count: int) -> dict[str, Any]:
    """When a wildcard CDS stream to ``target`` first had ``count`` names,
    trying again every ``POLL_S`` while nothing listens there."""
    attempts = 0
    while True:
        attempts += 1
        opened = time.monotonic()
        channel = grpc.aio.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", -1), ("grpc.use_local_subchannel_pool", 1)])
        call = channel.stream_stream(
            DELTA_ADS, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
        try:
            await call.write(discovery_pb2.DeltaDiscoveryRequest(
                node={"id": f"snapshot-bench-{os.getpid()}"}, type_url=CLUSTER,
                resource_names_subscribe=[WILDCARD]))
            names: set[str] = set()
            responses = 0
            while len(names) < count:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return {"error": "the stream ended"}
                responses += 1
                names.update(r.name for r in response.resources)
                await call.write(discovery_pb2.DeltaDiscoveryRequest(
                    type_url=CLUSTER, response_nonce=response.nonce))
            return {"opened": opened, "done": time.monotonic(), "attempts": attempts,
                    "responses": responses}
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                return {"error": f"{error.code().name}: {error.details()}"}
        finally:
            call.cancel()
            await channel.close()
        await asyncio.sleep(POLL_S)


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


async def fill_snapshot(redis_url: str, prefix: str, n: int) -> int:
    """Redis holds a snapshot of N Clusters under ``prefix``; the bytes of its entries."""
    cache = ResourceCache()
    store = RedisStore(redis_url, prefix, timeout=30.0)
    writer = SnapshotWriter(cache, store, new_metrics())
    cache.add_listener(writer.on_cache_change)
    resources = cached(origin_resources(range(n), 0))
    cache.apply(CLUSTER, Update(resources, complete=True))
    try:
        assert await writer.write_pending()
    finally:
        await store.close()
    return sum(map(len, entries_of(resources).values()))


def relay_config(path: Path, xds_port: int, redis_url: str, prefix: str,
                 load_timeout: float) -> None:
    admin_port, origin_port = free_port(), free_port()  # nothing listens on origin_port
    path.write_text(f"""
node: {{id: snapshot-bench, cluster: bench}}
server: {{address: "127.0.0.1:{xds_port}", drain_period: 0s}}
admin: {{address: "127.0.0.1:{admin_port}"}}
upstream: {{address: "127.0.0.1:{origin_port}"}}
logging: {{level: warning}}
persistence:
  redis: {{url: "{redis_url}", key_prefix: "{prefix}"}}
  load_timeout: {load_timeout}s
""")


async def measure_start(kind: str, client: Workers, redis_url: str, prefix: str, n: int,
                        args: argparse.Namespace) -> dict[str, Any]:
    """One spawn of the ``kind`` server: when the client first had all N."""
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        config, log = Path(folder) / "relay.yaml", Path(folder) / "server.log"
        if kind == "relay":
            relay_config(config, port, redis_url, prefix, args.load_timeout)
            command = [sys.executable, "-m", "relay", "run", "--config", str(config)]
        else:
            command = [sys.executable, "-m", "benchmarks.snapshot", "--serve-bare",
                       "--port", str(port), "--redis", redis_url,
                       "--key", f"{prefix}:v{FORMAT}:type:{CLUSTER}"]
        client.send((f"127.0.0.1:{port}", n, args.timeout))
        with log.open("wb") as stderr:
            spawned = time.monotonic()
            process = subprocess.Popen(command, stderr=stderr)  # noqa: ASYNC220
            try:
                (reply,) = await client.next_messages()
                cpu, rss = cpu_seconds(process.pid), rss_mib(process.pid)
            finally:
                stop_process(process)
        if "error" in reply:
            # its first lines: what went wrong comes before the origin's retries
            head = log.read_text(errors="replace")[:2000]
            return {"server": kind, "error": reply["error"], "log": head}
    return {"server": kind,
            "configured_ms": round((reply["done"] - spawned) * 1000, 1),
            "listening_ms": round((reply["opened"] - spawned) * 1000, 1),
            "cpu_s": round(cpu, 3), "rss_mib": rss, "responses": reply["responses"],
            "attempts": reply["attempts"], "load": os.getloadavg()[0]}


async def measure_starts(redis_url: str, n: int, client: Workers,
                         args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    prefix = f"bench-start-{n}"
    await fill_snapshot(redis_url, prefix, n)
    runs: dict[str, list[dict[str, Any]]] = {"relay": [], "bare": []}
    for run in range(args.runs):
        for kind in ("relay", "bare") if run % 2 == 0 else ("bare", "relay"):
            figures = await measure_start(kind, client, redis_url, prefix, n, args)
            runs[kind].append(figures)
            print(json.dumps({"clusters": n, "part": "start", "run": run, **figures}),
                  flush=True)
    return runs


# -- the bare server (``--serve-bare``, its own process) ----------------------------


class SnapshotBareServer(BareServer):
    """Sends one pre-assembled response to any subscription."""

    def __init__(self, response: bytes) -> None:
        super().__init__(Catalog())
        self.response = response

    async def _read(self, requests: AsyncIterator[Any], stream: Any) -> None:
        try:
            async for request in requests:
                if request.resource_names_subscribe:
                    stream.outbox.put_nowait(self.response)
        finally:
            stream.outbox.put_nowait(None)


def resource_part(entry: bytes) -> bytes:
    """The encoded ``resources`` field of a one-variant entry: its tail, as
    :mod:`relay.persistence.entries` lays it out (no expiry expected here)."""
    at, size, shift = 3, 0, 0
    while True:  # the name's length, a varint
        byte = entry[at]
        at += 1
        size |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    at += size
    assert entry[at] in (0, 1), "a variant with an expiry"  # flags: derived or not
    return entry[at + 1:]


async def serve_bare(port: int, redis_url: str, key: str) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_url)
    entries: dict[Any, Any] = await client.hgetall(key)
    await client.aclose()
    head = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER, nonce="b1")
    response = head.SerializeToString() + b"".join(map(resource_part, entries.values()))
    server = SnapshotBareServer(response)
    await server.start(port)
    try:
        await asyncio.Event().wait()  # until SIGTERM
    finally:
        await server.stop()


# -- the harness ------------------------------------------------------------------


# (label, the relay's figure, the bare server's figure)
WRITE_ROWS: Sequence[tuple[str, str, str]] = (
    ("write, all N changed, not yet sent (ms)", "cold_all_ms", "all_ms"),
    ("  its loop CPU, not yet sent (ms)", "cold_all_cpu_ms", "all_cpu_ms"),
    ("  worst loop stall, not yet sent (ms)", "cold_all_stall_ms", "all_stall_ms"),
    ("write, all N changed, already sent (ms)", "warm_all_ms", "all_ms"),
    ("  its loop CPU, already sent (ms)", "warm_all_cpu_ms", "all_cpu_ms"),
    ("  worst loop stall, already sent (ms)", "warm_all_stall_ms", "all_stall_ms"),
    ("  of which store.write (ms)", "warm_store_write_ms", "all_ms"),
    ("write, 1 of N changed (ms)", "relay_one_ms", "one_ms"),
    ("  its loop CPU, 1 of N (ms)", "relay_one_cpu_ms", "one_cpu_ms"),
)
START_ROWS: Sequence[tuple[str, str, str]] = (
    ("start: first client has all N (ms)", "configured_ms", "configured_ms"),
    ("start: port accepting (ms)", "listening_ms", "listening_ms"),
    ("start: server CPU by then (s)", "cpu_s", "cpu_s"),
    ("start: server RSS then (MiB)", "rss_mib", "rss_mib"),
)


def summarize(result: dict[str, Any]) -> list[tuple[str, Comparison]]:
    rows = []
    writes = result.get("write_runs")
    if writes:
        rows += [(label, compare(values(writes, relay), values(writes, bare)))
                 for label, relay, bare in WRITE_ROWS]
    starts = result.get("start_runs")
    if starts:
        rows += [(label, compare(values(starts["relay"], relay), values(starts["bare"], bare)))
                 for label, relay, bare in START_ROWS]
    return rows


async def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    parts = set(args.parts.split(","))
    sizes = [int(x) for x in args.sizes.split(",")]
    redis_server = RedisServer().start()
    results = []
    try:
        async with workers(client_main, 1, 1) as client:
            for n in sizes:
                result: dict[str, Any] = {
                    "clusters": n,
                    "entry_bytes": len(entries_of(cached(origin_resources([0], 0)))[
                        cluster_name(0)])}
                if "write" in parts:
                    result["write_runs"] = await measure_writes(redis_server.url, n, args.runs)
                if "start" in parts:
                    result["start_runs"] = await measure_starts(redis_server.url, n, client,
                                                                args)
                result["errors"] = [f"{r['server']} run {i}: {r['error']}"
                                    for kind in result.get("start_runs", {}).values()
                                    for i, r in enumerate(kind) if "error" in r]
                result["summary"] = {label.strip(): c for label, c in summarize(result)}
                results.append(result)
            client.send(None)
    finally:
        redis_server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,1000,10000",
                        help="values of N (Clusters), comma-separated")
    parser.add_argument("--runs", type=int, default=5, help="runs per case and N")
    parser.add_argument("--parts", default="write,start",
                        help="which parts to run: write, start or both (comma-separated)")
    parser.add_argument("--load-timeout", type=float, default=1.0,
                        help="the relay's persistence.load_timeout, in seconds")
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="seconds a spawn may take to configure the client")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/snapshot.json"))
    # the baseline server, as the harness spawns it
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--redis", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        asyncio.run(serve_bare(args.port, args.redis, args.key))
        return
    results = asyncio.run(run_all(args))
    for result in results:
        print(f"\nN = {result['clusters']} Clusters ({result['entry_bytes']} bytes per entry), "
              f"{args.runs} runs each:\n{table(summarize(result), 'figure')}")
        for error in result["errors"]:
            print(f"  {error}")
    write_results(args.out, "benchmarks.snapshot", runs=args.runs, results=results)


if __name__ == "__main__":
    main()
