"""Sending fuzz cases to a relay, while well-behaved watchers follow the origin.

Hypothesis runs examples synchronously, the relay and its clients live in an
event loop: :class:`LoopThread` runs that loop in a thread of its own, and the
test's thread hands it one coroutine at a time. :class:`FuzzRig` holds the
origin, the channel to the relay and the watchers; :meth:`FuzzRig.example`
pushes one origin update, runs one case, and checks both the case's outcome
(:func:`tests.fuzz.rules.violations`) and that every watcher received the
update, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import message as pb_message

from relay.xds_types import ENDPOINT
from tests.builders import cluster, endpoints, listener, route
from tests.fuzz.rules import (
    Limits,
    Outcome,
    StreamOracle,
    lost_status,
    response_class,
    violations,
)
from tests.fuzz.strategies import ADS_DELTA, ADS_SOTW, METHODS_BY_PATH, WATCHED, Case, Method
from tests.harness import ScriptedOrigin

T = TypeVar("T")

# how long a stream may take to end after its client half-closes or cancels it
END_TIMEOUT = 5.0
# how long a step's ``wait`` (or an ``answer`` with nothing received) waits
STEP_WAIT = 0.02


def _identity(data: bytes) -> bytes:
    return data


class LoopThread:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-loop",
                                        daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 60.0) -> T:
        """Run ``coro`` in the loop; its result (or exception) here."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


# -- the origin -------------------------------------------------------------------------


def watched(version: int) -> endpoint_pb2.ClusterLoadAssignment:
    """The watched ClusterLoadAssignment at ``version``: its endpoint's host
    carries the number, for the watchers to read."""
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=WATCHED)
    address = cla.endpoints.add().lb_endpoints.add().endpoint.address.socket_address
    address.address = f"v{version}.fuzz"
    address.port_value = 8080
    return cla


def version_in(cla: endpoint_pb2.ClusterLoadAssignment) -> int:
    host = cla.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address
    return int(host.removeprefix("v").removesuffix(".fuzz"))


def fuzz_origin() -> ScriptedOrigin:
    """A scripted origin holding what :data:`tests.fuzz.strategies.ORIGIN_NAMES` says."""
    origin = ScriptedOrigin()
    origin.set(cluster("a"), cluster("b"), watched(0), endpoints("a", 1001),
               endpoints("b", 1002), listener("l1"), route("r1", "a"), version="v0")
    return origin


# -- one case ----------------------------------------------------------------------------


async def run_case(channel: grpc.aio.Channel, case: Case, limits: Limits,
                   end_timeout: float = END_TIMEOUT) -> Outcome:
    """Send ``case`` to the relay on ``channel``; how it ended."""
    method = case.method
    oracle = StreamOracle(method.protocol, method.type_url, limits, fetch=method.fetch)
    if method.fetch:
        return await _run_fetch(channel, case, oracle, end_timeout)
    call = channel.stream_stream(method.path, request_serializer=_identity,
                                 response_deserializer=_identity)()
    received: list[tuple[str, str, str]] = []
    undecodable = 0
    arrived = asyncio.Event()
    decoder = response_class(method.protocol)

    async def read() -> None:
        nonlocal undecodable
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while (data := await call.read()) is not grpc.aio.EOF:
                try:
                    response = decoder.FromString(data)
                except pb_message.DecodeError:
                    undecodable += 1
                    continue
                received.append((response.type_url, response.nonce,
                                 getattr(response, "version_info", "")))
                arrived.set()

    reader = asyncio.create_task(read())
    sent = attempted = 0
    try:
        for step in case.steps:
            if reader.done():
                break  # the relay ended the stream
            if step.answer is not None and not received:
                await _wait_for(arrived, STEP_WAIT)
            payload = step.payload(received)
            oracle.judge(payload)
            attempted += 1
            try:
                await call.write(payload)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.RpcError):
                oracle.judgements.pop()  # never reached the relay
                break
            sent += 1
            if step.wait:
                arrived.clear()
                await _wait_for(arrived, STEP_WAIT)
        if case.ending == "cancel":
            call.cancel()
        else:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError,
                                     grpc.RpcError):
                await call.done_writing()
        try:
            await asyncio.wait_for(asyncio.shield(reader), end_timeout)
        except TimeoutError:
            call.cancel()
            return Outcome(None, "", case.ending, oracle.judgements, sent, attempted,
                           [t for t, _, _ in received], undecodable)
        code = await call.code()
        details = await call.details() or ""
    finally:
        reader.cancel()
        call.cancel()
    return Outcome(code, details, case.ending, oracle.judgements, sent, attempted,
                   [t for t, _, _ in received], undecodable)


async def _run_fetch(channel: grpc.aio.Channel, case: Case, oracle: StreamOracle,
                     timeout: float) -> Outcome:
    payload = case.steps[0].payload(())
    oracle.judge(payload)
    call = channel.unary_unary(case.method.path, request_serializer=_identity,
                               response_deserializer=_identity)
    types: list[str] = []
    undecodable = 0
    try:
        data = await call(payload, timeout=timeout)
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Outcome(None, "", "close", oracle.judgements, 1, 1)
        return Outcome(error.code(), error.details() or "", "close", oracle.judgements, 1, 1)
    try:
        types.append(discovery_pb2.DiscoveryResponse.FromString(data).type_url)
    except pb_message.DecodeError:
        undecodable = 1
    return Outcome(grpc.StatusCode.OK, "", "close", oracle.judgements, 1, 1, types, undecodable)


async def _wait_for(event: asyncio.Event, timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


# -- watchers ----------------------------------------------------------------------------


class Watcher:
    """A well-behaved client subscribed to the watched ClusterLoadAssignment:
    records each version it receives (see :func:`watched`) and
    ACKs every response."""

    def __init__(self, channel: grpc.aio.Channel, method: Method, number: int) -> None:
        self.method = method
        self.node_id = f"fuzz-watcher-{number}"
        self.seen: list[int] = []
        self.error: str | None = None
        # set whenever something is received or the stream ends
        self.changed = asyncio.Event()
        self._call = channel.stream_stream(
            method.path, request_serializer=_identity, response_deserializer=_identity)()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        first = self._request(node=base_pb2.Node(id=self.node_id, cluster="fuzz"),
                              subscribe=True)
        await self._call.write(first.SerializeToString())
        self._task = asyncio.create_task(self._follow())

    def _request(self, nonce: str = "", version: str = "", node: base_pb2.Node | None = None,
                 subscribe: bool = False) -> Any:
        type_url = "" if self.method.type_url else ENDPOINT
        if self.method.protocol == "delta":
            request: Any = discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, response_nonce=nonce,
                resource_names_subscribe=[WATCHED] if subscribe else [])
        else:
            request = discovery_pb2.DiscoveryRequest(
                type_url=type_url, response_nonce=nonce, version_info=version,
                resource_names=[WATCHED])
        if node is not None:
            request.node.CopyFrom(node)
        return request

    async def _follow(self) -> None:
        decoder = response_class(self.method.protocol)
        try:
            while (data := await self._call.read()) is not grpc.aio.EOF:
                response = decoder.FromString(data)
                bodies = [r.resource for r in response.resources] \
                    if self.method.protocol == "delta" else list(response.resources)
                for body in bodies:
                    cla = endpoint_pb2.ClusterLoadAssignment.FromString(body.value)
                    if cla.cluster_name == WATCHED:
                        self.seen.append(version_in(cla))
                        self.changed.set()
                await self._call.write(self._request(
                    response.nonce, getattr(response, "version_info", "")).SerializeToString())
            self.error = "the relay ended the stream (OK)"
        except grpc.aio.AioRpcError as error:
            self.error = f"the stream failed: {error.code().name} {error.details()!r}"
        except asyncio.CancelledError:
            pass
        self.changed.set()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._call.cancel()


WATCHER_METHODS = (ADS_DELTA, ADS_SOTW,
                   METHODS_BY_PATH["/envoy.service.endpoint.v3.EndpointDiscoveryService/"
                                   "StreamEndpoints"],
                   METHODS_BY_PATH["/envoy.service.endpoint.v3.EndpointDiscoveryService/"
                                   "DeltaEndpoints"])


# -- the rig ------------------------------------------------------------------------------


@dataclass
class Tally:
    """What a run of examples saw."""

    examples: int = 0
    statuses: Counter[str] = field(default_factory=Counter)   # "verdict -> CODE"
    kinds: Counter[str] = field(default_factory=Counter)      # generated request kinds
    broken: list[tuple[Case, list[str]]] = field(default_factory=list)
    watcher_updates: int = 0
    watcher_missed: int = 0
    watcher_extra: int = 0
    lost_statuses: int = 0     # see tests.fuzz.rules.LOST_STATUS


class FuzzRig:
    """An origin, a channel to a relay following it, and the watchers."""

    def __init__(self, origin: ScriptedOrigin, channel: grpc.aio.Channel, limits: Limits
                 ) -> None:
        self.origin = origin
        self.channel = channel
        self.limits = limits
        self.watchers: list[Watcher] = []
        self.version = 0
        self.tally = Tally()

    async def start_watchers(self, methods: tuple[Method, ...] = WATCHER_METHODS) -> None:
        for number, method in enumerate(methods):
            watcher = Watcher(self.channel, method, number)
            await watcher.start()
            self.watchers.append(watcher)
        await self.confirm()

    def close(self) -> None:
        for watcher in self.watchers:
            watcher.close()

    def push(self) -> None:
        """One origin update of the watched resource."""
        self.version += 1
        self.origin.set(watched(self.version), version=f"w{self.version}")

    async def confirm(self, timeout: float = END_TIMEOUT) -> list[str]:
        """Wait until every watcher has the latest update; what went wrong with
        the updates (missed, repeated, out of order, a watcher's stream gone)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for w in self.watchers:
            while (not w.seen or w.seen[-1] != self.version) and w.error is None and \
                    loop.time() < deadline:
                w.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(w.changed.wait(), deadline - loop.time())
        problems = []
        expected = list(range(self.version + 1))
        for w in self.watchers:
            self.tally.watcher_updates += 1
            if w.error is not None:
                problems.append(f"watcher {w.method.path}: {w.error}")
            if w.seen != expected:
                missed = sorted(set(expected) - set(w.seen))
                extra = len(w.seen) - len(set(w.seen))
                self.tally.watcher_missed += len(missed)
                self.tally.watcher_extra += extra
                problems.append(f"watcher {w.method.path} received versions "
                                f"{_tail(w.seen)}, expected {_tail(expected)} "
                                f"(missed {missed[:10]}, {extra} repeated)")
                w.seen = expected[:]  # report each problem once
        return problems

    async def example(self, case: Case) -> tuple[Outcome, list[str]]:
        """Push an update, run ``case`` meanwhile, check both."""
        self.push()
        outcome = await run_case(self.channel, case, self.limits)
        broken = violations(outcome, fetch=case.method.fetch)
        broken += await self.confirm()
        self._count(case, outcome, broken)
        return outcome, broken

    def _count(self, case: Case, outcome: Outcome, broken: list[str]) -> None:
        tally = self.tally
        tally.examples += 1
        verdicts = [j.verdict for j in outcome.judgements]
        verdict = "invalid" if "invalid" in verdicts else "maybe" if "maybe" in verdicts \
            else "valid"
        code = outcome.code.name if outcome.code is not None else "HUNG"
        kind = "fetch" if case.method.fetch else case.method.protocol
        tally.statuses[f"{kind:5} {verdict:7} -> {code}"] += 1
        for step in case.steps:
            tally.kinds[step.label] += 1
        if lost_status(outcome):
            tally.lost_statuses += 1
        if broken:
            tally.broken.append((case, broken))


def _tail(versions: list[int]) -> str:
    return str(versions) if len(versions) <= 8 else f"[..., {', '.join(map(str, versions[-6:]))}]"

