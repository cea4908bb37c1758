"""REST polling benchmark: pollers POSTing JSON DiscoveryRequests, as Envoy's
``api_type: REST`` subscriptions do, against the relay's REST listener and a
bare aiohttp server, side by side in one invocation.

Each poller asks for the same K ClusterLoadAssignments (``big-0`` ...,
about ``--size`` bytes each) over and over, as a node of its own (its own
node id, as every Envoy of a fleet has), on a keep-alive connection of its
own, in three phases:

* full: with no ``version_info``, so that every poll is answered in full
  (200, the JSON DiscoveryResponse);
* current: with the version it was given, so that every poll is answered
  ``304 Not Modified`` with no body (what a fleet polling an unchanged
  config costs);
* fresh: as current, but each poll as a node never seen before (a new node
  id every poll), so that the relay decodes and fetches every one: what a
  poll costs it the first time, or after a change (the relay answers a poll
  it answered before from a lease that has not changed without either).

The bare server (this module's ``serve_bare``, its own process) does the
least a real server must: it reads the body, decodes it as JSON, and writes
the relay's own answer, fetched once from the relay and held as bytes (so
both send the very same bytes), or 304 when the poll's ``version_info`` is
the answer's. The relay's origin is :mod:`benchmarks.bare`'s gRPC server;
the relay runs from ``--relay-src`` (default: this checkout; another
tree, such as a git worktree of an older commit, for a before and after).

Pollers run in worker processes (``--workers``), so the figures are the
servers'. Per phase, after a poll each that is not measured: the time for
every poller to make ``--polls`` polls and the server's CPU time per poll,
all its threads, and its main thread's (the event loop's: the relay's
other threads are gRPC's), relay against bare; runs alternate, min and
median over ``--runs``.

``--names 5000,20000,50000``: the same phases for polls of that many names
each (``--pollers`` pollers, default 2 there, ``--polls`` each, default 5),
with the CPU per poll and per name, to see that a poll costs what its names
do (the same per name at every size).

``--holds 5000,20000,50000``: how long one big poll holds the relay's event
loop. In this process (``--in-process``, the relay's ``--relay-src``
package imported here): a real REST server on a loopback port, over a
cache of N small ClusterLoadAssignments, and a 1 ms timer measuring every
hold of the loop (as :mod:`benchmarks.console`: wall, and the loop thread's
CPU time, which the machine's load does not inflate), while one poll at a
time comes from a process of its own. Otherwise, as another client sees it
in a relay process: A probe (its own process) polls one name
again and again (each answered ``304`` from the answers kept), and its
slowest answer while the big poll is served is the stall. Per run and
size, every name cached first: ``idle``, the probe with no big poll (its
own pace); ``first``, a poll of N names the relay has no lease of (N - 1
of the first N, and one more: a new lease, a fetch, and the lease's JSON
written), then ``again``, the same names as another node (a fetch; the
JSON is the lease's). With the big poll's own time and the relay's CPU
time for it.

Usage: ``python -m benchmarks.rest [--pollers 100] [--resources 100]
[--size 1024] [--polls 50] [--runs 3] [--workers 2] [--relay-src DIR]
[--names 5000,20000,50000] [--holds 5000,20000,50000]``
Writes a table to stdout and JSON to ``benchmarks/results/rest.json``
(``rest-names.json`` with ``--names``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.bare import bare_process, big_names
from benchmarks.processes import cpu_seconds, main_thread_cpu_seconds, relay_process, workers
from benchmarks.report import Comparison, compare, revision, table, values, write_results
from relay.xds_types import ENDPOINT
from tests.ports import free_port

PATH = "/v3/discovery:endpoints"
PHASES = ("full", "current", "fresh")
#: In a poll's body, what each poller writes its own node id over.
NODE = "@NODE@"


def request_body(names: Sequence[str], version_info: str = "", node_id: str = NODE) -> bytes:
    """A poll as Envoy writes it (JSON names of the DiscoveryRequest fields)."""
    body: dict[str, Any] = {"node": {"id": node_id, "cluster": "bench"},
                            "typeUrl": ENDPOINT, "resourceNames": list(names)}
    if version_info:
        body["versionInfo"] = version_info
    return json.dumps(body).encode()


# -- the bare server ---------------------------------------------------------------


def serve_bare(conn: Connection, port: int, answer: bytes, version_info: str) -> None:
    """A bare aiohttp server on ``port`` answering every poll with ``answer``
    (or 304 for ``version_info``); says "ready", runs until told "stop"."""
    asyncio.run(_serve_bare(conn, port, answer, version_info))


async def _serve_bare(conn: Connection, port: int, answer: bytes, version_info: str) -> None:
    from aiohttp import web

    async def poll(request: web.Request) -> web.Response:
        polled = json.loads(await request.read())
        if polled.get("versionInfo") == version_info:
            return web.Response(status=304)
        return web.Response(body=answer, content_type="application/json")

    app = web.Application()
    app.router.add_post(PATH, poll)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    conn.send("ready")
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    await runner.cleanup()


# -- the pollers ---------------------------------------------------------------------


def poller_main(conn: Connection, count: int) -> None:
    asyncio.run(_pollers(conn, count))


async def _pollers(conn: Connection, count: int) -> None:
    """``count`` pollers; per "poll" message (url, body, polls, fresh), each
    polls that many times, as a node of its own (every poll as a new one
    with ``fresh``); answers how many answers of each status came, and the time."""
    conn.send("ready")
    loop = asyncio.get_running_loop()
    while (message := await loop.run_in_executor(None, conn.recv)) is not None:
        conn.send(await _round(count, *message))


async def _round(count: int, url: str, body: bytes, polls: int, fresh: bool
                 ) -> tuple[dict[int, int], float]:
    """``count`` pollers, a keep-alive connection each, polling ``polls`` times."""
    import aiohttp

    statuses: dict[int, int] = {}
    headers = {"Content-Type": "application/json"}
    head, _, tail = body.partition(NODE.encode())
    me = f"poller-{os.getpid()}"
    made = itertools.count()
    this_round = os.urandom(4).hex()  # fresh's nodes are new in every round too

    async def poll(session: aiohttp.ClientSession, node_id: str) -> int:
        data = head + node_id.encode() + tail
        async with session.post(url, data=data, headers=headers) as reply:
            await reply.read()
            return reply.status

    async def poller(session: aiohttp.ClientSession, i: int) -> None:
        for _ in range(polls):
            status = await poll(session, f"{me}-{i}-{this_round}-{next(made)}" if fresh
                                else f"{me}-{i}")
            statuses[status] = statuses.get(status, 0) + 1

    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
                for _ in range(count)]
    try:
        # One poll each first, so that every connection is open before the clock starts.
        await asyncio.gather(*(poll(s, f"{me}-{i}") for i, s in enumerate(sessions)))
        started = time.perf_counter()
        await asyncio.gather(*(poller(s, i) for i, s in enumerate(sessions)))
        return statuses, time.perf_counter() - started
    finally:
        for session in sessions:
            await session.close()


# -- the harness -------------------------------------------------------------------


@dataclass
class Server:
    url: str
    pid: int


async def first_answer(url: str, body: bytes, count: int, timeout: float = 120.0) -> bytes:
    """The relay's 200 answer to ``body``, once it holds all ``count`` resources
    (it subscribes the names on the origin at the first poll: a 503 until
    some are in, then what it has after ``rest.wait``)."""
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.post(url, data=body) as reply:
                if reply.status == 200:
                    answer = await reply.read()
                    if len(json.loads(answer).get("resources", ())) == count:
                        return answer
            await asyncio.sleep(0.1)
    raise RuntimeError(f"no 200 of {count} resources from {url} within {timeout}s")


@contextlib.asynccontextmanager
async def bare_server(answer: bytes, version_info: str) -> AsyncIterator[Server]:
    port = free_port()
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    process = ctx.Process(target=serve_bare, args=(theirs, port, answer, version_info))
    process.start()
    try:
        if await asyncio.get_running_loop().run_in_executor(None, ours.recv) != "ready":
            raise RuntimeError("bare server did not start")
        assert process.pid is not None
        yield Server(f"http://127.0.0.1:{port}{PATH}", process.pid)
    finally:
        ours.send("stop")
        process.join(10)
        if process.is_alive():
            process.kill()


async def measure(server: Server, pollers: Any, names: Sequence[str], version_info: str,
                  polls: int, count: int) -> dict[str, Any]:
    """Both phases against ``server``: seconds for all polls, server CPU per poll."""
    run: dict[str, Any] = {}
    for phase in PHASES:
        body = request_body(names, version_info if phase != "full" else "")
        # A poll each first, not measured: a node's first poll (each of
        # fresh's is one) is what fresh measures.
        pollers.send((server.url, body, 1, False))
        await pollers.next_messages()
        cpu, loop_cpu = cpu_seconds(server.pid), main_thread_cpu_seconds(server.pid)
        pollers.send((server.url, body, polls, phase == "fresh"))
        answers = await pollers.next_messages()
        cpu = cpu_seconds(server.pid) - cpu
        loop_cpu = main_thread_cpu_seconds(server.pid) - loop_cpu
        statuses: dict[int, int] = {}
        for worker_statuses, _ in answers:
            for status, n in worker_statuses.items():
                statuses[status] = statuses.get(status, 0) + n
        expected = 200 if phase == "full" else 304
        if statuses != {expected: polls * count}:
            raise RuntimeError(f"{phase}: answers {statuses}, expected {polls * count} "
                               f"x {expected}")
        run[f"{phase}_seconds"] = max(seconds for _, seconds in answers)
        run[f"{phase}_cpu_ms_per_poll"] = cpu * 1000 / (polls * count)
        run[f"{phase}_loop_cpu_ms_per_poll"] = loop_cpu * 1000 / (polls * count)
        run[f"{phase}_cpu_us_per_name"] = cpu * 1e6 / (polls * count * max(1, len(names)))
    return run


async def run_all(args: argparse.Namespace, sizes: Sequence[int]
                  ) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Per number of names polled, the relay's and the bare server's runs."""
    results: dict[int, dict[str, list[dict[str, Any]]]] = {}
    rest_port = free_port()
    async with bare_process(big=max(sizes), size=args.size) as origin, \
            relay_process("rest-bench-relay", origin.port, 1.0,
                          sections=f'rest: {{address: "127.0.0.1:{rest_port}", lease: 600s}}',
                          src=args.relay_src) as relay, \
            workers(poller_main, args.pollers, args.workers) as pollers:
        relay_url = f"http://127.0.0.1:{rest_port}{PATH}"
        relay_server = Server(relay_url, relay.process.pid)
        for size in sizes:
            names = big_names(size)
            answer = await first_answer(relay_url, request_body(names, node_id="first"),
                                        len(names))
            version_info = json.loads(answer)["versionInfo"]
            runs: dict[str, list[dict[str, Any]]] = {"relay": [], "bare": []}
            for _ in range(args.runs):
                async with bare_server(answer, version_info) as bare:
                    runs["bare"].append(await measure(bare, pollers, names, version_info,
                                                      args.polls, args.pollers))
                runs["relay"].append(await measure(relay_server, pollers, names,
                                                   version_info, args.polls, args.pollers))
            results[size] = runs
        pollers.send(None)
    return results


# -- --holds: the stall one big poll causes, as a probe sees it ---------------------


def probe_main(conn: Connection, url: str, body: bytes) -> None:
    """Poll ``url`` with ``body`` again and again; "start" clears the record,
    "stop" answers the slowest answer and how many answers came since."""
    asyncio.run(_probe(conn, url, body))


async def _probe(conn: Connection, url: str, body: bytes) -> None:
    import aiohttp

    slowest, answers, running = 0.0, 0, True

    async def polling(session: aiohttp.ClientSession) -> None:
        nonlocal slowest, answers
        while running:
            started = time.perf_counter()
            async with session.post(url, data=body) as reply:
                await reply.read()
                assert reply.status in (200, 304), reply.status
            slowest = max(slowest, time.perf_counter() - started)
            answers += 1
            await asyncio.sleep(0.002)

    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        task = loop.create_task(polling(session))
        conn.send("ready")
        while (message := await loop.run_in_executor(None, conn.recv)) is not None:
            if message == "start":
                slowest, answers = 0.0, 0
            else:
                conn.send((slowest * 1000, answers))
        running = False
        await task


async def hold_of(url: str, body: bytes | None, probe: Connection, pid: int
                  ) -> dict[str, float]:
    """One big poll: its time, the relay's CPU for it, the probe's slowest
    answer (``body`` None: 0.3 s of no poll, the probe's own pace)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        probe.send("start")
        await asyncio.sleep(0.2)  # the probe's answers before: its own pace
        cpu, started = cpu_seconds(pid), time.perf_counter()
        if body is None:
            await asyncio.sleep(0.3)
        else:
            async with session.post(url, data=body) as reply:
                answer = await reply.read()
                assert reply.status == 200, (reply.status, answer[:200])
        took, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu
        await asyncio.sleep(0.1)
        probe.send("stop")
        slowest, answers = await loop.run_in_executor(None, probe.recv)
    return {"poll_ms": took * 1000, "relay_cpu_ms": cpu * 1000, "probe_slowest_ms": slowest,
            "probe_answers": answers}


async def run_holds(args: argparse.Namespace, sizes: Sequence[int]
                    ) -> dict[int, dict[str, list[dict[str, float]]]]:
    """Per size, ``first`` and ``again`` polls' holds, ``args.runs`` of each."""
    rest_port = free_port()
    results: dict[int, dict[str, list[dict[str, float]]]] = {}
    async with bare_process(big=max(sizes) + args.runs + 1, size=args.size) as origin, \
            relay_process("rest-holds-relay", origin.port, 1.0,
                          sections=f'rest: {{address: "127.0.0.1:{rest_port}", lease: 600s}}',
                          src=args.relay_src) as relay:
        url = f"http://127.0.0.1:{rest_port}{PATH}"
        # every name cached first (what a poll of names the relay has not
        # cached costs is the origin's and the cache's, not the poll's)
        everything = big_names(max(sizes) + args.runs + 1)
        await first_answer(url, request_body(everything, node_id="warm"), len(everything))
        probe_body = request_body(["big-0"], node_id="probe")
        answer = await first_answer(url, probe_body, 1)
        probe_body = request_body(["big-0"], json.loads(answer)["versionInfo"], "probe")
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        probe = ctx.Process(target=probe_main, args=(theirs, url, probe_body))
        probe.start()
        try:
            assert await asyncio.get_running_loop().run_in_executor(None, ours.recv) == "ready"
            for size in sizes:
                runs: dict[str, list[dict[str, float]]] = {"idle": [], "first": [],
                                                           "again": []}
                for run in range(args.runs):
                    names = [*big_names(size - 1), f"big-{size + run}"]
                    runs["idle"].append(await hold_of(url, None, ours, relay.process.pid))
                    for kind in ("first", "again"):
                        runs[kind].append(await hold_of(
                            url, request_body(names, node_id=f"{kind}-{size}-{run}"), ours,
                            relay.process.pid))
                results[size] = runs
        finally:
            ours.send(None)
            probe.join(10)
            if probe.is_alive():
                probe.kill()
    return results


# a poll from a process of its own: its writing and reading are no part of the loop's holds
_POLLER = """
import sys, time, urllib.request
started = time.perf_counter()
request = urllib.request.Request(sys.argv[1], data=sys.stdin.buffer.read(), method="POST")
with urllib.request.urlopen(request, timeout=600) as reply:
    body = reply.read()
print(reply.status, len(body), (time.perf_counter() - started) * 1000)
"""


async def polled_from_outside(url: str, body: bytes) -> float:
    """Milliseconds a poll took, posted by a process of its own (a 200 expected)."""
    poller = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _POLLER, url, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = await poller.communicate(body)
    status, _, ms = out.decode().split()
    assert status == "200", out
    return float(ms)


async def holds_in_process(args: argparse.Namespace, sizes: Sequence[int]
                           ) -> dict[int, dict[str, list[dict[str, float]]]]:
    """:func:`run_holds`' polls, each measured by a :class:`LoopWatch` in the
    process serving it (the relay's layers, no origin: every name cached)."""
    from benchmarks.console import LoopWatch
    from relay.cache import Update
    from relay.config.values import Address
    from relay.core import Core
    from relay.protocol.limits import DEFAULT_LIMITS
    from relay.resource import CachedResource
    from relay.runtime import tune_gc
    from relay.server.fetch import Fetcher
    from relay.server.rest import RestServer
    from relay.server.serving import ServingSettings
    from tests.builders import endpoints, pack
    from tests.clock import ManualClock
    from tests.test_fetch_linear import Up

    clock = ManualClock()
    core = Core.create(settings=ServingSettings(limits=dataclasses.replace(
        DEFAULT_LIMITS, leases_per_host=1000)), clock=clock)
    core.index.link(Up())
    everything = big_names(max(sizes) + args.runs + 1)
    core.cache.apply(ENDPOINT, Update([
        CachedResource.from_message(ENDPOINT, pack(endpoints(name, 1 + i % 7)), name, "v1")
        for i, name in enumerate(everything)]))
    rest = RestServer(core.serving, Fetcher(core.serving, clock, 600.0, 0.0),
                      Address("127.0.0.1", 0))
    url = f"http://127.0.0.1:{await rest.start()}{PATH}"
    tune_gc()
    results: dict[int, dict[str, list[dict[str, float]]]] = {}
    try:
        for size in sizes:
            runs: dict[str, list[dict[str, float]]] = {"first": [], "again": []}
            for run in range(args.runs):
                names = [*big_names(size - 1), f"big-{size + run}"]
                for kind in ("first", "again"):
                    body = request_body(names, node_id=f"{kind}-{size}-{run}")
                    with LoopWatch() as watch:
                        await asyncio.sleep(0.01)
                        ms = await polled_from_outside(url, body)
                    runs[kind].append({
                        "poll_ms": ms, "hold_max_ms": watch.longest * 1000,
                        "cpu_hold_max_ms": max(watch.cpu_holds) * 1000,
                        "holds_over_50ms": sum(held > 0.05 for held in watch.holds),
                        "cpu_holds_over_50ms": sum(held > 0.05 for held in watch.cpu_holds)})
            results[size] = runs
    finally:
        await rest.stop()
    return results


def print_in_process(args: argparse.Namespace,
                     results: dict[int, dict[str, list[dict[str, float]]]]) -> None:
    from benchmarks.console import relay_dir

    print(f"relay package {relay_dir()}; one poll at a time, in-process loop watch; "
          f"min / median / max of {args.runs} runs")
    rows = []
    keys = ("cpu_hold_max_ms", "cpu_holds_over_50ms", "hold_max_ms", "holds_over_50ms",
            "poll_ms")
    for size, runs in results.items():
        for kind, measured in runs.items():
            cells = [f"{min(v):.0f} / {statistics.median(v):.0f} / {max(v):.0f}"
                     for key in keys for v in [[m[key] for m in measured]]]
            rows.append(f"| {size:,} | {kind} | {' | '.join(cells)} |")
    print("\n| names | poll | longest hold, CPU (ms) | CPU holds > 50 ms | longest hold, "
          "wall (ms) | wall holds > 50 ms | the poll (ms) |\n"
          "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows))


def print_holds(args: argparse.Namespace, results: dict[int, dict[str, list[dict[str, float]]]]
                ) -> None:
    print(f"relay at {revision(args.relay_src)} ({args.relay_src}); one big poll at a time, "
          f"ClusterLoadAssignments of ~{args.size} B; min / median of {args.runs} runs")
    rows = []
    for size, runs in results.items():
        for kind, measured in runs.items():
            cells = [f"{min(v):.0f} / {statistics.median(v):.0f}"
                     for key in ("probe_slowest_ms", "poll_ms", "relay_cpu_ms")
                     for v in [[m[key] for m in measured]]]
            rows.append(f"| {size:,} | {kind} | {' | '.join(cells)} |")
    print("\n| names | poll | probe's slowest answer (ms) | the poll (ms) | relay CPU (ms) |\n"
          "| --- | --- | --- | --- | --- |\n" + "\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pollers", type=int, default=None,
                        help="pollers in all (default 100; 2 with --names)")
    parser.add_argument("--resources", type=int, default=100)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--polls", type=int, default=None,
                        help="polls per poller and phase (default 50; 5 with --names)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the tree the relay runs from (default: this checkout)")
    parser.add_argument("--names", default="",
                        help="comma-separated numbers of names per poll: per-name costs")
    parser.add_argument("--holds", default="",
                        help="comma-separated numbers of names per poll: the stall each causes")
    parser.add_argument("--in-process", action="store_true",
                        help="with --holds: measure the loop's holds in this process")
    args = parser.parse_args()
    if args.holds and args.in_process:
        in_process(args)
        return
    if args.holds:
        args.relay_src = args.relay_src.resolve()
        holds = asyncio.run(run_holds(args, [int(n) for n in args.holds.split(",") if n]))
        print_holds(args, holds)
        write_results(Path("benchmarks/results/rest-holds.json"), "benchmarks.rest",
                      relay_src=str(args.relay_src), revision=revision(args.relay_src),
                      runs={str(size): runs for size, runs in holds.items()})
        return
    sizes = [int(n) for n in args.names.split(",") if n] or [args.resources]
    args.pollers = args.pollers or (2 if args.names else 100)
    args.polls = args.polls or (5 if args.names else 50)
    args.relay_src = args.relay_src.resolve()
    results = asyncio.run(run_all(args, sizes))
    print(f"relay at {revision(args.relay_src)} ({args.relay_src}); {args.pollers} pollers x "
          f"{args.polls} polls of ClusterLoadAssignments (~{args.size} B each), "
          f"{args.runs} runs")
    summary: dict[str, Comparison] = {}
    figures = [("all polls (s)", "seconds"), ("server CPU per poll (ms)", "cpu_ms_per_poll"),
               # (the relay's other threads, gRPC's, are the rest of its CPU)
               ("main thread CPU per poll (ms)", "loop_cpu_ms_per_poll")]
    if args.names:
        figures.append(("server CPU per name (us)", "cpu_us_per_name"))
    for size, runs in results.items():
        rows = [(f"{phase}: {figure}",
                 compare(values(runs["relay"], f"{phase}_{key}"),
                         values(runs["bare"], f"{phase}_{key}")))
                for phase in PHASES for figure, key in figures]
        print(f"\n{size:,} names a poll\n")
        print(table(rows))
        summary.update({f"{size} names, {label}": c for label, c in rows})
    write_results(Path("benchmarks/results/rest-names.json" if args.names
                       else "benchmarks/results/rest.json"), "benchmarks.rest",
                  relay_src=str(args.relay_src), revision=revision(args.relay_src),
                  runs={str(size): runs for size, runs in results.items()}, summary=summary)


def in_process(args: argparse.Namespace) -> None:
    """``--holds --in-process``: here, or run again with ``--relay-src``'s relay."""
    from benchmarks.console import RERUN, rerun_from

    here = Path(__file__).resolve().parents[1]
    if args.relay_src.resolve() != here and RERUN not in os.environ:
        sys.exit(rerun_from(args.relay_src.resolve(), "benchmarks.rest"))
    sizes = [int(n) for n in args.holds.split(",") if n]
    print_in_process(args, asyncio.run(holds_in_process(args, sizes)))


if __name__ == "__main__":
    main()
