"""Memory benchmark: what big clients, refused requests and idle streams cost
a relay's RSS, and whether it comes back.

Each phase runs against fresh processes, as :mod:`benchmarks.attacks` does
(its origin and relay configs): an origin (a relay serving resource files,
one ClusterLoadAssignment ``bench``) and the relay under test following it,
every limit at its default. The client (a worker process) starts once the
relay has run 2 s. The relay's RSS (``/proc/PID/status`` VmRSS) is sampled
every 100 ms: *before* is the sample just before the client starts, *peak*
the largest from then until *after*, 5 s after the client has left.

* ``delta-names``: one delta stream subscribes to ``--names`` (100,000)
  made-up ClusterLoadAssignment names in one request (the origin has none of
  them), reads and ACKs until every name is answered (``removed_resources``)
  or no response has come for 10 s (the names never answered are counted);
  once the relay is quiet (under 20 % of a core for 0.25 s) and 1 s more
  (*held*), it leaves (cancels its stream, closes its channel). The relay's
  origin stays subscribed to the names for ``upstream.linger`` (30 s) after,
  for a client that comes back: *after linger* is 5 s after that, and
  *lingering* 1 s before it ends (memory given back, what lingers still
  held), with the time the RSS was first back within 10 % of *before*: on a
  loaded machine a relay takes more than 5 s to let go of such a client.
* ``sotw-names``: the same over SotW, the last name ``bench`` (SotW says
  nothing of names that do not exist); answered once no response has come
  for 1 s after the first.
* ``refused-nodes``: ``--refused`` (10) delta streams at once, each a
  connection of its own, each sending one request whose Node carries
  ``--node-mib`` (8) MiB of metadata: refused for ``limits.node_size``.
* ``idle-streams``: ``--idle-streams`` (1,000) delta streams, 10 per
  connection, each subscribed to ``bench``; *held* 2 s after all are
  answered, and the cost per stream is *held* less *before*.

Targets (issue 23): a 100,000-name client costs at most 60 MiB at its peak,
the RSS is back within 10 % of *before* 5 s after it leaves, and refused
requests leave at most 10 MiB.

``--breakdown`` runs the relay under tracemalloc (:mod:`benchmarks.traced_relay`)
and, for the names phases and refused Nodes, prints what Python objects
are held by the line that allocated them, per name (or request), at
*held*, *after* and *after linger*. Its RSS figures are not a plain run's
(tracemalloc's own tables and snapshots take room, and the relay runs
several times slower): compare its Python objects with a plain run's RSS
per name to see what is native (gRPC, protobuf, the allocators' free lists).

The relay runs from ``--relay-src`` (default: this checkout), with this
checkout's clients, so that a git worktree of another commit is measured the
same way. It allocates as ``xds-relay run`` does (glibc's malloc, see
:func:`relay.memory.exec_with_allocator`); ``PYTHONMALLOC=pymalloc`` in this
command's environment measures CPython's own allocator instead (and a tree
from before that choice runs with CPython's). ``--json`` has, per names
phase, the RSS every 0.5 s from 1 s before the client left (``since_left``:
seconds, MiB), to see when memory comes back.

Usage::

    .venv/bin/python -m benchmarks.memory [--only PHASE] [--relay-src DIR]
        [--names 100000] [--refused 10] [--node-mib 8] [--idle-streams 1000]
        [--breakdown] [--json PATH] [--markdown PATH] [--keep-logs DIR]

Prints Markdown tables (progress on stderr); ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from benchmarks.attacks import (
    BENCH_YAML,
    RssSampler,
    Targets,
    copy_logs,
    origin_config,
    relay_config,
    relay_run,
)
from benchmarks.processes import (
    DELTA_ADS,
    channel,
    cpu_seconds,
    demand_seconds,
    open_streams,
    wait_for_worker,
    wait_ready,
    workers,
)
from benchmarks.report import publish, revision, write_results
from relay.xds_types import ENDPOINT
from tests.ports import free_port

SOTW_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
SETTLE_S = 2.0
HOLD_S = 1.0
AFTER_S = 5.0
#: the relay's upstream.linger (its default): the origin stays subscribed to
#: what a client let go this long, for a client that comes back
LINGER_S = 30.0
#: a SotW client is answered once no response came for this long
SOTW_QUIET_S = 1.0
#: no client may wait longer for its first response, and for each later one
ANSWER_TIMEOUT_S = 60.0
STALLED_S = 10.0
#: the relay is done with a client once it runs (or waits to run) less than
#: this share of a core over QUIET_INTERVAL_S, or after QUIET_TIMEOUT_S
QUIET_SHARE = 0.2
QUIET_INTERVAL_S = 0.25
QUIET_TIMEOUT_S = 60.0
IDLE_PER_CHANNEL = 10
IDLE_WORKERS = 2
MIB = 1024 * 1024

#: Issue 23's targets
PEAK_TARGET_MIB = 60.0
BACK_WITHIN = 0.10
REFUSED_TARGET_MIB = 10.0


# -- the relay under test -------------------------------------------------------------


@dataclass
class RelayUnderTest:
    process: subprocess.Popen[bytes]
    directory: Path
    traced: bool

    async def snapshot(self, label: str) -> dict[str, Any] | None:
        """Under ``--breakdown``, the traced relay's report at this moment
        (:mod:`benchmarks.traced_relay`); None otherwise."""
        if not self.traced:
            return None
        assert self.process.stdin is not None
        path = self.directory / f"snapshot-{label}.json"
        self.process.stdin.write(f"{label} {path}\n".encode())
        self.process.stdin.flush()
        for _ in range(1200):  # a snapshot of a large heap takes a while
            if path.exists():
                result: dict[str, Any] = json.loads(path.read_text())
                return result
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the traced relay wrote no snapshot {label!r} within 120 s")


@contextlib.contextmanager
def relay_under_test(config: str, directory: Path, src: Path, traced: bool
                     ) -> Iterator[RelayUnderTest]:
    """The relay under test from ``src`` (as :func:`benchmarks.attacks.relay_run`),
    under tracemalloc with ``traced``."""
    config_file = directory / "relay.yaml"
    config_file.write_text(config)
    env = {**os.environ, "PYTHONPATH": str(src)}
    script = [str(Path(__file__).with_name("traced_relay.py"))] if traced else ["-m", "relay"]
    with (directory / "relay.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, *script, "run", "--config", str(config_file)], cwd=src, env=env,
            stdin=subprocess.PIPE if traced else subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT)
    try:
        yield RelayUnderTest(process, directory, traced)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- clients (worker processes) --------------------------------------------------------


def names_main(pipe: Connection, _share: int, targets: Targets, protocol: str,
               count: int) -> None:
    """One client of ``count`` made-up names: "ready"; on "go" subscribes and
    answers ``{"answered": ..., "responses": ..., "seconds": ...}`` once
    answered (or ``{"error": ...}``); on "leave" leaves and answers "left"."""
    asyncio.run(_names_client(pipe, targets, protocol, count))


async def _names_client(pipe: Connection, targets: Targets, protocol: str, count: int) -> None:
    loop = asyncio.get_running_loop()
    pipe.send("ready")
    await loop.run_in_executor(None, pipe.recv)
    names = [f"made-up-{k}" for k in range(count)]
    chan = channel(targets.xds)
    responses = answered = 0
    reading: asyncio.Future[Any] | None = None
    start = time.monotonic()
    try:
        if protocol == "delta":
            call = chan.stream_stream(
                DELTA_ADS,
                request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
            await call.write(discovery_pb2.DeltaDiscoveryRequest(
                node={"id": "memory-delta"}, type_url=ENDPOINT, resource_names_subscribe=names))
            while answered < count:
                # Not wait_for: a read cancelled cancels the whole call.
                reading = asyncio.ensure_future(call.read())
                await asyncio.wait([reading], timeout=STALLED_S if responses else ANSWER_TIMEOUT_S)
                if not reading.done():
                    if responses:
                        break  # the rest never comes: said in the table
                    raise TimeoutError(f"no response within {ANSWER_TIMEOUT_S:.0f} s")
                response = reading.result()
                if response is grpc.aio.EOF:
                    raise RuntimeError("the relay ended the stream")
                responses += 1
                answered += len(response.removed_resources) + len(response.resources)
                await call.write(discovery_pb2.DeltaDiscoveryRequest(
                    type_url=ENDPOINT, response_nonce=response.nonce))
        else:
            call = chan.stream_stream(
                SOTW_ADS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DiscoveryResponse.FromString)()
            # ``bench``, which exists, for the last: SotW says nothing of names that do not
            names[-1] = "bench"
            await call.write(discovery_pb2.DiscoveryRequest(
                node={"id": "memory-sotw"}, type_url=ENDPOINT, resource_names=names))
            timeout = ANSWER_TIMEOUT_S
            while True:
                reading = asyncio.ensure_future(call.read())
                await asyncio.wait([reading], timeout=timeout)
                if not reading.done():
                    if responses:
                        break
                    raise TimeoutError(f"no response within {ANSWER_TIMEOUT_S:.0f} s")
                response = reading.result()
                if response is grpc.aio.EOF:
                    raise RuntimeError("the relay ended the stream")
                responses += 1
                answered = len(response.resources)
                timeout = SOTW_QUIET_S
                await call.write(discovery_pb2.DiscoveryRequest(
                    type_url=ENDPOINT, version_info=response.version_info,
                    response_nonce=response.nonce, resource_names=names))
    except (grpc.aio.AioRpcError, RuntimeError, TimeoutError) as error:
        pipe.send({"error": f"{type(error).__name__} {error} after {answered:,} answered in "
                            f"{responses} responses"})
    else:
        pipe.send({"answered": answered, "responses": responses,
                   "seconds": round(time.monotonic() - start, 2),
                   "unanswered": count - answered if protocol == "delta" else 0})
    await loop.run_in_executor(None, pipe.recv)
    call.cancel()
    if reading is not None:
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await reading
    await chan.close()
    pipe.send("left")


def refused_main(pipe: Connection, _share: int, targets: Targets, count: int,
                 node_mib: float) -> None:
    """"ready"; on "go", ``count`` streams at once, each sending a Node of
    ``node_mib`` MiB; answers each one's status, counted."""
    asyncio.run(_refused_clients(pipe, targets, count, node_mib))


async def _refused_clients(pipe: Connection, targets: Targets, count: int,
                           node_mib: float) -> None:
    loop = asyncio.get_running_loop()
    metadata = struct_pb2.Struct()
    metadata["blob"] = "x" * int(node_mib * MIB)
    pipe.send("ready")
    await loop.run_in_executor(None, pipe.recv)

    async def one(index: int) -> str:
        chan = channel(targets.xds)
        call = chan.stream_stream(
            DELTA_ADS, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
        request = discovery_pb2.DeltaDiscoveryRequest(
            type_url=ENDPOINT, resource_names_subscribe=["bench"])
        request.node.id = f"big-node-{index}"
        request.node.metadata.CopyFrom(metadata)
        try:
            await call.write(request)
            response = await asyncio.wait_for(call.read(), 30)
            return "answered" if response is not grpc.aio.EOF else "closed (OK)"
        except grpc.aio.AioRpcError as error:
            return f"{error.code().name}: {error.details()}"
        except TimeoutError:
            return "timeout"
        finally:
            await chan.close()

    statuses = Counter(await asyncio.gather(*(one(i) for i in range(count))))
    pipe.send(dict(statuses))
    await loop.run_in_executor(None, pipe.recv)


def idle_main(pipe: Connection, share: int, targets: Targets) -> None:
    """``share`` streams subscribed to ``bench``, "ready" once each has its
    first response; on "leave" closes them and answers "left"."""
    asyncio.run(_idle_clients(pipe, share, targets))


async def _idle_clients(pipe: Connection, share: int, targets: Targets) -> None:
    loop = asyncio.get_running_loop()
    channels, calls = await open_streams(targets.xds, share, IDLE_PER_CHANNEL)
    for call in calls:
        await asyncio.wait_for(call.read(), 60)
    pipe.send("ready")
    await loop.run_in_executor(None, pipe.recv)
    for call in calls:
        call.cancel()
    for chan in channels:
        await chan.close()
    pipe.send("left")


# -- the phases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    names: int
    refused: int
    node_mib: float
    idle_streams: int


Phase = Callable[[RelayUnderTest, RssSampler, Targets, Settings], Awaitable[dict[str, Any]]]


def _after(sampler: RssSampler, relay: RelayUnderTest) -> float | None:
    return sampler.latest() if relay.process.poll() is None else None


async def quiet(pid: int) -> None:
    """Until the relay is quiet (see ``QUIET_SHARE``): done with what a client
    asked, the origin's answers included."""
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    while time.monotonic() < deadline:
        used = demand_seconds(pid)
        await asyncio.sleep(QUIET_INTERVAL_S)
        if demand_seconds(pid) - used < QUIET_SHARE * QUIET_INTERVAL_S:
            return


async def _names_phase(protocol: str, relay: RelayUnderTest, sampler: RssSampler,
                       targets: Targets, settings: Settings) -> dict[str, Any]:
    async with workers(names_main, 1, 1, targets, protocol, settings.names) as client:
        await asyncio.sleep(SETTLE_S)
        before = sampler.latest()
        base = await relay.snapshot("before")
        start = time.monotonic()
        client.send("go")
        outcome = (await client.next_messages())[0]
        await quiet(relay.process.pid)
        await asyncio.sleep(HOLD_S)
        held = sampler.latest()
        at_held = await relay.snapshot("held")
        client.send("leave")
        await client.next_messages()
        left = time.monotonic()
    await asyncio.sleep(max(0.0, left + AFTER_S - time.monotonic()))
    after = _after(sampler, relay)
    at_after = await relay.snapshot("after")
    await asyncio.sleep(max(0.0, left + LINGER_S - 1.0 - time.monotonic()))
    lingering = _after(sampler, relay)
    await asyncio.sleep(max(0.0, left + LINGER_S + AFTER_S - time.monotonic()))
    after_linger = _after(sampler, relay)
    at_after_linger = await relay.snapshot("after-linger")
    return {"sent": f"1 {protocol} stream x {settings.names:,} names",
            "rss_before_mib": before, "rss_peak_mib": sampler.peak_since(start),
            "rss_held_mib": held, "rss_after_mib": after,
            "rss_after_linger_mib": after_linger, "client": outcome,
            "rss_lingering_mib": lingering,
            "back_within_s": back_within(sampler, left, before),
            "since_left": timeline(sampler, left),
            "units": settings.names, "unit": "name",
            "breakdown": None if base is None else {"base": base, "held": at_held,
                                                    "after": at_after,
                                                    "after-linger": at_after_linger}}


def back_within(sampler: RssSampler, left: float, before: float | None) -> float | None:
    """Seconds from the client leaving until the RSS was first back within
    ``BACK_WITHIN`` of ``before`` (None: not before the linger ended). On a
    loaded machine the relay takes longer to let go of a client, and this
    tells that from memory that does not come back."""
    if before is None:
        return None
    return next((round(at - left, 1) for at, rss in sampler.samples
                 if left <= at < left + LINGER_S and rss <= before * (1 + BACK_WITHIN)), None)


def timeline(sampler: RssSampler, left: float, step: float = 0.5) -> list[tuple[float, float]]:
    """The RSS (MiB) from 1 s before the client left, every ``step`` seconds:
    (seconds since it left, RSS)."""
    found: list[tuple[float, float]] = []
    for at, rss in sampler.samples:
        since = at - left
        if since >= -1.0 and (not found or since >= found[-1][0] + step):
            found.append((round(since, 1), round(rss, 1)))
    return found


async def delta_names(relay: RelayUnderTest, sampler: RssSampler, targets: Targets,
                      settings: Settings) -> dict[str, Any]:
    return await _names_phase("delta", relay, sampler, targets, settings)


async def sotw_names(relay: RelayUnderTest, sampler: RssSampler, targets: Targets,
                     settings: Settings) -> dict[str, Any]:
    return await _names_phase("sotw", relay, sampler, targets, settings)


async def refused_nodes(relay: RelayUnderTest, sampler: RssSampler, targets: Targets,
                        settings: Settings) -> dict[str, Any]:
    async with workers(refused_main, 1, 1, targets, settings.refused,
                       settings.node_mib) as client:
        await asyncio.sleep(SETTLE_S)
        before = sampler.latest()
        base = await relay.snapshot("before")
        start = time.monotonic()
        client.send("go")
        outcome = (await client.next_messages())[0]
        done = time.monotonic()
        client.send("exit")
    await asyncio.sleep(max(0.0, done + AFTER_S - time.monotonic()))
    after = _after(sampler, relay)
    at_after = await relay.snapshot("after")
    return {"sent": f"{settings.refused} streams x {settings.node_mib:g} MiB Node",
            "rss_before_mib": before, "rss_peak_mib": sampler.peak_since(start),
            "rss_held_mib": None, "rss_after_mib": after, "client": outcome,
            "units": settings.refused, "unit": "request",
            "breakdown": None if base is None else {"base": base, "after": at_after}}


async def idle_streams(relay: RelayUnderTest, sampler: RssSampler, targets: Targets,
                       settings: Settings) -> dict[str, Any]:
    await asyncio.sleep(SETTLE_S)
    before = sampler.latest()
    start = time.monotonic()
    count = settings.idle_streams
    async with workers(idle_main, count, IDLE_WORKERS, targets) as clients:
        await asyncio.sleep(SETTLE_S)
        held = sampler.latest()
        clients.send("leave")
        for pipe, proc in zip(clients.pipes, clients.processes, strict=True):
            await wait_for_worker(pipe, proc)
        left = time.monotonic()
    await asyncio.sleep(max(0.0, left + AFTER_S - time.monotonic()))
    return {"sent": f"{count:,} idle delta streams, {IDLE_PER_CHANNEL} per connection",
            "rss_before_mib": before, "rss_peak_mib": sampler.peak_since(start),
            "rss_held_mib": held, "rss_after_mib": _after(sampler, relay), "client": "held",
            "units": count, "unit": "stream", "breakdown": None}


PHASES: dict[str, Phase] = {
    "delta-names": delta_names,
    "sotw-names": sotw_names,
    "refused-nodes": refused_nodes,
    "idle-streams": idle_streams,
}


async def measure(name: str, settings: Settings, src: Path, traced: bool,
                  keep_logs: Path | None = None) -> dict[str, Any]:
    """One phase against fresh processes: its row; the relay's and the
    origin's logs copied to ``keep_logs``, if given."""
    with tempfile.TemporaryDirectory(prefix=f"memory-{name}-") as tmp:
        base = Path(tmp)
        try:
            return await _measure(name, settings, src, traced, base)
        finally:
            if keep_logs is not None:
                copy_logs(base, keep_logs, name)


async def _measure(name: str, settings: Settings, src: Path, traced: bool, base: Path
                   ) -> dict[str, Any]:
    resources = base / "resources"
    resources.mkdir()
    (resources / "bench.yaml").write_text(BENCH_YAML)
    origin_port, origin_admin = free_port(), free_port()
    targets = Targets(free_port(), free_port(), free_port())
    with relay_run(origin_config(resources, origin_port, origin_admin), "origin", base,
                   src):
        await wait_ready(origin_admin)
        with relay_under_test(relay_config(origin_port, targets, None), base, src,
                              traced) as relay:
            await wait_ready(targets.admin_port)
            sampler = RssSampler(relay.process.pid)
            sampling = asyncio.create_task(sampler.run())
            cpu_before = cpu_seconds(relay.process.pid)
            try:
                row = await PHASES[name](relay, sampler, targets, settings)
                row["relay_cpu_s"] = round(cpu_seconds(relay.process.pid) - cpu_before, 2)
            finally:
                sampling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampling
            row["relay_exit_code"] = relay.process.poll()
            return {"phase": name, **row, **_figures(row)}


def _figures(row: dict[str, Any]) -> dict[str, Any]:
    """Costs from the samples: at the peak, held (per unit) and left behind."""
    before, peak = row["rss_before_mib"], row["rss_peak_mib"]
    held, after = row["rss_held_mib"], row["rss_after_mib"]
    out: dict[str, Any] = {"peak_cost_mib": None, "per_unit_bytes": None,
                           "left_mib": None, "left_share": None}
    if before is None:
        return out
    if peak is not None:
        out["peak_cost_mib"] = peak - before
    if held is not None:
        out["per_unit_bytes"] = (held - before) * MIB / row["units"]
    if after is not None:
        out["left_mib"] = after - before
        out["left_share"] = (after - before) / before
    return out


# -- report ----------------------------------------------------------------------------------


def _n(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _target(row: dict[str, Any]) -> str:
    """Whether the row meets issue 23's targets (``-`` where it sets none)."""
    if row["phase"] in ("delta-names", "sotw-names"):
        if row["peak_cost_mib"] is None or row["left_share"] is None:
            return "no"
        ok = row["peak_cost_mib"] <= PEAK_TARGET_MIB and row["left_share"] <= BACK_WITHIN
        return "yes" if ok else "no"
    if row["phase"] == "refused-nodes":
        ok = row["left_mib"] is not None and row["left_mib"] <= REFUSED_TARGET_MIB
        return "yes" if ok else "no"
    return "-"


def _client(row: dict[str, Any]) -> str:
    got = row["client"]
    if isinstance(got, dict) and "answered" in got:
        text = f"{got['answered']:,} answered in {got['responses']} responses, {got['seconds']} s"
        if got.get("unanswered"):
            text += f"; {got['unanswered']:,} never answered ({STALLED_S:.0f} s without a response)"
        return text
    if isinstance(got, dict):
        return ", ".join(f"{k}: {v}" for k, v in got.items())
    return str(got)


def _lingering(row: dict[str, Any]) -> str:
    """Left 1 s before the linger ends (memory given back, what lingers still
    there), and when the RSS was first back within BACK_WITHIN."""
    before, lingering = row["rss_before_mib"], row.get("rss_lingering_mib")
    if before is None or lingering is None:
        return "-"
    back = row.get("back_within_s")
    return (f"{lingering - before:.1f} ({(lingering - before) / before:+.0%}); "
            f"{'never' if back is None else f'{back} s'}")


def _left_after_linger(row: dict[str, Any]) -> str:
    before, after = row["rss_before_mib"], row.get("rss_after_linger_mib")
    if before is None or after is None:
        return "-"
    return f"{after - before:.1f} ({(after - before) / before:+.0%})"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| phase | sent | RSS before / peak / held / after (MiB) | peak cost (MiB) "
             "| held per unit | left after 5 s (MiB, %) | left while lingering (MiB, %); "
             "back within 10 % after | left after linger + 5 s (MiB, %) "
             "| relay CPU (s) | target met | client got |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: | --- |"]
    for row in rows:
        share = row["left_share"]
        per_unit = row["per_unit_bytes"]
        unit = "-" if per_unit is None else f"{per_unit:,.0f} B/{row['unit']}"
        lines.append(
            f"| {row['phase']} | {row['sent']} "
            f"| {_n(row['rss_before_mib'])} / {_n(row['rss_peak_mib'])} / "
            f"{_n(row['rss_held_mib'])} / {_n(row['rss_after_mib'])} "
            f"| {_n(row['peak_cost_mib'], 1)} "
            f"| {unit} "
            f"| {_n(row['left_mib'], 1)} ({'-' if share is None else f'{share:+.0%}'}) "
            f"| {_lingering(row)} | {_left_after_linger(row)} "
            f"| {_n(row.get('relay_cpu_s'), 1)} | {_target(row)} "
            f"| {_client(row)} |")
    return "\n".join(lines)


def breakdown(row: dict[str, Any], lines: int = 25) -> str:
    """The Python objects a phase's client left held, by file and by line,
    per name or request (tracemalloc)."""
    found = row.get("breakdown")
    if not found:
        return ""
    units, unit = row["units"], row["unit"]
    out = [f"### {row['phase']}: Python objects (tracemalloc) per {unit}"]
    for label in ("held", "after", "after-linger"):
        snap = found.get(label)
        if snap is None:
            continue
        traced = snap["traced_diff"]
        out += ["", f"At *{label}*: +{traced / MIB:.1f} MiB of Python objects "
                f"({traced / units:,.0f} B/{unit}).", "",
                f"| file | B/{unit} |", "| --- | ---: |"]
        out += [f"| {where} | {size / units:,.1f} |"
                for where, size in list(snap["by_file"].items())[:12] if abs(size) >= units]
        out += ["", f"| line | B/{unit} | blocks/{unit} |", "| --- | ---: | ---: |"]
        out += [f"| {entry['where']} | {entry['bytes'] / units:,.1f} "
                f"| {entry['blocks'] / units:.2f} |"
                for entry in snap["by_line"][:lines] if abs(entry["bytes"]) >= units]
    return "\n".join(out)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    settings = Settings(args.names, args.refused, args.node_mib, args.idle_streams)
    rows = []
    for name in [args.only] if args.only else list(PHASES):
        print(f"{name} ...", file=sys.stderr, flush=True)
        row = await measure(name, settings, args.relay_src, args.breakdown, args.keep_logs)
        shown = {k: v for k, v in row.items() if k != "breakdown"}
        print(json.dumps(shown), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.memory",
        description="A relay process's RSS around big clients, refused requests, idle streams.")
    parser.add_argument("--only", choices=list(PHASES), help="run this phase alone")
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        metavar="DIR",
                        help="run the relay processes from this source tree (default: the "
                             "checkout holding this script)")
    parser.add_argument("--names", type=int, default=100_000,
                        help="names of the big client (default 100,000)")
    parser.add_argument("--refused", type=int, default=10,
                        help="streams sending an oversized Node (default 10)")
    parser.add_argument("--node-mib", type=float, default=8.0,
                        help="the oversized Node's size in MiB (default 8)")
    parser.add_argument("--idle-streams", type=int, default=1000,
                        help="idle streams, 10 per connection (default 1,000)")
    parser.add_argument("--breakdown", action="store_true",
                        help="run the relay under tracemalloc and show where the names' "
                             "Python memory goes (slower; RSS figures not comparable)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every figure here")
    parser.add_argument("--keep-logs", type=Path, metavar="DIR",
                        help="copy each phase's relay and origin logs here "
                             "(<phase>-relay.log, <phase>-origin.log)")
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="write the tables here too")
    args = parser.parse_args(argv)
    args.relay_src = args.relay_src.resolve()
    started = time.monotonic()
    rows = asyncio.run(main_async(args))
    commit = revision(args.relay_src)
    traced = " under tracemalloc (--breakdown)" if args.breakdown else ""
    heading = (f"Memory of the relay at {commit} ({args.relay_src}){traced}, "
               f"{os.cpu_count()} CPUs, {time.monotonic() - started:.0f} s in all.")
    parts = [heading, markdown(rows), *filter(None, (breakdown(row) for row in rows))]
    publish("\n\n".join(parts) + "\n", args.markdown)
    if args.json:
        write_results(args.json, "benchmarks.memory", relay_src=str(args.relay_src),
                      revision=commit, breakdown=args.breakdown, rows=rows)


if __name__ == "__main__":
    main()
