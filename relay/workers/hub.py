"""The hub of ``--workers``: the process that follows the origin, feeds the workers,
restarts them, drains them and serves admin.

The hub is a relay (:class:`relay.app.Relay`) that serves xDS only on a unix
socket in a private directory, to its workers; each worker is a relay whose
origin is that socket (:mod:`relay.workers.worker`). The workers' port is
bound once here first, without listening, so that port 0 becomes a real
port, a port in use is an error before anything starts, and a restarted
worker can always bind it again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from relay.admin import READ_METHODS, AdminServer, Reply
from relay.app import build_relay, signal_queue
from relay.cache import ResourceCache
from relay.clock import within
from relay.config import Address, RelayConfig
from relay.console.data import snapshot_views
from relay.console.source import ConsoleSource, WorkersSource, hub_reading
from relay.runtime import tune_gc
from relay.upstream.backoff import Backoff
from relay.workers.link import Link
from relay.workers.metrics import merge_metrics
from relay.workers.worker import WorkerSpec, worker_config, worker_main

__all__ = ["Hub", "HubAdmin", "WorkerProcess", "reserve_port", "run_hub"]

log = logging.getLogger("relay.workers")

#: Waits before restarting a worker that exited: jittered, doubling from the first to the last.
RESTART_BACKOFF = (0.5, 30.0)
#: A worker that ran this long was working: its slot's backoff starts over.
STABLE_AFTER = 60.0
#: How long a worker has to answer the admin server's question.
ASK_TIMEOUT = 2.0
#: How long workers have to exit after their drain period (or at once, after
#: SIGINT) before they are killed.
EXIT_GRACE = 10.0


def reserve_port(address: Address) -> socket.socket:
    """A socket bound to ``address`` with SO_REUSEPORT, not listening.

    It holds the workers' port for as long as the hub runs (port 0 becomes a
    free port), and accepts nothing: the kernel hands connections only to
    the listening sockets in the group, the workers'. Raises ``OSError``
    naming the address when it cannot be bound.
    """
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as error:
        raise OSError(f"cannot listen on {address}: {error}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(sockaddr)
    except OSError as error:
        sock.close()
        raise OSError(f"cannot listen on {address}: {error.strerror or error}") from None
    return sock


def _how_it_ended(code: int | None) -> str:
    if code is None:
        return "could not be started"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class WorkerProcess:
    """One worker slot (``index`` 1..N): the process now in it, and what it said.

    A restarted worker takes its predecessor's slot, index and node id.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.pid: int | None = None
        self.ready = False
        self.restarts = 0
        # what /ready says of it while it is not ready
        self.status = "not started"
        # the exit code of the process now in the slot, once it has exited
        self.exited: asyncio.Future[int | None] | None = None
        self._link: Link | None = None
        self._reader: asyncio.Task[None] | None = None
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._asked = 0

    @property
    def running(self) -> bool:
        return self.exited is not None and not self.exited.done()

    async def start(self, spec: WorkerSpec) -> None:
        """Start a process in the slot (the previous one has exited)."""
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked gRPC
        ours, theirs = context.Pipe()
        process = context.Process(target=worker_main, args=(spec, theirs), daemon=True,
                                  name=f"xds-relay-worker-{self.index}")
        process.start()
        theirs.close()  # the worker's end is the worker's: its exit ends the link
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[int | None] = loop.create_future()

        def on_exit() -> None:
            loop.remove_reader(process.sentinel)
            process.join()
            exited.set_result(process.exitcode)
            process.close()
            self.ready = False

        loop.add_reader(process.sentinel, on_exit)
        self.pid, self.exited = process.pid, exited
        self.ready, self.status = False, "starting"
        self._link = await Link.open(ours)
        self._reader = asyncio.create_task(self._read(self._link))

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the process, if it still runs."""
        if self.running and self.pid is not None:
            os.kill(self.pid, signum)

    async def ask(self, question: str, details: Mapping[str, Any] | None = None) -> Any:
        """The worker's answer to ``question`` ("clients", "metrics", the
        console's, with its ``details``); None if it is not ready or does not
        answer within ``ASK_TIMEOUT``."""
        link = self._link
        if link is None or not self.ready:
            return None
        self._asked += 1
        ask_id = self._asked
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._replies[ask_id] = reply
        link.send({"ask": question, "id": ask_id, "details": dict(details or {})})
        try:
            return await within(reply, ASK_TIMEOUT)
        except TimeoutError:
            return None
        finally:
            self._replies.pop(ask_id, None)

    async def _read(self, link: Link) -> None:
        while (message := await link.receive()) is not None:
            if "ready" in message:
                self.ready, self.status = True, "ready"
                log.info("worker %d (pid %s) ready", self.index, self.pid)
            elif "reply" in message:
                reply = self._replies.get(message["reply"])
                if reply is not None and not reply.done():
                    reply.set_result(message.get("data"))
        self.ready = False
        link.close()

    def close(self) -> None:
        """Forget the exited process's link."""
        if self._reader is not None:
            self._reader.cancel()
        if self._link is not None:
            self._link.close()
        self._link = self._reader = None


class HubAdmin(AdminServer):
    """The admin server of a relay run with ``--workers``.

    ``/ready`` and ``/config_dump`` are the hub's (its readiness counts the
    workers'); ``/clients`` and ``/metrics`` are gathered from the workers
    when asked (see :meth:`Hub.clients`, :func:`merge_metrics`).
    """

    def __init__(self, cache: ResourceCache, not_ready_reason: Callable[[], str | None],
                 clients: Callable[[], Awaitable[dict[str, Any]]],
                 metrics: Callable[[], Awaitable[bytes]],
                 ready_detail: Callable[[], str] | None = None,
                 console: ConsoleSource | None = None,
                 origins: Callable[[], list[dict[str, Any]]] | None = None,
                 config: RelayConfig | None = None) -> None:
        super().__init__(cache, None, not_ready_reason, ready_detail=ready_detail,
                         console=console, origins=origins, config=config)
        self._gather_clients = clients
        self._gather_metrics = metrics

    async def respond(self, method: str, target: str) -> Reply:
        path = urlsplit(target).path
        if method in READ_METHODS and path == "/clients":
            body = json.dumps(await self._gather_clients(), indent=2).encode() + b"\n"
            return Reply(200, body, "application/json")
        if method in READ_METHODS and path == "/metrics":
            return Reply(200, await self._gather_metrics(), CONTENT_TYPE_LATEST)
        return self.route(method, target)


class Hub:
    """The first process of ``xds-relay run --workers N`` (N > 1)."""

    def __init__(self, config: RelayConfig, log_level: str) -> None:
        self.config = config
        self.log_level = log_level
        # Private (0700): only this user's processes can reach the socket.
        self._dir = Path(tempfile.mkdtemp(prefix="xds-relay-"))
        self.socket = f"unix:{self._dir / 'hub.sock'}"
        # xds_relay_ready says what the hub's /ready says
        self.relay = build_relay(config, listen=self.socket, admin=False,
                                 readiness=self.not_ready_reason)
        self.relay.metrics.worker_restarts.add(0)  # a series from the start, for increase()
        self.workers = [WorkerProcess(i) for i in range(1, config.server.workers + 1)]
        # the console's clients and history: the workers', merged (relay.console)
        console = WorkersSource(self.ask_workers, lambda: hub_reading(self.relay.metrics),
                                lambda: snapshot_views(self.relay.snapshot_writers,
                                                       self.relay.restored_of))
        self.admin = HubAdmin(self.relay.cache, self.not_ready_reason, self.clients,
                              self.metrics, self.relay.ready_detail, console,
                              origins=self.relay.origin_statuses, config=config)
        self.draining = False
        self.port = 0  # where the workers serve clients
        self.admin_port = 0
        self._reserved: socket.socket | None = None
        self.rest_port: int | None = None  # where the workers serve REST polling, if they do
        self._rest_reserved: socket.socket | None = None
        self._supervisors: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Hold the port, start following the origin, serve admin, start the workers."""
        self._reserved = reserve_port(self.config.server.address)
        self.port = int(self._reserved.getsockname()[1])
        rest = self.config.rest.address
        if rest is not None:
            self._rest_reserved = reserve_port(rest)
            self.rest_port = int(self._rest_reserved.getsockname()[1])
        await self.relay.start()
        admin = self.config.admin.address
        self.admin_port = await self.admin.start(self.config.admin)
        self._supervisors = [asyncio.create_task(self._supervise(worker), name="worker")
                             for worker in self.workers]
        log.info("serving xDS on %s:%d with %d workers, admin on %s:%d",
                 self.config.server.address.host, self.port, len(self.workers), admin.host,
                 self.admin_port)
        if rest is not None:
            log.info("workers serve REST polling on %s:%d", rest.host, self.rest_port)

    def not_ready_reason(self) -> str | None:
        """Why ``/ready`` says 503: the hub's own reason, or the first worker not ready."""
        if self.draining:
            return "draining"
        reason = self.relay.not_ready_reason()
        if reason is not None:
            return reason
        for worker in self.workers:
            if not worker.ready:
                return f"worker {worker.index} {worker.status}"
        return None

    async def clients(self) -> dict[str, Any]:
        """``/clients``: every worker's clients (each with ``worker``: its index),
        and the workers themselves."""
        answers = await asyncio.gather(*(worker.ask("clients") for worker in self.workers))
        clients: list[dict[str, Any]] = []
        workers: list[dict[str, Any]] = []
        for worker, answer in zip(self.workers, answers, strict=True):
            workers.append({"worker": worker.index, "pid": worker.pid, "ready": worker.ready,
                            "restarts": worker.restarts, "answered": answer is not None})
            clients += [{"worker": worker.index, **client} for client in answer or []]
        return {"clients": clients, "workers": workers}

    async def ask_workers(self, question: str, details: Mapping[str, Any]
                          ) -> list[tuple[int, Any]]:
        """Every worker's answer to ``question`` (None: none), by worker index."""
        answers = await asyncio.gather(*(worker.ask(question, details)
                                         for worker in self.workers))
        return [(worker.index, answer) for worker, answer in zip(self.workers, answers,
                                                                 strict=True)]

    async def metrics(self) -> bytes:
        """``/metrics``: see :func:`relay.workers.metrics.merge_metrics`."""
        pages = await asyncio.gather(*(worker.ask("metrics") for worker in self.workers))
        return merge_metrics(generate_latest(self.relay.registry).decode(), {
            worker.index: page for worker, page in zip(self.workers, pages, strict=True)
            if page is not None})

    async def _supervise(self, worker: WorkerProcess) -> None:
        """Keep a worker in the slot: restart it, after a backoff, whenever it exits."""
        backoff = Backoff(*RESTART_BACKOFF)
        loop = asyncio.get_running_loop()
        spec = WorkerSpec(worker.index, worker_config(self.config, worker.index, self.port,
                                                      self.rest_port),
                          self.socket, self.log_level)
        while True:
            started = loop.time()
            try:
                await worker.start(spec)
            except OSError as error:  # no process could be started (out of memory, pids)
                log.error("cannot start worker %d: %s", worker.index, error)
                code = None
            else:
                assert worker.exited is not None
                # shielded: cancelling this task (a drain) must not cancel the exit
                code = await asyncio.shield(worker.exited)
                worker.close()
            if loop.time() - started >= STABLE_AFTER:
                backoff.reset()
            delay = backoff.next_delay()
            worker.restarts += 1
            self.relay.metrics.worker_restarts.add(1)
            worker.status = f"{_how_it_ended(code)}; restarting"
            log.warning("worker %d (pid %s) %s; restarting it in %.1fs", worker.index,
                        worker.pid, _how_it_ended(code), delay)
            await asyncio.sleep(delay)

    async def shut_down(self, first: signal.Signals, signals: asyncio.Queue[signal.Signals]
                        ) -> int:
        """Stop the workers, then the hub; the exit code (1: a worker had to be killed).

        SIGTERM: each worker drains its clients over ``server.drain_period``,
        the hub feeding them until they are gone. SIGINT, or a second signal:
        each stops at once.
        """
        self.draining = True
        for task in self._supervisors:
            task.cancel()
        await asyncio.gather(*self._supervisors, return_exceptions=True)
        running = [worker for worker in self.workers if worker.running]
        exits = [worker.exited for worker in running if worker.exited is not None]
        period = self.config.server.drain_period
        if first == signal.SIGTERM:
            log.info("SIGTERM: draining %d workers over %.1fs (signal again to stop now)",
                     len(running), period)
        for worker in running:
            worker.signal(first)
        again = asyncio.create_task(signals.get())
        everyone = asyncio.gather(*exits)
        either: set[asyncio.Future[Any]] = {everyone, again}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED,
                           timeout=(period if first == signal.SIGTERM else 0) + EXIT_GRACE)
        if again.done() and not everyone.done():
            log.info("stopping the workers now")
            for worker in running:
                worker.signal(signal.SIGINT)
            await asyncio.wait({everyone}, timeout=EXIT_GRACE)
        again.cancel()
        late = [worker for worker in running if worker.running]
        for worker in late:
            log.error("worker %d (pid %s) did not exit; killing it", worker.index, worker.pid)
            worker.signal(signal.SIGKILL)
        await asyncio.wait({everyone}, timeout=EXIT_GRACE)
        for worker in running:
            worker.close()
        log.info("shutting down")
        await self.stop()
        return 1 if late else 0

    async def stop(self) -> None:
        """Stop the hub: the workers left are killed (``shut_down`` ends them first)."""
        for task in self._supervisors:
            task.cancel()
        exits = [w.exited for w in self.workers if w.running and w.exited is not None]
        for worker in self.workers:
            worker.signal(signal.SIGKILL)
        if exits:
            await asyncio.wait(exits, timeout=EXIT_GRACE)
        for worker in self.workers:
            worker.close()
        await self.admin.stop()
        await self.relay.stop(grace=1.0)
        for reserved in (self._reserved, self._rest_reserved):
            if reserved is not None:
                reserved.close()
        shutil.rmtree(self._dir, ignore_errors=True)


async def run_hub(config: RelayConfig, log_level: str) -> int:
    """``xds-relay run`` with ``server.workers`` > 1, until a signal; the exit code."""
    signals = signal_queue()
    hub = Hub(config, log_level)
    try:
        await hub.start()
    except OSError as error:
        log.error("%s", error)
        await hub.stop()
        return 1
    tune_gc()
    return await hub.shut_down(await signals.get(), signals)
