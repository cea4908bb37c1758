"""Attack benchmark: what hostile clients cost a relay, and whether anyone else notices.

Each attack runs against fresh processes, so that memory figures compare:

* an origin: a relay process serving resource files (``upstream.files``,
  rescanned every 50 ms) from a temporary directory;
* the relay under test: ``python -m relay run`` following that origin
  (``upstream.address``), with admin and REST on 127.0.0.1 ports, logging
  at its default level to a file, and otherwise every default;
* a sentinel (a worker process): a delta client of one Cluster,
  ``sentinel``, whose file it rewrites every 1 to 1.5 s with a new sequence
  number (``alt_stat_name: sentinel-<n>``), timing each update from the file
  written to the sentinel's receipt of that number or a later one;
* the attacker (another worker process), told to start once everything is
  up and the relay has run 2 s.

Per attack, one row: the relay's RSS (``/proc/PID/status`` VmRSS, sampled
every 100 ms) just before the attack, its peak from the attack's start to
5 s after its end, and at that point ("after"); the latency of the sentinel's
updates written in that window (median and max) and how many never arrived
(still missing 3 s after the window closed); the bytes the relay logged in
that window; origin stream breaks (``xds_relay_upstream_reconnects_total``
from the relay's admin ``/metrics``, after less before: a client must never
cost the relay its origin stream); and what each attacker got, counted:
gRPC status codes, HTTP statuses, ``closed by server``, ``reset by server``,
``timeout`` (the server still held the attacker when the attack's time was
up).

The attacks (the issue's sizes at ``--scale 1.0``; the default, 0.3, keeps
a run on 2 shared cores under 5 minutes):

* ``rest-names``: 3 REST polls (no credentials) of 100,000 made-up
  ClusterLoadAssignment names each, at once; ``grpc-names``: 3 delta
  streams of 100,000 made-up names each, held 10 s. Never scaled: the point
  is 300,000 names against the origin's ``limits.names_per_stream``
  (200,000 by default).
* ``rapid-reset``: one HTTP/2 connection (the ``h2`` package) opening
  150,000 valid gRPC delta streams, each reset (RST_STREAM CANCEL) at once,
  as fast as it can for at most 15 s.
* ``many-streams-one-host``: 100 connections of 100 delta streams each (the
  ``bench`` ClusterLoadAssignment), held 10 s.
* ``admin-slowloris``: 1,000 connections to admin sending a request's
  headers one byte a second, for 15 s; ``rest-idle``: 1,000 idle TCP
  connections to REST, 15 s; ``rest-slow-bodies``: 30 REST POSTs declaring
  16 MiB - 1 byte bodies, each sending 16 MiB x scale of it over 15 s and
  never the last byte.
* ``log-reset-body``: REST POSTs reset (RST) mid-body, 4 at a time, for
  10 s (at most 100,000); ``log-tls-handshake``: with ``server.tls``, 3,000
  plain-text requests to the TLS xDS port, 20 at a time; ``log-many-hosts``:
  one bad REST poll (not JSON) from each of 2,000 source addresses
  127.0.x.y.

Every loop is bounded in count and time; everything stays on 127.0.0.0/8.
The relay runs from ``--relay-src`` (default: this checkout): its processes
start there, with it as ``PYTHONPATH``, so that a git worktree of another
commit is measured with this commit's clients. Only keys every version has
are set (addresses, ``upstream.files``/``poll_interval``, ``server.tls``).

Usage::

    .venv/bin/python -m benchmarks.attacks [--scale 0.3] [--only NAME]
        [--relay-src DIR] [--json PATH] [--markdown PATH] [--keep-logs DIR]

Prints a Markdown table (progress on stderr); ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.service.discovery.v3 import discovery_pb2

from benchmarks.processes import (
    DELTA_ADS,
    NAME,
    ClientTLS,
    channel,
    new_streams,
    subscription,
    wait_ready,
    workers,
)
from benchmarks.report import publish, revision, write_results
from benchmarks.rest import PATH, request_body
from relay.xds_types import CLUSTER, ENDPOINT
from tests.certs import Authority
from tests.ports import free_port

DEFAULT_SCALE = 0.3
#: the relay's steady state before an attack, and the window after one
SETTLE_S = 2.0
AFTER_S = 5.0
#: how long the sentinel waits for its last update once told to stop
SENTINEL_GRACE_S = 3.0
SAMPLE_S = 0.1
SENTINEL = "sentinel"
CONNECT_TIMEOUT_S = 5.0
#: no attack may run longer, whatever it was told
ATTACK_LIMIT_S = 120.0
#: the most names one request (REST or gRPC) carries: the relay's default
#: limits.names_per_request; three of them cross the origin's 200,000
NAMES = 100_000
MIB = 1024 * 1024


# -- resources ---------------------------------------------------------------------


def sentinel_yaml(seq: int) -> str:
    """The sentinel Cluster at update ``seq`` (its only change: ``alt_stat_name``)."""
    return f"""\
"@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
name: {SENTINEL}
alt_stat_name: {SENTINEL}-{seq}
connect_timeout: 1s
type: EDS
eds_cluster_config: {{eds_config: {{ads: {{}}, resource_api_version: V3}}}}
"""


BENCH_YAML = f"""\
"@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
cluster_name: {NAME}
endpoints:
- lb_endpoints:
  - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 8080}}}}}}
"""


def write_sentinel(directory: Path, seq: int) -> None:
    """Replace the sentinel's file at once (the file source never sees half of it)."""
    staged = directory / f".{SENTINEL}.tmp"  # not a suffix the file source reads
    staged.write_text(sentinel_yaml(seq))
    os.replace(staged, directory / f"{SENTINEL}.yaml")


# -- the relay processes -------------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """Where the attacker and the sentinel find the relay under test (picklable)."""

    xds_port: int
    admin_port: int
    rest_port: int
    tls: ClientTLS | None = None

    @property
    def xds(self) -> str:
        return f"127.0.0.1:{self.xds_port}"


@contextlib.contextmanager
def relay_run(config: str, name: str, directory: Path, src: Path
              ) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m relay run`` from ``src`` with ``config``, stdout and stderr to
    ``<directory>/<name>.log``; stopped on the way out (SIGINT, which stops at
    once, then SIGKILL after 10 s)."""
    config_file = directory / f"{name}.yaml"
    config_file.write_text(config)
    env = {**os.environ, "PYTHONPATH": str(src)}
    with (directory / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "relay", "run", "--config", str(config_file)],
            cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def rss_mib(pid: int) -> float | None:
    """A process's resident memory now (VmRSS), None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


@dataclass
class RssSampler:
    """VmRSS of one process every ``SAMPLE_S``, with when each was taken."""

    pid: int
    samples: list[tuple[float, float]] = field(default_factory=list)

    async def run(self) -> None:
        while (rss := rss_mib(self.pid)) is not None:
            self.samples.append((time.monotonic(), rss))
            await asyncio.sleep(SAMPLE_S)

    def latest(self) -> float | None:
        return self.samples[-1][1] if self.samples else None

    def peak_since(self, start: float) -> float | None:
        return max((rss for at, rss in self.samples if at >= start), default=None)


def _metrics_text(admin_port: int) -> str:
    url = f"http://127.0.0.1:{admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        return str(reply.read().decode())


async def upstream_reconnects(admin_port: int) -> float | None:
    """``xds_relay_upstream_reconnects_total`` from the relay's admin, None if
    it did not answer within 5 s."""
    from prometheus_client.parser import text_string_to_metric_families

    loop = asyncio.get_running_loop()
    try:
        text = await loop.run_in_executor(None, _metrics_text, admin_port)
    except OSError:
        return None
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == "xds_relay_upstream_reconnects_total")


# -- the sentinel ------------------------------------------------------------------------


def sentinel_main(pipe: Connection, _share: int, targets: Targets, directory: str,
                  seed: int) -> None:
    """The sentinel worker: says "ready" once served update 0, writes updates
    until told "stop", then answers its records (see :func:`_sentinel`)."""
    asyncio.run(_sentinel(pipe, targets, Path(directory), seed))


def _sentinel_seq(resource: discovery_pb2.Resource) -> int:
    cluster = cluster_pb2.Cluster.FromString(resource.resource.value)
    return int(cluster.alt_stat_name.rsplit("-", 1)[1])


async def _sentinel(pipe: Connection, targets: Targets, directory: Path, seed: int) -> None:
    """Answers ``{"updates": [[seq, written, delivered or None], ...], "stream": {...}}``:
    ``delivered`` is when the sentinel first held ``seq`` or a later update
    (a later one supersedes it), by ``time.monotonic()`` (one clock for every
    process on the machine)."""
    written: dict[int, float] = {}
    delivered: dict[int, float] = {}
    stream_events: Counter[str] = Counter()
    latest = -1
    served = asyncio.Event()
    stop = asyncio.Event()

    async def follow() -> None:
        nonlocal latest
        for _ in range(100):  # resubscriptions, should the relay end the stream
            chan = channel(targets.xds, targets.tls)
            call = chan.stream_stream(
                DELTA_ADS,
                request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
            try:
                await call.write(discovery_pb2.DeltaDiscoveryRequest(
                    node={"id": "sentinel"}, type_url=CLUSTER,
                    resource_names_subscribe=[SENTINEL]))
                while (response := await call.read()) is not grpc.aio.EOF:
                    now = time.monotonic()
                    for resource in response.resources:
                        if resource.name == SENTINEL and (seq := _sentinel_seq(resource)) > latest:
                            for earlier in range(latest + 1, seq + 1):
                                delivered[earlier] = now
                            latest = seq
                            served.set()
                    await call.write(discovery_pb2.DeltaDiscoveryRequest(
                        type_url=CLUSTER, response_nonce=response.nonce))
                stream_events["ended by the relay (OK)"] += 1
            except grpc.aio.AioRpcError as error:
                stream_events[f"ended by the relay ({error.code().name})"] += 1
            finally:
                await chan.close()
            if stop.is_set():
                return
            await asyncio.sleep(0.5)

    async def update() -> None:
        rng = random.Random(seed)
        for seq in range(1, 1000):  # at 1 to 1.5 s apart, over 16 minutes: never reached
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.uniform(1.0, 1.5))
            if stop.is_set():
                return
            write_sentinel(directory, seq)
            written[seq] = time.monotonic()

    following = asyncio.create_task(follow())
    try:
        await asyncio.wait_for(served.wait(), 30)
    except TimeoutError:
        pipe.send("the sentinel got no update 0 within 30 s")
        return
    pipe.send("ready")
    updating = asyncio.create_task(update())
    loop = asyncio.get_running_loop()
    with contextlib.suppress(EOFError):  # the harness died: stop all the same
        await loop.run_in_executor(None, pipe.recv)
    stop.set()
    await updating
    last = max(written, default=0)
    deadline = time.monotonic() + SENTINEL_GRACE_S
    while latest < last and (left := deadline - time.monotonic()) > 0:
        served.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(served.wait(), left)
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    pipe.send({"updates": [[seq, at, delivered.get(seq)] for seq, at in sorted(written.items())],
               "stream": dict(stream_events)})


# -- attack building blocks ----------------------------------------------------------------


@dataclass
class Outcome:
    """What an attack sent and what its attackers got (counted)."""

    sent: str
    statuses: Counter[str] = field(default_factory=Counter)


def _http_status(head: bytes) -> str | None:
    """``HTTP 400`` from a response's first bytes, None if they are not one."""
    if head.startswith(b"HTTP/1.") and len(head) >= 12:
        return f"HTTP {head[9:12].decode(errors='replace')}"
    return None


async def _until_closed(reader: asyncio.StreamReader, deadline: float) -> str:
    """How the server left a connection by ``deadline``: ``HTTP <status>`` if it
    answered one (``, closed`` if it then closed), ``closed by server``,
    ``reset by server``, or ``timeout`` (still open, nothing said)."""
    head = b""
    while True:
        try:
            data = await asyncio.wait_for(reader.read(65536), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return _http_status(head) or "timeout"
        except OSError:
            status = _http_status(head)
            return f"{status}, reset" if status else "reset by server"
        if not data:
            status = _http_status(head)
            return f"{status}, closed" if status else "closed by server"
        if len(head) < 64:
            head += data


Feed = Callable[[asyncio.StreamWriter, float], Coroutine[Any, Any, None]]


async def _connect(port: int, local: str | None = None
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | str:
    """A TCP connection to 127.0.0.1:``port`` (from ``local``), or why none."""
    try:
        return await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port,
                                    local_addr=(local, 0) if local else None),
            CONNECT_TIMEOUT_S)
    except TimeoutError:
        return "connect timeout"
    except OSError as error:
        return f"connect failed ({error.strerror or type(error).__name__})"


async def _hold(port: int, count: int, duration: float, feed: Feed) -> Counter[str]:
    """``count`` connections at once, each fed by ``feed`` until ``duration``
    is up; how the server left each (:func:`_until_closed`)."""
    deadline = time.monotonic() + duration
    connecting = asyncio.Semaphore(100)  # the listen backlog is about this

    async def one() -> str:
        async with connecting:
            connected = await _connect(port)
        if isinstance(connected, str):
            return connected
        reader, writer = connected
        feeding = asyncio.create_task(feed(writer, deadline))
        try:
            return await _until_closed(reader, deadline)
        finally:
            feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await feeding
            writer.transport.abort()

    return Counter(await asyncio.gather(*(one() for _ in range(count))))


async def _write(writer: asyncio.StreamWriter, data: bytes) -> bool:
    """Write and drain; False once the server has gone."""
    try:
        writer.write(data)
        await writer.drain()
    except OSError:
        return False
    return True


async def _pause_until(seconds: float, deadline: float) -> bool:
    """Sleep ``seconds`` unless ``deadline`` comes first; False if it came."""
    left = deadline - time.monotonic()
    await asyncio.sleep(max(0.0, min(seconds, left)))
    return seconds < left


async def _bounded_pool(count: int, concurrency: int, duration: float,
                        one: Callable[[int], Awaitable[str]]) -> Counter[str]:
    """``one(i)`` for i below ``count``, ``concurrency`` at a time, none
    started after ``duration``; what each returned, counted."""
    deadline = time.monotonic() + duration
    statuses: Counter[str] = Counter()
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < count and time.monotonic() < deadline:
            index, next_index = next_index, next_index + 1
            statuses[await one(index)] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses


def _code(error: grpc.aio.AioRpcError) -> str:
    return f"gRPC {error.code().name}"


# -- the attacks ------------------------------------------------------------------------------


async def rest_names(targets: Targets, scale: float) -> Outcome:
    """3 REST polls of ``NAMES`` made-up ClusterLoadAssignments at once; the
    attack lasts 10 s (the names stay subscribed for ``rest.lease``)."""
    import aiohttp

    start = time.monotonic()
    url = f"http://127.0.0.1:{targets.rest_port}{PATH}"

    async def poll(session: aiohttp.ClientSession, index: int) -> str:
        body = request_body([f"made-up-{index}-{k}" for k in range(NAMES)])
        try:
            async with session.post(url, data=body,
                                    headers={"Content-Type": "application/json"}) as reply:
                await reply.read()
                return f"HTTP {reply.status}"
        except TimeoutError:
            return "timeout"
        except aiohttp.ClientError as error:
            return f"failed ({type(error).__name__})"

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        statuses = Counter(await asyncio.gather(*(poll(session, i) for i in range(3))))
    await asyncio.sleep(max(0.0, start + 10 - time.monotonic()))
    return Outcome(f"3 POSTs x {NAMES:,} names", statuses)


async def grpc_names(targets: Targets, scale: float) -> Outcome:
    """3 delta streams (a connection each) of ``NAMES`` made-up names each, held 10 s."""
    channels, calls = new_streams(targets.xds, 3, tls=targets.tls)
    deadline = time.monotonic() + 10

    async def one(index: int, call: Any) -> str:
        answered = False
        try:
            await call.write(discovery_pb2.DeltaDiscoveryRequest(
                node={"id": f"names-{index}"}, type_url=ENDPOINT,
                resource_names_subscribe=[f"made-up-{index}-{k}" for k in range(NAMES)]))
            while True:
                left = deadline - time.monotonic()
                response = await asyncio.wait_for(call.read(), max(0.0, left))
                if response is grpc.aio.EOF:
                    return "closed by server (OK)"
                answered = True
        except TimeoutError:
            return "answered, held" if answered else "timeout"
        except grpc.aio.AioRpcError as error:
            return _code(error)

    try:
        statuses = Counter(await asyncio.gather(*(one(i, c) for i, c in enumerate(calls))))
    finally:
        for call in calls:
            call.cancel()
        for chan in channels:
            await chan.close()
    return Outcome(f"3 streams x {NAMES:,} names, 10 s", statuses)


async def rapid_reset(targets: Targets, scale: float) -> Outcome:
    """One connection: HEADERS of a valid gRPC delta stream then RST_STREAM,
    over and over, at most ``150,000 x scale`` times and 15 s."""
    import h2.config
    import h2.connection
    import h2.errors
    import h2.events
    import h2.exceptions

    count, duration = round(150_000 * scale), 15.0
    connected = await _connect(targets.xds_port)
    if isinstance(connected, str):
        return Outcome("no connection", Counter([connected]))
    reader, writer = connected
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    writer.write(conn.data_to_send())
    headers = [(":method", "POST"), (":scheme", "http"), (":path", DELTA_ADS),
               (":authority", targets.xds), ("content-type", "application/grpc"),
               ("te", "trailers")]
    statuses: Counter[str] = Counter()
    ended = asyncio.Event()

    async def read() -> None:
        try:
            while data := await reader.read(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        code = event.error_code
                        statuses[f"GOAWAY {getattr(code, 'name', code)}"] += 1
                        ended.set()
                    elif isinstance(event, h2.events.StreamReset):
                        statuses["RST_STREAM from server"] += 1
                writer.write(conn.data_to_send())
            statuses["closed by server"] += 1
        except OSError:
            statuses["reset by server"] += 1
        except h2.exceptions.ProtocolError as error:
            statuses[f"h2 error ({type(error).__name__})"] += 1
        ended.set()

    reading = asyncio.create_task(read())
    sent = 0
    start = time.monotonic()
    deadline = start + duration
    try:
        while sent < count and not ended.is_set() and time.monotonic() < deadline:
            for _ in range(min(100, count - sent)):
                stream_id = conn.get_next_available_stream_id()
                conn.send_headers(stream_id, headers)
                conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                sent += 1
            writer.write(conn.data_to_send())
            await asyncio.wait_for(writer.drain(), max(0.001, deadline - time.monotonic()))
    except TimeoutError:
        statuses["timeout (server stopped reading)"] += 1
    except (OSError, h2.exceptions.ProtocolError):
        pass  # the server ended the connection: the reader says how
    elapsed = time.monotonic() - start
    # what the server says about the last resets, if anything
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ended.wait(), 1)
    if not ended.is_set():
        statuses["timeout"] += 1
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading
    writer.transport.abort()
    return Outcome(f"{sent:,} resets in {elapsed:.1f} s", statuses)


async def many_streams_one_host(targets: Targets, scale: float) -> Outcome:
    """``100 x scale`` connections of 100 delta streams each, held 10 s
    once opened (opening bounded to 20 s)."""
    connections, per = max(1, round(100 * scale)), 100
    channels, calls = new_streams(targets.xds, connections * per, per, targets.tls)
    opened = asyncio.Event()
    answered = [False] * len(calls)
    ends: list[str | None] = [None] * len(calls)
    waiting = len(calls)

    async def one(index: int, call: Any) -> None:
        nonlocal waiting
        try:
            await call.write(subscription(index))
            while (response := await call.read()) is not grpc.aio.EOF:
                del response
                if not answered[index]:
                    answered[index] = True
                    waiting -= 1
                    if not waiting:
                        opened.set()
            ends[index] = "closed by server (OK)"
        except grpc.aio.AioRpcError as error:
            ends[index] = _code(error)
        if not answered[index]:
            waiting -= 1
            if not waiting:
                opened.set()

    tasks = [asyncio.create_task(one(i, c)) for i, c in enumerate(calls)]
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(opened.wait(), 20)
        await asyncio.sleep(10)
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for chan in channels:
            await chan.close()
    statuses = Counter(end or ("answered, held" if got else "timeout")
                       for end, got in zip(ends, answered, strict=True))
    return Outcome(f"{connections} conns x {per} streams, 10 s", statuses)


async def admin_slowloris(targets: Targets, scale: float) -> Outcome:
    """``1,000 x scale`` connections to admin, each sending a request's
    headers a byte a second (never ending them), for 15 s."""
    count, duration = round(1000 * scale), 15.0
    request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1000

    async def drip(writer: asyncio.StreamWriter, deadline: float) -> None:
        if not await _pause_until(random.random(), deadline):
            return
        for byte in request:
            if not await _write(writer, bytes([byte])) or not await _pause_until(1.0, deadline):
                return

    statuses = await _hold(targets.admin_port, count, duration, drip)
    return Outcome(f"{count} conns, 1 header byte/s, 15 s", statuses)


async def rest_idle(targets: Targets, scale: float) -> Outcome:
    """``1,000 x scale`` TCP connections to REST that never send a byte, 15 s."""
    count, duration = round(1000 * scale), 15.0

    async def nothing(writer: asyncio.StreamWriter, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))

    statuses = await _hold(targets.rest_port, count, duration, nothing)
    return Outcome(f"{count} idle conns, 15 s", statuses)


async def rest_slow_bodies(targets: Targets, scale: float) -> Outcome:
    """30 REST POSTs declaring a 16 MiB - 1 byte body, each sending
    ``16 MiB x scale`` of it (never all) evenly over 15 s, then waiting."""
    count, duration, tick = 30, 15.0, 0.25
    declared = 16 * MIB - 1
    total = min(declared - 1, round(declared * scale))
    ticks = int((duration - 1) / tick)
    chunk = b"a" * (total // ticks)
    headers = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n").encode()

    async def trickle(writer: asyncio.StreamWriter, deadline: float) -> None:
        if not await _write(writer, headers):
            return
        for _ in range(ticks):
            if not await _pause_until(tick, deadline) or not await _write(writer, chunk):
                return

    statuses = await _hold(targets.rest_port, count, duration, trickle)
    return Outcome(f"{count} bodies of {declared:,} B, {len(chunk) * ticks / MIB:.1f} MiB "
                   "each sent, 15 s", statuses)


async def log_reset_body(targets: Targets, scale: float) -> Outcome:
    """REST POSTs reset mid-body (half of a 1,000-byte body, then RST), 4 at a
    time for 10 s, at most ``100,000 x scale``."""
    count, duration = round(100_000 * scale), 10.0
    half = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n").encode() + b"{" * 500

    async def one(_index: int) -> str:
        connected = await _connect(targets.rest_port)
        if isinstance(connected, str):
            return connected
        _reader, writer = connected
        sent = await _write(writer, half)
        sock = writer.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # with SO_LINGER 0: an RST
        return "reset by attacker mid-body" if sent else "reset by server"

    statuses = await _bounded_pool(count, 4, duration, one)
    return Outcome(f"{sum(statuses.values()):,} POSTs reset mid-body, 10 s", statuses)


async def log_tls_handshake(targets: Targets, scale: float) -> Outcome:
    """``3,000 x scale`` plain-text HTTP requests to the TLS xDS port, 20 at a
    time (each waits up to 5 s for the server to close), within 30 s."""
    count = round(3000 * scale)
    garbage = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

    async def one(_index: int) -> str:
        connected = await _connect(targets.xds_port)
        if isinstance(connected, str):
            return connected
        reader, writer = connected
        try:
            if not await _write(writer, garbage):
                return "reset by server"
            return await _until_closed(reader, time.monotonic() + 5)
        finally:
            writer.transport.abort()

    statuses = await _bounded_pool(count, 20, 30, one)
    return Outcome(f"{sum(statuses.values()):,} plain-text requests to TLS", statuses)


async def log_many_hosts(targets: Targets, scale: float) -> Outcome:
    """One bad REST poll (a body that is not JSON) from each of ``2,000 x
    scale`` source addresses 127.0.x.y, 20 at a time, within 30 s."""
    count = round(2000 * scale)
    poll = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 8\r\nConnection: close\r\n\r\nnot json").encode()

    async def one(index: int) -> str:
        host = f"127.0.{1 + index // 250}.{1 + index % 250}"
        connected = await _connect(targets.rest_port, host)
        if isinstance(connected, str):
            return connected
        reader, writer = connected
        try:
            if not await _write(writer, poll):
                return "reset by server"
            return await _until_closed(reader, time.monotonic() + 5)
        finally:
            writer.transport.abort()

    statuses = await _bounded_pool(count, 20, 30, one)
    return Outcome(f"{count:,} bad polls, one per source address", statuses)


@dataclass(frozen=True)
class Attack:
    name: str
    run: Callable[[Targets, float], Awaitable[Outcome]]
    #: the relay serves TLS (xDS and REST) for this one
    tls: bool = False


ATTACKS = {attack.name: attack for attack in (
    Attack("rest-names", rest_names),
    Attack("grpc-names", grpc_names),
    Attack("rapid-reset", rapid_reset),
    Attack("many-streams-one-host", many_streams_one_host),
    Attack("admin-slowloris", admin_slowloris),
    Attack("rest-idle", rest_idle),
    Attack("rest-slow-bodies", rest_slow_bodies),
    Attack("log-reset-body", log_reset_body),
    Attack("log-tls-handshake", log_tls_handshake, tls=True),
    Attack("log-many-hosts", log_many_hosts),
)}


def attacker_main(pipe: Connection, _share: int, name: str, targets: Targets,
                  scale: float) -> None:
    """The attacker worker: "ready", then on "go" runs the attack and answers
    ``{"sent": ..., "statuses": {...}}``."""
    asyncio.run(_attacker(pipe, name, targets, scale))


async def _attacker(pipe: Connection, name: str, targets: Targets, scale: float) -> None:
    pipe.send("ready")
    await asyncio.get_running_loop().run_in_executor(None, pipe.recv)
    try:
        outcome = await asyncio.wait_for(ATTACKS[name].run(targets, scale), ATTACK_LIMIT_S)
    except TimeoutError:
        outcome = Outcome(f"stopped after {ATTACK_LIMIT_S:.0f} s", Counter(["attack overran"]))
    pipe.send({"sent": outcome.sent, "statuses": dict(outcome.statuses)})


# -- one measurement ---------------------------------------------------------------------------


def origin_config(directory: Path, xds_port: int, admin_port: int) -> str:
    return f"""
node: {{id: attacks-origin}}
server: {{address: "127.0.0.1:{xds_port}"}}
admin: {{address: "127.0.0.1:{admin_port}"}}
upstream: {{files: "{directory}", poll_interval: 0.05s}}
logging: {{level: warning}}
"""


def relay_config(origin_port: int, targets: Targets, tls_files: tuple[Path, Path] | None
                 ) -> str:
    tls = (f', tls: {{cert_file: "{tls_files[0]}", key_file: "{tls_files[1]}"}}'
           if tls_files else "")
    return f"""
node: {{id: attacks-relay}}
server: {{address: "127.0.0.1:{targets.xds_port}"{tls}}}
admin: {{address: "127.0.0.1:{targets.admin_port}"}}
rest: {{address: "127.0.0.1:{targets.rest_port}"}}
upstream: {{address: "127.0.0.1:{origin_port}"}}
"""


def _latencies(updates: Sequence[Sequence[Any]], start: float, end: float
               ) -> tuple[list[float], int]:
    """Latencies (ms) of the updates written in [start, end], and how many never came."""
    window = [(at, got) for _seq, at, got in updates if start <= at <= end]
    return [(got - at) * 1000 for at, got in window if got is not None], \
        sum(1 for _at, got in window if got is None)


async def measure(attack: Attack, scale: float, src: Path, seed: int,
                  keep_logs: Path | None = None) -> dict[str, Any]:
    """One attack against fresh processes: the figures of its row; the
    relay's and the origin's logs copied to ``keep_logs``, if given."""
    with tempfile.TemporaryDirectory(prefix=f"attack-{attack.name}-") as tmp:
        base = Path(tmp)
        resources = base / "resources"
        resources.mkdir()
        (resources / "bench.yaml").write_text(BENCH_YAML)
        write_sentinel(resources, 0)
        tls_files = None
        client_tls = None
        if attack.tls:
            authority = Authority(base)
            leaf = authority.relay_leaf()
            tls_files = (leaf.cert_file, leaf.key_file)
            client_tls = ClientTLS(authority.cert_pem)
        origin_port, origin_admin = free_port(), free_port()
        targets = Targets(free_port(), free_port(), free_port(), client_tls)
        try:
            with relay_run(origin_config(resources, origin_port, origin_admin), "origin",
                           base, src):
                await wait_ready(origin_admin)
                with relay_run(relay_config(origin_port, targets, tls_files), "relay", base,
                               src) as relay:
                    await wait_ready(targets.admin_port)
                    return await _measure(attack, scale, relay, targets, base, resources, seed)
        finally:
            if keep_logs is not None:
                copy_logs(base, keep_logs, attack.name)


def copy_logs(base: Path, keep_logs: Path, attack: str) -> None:
    keep_logs.mkdir(parents=True, exist_ok=True)
    for name in ("relay", "origin"):
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(base / f"{name}.log", keep_logs / f"{attack}-{name}.log")


async def _measure(attack: Attack, scale: float, relay: subprocess.Popen[bytes],
                   targets: Targets, base: Path, resources: Path, seed: int
                   ) -> dict[str, Any]:
    relay_log, origin_log = base / "relay.log", base / "origin.log"
    sampler = RssSampler(relay.pid)
    sampling = asyncio.create_task(sampler.run())
    try:
        async with workers(sentinel_main, 1, 1, targets, str(resources), seed) as sentinel:
            async with workers(attacker_main, 1, 1, attack.name, targets, scale) as attacker:
                await asyncio.sleep(SETTLE_S)
                rss_before = sampler.latest()
                reconnects_before = await upstream_reconnects(targets.admin_port)
                log_before = relay_log.stat().st_size
                origin_log_before = origin_log.stat().st_size
                start = time.monotonic()
                attacker.send("go")
                outcome = (await attacker.next_messages())[0]
                end = time.monotonic()
            await asyncio.sleep(max(0.0, end + AFTER_S - time.monotonic()))
            after_at = time.monotonic()
            rss_after = sampler.latest() if relay.poll() is None else None
            reconnects_after = await upstream_reconnects(targets.admin_port)
            log_bytes = relay_log.stat().st_size - log_before
            origin_log_bytes = origin_log.stat().st_size - origin_log_before
            sentinel.send("stop")
            record = (await sentinel.next_messages())[0]
    finally:
        sampling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampling
    latencies, missed = _latencies(record["updates"], start, after_at)
    breaks = (None if reconnects_before is None or reconnects_after is None
              else reconnects_after - reconnects_before)
    return {
        "attack": attack.name,
        "sent": outcome["sent"],
        "attack_s": round(end - start, 2),
        "rss_before_mib": rss_before,
        "rss_peak_mib": sampler.peak_since(start),
        "rss_after_mib": rss_after,
        "sentinel_updates": len(latencies) + missed,
        "sentinel_p50_ms": statistics.median(latencies) if latencies else None,
        "sentinel_max_ms": max(latencies) if latencies else None,
        "sentinel_missed": missed,
        "sentinel_stream": record["stream"],
        "log_bytes": log_bytes,
        "origin_log_bytes": origin_log_bytes,
        "origin_stream_breaks": breaks,
        "relay_exit_code": relay.poll(),
        "statuses": outcome["statuses"],
    }


# -- report ---------------------------------------------------------------------------------------


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _statuses(row: dict[str, Any]) -> str:
    got = ", ".join(f"{status}: {count:,}" for status, count in
                    sorted(row["statuses"].items(), key=lambda item: -item[1]))
    if row["relay_exit_code"] is not None:
        got += f"; relay exited ({row['relay_exit_code']})"
    if row["sentinel_stream"]:
        got += "; sentinel stream " + ", ".join(
            f"{event} x{count}" for event, count in row["sentinel_stream"].items())
    return got


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The table: one row per attack."""
    lines = ["| attack | sent | RSS before / peak / after (MiB) | sentinel p50 / max (ms) "
             "| missed / updates | log bytes | origin stream breaks | attacker got |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        breaks = row["origin_stream_breaks"]
        lines.append(
            f"| {row['attack']} | {row['sent']} "
            f"| {_mib(row['rss_before_mib'])} / {_mib(row['rss_peak_mib'])} / "
            f"{_mib(row['rss_after_mib'])} "
            f"| {_ms(row['sentinel_p50_ms'])} / {_ms(row['sentinel_max_ms'])} "
            f"| {row['sentinel_missed']} / {row['sentinel_updates']} | {row['log_bytes']:,} "
            f"| {'-' if breaks is None else f'{breaks:.0f}'} | {_statuses(row)} |")
    return "\n".join(lines)


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 10:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 10], got {text!r}")
    return value


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    names = [args.only] if args.only else list(ATTACKS)
    rows = []
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        row = await measure(ATTACKS[name], args.scale, args.relay_src, args.seed,
                            args.keep_logs)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.attacks",
        description="Hostile clients against a relay process, with a sentinel client.")
    parser.add_argument("--scale", type=_scale, default=DEFAULT_SCALE,
                        help=f"attack sizes as a fraction of the issue's (default "
                             f"{DEFAULT_SCALE}: under 5 minutes on 2 cores; 1.0: full size)")
    parser.add_argument("--only", choices=list(ATTACKS), help="run this attack alone")
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        metavar="DIR",
                        help="run the relay processes from this source tree (default: the "
                             "checkout holding this script)")
    parser.add_argument("--seed", type=int, default=1, help="the sentinel's update timing")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every figure here")
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="write the table here too")
    parser.add_argument("--keep-logs", type=Path, metavar="DIR",
                        help="copy each attack's relay and origin logs here "
                             "(<attack>-relay.log, <attack>-origin.log)")
    args = parser.parse_args(argv)
    args.relay_src = args.relay_src.resolve()
    started = time.monotonic()
    rows = asyncio.run(main_async(args))
    commit = revision(args.relay_src)
    default = " (the default; 1.0 is the issue's full size)" if args.scale == DEFAULT_SCALE else ""
    heading = (f"Attacks against the relay at {commit} ({args.relay_src}), scale "
               f"{args.scale}{default}, {os.cpu_count()} CPUs, "
               f"{time.monotonic() - started:.0f} s in all.")
    publish(f"{heading}\n\n{markdown(rows)}\n", args.markdown)
    if args.json:
        write_results(args.json, "benchmarks.attacks", relay_src=str(args.relay_src),
                      revision=commit, scale=args.scale, rows=rows)


if __name__ == "__main__":
    main()
