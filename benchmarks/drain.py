"""Drain benchmark: how a relay with N connected streams lets them go on SIGTERM.

A relay runs as its own process (``xds-relay run``, ``server.drain_period``
P) behind a scripted origin; worker processes open N delta streams (one
connection each) and wait. Then the relay gets SIGTERM. Reported: how the
stream closes spread over the period (first, median, last, closes per
second, the busiest second against the even rate N/P), the status clients
saw, and when the process exited and with what code.

Usage: ``python -m benchmarks.drain [--streams 2000] [--period 5] [--workers 2]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from benchmarks.fanout import DELTA_ADS, NAME, free_port, wait_for_worker, wait_ready
from relay.xds_types import ENDPOINT
from tests.harness import ScriptedOrigin, endpoints


def worker_main(conn: Connection, target: str, count: int) -> None:
    asyncio.run(_worker(conn, target, count))


async def _worker(conn: Connection, target: str, count: int) -> None:
    channels = [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(count)]
    calls = []
    for channel in channels:
        call = channel.stream_stream(
            DELTA_ADS, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
        await call.write(discovery_pb2.DeltaDiscoveryRequest(
            node={"id": "drain-bench"}, type_url=ENDPOINT, resource_names_subscribe=[NAME]))
        calls.append(call)
    for call in calls:
        await call.read()
    conn.send("ready")

    async def until_closed(call: Any) -> tuple[float, str, str]:
        try:
            while await call.read() is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as error:
            return time.time(), error.code().name, error.details() or ""
        return time.time(), "OK", ""

    conn.send(await asyncio.gather(*(until_closed(c) for c in calls)))
    for channel in channels:
        await channel.close()


async def measure(n: int, period: float, workers: int) -> dict[str, Any]:
    origin = await ScriptedOrigin().start()
    origin.set(endpoints(NAME, 1))
    xds_port, admin_port = free_port(), free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
        config.write(f"""
node: {{id: drain-bench}}
server: {{address: "127.0.0.1:{xds_port}", drain_period: {period}s}}
admin: {{address: "127.0.0.1:{admin_port}"}}
upstream: {{address: "127.0.0.1:{origin.port}"}}
logging: {{level: warning}}
""")
    relay = subprocess.Popen(  # noqa: ASYNC220 (started once, before measuring)
        [sys.executable, "-m", "relay", "run", "--config", config.name])
    loop = asyncio.get_running_loop()
    procs: list[mp.Process] = []
    try:
        await wait_ready(admin_port)
        ctx = mp.get_context("spawn")
        pipes = []
        for share in (n // workers + (1 if i < n % workers else 0) for i in range(workers)):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(theirs, f"127.0.0.1:{xds_port}", share))
            proc.start()
            procs.append(proc)
            pipes.append(ours)
        for pipe, proc in zip(pipes, procs, strict=True):
            await wait_for_worker(loop, pipe, proc, "ready")
        sent = time.time()
        relay.send_signal(signal.SIGTERM)
        ends: list[tuple[float, str, str]] = []
        for pipe, proc in zip(pipes, procs, strict=True):
            ends.extend(await wait_for_worker(loop, pipe, proc))
        code = await loop.run_in_executor(None, relay.wait, period + 30)
        exited = time.time() - sent
    finally:
        if relay.poll() is None:
            relay.kill()
        for proc in procs:
            proc.kill()
        await origin.stop()
    closed = sorted(t - sent for t, _, _ in ends)
    per_second = Counter(int(t) for t in closed)
    return {
        "streams": n, "drain_period_s": period,
        "first_close_s": round(closed[0], 2), "median_close_s": round(statistics.median(closed), 2),
        "last_close_s": round(closed[-1], 2),
        "busiest_second": max(per_second.values()), "even_rate_per_s": round(n / period, 1),
        "statuses": {f"{code} {details}": k
                     for (code, details), k in Counter((c, d) for _, c, d in ends).items()},
        "exit_code": code, "exit_after_s": round(exited, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--period", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    result = asyncio.run(measure(args.streams, args.period, args.workers))
    print(json.dumps(result, indent=2))
    print(f"\nbusiest second / even rate: "
          f"{result['busiest_second'] / result['even_rate_per_s']:.2f}x")


if __name__ == "__main__":
    main()
