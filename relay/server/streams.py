"""The thin I/O layer around the protocol state: one object per gRPC stream.

A :class:`DownstreamStream` reads requests in one task and feeds them to its
per-type state objects; the gRPC handler's generator writes whatever those
objects say to send. Cache changes only mark names in the state objects and
wake the writer, so a client that stops reading holds up nobody but itself,
and what waits for it is at most one set of names per type.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import grpc
from envoy.config.core.v3 import base_pb2

from relay.cache import ResourceCache
from relay.constraints import EMPTY_PARAMS, Params, params_of
from relay.encoding import encode_delta_response, encode_sotw_response, locator_size
from relay.interest import InterestIndex
from relay.protocol.delta import DeltaResponsePlan, DeltaSubscription
from relay.protocol.outcome import ProtocolError, RequestOutcome
from relay.protocol.sotw import SotwResponsePlan, SotwSubscription
from relay.protocol.view import CacheView, NonceSource
from relay.telemetry import Metrics
from relay.xds_types import CLUSTER, ENDPOINT, push_rank, short_name

log = logging.getLogger("relay.downstream")

# The two xDS wire protocols: state of the world and incremental.
XdsProtocol = Literal["sotw", "delta"]

# A SotW client announcing this accepts resources wrapped in Resource (TTLs,
# heartbeats); others get bare resources.
SUPPORTS_RESOURCE_IN_SOTW = "xds.config.supports-resource-in-sotw"
# The generated messages carry no type information; this names what flows.
Request: TypeAlias = Any  # DiscoveryRequest | DeltaDiscoveryRequest


@dataclass
class ServingContext:
    """What every downstream stream shares."""

    cache: ResourceCache
    index: InterestIndex
    metrics: Metrics
    view: CacheView
    batch_window: float = 0.0
    # the largest resource locator (name and parameters, encoded) a client may
    # subscribe to: what the relay can forward to its origin (None: no origin)
    max_locator_size: int | None = None
    streams: set[DownstreamStream] = field(default_factory=set)
    # set when the relay drains: new streams are refused
    draining: bool = False
    # set while no stream is open
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    def subscription_counts(self) -> Counter[tuple[str, ...]]:
        """Streams subscribed to each type, by (protocol, short type name)."""
        counts: Counter[tuple[str, ...]] = Counter()
        # Snapshots (list(...)): the OTLP exporter calls this from its own thread.
        for stream in list(self.streams):
            for type_url in list(stream.states):
                counts[stream.protocol, short_name(type_url)] += 1
        return counts

    def close_streams(self, reason: str) -> None:
        """Ask every downstream stream to end (see :meth:`DownstreamStream.close`)."""
        for stream in list(self.streams):
            stream.close(reason)

    def client_statuses(self) -> list[dict[str, Any]]:
        """Every connected client's status (see :meth:`DownstreamStream.status`)."""
        return sorted((s.status() for s in self.streams),
                      key=lambda s: (s["node_id"], s["peer"]))

    @classmethod
    def create(cls, cache: ResourceCache, index: InterestIndex, metrics: Metrics,
               batch_window: float = 0.0) -> ServingContext:
        def conflict(type_url: str, name: str) -> None:
            metrics.variant_conflicts.add(1, {"type": short_name(type_url)})

        return cls(cache, index, metrics, CacheView(cache, conflict), batch_window)


class DownstreamStream:
    """One downstream xDS stream, ADS (any type) or per-type (``fixed_type_url``)."""

    def __init__(self, serving: ServingContext, protocol: XdsProtocol, peer: str,
                 fixed_type_url: str | None = None) -> None:
        self.serving = serving
        self.protocol: XdsProtocol = protocol
        self.peer = peer
        self.fixed_type_url = fixed_type_url
        self.node: base_pb2.Node | None = None
        # per type URL, the node's dynamic parameters (the latest node sent)
        self.node_params: dict[str, Params] = {}
        self.states: dict[str, DeltaSubscription | SotwSubscription] = {}
        self._nonces = NonceSource()
        self._wake = asyncio.Event()
        self._origin_changed = False
        self._closing: str | None = None
        # per type, when the client last changed what it subscribes to: resources
        # received after that are pushes (even if they waited for an ACK), and
        # count towards the push latency; older ones are answers from cache
        self._requested_at: dict[str, float] = {}

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    @property
    def node_id(self) -> str:
        return self.node.id if self.node is not None else ""

    def status(self) -> dict[str, Any]:
        """What this client subscribes to, holds, ACKed and last NACKed, per type.

        ``acked`` is the version_info of the last ACKed response for SotW, and
        its nonce for delta (whose versions are per resource: ``versions``).

        For the admin endpoints and CSDS; names are sorted for stable output.
        """
        types: dict[str, Any] = {}
        for type_url, state in sorted(self.states.items()):
            nack = state.last_nack
            acked = (state.acked_nonce if isinstance(state, DeltaSubscription)
                     else state.acked_version)
            types[type_url] = {
                "subscribed": sorted(state.names),
                "wildcard": state.wildcard,
                # what the client was last sent (or declared it has), per name
                "versions": {name: held.version for name, held in sorted(state.held.items())},
                "acked": acked,
                # the response the client has not answered yet: until it does,
                # ``versions`` may not be what the client runs
                "in_flight": state.inflight_nonce,
                "last_nack": None if nack is None else {
                    "nonce": nack.nonce, "version": nack.version, "message": nack.message},
            }
        return {"node_id": self.node_id, "peer": self.peer, "protocol": self.protocol,
                "types": types}

    def close(self, reason: str) -> None:
        """End the stream with UNAVAILABLE and ``reason``; the client reconnects."""
        self._closing = reason
        self._wake.set()

    # -- notifications from the subscription index -------------------------

    def resources_changed(self, type_url: str, names: frozenset[str], everything: bool) -> None:
        state = self.states.get(type_url)
        if state is not None:
            coalesced = state.resources_changed(names, everything)
            if coalesced:
                self.serving.metrics.downstream_coalesced.add(
                    self.protocol, short_name(type_url), amount=coalesced)
            self._origin_changed = True
            self._wake.set()

    def heartbeats_received(self, type_url: str, names: frozenset[str]) -> None:
        state = self.states.get(type_url)
        if state is not None:
            state.heartbeats_received(names)
            self._origin_changed = True
            self._wake.set()

    # -- requests ------------------------------------------------------------

    def type_url_of(self, request: Request) -> str:
        """The type a request is for, checked against the service it came on."""
        if self.fixed_type_url is not None:
            if request.type_url and request.type_url != self.fixed_type_url:
                raise ProtocolError(
                    f"type_url {request.type_url!r} sent on the discovery service for "
                    f"{self.fixed_type_url!r}")
            return self.fixed_type_url
        if not request.type_url:
            raise ProtocolError("type_url is required on an aggregated (ADS) stream")
        type_url: str = request.type_url
        return type_url

    def check_locator_sizes(self, request: Request, node_params: Params) -> None:
        """Refuse a name the relay could not forward to its origin.

        The relay's subscription upstream carries every client's names (with
        the node's dynamic parameters for the type, if any). One too large
        for a request to the origin is never sent there (see
        :mod:`relay.upstream.requests`); the client that asked for it is told.
        """
        limit = self.serving.max_locator_size
        if limit is None:
            return
        delta = self.protocol == "delta"
        names = request.resource_names_subscribe if delta else request.resource_names
        locators = request.resource_locators_subscribe if delta else request.resource_locators
        with_params = locator_size("", node_params) if node_params else 0
        for name in names:
            # A character is at most four bytes: most names need no encoding.
            if 4 * len(name) + 8 + with_params > limit and \
                    (size := locator_size(name, node_params)) > limit:
                raise ProtocolError(
                    f"resource name {name[:64]!r}... has {size} bytes with the node's dynamic "
                    f"parameters; the relay forwards names of at most {limit} bytes to its "
                    "origin (upstream.max_request_size)")
        for locator in locators:
            size = locator_size(locator.name, locator.dynamic_parameters.items())
            if size > limit:
                raise ProtocolError(
                    f"resource locator {locator.name[:64]!r} has {size} bytes with its "
                    f"dynamic parameters; the relay forwards locators of at most {limit} "
                    "bytes to its origin (upstream.max_request_size)")

    def handle_request(self, request: Request) -> RequestOutcome:
        """Feed one request to the state of its type."""
        type_url = self.type_url_of(request)
        if request.HasField("node"):
            if self.node is None:
                # The node of the first request that carries one is kept for the
                # stream; only its dynamic parameters may change later.
                self.node = request.node
            self._update_node_params(request.node)
        self.check_locator_sizes(request, self.node_params.get(type_url, EMPTY_PARAMS))
        state = self.states.get(type_url)
        if state is None:
            state = (DeltaSubscription(type_url) if self.protocol == "delta"
                     else SotwSubscription(type_url))
            state.set_node_params(self.node_params.get(type_url, EMPTY_PARAMS))
            if isinstance(state, SotwSubscription) and self.node is not None:
                state.wrap_ttl = SUPPORTS_RESOURCE_IN_SOTW in self.node.client_features
            self.states[type_url] = state
        outcome = state.on_request(request)
        if outcome.interest_changed or type_url not in self._requested_at:
            self._requested_at[type_url] = time.monotonic()
        metrics = self.serving.metrics
        if outcome.nack is not None:
            metrics.downstream_nacks.add(self.protocol, short_name(type_url))
            log.warning("NACK from node=%r peer=%s type=%s nonce=%s: %s", self.node_id,
                        self.peer, short_name(type_url), outcome.nack.nonce,
                        outcome.nack.message)
        elif outcome.ack_nonce is not None:
            metrics.downstream_acks.add(self.protocol, short_name(type_url))
        # Plain ACKs are the bulk of traffic and never change interest; any
        # other request (re)registers, so a first request with no names still
        # puts the stream in the index to hear that its type became synced.
        if outcome.interest_changed or outcome.ack_nonce is None:
            self.serving.index.update(self, type_url, state.interest())
        return outcome

    def _update_node_params(self, node: base_pb2.Node) -> None:
        params = {type_url: params_of(context.params)
                  for type_url, context in node.dynamic_parameters.items()}
        if params == self.node_params:
            return
        self.node_params = params
        for type_url, state in self.states.items():
            if state.set_node_params(params.get(type_url, EMPTY_PARAMS)):
                self.serving.index.update(self, type_url, state.interest())

    # -- responses -----------------------------------------------------------

    def ready_responses(self) -> Iterator[bytes]:
        """Encoded responses due now, in make-before-break order.

        Clusters, endpoints, listeners, routes, then other types; a delta
        response that only removes clusters goes after all the others, so that
        nothing still points at a cluster when it disappears.
        """
        view = self.serving.view
        deferred: list[DeltaResponsePlan | SotwResponsePlan] = []
        for type_url in sorted(self.states, key=push_rank):
            state = self.states[type_url]
            plan = state.next_response(view, self._nonces)
            if plan is None:
                continue
            if type_url == CLUSTER and _only_removes(plan):
                deferred.append(plan)
                continue
            if type_url == CLUSTER and self.protocol == "sotw":
                # Envoy re-requests endpoints after a cluster update and waits
                # for an answer even if they did not change.
                endpoints = self.states.get(ENDPOINT)
                if isinstance(endpoints, SotwSubscription):
                    endpoints.answer_next_request = True
            yield self._sent(plan)
        for plan in deferred:
            yield self._sent(plan)
        for type_url, state in self.states.items():
            if state.refetch:
                self.serving.index.request_refetch(type_url, frozenset(state.refetch))
                state.refetch = set()

    def _sent(self, plan: DeltaResponsePlan | SotwResponsePlan) -> bytes:
        metrics = self.serving.metrics
        metrics.push(self.protocol, plan.type_url)
        if plan.resources:
            newest = max(r.received for r in plan.resources)
            if newest > self._requested_at.get(plan.type_url, 0.0):
                metrics.push_latency.record(time.monotonic() - newest,
                                            short_name(plan.type_url))
        return encode_plan(plan)

    async def serve(self, requests: AsyncIterator[Request],
                    context: grpc.aio.ServicerContext) -> None:
        """Run the stream: the body of a gRPC stream-stream handler.

        Writes with ``context.write`` rather than by yielding: one layer of
        async generators less per message on the fan-out path.
        """
        metrics = self.serving.metrics
        metrics.downstream_streams.add(1, {"protocol": self.protocol})
        self.serving.streams.add(self)
        self.serving.idle.clear()
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                if self._closing is not None:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, self._closing)
                for response in self.ready_responses():
                    await context.write(response)
                if reader.done():
                    error = reader.exception()
                    if isinstance(error, ProtocolError):
                        metrics.downstream_rejected.add(1, {"protocol": self.protocol})
                        log.warning("rejecting stream from %s: %s", self.peer, error)
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
                    return
                await self._wake.wait()
                if self._origin_changed and self.serving.batch_window > 0:
                    # Let the rest of the origin's burst arrive first.
                    await asyncio.sleep(self.serving.batch_window)
                self._origin_changed = False
                self._wake.clear()
        finally:
            reader.cancel()
            self.serving.streams.discard(self)
            if not self.serving.streams:
                self.serving.idle.set()
            self.serving.index.remove(self)
            metrics.downstream_streams.add(-1, {"protocol": self.protocol})

    async def _read(self, requests: AsyncIterator[Request]) -> None:
        try:
            async for request in requests:
                self.handle_request(request)
                self._wake.set()
        finally:
            self._wake.set()


def _only_removes(plan: DeltaResponsePlan | SotwResponsePlan) -> bool:
    if isinstance(plan, DeltaResponsePlan):
        return not plan.resources and bool(plan.removed or plan.removed_names)
    return False


def encode_plan(plan: DeltaResponsePlan | SotwResponsePlan) -> bytes:
    """Serialize a planned response around its pre-encoded resources."""
    if isinstance(plan, DeltaResponsePlan):
        return encode_delta_response(plan.head(), [
            *(r.delta_entry for r in plan.resources),
            *(r.heartbeat_entry for r in plan.heartbeats)])
    return encode_sotw_response(plan.head(), (
        r.sotw_heartbeat_entry if r.name in plan.heartbeats else
        r.sotw_wrapped_entry if r.name in plan.wrapped else r.sotw_entry
        for r in plan.resources))
