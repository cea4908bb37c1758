"""Real gRPC parts for end-to-end tests: a scripted origin and scripted clients.

Everything listens on 127.0.0.1 port 0 and speaks the real protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, message

from relay import xds_types
from relay.app import Relay, build_relay
from relay.clock import Clock
from relay.config import parse_config
from relay.constraints import EMPTY_PARAMS, Params, compile_constraints, params_of
from relay.upstream.backoff import Backoff
from tests.builders import (  # noqa: F401 (re-exported for tests)
    cluster,
    endpoints,
    listener,
    pack,
    route,
    type_url_of,
    version_of,
)
from tests.ports import origin_ports

DELTA = discovery_pb2.DeltaDiscoveryRequest
DPC = discovery_pb2.DynamicParameterConstraints
SOTW = discovery_pb2.DiscoveryRequest
ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/"
TIMEOUT = 5.0
QUIET = 0.3  # how long "nothing arrives" is watched for


# -- the scripted origin -------------------------------------------------------


class OriginServer:
    """What scripted origins share: a Delta-ADS server on loopback.

    Subclasses serve streams in ``_serve`` (usually through :func:`pump`),
    and may give server options, TLS credentials and more services
    (``more_handlers``, e.g. load reporting).
    """

    def __init__(self) -> None:
        self.streams: list[Any] = []
        self.port = 0
        self._server: grpc.aio.Server | None = None

    def server_options(self) -> list[tuple[str, Any]]:
        return []

    def server_credentials(self) -> grpc.ServerCredentials | None:
        return None

    def more_handlers(self) -> list[grpc.GenericRpcHandler]:
        return []

    async def start(self, port: int = 0) -> Self:
        """Listen on ``port`` (by default a free one of :func:`origin_ports`, which
        no other test's server is given while this one is away; the same again
        after a stop). Nothing else may listen on it (no ``SO_REUSEPORT``)."""
        server = grpc.aio.server(options=[*self.server_options(), ("grpc.so_reuseport", 0)])
        handler = grpc.stream_stream_rpc_method_handler(
            self._serve, request_deserializer=DELTA.FromString,
            response_serializer=_encoded)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "envoy.service.discovery.v3.AggregatedDiscoveryService",
            {"DeltaAggregatedResources": handler}), *self.more_handlers()])
        self.port = self._listen(server, port)
        await server.start()
        self._server = server
        return self

    def _listen(self, server: grpc.aio.Server, port: int) -> int:
        credentials = self.server_credentials()

        def bind(port: int) -> int:
            address = f"127.0.0.1:{port}"
            return server.add_insecure_port(address) if credentials is None else \
                server.add_secure_port(address, credentials)

        if port:
            return bind(port)
        for _, candidate in zip(range(50), origin_ports(), strict=False):
            with contextlib.suppress(RuntimeError):  # taken (another run's origin)
                return bind(candidate)
        return bind(0)

    async def stop(self) -> None:
        """Go away at once, as a crashed or unreachable origin does."""
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    @property
    def stream(self) -> Any:
        """The newest stream."""
        return self.streams[-1]

    def _serve(self, requests: AsyncIterator[DELTA],
               context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        raise NotImplementedError


def _encoded(response: discovery_pb2.DeltaDiscoveryResponse | bytes) -> bytes:
    """A response's encoding: bytes in an outbox are sent as they are (an
    origin's own encoding, or what is not a response at all)."""
    return response if isinstance(response, bytes) else response.SerializeToString()


async def pump(outbox: asyncio.Queue[Any], reader: Coroutine[Any, Any, None]
               ) -> AsyncIterator[Any]:
    """Yield what ``outbox`` holds until a ``None``, while ``reader`` reads requests."""
    task = asyncio.create_task(reader)
    try:
        while (response := await outbox.get()) is not None:
            yield response
    finally:
        task.cancel()


@dataclass
class OriginStream:
    """One Delta-ADS stream the origin is serving."""

    requests: asyncio.Queue[discovery_pb2.DeltaDiscoveryRequest] = field(
        default_factory=asyncio.Queue)
    outbox: asyncio.Queue[discovery_pb2.DeltaDiscoveryResponse | bytes | None] = field(
        default_factory=asyncio.Queue)
    log: list[discovery_pb2.DeltaDiscoveryRequest] = field(default_factory=list)
    subscribed: dict[str, set[str]] = field(default_factory=dict)
    # type -> (name, parameters) subscribed with ResourceLocators
    locators: dict[str, set[tuple[str, Params]]] = field(default_factory=dict)
    # set once the relay's side of the stream is gone (closed or cancelled)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class ScriptedOrigin(OriginServer):
    """A Delta-ADS origin that behaves like a simple control plane.

    It answers subscriptions from ``resources`` (a name nobody has is
    reported in ``removed_resources``), pushes changes made with :meth:`set`
    and :meth:`remove` to subscribers, and records every request. With
    ``auto=False`` it only records, and tests send responses by hand.
    """

    def __init__(self, auto: bool = True, drop_first_streams: int = 0) -> None:
        super().__init__()
        self.auto = auto
        self.drop_first_streams = drop_first_streams
        self.resources: dict[str, dict[str, tuple[str, any_pb2.Any]]] = {}
        # type -> name -> constraints key -> (version, body, constraints)
        self.variants: dict[str, dict[str, dict[str, tuple[str, any_pb2.Any, DPC]]]] = {}
        self.streams: list[OriginStream] = []
        self._nonce = 0
        self.new_stream = asyncio.Event()

    def all_requests(self) -> list[discovery_pb2.DeltaDiscoveryRequest]:
        return [r for s in self.streams for r in s.log]

    def subscription_requests(self) -> list[discovery_pb2.DeltaDiscoveryRequest]:
        """Requests that change the subscription (not plain ACKs)."""
        return [r for r in self.all_requests()
                if r.resource_names_subscribe or r.resource_names_unsubscribe
                or r.resource_locators_subscribe or r.resource_locators_unsubscribe]

    def nonce(self) -> str:
        self._nonce += 1
        return f"o{self._nonce}"

    async def _serve(self, requests: AsyncIterator[DELTA],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        stream = OriginStream()
        self.streams.append(stream)
        self.new_stream.set()
        if len(self.streams) <= self.drop_first_streams:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "origin not ready")

        async def read() -> None:
            async for request in requests:
                stream.log.append(request)
                await stream.requests.put(request)
                if self.auto:
                    self._answer(stream, request)
            await stream.outbox.put(None)

        try:
            async for response in pump(stream.outbox, read()):
                yield response
        finally:
            stream.ended.set()

    def _answer(self, stream: OriginStream, request: DELTA) -> None:
        type_url = request.type_url
        locators = stream.locators.setdefault(type_url, set())
        for loc in request.resource_locators_unsubscribe:
            locators.discard((loc.name, params_of(loc.dynamic_parameters)))
        for loc in request.resource_locators_subscribe:
            params = params_of(loc.dynamic_parameters)
            locators.add((loc.name, params))
            self._send_variants(stream, type_url, loc.name, params)
        for name in request.resource_names_subscribe:
            if name in self.variants.get(type_url, {}):
                locators.add((name, EMPTY_PARAMS))
                self._send_variants(stream, type_url, name, EMPTY_PARAMS)
        subs = stream.subscribed.setdefault(type_url, set())
        new = [n for n in request.resource_names_subscribe]
        subs.update(new)
        subs.difference_update(request.resource_names_unsubscribe)
        if not new:
            return
        have = self.resources.get(type_url, {})
        known = dict(request.initial_resource_versions)
        names = sorted(have) if "*" in new else sorted(n for n in new if n != "*")
        send = [n for n in names if n in have and known.get(n) != have[n][0]]
        with_variants = self.variants.get(type_url, {})
        missing = [n for n in names if n not in have and n != "*" and n not in with_variants]
        gone = [n for n in known if n not in have and n not in with_variants]
        self.send(stream, type_url, send, sorted(set(missing) | set(gone)))

    def send(self, stream: OriginStream, type_url: str, names: Iterable[str],
             removed: Iterable[str] = ()) -> str:
        have = self.resources.get(type_url, {})
        response = discovery_pb2.DeltaDiscoveryResponse(type_url=type_url, nonce=self.nonce(),
                                                        removed_resources=list(removed))
        for name in names:
            version, body = have[name]
            response.resources.add(name=name, version=version, resource=body)
        stream.outbox.put_nowait(response)
        return response.nonce

    def _send_variants(self, stream: OriginStream, type_url: str, name: str,
                       params: Params) -> None:
        """Answer a locator with the variants it matches (an empty response if none)."""
        response = discovery_pb2.DeltaDiscoveryResponse(type_url=type_url, nonce=self.nonce())
        for version, body, constraints in self.variants.get(type_url, {}).get(name, {}).values():
            if compile_constraints(constraints).matches(params):
                added = response.resources.add(version=version, resource=body)
                added.resource_name.name = name
                added.resource_name.dynamic_parameter_constraints.CopyFrom(constraints)
        stream.outbox.put_nowait(response)

    def set_variant(self, msg: message.Message, constraints: DPC, version: str) -> None:
        """Create or change one variant; push it to the locators it matches."""
        type_url = type_url_of(msg)
        name = getattr(msg, "name", "") or getattr(msg, "cluster_name", "")
        compiled = compile_constraints(constraints)
        self.variants.setdefault(type_url, {}).setdefault(name, {})[compiled.key] = (
            version, pack(msg), constraints)
        for stream in self.streams:
            if any(n == name and compiled.matches(p)
                   for n, p in stream.locators.get(type_url, ())):
                response = discovery_pb2.DeltaDiscoveryResponse(type_url=type_url,
                                                                nonce=self.nonce())
                added = response.resources.add(version=version, resource=pack(msg))
                added.resource_name.name = name
                added.resource_name.dynamic_parameter_constraints.CopyFrom(constraints)
                stream.outbox.put_nowait(response)

    def remove_variant(self, type_url: str, name: str, constraints: DPC) -> None:
        """Delete one variant; tell the locators it matched, by name and constraints."""
        compiled = compile_constraints(constraints)
        self.variants.get(type_url, {}).get(name, {}).pop(compiled.key, None)
        for stream in self.streams:
            if any(n == name and compiled.matches(p)
                   for n, p in stream.locators.get(type_url, ())):
                response = discovery_pb2.DeltaDiscoveryResponse(type_url=type_url,
                                                                nonce=self.nonce())
                removed = response.removed_resource_names.add(name=name)
                removed.dynamic_parameter_constraints.CopyFrom(constraints)
                stream.outbox.put_nowait(response)

    def send_raw(self, response: discovery_pb2.DeltaDiscoveryResponse) -> None:
        if not response.nonce:
            response.nonce = self.nonce()
        self.stream.outbox.put_nowait(response)

    def acked(self, nonce: str) -> bool:
        """Whether the relay has answered the response ``nonce`` (it has applied it)."""
        return any(r.response_nonce == nonce for r in self.all_requests())

    def set(self, *msgs: message.Message, version: str | None = None) -> list[str]:
        """Create or change resources and push them to subscribed streams.

        Returns the nonces of the responses sent.
        """
        by_type: dict[str, list[str]] = {}
        for msg in msgs:
            type_url = type_url_of(msg)
            name = getattr(msg, "name", "") or getattr(msg, "cluster_name", "")
            self.resources.setdefault(type_url, {})[name] = (version or version_of(msg),
                                                             pack(msg))
            by_type.setdefault(type_url, []).append(name)
        nonces = []
        for stream in self.streams:
            for type_url, names in by_type.items():
                subs = stream.subscribed.get(type_url, set())
                wanted = [n for n in names if n in subs or "*" in subs]
                if wanted:
                    nonces.append(self.send(stream, type_url, wanted))
        return nonces

    def remove(self, type_url: str, *names: str) -> None:
        for name in names:
            self.resources.get(type_url, {}).pop(name, None)
        for stream in self.streams:
            subs = stream.subscribed.get(type_url, set())
            gone = [n for n in names if n in subs or "*" in subs]
            if gone:
                self.send(stream, type_url, [], gone)

    async def next_request(self, timeout: float = TIMEOUT) -> DELTA:
        """The next request on the newest stream (waiting for one to open)."""
        await eventually(lambda: self.streams, timeout)
        return await asyncio.wait_for(self.stream.requests.get(), timeout)


# -- scripted downstream clients ------------------------------------------------


class XdsClient:
    """A downstream stream driven by the test: send requests, read responses.

    A background task reads the stream into a queue, so that waiting for a
    response with a timeout never cancels the call itself.
    """

    def __init__(self, channel: grpc.aio.Channel, method: str, delta: bool) -> None:
        self.delta = delta
        response_class: Any = (discovery_pb2.DeltaDiscoveryResponse if delta
                               else discovery_pb2.DiscoveryResponse)
        request_class: Any = DELTA if delta else SOTW
        self.call = channel.stream_stream(
            method, request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString)()
        self.responses: list[Any] = []
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                response = await self.call.read()
                await self._inbox.put(response)
                if response is grpc.aio.EOF:
                    return
        except grpc.aio.AioRpcError as error:
            await self._inbox.put(error)
        except asyncio.CancelledError:
            pass

    async def send(self, **fields: Any) -> None:
        request = DELTA(**fields) if self.delta else SOTW(**fields)
        await self.call.write(request)

    async def recv(self, timeout: float = TIMEOUT) -> Any:
        """The next response; raises the stream's error if it failed."""
        response = await asyncio.wait_for(self._inbox.get(), timeout)
        if isinstance(response, grpc.aio.AioRpcError):
            raise response
        assert response is not grpc.aio.EOF, "stream ended"
        self.responses.append(response)
        return response

    async def expect_nothing(self, within: float = QUIET) -> None:
        """Assert that no response arrives within ``within`` seconds."""
        try:
            response = await asyncio.wait_for(self._inbox.get(), within)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected response: {response}")

    async def ack(self, response: Any, **fields: Any) -> None:
        if self.delta:
            await self.send(type_url=response.type_url, response_nonce=response.nonce, **fields)
        else:
            await self.send(type_url=response.type_url, response_nonce=response.nonce,
                            version_info=response.version_info, **fields)

    def close(self) -> None:
        self._reader.cancel()
        self.call.cancel()


def names_of(response: Any) -> list[str]:
    """Names of the resources in a response (SotW bodies are unpacked)."""
    if isinstance(response, discovery_pb2.DeltaDiscoveryResponse):
        return [r.name for r in response.resources]
    out = []
    for body in response.resources:
        cls = xds_types.message_class(body.type_url)
        assert cls is not None
        msg = cls.FromString(body.value)
        out.append(getattr(msg, "name", "") or getattr(msg, "cluster_name", ""))
    return out


def node(node_id: str = "client-1") -> base_pb2.Node:
    return base_pb2.Node(id=node_id, cluster="test")


@dataclass
class Stack:
    """An origin, a relay connected to it, and a channel to the relay."""

    origin: ScriptedOrigin
    relay: Relay
    channel: grpc.aio.Channel
    clients: list[XdsClient] = field(default_factory=list)

    def client(self, delta: bool = True, method: str | None = None) -> XdsClient:
        if method is None:
            method = ADS + ("DeltaAggregatedResources" if delta else "StreamAggregatedResources")
        c = XdsClient(self.channel, method, delta)
        self.clients.append(c)
        return c


def relay_config(upstream_port: int, linger: str = "0s", backoff: str = "0.05s",
                 answer_grace: str = "0.5s", upstream: str = "", node: str = "",
                 server: str = "", limits: str = "", rest: str = "") -> str:
    """A relay following the origin on ``upstream_port``; ``upstream`` adds
    lines to the upstream section, ``node``, ``server``, ``limits`` and
    ``rest`` keys to the node, the server, the limits and the REST listener
    (YAML flow)."""
    upstream_lines = "".join(f"\n  {line}" for line in upstream.strip().splitlines())
    node_keys = f", {node}" if node else ""
    server_keys = f", {server}" if server else ""
    return f"""
node: {{id: relay-test, cluster: xds-relay{node_keys}}}
server: {{address: "127.0.0.1:0"{server_keys}}}
admin: {{address: "127.0.0.1:0"}}
upstream:
  address: "127.0.0.1:{upstream_port}"
  linger: {linger}
  answer_grace: {answer_grace}
  backoff: {{initial: {backoff}, max: 0.5s}}{upstream_lines}
limits: {{{limits}}}
rest: {{{rest}}}
"""


@contextlib.asynccontextmanager
async def serving_relay(relay: Relay) -> AsyncIterator[grpc.aio.Channel]:
    """``relay`` started, and a channel to its xDS port; both ended on the way out."""
    await relay.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}")
    try:
        yield channel
    finally:
        await channel.close()
        await relay.stop(0)


@contextlib.asynccontextmanager
async def running_stack(origin: Any = None, *, channel_options: Sequence[tuple[str, Any]] = (),
                        clock: Clock | None = None, **config: str) -> AsyncIterator[Stack]:
    """``origin`` (a :class:`ScriptedOrigin` unless given) started, a relay
    following it (``config``: see :func:`relay_config``; its timers on
    ``clock``) and a channel to it."""
    origin = await (origin or ScriptedOrigin()).start()
    if clock is not None and "batch_window" not in config.get("server", ""):
        # The upstream's batch window runs on the clock: a test that moves
        # time itself would have to move it past every window.
        server = config.get("server", "")
        config["server"] = f"{server}, batch_window: 0s" if server else "batch_window: 0s"
    relay = build_relay(parse_config(relay_config(origin.port, **config)), clock)
    await relay.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}",
                                        options=list(channel_options))
    stack = Stack(origin, relay, channel)
    try:
        yield stack
    finally:
        for c in stack.clients:
            c.close()
        await channel.close()
        await relay.stop(0)
        await origin.stop()


class RecordingBackoff(Backoff):
    """A short backoff that records its steps ("wait") and resets ("reset")."""

    def __init__(self) -> None:
        super().__init__(0.01, 0.05)
        self.events: list[str] = []

    def next_delay(self) -> float:
        self.events.append("wait")
        return super().next_delay()

    def reset(self) -> None:
        self.events.append("reset")
        super().reset()


async def eventually(predicate: Any, timeout: float = TIMEOUT) -> None:
    """Wait until ``predicate()`` is true (polling; for what the test cannot be told)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
