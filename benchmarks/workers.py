"""Workers benchmark: one update reaching M streams, relay with W workers against the bare server.

For each worker count W, a fresh relay runs as its own processes
(``xds-relay run --workers W``; W = 1 is the single process, without
``--workers``) and follows a scripted origin in this process over Delta
ADS. Its baseline is the bare ``grpc.aio`` server of :mod:`benchmarks.bare`
(pre-encoded bytes, the relay's server options, one process), the same for
every W. In one invocation, each run measures the bare server and then each
W, each on a fresh server, the order reversed every other run so that all
of them see the same noise. The same client processes' code is the client
of all: M delta streams (one gRPC connection each, like M Envoys; with
workers the kernel spreads the connections over them) subscribe to one
ClusterLoadAssignment and ACK what they get. Then, per round, the resource
changes (relay: the origin sends it; bare: it is told on its control pipe,
``update NAME PORT``) and every stream notes when the new version arrived.
Per run:

* ``update_all_ms``, ``update_median_stream_ms``: from the change's send
  until the last stream, and the median stream, had it (median of rounds);
* ``cpu_ms_per_update``: the server's CPU time from the send until its
  ACKs are in (mean of rounds), summed over every relay process (the hub,
  the workers, multiprocessing's resource tracker), as
  :mod:`benchmarks.fanout` takes it for one process;
* ``busiest_process_cpu_ms``: that of the process that spent the most
  (with a core for each process, the fan-out takes at least that long);
  the bare server's is its own, as it is one process;
* ``hub_cpu_ms_per_update`` (W > 1): the hub's;
* ``origin_streams`` (relay): streams the origin saw; it must be 1 whatever
  W, and the benchmark stops if it is not;
* ``fewest_streams_per_worker``, ``most_streams_per_worker`` (relay): how
  the kernel spread the clients over the workers (``/clients``).

Each figure is reported per W as min and median over runs, for the relay
and the bare server, with relay / bare (see :mod:`benchmarks.report`).

The clients share the machine with the servers: on a machine with few cores
they compete with the workers for them, and the figures say more about the
machine than about the relay (see docs/running.md, "Beyond one core", and
docs/performance.md#workers).

Usage: ``python -m benchmarks.workers [--workers 1,2,N] [--streams 1000] [--runs 3]
[--rounds 5] [--clients 2]`` (N: the number of CPUs). Writes tables to stdout and
JSON to ``benchmarks/results/workers.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.bare import bare_process
from benchmarks.processes import (
    NAME,
    cpu_seconds,
    open_streams,
    receive_version,
    relay_process,
    workers,
)
from benchmarks.report import Comparison, compare, table, values, write_results
from tests.builders import endpoints, version_of
from tests.harness import ScriptedOrigin

# label of each figure ({w}: the worker count), in the order reported
FIGURES = {
    "update_all_ms": "update reaches all streams, {w} (ms)",
    "update_median_stream_ms": "update reaches median stream, {w} (ms)",
    "cpu_ms_per_update": "server CPU per update, all processes, {w} (ms)",
    "busiest_process_cpu_ms": "busiest process CPU per update, {w} (ms)",
    "hub_cpu_ms_per_update": "hub CPU per update, {w} (ms)",
    "origin_streams": "origin streams, {w}",
    "fewest_streams_per_worker": "streams on the least loaded worker, {w}",
    "most_streams_per_worker": "streams on the most loaded worker, {w}",
}
# the figures that only mean something with workers
WITH_WORKERS = ("hub_cpu_ms_per_update", "fewest_streams_per_worker",
                "most_streams_per_worker")
# the figures the bare server has a counterpart for
COMPARED = ("update_all_ms", "update_median_stream_ms", "cpu_ms_per_update",
            "busiest_process_cpu_ms")

# -- client processes -------------------------------------------------------------


def client_main(conn: Connection, count: int, target: str) -> None:
    asyncio.run(_clients(conn, count, target))


async def _clients(conn: Connection, count: int, target: str) -> None:
    """``count`` streams; per command (a version), when each stream got it."""
    loop = asyncio.get_running_loop()
    channels, calls = await open_streams(target, count)

    await asyncio.gather(*(receive_version(c, None) for c in calls))
    conn.send("ready")
    while (version := await loop.run_in_executor(None, conn.recv)) is not None:
        conn.send(await asyncio.gather(*(receive_version(c, version) for c in calls)))
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()


# -- the servers ------------------------------------------------------------------


def admin_clients(admin_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/clients", timeout=10) as reply:
        return dict(json.loads(reply.read()))


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (children, theirs, ...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            # after the command, which may hold spaces and parentheses
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found.extend(below)
        todo.extend(below)
    return sorted(found)


@dataclass
class Server:
    """What a run measures: a server's processes (the first the one started),
    where its clients connect, and how ``NAME`` changes on it (to
    ``endpoints(NAME, port)``)."""

    kind: str
    pids: list[int]
    target: str
    change: Callable[[int], Awaitable[None]]
    # the relay's: its admin port and origin
    admin_port: int | None = None
    origin: ScriptedOrigin | None = None
    worker_pids: list[int] = field(default_factory=list)


@contextlib.asynccontextmanager
async def bare_server(streams: int) -> AsyncIterator[Server]:
    async with bare_process() as bare:
        async def change(port: int) -> None:
            answer = await bare.command(f"update {NAME} {port}")
            if answer != f"pushed {streams}":
                raise RuntimeError(f"bare server said {answer!r}, expected 'pushed {streams}'")

        yield Server("bare", [bare.pid], bare.target, change)


@contextlib.asynccontextmanager
async def relay_server(worker_count: int, src: Path | None = None) -> AsyncIterator[Server]:
    origin = await ScriptedOrigin().start()
    origin.set(endpoints(NAME, 1))
    run_args = ["--workers", str(worker_count)] if worker_count > 1 else []
    try:
        # drain_period 0: the harness's SIGTERM at the end need not wait.
        async with relay_process("bench-relay", origin.port, drain_period=0,
                                 run_args=run_args, src=src) as relay:
            async def change(port: int) -> None:
                origin.set(endpoints(NAME, port))

            yield Server("relay", [relay.process.pid], relay.target, change,
                         admin_port=relay.admin_port, origin=origin)
    finally:
        await origin.stop()


# -- the harness ------------------------------------------------------------------


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


async def _relay_processes(server: Server, worker_count: int) -> Counter[int]:
    """Finds the relay's processes (into ``server.pids``); how many clients
    each worker has."""
    assert server.admin_port is not None
    listing = await asyncio.to_thread(admin_clients, server.admin_port)
    hub = server.pids[0]
    server.worker_pids = [int(w["pid"]) for w in listing.get("workers", [])]
    server.pids = [hub, *descendants(hub)]
    if len(server.worker_pids) != (worker_count if worker_count > 1 else 0) \
            or not set(server.worker_pids) <= set(server.pids):
        raise RuntimeError(f"relay with {worker_count} workers lists workers "
                           f"{server.worker_pids}, processes {server.pids}")
    return Counter(int(c.get("worker", 1)) for c in listing["clients"])


async def measure(server: Server, worker_count: int, streams: int, rounds: int,
                  client_processes: int) -> dict[str, Any]:
    """One run against a fresh ``server`` (``worker_count`` 0: the bare one)."""
    async with workers(client_main, streams, client_processes, server.target) as clients:
        await asyncio.sleep(0.5)
        spread = (await _relay_processes(server, worker_count)
                  if server.kind == "relay" else None)
        everyone, median_stream = [], []
        cpu: list[list[float]] = []  # per round, per process
        for round_no in range(rounds):
            port = 1000 + round_no
            clients.send(version_of(endpoints(NAME, port)))
            await asyncio.sleep(0.2)  # let the clients start reading
            cpu_before = [cpu_seconds(pid) for pid in server.pids]
            sent = time.monotonic()
            await server.change(port)
            times = [t for ts in await clients.next_messages() for t in ts]
            await asyncio.sleep(0.1)  # the last ACKs
            cpu.append([cpu_seconds(pid) - before
                        for pid, before in zip(server.pids, cpu_before, strict=True)])
            everyone.append(max(times) - sent)
            median_stream.append(statistics.median(times) - sent)
        clients.send(None)
    per_process = [statistics.mean(column) for column in zip(*cpu, strict=True)]
    result: dict[str, Any] = {
        "update_all_ms": _ms(statistics.median(everyone)),
        "update_median_stream_ms": _ms(statistics.median(median_stream)),
        "cpu_ms_per_update": _ms(sum(per_process)),
        "busiest_process_cpu_ms": _ms(max(per_process)),
        "hub_cpu_ms_per_update": _ms(per_process[0]) if worker_count > 1 else None,
        "processes": len(server.pids),
        "process_cpu_ms_per_update": [_ms(c) for c in per_process],
        # the machine's 1-minute load when the run ended: how noisy it was
        "load": os.getloadavg()[0],
    }
    if server.origin is not None and spread is not None:
        per_worker = [spread[i] for i in sorted(spread)]
        result.update({
            "origin_streams": len(server.origin.streams),
            "streams_per_worker": per_worker,
            "fewest_streams_per_worker": min(per_worker),
            "most_streams_per_worker": max(per_worker),
        })
    return result


def workers_label(count: int) -> str:
    return f"W = {count}"


async def run_all(args: argparse.Namespace, counts: list[int]
                  ) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """Every run: the bare server's, and the relay's per worker count."""
    order: list[int] = [0, *counts]  # 0: the bare server
    bare: list[dict[str, Any]] = []
    relay: dict[int, list[dict[str, Any]]] = {count: [] for count in counts}
    for run in range(args.runs):
        # reverse the order every other run, to spread the machine's noise
        for count in order if run % 2 == 0 else order[::-1]:
            server = (bare_server(args.streams) if count == 0
                      else relay_server(count, args.relay_src))
            async with server as s:
                result = await measure(s, count, args.streams, args.rounds, args.clients)
            if count == 0:
                bare.append(result)
            else:
                relay[count].append(result)
            print(json.dumps({"server": "bare" if count == 0 else "relay", "workers": count,
                              "run": run, **result}), flush=True)
            if count and result["origin_streams"] != 1:
                raise SystemExit(f"the origin saw {result['origin_streams']} streams with "
                                 f"{count} workers; expected 1")
    return bare, relay


def summarize(bare: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Comparison]:
    return {key: compare(values(runs, key), values(bare, key) if key in COMPARED else None)
            for key in FIGURES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cpus = os.cpu_count() or 1
    parser.add_argument("--workers", default=f"1,2,{cpus}",
                        help=f"worker counts to compare (default 1,2,{cpus}: this machine's CPUs)")
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3,
                        help="runs of the bare server and of each worker count")
    parser.add_argument("--rounds", type=int, default=5, help="updates per run")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--relay-src", type=Path, default=None, metavar="DIR",
                        help="run another tree's relay (e.g. an export of an earlier commit), "
                             "to compare its ratios with this one's in the same session")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/workers.json"))
    args = parser.parse_args()
    if args.relay_src is not None:
        args.relay_src = args.relay_src.resolve()
    counts = sorted({int(x) for x in args.workers.split(",")})
    if not counts or counts[0] < 1:
        parser.error("worker counts are 1 or more")
    bare, relay = asyncio.run(run_all(args, counts))
    summaries = {count: summarize(bare, relay[count]) for count in counts}
    rows = [(label.format(w=workers_label(count)), summaries[count][key])
            for key, label in FIGURES.items() for count in counts
            if key not in WITH_WORKERS or count > 1]
    loads = [run["load"] for run in [*bare, *(r for rs in relay.values() for r in rs)]]
    print(f"\n{cpus} CPUs, {args.streams} streams from {args.clients} client processes, "
          f"{args.runs} run(s) of each server, {args.rounds} updates per run, "
          f"load {min(loads):.1f}-{max(loads):.1f}; W = 1 is one process (no --workers), "
          f"the bare columns are the same bare runs for every W:\n{table(rows, 'figure')}")
    write_results(
        args.out, "benchmarks.workers", streams=args.streams, clients=args.clients,
        relay_src=str(args.relay_src or Path(__file__).resolve().parents[1]),
        runs=args.runs, rounds=args.rounds, bare_runs=bare,
        results=[{"workers": count, "runs": relay[count], "summary": summaries[count]}
                 for count in counts])


if __name__ == "__main__":
    main()
