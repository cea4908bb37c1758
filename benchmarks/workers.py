"""Workers benchmark: one origin update reaching M streams, with 1, 2 and N worker processes.

For each worker count W, a fresh relay runs as its own processes
(``xds-relay run --workers W``; W = 1 is today's single process) and follows
a scripted origin in this process. Client processes open M delta streams
(one gRPC connection each, like M Envoys; the kernel spreads the connections
over the workers), subscribe to one ClusterLoadAssignment and ACK what they
get. Then, per round, the origin changes it and every stream notes when the
new version arrived. Reported per W:

* time from the origin's send until the update reached all M streams (and
  the median stream), median and max over the rounds;
* CPU time per update summed over every relay process (hub and workers),
  that of the busiest process (with a core for each process, the fan-out
  takes at least that long) and the hub's;
* how many streams the origin saw (it must be 1, whatever W) and how the
  clients spread over the workers.

The clients share the machine with the relay: on a machine with few cores
they compete with the workers for them, and the figures say more about the
machine than about the relay (see the README, "Beyond one core").

Usage: ``python -m benchmarks.workers [--workers 1,2,N] [--streams 1000] [--rounds 5]
[--clients 2]`` (N: the number of CPUs). Writes a table to stdout and JSON to
``benchmarks/results/workers.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import urllib.request
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2

from benchmarks.processes import NAME, cpu_seconds, open_streams, relay_process, workers
from relay.xds_types import ENDPOINT
from tests.harness import ScriptedOrigin, endpoints, version_of

# -- client processes -------------------------------------------------------------


def client_main(conn: Connection, count: int, target: str) -> None:
    asyncio.run(_clients(conn, count, target))


async def _clients(conn: Connection, count: int, target: str) -> None:
    """``count`` streams; per command (a version), when each stream got it."""
    loop = asyncio.get_running_loop()
    channels, calls = await open_streams(target, count)

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
    while (version := await loop.run_in_executor(None, conn.recv)) is not None:
        conn.send(await asyncio.gather(*(receive(c, version) for c in calls)))
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()


# -- the harness ------------------------------------------------------------------


def admin_clients(admin_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/clients", timeout=10) as reply:
        return dict(json.loads(reply.read()))


async def measure(worker_count: int, streams: int, rounds: int,
                  client_processes: int) -> dict[str, Any]:
    origin = await ScriptedOrigin().start()
    origin.set(endpoints(NAME, 1))
    run_args = ["--workers", str(worker_count)] if worker_count > 1 else []
    try:
        async with relay_process("bench-relay", origin.port, drain_period=0,
                                 run_args=run_args) as relay, \
                workers(client_main, streams, client_processes, relay.target) as clients:
            await asyncio.sleep(0.5)
            listing = await asyncio.to_thread(admin_clients, relay.admin_port)
            pids = [relay.process.pid, *(w["pid"] for w in listing.get("workers", []))]
            spread = Counter(c.get("worker", 1) for c in listing["clients"])
            latencies, medians = [], []
            cpu_before = [cpu_seconds(pid) for pid in pids]
            for round_no in range(rounds):
                message = endpoints(NAME, 1000 + round_no)
                clients.send(version_of(message))
                await asyncio.sleep(0.2)  # let the clients start reading
                sent = time.monotonic()
                origin.set(message)
                times = [t for ts in await clients.next_messages() for t in ts]
                latencies.append(max(times) - sent)
                medians.append(statistics.median(times) - sent)
            # Includes the 0.2 s pauses, in which the relay idles.
            cpu = [(cpu_seconds(pid) - before) / rounds
                   for pid, before in zip(pids, cpu_before, strict=True)]
            clients.send(None)
    finally:
        await origin.stop()
    return {
        "workers": worker_count,
        "streams": streams,
        "all_ms_median": round(statistics.median(latencies) * 1000, 1),
        "all_ms_max": round(max(latencies) * 1000, 1),
        "median_stream_ms": round(statistics.median(medians) * 1000, 1),
        "relay_cpu_ms_per_update": round(sum(cpu) * 1000, 1),
        # what one core must do per update: with a core per process, the fan-out
        # takes at least this long
        "busiest_process_cpu_ms": round(max(cpu) * 1000, 1),
        "hub_cpu_ms_per_update": round(cpu[0] * 1000, 1) if worker_count > 1 else None,
        "relay_processes": len(pids),
        "streams_per_worker": [spread[i] for i in sorted(spread)],
        "origin_streams": len(origin.streams),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cpus = os.cpu_count() or 1
    parser.add_argument("--workers", default=f"1,2,{cpus}",
                        help=f"worker counts to compare (default 1,2,{cpus}: this machine's CPUs)")
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/workers.json"))
    args = parser.parse_args()
    counts = sorted({int(x) for x in args.workers.split(",")})
    results = []
    for count in counts:
        result = asyncio.run(measure(count, args.streams, args.rounds, args.clients))
        if result["origin_streams"] != 1:
            raise SystemExit(f"the origin saw {result['origin_streams']} streams with "
                             f"{count} workers; expected 1")
        results.append(result)
        print(json.dumps(result), flush=True)
    print(f"\n{cpus} CPUs, {args.streams} streams, {args.clients} client processes")
    print(f"{'workers':>8} {'all (ms)':>9} {'max (ms)':>9} {'median (ms)':>12} "
          f"{'CPU ms/update':>14} {'busiest (ms)':>13} {'hub (ms)':>9} {'origin streams':>15}"
          "  streams per worker")
    for r in results:
        print(f"{r['workers']:>8} {r['all_ms_median']:>9} {r['all_ms_max']:>9} "
              f"{r['median_stream_ms']:>12} {r['relay_cpu_ms_per_update']:>14} "
              f"{r['busiest_process_cpu_ms']:>13} {r['hub_cpu_ms_per_update'] or '-':>9} "
              f"{r['origin_streams']:>15}  {r['streams_per_worker']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cpus": cpus, "results": results}, indent=2))


if __name__ == "__main__":
    main()
