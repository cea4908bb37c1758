"""The gRPC loop around :class:`~relay.upstream.state.UpstreamState`.

Opens the one ``DeltaAggregatedResources`` stream to the origin, sends what
the state says, parses every response (in steps, letting the event loop
run), hands a usable one to the state and applies the outcome it returns:
the ACK or NACK and any resubscription go out, the relay is synced once one
is ACKed.
When the stream breaks, the cache, and so every downstream client, keeps its
resources, and the client reconnects:

* at once, after a stream the origin had answered: the origin ended it
  (istiod does at its maximum connection age, with a GOAWAY) or it broke
  after working. The backoff starts over from its first step, and a stream
  shorter than that step waits it, so that an origin answering and dropping
  at once cannot make the relay spin;
* after the next backoff step otherwise (the origin refused, timed out or
  never answered), jittered and doubling up to the configured maximum.

Every attempt dials a fresh channel (see :mod:`relay.upstream.dial`), so the
relay's backoff is the only one between the origin's return and the clients.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from relay.clock import Clock, MonotonicClock, wait_until
from relay.demand import REFUSAL_COOLDOWN
from relay.protocol.limits import shown
from relay.telemetry import Metrics
from relay.upstream.backoff import Backoff
from relay.upstream.dial import Dialer, DialError
from relay.upstream.requests import Request
from relay.upstream.responses import Checked, ParsedResponse, parse_steps
from relay.upstream.state import Acked, Demand, Nacked, ResponseOutcome, UpstreamState
from relay.xds_types import short_name

log = logging.getLogger("relay.upstream")

DELTA_ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"

# Statuses that mean the origin refused the relay's credentials: worth an error.
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


# The most names whose interest changed the upstream acts on in one turn.
MAX_NAMES_PER_TURN = 2_000


class UpstreamClient:
    """Keeps one Delta-ADS stream to the origin open for as long as it runs.

    It is the receiving end of :class:`relay.interest.Upward`: told that the
    clients' interest in a type changed, or that they need fresh copies, it
    acts once ``batch_window`` (on ``clock``) has passed since the first of
    them, reading what is wanted from ``demand`` at that moment: however
    clients churn, the origin gets at most one subscription change per type
    per window (split if it is too large for one request, see
    :func:`~relay.upstream.requests.split_requests`, or for one turn of the
    event loop, see :meth:`_take_changed`), and a name subscribed and
    unsubscribed within one window costs it nothing. The price is latency: a
    client asking for a name no other client has waits up to one window more
    (``server.batch_window``, 5 ms by default) for its first answer. With no
    window it acts in the next turn of the event loop (changes in one turn
    coalesce). Lingering subscriptions that run out go when they do (see
    :meth:`_timer`), not with the window.
    """

    def __init__(self, dialer: Dialer, state: UpstreamState, demand: Demand, backoff: Backoff,
                 metrics: Metrics, clock: Clock | None = None,
                 batch_window: float = 0.0) -> None:
        self.dialer = dialer
        self.state = state
        self.demand = demand
        self.backoff = backoff
        self.metrics = metrics
        self.clock: Clock = clock or MonotonicClock()
        self.batch_window = batch_window
        self.streams_opened = 0
        self._outbox: asyncio.Queue[Request] | None = None
        self._timer_changed = asyncio.Event()
        self.connected_event = asyncio.Event()
        # set once the relay is synced: the origin sent a valid response (or,
        # with nothing subscribed yet, kept a stream open for answer_grace)
        self.synced_event = asyncio.Event()
        # what clients asked for and the upstream has not acted on yet: per
        # type, names whose interest changed, and names to fetch afresh
        self._changed: dict[str, set[str]] = {}
        self._refetches: dict[str, set[str]] = {}
        # the open batch window: it acts on the batch when it closes
        self._window: asyncio.Task[None] | None = None
        # once run() has ended
        self._stopped = False
        # an act in the next turn of the event loop is due (no window, or
        # the rest of a batch too large for one turn)
        self._scheduled = False

    @property
    def target(self) -> str:
        return self.dialer.target

    def interest_changed(self, type_url: str, names: Iterable[str]) -> None:
        """The union of what clients want of ``type_url`` changed (see Upward)."""
        self._changed.setdefault(type_url, set()).update(names)
        self._schedule()

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        """Clients need fresh copies of these resources (see Upward)."""
        self._refetches.setdefault(type_url, set()).update(names)
        self._schedule()

    def _schedule(self) -> None:
        """Act on what clients asked for once the batch window closes: the
        first change after a quiet spell opens it, later ones join it, as they
        join a batch still being acted on (see :meth:`_take_changed`)."""
        if self._scheduled or self._window is not None or self._stopped:
            # Stopped: nothing to send to, and no window left behind.
            return
        if self.batch_window <= 0:
            self._next_turn()
            return
        self._window = asyncio.get_running_loop().create_task(
            self._close_window(self.clock.now() + self.batch_window),
            name="upstream-batch-window")

    def _next_turn(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._act_on_demand)

    async def _close_window(self, closes: float) -> None:
        try:
            await self.clock.sleep(max(0.0, closes - self.clock.now()))
        finally:
            self._window = None
        self._act_on_demand()

    def _act_on_demand(self) -> None:
        self._scheduled = False
        changed = self._take_changed()
        refetches, self._refetches = self._refetches, {}
        now = self.clock.now()
        for type_url, names in sorted(changed.items()):
            self._send(self.state.on_interest_changed(type_url, self.demand, now, names))
        for type_url, names in sorted(refetches.items()):
            self._send(self.state.on_refetch(type_url, frozenset(names)))
        self._timer_changed.set()

    def _take_changed(self) -> dict[str, set[str]]:
        """Names whose interest changed, at most :data:`MAX_NAMES_PER_TURN` of
        them: the rest wait for the next turn of the event loop (not for
        another window: they are of this batch), so that a client subscribing
        to 100,000 names holds up nobody."""
        taken: dict[str, set[str]] = {}
        room = MAX_NAMES_PER_TURN
        for type_url in sorted(self._changed):
            names = self._changed[type_url]
            if len(names) <= room:
                taken[type_url] = self._changed.pop(type_url)
                room -= len(names)
                continue
            if room:
                taken[type_url] = {names.pop() for _ in range(room)}
            break
        if self._changed:
            self._next_turn()
        return taken

    def _send(self, requests: list[Request]) -> None:
        if self._outbox is not None:
            for request in requests:
                self._outbox.put_nowait(request)

    async def run(self) -> None:
        """Connect, serve, reconnect; until cancelled."""
        timer = asyncio.create_task(self._timer())
        self._stopped = False
        try:
            while True:
                started = self.clock.now()
                responded = await self._one_stream()
                if responded and self.clock.now() - started >= self.backoff.initial:
                    log.info("reconnecting to origin %s now", self.target)
                    delay = 0.0
                else:
                    delay = self.backoff.next_delay()
                    log.info("reconnecting to origin %s in %.2fs", self.target, delay)
                await self.clock.sleep(delay)
        finally:
            self._stopped = True
            timer.cancel()
            if self._window is not None:
                # Nothing to send it to: a new stream subscribes what is
                # wanted then (on_connect reads the demand whole).
                self._window.cancel()

    async def _one_stream(self) -> bool:
        """One attempt: dial, subscribe, serve until the stream ends.

        Returns whether the origin responded on it (it was serving).
        """
        try:
            channel = self.dialer.channel()
            metadata = self.dialer.metadata()
        except DialError as error:
            log.error("cannot connect to origin %s: %s", self.target, error)
            return False
        async with channel:
            call = channel.stream_stream(
                DELTA_ADS_METHOD,
                request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString,
            )(metadata=metadata, wait_for_ready=False)
            self.streams_opened += 1
            if self.streams_opened > 1:
                self.metrics.upstream_reconnects.add(1)
            outbox: asyncio.Queue[Request] = asyncio.Queue()
            self._outbox = outbox
            for request in self.state.on_connect(self.demand, self.clock.now()):
                outbox.put_nowait(request)
            writer = asyncio.create_task(self._write(call, outbox))
            session = asyncio.create_task(self._read(call, outbox))
            connected = asyncio.create_task(self._mark_connected(channel))
            try:
                done, _ = await asyncio.wait({session, connected},
                                             timeout=self.dialer.connect_timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    log.warning("origin %s: not connected after %.1fs (upstream.connect_timeout)",
                                self.target, self.dialer.connect_timeout)
                    return False
                return await session
            finally:
                self._outbox = None
                self.state.on_disconnect()
                for task in (writer, session, connected):
                    task.cancel()
                call.cancel()
                if self.connected_event.is_set():
                    self.connected_event.clear()
                    self.metrics.upstream_connected.add(-1)
                    log.info("disconnected from origin %s", self.target)

    async def _read(self, call: grpc.aio.StreamStreamCall,
                    outbox: asyncio.Queue[Request]) -> bool:
        """Hand responses to the state until the stream ends; whether any came."""
        responded = False
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    log.info("origin %s ended the stream", self.target)
                    return responded
                if not responded:
                    # Only a response proves the origin serves us: reset backoff now.
                    responded = True
                    self.backoff.reset()
                checked = await self._parse(response)
                if isinstance(checked, ParsedResponse):
                    outcome: ResponseOutcome = self.state.on_response(
                        checked, self.demand, self.clock.now())
                else:
                    outcome = self.state.on_unusable(checked)
                self._apply(response.type_url, outcome, outbox)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._refused(error.details() or "")
            level = logging.ERROR if error.code() in _REFUSED else logging.WARNING
            hint = " (check upstream.token_file and upstream.tls)" \
                if error.code() in _REFUSED else ""
            log.log(level, "origin stream to %s failed: %s %s%s", self.target,
                    error.code().name, error.details(), hint)
            return responded

    def _apply(self, type_url: str, outcome: ResponseOutcome,
               outbox: asyncio.Queue[Request]) -> None:
        """Send what a response's outcome says; an ACK means the relay is synced."""
        match outcome:
            case Acked():
                self.synced_event.set()
                label = "ack"
            case Nacked():
                label = "nack"
        self.metrics.upstream_responses.add(1, {"type": short_name(type_url), "outcome": label})
        for request in outcome.requests:
            outbox.put_nowait(request)
        self._timer_changed.set()  # the response may have set a deadline

    def _refused(self, details: str) -> None:
        """The origin ended the stream for asking too much (an origin with a
        limit of its own, such as another relay): the names it has not
        answered are the ones it refused. Their subscribers are refused in
        turn, and the next stream goes without them, so that one client's
        subscription never cuts the zone off in a reconnect loop."""
        suspects = self.state.unanswered_names()
        message = (f"the origin refused the relay's subscription to this stream's names "
                   f"({shown(details, 200)}); they are refused for "
                   f"{REFUSAL_COOLDOWN:.0f}s")
        refused = 0
        for type_url, names in sorted(suspects.items()):
            refused += self.demand.origin_refused(type_url, names, message)
        log.warning("origin %s refused the subscription: %s; dropped the %d names it had not "
                    "answered yet and refused them to their %d subscribers", self.target,
                    shown(details, 200), sum(map(len, suspects.values())), refused)

    @staticmethod
    async def _parse(response: discovery_pb2.DeltaDiscoveryResponse) -> Checked:
        """Parse a response in steps, letting the event loop run between them:
        a response of 10,000 resources holds up no client for long."""
        steps = parse_steps(response)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                checked: Checked = done.value
                return checked
            await asyncio.sleep(0)

    async def _mark_connected(self, channel: grpc.aio.Channel) -> None:
        await channel.channel_ready()
        self.connected_event.set()
        self.metrics.upstream_connected.add(1)
        log.info("connected to origin %s", self.target)
        # With nothing subscribed the origin has nothing to answer: it has
        # accepted the relay once the stream outlives a refusal (an origin
        # refusing credentials ends it at once). This task ends with the stream.
        await self.clock.sleep(self.state.answer_grace)
        if not self.state.has_subscriptions():
            self.synced_event.set()

    @staticmethod
    async def _write(call: grpc.aio.StreamStreamCall, outbox: asyncio.Queue[Request]) -> None:
        try:
            while True:
                await call.write(await outbox.get())
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return  # the read side sees the failure and reconnects

    async def _timer(self) -> None:
        """Run the state's deadlines: lingering subscriptions that run out,
        locators to settle, reconciles after a reconnect."""
        while True:
            deadline = self.state.next_deadline()
            self._timer_changed.clear()
            if not await wait_until(self.clock, self._timer_changed, deadline):
                self._send(self.state.on_tick(self.demand, self.clock.now()))
