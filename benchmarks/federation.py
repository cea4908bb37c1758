"""Federation benchmark (issue 25): two origins routed by authority, and a glob.

**Two origins against one.** N delta streams (one gRPC connection each, in
client worker processes) subscribe to one ClusterLoadAssignment each, half to
one name and half to the other. The relay runs in its own process in one of
two shapes, alternating run by run:

* ``two``: the names are ``xdstp://east.example.com/...`` and
  ``xdstp://west.example.com/...``, the relay configured with
  ``authorities:`` for both, each served by its own scripted origin (E and W;
  the default ``upstream:`` is a third, idle one);
* ``one``: the names are classic (``bench-east``, ``bench-west``), both
  served by one scripted origin through ``upstream:``.

The streams connect at once (``storm``: until every stream had its first
response, the names fetched from the origins on the way); then, per round,
each name changes in turn (``two``: through its own origin; ``one``: through
the one origin) and every stream of that name notes when the new version
arrived. Per run, medians of rounds: ``update_all_ms_east`` /
``update_all_ms_west`` (from the change's send until the last stream of that
name had it), ``update_median_stream_ms`` (the median stream, both names),
``cpu_ms_per_update`` (the relay's CPU from the send until the ACKs are in,
mean of updates). Reported as min and median over runs, two / one.

**A glob collection.** An origin serves the collection ``GLOB``
(``xdstp://auth/envoy.config.endpoint.v3.ClusterLoadAssignment/pool/*``) of M
small members. S delta streams subscribe to the glob at once, on a fresh
server (``cold``: for the relay, the first subscription makes it ask the
origin); once that phase is over, S more do so while the first stay (``warm``:
the relay answers from its cache). Per phase: until the last (``all``) and the
median subscriber (a stalled one counting as never) had every member, and the
server's CPU meanwhile. A subscriber that has not every member within
``--wait`` seconds is not waited for: the phase's ``all`` time and CPU are
left out of that run and ``<phase>_stalled`` counts such subscribers
(``<phase>_stalled_at``: how many members they had). The same clients against
the bare server of :mod:`benchmarks.bare` (``--glob M``: the same members,
pre-encoded), relay / bare. ``glob_origin_requests``: how often the relay's
origin was asked for the glob (1 is right).

The client workers share the machine with the server under test (and, for
the relay, its origins, in this process): on a small machine the times are
the clients' too, and CPU figures are steadier than times. Each run records
the 1-minute load when it ended (``load``).

Usage: ``python -m benchmarks.federation [--streams 1000] [--members 10000]
[--subscribers 100] [--runs 3] [--rounds 3] [--workers 2] [--wait 60]
[--parts origins,glob]``; a smoke run: ``--streams 40 --members 200
--subscribers 4 --runs 1 --rounds 1``. Writes the tables to stdout and JSON
(every run, the relay's revision) to ``benchmarks/results/federation.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from benchmarks.bare import GLOB, bare_process, glob_members
from benchmarks.processes import (
    cpu_seconds,
    main_thread_cpu_seconds,
    new_streams,
    receive_version,
    relay_process,
    workers,
)
from benchmarks.report import Comparison, compare, revision, table, values, write_results
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack, version_of
from tests.harness import OriginStream, ScriptedOrigin

ROOT = Path(__file__).resolve().parent.parent
EDS = "envoy.config.endpoint.v3.ClusterLoadAssignment"
EAST, WEST = "east.example.com", "west.example.com"
# the names each shape's streams subscribe to, east's first
NAMES = {"two": (f"xdstp://{EAST}/{EDS}/bench", f"xdstp://{WEST}/{EDS}/bench"),
         "one": ("bench-east", "bench-west")}
SHAPES = ("one", "two")
GLOB_SERVERS = ("bare", "relay")
# a glob subscriber that has not every member by then (``--wait``) is counted
# as stalled, not waited on
WAIT_S = 60.0

ORIGIN_FIGURES = {
    "update_all_ms_east": "update via east: all its streams (ms)",
    "update_all_ms_west": "update via west: all its streams (ms)",
    "update_median_stream_ms": "update: median stream (ms)",
    "cpu_ms_per_update": "relay CPU per update (ms)",
    "storm_all_ms": "storm: all streams answered (ms)",
    "storm_cpu_ms": "storm: relay CPU (ms)",
}
GLOB_FIGURES = {
    "cold_all_ms": "cold: all subscribers have all members (ms)",
    "cold_median_ms": "cold: median subscriber (ms)",
    "cold_cpu_ms": "cold: server CPU (ms)",
    "warm_all_ms": "warm: all subscribers have all members (ms)",
    "warm_median_ms": "warm: median subscriber (ms)",
    "warm_cpu_ms": "warm: server CPU (ms)",
    "glob_origin_requests": "origin asked for the glob (times)",
    "cold_stalled": "cold: subscribers short of members at the end",
    "warm_stalled": "warm: subscribers short of members at the end",
}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _request(name: str) -> discovery_pb2.DeltaDiscoveryRequest:
    return discovery_pb2.DeltaDiscoveryRequest(
        node={"id": f"bench-{os.getpid()}"}, type_url=ENDPOINT, resource_names_subscribe=[name])


async def _close(channels: Sequence[grpc.aio.Channel], calls: Sequence[Any]) -> None:
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()


# -- client workers (separate processes) -------------------------------------------


def origins_worker(conn: Connection, first: int, count: int, target: str,
                   names: tuple[str, str]) -> None:
    asyncio.run(_origins_worker(conn, first, count, target, names))


async def _origins_worker(conn: Connection, first: int, count: int, target: str,
                          names: tuple[str, str]) -> None:
    """Stream ``first + j`` subscribes to ``names[(first + j) % 2]``. Says
    ``"ready"``; on ``"storm"`` opens its streams at once and sends when each
    got its first response; then, per ``(i, version)`` it is sent, when each
    stream of ``names[i]`` got that version; stops on None."""
    loop = asyncio.get_running_loop()
    conn.send("ready")
    command = await loop.run_in_executor(None, conn.recv)
    assert command == "storm", command
    channels, calls = new_streams(target, count)
    which = [(first + j) % 2 for j in range(count)]

    async def join(call: Any, index: int) -> float:
        await call.write(_request(names[index]))
        return await receive_version(call, None)

    conn.send(await asyncio.gather(*(join(c, i) for c, i in zip(calls, which, strict=True))))
    while (command := await loop.run_in_executor(None, conn.recv)) is not None:
        index, version = command
        conn.send(await asyncio.gather(*(receive_version(c, version)
                                         for c, i in zip(calls, which, strict=True)
                                         if i == index)))
    await _close(channels, calls)


def glob_worker(conn: Connection, count: int, target: str, members: int, wait: float) -> None:
    asyncio.run(_glob_worker(conn, count, target, members, wait))


async def _glob_worker(conn: Connection, count: int, target: str, members: int,
                       wait: float) -> None:
    """Says ``"ready"``; on ``"go"`` opens its streams at once, each subscribing
    to ``GLOB``, and sends, per stream, ``(when it had all members or None,
    how many it had)``, once all had them or ``wait`` seconds passed; its
    streams stay open (ACKing what comes) until None."""
    loop = asyncio.get_running_loop()
    conn.send("ready")
    command = await loop.run_in_executor(None, conn.recv)
    assert command == "go", command
    channels, calls = new_streams(target, count)
    prefix = GLOB[:-1]
    seen: list[set[str]] = [set() for _ in calls]
    done: list[float | None] = [None for _ in calls]
    all_done = asyncio.Event()

    async def ack(call: Any, nonce: str) -> None:
        await call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT,
                                                             response_nonce=nonce))

    async def collect(index: int, call: Any) -> None:
        """Read (and ACK) all the stream gets; note when it had every member."""
        held = seen[index]
        await call.write(_request(GLOB))
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while (response := await call.read()) is not grpc.aio.EOF:
                arrived = time.monotonic()
                await ack(call, response.nonce)
                held.update(r.name for r in response.resources if r.name.startswith(prefix))
                if done[index] is None and len(held) >= members:
                    done[index] = arrived
                    if None not in done:
                        all_done.set()

    readers = [asyncio.create_task(collect(i, c)) for i, c in enumerate(calls)]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_done.wait(), wait)
    conn.send([(t, len(s)) for t, s in zip(done, seen, strict=True)])
    await loop.run_in_executor(None, conn.recv)
    for task in readers:
        task.cancel()
    await _close(channels, calls)


# -- two origins against one ---------------------------------------------------------


@dataclass
class Shape:
    """A relay in one shape: its process, where its clients connect, the two
    names, how each changes, and its origins (name -> origin)."""

    pid: int
    target: str
    names: tuple[str, str]
    change: Callable[[int, int], None]
    origins: dict[str, ScriptedOrigin]


def _subscribed(origin: ScriptedOrigin) -> list[str]:
    return sorted({n for r in origin.all_requests() for n in r.resource_names_subscribe})


@contextlib.asynccontextmanager
async def shaped_relay(shape: str) -> AsyncIterator[Shape]:
    names = NAMES[shape]
    if shape == "two":
        east, west, default = ScriptedOrigin(), ScriptedOrigin(), ScriptedOrigin()
        east.set(endpoints(names[0], 1))
        west.set(endpoints(names[1], 1))
        origins = {"east": east, "west": west, "default": default}
        by_name = (east, west)
    else:
        default = ScriptedOrigin()
        default.set(endpoints(names[0], 1), endpoints(names[1], 1))
        origins = {"default": default}
        by_name = (default, default)
    for origin in origins.values():
        await origin.start()
    authorities = "" if shape == "one" else (
        f'authorities: {{{EAST}: {{address: "127.0.0.1:{origins["east"].port}"}}, '
        f'{WEST}: {{address: "127.0.0.1:{origins["west"].port}"}}}}')
    try:
        # drain_period 0: the SIGTERM at the end need not wait.
        async with relay_process(f"bench-{shape}", default.port, drain_period=0,
                                 sections=authorities) as relay:
            def change(index: int, port: int) -> None:
                by_name[index].set(endpoints(names[index], port))

            yield Shape(relay.process.pid, relay.target, names, change, origins)
    finally:
        for origin in origins.values():
            await origin.stop()


async def measure_origins(shape: str, n: int, rounds: int, worker_count: int
                          ) -> dict[str, Any]:
    """One run of ``shape`` on a fresh relay."""
    async with shaped_relay(shape) as relay, \
            workers(origins_worker, n, worker_count, relay.target, relay.names,
                    numbered=True) as clients:
        cpu_before = cpu_seconds(relay.pid)
        started = time.monotonic()
        clients.send("storm")
        firsts = [t for ts in await clients.next_messages() for t in ts]
        storm_cpu = cpu_seconds(relay.pid) - cpu_before
        await asyncio.sleep(0.5)
        every: dict[int, list[float]] = {0: [], 1: []}
        median_stream, cpu, main = [], [], []
        for round_no in range(rounds):
            for index in (0, 1):
                port = 1000 + 2 * round_no + index
                clients.send((index, version_of(endpoints(relay.names[index], port))))
                await asyncio.sleep(0.2)  # let workers start reading
                cpu_before = cpu_seconds(relay.pid)
                main_before = main_thread_cpu_seconds(relay.pid)
                sent = time.monotonic()
                relay.change(index, port)
                times = [t for ts in await clients.next_messages() for t in ts]
                await asyncio.sleep(0.1)  # the last ACKs
                cpu.append(cpu_seconds(relay.pid) - cpu_before)
                main.append(main_thread_cpu_seconds(relay.pid) - main_before)
                every[index].append(max(times) - sent)
                median_stream.append(statistics.median(times) - sent)
        clients.send(None)
        asked = {name: _subscribed(origin) for name, origin in relay.origins.items()}
        streams = {name: len(origin.streams) for name, origin in relay.origins.items()}
    return {
        "update_all_ms_east": _ms(statistics.median(every[0])),
        "update_all_ms_west": _ms(statistics.median(every[1])),
        "update_median_stream_ms": _ms(statistics.median(median_stream)),
        "cpu_ms_per_update": _ms(statistics.mean(cpu)),
        "main_thread_cpu_ms_per_update": _ms(statistics.mean(main)),
        "storm_all_ms": _ms(max(firsts) - started),
        "storm_cpu_ms": _ms(storm_cpu),
        # what each origin was asked for, over how many streams: its own names, one
        "origin_names": asked,
        "origin_streams": streams,
        "load": os.getloadavg()[0],
    }


async def run_origins(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {shape: [] for shape in SHAPES}
    for run in range(args.runs):
        for shape in SHAPES if run % 2 == 0 else SHAPES[::-1]:
            result = await measure_origins(shape, args.streams, args.rounds, args.workers)
            runs[shape].append(result)
            print(json.dumps({"part": "origins", "shape": shape, "run": run, **result}),
                  flush=True)
    summary = {key: compare(values(runs["two"], key), values(runs["one"], key))
               for key in ORIGIN_FIGURES}
    return {"streams": args.streams, "runs": runs, "summary": summary}


# -- a glob collection --------------------------------------------------------------


class GlobOrigin(ScriptedOrigin):
    """A scripted origin that also serves ``GLOB``: a subscription to it is
    answered with every member, in one response encoded once."""

    def __init__(self, members: int) -> None:
        super().__init__()
        self.members = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT)
        for name in glob_members(members):
            message = endpoints(name, 1)
            self.members.resources.add(name=name, version=version_of(message),
                                       resource=pack(message))
        self.glob_requests = 0

    def _answer(self, stream: OriginStream,
                request: discovery_pb2.DeltaDiscoveryRequest) -> None:
        if GLOB in request.resource_names_subscribe:
            self.glob_requests += 1
            response = discovery_pb2.DeltaDiscoveryResponse()
            response.CopyFrom(self.members)
            response.nonce = self.nonce()
            stream.outbox.put_nowait(response)
            rest = discovery_pb2.DeltaDiscoveryRequest()
            rest.CopyFrom(request)
            del rest.resource_names_subscribe[:]
            rest.resource_names_subscribe.extend(
                n for n in request.resource_names_subscribe if n != GLOB)
            request = rest
        super()._answer(stream, request)


@dataclass
class GlobServer:
    pid: int
    target: str
    # how often the origin was asked for the glob so far (the relay's only)
    glob_requests: Callable[[], int] | None = None


@contextlib.asynccontextmanager
async def glob_relay(members: int) -> AsyncIterator[GlobServer]:
    origin = await GlobOrigin(members).start()
    try:
        async with relay_process("bench-glob", origin.port, drain_period=0) as relay:
            yield GlobServer(relay.process.pid, relay.target, lambda: origin.glob_requests)
    finally:
        await origin.stop()


@contextlib.asynccontextmanager
async def glob_bare(members: int) -> AsyncIterator[GlobServer]:
    async with bare_process(glob=members) as bare:
        yield GlobServer(bare.pid, bare.target)


GLOB_SERVER_OF: dict[str, Callable[[int], AbstractAsyncContextManager[GlobServer]]] = {
    "bare": glob_bare, "relay": glob_relay}


async def _phase(server: GlobServer, name: str, subscribers: int, members: int,
                 worker_count: int, wait: float, stack: contextlib.AsyncExitStack
                 ) -> dict[str, Any]:
    """``subscribers`` new streams subscribe to the glob at once; their workers
    stay (entered on ``stack``) so that the streams stay open. If some have
    not every member within ``wait`` s, the times are None, and
    ``<name>_stalled`` says how many, ``<name>_stalled_at`` what they had."""
    clients = await stack.enter_async_context(
        workers(glob_worker, subscribers, worker_count, server.target, members, wait))
    stack.callback(clients.send, None)
    cpu_before = cpu_seconds(server.pid)
    started = time.monotonic()
    clients.send("go")
    streams = [s for reply in await clients.next_messages() for s in reply]
    cpu = cpu_seconds(server.pid) - cpu_before
    stalled = sorted(held for t, held in streams if t is None)
    times = [t for t, _ in streams if t is not None]
    if stalled:
        print(f"{name}: {len(stalled)} of {subscribers} subscribers had not every member "
              f"after {wait:.0f} s (members held: {dict(Counter(stalled))})", flush=True)
    return {f"{name}_all_ms": None if stalled else _ms(max(times) - started),
            f"{name}_median_ms": None if len(stalled) * 2 >= len(streams) else
            _ms(sorted(times)[(len(streams) - 1) // 2] - started),
            f"{name}_cpu_ms": None if stalled else _ms(cpu),
            f"{name}_stalled": len(stalled),
            f"{name}_stalled_at": dict(Counter(stalled))}


async def measure_glob(kind: str, members: int, subscribers: int, worker_count: int,
                       wait: float) -> dict[str, Any]:
    async with GLOB_SERVER_OF[kind](members) as server, contextlib.AsyncExitStack() as stack:
        result = await _phase(server, "cold", subscribers, members, worker_count, wait, stack)
        result.update(await _phase(server, "warm", subscribers, members, worker_count, wait,
                                   stack))
        if server.glob_requests is not None:
            result["glob_origin_requests"] = server.glob_requests()
        result["load"] = os.getloadavg()[0]
        return result


async def run_glob(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in GLOB_SERVERS}
    for run in range(args.runs):
        for kind in GLOB_SERVERS if run % 2 == 0 else GLOB_SERVERS[::-1]:
            result = await measure_glob(kind, args.members, args.subscribers, args.workers,
                                        args.wait)
            runs[kind].append(result)
            print(json.dumps({"part": "glob", "server": kind, "run": run, **result}),
                  flush=True)
    summary = {key: compare(values(runs["relay"], key),
                            None if key == "glob_origin_requests" else values(runs["bare"], key))
               for key in GLOB_FIGURES}
    return {"members": args.members, "subscribers": args.subscribers, "runs": runs,
            "summary": summary}


# -- the report -----------------------------------------------------------------------


def relabel(text: str, ours: str, theirs: str) -> str:
    """``table``'s text with its relay and bare columns named ``ours`` and ``theirs``."""
    head, rest = text.split("\n", 1)
    head = head.replace("relay min", f"{ours} min").replace("relay median", f"{ours} median")
    head = head.replace("bare min", f"{theirs} min").replace("bare median", f"{theirs} median")
    return f"{head}\n{rest}"


def tables(results: dict[str, Any], args: argparse.Namespace) -> str:
    out = []
    if "origins" in results:
        rows: list[tuple[str, Comparison]] = [
            (label, results["origins"]["summary"][key]) for key, label in ORIGIN_FIGURES.items()]
        out.append(f"{args.streams} streams over two names, {args.runs} runs of each shape, "
                   f"{args.rounds} rounds (ratio: two origins / one origin):\n\n"
                   + relabel(table(rows, "figure"), "two", "one"))
    if "glob" in results:
        rows = [(label, results["glob"]["summary"][key]) for key, label in GLOB_FIGURES.items()]
        out.append(f"A glob of {args.members} members to {args.subscribers} subscribers, "
                   f"{args.runs} runs each (ratio: relay / bare):\n\n"
                   + table(rows, "figure"))
    return "\n\n".join(out)


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    parts = args.parts.split(",")
    results: dict[str, Any] = {}
    if "origins" in parts:
        results["origins"] = await run_origins(args)
    if "glob" in parts:
        results["glob"] = await run_glob(args)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000,
                        help="streams of the two-origins part, half on each name")
    parser.add_argument("--members", type=int, default=10000, help="members of the glob")
    parser.add_argument("--subscribers", type=int, default=100,
                        help="subscribers of the glob, cold and again warm")
    parser.add_argument("--runs", type=int, default=3, help="runs of each shape and server")
    parser.add_argument("--rounds", type=int, default=3,
                        help="updates of each name per run (two-origins part)")
    parser.add_argument("--workers", type=int, default=2, help="client worker processes")
    parser.add_argument("--wait", type=float, default=WAIT_S,
                        help="seconds a glob subscriber may take to have every member")
    parser.add_argument("--parts", default="origins,glob",
                        help="which parts to run: origins, glob or both")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/federation.json"))
    args = parser.parse_args()
    before = revision(ROOT)
    started = time.monotonic()
    results = asyncio.run(run_all(args))
    after = revision(ROOT)
    print(f"\nRelay at {before}"
          + ("" if after == before else f" at the start, {after} at the end")
          + f", {os.cpu_count()} CPUs, {time.monotonic() - started:.0f} s in all.\n")
    print(tables(results, args))
    write_results(args.out, "benchmarks.federation", revision=before, revision_at_end=after,
                  runs=args.runs, rounds=args.rounds, workers=args.workers, **results)


if __name__ == "__main__":
    main()
