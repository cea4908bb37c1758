"""Fan-out benchmark: the relay against bare gRPC servers, N streams each.

For each N, runs alternate between servers, each in its own process: the
relay (``xds-relay run``, following a scripted origin in this process over
Delta ADS) and two baselines, the bare ``grpc.aio`` server of
:mod:`benchmarks.bare` (pre-encoded bytes) with the relay's gRPC server
options as it runs by default, connection ageing included (``bare``), and
with gRPC's defaults (``bare-default``; but for its queue of calls, see
:mod:`benchmarks.bare`): what the relay's options cost shows between the
two (``bare / bare-default``). ``bare-no-age`` and ``relay-no-age`` are
each without ``server.max_connection_age`` (gRPC's per-connection timer
for it is most of that cost; ``relay / relay-no-age`` is what it costs the
relay). ``bare-default-malloc`` is ``bare-default`` on glibc's malloc, the
relay's allocator (``PYTHONMALLOC=malloc``; :mod:`relay.memory`):
``relay-no-age / bare-default-malloc`` is what the relay's own code holds.
``relay-no-window`` is the relay with ``server.batch_window: 0s``: it pushes
as soon as an origin change is cached, where by default it waits 5 ms for
the rest of the origin's burst (a deliberate trade: one push per burst, and
make-before-break order; see docs/performance.md). ``relay-no-window /
bare-default`` is the relay's own cost without the configured wait.
The same worker processes' code is the client of all: N delta streams
(one gRPC connection each, like N Envoys) subscribe to one
ClusterLoadAssignment and ACK what they get.

A run: one stream in this process subscribes (for the relay, it keeps the
resource cached and the relay synced); then the N streams connect all at
once (a connection storm on a warm server); then, per round, the resource
changes (relay: the origin sends it; bare: it is told on its control pipe)
and every stream notes when the new version arrived. Per run:

* ``update_all_ms``, ``update_median_stream_ms``: from the change's send
  until the last stream, and the median stream, had it (median of rounds);
* ``cpu_ms_per_update``: the server's CPU time from the send until its
  ACKs are in (mean of rounds); steadier than wall time, as the server
  shares the machine with the clients (and, in the results only,
  ``main_thread_cpu_ms_per_update``: that of its main thread, Python's event
  loop; gRPC's threads have the rest);
* ``rss_kib_per_stream``: the server's resident memory after the storm
  less before it, per stream;
* ``storm_all_ms``, ``storm_median_stream_ms``: from the storm's start
  until every stream, and the median stream, had its first response;
* ``storm_cpu_ms``: the server's CPU time meanwhile (and, in the results
  only, ``storm_main_thread_cpu_ms``: its main thread's, and
  ``storm_client_cpu_ms``: the client workers');
* ``storm_origin_requests`` (relay only): requests the origin received
  meanwhile; the resource is cached, so none should be.

Each figure is reported as min and median over runs for every server,
then as ratios of like with like (min over min, median over median): the
relay over each baseline.

The relay runs from ``--relay-src`` (default: this checkout; a git worktree
of another commit measures that commit with this checkout's clients and
baselines). ``--servers`` picks the servers; ``bare-gc`` is ``bare`` with the
relay's garbage collector settings too; ``relay-pymalloc`` is the relay
with ``PYTHONMALLOC=pymalloc`` (CPython's own allocator; ``xds-relay run``
otherwise starts again on glibc's malloc), reported against the relay too.

Usage: ``python -m benchmarks.fanout [--streams 1000,2000] [--runs 3] [--rounds 5] [--workers 2]
[--relay-src DIR] [--before-src DIR] [--servers bare,bare-default,relay]``;
``--before-src`` adds ``relay-before``, the relay from another tree (an
export of an earlier commit), alternating with the rest: before and after
in one invocation, under the same noise.
Writes tables to stdout and JSON to ``benchmarks/results/fanout.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.bare import bare_process
from benchmarks.processes import (
    NAME,
    ClientTLS,
    cpu_seconds,
    main_thread_cpu_seconds,
    new_streams,
    open_streams,
    receive_version,
    relay_process,
    subscription,
    workers,
)
from benchmarks.report import revision, server_tables, summarize_servers, write_results
from tests.builders import endpoints, version_of
from tests.harness import ScriptedOrigin

# every server a run can measure, in the order they alternate; the default set
SERVERS = ("bare", "bare-no-age", "bare-default", "bare-default-malloc", "bare-gc", "relay",
           "relay-no-age", "relay-no-window", "relay-pymalloc", "relay-before")
DEFAULT_SERVERS = ("bare", "bare-default", "relay")
# (a, b) of each ratio a / b reported, of the servers that ran; bare / bare-default
# is what the relay's gRPC options cost (connection ageing above all: see bare-no-age)
RATIOS = (("relay", "bare"), ("relay", "bare-default"), ("relay", "bare-gc"),
          ("bare", "bare-default"), ("bare-no-age", "bare-default"),
          ("relay-no-age", "bare-no-age"), ("relay-no-age", "bare-default"),
          ("relay", "relay-no-age"), ("relay-no-age", "bare-default-malloc"),
          ("relay-no-window", "bare-default"), ("relay", "relay-no-window"),
          ("bare-default-malloc", "bare-default"),
          ("relay-pymalloc", "bare"), ("relay-pymalloc", "bare-default"),
          ("relay-pymalloc", "relay"),
          ("relay-before", "bare"), ("relay-before", "bare-default"), ("relay", "relay-before"))
# label of each figure, in the order reported
FIGURES = {
    "update_all_ms": "update reaches all streams (ms)",
    "update_median_stream_ms": "update reaches median stream (ms)",
    "cpu_ms_per_update": "server CPU per update (ms)",
    "rss_kib_per_stream": "RSS per idle stream (KiB)",
    "storm_all_ms": "storm: all streams answered (ms)",
    "storm_median_stream_ms": "storm: median stream answered (ms)",
    "storm_cpu_ms": "storm: server CPU (ms)",
    "storm_origin_requests": "storm: requests to the origin",
}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# -- client workers (separate processes) ----------------------------------------


def worker_main(conn: Connection, count: int, target: str, per_channel: int,
                tls: ClientTLS | None = None) -> None:
    asyncio.run(_worker(conn, count, target, per_channel, tls))


async def _worker(conn: Connection, count: int, target: str, per_channel: int,
                  tls: ClientTLS | None) -> None:
    """Says ``"ready"``; on ``"storm"`` opens its streams at once (over TLS with
    ``tls``) and sends when each got its first response; then, per version it
    is sent, when each got that version; stops on None."""
    loop = asyncio.get_running_loop()
    conn.send("ready")
    command = await loop.run_in_executor(None, conn.recv)
    assert command == "storm", command
    channels, calls = new_streams(target, count, per_channel, tls)

    async def join(index: int, call: Any) -> float:
        await call.write(subscription(index))
        return await receive_version(call, None)

    conn.send(await asyncio.gather(*(join(i, c) for i, c in enumerate(calls))))
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command is None:
            break
        conn.send(await asyncio.gather(*(receive_version(c, command) for c in calls)))
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()


# -- the servers ------------------------------------------------------------------


@dataclass
class Server:
    """What a run measures: a server process, where its clients connect, and
    how ``NAME`` changes on it (to ``endpoints(NAME, port)``); with
    ``client_tls``, how each client reaches it over TLS (given ``"keeper"``
    or ``"client-<i>"``, the i-th client worker)."""

    kind: str
    pid: int
    target: str
    change: Callable[[int], Awaitable[None]]
    # requests its origin has received so far (the relay's only)
    origin_requests: Callable[[], int] | None = None
    client_tls: Callable[[str], ClientTLS | None] = field(default=lambda name: None)


@contextlib.asynccontextmanager
async def bare_server(kind: str = "bare", options: str = "relay",
                      tls: tuple[Path, Path] | None = None,
                      client_tls: Callable[[str], ClientTLS | None] = lambda name: None,
                      gc: str = "default", env: dict[str, str] | None = None
                      ) -> AsyncIterator[Server]:
    """The bare server with ``options`` (``"relay"``: the relay's gRPC options,
    ``"default"``: gRPC's), over TLS with ``tls`` (certificate and key files),
    with the relay's garbage collector settings if ``gc="relay"``, ``env``
    added to its environment."""
    async with bare_process(options=options, tls=tls, gc=gc, env=env) as bare:
        async def change(port: int) -> None:
            await bare.command(f"update {NAME} {port}")

        yield Server(kind, bare.pid, bare.target, change, client_tls=client_tls)


@contextlib.asynccontextmanager
async def relay_server(kind: str = "relay", server_extra: str = "",
                       client_tls: Callable[[str], ClientTLS | None] = lambda name: None,
                       *, src: Path | None = None, env: dict[str, str] | None = None
                       ) -> AsyncIterator[Server]:
    """A relay following a scripted origin; ``server_extra``: more keys of its
    ``server`` section (see :func:`relay_process`), e.g. ``tls``; ``src``:
    the tree it runs from, ``env``: more of its environment."""
    origin = await ScriptedOrigin().start()
    origin.set(endpoints(NAME, 1))
    try:
        # drain_period 0: the harness's SIGTERM at the end need not wait.
        async with relay_process("bench-relay", origin.port, drain_period=0,
                                 server_extra=server_extra, src=src, env=env) as relay:
            async def change(port: int) -> None:
                origin.set(endpoints(NAME, port))

            yield Server(kind, relay.process.pid, relay.target, change,
                         lambda: len(origin.all_requests()), client_tls)
    finally:
        await origin.stop()


def starters(src: Path | None = None, before: Path | None = None
             ) -> dict[str, Callable[[], AbstractAsyncContextManager[Server]]]:
    """How to start a fresh server of each kind in :data:`SERVERS` (the relay's
    from ``src``; ``relay-before``'s from ``before``)."""
    return {
        "bare": bare_server,
        "bare-no-age": functools.partial(bare_server, "bare-no-age", "relay-no-age"),
        "bare-default": functools.partial(bare_server, "bare-default", "default"),
        "bare-default-malloc": functools.partial(bare_server, "bare-default-malloc", "default",
                                                 env={"PYTHONMALLOC": "malloc"}),
        "bare-gc": functools.partial(bare_server, "bare-gc", gc="relay"),
        "relay": functools.partial(relay_server, src=src),
        "relay-no-age": functools.partial(relay_server, "relay-no-age",
                                          "max_connection_age: 0s", src=src),
        "relay-no-window": functools.partial(relay_server, "relay-no-window",
                                             "batch_window: 0s", src=src),
        "relay-pymalloc": functools.partial(relay_server, "relay-pymalloc", src=src,
                                            env={"PYTHONMALLOC": "pymalloc"}),
        "relay-before": functools.partial(relay_server, "relay-before", src=before),
    }


SERVER_OF = starters()


@contextlib.asynccontextmanager
async def keeper(target: str, tls: ClientTLS | None = None) -> AsyncIterator[None]:
    """One stream holding ``NAME`` (ACKing all it gets), so that the relay has
    it cached before the storm and keeps it."""
    channels, calls = await open_streams(target, 1, tls=tls)
    call = calls[0]
    await receive_version(call, None)

    async def ack_all() -> None:
        while True:
            await receive_version(call, None)

    task = asyncio.create_task(ack_all())
    try:
        yield
    finally:
        task.cancel()
        call.cancel()
        await channels[0].close()


# -- the harness ------------------------------------------------------------------


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _no_phases(phase: str, pid: int) -> AbstractAsyncContextManager[None]:
    return contextlib.nullcontext()


async def measure(start: Callable[[], AbstractAsyncContextManager[Server]], n: int,
                  rounds: int, worker_count: int, per_channel: int,
                  phases: Callable[[str, int], AbstractAsyncContextManager[Any]] = _no_phases
                  ) -> dict[str, Any]:
    """One run against a fresh server, from ``start`` (e.g. ``SERVER_OF[kind]``).

    ``phases(phase, pid)`` is entered around the storm (``"storm"``) and the
    updates (``"updates"``), given the server's pid: a profiler's hook
    (:mod:`benchmarks.profile`)."""
    async with start() as server, keeper(server.target, server.client_tls("keeper")):
        await asyncio.sleep(0.5)
        rss_before = rss_kib(server.pid)
        async with workers(worker_main, n, worker_count, server.target, per_channel,
                           each=[server.client_tls(f"client-{i}")
                                 for i in range(worker_count)]) as clients:
            requests_before = server.origin_requests() if server.origin_requests else 0
            client_pids = [p.pid for p in clients.processes if p.pid is not None]
            cpu_before = cpu_seconds(server.pid)
            main_before = main_thread_cpu_seconds(server.pid)
            client_cpu_before = sum(cpu_seconds(pid) for pid in client_pids)
            async with phases("storm", server.pid):
                started = time.monotonic()
                clients.send("storm")
                firsts = [t for ts in await clients.next_messages() for t in ts]
            storm_cpu = cpu_seconds(server.pid) - cpu_before
            storm_main = main_thread_cpu_seconds(server.pid) - main_before
            storm_client_cpu = sum(cpu_seconds(pid) for pid in client_pids) - client_cpu_before
            storm_requests = (server.origin_requests() - requests_before
                              if server.origin_requests else None)
            await asyncio.sleep(0.5)
            rss_after = rss_kib(server.pid)
            everyone, median_stream, cpu, main = [], [], [], []
            async with phases("updates", server.pid):
                for round_no in range(rounds):
                    port = 1000 + round_no
                    clients.send(version_of(endpoints(NAME, port)))
                    await asyncio.sleep(0.2)  # let workers start reading
                    cpu_before = cpu_seconds(server.pid)
                    main_before = main_thread_cpu_seconds(server.pid)
                    sent = time.monotonic()
                    await server.change(port)
                    times = [t for ts in await clients.next_messages() for t in ts]
                    await asyncio.sleep(0.1)  # the last ACKs
                    cpu.append(cpu_seconds(server.pid) - cpu_before)
                    main.append(main_thread_cpu_seconds(server.pid) - main_before)
                    everyone.append(max(times) - sent)
                    median_stream.append(statistics.median(times) - sent)
            clients.send(None)
    return {
        "update_all_ms": _ms(statistics.median(everyone)),
        "update_median_stream_ms": _ms(statistics.median(median_stream)),
        "cpu_ms_per_update": _ms(statistics.mean(cpu)),
        "main_thread_cpu_ms_per_update": _ms(statistics.mean(main)),
        "rss_kib_per_stream": round((rss_after - rss_before) / n, 1),
        "storm_all_ms": _ms(max(firsts) - started),
        "storm_median_stream_ms": _ms(statistics.median(firsts) - started),
        "storm_cpu_ms": _ms(storm_cpu),
        "storm_main_thread_cpu_ms": _ms(storm_main),
        "storm_client_cpu_ms": _ms(storm_client_cpu),
        "storm_origin_requests": storm_requests,
        "rss_mib_before": round(rss_before / 1024, 1),
        "rss_mib_after": round(rss_after / 1024, 1),
        # the machine's 1-minute load when the run ended: how noisy it was
        "load": os.getloadavg()[0],
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each server's spread per figure, and the ratios of :data:`RATIOS`."""
    return summarize_servers(runs, list(FIGURES), RATIOS)


async def run_all(args: argparse.Namespace, servers: list[str]) -> list[dict[str, Any]]:
    start = starters(args.relay_src, args.before_src)
    results = []
    for n in (int(x) for x in args.streams.split(",")):
        runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in servers}
        for run in range(args.runs):
            # rotate which goes first, to spread the machine's noise
            shift = run % len(servers)
            for kind in [*servers[shift:], *servers[:shift]]:
                result = await measure(start[kind], n, args.rounds, args.workers,
                                       args.streams_per_connection)
                runs[kind].append(result)
                print(json.dumps({"streams": n, "server": kind, "run": run, **result}),
                      flush=True)
        results.append({"streams": n, "runs": runs, "summary": summarize(runs)})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1000,2000")
    parser.add_argument("--runs", type=int, default=3, help="runs per server and N")
    parser.add_argument("--rounds", type=int, default=5, help="updates per run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--streams-per-connection", type=int, default=1)
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the tree the relay runs from (default: this checkout)")
    parser.add_argument("--before-src", type=Path,
                        help="another tree, run as the server relay-before (added to "
                             "--servers): before and after in one invocation, alternating")
    parser.add_argument("--servers", default=",".join(DEFAULT_SERVERS),
                        help=f"a subset of {','.join(SERVERS)}")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fanout.json"))
    args = parser.parse_args()
    asked = args.servers.split(",") + (["relay-before"] if args.before_src else [])
    if unknown := set(asked) - set(SERVERS):
        parser.error(f"unknown servers: {', '.join(sorted(unknown))}")
    servers = [s for s in SERVERS if s in asked]
    if "relay-before" in asked and args.before_src is None:
        parser.error("relay-before runs the tree given by --before-src")
    args.relay_src = args.relay_src.resolve()
    commit = revision(args.relay_src)
    before = "" if args.before_src is None else \
        f", relay-before at {revision(args.before_src)} ({args.before_src.resolve()})"
    results = asyncio.run(run_all(args, servers))
    for result in results:
        loads = [run["load"] for runs in result["runs"].values() for run in runs]
        print(f"\n{result['streams']} streams, {args.runs} runs each, relay at {commit} "
              f"({args.relay_src}){before}, 1-minute load {min(loads):.1f}-{max(loads):.1f}:\n"
              f"{server_tables(result['summary'], FIGURES, servers)}")
    write_results(args.out, "benchmarks.fanout", runs=args.runs, rounds=args.rounds,
                  relay_src=str(args.relay_src), revision=commit, servers=servers,
                  before_src=None if args.before_src is None else str(args.before_src),
                  results=results)


if __name__ == "__main__":
    main()
