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
every poller to make ``--polls`` polls and the server's CPU time per poll (a
server of one event loop: the loop's time per poll), relay against bare;
runs alternate, min and median over ``--runs``.

``--names 5000,20000,50000``: the same phases for polls of that many names
each (``--pollers`` pollers, default 2 there, ``--polls`` each, default 5),
with the CPU per poll and per name, to see that a poll costs what its names
do (the same per name at every size).

Usage: ``python -m benchmarks.rest [--pollers 100] [--resources 100]
[--size 1024] [--polls 50] [--runs 3] [--workers 2] [--relay-src DIR]
[--names 5000,20000,50000]``
Writes a table to stdout and JSON to ``benchmarks/results/rest.json``
(``rest-names.json`` with ``--names``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.bare import bare_process, big_names
from benchmarks.processes import cpu_seconds, relay_process, workers
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
        cpu = cpu_seconds(server.pid)
        pollers.send((server.url, body, polls, phase == "fresh"))
        answers = await pollers.next_messages()
        cpu = cpu_seconds(server.pid) - cpu
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
    args = parser.parse_args()
    sizes = [int(n) for n in args.names.split(",") if n] or [args.resources]
    args.pollers = args.pollers or (2 if args.names else 100)
    args.polls = args.polls or (5 if args.names else 50)
    args.relay_src = args.relay_src.resolve()
    results = asyncio.run(run_all(args, sizes))
    print(f"relay at {revision(args.relay_src)} ({args.relay_src}); {args.pollers} pollers x "
          f"{args.polls} polls of ClusterLoadAssignments (~{args.size} B each), "
          f"{args.runs} runs")
    summary: dict[str, Comparison] = {}
    figures = [("all polls (s)", "seconds"), ("server CPU per poll (ms)", "cpu_ms_per_poll")]
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


if __name__ == "__main__":
    main()
