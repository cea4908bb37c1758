"""A worker process of ``--workers``: a relay whose origin is the hub.

It serves clients on ``server.address`` next to the other workers (the
kernel spreads connections between them: SO_REUSEPORT) and follows the hub
over its unix socket with Delta ADS, plaintext and no token, exactly as a
relay follows any origin. Signals work as for a single relay (SIGTERM
drains, SIGINT stops at once), and it stops at once when the hub is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection

from prometheus_client import generate_latest

from relay.app import Relay, build_relay, serve_until_signalled, signal_queue
from relay.config import Address, BackoffConfig, MetricsConfig, RelayConfig
from relay.console.source import QUESTIONS as CONSOLE_QUESTIONS
from relay.console.source import local_source, worker_answer
from relay.logs import configure_logging
from relay.runtime import tune_gc
from relay.upstream.dial import Dialer
from relay.workers.link import Link

__all__ = ["WorkerSpec", "worker_config", "worker_main", "worker_node_id"]

log = logging.getLogger("relay.workers")


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process is started with (pickled to it by ``multiprocessing``)."""

    index: int  # 1..N; a restarted worker keeps its predecessor's
    config: RelayConfig  # see worker_config
    hub: str  # the hub's socket, "unix:/path"
    log_level: str


def worker_node_id(node_id: str, index: int) -> str:
    """The node id worker ``index`` presents to the hub: the relay's, with
    ``/worker-N`` appended (the origin only ever sees the relay's own)."""
    return f"{node_id}/worker-{index}"


def worker_config(config: RelayConfig, index: int, port: int,
                  rest_port: int | None = None) -> RelayConfig:
    """``config`` as worker ``index`` runs it.

    Clients on ``port`` (the one the hub holds: ``server.address`` may say 0),
    and REST pollers on ``rest_port`` (likewise, for ``rest.address``);
    a node id of its own; the hub as origin, which honours
    ``initial_resource_versions`` and is local, so a short backoff; no OTLP
    push (the hub's ``/metrics`` is where its series go); no snapshot (the
    hub keeps it).
    """
    rest = config.rest
    if rest.address is not None and rest_port is not None:
        rest = rest.model_copy(update={"address": Address(rest.address.host, rest_port)})
    # Every origin's settings describe the link to the hub: a worker follows
    # the hub alone, whatever origin a name comes from (the hub routes them;
    # the worker's origins only say which names it may refuse).
    hub_link = {"initial_versions": "honoured", "backoff": BackoffConfig(initial=0.05, max=1.0)}
    upstream = config.upstream
    return config.model_copy(update={
        "node": config.node.model_copy(update={"id": worker_node_id(config.node.id, index)}),
        "rest": rest,
        "server": config.server.model_copy(update={
            "address": Address(config.server.address.host, port), "workers": 1}),
        "upstream": None if upstream is None else upstream.model_copy(update=hub_link),
        "authorities": {name: origin.model_copy(update=hub_link)
                        for name, origin in config.authorities.items()},
        "metrics": MetricsConfig(),
        "persistence": None,
    })


def worker_main(spec: WorkerSpec, end: Connection) -> None:
    """The worker process: serve until told to stop; ``end`` is its control channel."""
    configure_logging(spec.log_level, spec.config.logging.format, f"worker-{spec.index}")
    try:
        code = asyncio.run(_serve(spec, end))
    except KeyboardInterrupt:  # SIGINT before the loop took signals over
        code = 130
    # The terminal's Ctrl-C reaches every process of the group and the hub
    # passes it on too: one left over must not raise while exiting.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


async def _serve(spec: WorkerSpec, end: Connection) -> int:
    signals = signal_queue()
    link = await Link.open(end)
    upstream = spec.config.hub_link()
    hub = Dialer(spec.hub, max_response_size=upstream.max_response_size,
                 connect_timeout=upstream.connect_timeout)
    relay = build_relay(spec.config, origin=hub, admin=False, reuse_port=True)
    try:
        await relay.start()
    except OSError as error:
        log.error("%s", error)
        await relay.stop(0)
        return 1
    tune_gc()
    tasks = [asyncio.create_task(_report_ready(relay, link)),
             asyncio.create_task(_answer(relay, link, signals))]
    try:
        await serve_until_signalled(relay, signals)
    finally:
        for task in tasks:
            task.cancel()
        link.close()
    return 0


async def _report_ready(relay: Relay, link: Link) -> None:
    """Tell the hub once serving and synced with it (what ``/ready`` counts)."""
    assert relay.upstream is not None
    await relay.upstream.synced_event.wait()
    link.send({"ready": os.getpid()})


async def _answer(relay: Relay, link: Link, signals: asyncio.Queue[signal.Signals]) -> None:
    """Answer the hub's questions until it is gone; then stop (as SIGINT would)."""
    console = local_source(relay.serving)  # what the hub's console asks of this worker
    while (message := await link.receive()) is not None:
        data: object = None
        if message.get("ask") == "clients":
            data = relay.serving.client_statuses()
        elif message.get("ask") == "metrics":
            data = generate_latest(relay.registry).decode()
        elif message.get("ask") in CONSOLE_QUESTIONS:
            data = await worker_answer(console, message["ask"], message.get("details", {}))
        link.send({"reply": message.get("id"), "data": data})
    log.warning("the hub is gone; stopping")
    signals.put_nowait(signal.SIGINT)
