"""A real browser for the console's tests and its screenshot: Debian's
``chromium`` (never a downloaded build), driven by Playwright, headless, in a
fresh profile; and a relay with real gRPC clients for it to look at.

Tests skip, saying why, where ``/usr/bin/chromium`` or the ``playwright``
package is missing (``make test`` and ``.ci/run`` install both where they may).
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from relay import xds_types
from relay.app import Relay, build_relay
from relay.config import parse_config
from tests.harness import ScriptedOrigin, XdsClient, cluster, node, relay_config

if TYPE_CHECKING:
    from playwright.async_api import BrowserContext, Page

#: Debian's package, as the tests want it.
CHROMIUM = Path("/usr/bin/chromium")
#: What the browser runs with: headless, no sandbox (root in CI), nothing of
#: its own on the network (no updates, sync, QUIC, first-run pages).
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync")


def missing_browser() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if not CHROMIUM.exists():
        return (f"no {CHROMIUM}: install Debian's chromium package (apt-get install "
                "chromium; make test and .ci/run do where they may)")
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is missing: pip install -e '.[test]'"
    return None


@dataclass
class Browser:
    """One page in a fresh profile, and every error its console reported."""

    context: BrowserContext
    page: Page
    errors: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def browser() -> AsyncIterator[Browser]:
    """Chromium with a fresh user-data directory, and a page in it."""
    from playwright.async_api import async_playwright

    with tempfile.TemporaryDirectory(prefix="xds-relay-chromium-") as profile:
        async with async_playwright() as playwright:
            context = await playwright.chromium.launch_persistent_context(
                profile, executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS),
                headless=True, viewport={"width": 1400, "height": 1000})
            try:
                page = context.pages[0] if context.pages else await context.new_page()
                opened = Browser(context, page)
                page.on("console", lambda message: opened.errors.append(message.text)
                        if message.type == "error" else None)
                page.on("pageerror", lambda error: opened.errors.append(str(error)))
                yield opened
            finally:
                await context.close()


@dataclass
class Zone:
    """An origin, a relay following it, and real gRPC clients of the relay."""

    origin: ScriptedOrigin
    relay: Relay
    channel: grpc.aio.Channel
    clients: list[XdsClient] = field(default_factory=list)
    channels: list[grpc.aio.Channel] = field(default_factory=list)  # clients' own
    # what each SotW client subscribes to: its every request says it again
    _names: dict[int, list[str]] = field(default_factory=dict)

    @property
    def console(self) -> str:
        return f"http://127.0.0.1:{self.relay.admin_port}/"

    async def connect(self, node_id: str, *names: str, delta: bool = True,
                      own_connection: bool = False) -> XdsClient:
        """A client of ``node_id`` subscribed to the clusters ``names``, holding
        the first response (not answered yet); with ``own_connection``, on a
        connection of its own (a peer of its own), as an Envoy is."""
        method = ("/envoy.service.discovery.v3.AggregatedDiscoveryService/" +
                  ("DeltaAggregatedResources" if delta else "StreamAggregatedResources"))
        channel = self.channel
        if own_connection:
            channel = grpc.aio.insecure_channel(
                f"127.0.0.1:{self.relay.xds_port}",
                options=[("grpc.use_local_subchannel_pool", 1)])
            self.channels.append(channel)
        client = XdsClient(channel, method, delta)
        self.clients.append(client)
        subscribe: dict[str, Any] = ({"resource_names_subscribe": list(names)} if delta
                                     else {"resource_names": list(names)})
        await client.send(node=node(node_id), type_url=xds_types.CLUSTER, **subscribe)
        await client.recv()
        if not delta:
            self._names[id(client)] = list(names)
        return client

    def _again(self, client: XdsClient) -> dict[str, Any]:
        names = self._names.get(id(client))
        return {} if names is None else {"resource_names": names}

    async def ack(self, client: XdsClient) -> None:
        await client.ack(client.responses[-1], **self._again(client))

    async def nack(self, client: XdsClient, message: str) -> None:
        await client.ack(client.responses[-1], error_detail={"code": 3, "message": message},
                         **self._again(client))


@contextlib.asynccontextmanager
async def zone(clusters: int = 3, token_file: Path | None = None) -> AsyncIterator[Zone]:
    """An origin with ``clusters`` clusters (``c0``...), a relay following it
    (its admin behind ``token_file`` if given), and a channel to the relay."""
    origin = await ScriptedOrigin().start()
    origin.set(*(cluster(f"c{i}") for i in range(clusters)))
    config = parse_config(relay_config(origin.port))
    if token_file is not None:
        config = config.model_copy(update={
            "admin": config.admin.model_copy(update={"token_file": token_file})})
    relay = build_relay(config)
    await relay.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}")
    opened = Zone(origin, relay, channel)
    try:
        yield opened
    finally:
        for client in opened.clients:
            client.close()
        for own in opened.channels:
            await own.close()
        await channel.close()
        await relay.stop(0)
        await origin.stop()
