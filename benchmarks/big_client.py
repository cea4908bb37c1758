"""Big-client benchmark: one client subscribing to K resources at once.

A client (its own process) opens a delta stream, subscribes to K
ClusterLoadAssignments of about 1 KB each (``big-0`` ...) in one request and
reads (decodes, ACKs) until it has all K. Timed from the subscribe's write
until the last resource is in, against three servers:

* bare: the bare ``grpc.aio`` server of :mod:`benchmarks.bare`, which sends
  one pre-encoded response of K resources;
* relay cold: a fresh relay (``xds-relay run``) that has nothing cached, so
  it asks its origin, which answers at once;
* relay warm: the same relay, while the cold run's client still holds the K
  names, so that all are cached;
* forwarder: the bare forwarder of :mod:`benchmarks.forwarder` in front of
  the relay's origin, fresh each run: the fastest a hop that holds nothing
  can be, the cold relay's other bound (its rows say "/ forwarder").

The relay's origin is a second bare server, so that the origin side costs
little: the tests' ScriptedOrigin takes about 1.5 s of its own (this
process's) CPU to answer 100,000 names and 3 s to take them in.

Meanwhile a probe (its own process) holds one more stream to the server
under test, subscribed to ``NAME``, which the bare server (or the relay's
origin) changes every 20 ms, writing the send time into the version. A
server whose event loop stalls delays the probe: per phase, the worst gap
between the probe's updates and the worst latency of an update sent in it
are reported, and the same over 2 s with no big client (the baseline). The
gap is the stall as a client sees it; the latency understates the relay's,
as what queued up meanwhile goes out together, the newest version only. A
phase runs from its start (subscribe, or the client leaving) to the end of
the first 0.1 s in which the server ran, or waited for a CPU, under 35% of
the time; its CPU time is reported too, and for a leave how long the server
stayed busy (``busy``, to 0.1 s). Phases: the bare server's join and leave; the
relay's cold join, warm join, the warm client leaving (the names stay, the
cold client holds them) and the cold client leaving last (the relay forgets
them).

Runs alternate between the bare server, a fresh relay and a fresh forwarder
(in turn, then the other way round), each phase with a timeout; a refused
subscription is reported with its gRPC status instead of a time. Figures are
min and median over runs, with relay / bare (and relay / forwarder).

The relay runs from ``--relay-src`` (default: this checkout; a git worktree
of another commit measures that commit with this checkout's clients and
baselines).

The relay's ``server.max_response_size`` is 4 MiB by default (gRPC clients'
default receive limit), and the bare server sends one message whatever its
size, which this benchmark's client (no receive limit) takes: with
``--max-response-size default,2GiB`` a second relay, whose limit is what the
client accepts, is measured too (its rows say ``relay@2GiB``), the fair
comparison with the bare server's one message. With ``--variant sotw`` the
big client subscribes over SotW (``StreamAggregatedResources``; each ACK
names all K again, as Envoy's do) and the bare server is
:mod:`benchmarks.bare_sotw`, sending one pre-encoded ``DiscoveryResponse``;
the forwarder (delta only) is left out. ``--servers`` picks among
bare, relay and forwarder.

Usage: ``python -m benchmarks.big_client [--resources 1000,10000,100000] [--runs 3]
[--timeout 120] [--variant delta|sotw] [--max-response-size default,2GiB]
[--servers bare,relay,forwarder] [--relay-src DIR]``
Writes tables to stdout and JSON to ``benchmarks/results/big_client.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from benchmarks.bare import BareProcess, bare_process, big_names
from benchmarks.bare_sotw import bare_sotw_process
from benchmarks.forwarder import forwarder_process
from benchmarks.processes import (
    DELTA_ADS,
    Workers,
    cpu_seconds,
    demand_seconds,
    main_thread_cpu_seconds,
    open_streams,
    relay_process,
    wait_for_worker,
    workers,
)
from benchmarks.report import Comparison, compare, revision, table, values, write_results
from relay.xds_types import ENDPOINT

TICK_MS = 20
BASELINE_S = 2.0
# A server is quiet again when it ran or waited to run for less than this
# share of QUIET_INTERVAL_S. The probe's updates alone keep an idle relay at
# about 10% of a core; a relay at work on a big client wants all of one.
QUIET_SHARE = 0.35
QUIET_INTERVAL_S = 0.1
SENT = "sent@"
# --max-response-size: the relay's own default (server.max_response_size unset)
DEFAULT_SIZE = "default"
SOTW_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


def _ack(response: Any) -> discovery_pb2.DeltaDiscoveryRequest:
    return discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT, response_nonce=response.nonce)


class Protocol:
    """How the big client subscribes and ACKs: delta, or SotW (``--variant``)."""

    def __init__(self, variant: str, names: list[str]) -> None:
        self.variant = variant
        self.names = names
        # delta: the names not received yet; SotW: how many resources are
        # still to come (a SotW resource is an Any without its name: the
        # relay sends each once, and decoding every body to read its name
        # would be the client's work, not the server's)
        self.missing = set(names)
        self.to_come = len(names)

    def method(self) -> tuple[str, Any, Any]:
        """The ADS method, its request serializer and response deserializer."""
        if self.variant == "sotw":
            return (SOTW_ADS, discovery_pb2.DiscoveryRequest.SerializeToString,
                    discovery_pb2.DiscoveryResponse.FromString)
        return (DELTA_ADS, discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                discovery_pb2.DeltaDiscoveryResponse.FromString)

    def subscribe(self) -> Any:
        node = {"id": f"big-client-{os.getpid()}"}
        if self.variant == "sotw":
            return discovery_pb2.DiscoveryRequest(node=node, type_url=ENDPOINT,
                                                  resource_names=self.names)
        return discovery_pb2.DeltaDiscoveryRequest(node=node, type_url=ENDPOINT,
                                                   resource_names_subscribe=self.names)

    def ack(self, response: Any) -> Any:
        """A SotW ACK names the whole subscription again, as Envoy's do."""
        if self.variant == "sotw":
            return discovery_pb2.DiscoveryRequest(
                type_url=ENDPOINT, version_info=response.version_info,
                response_nonce=response.nonce, resource_names=self.names)
        return _ack(response)

    def all_in(self, response: Any) -> bool:
        """Count what ``response`` carries; whether every resource is in now."""
        if self.variant == "sotw":
            self.to_come -= len(response.resources)
            return self.to_come <= 0
        self.missing.difference_update(resource.name for resource in response.resources)
        return not self.missing


# -- the big client (its own process) ---------------------------------------------


def client_main(conn: Connection, _count: int, target: str, resources: int,
                variant: str = "delta") -> None:
    asyncio.run(_client(conn, target, resources, variant))


async def _client(conn: Connection, target: str, resources: int, variant: str) -> None:
    """Connects and says ``"ready"``; on ``"join"`` subscribes and reports the
    times (or the stream's error); on ``"leave"`` cancels its stream, reports
    when, and exits."""
    loop = asyncio.get_running_loop()
    names = big_names(resources)
    protocol = Protocol(variant, names)
    request = protocol.subscribe()
    # 100,000 resources of 1 KB are a 110 MB response.
    channel = grpc.aio.insecure_channel(target, options=[
        ("grpc.max_receive_message_length", -1), ("grpc.use_local_subchannel_pool", 1)])
    await channel.channel_ready()  # connected: the time is the subscription's only
    method, serializer, deserializer = protocol.method()
    call = channel.stream_stream(method, request_serializer=serializer,
                                 response_deserializer=deserializer)()
    conn.send("ready")
    command = await loop.run_in_executor(None, conn.recv)
    assert command == "join", command
    responses = 0
    sent = time.monotonic()
    try:
        await call.write(request)
        all_in = False
        while not all_in:
            response = await call.read()
            if response is grpc.aio.EOF:
                raise RuntimeError("the stream ended")
            responses += 1
            all_in = protocol.all_in(response)
            await call.write(protocol.ack(response))
        conn.send({"sent": sent, "done": time.monotonic(), "responses": responses})
    except grpc.aio.AioRpcError as error:
        conn.send({"error": f"{error.code().name}: {error.details()}"})
    except RuntimeError as error:
        conn.send({"error": str(error)})

    async def ack_all() -> None:
        while (response := await call.read()) is not grpc.aio.EOF:
            await call.write(protocol.ack(response))

    acks = asyncio.create_task(ack_all())
    command = await loop.run_in_executor(None, conn.recv)
    assert command == "leave", command
    left = time.monotonic()
    acks.cancel()
    call.cancel()
    # Closed before answering: the server has its part to do by then.
    await channel.close()
    conn.send({"left": left})


# -- the probe (its own process) ----------------------------------------------------


def probe_main(conn: Connection, _count: int, target: str) -> None:
    asyncio.run(_probe(conn, target))


async def _probe(conn: Connection, target: str) -> None:
    """Follows ``NAME``; says ``"ready"`` once the ticks arrive; on ``"stop"``
    sends ``(arrived, sent)`` of every tick, when it stopped, and its error."""
    loop = asyncio.get_running_loop()
    channels, calls = await open_streams(target, 1)
    call = calls[0]
    ticks: list[tuple[float, float]] = []
    ticking = asyncio.Event()

    async def follow() -> None:
        while (response := await call.read()) is not grpc.aio.EOF:
            arrived = time.monotonic()
            await call.write(_ack(response))
            for resource in response.resources:
                if resource.version.startswith(SENT):
                    ticks.append((arrived, float(resource.version.removeprefix(SENT))))
                    ticking.set()

    task = asyncio.create_task(follow())
    await asyncio.wait([task, asyncio.create_task(ticking.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    conn.send("ready")
    await loop.run_in_executor(None, conn.recv)
    stopped = time.monotonic()
    error = None
    if task.done():
        error = repr(task.exception())
    task.cancel()
    call.cancel()
    conn.send({"ticks": ticks, "stopped": stopped, "error": error})
    await channels[0].close()


def probe_stall(probe: dict[str, Any], start: float, end: float) -> dict[str, float | None]:
    """The worst gap between ticks that ended in (start, end] (a stall ends
    where the server takes up again: in the phase that caused it), and the
    worst latency of a tick sent in it or the tick before (ms)."""
    arrivals = [arrived for arrived, _ in probe["ticks"]] + [probe["stopped"]]
    gaps = [b - a for a, b in itertools.pairwise(arrivals) if start < b <= end]
    since = start - TICK_MS / 1000
    latencies = [arrived - sent for arrived, sent in probe["ticks"] if since <= sent <= end]
    return {"gap_ms": round(max(gaps) * 1000, 1) if gaps else None,
            "latency_ms": round(max(latencies) * 1000, 1) if latencies else None}


# -- the harness ------------------------------------------------------------------


class PhaseFailed(Exception):
    """A phase timed out or was refused: the run's later phases are skipped."""


async def quiet_after(pid: int, timeout: float) -> tuple[float, float]:
    """When ``pid`` next wants under ``QUIET_SHARE`` of a core (see
    :func:`demand_seconds`): the start and end of the first quiet interval."""
    deadline = time.monotonic() + timeout
    since, demand = time.monotonic(), demand_seconds(pid)
    while True:
        await asyncio.sleep(QUIET_INTERVAL_S)
        now, now_demand = time.monotonic(), demand_seconds(pid)
        if (now_demand - demand) / (now - since) < QUIET_SHARE:
            return since, now
        if now > deadline:
            raise PhaseFailed(f"server still busy {timeout:g} s later")
        since, demand = now, now_demand


class Run:
    """One run against one server: its phases' figures and windows."""

    def __init__(self, server: str, pid: int, timeout: float, origin_pid: int | None = None,
                 variant: str = "delta") -> None:
        self.figures: dict[str, Any] = {"server": server}
        self.variant = variant
        self.windows: dict[str, tuple[float, float]] = {}
        self.pid = pid
        self.origin_pid = origin_pid
        self.timeout = timeout

    async def baseline(self) -> None:
        await quiet_after(self.pid, self.timeout)
        start = time.monotonic()
        await asyncio.sleep(BASELINE_S)
        self.windows["baseline"] = (start, time.monotonic())

    async def join(self, phase: str, clients: Workers, index: int) -> None:
        pipe, proc = clients.pipes[index], clients.processes[index]
        cpu, main_cpu = cpu_seconds(self.pid), main_thread_cpu_seconds(self.pid)
        origin_cpu = cpu_seconds(self.origin_pid) if self.origin_pid else None
        pipe.send("join")
        try:
            reply = await asyncio.wait_for(wait_for_worker(pipe, proc), self.timeout)
        except TimeoutError:
            raise PhaseFailed(f"{phase}: no answer within {self.timeout:g} s") from None
        if "error" in reply:
            raise PhaseFailed(f"{phase}: refused: {reply['error']}")
        # the phase's window ends with the first quiet interval
        _, quiet = await quiet_after(self.pid, self.timeout)
        self.windows[phase] = (reply["sent"], quiet)
        self.figures[f"{phase}_ms"] = round((reply["done"] - reply["sent"]) * 1000, 1)
        self.figures[f"{phase}_responses"] = reply["responses"]
        self.figures[f"{phase}_cpu_s"] = round(cpu_seconds(self.pid) - cpu, 3)
        self.figures[f"{phase}_main_cpu_s"] = round(main_thread_cpu_seconds(self.pid) - main_cpu, 3)
        if origin_cpu is not None and self.origin_pid:
            self.figures[f"{phase}_origin_cpu_s"] = round(
                cpu_seconds(self.origin_pid) - origin_cpu, 3)

    async def leave(self, phase: str, clients: Workers, index: int) -> None:
        pipe, proc = clients.pipes[index], clients.processes[index]
        cpu = cpu_seconds(self.pid)
        pipe.send("leave")
        left = (await wait_for_worker(pipe, proc))["left"]
        busy_until, quiet = await quiet_after(self.pid, self.timeout)
        self.windows[phase] = (left, quiet)
        self.figures[f"{phase}_busy_s"] = round(busy_until - left, 3)
        self.figures[f"{phase}_cpu_s"] = round(cpu_seconds(self.pid) - cpu, 3)

    async def finish(self, probe: Workers, clients: Workers) -> dict[str, Any]:
        """Stop the probe and the clients; the figures, with the probe's stalls."""
        for proc in clients.processes:
            proc.kill()
        probe.send("stop")
        (ticks,) = await probe.next_messages()
        if ticks["error"]:
            self.figures["probe_error"] = ticks["error"]
        # the machine's 1-minute load when the run ended: how noisy it was
        self.figures["load"] = os.getloadavg()[0]
        for phase, (start, end) in self.windows.items():
            for key, value in probe_stall(ticks, start, end).items():
                self.figures[f"{phase}_{key}"] = value
        return self.figures


async def measure_bare(bare: BareProcess, resources: int, timeout: float,
                       variant: str = "delta") -> dict[str, Any]:
    run = Run("bare", bare.pid, timeout)
    async with workers(probe_main, 1, 1, bare.target) as probe, \
            workers(client_main, 1, 1, bare.target, resources, variant) as clients:
        try:
            await run.baseline()
            await run.join("join", clients, 0)
            await run.leave("leave", clients, 0)
        except PhaseFailed as failure:
            run.figures["error"] = str(failure)
        return await run.finish(probe, clients)


async def measure_forwarder(origin: BareProcess, resources: int, timeout: float
                            ) -> dict[str, Any]:
    # (delta only: the forwarder speaks delta to its clients)
    async with forwarder_process(origin.target) as forwarder, \
            workers(probe_main, 1, 1, forwarder.target) as probe, \
            workers(client_main, 1, 1, forwarder.target, resources) as clients:
        run = Run("forwarder", forwarder.pid, timeout, origin.pid)
        try:
            await run.baseline()
            await run.join("join", clients, 0)
        except PhaseFailed as failure:
            run.figures["error"] = str(failure)
        return await run.finish(probe, clients)


async def measure_relay(origin: BareProcess, resources: int, timeout: float,
                        src: Path | None = None, max_response_size: str = DEFAULT_SIZE,
                        variant: str = "delta") -> dict[str, Any]:
    server = "" if max_response_size == DEFAULT_SIZE else \
        f"max_response_size: {max_response_size}"
    async with relay_process("big-client-bench", origin.port, drain_period=0, src=src,
                             server_extra=server) as relay, \
            workers(probe_main, 1, 1, relay.target) as probe, \
            workers(client_main, 2, 2, relay.target, resources, variant) as clients:
        run = Run(relay_kind(max_response_size), relay.process.pid, timeout, origin.pid)
        try:
            await run.baseline()
            await run.join("cold_join", clients, 0)
            await run.join("warm_join", clients, 1)
            await run.leave("warm_leave", clients, 1)
            await run.leave("last_leave", clients, 0)
        except PhaseFailed as failure:
            run.figures["error"] = str(failure)
        return await run.finish(probe, clients)


# the servers of each run, in this order (and the next run in the reverse); a
# relay for each --max-response-size
KINDS = ("bare", "relay", "forwarder")


def relay_kind(max_response_size: str) -> str:
    """The name of a relay's runs: ``relay``, or ``relay@SIZE`` for a size set."""
    return "relay" if max_response_size == DEFAULT_SIZE else f"relay@{max_response_size}"

# (label, the relay's figure, the bare server's figure or None)
ROWS: Sequence[tuple[str, str, str | None]] = (
    ("all K received, relay warm (ms)", "warm_join_ms", "join_ms"),
    ("all K received, relay cold (ms)", "cold_join_ms", "join_ms"),
    ("server CPU, warm join (s)", "warm_join_cpu_s", "join_cpu_s"),
    ("server main-thread CPU, warm join (s)", "warm_join_main_cpu_s", "join_main_cpu_s"),
    ("server CPU, cold join (s)", "cold_join_cpu_s", "join_cpu_s"),
    ("origin CPU, cold join (s)", "cold_join_origin_cpu_s", None),
    ("server CPU, warm leave (s)", "warm_leave_cpu_s", "leave_cpu_s"),
    ("server CPU, last leave (s)", "last_leave_cpu_s", "leave_cpu_s"),
    # polled every 0.1 s: the bare server's are all under that
    ("busy after warm leave (s)", "warm_leave_busy_s", None),
    ("busy after last leave (s)", "last_leave_busy_s", None),
    *((f"probe worst {what}, {label} (ms)", f"{relay}_{key}", f"{bare}_{key}")
      for what, key in (("gap", "gap_ms"), ("latency", "latency_ms"))
      for label, relay, bare in (("baseline", "baseline", "baseline"),
                                 ("cold join", "cold_join", "join"),
                                 ("warm join", "warm_join", "join"),
                                 ("warm leave", "warm_leave", "leave"),
                                 ("last leave", "last_leave", "leave"))),
)


# (label, the relay's figure, the forwarder's): the cold join against its other bound
FORWARDER_ROWS: Sequence[tuple[str, str, str]] = (
    ("all K received, relay cold / forwarder (ms)", "cold_join_ms", "join_ms"),
    ("server CPU, cold join / forwarder (s)", "cold_join_cpu_s", "join_cpu_s"),
    ("origin CPU, cold join / forwarder (s)", "cold_join_origin_cpu_s", "join_origin_cpu_s"),
    ("probe worst gap, cold join / forwarder (ms)", "cold_join_gap_ms", "join_gap_ms"),
)


def summarize(runs: dict[str, list[dict[str, Any]]], kind: str = "relay"
              ) -> dict[str, Comparison]:
    """The table of one relay's runs (``kind``) against the bare server's and
    the forwarder's (either left out: no ratios against it)."""
    bare_runs = runs.get("bare")  # (none with --servers relay,forwarder)
    return {**{label: compare(values(runs[kind], relay),
                              None if bare is None or not bare_runs else values(bare_runs, bare))
               for label, relay, bare in ROWS},
            **{label: compare(values(runs[kind], relay),
                              values(runs["forwarder"], forwarder))
               for label, relay, forwarder in FORWARDER_ROWS if runs.get("forwarder")}}


def kinds_of(args: argparse.Namespace) -> list[str]:
    """The servers each run measures, in order: the bare server, a relay per
    ``--max-response-size``, and (delta, unless left out) the forwarder."""
    chosen = args.servers.split(",")
    kinds = ["bare"] if "bare" in chosen else []
    if "relay" in chosen:
        kinds += [relay_kind(size) for size in args.max_response_size.split(",")]
    if "forwarder" in chosen and args.variant == "delta":  # (it serves delta only)
        kinds.append("forwarder")
    return kinds


async def measure(kind: str, bare: BareProcess, origin: BareProcess, resources: int,
                  args: argparse.Namespace) -> dict[str, Any]:
    if kind == "bare":
        return await measure_bare(bare, resources, args.timeout, args.variant)
    if kind == "forwarder":
        return await measure_forwarder(origin, resources, args.timeout)
    size = kind.partition("@")[2] or DEFAULT_SIZE
    return await measure_relay(origin, resources, args.timeout, args.relay_src, size,
                               args.variant)


async def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    kinds = kinds_of(args)
    for resources in (int(x) for x in args.resources.split(",")):
        runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
        baseline = bare_sotw_process(resources, args.size) if args.variant == "sotw" else \
            bare_process(resources, args.size)
        async with baseline as bare, bare_process(resources, args.size) as origin:
            for server in (bare, origin):
                await server.command(f"tick bench {TICK_MS}")
            for run in range(args.runs):
                for kind in kinds if run % 2 == 0 else kinds[::-1]:
                    figures = await measure(kind, bare, origin, resources, args)
                    runs[kind].append(figures)
                    print(json.dumps({"resources": resources, "run": run, **figures}),
                          flush=True)
        errors = [f"{r['server']} run {i}: {r['error']}"
                  for kind in runs for i, r in enumerate(runs[kind]) if "error" in r]
        results.append({"resources": resources, "runs": runs, "errors": errors, "summary": {
            kind: summarize(runs, kind) for kind in kinds if kind.startswith("relay")}})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resources", default="1000,10000,100000",
                        help="values of K, comma-separated")
    parser.add_argument("--size", type=int, default=1024, help="bytes per resource (about)")
    parser.add_argument("--runs", type=int, default=3, help="runs per server and K")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a phase (a join, a leave's aftermath) may take")
    parser.add_argument("--variant", choices=["delta", "sotw"], default="delta",
                        help="the big client's protocol (the probe's is delta)")
    parser.add_argument("--max-response-size", default=DEFAULT_SIZE, metavar="SIZES",
                        help="the relay's server.max_response_size, comma-separated: a "
                             "relay for each ('default': unset, 4MiB; '2GiB': as much as "
                             "the client accepts)")
    parser.add_argument("--servers", default=",".join(KINDS),
                        help=f"which of {','.join(KINDS)} to measure")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/big_client.json"))
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        metavar="DIR", help="run the relay from this source tree (default: "
                                            "the checkout holding this script)")
    args = parser.parse_args()
    args.relay_src = args.relay_src.resolve()
    commit = revision(args.relay_src)
    print(f"relay at {commit} ({args.relay_src}), {args.variant} client", flush=True)
    results = asyncio.run(run_all(args))
    for result in results:
        for kind, summary in result["summary"].items():
            rows = [(label, summary[label]) for label, _, _ in (*ROWS, *FORWARDER_ROWS)
                    if label in summary]
            print(f"\nK = {result['resources']}, {kind}, {args.runs} runs each:\n"
                  f"{table(rows, 'figure')}")
        for error in result["errors"]:
            print(f"  {error}")
    write_results(args.out, "benchmarks.big_client", runs=args.runs, results=results,
                  relay_src=str(args.relay_src), revision=commit, variant=args.variant)


if __name__ == "__main__":
    main()
