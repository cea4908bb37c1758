"""Fan-out benchmark: one origin update reaching N downstream streams.

For each N, a fresh relay runs as its own process (``xds-relay run``) and
follows a scripted origin in this process over Delta ADS. Worker processes
open N downstream delta streams (one gRPC connection each, like N Envoys),
subscribe to one ClusterLoadAssignment and ACK what they get. Then, per
round, the origin changes it and every stream notes when the new version
arrived. Reported per N:

* time from the origin's send until the update reached all N streams (and
  the median stream), over several rounds;
* the relay's own CPU time per update (it shares the machine with the
  clients, so this is steadier than wall time), per stream;
* the relay's resident memory per connected stream (RSS growth / N).

Usage: ``python -m benchmarks.fanout [--streams 100,1000,5000] [--rounds 5] [--workers 2]``
Writes a table to stdout and JSON to ``benchmarks/results/fanout.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import ENDPOINT
from tests.harness import ScriptedOrigin, endpoints, version_of

DELTA_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
NAME = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# -- client workers (separate processes) ----------------------------------------


def worker_main(conn: Connection, target: str, count: int, per_channel: int) -> None:
    asyncio.run(_worker(conn, target, count, per_channel))


async def _worker(conn: Connection, target: str, count: int, per_channel: int) -> None:
    loop = asyncio.get_running_loop()
    channels = [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range((count + per_channel - 1) // per_channel)]
    calls = []
    for i in range(count):
        call = channels[i // per_channel].stream_stream(
            DELTA_ADS, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
        await call.write(discovery_pb2.DeltaDiscoveryRequest(
            node={"id": f"bench-{os.getpid()}-{i}"}, type_url=ENDPOINT,
            resource_names_subscribe=[NAME]))
        calls.append(call)

    async def receive(call: Any, version: str | None) -> float:
        while True:
            response = await call.read()
            arrived = time.monotonic()
            await call.write(discovery_pb2.DeltaDiscoveryRequest(
                type_url=ENDPOINT, response_nonce=response.nonce))
            if version is None or any(r.version == version for r in response.resources):
                return arrived

    await asyncio.gather(*(receive(c, None) for c in calls))
    conn.send("ready")
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command is None:
            break
        times = await asyncio.gather(*(receive(c, command) for c in calls))
        conn.send(times)
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()


# -- the harness ------------------------------------------------------------------


async def measure(n: int, rounds: int, workers: int, per_channel: int) -> dict[str, Any]:
    origin = await ScriptedOrigin().start()
    origin.set(endpoints(NAME, 1))
    xds_port, admin_port = free_port(), free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
        config.write(f"""
node: {{id: bench-relay}}
server: {{address: "127.0.0.1:{xds_port}", drain_period: 0s}}
admin: {{address: "127.0.0.1:{admin_port}"}}
upstream: {{address: "127.0.0.1:{origin.port}"}}
logging: {{level: warning}}
""")
    relay = subprocess.Popen(  # noqa: ASYNC220 (started once, before measuring)
        [sys.executable, "-m", "relay", "run", "--config", config.name])
    loop = asyncio.get_running_loop()
    procs: list[mp.Process] = []
    pipes: list[Connection] = []
    try:
        await wait_ready(admin_port)
        await asyncio.sleep(0.5)
        rss_before = rss_kib(relay.pid)
        ctx = mp.get_context("spawn")
        shares = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
        for share in shares:
            if share == 0:
                continue
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker_main,
                               args=(theirs, f"127.0.0.1:{xds_port}", share, per_channel))
            proc.start()
            procs.append(proc)
            pipes.append(ours)
        for pipe, proc in zip(pipes, procs, strict=True):
            await wait_for_worker(loop, pipe, proc, "ready")
        await asyncio.sleep(0.5)
        rss_after = rss_kib(relay.pid)
        all_latencies, median_latencies = [], []
        cpu_before = cpu_seconds(relay.pid)
        for round_no in range(rounds):
            message = endpoints(NAME, 1000 + round_no)
            version = version_of(message)
            for pipe in pipes:
                pipe.send(version)
            await asyncio.sleep(0.2)  # let workers start reading
            sent = time.monotonic()
            origin.set(message)
            times: list[float] = []
            for pipe, proc in zip(pipes, procs, strict=True):
                times.extend(await wait_for_worker(loop, pipe, proc))
            all_latencies.append(max(times) - sent)
            median_latencies.append(statistics.median(times) - sent)
        # Includes the 0.2 s pauses, in which the relay idles.
        cpu_per_round = (cpu_seconds(relay.pid) - cpu_before) / rounds
        for pipe in pipes:
            pipe.send(None)
        return {
            "streams": n,
            "all_ms_median": round(statistics.median(all_latencies) * 1000, 1),
            "all_ms_max": round(max(all_latencies) * 1000, 1),
            "median_stream_ms": round(statistics.median(median_latencies) * 1000, 1),
            "relay_cpu_ms_per_update": round(cpu_per_round * 1000, 1),
            "relay_cpu_us_per_stream": round(cpu_per_round * 1e6 / n, 1),
            "rss_mib_idle": round(rss_before / 1024, 1),
            "rss_mib_loaded": round(rss_after / 1024, 1),
            "rss_kib_per_stream": round((rss_after - rss_before) / n, 1),
            "upstream_streams": len(origin.streams),
        }
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        relay.terminate()
        relay.wait(10)
        os.unlink(config.name)
        await origin.stop()


async def wait_for_worker(loop: asyncio.AbstractEventLoop, pipe: Connection,
                          proc: mp.Process, expected: str | None = None) -> Any:
    """A worker's next message; fails (rather than hangs) if the worker died."""
    while not await loop.run_in_executor(None, pipe.poll, 1.0):
        if not proc.is_alive():
            raise RuntimeError(f"client worker exited with code {proc.exitcode}")
    message = pipe.recv()
    if expected is not None and message != expected:
        raise RuntimeError(f"client worker said {message!r}, expected {expected!r}")
    return message


async def wait_ready(admin_port: int) -> None:
    url = f"http://127.0.0.1:{admin_port}/ready"
    for _ in range(200):
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:  # noqa: ASYNC210 (polling)
                if reply.status == 200:
                    return
        except OSError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("relay did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="100,1000,5000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--streams-per-connection", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fanout.json"))
    args = parser.parse_args()
    results = []
    for n in (int(x) for x in args.streams.split(",")):
        result = asyncio.run(measure(n, args.rounds, args.workers, args.streams_per_connection))
        results.append(result)
        print(json.dumps(result), flush=True)
    base = results[0]
    print(f"\n{'streams':>8} {'all (ms)':>9} {'max (ms)':>9} {'median (ms)':>12} "
          f"{'CPU us/stream':>14} {'KiB/stream':>11} {'x latency':>10} {'x streams':>10}")
    for r in results:
        ratio = r["all_ms_median"] / base["all_ms_median"] if base["all_ms_median"] else 0
        print(f"{r['streams']:>8} {r['all_ms_median']:>9} {r['all_ms_max']:>9} "
              f"{r['median_stream_ms']:>12} {r['relay_cpu_us_per_stream']:>14} "
              f"{r['rss_kib_per_stream']:>11} {ratio:>10.1f} "
              f"{r['streams'] / base['streams']:>10.0f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
