"""Soak benchmark: a relay with 1,000 clients through a long origin outage.

A relay runs as its own process (``xds-relay run``, one process) following a
scripted origin in this process (:class:`tests.harness.ScriptedOrigin`, as
:mod:`benchmarks.fanout` uses), which can stop (its server gone: the relay's
stream breaks and its reconnects are refused) and start again on the same port.

The origin serves ``CLUSTERS`` Clusters (``c-0`` ...), ``E`` ClusterLoadAssignments
(``ep-0`` ..., E = 3/10 of the clients, at least 30), ``BULK`` larger ones (about
4 KB each, ``bulk-0`` ...) and ``probe-tick``. Each resource carries its
generation in its body (a Cluster's ``connect_timeout`` seconds, a
ClusterLoadAssignment's first port - 10000), so that delta and SotW clients
alike can tell which version they hold.

The clients, each stream on a connection of its own:

* **well-behaved** (``--clients``, half delta, half SotW, in ``--workers``
  processes): each subscribes to every Cluster and to 3 ClusterLoadAssignments of
  its own, ACKs every response, and keeps per name the generation it holds.
  Every end of its stream that it did not ask for (an error status, or the
  relay ending it, even with OK) is a *disconnect*: recorded with its status,
  and the client reconnects after 1 s. ``--late`` of them (a fraction) connect
  during the outage, spread over its first half.
* **churn**: ``--churn-rate`` operations per second, over all of them, each on a
  random client: unsubscribe a name and subscribe it again 0.5-3 s later;
  swap one of its ClusterLoadAssignments for another; or close its stream
  (cancel, a clean close) and open it again at once.
* an **anchor** (well-behaved, in the probe process) subscribes to every name,
  as the rest of a zone would: what churn lets go stays cached, so that every
  subscription during the outage can be answered from the cache.
* **hostile** (``--hostile``, one process with the stalled ones): each one,
  one connection per attempt, cycles through ``HOSTILE_KINDS``: garbage bytes
  as a request (delta and SotW methods in turn); 5,000 names in one
  request; a 100 KB name; a flood of NACKs with 1 MB messages; an unknown,
  new type URL; requests after requests without ever ACKing. Each attempt
  lasts until the relay ends the stream or ``HOLD`` seconds; its outcome
  (``ended:<status>``, or ``open:answered`` / ``open:silent``: the relay still
  served it) is counted by kind.
* **stalled** (``--stalled``): subscribe to every Cluster and every bulk name
  (about 400 KB), never read a response, and change a bulk subscription every
  5 s; their stream's state is reported at the end.

The phases: **warm-up** (``--warmup`` s, everyone connected and synced, churn
and hostile clients going); **down** (``--down`` s, 600 by default: the origin
stopped; late clients connect, churn, hostile and stalled clients go on);
**return**: the origin starts again on its port with changes (``c-0``,
``c-1``, every 20th ClusterLoadAssignment and ``bulk-0`` change, ``c-9`` is
removed) until every well-behaved client holds exactly what it should (or
``--converge-timeout``); **tail** (``--tail`` s). Then churn stops, and after
5 s every well-behaved client's holdings are compared with what it
subscribes to.

Reported:

* **disconnects** of well-behaved clients (must be 0), by status and phase;
* **resources lost**: well-behaved clients whose holdings at the end differ
  from the origin's resources for the names they subscribe to (must be 0);
  resources received for names not subscribed;
* **convergence**: from the origin's restart until every well-behaved client
  holds the new generations (and the median client), the relay's backoff
  step then and its reconnect, from its log;
* **served from cache**: subscriptions made during the outage (late clients,
  churn, reopened streams): how many were answered during it, latency p99 and
  max, and how many waited for the origin;
* **relay RSS** sampled every ``--sample-interval`` s (``/proc/PID/status``):
  at the end of warm-up, max, end, and the slope over the outage (KiB/min,
  all of it and its second half, after the late clients: bounded means
  about 0), and the relay's CPU time per phase, open fds; every
  ``--metrics-interval`` s its gauges too (streams, cached names, names
  subscribed upstream), to tell what grows from what is held;
* **loop lag**, measured from outside (the relay exports no loop-lag metric):
  a probe stream (its own process) subscribes to ``c-0``, a cached name, and
  unsubscribes every 0.5 s; the time from its request to the response is the
  relay's responsiveness to any client (its event loop's lag, plus a few ms of
  gRPC on an idle machine), p50/p99/max per phase; while the origin is up,
  ``probe-tick`` changes every second with its send time as its version, and
  the probe reports origin send -> client receipt; and the relay's
  ``xds_relay_push_latency_seconds`` histogram per phase (p99 and max as
  bucket bounds; pushes only, so none while the origin is down);
* **hostile outcomes** by kind, the stalled streams' states (and, once they
  read at last, what the relay had kept for them), the relay's log volume by
  message (hostile clients can make it log), and counts of streams, requests
  and responses.

Takes ``--warmup`` + ``--down`` + ``--tail`` s plus about 30 s of set-up and
reports, plus the convergence (after a 600 s outage the relay's backoff is at
its maximum, 30 s by default): about 12 minutes with the defaults.

Usage: ``python -m benchmarks.soak [--clients 1000] [--down 600] [--hostile 5]
[--stalled 3] [--churn-rate 5] [--workers 2] [--warmup 30] [--tail 30]
[--hostile-kinds garbage,many_names,...] [--upstream "backoff: {max: 5s}"]``
Writes a summary to stdout and JSON to ``benchmarks/results/soak.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import os
import random
import re
import statistics
import threading
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import message
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.fanout import rss_kib
from benchmarks.processes import DELTA_ADS, channel, cpu_seconds, relay_process, workers
from benchmarks.report import write_results
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints
from tests.harness import ScriptedOrigin

SOTW_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
TYPES = (CLUSTER, ENDPOINT)
CLUSTERS = 10
PER_CLIENT = 3
BULK = 100
BULK_PORTS = 200       # padding of a bulk ClusterLoadAssignment: about 4 KB
PROBE_NAME = "probe-tick"
FIRST_PORT = 10000     # a ClusterLoadAssignment's first port is FIRST_PORT + its generation
HOLD = 5.0             # how long a hostile attempt lasts if the relay does not end it
NACKS = 20             # NACKs of 1 MB in a flood, 50 ms apart
SYNC_TIMEOUT = 180.0
HOSTILE_KINDS = ("garbage", "many_names", "huge_name", "nack_flood", "unknown_type", "no_acks")
PHASES = ("warmup", "down", "return", "tail")

State = dict[str, dict[str, int]]   # type URL -> name -> generation


# -- the origin's resources -------------------------------------------------------


def endpoint_count(clients: int) -> int:
    return max(30, clients * PER_CLIENT // 10)


def cluster_names() -> list[str]:
    return [f"c-{i}" for i in range(CLUSTERS)]


def client_endpoints(index: int, total: int) -> list[str]:
    return [f"ep-{(index * PER_CLIENT + k) % total}" for k in range(PER_CLIENT)]


def initial_state(clients: int) -> State:
    eps = {f"ep-{i}": 1 for i in range(endpoint_count(clients))}
    eps.update({f"bulk-{i}": 1 for i in range(BULK)})
    return {CLUSTER: dict.fromkeys(cluster_names(), 1), ENDPOINT: eps}


def changed_state(state: State) -> tuple[State, list[str]]:
    """The origin's state when it comes back, and the Cluster it removed."""
    new = {t: dict(names) for t, names in state.items()}
    removed = f"c-{CLUSTERS - 1}"
    for name in ("c-0", "c-1"):
        new[CLUSTER][name] += 1
    del new[CLUSTER][removed]
    for name in [n for n in new[ENDPOINT] if n.startswith("ep-")][::20]:
        new[ENDPOINT][name] += 1
    new[ENDPOINT]["bulk-0"] += 1
    return new, [removed]


def resource(type_url: str, name: str, generation: int) -> message.Message:
    if type_url == CLUSTER:
        return cluster(name, generation)
    padding = range(30000, 30000 + BULK_PORTS) if name.startswith("bulk-") else ()
    return endpoints(name, FIRST_PORT + generation, *padding)


def messages(state: State) -> list[message.Message]:
    return [resource(t, name, gen) for t, names in state.items() for name, gen in names.items()]


def generation(type_url: str, body: bytes) -> tuple[str, int]:
    """The name and generation of a resource's body."""
    if type_url == CLUSTER:
        c = cluster_pb2.Cluster.FromString(body)
        return c.name, int(c.connect_timeout.seconds)
    cla = endpoint_pb2.ClusterLoadAssignment.FromString(body)
    lb = cla.endpoints[0].lb_endpoints if cla.endpoints else []
    port = lb[0].endpoint.address.socket_address.port_value if lb else FIRST_PORT
    return cla.cluster_name, int(port) - FIRST_PORT


def _stream(chan: grpc.aio.Channel, delta: bool) -> Any:
    if delta:
        return chan.stream_stream(
            DELTA_ADS, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)
    return chan.stream_stream(
        SOTW_ADS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
        response_deserializer=discovery_pb2.DiscoveryResponse.FromString)


def _status(error: BaseException) -> tuple[str, str]:
    if isinstance(error, grpc.aio.AioRpcError):
        return error.code().name, (error.details() or "")[:200]
    return type(error).__name__, str(error)[:200]


# -- well-behaved clients (worker processes) --------------------------------------


class Client:
    """One well-behaved ADS stream: subscribes, ACKs everything, keeps what it
    holds, reconnects after a disconnect; churn operations change it."""

    def __init__(self, pool: Pool, index: int, delta: bool,
                 names: dict[str, set[str]]) -> None:
        self.pool = pool
        self.index = index
        self.delta = delta
        self.protocol = "delta" if delta else "sotw"
        self.channel = channel(pool.target)
        self.names = names
        self.held: dict[str, dict[str, int]] = {t: {} for t in TYPES}
        self.sotw: dict[str, tuple[str, str]] = {}   # type -> last (version_info, nonce)
        # names subscribed and not yet answered: when, and in which phase
        self.pending: dict[str, tuple[float, str]] = {}
        self.call: Any = None
        self.lock = asyncio.Lock()
        self.closing = False   # the client itself is closing its stream
        self.busy = False      # a churn operation is under way
        self.synced = asyncio.Event()
        self.matched_at: float | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def write(self, request: Any) -> None:
        async with self.lock:
            await self.call.write(request)
        self.pool.counts["requests"] += 1

    def _subscription(self, type_url: str) -> Any:
        node = {"id": f"soak-{self.index}"}
        names = sorted(self.names[type_url])
        if self.delta:
            return discovery_pb2.DeltaDiscoveryRequest(node=node, type_url=type_url,
                                                       resource_names_subscribe=names)
        return discovery_pb2.DiscoveryRequest(node=node, type_url=type_url, resource_names=names)

    async def open(self) -> None:
        """A new stream, subscribed to what the client wants (under the write
        lock, so that a churn operation's request goes after these)."""
        async with self.lock:
            self.call = _stream(self.channel, self.delta)(wait_for_ready=True)
            self.held = {t: {} for t in TYPES}
            self.sotw = {}
            now = time.monotonic()
            self.pending = {n: (now, self.pool.phase) for t in TYPES for n in self.names[t]}
            self.pool.counts["streams_opened"] += 1
            for type_url in TYPES:
                await self.call.write(self._subscription(type_url))
                self.pool.counts["requests"] += 1

    async def run(self) -> None:
        while True:
            code, details = "OK", "ended by the relay"
            try:
                await self.open()
                while (response := await self.call.read()) is not grpc.aio.EOF:
                    await self.on_response(response)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not self.closing or (task is not None and task.cancelling()):
                    raise
            except Exception as error:
                code, details = _status(error)
            if self.closing:
                self.closing = False
                self.pool.counts["clean_closes"] += 1
                continue
            self.pool.disconnect(self, code, details)
            await asyncio.sleep(1.0)

    def arrived(self, name: str, now: float) -> None:
        entry = self.pending.pop(name, None)
        if entry is not None:
            self.pool.answered(entry, now)

    async def on_response(self, response: Any) -> None:
        now = time.monotonic()
        self.pool.counts["responses"] += 1
        type_url = response.type_url
        wanted = self.names.get(type_url, set())
        held = self.held.setdefault(type_url, {})
        if self.delta:
            for res in response.resources:
                if res.name not in wanted:
                    self.pool.counts["unsolicited_resources"] += 1
                    continue
                held[res.name] = generation(type_url, res.resource.value)[1]
                self.arrived(res.name, now)
            for name in response.removed_resources:
                held.pop(name, None)
                self.arrived(name, now)
            ack: Any = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url,
                                                           response_nonce=response.nonce)
        else:
            got = dict(generation(type_url, body.value) for body in response.resources)
            self.pool.counts["unsolicited_resources"] += sum(1 for n in got if n not in wanted)
            got = {n: g for n, g in got.items() if n in wanted}
            if type_url == CLUSTER:  # the whole subscribed set: absence is removal
                held.clear()
                for name in [n for n in self.pending if n in wanted]:
                    self.arrived(name, now)
            held.update(got)
            for name in got:
                self.arrived(name, now)
            self.sotw[type_url] = (response.version_info, response.nonce)
            ack = discovery_pb2.DiscoveryRequest(
                type_url=type_url, version_info=response.version_info,
                response_nonce=response.nonce, resource_names=sorted(wanted))
        await self.write(ack)
        if not self.pending:
            self.synced.set()
        if self.pool.expected is not None and self.matched_at is None and self.matches():
            self.matched_at = now

    def difference(self) -> dict[str, Any] | None:
        """How what it holds differs from what it should (None: not at all)."""
        expected = self.pool.expected
        assert expected is not None
        out: dict[str, Any] = {}
        for type_url in TYPES:
            want = {n: expected[type_url][n] for n in self.names[type_url]
                    if n in expected[type_url]}
            have = self.held.get(type_url, {})
            missing = sorted(set(want) - set(have))
            extra = sorted(set(have) - set(want))
            stale = sorted(n for n in want if n in have and have[n] != want[n])
            if missing or extra or stale:
                out[type_url.rsplit(".", 1)[-1]] = {"missing": missing, "extra": extra,
                                                    "stale": stale}
        return out or None

    def matches(self) -> bool:
        return self.difference() is None

    async def change(self, type_url: str, subscribe: Sequence[str] = (),
                     unsubscribe: Sequence[str] = ()) -> None:
        now = time.monotonic()
        names = self.names[type_url]
        names.difference_update(unsubscribe)
        names.update(subscribe)
        for name in unsubscribe:
            self.held[type_url].pop(name, None)
            self.pending.pop(name, None)
        for name in subscribe:
            self.pending[name] = (now, self.pool.phase)
        if self.delta:
            request: Any = discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, resource_names_subscribe=subscribe,
                resource_names_unsubscribe=unsubscribe)
        else:
            version, nonce = self.sotw.get(type_url, ("", ""))
            request = discovery_pb2.DiscoveryRequest(
                type_url=type_url, version_info=version, response_nonce=nonce,
                resource_names=sorted(names))
        await self.write(request)
        if self.pool.expected is not None and self.matched_at is None and self.matches():
            self.matched_at = now

    # -- churn --------------------------------------------------------------------

    async def churn(self, kind: str, endpoints_total: int) -> None:
        if kind == "toggle":
            type_url = random.choice(TYPES)
            name = random.choice(sorted(self.names[type_url]))
            await self.change(type_url, unsubscribe=[name])
            await asyncio.sleep(random.uniform(0.5, 3.0))
            await self.change(type_url, subscribe=[name])
        elif kind == "swap":
            old = random.choice(sorted(self.names[ENDPOINT]))
            new = f"ep-{random.randrange(endpoints_total)}"
            if new not in self.names[ENDPOINT]:
                await self.change(ENDPOINT, subscribe=[new], unsubscribe=[old])
        else:  # reopen
            self.closing = True
            self.call.cancel()
            await asyncio.sleep(0)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        if self.call is not None:
            self.call.cancel()
        await self.channel.close()


class Pool:
    """The well-behaved clients of one process, and what they saw."""

    def __init__(self, target: str, endpoints_total: int) -> None:
        self.target = target
        self.endpoints_total = endpoints_total
        self.clients: list[Client] = []
        self.phase = "warmup"
        self.expected: State | None = None
        self.counts: Counter[str] = Counter()
        self.disconnects: list[dict[str, Any]] = []
        # latencies of subscriptions, by the phase they were made in
        self.latency: dict[str, list[float]] = defaultdict(list)
        # subscriptions answered only in a later phase, by the phase they were made in
        self.answered_later: Counter[str] = Counter()
        self.churn_rate = 0.0
        self.churn_ops: Counter[str] = Counter()
        self.churn_failed: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def answered(self, entry: tuple[float, str], now: float) -> None:
        subscribed, phase = entry
        self.latency[phase].append(now - subscribed)
        if phase != self.phase:
            self.answered_later[phase] += 1

    def disconnect(self, client: Client, code: str, details: str) -> None:
        self.disconnects.append({"client": client.index, "protocol": client.protocol,
                                 "phase": self.phase, "status": code, "details": details,
                                 "at": time.time()})

    def new_client(self, index: int, names: dict[str, set[str]] | None = None) -> Client:
        if names is None:
            names = {CLUSTER: set(cluster_names()),
                     ENDPOINT: set(client_endpoints(index, self.endpoints_total))}
        client = Client(self, index, index % 2 == 0, names)
        self.clients.append(client)
        client.start()
        return client

    async def add(self, indices: Sequence[int], at_once: int = 100) -> None:
        """Start clients, ``at_once`` joining at a time; until all are synced."""
        gate = asyncio.Semaphore(at_once)

        async def join(index: int) -> None:
            async with gate:
                await asyncio.wait_for(self.new_client(index).synced.wait(), SYNC_TIMEOUT)

        await asyncio.gather(*(join(i) for i in indices))

    async def add_late(self, indices: Sequence[int], spread: float) -> None:
        for index in indices:
            await asyncio.sleep(spread / max(len(indices), 1))
            self.new_client(index)

    async def churn_loop(self) -> None:
        while True:
            if self.churn_rate <= 0 or not self.clients:
                await asyncio.sleep(0.5)
                continue
            await asyncio.sleep(random.expovariate(self.churn_rate))
            idle = [c for c in self.clients if not c.busy and c.call is not None]
            if not idle:
                continue
            client = random.choice(idle)
            kind = random.choice(("toggle", "swap", "reopen"))
            self.spawn(self._churn(client, kind))

    async def _churn(self, client: Client, kind: str) -> None:
        client.busy = True
        self.churn_ops[kind] += 1
        try:
            await client.churn(kind, self.endpoints_total)
        except Exception as error:
            self.churn_failed[f"{kind}: {_status(error)[0]}"] += 1
        finally:
            client.busy = False

    def expect(self, state: State) -> None:
        self.expected = state
        now = time.monotonic()
        for client in self.clients:
            client.matched_at = now if client.matches() else None

    def converged(self) -> dict[str, Any]:
        return {"clients": len(self.clients),
                "matched": [c.matched_at for c in self.clients if c.matched_at is not None]}

    def final(self) -> list[dict[str, Any]]:
        out = []
        for client in self.clients:
            diff = client.difference()
            if diff is not None:
                out.append({"client": client.index, "protocol": client.protocol, **diff})
        return out

    def report(self) -> dict[str, Any]:
        now = time.monotonic()
        waiting: Counter[str] = Counter()
        for client in self.clients:
            for subscribed, phase in client.pending.values():
                if now - subscribed > 5:
                    waiting[phase] += 1
        return {"clients": len(self.clients), "counts": dict(self.counts),
                "disconnects": self.disconnects, "latency": dict(self.latency),
                "answered_later": dict(self.answered_later),
                "unanswered_over_5s": dict(waiting), "churn_ops": dict(self.churn_ops),
                "churn_failed": dict(self.churn_failed)}

    async def command(self, command: Any) -> Any:
        match command:
            case ("phase", phase):
                self.phase = phase
            case ("churn", rate):
                self.churn_rate = rate
            case ("late", indices, spread):
                self.spawn(self.add_late(indices, spread))
            case ("expect", state):
                self.expect(state)
            case "converged":
                return self.converged()
            case "final":
                return self.final()
            case "report":
                return self.report()
            case _:
                raise ValueError(f"unknown command {command!r}")
        return "ok"

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(c.close() for c in self.clients), return_exceptions=True)


async def serve_commands(conn: Connection, handle: Any) -> None:
    """Answer the harness's commands, one reply each, until None."""
    loop = asyncio.get_running_loop()
    while (command := await loop.run_in_executor(None, conn.recv)) is not None:
        conn.send(await handle(command))


def worker_main(conn: Connection, first: int, count: int, target: str,
                endpoints_total: int) -> None:
    asyncio.run(_worker(conn, first, count, target, endpoints_total))


async def _worker(conn: Connection, first: int, count: int, target: str,
                  endpoints_total: int) -> None:
    pool = Pool(target, endpoints_total)
    churn = asyncio.create_task(pool.churn_loop())
    await pool.add(range(first, first + count))
    conn.send("ready")
    try:
        await serve_commands(conn, pool.command)
    finally:
        churn.cancel()
        await pool.close()


# -- the probe process: the anchor, the round-trip and update probes --------------


class Probes:
    """The anchor (a well-behaved client of every name), and two probe streams."""

    def __init__(self, target: str, anchor_index: int, state: State) -> None:
        self.pool = Pool(target, 0)
        self.anchor_index = anchor_index
        self.state = state
        self.target = target
        self.round_trips: list[tuple[float, str, float]] = []   # (when, phase, seconds)
        self.updates: list[tuple[float, str, float]] = []
        self.errors: list[dict[str, Any]] = []
        self.round_trip_timeouts: Counter[str] = Counter()

    async def start(self) -> list[asyncio.Task[None]]:
        names = {t: set(n) for t, n in self.state.items()}
        await asyncio.wait_for(self.pool.new_client(self.anchor_index, names).synced.wait(),
                               SYNC_TIMEOUT)
        return [asyncio.create_task(self.round_trip()), asyncio.create_task(self.ticks())]

    def error(self, probe: str, error: BaseException) -> None:
        code, details = _status(error)
        self.errors.append({"probe": probe, "phase": self.pool.phase, "status": code,
                            "details": details})

    async def round_trip(self) -> None:
        """Subscribe to ``c-0`` (cached: the anchor holds it), time the answer,
        ACK it, unsubscribe; every 0.5 s."""
        chan = channel(self.target)
        while True:
            call = _stream(chan, True)(wait_for_ready=True)
            inbox: asyncio.Queue[Any] = asyncio.Queue()

            async def read(call: Any = call, inbox: asyncio.Queue[Any] = inbox) -> None:
                try:
                    while (response := await call.read()) is not grpc.aio.EOF:
                        inbox.put_nowait(response)
                    inbox.put_nowait(grpc.aio.EOF)
                except grpc.aio.AioRpcError as e:
                    inbox.put_nowait(e)

            reader = asyncio.create_task(read())
            first = True
            try:
                while True:
                    sent = time.monotonic()
                    phase = self.pool.phase
                    await call.write(discovery_pb2.DeltaDiscoveryRequest(
                        node={"id": "soak-probe"} if first else None, type_url=CLUSTER,
                        resource_names_subscribe=["c-0"]))
                    first = False
                    while True:
                        try:
                            response = await asyncio.wait_for(inbox.get(), 30)
                        except TimeoutError:
                            self.round_trip_timeouts[phase] += 1
                            raise
                        if response is grpc.aio.EOF or isinstance(response, BaseException):
                            raise response if isinstance(response, BaseException) else \
                                RuntimeError("the relay ended the probe stream")
                        await call.write(discovery_pb2.DeltaDiscoveryRequest(
                            type_url=CLUSTER, response_nonce=response.nonce))
                        if any(r.name == "c-0" for r in response.resources):
                            break
                    self.round_trips.append((sent, phase, time.monotonic() - sent))
                    await call.write(discovery_pb2.DeltaDiscoveryRequest(
                        type_url=CLUSTER, resource_names_unsubscribe=["c-0"]))
                    await asyncio.sleep(0.5)
            except Exception as error:
                self.error("round_trip", error)
            finally:
                reader.cancel()
                call.cancel()
            await asyncio.sleep(1.0)

    async def ticks(self) -> None:
        """Hold ``probe-tick``: its version is the origin's send time."""
        chan = channel(self.target)
        while True:
            call = _stream(chan, True)(wait_for_ready=True)
            try:
                await call.write(discovery_pb2.DeltaDiscoveryRequest(
                    node={"id": "soak-tick"}, type_url=ENDPOINT,
                    resource_names_subscribe=[PROBE_NAME]))
                first = True
                while (response := await call.read()) is not grpc.aio.EOF:
                    now = time.monotonic()
                    for res in response.resources:
                        if res.version.startswith("sent@") and not first:
                            self.updates.append((now, self.pool.phase,
                                                 now - float(res.version[5:])))
                    first = False
                    await call.write(discovery_pb2.DeltaDiscoveryRequest(
                        type_url=ENDPOINT, response_nonce=response.nonce))
                self.error("ticks", RuntimeError("the relay ended the tick stream"))
            except Exception as error:
                self.error("ticks", error)
            finally:
                call.cancel()
            await asyncio.sleep(1.0)

    async def command(self, command: Any) -> Any:
        if command == "probes":
            return {"round_trips": self.round_trips, "updates": self.updates,
                    "errors": self.errors, "round_trip_timeouts": dict(self.round_trip_timeouts)}
        return await self.pool.command(command)


def probe_main(conn: Connection, _share: int, target: str, anchor_index: int,
               state: State) -> None:
    asyncio.run(_probe(conn, target, anchor_index, state))


async def _probe(conn: Connection, target: str, anchor_index: int, state: State) -> None:
    probes = Probes(target, anchor_index, state)
    tasks = await probes.start()
    conn.send("ready")
    try:
        await serve_commands(conn, probes.command)
    finally:
        for task in tasks:
            task.cancel()
        await probes.pool.close()


# -- hostile and stalled clients (one process) -----------------------------------


async def _drain(call: Any, until: float) -> tuple[str, int]:
    """Read until the stream ends (``ended:<status>``) or ``until``
    (``open:answered`` or ``open:silent``); and how many responses came."""
    count = 0
    try:
        while True:
            left = until - time.monotonic()
            if left <= 0:
                break
            response = await asyncio.wait_for(call.read(), left)
            if response is grpc.aio.EOF:
                return "ended:OK", count
            count += 1
    except TimeoutError:
        pass
    except Exception as error:
        return f"ended:{_status(error)[0]}", count
    return ("open:answered" if count else "open:silent"), count


def _nack_body() -> str:
    return "NACK " + "x" * (1024 * 1024 - 5)


class Hostile:
    """Hostile clients, each cycling through the kinds, and stalled clients."""

    def __init__(self, target: str, endpoints_total: int, kinds: Sequence[str]) -> None:
        self.target = target
        self.endpoints_total = endpoints_total
        self.kinds = kinds
        self.outcomes: dict[str, Counter[str]] = {k: Counter() for k in kinds}
        self.details: dict[str, dict[str, str]] = {k: {} for k in kinds}
        self.bytes_sent = 0
        self.stalled: list[tuple[Any, int]] = []
        self.stall_tasks: list[asyncio.Task[None]] = []
        self.stalled_writes = 0
        self.stalled_write_failures: Counter[str] = Counter()
        self.nack = _nack_body()

    async def attempt(self, kind: str, number: int) -> tuple[str, str]:
        chan = channel(self.target)
        until = time.monotonic() + HOLD
        try:
            if kind == "garbage":
                method = DELTA_ADS if number % 2 == 0 else SOTW_ADS
                call = chan.stream_stream(method)()   # bytes as they are, both ways
                garbage = b"\x0f" + os.urandom(255)   # wire type 7: never valid
                await call.write(garbage)
                self.bytes_sent += len(garbage)
                outcome, _ = await _drain(call, until)
            else:
                call = _stream(chan, True)()
                outcome = await getattr(self, kind)(call, until)
            details = ""
            if outcome.startswith("ended:") and outcome != "ended:OK":
                details = (await call.details() or "")[:200]
            call.cancel()
            return outcome, details
        except Exception as error:
            code, details = _status(error)
            return f"ended:{code}", details
        finally:
            await chan.close()

    async def _write(self, call: Any, request: Any) -> None:
        await call.write(request)
        self.bytes_sent += request.ByteSize()

    async def many_names(self, call: Any, until: float) -> str:
        names = [f"hostile-{uuid.uuid4().hex[:8]}-{i}" for i in range(5000)]
        await self._write(call, discovery_pb2.DeltaDiscoveryRequest(
            node={"id": "hostile-many"}, type_url=ENDPOINT, resource_names_subscribe=names))
        return (await _drain(call, until))[0]

    async def huge_name(self, call: Any, until: float) -> str:
        name = "huge-" + uuid.uuid4().hex * (100 * 1024 // 32)
        await self._write(call, discovery_pb2.DeltaDiscoveryRequest(
            node={"id": "hostile-huge"}, type_url=ENDPOINT, resource_names_subscribe=[name]))
        return (await _drain(call, until))[0]

    async def nack_flood(self, call: Any, until: float) -> str:
        await self._write(call, discovery_pb2.DeltaDiscoveryRequest(
            node={"id": "hostile-nack"}, type_url=ENDPOINT, resource_names_subscribe=["ep-0"]))
        try:
            first = await asyncio.wait_for(call.read(), until - time.monotonic())
        except TimeoutError:
            return "open:silent"
        if first is grpc.aio.EOF:
            return "ended:OK"
        for _ in range(NACKS):
            await self._write(call, discovery_pb2.DeltaDiscoveryRequest(
                type_url=ENDPOINT, response_nonce=first.nonce,
                error_detail={"code": 3, "message": self.nack}))
            await asyncio.sleep(0.05)
        outcome = (await _drain(call, until))[0]
        return "open:answered" if outcome == "open:silent" else outcome

    async def unknown_type(self, call: Any, until: float) -> str:
        type_url = f"type.googleapis.com/hostile.Unknown{uuid.uuid4().hex[:8]}"
        await self._write(call, discovery_pb2.DeltaDiscoveryRequest(
            node={"id": "hostile-type"}, type_url=type_url,
            resource_names_subscribe=["a", "b", "c"]))
        return (await _drain(call, until))[0]

    async def no_acks(self, call: Any, until: float) -> str:
        """Subscription changes every 50 ms, reading responses, never ACKing."""
        responses = 0

        async def read() -> str:
            nonlocal responses
            try:
                while (await call.read()) is not grpc.aio.EOF:
                    responses += 1
                return "ended:OK"
            except Exception as error:
                return f"ended:{_status(error)[0]}"

        reader = asyncio.create_task(read())
        first = True
        try:
            while time.monotonic() < until and not reader.done():
                name = f"ep-{random.randrange(self.endpoints_total)}"
                await self._write(call, discovery_pb2.DeltaDiscoveryRequest(
                    node={"id": "hostile-noack"} if first else None, type_url=ENDPOINT,
                    resource_names_subscribe=[name] if first or random.random() < 0.5 else [],
                    resource_names_unsubscribe=[] if first else [name]))
                first = False
                await asyncio.sleep(0.05)
        except Exception:
            pass
        if reader.done():
            return reader.result()
        reader.cancel()
        return "open:answered" if responses else "open:silent"

    async def hostile(self, number: int) -> None:
        attempt = number
        while True:
            kind = self.kinds[attempt % len(self.kinds)]
            outcome, details = await self.attempt(kind, attempt // len(self.kinds))
            self.outcomes[kind][outcome] += 1
            if details:
                self.details[kind].setdefault(outcome, details)
            attempt += 1
            await asyncio.sleep(1.0)

    async def stall(self, number: int) -> None:
        """Subscribe to every Cluster and every bulk name, never read; change a
        bulk subscription every 5 s."""
        # No BDP probing: the stream's window stays at 64 KB, well under what
        # it subscribes to, so the relay's writes to it stall.
        chan = grpc.aio.insecure_channel(self.target, options=[
            ("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0)])
        delta = number % 2 == 0
        call = _stream(chan, delta)(wait_for_ready=True)
        self.stalled.append((call, number))
        bulk = [f"bulk-{i}" for i in range(BULK)]
        node = {"id": f"soak-stalled-{number}"}
        if delta:
            await call.write(discovery_pb2.DeltaDiscoveryRequest(
                node=node, type_url=CLUSTER, resource_names_subscribe=cluster_names()))
            await call.write(discovery_pb2.DeltaDiscoveryRequest(
                type_url=ENDPOINT, resource_names_subscribe=bulk))
        else:
            await call.write(discovery_pb2.DiscoveryRequest(
                node=node, type_url=CLUSTER, resource_names=cluster_names()))
            await call.write(discovery_pb2.DiscoveryRequest(
                type_url=ENDPOINT, resource_names=bulk))
        held = True
        while not call.done():
            await asyncio.sleep(5.0)
            held = not held
            try:
                if delta:
                    change = {"resource_names_subscribe" if held
                              else "resource_names_unsubscribe": [bulk[-1]]}
                    request: Any = discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT,
                                                                       **change)
                else:
                    request = discovery_pb2.DiscoveryRequest(
                        type_url=ENDPOINT, resource_names=bulk if held else bulk[:-1])
                await asyncio.wait_for(call.write(request), 5.0)
                self.stalled_writes += 1
            except Exception as error:
                self.stalled_write_failures[_status(error)[0]] += 1

    async def report(self) -> dict[str, Any]:
        """Outcomes; and each stalled stream's state, then what it reads when it
        starts reading at last (what the relay had kept for it), for 3 s."""
        for task in self.stall_tasks:
            task.cancel()
        stalled = []
        for call, number in self.stalled:
            state, backlog, size = "open", 0, 0
            if call.done():
                state = f"ended:{(await call.code()).name}"
            else:
                until = time.monotonic() + 3.0
                with contextlib.suppress(Exception):
                    while (left := until - time.monotonic()) > 0:
                        response = await asyncio.wait_for(call.read(), left)
                        if response is grpc.aio.EOF:
                            state = "ended:OK"
                            break
                        backlog += 1
                        size += response.ByteSize()
            stalled.append({"stalled": number, "protocol": "delta" if number % 2 == 0
                            else "sotw", "state": state, "backlog_responses": backlog,
                            "backlog_bytes": size})
        return {"outcomes": {k: dict(v) for k, v in self.outcomes.items()},
                "details": self.details, "bytes_sent": self.bytes_sent,
                "stalled": stalled, "stalled_writes": self.stalled_writes,
                "stalled_write_failures": dict(self.stalled_write_failures)}


def hostile_main(conn: Connection, _share: int, target: str, hostile: int, stalled: int,
                 endpoints_total: int, kinds: Sequence[str]) -> None:
    asyncio.run(_hostile(conn, target, hostile, stalled, endpoints_total, kinds))


async def _hostile(conn: Connection, target: str, hostile: int, stalled: int,
                   endpoints_total: int, kinds: Sequence[str]) -> None:
    clients = Hostile(target, endpoints_total, kinds)
    clients.stall_tasks = [asyncio.create_task(clients.stall(i)) for i in range(stalled)]
    await asyncio.sleep(0.5)
    tasks = [*clients.stall_tasks,
             *(asyncio.create_task(clients.hostile(i)) for i in range(hostile))]
    conn.send("ready")

    async def command(command: Any) -> Any:
        if command == "report":
            return await clients.report()
        raise ValueError(f"unknown command {command!r}")

    try:
        await serve_commands(conn, command)
    finally:
        for task in tasks:
            task.cancel()
        for call, _ in clients.stalled:
            call.cancel()


# -- the harness: the relay's log, samples, metrics --------------------------------


_LOG_LINE = re.compile(rb"level=(\w+) logger=(\S+) msg=(.{0,48})")
_RECONNECT = re.compile(r"reconnecting to origin \S+ in ([0-9.]+)s")


class RelayLog:
    """Reads the relay's stderr in a thread: counts lines and bytes by kind of
    message (its first words, digits masked), keeps one sample of each, and
    when the upstream connection lines came."""

    KEEP = 300   # bytes of a line kept as a sample

    def __init__(self, stream: io.BufferedReader) -> None:
        self.stream = stream
        self.lines: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.longest: dict[str, int] = {}
        self.samples: dict[str, str] = {}
        self.upstream: list[tuple[float, str]] = []   # (monotonic, line)
        self.total_bytes = 0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _line(self, head: bytes, length: int) -> None:
        match = _LOG_LINE.search(head)
        if match is None:
            key = "(other) " + re.sub(r"\d+", "N", head[:40].decode(errors="replace"))
        else:
            level, logger, msg = (g.decode(errors="replace") for g in match.groups())
            words = re.sub(r"\d+", "N", " ".join(msg.split()[:4]))
            key = f"{level} {logger} {words}"
        self.lines[key] += 1
        self.bytes[key] += length
        self.longest[key] = max(self.longest.get(key, 0), length)
        self.samples.setdefault(key, head[:self.KEEP].decode(errors="replace"))
        text = head[:self.KEEP].decode(errors="replace")
        if "origin" in text and ("reconnecting" in text or "connected to" in text):
            self.upstream.append((time.monotonic(), text))

    def _read(self) -> None:
        head, length = b"", 0
        while chunk := self.stream.read1(1 << 16):
            self.total_bytes += len(chunk)
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                if len(head) < self.KEEP:
                    head += chunk[start:min(end, start + self.KEEP)]
                self._line(head, length + end - start + 1)
                head, length = b"", 0
                start = end + 1
            if len(head) < self.KEEP:
                head += chunk[start:start + self.KEEP]
            length += len(chunk) - start
        if length:
            self._line(head, length)

    def backoff_before(self, at: float) -> float | None:
        steps = [float(m.group(1)) for when, line in self.upstream
                 if when <= at and (m := _RECONNECT.search(line))]
        return steps[-1] if steps else None

    def connected_after(self, at: float) -> float | None:
        return next((when for when, line in self.upstream
                     if when >= at and "connected to origin" in line), None)

    def summary(self) -> dict[str, Any]:
        kinds = [{"kind": key, "lines": self.lines[key], "bytes": size,
                  "longest": self.longest[key], "sample": self.samples[key]}
                 for key, size in self.bytes.most_common()]
        return {"bytes": self.total_bytes, "lines": sum(self.lines.values()), "kinds": kinds}


_COUNTED = ("xds_relay_downstream_streams", "xds_relay_upstream_reconnects_total",
            "xds_relay_downstream_rejected_streams_total", "xds_relay_downstream_nacks_total",
            "xds_relay_downstream_pushes_total", "xds_relay_cache_resources",
            "xds_relay_cache_variants", "xds_relay_upstream_subscriptions")


def scrape(admin_port: int) -> dict[str, Any]:
    """The relay's push-latency histogram (summed over types: bound -> count)
    and a few counters, from /metrics."""
    url = f"http://127.0.0.1:{admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    buckets: dict[float, float] = defaultdict(float)
    values: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "xds_relay_push_latency_seconds_bucket":
                buckets[float(sample.labels["le"])] += sample.value
            elif sample.name in _COUNTED:
                values[sample.name] += sample.value
    return {"buckets": dict(buckets), **values}


def histogram_summary(before: dict[float, float], after: dict[float, float]
                      ) -> dict[str, Any]:
    """Pushes between two scrapes: count, and p99 and max as bucket upper bounds (s)."""
    bounds = sorted(after)
    cumulative = [after[b] - before.get(b, 0.0) for b in bounds]
    total = cumulative[-1] if cumulative else 0.0
    if total <= 0:
        return {"pushes": 0, "p99_le_s": None, "max_le_s": None}
    p99 = next(b for b, c in zip(bounds, cumulative, strict=True) if c >= 0.99 * total)
    top = next(b for b, c in zip(bounds, cumulative, strict=True) if c >= total)
    return {"pushes": int(total), "p99_le_s": p99, "max_le_s": top}


def percentiles(values: Sequence[float], scale: float = 1000.0) -> dict[str, Any]:
    """Count, p50, p99 and max of ``values`` (seconds), in ms by default."""
    if not values:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * scale, 2)

    return {"count": len(ordered), "p50": at(0.5), "p99": at(0.99),
            "max": round(ordered[-1] * scale, 2)}


def slope_kib_per_min(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, KiB) points, in KiB per minute."""
    if len(points) < 3:
        return None
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    den = sum((t - mean_t) ** 2 for t, _ in points)
    if den == 0:
        return None
    return round(60 * sum((t - mean_t) * (v - mean_v) for t, v in points) / den, 1)


@dataclass
class Run:
    """What the harness gathers while the phases go on."""

    pid: int
    admin_port: int
    started: float = field(default_factory=time.monotonic)
    phase: str = "start"
    phase_starts: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    scrapes: dict[str, dict[str, Any]] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    relay_exit: int | None = None

    def sample(self) -> None:
        pid = self.pid
        try:
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            self.samples.append({"t": round(time.monotonic() - self.started, 1),
                                 "phase": self.phase, "rss_kib": rss_kib(pid),
                                 "cpu_s": round(cpu_seconds(pid), 2), "fds": fds})
        except OSError:
            pass

    async def sampler(self, interval: float, metrics_interval: float) -> None:
        """Sample every ``interval`` s; add the relay's gauges (streams, cache
        names, upstream subscriptions) every ``metrics_interval`` s."""
        scraped = 0.0
        while True:
            self.sample()
            if self.samples and time.monotonic() - scraped >= metrics_interval:
                scraped = time.monotonic()
                with contextlib.suppress(OSError, ValueError):
                    gauges = scrape(self.admin_port)
                    self.samples[-1].update({short: gauges.get(name) for short, name in (
                        ("streams", "xds_relay_downstream_streams"),
                        ("cache_names", "xds_relay_cache_resources"),
                        ("upstream_subscriptions", "xds_relay_upstream_subscriptions"))})
            await asyncio.sleep(interval)

    def mark(self, phase: str) -> None:
        """A phase ends and ``phase`` starts: note when, CPU and metrics."""
        now = time.monotonic()
        self.cpu[phase] = cpu_seconds(self.pid)
        try:
            self.scrapes[phase] = scrape(self.admin_port)
        except OSError as error:
            self.scrapes[phase] = {"error": str(error), "buckets": {}}
        self.phase_starts[phase] = now
        self.phase = phase
        self.sample()


# -- the harness ------------------------------------------------------------------


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    late = int(args.clients * args.late)
    initial = args.clients - late
    state = initial_state(args.clients)
    endpoints_total = endpoint_count(args.clients)
    origin = await ScriptedOrigin().start()
    port = origin.port
    origin.set(*messages(state))
    origin_up = True

    async def tick() -> None:
        number = 0
        while True:
            await asyncio.sleep(1.0)
            if origin_up:
                number += 1
                origin.set(endpoints(PROBE_NAME, 1 + number % 50000),
                           version=f"sent@{time.monotonic():.6f}")

    origin.set(endpoints(PROBE_NAME, 1), version=f"sent@{time.monotonic():.6f}")
    ticker = asyncio.create_task(tick())
    read_end, write_end = os.pipe()
    log = RelayLog(os.fdopen(read_end, "rb"))
    relay_stderr = os.fdopen(write_end, "wb")
    result: dict[str, Any] = {}
    print(f"soak: {args.clients} clients ({late} during the outage), {args.hostile} hostile, "
          f"{args.stalled} stalled, churn {args.churn_rate}/s, outage {args.down:g}s",
          flush=True)
    try:
        async with relay_process("soak-relay", port, 0, log_level="info", stderr=relay_stderr,
                                 upstream_extra=args.upstream, src=args.relay_src) as relay:
            relay_stderr.close()
            run = Run(relay.process.pid, relay.admin_port)
            sampler = asyncio.create_task(run.sampler(args.sample_interval,
                                                      args.metrics_interval))
            t0 = time.monotonic()
            async with workers(probe_main, 1, 1, relay.target, args.clients, state) as probe, \
                    workers(worker_main, initial, args.workers, relay.target, endpoints_total,
                            numbered=True) as clients, \
                    workers(hostile_main, 1, 1, relay.target, args.hostile, args.stalled,
                            endpoints_total, args.hostile_kinds.split(",")) as hostile:
                pools = [probe, clients]
                connect_s = time.monotonic() - t0
                print(f"{initial} clients connected and synced in {connect_s:.1f}s", flush=True)

                async def everyone(command: Any) -> list[Any]:
                    for workers_ in pools:
                        workers_.send(command)
                    return [m for w in pools for m in await w.next_messages()]

                def alive() -> bool:
                    if relay.process.poll() is not None:
                        run.relay_exit = relay.process.returncode
                        return False
                    return True

                async def wait(seconds: float) -> None:
                    end = time.monotonic() + seconds
                    while time.monotonic() < end and alive():  # noqa: ASYNC110 (polls the relay)
                        await asyncio.sleep(min(1.0, end - time.monotonic()))

                try:
                    # warm-up
                    run.mark("warmup")
                    await everyone(("phase", "warmup"))
                    clients.send(("churn", args.churn_rate / args.workers))
                    await clients.next_messages()
                    await wait(args.warmup)
                    # the outage
                    origin_up = False
                    await origin.stop()
                    run.mark("down")
                    await everyone(("phase", "down"))
                    print(f"origin down for {args.down:g}s", flush=True)
                    shares = [list(range(initial + i, args.clients, args.workers))
                              for i in range(args.workers)]
                    for pipe, share in zip(clients.pipes, shares, strict=False):
                        pipe.send(("late", share, args.down / 2))
                    await clients.next_messages()
                    await wait(args.down)
                    # the origin's return, with changes
                    new_state, removed = changed_state(state)
                    origin.set(*[resource(t, n, g) for t, names in new_state.items()
                                 for n, g in names.items() if state[t].get(n) != g])
                    origin.remove(CLUSTER, *removed)
                    await everyone(("expect", new_state))
                    back = time.monotonic()
                    await origin.start(port)
                    origin_up = True
                    run.mark("return")
                    await everyone(("phase", "return"))
                    print("origin back with changes", flush=True)
                    converged: float | None = None
                    median: float | None = None
                    matched = total = 0
                    while time.monotonic() - back < args.converge_timeout and alive():
                        replies = await everyone("converged")
                        total = sum(r["clients"] for r in replies)
                        times = [t for r in replies for t in r["matched"]]
                        matched = len(times)
                        if matched == total:
                            converged = max(times) - back
                            median = statistics.median(times) - back
                            break
                        await asyncio.sleep(0.5)
                    print(f"converged: {matched}/{total} clients, "
                          f"{'-' if converged is None else f'{converged:.2f}s'}", flush=True)
                    # the tail, then quiet, then the final check
                    run.mark("tail")
                    await everyone(("phase", "tail"))
                    await wait(args.tail)
                    clients.send(("churn", 0.0))
                    await clients.next_messages()
                    run.mark("end")
                    await wait(5.0)
                    lost = [d for part in await everyone("final") for d in part]
                    reports = await everyone("report")
                    probe.send("probes")
                    probes = (await probe.next_messages())[0]
                    hostile.send("report")
                    hostile_report = (await hostile.next_messages())[0]
                    run.sample()
                    connected = log.connected_after(back)
                    result = {
                        "connect_s": round(connect_s, 1),
                        "convergence": {
                            "clients": total, "matched": matched,
                            "all_s": None if converged is None else round(converged, 2),
                            "median_client_s": None if median is None else round(median, 2),
                            "backoff_step_s": log.backoff_before(back),
                            "relay_connected_after_s": None if connected is None
                            else round(connected - back, 2),
                            "from_relay_connect_s": None if connected is None
                            or converged is None else round(back + converged - connected, 2),
                        },
                        "origin_back": back, "lost": lost, "reports": reports,
                        "probes": probes,
                        "hostile": hostile_report,
                    }
                finally:
                    alive()
                    for workers_ in (*pools, hostile):
                        with contextlib.suppress(Exception):
                            workers_.send(None)
            sampler.cancel()
            result["run"] = run
    finally:
        ticker.cancel()
        with contextlib.suppress(OSError):
            relay_stderr.close()
        await origin.stop()
    await asyncio.sleep(0.5)   # the relay's last lines
    result["log"] = log.summary()
    result["origin_requests"] = len(origin.all_requests())
    return result


# -- the report -------------------------------------------------------------------


def summarize(args: argparse.Namespace, raw: dict[str, Any]) -> dict[str, Any]:
    run: Run = raw["run"]
    reports = raw["reports"]
    counts: Counter[str] = Counter()
    churn: Counter[str] = Counter()
    churn_failed: Counter[str] = Counter()
    latency: dict[str, list[float]] = defaultdict(list)
    answered_later: Counter[str] = Counter()
    waiting: Counter[str] = Counter()
    disconnects: list[dict[str, Any]] = []
    for r in reports:
        counts.update(r["counts"])
        churn.update(r["churn_ops"])
        churn_failed.update(r["churn_failed"])
        answered_later.update(r["answered_later"])
        waiting.update(r["unanswered_over_5s"])
        disconnects += r["disconnects"]
        for phase, values in r["latency"].items():
            latency[phase] += values
    probes = raw["probes"]
    starts = run.phase_starts
    samples = run.samples
    down = [(s["t"], s["rss_kib"]) for s in samples if s["phase"] == "down"]
    half = down[len(down) // 2:]
    in_phase = {p: [s for s in samples if s["phase"] == p] for p in PHASES}
    warm = in_phase["warmup"]
    rss = {
        "after_warmup_mib": round((down[0][1] if down else samples[-1]["rss_kib"]) / 1024, 1),
        "start_mib": round(warm[0]["rss_kib"] / 1024, 1) if warm else None,
        "max_mib": round(max(s["rss_kib"] for s in samples) / 1024, 1),
        "end_of_outage_mib": round(down[-1][1] / 1024, 1) if down else None,
        "end_mib": round(samples[-1]["rss_kib"] / 1024, 1),
        "outage_slope_kib_per_min": slope_kib_per_min(down),
        "outage_second_half_slope_kib_per_min": slope_kib_per_min(half),
        "fds_start": warm[0]["fds"] if warm else None,
        "fds_max": max(s["fds"] for s in samples),
        "fds_end": samples[-1]["fds"],
    }
    order = [*PHASES, "end"]
    cpu = {}
    for a, b in itertools.pairwise(order):
        if a in run.cpu and b in run.cpu:
            wall = starts[b] - starts[a]
            cpu[a] = {"cpu_s": round(run.cpu[b] - run.cpu[a], 1),
                      "busy_pct": round(100 * (run.cpu[b] - run.cpu[a]) / max(wall, 1e-9), 1)}
    pushes = {}
    for a, b in itertools.pairwise(order):
        if a in run.scrapes and b in run.scrapes:
            pushes[a] = histogram_summary(run.scrapes[a].get("buckets", {}),
                                          run.scrapes[b].get("buckets", {}))
    round_trips = {p: percentiles([s for _, ph, s in probes["round_trips"] if ph == p])
                   for p in PHASES}
    # A tick sent before the relay reconnected reaches the probe when it does:
    # its latency is the outage's and the relay's backoff, not the relay's.
    back = raw["origin_back"]
    after = raw["convergence"]["relay_connected_after_s"]
    reconnected = back + (after or 0.0)
    fresh = [(at, ph, s) for at, ph, s in probes["updates"]
             if at < back or at - s >= reconnected]
    updates = {p: percentiles([s for _, ph, s in fresh if ph == p]) for p in PHASES}
    by_status = Counter(f"{d['status']}" for d in disconnects)
    by_phase = Counter(d["phase"] for d in disconnects)
    served = {p: {**percentiles(latency.get(p, [])),
                  "answered_in_a_later_phase": answered_later.get(p, 0),
                  "unanswered_over_5s_at_end": waiting.get(p, 0)} for p in PHASES}
    hostile = raw["hostile"]
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v)
                   for k, v in vars(args).items() if k != "out"},
        "well_behaved": {"clients": args.clients, "late": int(args.clients * args.late),
                         "streams_opened": counts["streams_opened"],
                         "clean_closes": counts["clean_closes"],
                         "requests": counts["requests"], "responses": counts["responses"],
                         "unsolicited_resources": counts["unsolicited_resources"],
                         "churn_ops": dict(churn), "churn_failed": dict(churn_failed)},
        "connect_s": raw["connect_s"],
        "disconnects": {"count": len(disconnects), "by_status": dict(by_status),
                        "by_phase": dict(by_phase), "first": disconnects[:20]},
        "resources_lost": {"clients": len(raw["lost"]), "first": raw["lost"][:20]},
        "convergence": raw["convergence"],
        "subscriptions_by_phase_ms": served,
        "rss": rss,
        "relay_cpu_by_phase": cpu,
        "relay_exit": run.relay_exit,
        "loop_lag_probe_round_trip_ms": round_trips,
        "probe_update_latency_ms": updates,
        "probe_errors": probes["errors"][:20],
        "probe_round_trip_timeouts": probes["round_trip_timeouts"],
        "push_latency_histogram": pushes,
        # at the start of each phase, and at the end
        "relay_metrics": {phase: {k: v for k, v in scraped.items() if k != "buckets"}
                          for phase, scraped in run.scrapes.items()},
        "hostile": hostile,
        "relay_log": raw["log"],
        "origin_requests": raw["origin_requests"],
        "rss_samples": samples,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def print_summary(s: dict[str, Any]) -> None:
    wb, conv, rss = s["well_behaved"], s["convergence"], s["rss"]
    rows: list[tuple[str, str]] = [
        ("well-behaved clients (late: during the outage)", f"{wb['clients']} ({wb['late']})"),
        ("streams opened / clean closes by clients", f"{wb['streams_opened']} / "
                                                     f"{wb['clean_closes']}"),
        ("requests / responses (well-behaved)", f"{wb['requests']} / {wb['responses']}"),
        ("churn operations", ", ".join(f"{k} {v}" for k, v in sorted(wb["churn_ops"].items()))),
        ("DISCONNECTS of well-behaved clients (must be 0)",
         f"{s['disconnects']['count']} {s['disconnects']['by_status'] or ''}".strip()),
        ("RESOURCES LOST: clients holding the wrong set at the end (must be 0)",
         str(s["resources_lost"]["clients"])),
        ("resources received for names not subscribed", str(wb["unsolicited_resources"])),
        ("convergence after the origin's return: all / median client (s)",
         f"{_ms(conv['all_s'])} / {_ms(conv['median_client_s'])} "
         f"({conv['matched']}/{conv['clients']} clients)"),
        ("  relay's backoff step then / its reconnect after / from it to all (s)",
         f"{_ms(conv['backoff_step_s'])} / {_ms(conv['relay_connected_after_s'])} / "
         f"{_ms(conv['from_relay_connect_s'])}"),
    ]
    down = s["subscriptions_by_phase_ms"]["down"]
    rows += [
        ("subscriptions during the outage: answered from cache p99 / max (ms)",
         f"{down['count']}: {_ms(down['p99'])} / {_ms(down['max'])}"),
        ("  answered only after the origin returned / still waiting at the end",
         f"{down['answered_in_a_later_phase']} / {down['unanswered_over_5s_at_end']}"),
        ("relay RSS (MiB): warm-up start, end of warm-up, max, end of outage, end",
         f"{_ms(rss['start_mib'])}, {_ms(rss['after_warmup_mib'])}, {rss['max_mib']}, "
         f"{_ms(rss['end_of_outage_mib'])}, {rss['end_mib']}"),
        ("relay RSS slope over the outage, all / 2nd half (KiB/min)",
         f"{_ms(rss['outage_slope_kib_per_min'])} / "
         f"{_ms(rss['outage_second_half_slope_kib_per_min'])}"),
        ("relay open fds: start, max, end", f"{rss['fds_start']}, {rss['fds_max']}, "
                                            f"{rss['fds_end']}"),
    ]
    for phase, c in s["relay_cpu_by_phase"].items():
        rows.append((f"relay CPU, {phase} (s, % of a core)", f"{c['cpu_s']}, {c['busy_pct']}%"))
    for phase, p in s["loop_lag_probe_round_trip_ms"].items():
        rows.append((f"loop lag probe: request->response, {phase}: p50 / p99 / max (ms)",
                     f"{_ms(p['p50'])} / {_ms(p['p99'])} / {_ms(p['max'])} (n={p['count']})"))
    for phase, p in s["probe_update_latency_ms"].items():
        if p["count"]:
            rows.append((f"probe update origin->client, {phase}: p50 / p99 / max (ms)",
                         f"{_ms(p['p50'])} / {_ms(p['p99'])} / {_ms(p['max'])} "
                         f"(n={p['count']})"))
    for phase, h in s["push_latency_histogram"].items():
        if h["pushes"]:
            rows.append((f"relay push latency histogram, {phase}: p99 / max bucket (s)",
                         f"<= {h['p99_le_s']} / <= {h['max_le_s']} ({h['pushes']} pushes)"))
    rows.append(("probe streams ended / round trips unanswered in 30 s",
                 f"{len(s['probe_errors'])} / {sum(s['probe_round_trip_timeouts'].values())}"))
    metrics = s["relay_metrics"]
    for key, label in (("xds_relay_cache_resources", "relay cache: names"),
                       ("xds_relay_upstream_subscriptions", "relay upstream subscriptions"),
                       ("xds_relay_downstream_streams", "relay downstream streams")):
        rows.append((f"{label} at warmup, down, return, tail, end",
                     ", ".join(_ms(metrics.get(p, {}).get(key)) for p in [*PHASES, "end"])))
    rows.append(("relay exit code (None: ran to the end)", str(s["relay_exit"])))
    log = s["relay_log"]
    rows.append(("relay log: lines / MiB", f"{log['lines']} / {log['bytes'] / 2**20:.1f}"))
    width = max(len(label) for label, _ in rows)
    print(f"\n| {'figure':<{width}} | value |\n| {'-' * width} | --- |")
    for label, value in rows:
        print(f"| {label:<{width}} | {value} |")
    hostile = s["hostile"]
    print("\nhostile outcomes by kind (open:*: the relay kept serving the stream):")
    for kind, outcomes in hostile["outcomes"].items():
        detail = "; ".join(f"{o}: {d}" for o, d in hostile["details"][kind].items())
        print(f"  {kind:<13} {dict(sorted(outcomes.items()))}" + (f"  [{detail}]" if detail
                                                                   else ""))
    print("stalled streams at the end (state, then responses and KiB read once they read):",
          ", ".join(f"{st['protocol']} {st['state']} {st['backlog_responses']} "
                    f"{st['backlog_bytes'] // 1024}" for st in hostile["stalled"]),
          f"(their requests {hostile['stalled_writes']}, failed "
          f"{hostile['stalled_write_failures'] or 0})")
    print("relay log, by message (lines, MiB, longest line):")
    for kind in log["kinds"][:8]:
        print(f"  {kind['lines']:>7} {kind['bytes'] / 2**20:>8.2f} {kind['longest']:>9}  "
              f"{kind['kind']}")
    if s["disconnects"]["first"]:
        print("first disconnects:", json.dumps(s["disconnects"]["first"][:5]))
    if s["resources_lost"]["first"]:
        print("first clients with the wrong set:", json.dumps(s["resources_lost"]["first"][:5]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000, help="well-behaved clients")
    parser.add_argument("--late", type=float, default=0.1,
                        help="fraction of the clients that connect during the outage")
    parser.add_argument("--down", type=float, default=600.0, help="seconds the origin is down")
    parser.add_argument("--hostile", type=int, default=5)
    parser.add_argument("--hostile-kinds", default=",".join(HOSTILE_KINDS),
                        help="what hostile clients do, in turn (comma-separated)")
    parser.add_argument("--stalled", type=int, default=3)
    parser.add_argument("--churn-rate", type=float, default=5.0,
                        help="churn operations per second, over all well-behaved clients")
    parser.add_argument("--workers", type=int, default=2, help="well-behaved client processes")
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--tail", type=float, default=30.0)
    parser.add_argument("--converge-timeout", type=float, default=180.0)
    parser.add_argument("--sample-interval", type=float, default=2.0,
                        help="seconds between samples of the relay's RSS")
    parser.add_argument("--metrics-interval", type=float, default=10.0,
                        help="seconds between scrapes of the relay's gauges into the samples")
    parser.add_argument("--upstream", default="",
                        help="extra keys for the relay's upstream section, YAML flow style")
    parser.add_argument("--relay-src", type=Path, default=None, metavar="DIR",
                        help="run another tree's relay (e.g. an export of an earlier commit)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/soak.json"))
    args = parser.parse_args()
    if args.relay_src is not None:
        args.relay_src = args.relay_src.resolve()
    unknown = set(args.hostile_kinds.split(",")) - set(HOSTILE_KINDS)
    if unknown:
        parser.error(f"unknown hostile kinds {sorted(unknown)}; they are {HOSTILE_KINDS}")
    summary = summarize(args, asyncio.run(soak(args)))
    print_summary(summary)
    write_results(args.out, "benchmarks.soak", **summary)


if __name__ == "__main__":
    main()
