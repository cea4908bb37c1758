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
import os
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2

from benchmarks.processes import NAME, cpu_seconds, open_streams, relay_process, workers
from relay.xds_types import ENDPOINT
from tests.harness import ScriptedOrigin, endpoints, version_of


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# -- client workers (separate processes) ----------------------------------------


def worker_main(conn: Connection, count: int, target: str, per_channel: int) -> None:
    asyncio.run(_worker(conn, count, target, per_channel))


async def _worker(conn: Connection, count: int, target: str, per_channel: int) -> None:
    loop = asyncio.get_running_loop()
    channels, calls = await open_streams(target, count, per_channel)

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


async def measure(n: int, rounds: int, worker_count: int,
                  per_channel: int) -> dict[str, Any]:
    origin = await ScriptedOrigin().start()
    origin.set(endpoints(NAME, 1))
    try:
        # drain_period 0: the harness's SIGTERM at the end need not wait.
        async with relay_process("bench-relay", origin.port, drain_period=0) as relay:
            pid = relay.process.pid
            await asyncio.sleep(0.5)
            rss_before = rss_kib(pid)
            async with workers(worker_main, n, worker_count, relay.target,
                               per_channel) as clients:
                await asyncio.sleep(0.5)
                rss_after = rss_kib(pid)
                all_latencies, median_latencies = [], []
                cpu_before = cpu_seconds(pid)
                for round_no in range(rounds):
                    message = endpoints(NAME, 1000 + round_no)
                    clients.send(version_of(message))
                    await asyncio.sleep(0.2)  # let workers start reading
                    sent = time.monotonic()
                    origin.set(message)
                    times = [t for ts in await clients.next_messages() for t in ts]
                    all_latencies.append(max(times) - sent)
                    median_latencies.append(statistics.median(times) - sent)
                # Includes the 0.2 s pauses, in which the relay idles.
                cpu_per_round = (cpu_seconds(pid) - cpu_before) / rounds
                clients.send(None)
    finally:
        await origin.stop()
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
