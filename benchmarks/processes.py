"""What the benchmarks share: a relay in its own process, client workers in
theirs, and the streams those workers open.

Clients run in worker processes so that the relay's figures are its own; a
worker talks to the harness over a pipe (``"ready"`` once its streams are
open and answered, then whatever the benchmark measures).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import IO, Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import ENDPOINT
from tests.certs import RELAY_NAME
from tests.ports import free_port

DELTA_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
# the one ClusterLoadAssignment every benchmark stream subscribes to
NAME = "bench"


def _schedstat(pid: int) -> tuple[int, int]:
    """Nanoseconds the threads of a process have run, and have waited to run
    (runnable, no CPU free), so far."""
    ran = waited = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            fields = (task / "schedstat").read_text().split()
            ran += int(fields[0])
            waited += int(fields[1])
    return ran, waited


def cpu_seconds(pid: int) -> float:
    """CPU time the threads of a process have run so far, to the nanosecond
    (``/proc/PID/stat`` counts 10 ms ticks, too coarse for a bare client)."""
    return _schedstat(pid)[0] / 1e9


def main_thread_cpu_seconds(pid: int) -> float:
    """CPU time the main thread of a process has run so far: in a ``grpc.aio``
    server, Python's event loop; gRPC's own threads (``event_engine``) do the
    I/O, HTTP/2 and TLS, and have the rest of :func:`cpu_seconds`."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def demand_seconds(pid: int) -> float:
    """CPU time so far plus time spent waiting for a CPU: on a busy machine a
    process that wants to run but cannot still counts as busy."""
    return sum(_schedstat(pid)) / 1e9


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class ServerProcess:
    """A benchmark's server in a process of its own (the bare server, the
    forwarder), listening on ``port``."""

    process: asyncio.subprocess.Process
    port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.asynccontextmanager
async def listening_process(module: str, args: Sequence[str], ready_within: float,
                            env: Mapping[str, str] | None = None
                            ) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """``python -m module args`` (``env``: more of its environment) and its
    port, once it has said on stdout that it listens (``port N``, within
    ``ready_within`` seconds); ended on the way out (end of stdin, then
    SIGKILL after 10 s)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, **env} if env else None)
    assert process.stdin is not None and process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), ready_within)).decode()
        if not line.startswith("port "):
            raise RuntimeError(f"{module} said {line!r}, expected its port")
        yield process, int(line.split()[1])
    finally:
        if process.returncode is None:
            process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


@dataclass
class RelayProcess:
    process: subprocess.Popen[bytes]
    xds_port: int
    admin_port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.xds_port}"


# Every benchmark's clients connect from 127.0.0.1, where a zone's come from
# many hosts and arrive over time: the per-host limits and the admission of
# new streams are lifted, so that one host stands for many and a storm
# measures the relay, not its pacing (benchmarks.fleet measures that).
ONE_HOST_LIMITS = ("limits: {streams_per_host: 1000000, connections_per_host: 1000000, "
                   "new_streams_per_second: 1000000, new_streams_burst: 1000000}")


@contextlib.asynccontextmanager
async def relay_process(node_id: str, origin_port: int, drain_period: float, *,
                        upstream_extra: str = "", server_extra: str = "",
                        sections: str = "", log_level: str = "warning",
                        stderr: IO[bytes] | None = None, run_args: Sequence[str] = (),
                        src: Path | None = None, env: Mapping[str, str] | None = None
                        ) -> AsyncIterator[RelayProcess]:
    """``xds-relay run`` following the origin on ``origin_port``, once ready.

    ``upstream_extra`` adds keys to the ``upstream`` section (YAML flow
    style, e.g. ``"backoff: {max: 5s}"``), ``server_extra`` to the
    ``server`` section (e.g. ``"tls: {cert_file: ..., key_file: ...}"``);
    ``sections`` are more top-level lines (e.g. ``"limits: {name_length: 100}"``;
    without a ``limits`` section, :data:`ONE_HOST_LIMITS`);
    ``run_args`` are more arguments to ``run`` (e.g. ``["--workers", "4"]``);
    the relay logs at ``log_level`` to ``stderr`` (the harness's own by
    default). With ``src``, the relay is another tree's (a git worktree of
    another commit: it starts there, with ``src`` as ``PYTHONPATH``); ``env``
    adds to its environment (e.g. ``{"PYTHONMALLOC": "pymalloc"}``: ``xds-relay
    run`` chooses glibc's malloc only where none is named). Stopped on the
    way out (SIGTERM, then SIGKILL after 10 s) if still running.
    """
    xds_port, admin_port = free_port(), free_port()
    extra = f", {upstream_extra}" if upstream_extra else ""
    server = f", {server_extra}" if server_extra else ""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
        config.write(f"""
node: {{id: {node_id}}}
server: {{address: "127.0.0.1:{xds_port}", drain_period: {drain_period}s{server}}}
admin: {{address: "127.0.0.1:{admin_port}"}}
upstream: {{address: "127.0.0.1:{origin_port}"{extra}}}
logging: {{level: {log_level}}}
{sections}
{"" if "limits:" in sections else ONE_HOST_LIMITS}
""")
    environ = {**os.environ, **(env or {}), **({"PYTHONPATH": str(src)} if src else {})}
    process = subprocess.Popen(  # noqa: ASYNC220 (started once, before measuring)
        [sys.executable, "-m", "relay", "run", "--config", config.name, *run_args],
        stderr=stderr, cwd=src, env=environ)
    try:
        await wait_ready(admin_port, process)
        yield RelayProcess(process, xds_port, admin_port)
    finally:
        stop_process(process)
        os.unlink(config.name)


async def wait_ready(admin_port: int, process: subprocess.Popen[bytes] | None = None,
                     timeout: float = 60.0) -> None:
    """Until the relay's ``/ready`` says 200, within ``timeout`` seconds (a
    relay starting on a busy 2-core machine has taken over 10 s to import);
    fails at once if ``process`` has exited."""
    url = f"http://127.0.0.1:{admin_port}/ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"relay exited with code {process.returncode} before ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:  # noqa: ASYNC210 (polling)
                if reply.status == 200:
                    return
        except OSError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"relay did not become ready within {timeout:g} s")


@dataclass
class Workers:
    processes: list[BaseProcess]
    pipes: list[Connection]

    async def next_messages(self) -> list[Any]:
        """Each worker's next message, in order."""
        return [await wait_for_worker(pipe, proc)
                for pipe, proc in zip(self.pipes, self.processes, strict=True)]

    def send(self, message: Any) -> None:
        for pipe in self.pipes:
            pipe.send(message)


@contextlib.asynccontextmanager
async def workers(target: Callable[..., None], streams: int, count: int,
                  *args: Any, numbered: bool = False, each: Sequence[Any] = ()
                  ) -> AsyncIterator[Workers]:
    """``count`` processes running ``target(pipe, share, *args)``, the streams
    shared out between them; entered once every one has said ``"ready"``.
    With ``numbered``, each is called ``target(pipe, first, share, *args)``,
    ``first`` being the number of its first stream among all; with ``each``,
    worker ``i`` gets ``each[i]`` as one more argument. Killed on the way out
    if they have not exited within 10 s."""
    ctx = mp.get_context("spawn")
    running = Workers([], [])
    first = 0
    try:
        for i in range(count):
            share = streams // count + (1 if i < streams % count else 0)
            if share == 0:
                continue
            ours, theirs = ctx.Pipe()
            head = (theirs, first, share) if numbered else (theirs, share)
            first += share
            own = (each[i],) if each else ()
            proc = ctx.Process(target=target, args=(*head, *args, *own))
            proc.start()
            running.processes.append(proc)
            running.pipes.append(ours)
        for message in await running.next_messages():
            if message != "ready":
                raise RuntimeError(f"client worker said {message!r}, expected 'ready'")
        yield running
    finally:
        for started in running.processes:
            started.join(10)
            if started.is_alive():
                started.kill()


async def wait_for_worker(pipe: Connection, proc: BaseProcess) -> Any:
    """A worker's next message; fails (rather than hangs) if the worker died."""
    loop = asyncio.get_running_loop()
    while not await loop.run_in_executor(None, pipe.poll, 1.0):
        if not proc.is_alive():
            raise RuntimeError(f"client worker exited with code {proc.exitcode}")
    return pipe.recv()


@dataclass(frozen=True)
class ClientTLS:
    """How a client reaches a relay over TLS: the CA it trusts and, for mutual
    TLS, its certificate and key (PEM; picklable, for client workers)."""

    ca_pem: bytes
    cert_pem: bytes | None = None
    key_pem: bytes | None = None


def channel(target: str, tls: ClientTLS | None = None) -> grpc.aio.Channel:
    """A channel of its own to ``target``: its own connection (a local subchannel
    pool, so that channels never share one), over TLS with ``tls``.

    Over TLS each connection makes a full handshake: gRPC resumes TLS sessions
    only for a channel given a cache (``grpc.ssl_session_cache``), and none is."""
    options: list[tuple[str, Any]] = [("grpc.use_local_subchannel_pool", 1)]
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    credentials = grpc.ssl_channel_credentials(tls.ca_pem, tls.key_pem, tls.cert_pem)
    return grpc.aio.secure_channel(
        target, credentials, options=[*options, ("grpc.ssl_target_name_override", RELAY_NAME)])


def new_streams(target: str, count: int, per_channel: int = 1, tls: ClientTLS | None = None
                ) -> tuple[list[grpc.aio.Channel], list[Any]]:
    """``count`` delta streams to ``target`` (``per_channel`` on each
    connection, over TLS with ``tls``), not yet started: the first write
    starts each."""
    channels = [channel(target, tls) for _ in range((count + per_channel - 1) // per_channel)]
    calls = [channels[i // per_channel].stream_stream(
        DELTA_ADS, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
        response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
        for i in range(count)]
    return channels, calls


def subscription(index: int) -> discovery_pb2.DeltaDiscoveryRequest:
    """The first request of stream ``index`` of this process: ``NAME``, delta."""
    return discovery_pb2.DeltaDiscoveryRequest(
        node={"id": f"bench-{os.getpid()}-{index}"}, type_url=ENDPOINT,
        resource_names_subscribe=[NAME])


async def open_streams(target: str, count: int, per_channel: int = 1,
                       tls: ClientTLS | None = None
                       ) -> tuple[list[grpc.aio.Channel], list[Any]]:
    """``count`` delta streams to the relay (``per_channel`` on each connection,
    over TLS with ``tls``), each subscribed to the ClusterLoadAssignment
    ``NAME``, one after the other."""
    channels, calls = new_streams(target, count, per_channel, tls)
    for i, call in enumerate(calls):
        await call.write(subscription(i))
    return channels, calls


async def receive_version(call: Any, version: str | None) -> float:
    """When the stream's next response (with ``version``, if given) arrived,
    by ``time.monotonic()``; every response on the way is ACKed."""
    while True:
        response = await call.read()
        arrived = time.monotonic()
        await call.write(discovery_pb2.DeltaDiscoveryRequest(
            type_url=ENDPOINT, response_nonce=response.nonce))
        if version is None or any(r.version == version for r in response.resources):
            return arrived
