"""REST polling benchmark: pollers POSTing JSON DiscoveryRequests, as Envoy's
``api_type: REST`` subscriptions do, against the relay's REST listener and a
bare aiohttp server.

Each poller asks for the same K ClusterLoadAssignments (``big-0`` ...,
about ``--size`` bytes each) over and over, on a keep-alive connection of its
own, in two phases:

* full: with no ``version_info``, so that every poll is answered in full
  (200, the JSON DiscoveryResponse);
* current: with the version it was given, so that every poll is answered
  ``304 Not Modified`` with no body (what a fleet polling an unchanged
  config costs).

The bare server (this module's ``serve_bare``, its own process) does the
least a real server must: it reads the body, decodes it as JSON, and writes
the relay's own answer, fetched once from the relay and held as bytes (so
both send the very same bytes), or 304 when the poll's ``version_info`` is
the answer's. The relay's origin is :mod:`benchmarks.bare`'s gRPC server.

Pollers run in worker processes (``--workers``), so the figures are the
servers'. Per phase: the time for every poller to make ``--polls`` polls
and the server's CPU time per poll, relay against bare; runs alternate,
min and median over ``--runs``.

Usage: ``python -m benchmarks.rest [--pollers 100] [--resources 100]
[--size 1024] [--polls 50] [--runs 3] [--workers 2]``
Writes a table to stdout and JSON to ``benchmarks/results/rest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.bare import bare_process, big_names
from benchmarks.processes import cpu_seconds, relay_process, workers
from benchmarks.report import compare, table, values, write_results
from relay.xds_types import ENDPOINT
from tests.ports import free_port

PATH = "/v3/discovery:endpoints"
PHASES = ("full", "current")


def request_body(names: Sequence[str], version_info: str = "") -> bytes:
    """A poll as Envoy writes it (JSON names of the DiscoveryRequest fields)."""
    body: dict[str, Any] = {"node": {"id": "rest-bench", "cluster": "bench"},
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
    """``count`` pollers; per "poll" message (url, body, polls), each polls
    that many times; answers how many answers of each status came, and the time."""
    conn.send("ready")
    loop = asyncio.get_running_loop()
    while (message := await loop.run_in_executor(None, conn.recv)) is not None:
        conn.send(await _round(count, *message))


async def _round(count: int, url: str, body: bytes, polls: int
                 ) -> tuple[dict[int, int], float]:
    """``count`` pollers, a keep-alive connection each, polling ``polls`` times."""
    import aiohttp

    statuses: dict[int, int] = {}
    headers = {"Content-Type": "application/json"}

    async def poll(session: aiohttp.ClientSession) -> int:
        async with session.post(url, data=body, headers=headers) as reply:
            await reply.read()
            return reply.status

    async def poller(session: aiohttp.ClientSession) -> None:
        for _ in range(polls):
            status = await poll(session)
            statuses[status] = statuses.get(status, 0) + 1

    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
                for _ in range(count)]
    try:
        # One poll each first, so that every connection is open before the clock starts.
        await asyncio.gather(*(poll(s) for s in sessions))
        started = time.perf_counter()
        await asyncio.gather(*(poller(s) for s in sessions))
        return statuses, time.perf_counter() - started
    finally:
        for session in sessions:
            await session.close()


# -- the harness -------------------------------------------------------------------


@dataclass
class Server:
    url: str
    pid: int


async def first_answer(url: str, body: bytes, timeout: float = 60.0) -> bytes:
    """The relay's 200 answer to ``body`` (it subscribes the names on the origin
    at the first poll: a 503 until they are in)."""
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            async with session.post(url, data=body) as reply:
                if reply.status == 200:
                    return await reply.read()
            await asyncio.sleep(0.1)
    raise RuntimeError(f"no 200 from {url} within {timeout}s")


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
        body = request_body(names, version_info if phase == "current" else "")
        cpu = cpu_seconds(server.pid)
        pollers.send((server.url, body, polls))
        answers = await pollers.next_messages()
        cpu = cpu_seconds(server.pid) - cpu
        statuses: dict[int, int] = {}
        for worker_statuses, _ in answers:
            for status, n in worker_statuses.items():
                statuses[status] = statuses.get(status, 0) + n
        expected = 304 if phase == "current" else 200
        if statuses != {expected: polls * count}:
            raise RuntimeError(f"{phase}: answers {statuses}, expected {polls * count} "
                               f"x {expected}")
        run[f"{phase}_seconds"] = max(seconds for _, seconds in answers)
        run[f"{phase}_cpu_ms_per_poll"] = cpu * 1000 / (polls * count)
    return run


async def run_all(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    names = big_names(args.resources)
    runs: dict[str, list[dict[str, Any]]] = {"relay": [], "bare": []}
    rest_port = free_port()
    async with bare_process(big=args.resources, size=args.size) as origin, \
            relay_process("rest-bench-relay", origin.port, 1.0,
                          sections=f'rest: {{address: "127.0.0.1:{rest_port}", lease: 600s}}'
                          ) as relay, \
            workers(poller_main, args.pollers, args.workers) as pollers:
        relay_url = f"http://127.0.0.1:{rest_port}{PATH}"
        answer = await first_answer(relay_url, request_body(names))
        version_info = json.loads(answer)["versionInfo"]
        relay_server = Server(relay_url, relay.process.pid)
        for _ in range(args.runs):
            async with bare_server(answer, version_info) as bare:
                runs["bare"].append(await measure(bare, pollers, names, version_info,
                                                  args.polls, args.pollers))
            runs["relay"].append(await measure(relay_server, pollers, names, version_info,
                                               args.polls, args.pollers))
        pollers.send(None)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pollers", type=int, default=100)
    parser.add_argument("--resources", type=int, default=100)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--polls", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    runs = asyncio.run(run_all(args))
    rows = [(f"{phase}: {figure}",
             compare(values(runs["relay"], f"{phase}_{key}"), values(runs["bare"],
                                                                     f"{phase}_{key}")))
            for phase in PHASES
            for figure, key in (("all polls (s)", "seconds"),
                                ("server CPU per poll (ms)", "cpu_ms_per_poll"))]
    print(f"{args.pollers} pollers x {args.polls} polls of {args.resources} "
          f"ClusterLoadAssignments (~{args.size} B each), {args.runs} runs")
    print(table(rows))
    write_results(Path("benchmarks/results/rest.json"), "benchmarks.rest",
                  runs=runs, summary={label: c for label, c in rows})


if __name__ == "__main__":
    main()
