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
import signal
import statistics
import time
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

import grpc

from benchmarks.processes import NAME, open_streams, relay_process, workers
from tests.harness import ScriptedOrigin, endpoints


def worker_main(conn: Connection, count: int, target: str) -> None:
    asyncio.run(_worker(conn, count, target))


async def _worker(conn: Connection, count: int, target: str) -> None:
    channels, calls = await open_streams(target, count)
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


async def measure(n: int, period: float, worker_count: int) -> dict[str, Any]:
    origin = await ScriptedOrigin().start()
    origin.set(endpoints(NAME, 1))
    loop = asyncio.get_running_loop()
    try:
        async with relay_process("drain-bench", origin.port, period) as relay, \
                workers(worker_main, n, worker_count, relay.target) as clients:
            sent = time.time()
            relay.process.send_signal(signal.SIGTERM)
            ends = [end for ends in await clients.next_messages() for end in ends]
            code = await loop.run_in_executor(None, relay.process.wait, period + 30)
            exited = time.time() - sent
    finally:
        await origin.stop()
    closed = sorted(t - sent for t, _, _ in ends)
    per_second = Counter(int(t) for t in closed)
    return {
        "streams": n, "drain_period_s": period,
        "first_close_s": round(closed[0], 2), "median_close_s": round(statistics.median(closed), 2),
        "last_close_s": round(closed[-1], 2),
        "busiest_second": max(per_second.values()), "even_rate_per_s": round(n / period, 1),
        "statuses": {f"{status} {details}": k
                     for (status, details), k in Counter((c, d) for _, c, d in ends).items()},
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
