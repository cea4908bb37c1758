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

An origin may have fallback servers (``upstream.fallback``). The client
follows one server at a time and moves by gRFC A71's rule (see
:mod:`relay.upstream.fallback`): to the next server when the one in use is
unreachable and clients want something the cache lacks; back to the primary,
closing the fallback's stream, as soon as the primary answers a probe. Every
metric it records carries its ``origin``; ``xds_relay_upstream_server`` says
which server is in use, and :meth:`UpstreamClient.status` tells the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from relay.clock import Clock, MonotonicClock, wait_until
from relay.demand import REFUSAL_COOLDOWN
from relay.protocol.limits import shown
from relay.telemetry import Metrics
from relay.turns import made_in_turns
from relay.upstream.backoff import Backoff
from relay.upstream.bulk import prepare
from relay.upstream.dial import Dialer, DialError
from relay.upstream.fallback import Failover, probe_requests, watches_uncached
from relay.upstream.requests import Request
from relay.upstream.responses import (
    Checked,
    ParsedResponse,
    UndecodableResponse,
    parse_steps,
)
from relay.upstream.state import (
    DEFAULT_MAX_REQUEST_SIZE,
    Acked,
    Demand,
    Nacked,
    ResponseOutcome,
    UpstreamState,
)
from relay.xds_types import KNOWN_TYPE_URLS, short_name

log = logging.getLogger("relay.upstream")

T = TypeVar("T")

DELTA_ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"

# Statuses that mean the origin refused the relay's credentials: worth an error.
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


# The most names whose interest changed the upstream acts on in one turn.
MAX_NAMES_PER_TURN = 2_000


@dataclass(frozen=True)
class UpstreamStatus:
    """What one origin's client is doing, as of when it was asked (for
    ``/ready``, ``/clients``, ``xds-relay status`` and the console). Times are
    wall-clock Unix seconds."""

    origin: str
    # every server of the origin, primary first (addresses)
    servers: tuple[str, ...]
    # the one in use: 0 the primary, n the n-th of its fallback servers
    in_use: int
    # whether the stream to the server in use is connected
    connected: bool
    # when it connected, if it is; else when the last stream was lost (None: never connected)
    since: float | None
    # streams opened after the first (to any of its servers)
    reconnects: int
    # per type URL: when the origin last sent a response of it
    last_response: Mapping[str, float]

    @property
    def server(self) -> str:
        """The address of the server in use."""
        return self.servers[self.in_use]

    @property
    def on_fallback(self) -> bool:
        return self.in_use > 0

    def to_json(self) -> dict[str, object]:
        """The status as JSON values (type URLs as short names)."""
        return {"origin": self.origin, "server": self.server, "fallback": self.in_use,
                "servers": list(self.servers), "connected": self.connected,
                "since": self.since, "reconnects": self.reconnects,
                "last_response": {short_name(type_url): at
                                  for type_url, at in sorted(self.last_response.items())}}


def delta_ads_call(channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]
                   ) -> grpc.aio.StreamStreamCall:
    """A Delta-ADS call on ``channel`` that fails at once when the server cannot
    be reached (rather than waiting for it to be). Its responses are read as
    received, bytes: :func:`~relay.upstream.responses.parse_steps` parses
    them in steps (gRPC would, in one call)."""
    return channel.stream_stream(
        DELTA_ADS_METHOD,
        request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
        response_deserializer=None,
    )(metadata=metadata, wait_for_ready=False)


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

    def __init__(self, dialers: Dialer | Sequence[Dialer], state: UpstreamState, demand: Demand,
                 backoff: Backoff, metrics: Metrics, clock: Clock | None = None,
                 batch_window: float = 0.0, *, origin: str = "default",
                 wall: Callable[[], float] = time.time) -> None:
        # the origin's servers, primary first (one Dialer: no fallback)
        self.dialers: tuple[Dialer, ...] = \
            (dialers,) if isinstance(dialers, Dialer) else tuple(dialers)
        self.state = state
        self.demand = demand
        self.backoff = backoff
        self.metrics = metrics
        self.clock: Clock = clock or MonotonicClock()
        self.batch_window = batch_window
        # the origin's name: the ``origin`` label of every metric recorded here
        self.origin = origin
        self._wall = wall
        self._labels = {"origin": origin}
        self._failover = Failover(len(self.dialers))
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
        # the primary's probes, while a fallback is in use
        self._probe: asyncio.Task[None] | None = None
        # set when the server in use changes outside the loop (the primary
        # answered a probe), or, while it waits after an unreachable server
        # with everything cached, when clients want something uncached
        self._interrupt = asyncio.Event()
        self._watching_demand = False
        # held while the state makes a piece of work in steps (a new
        # stream's subscription, a big response applied, a big settle: see
        # _in_steps): one at a time; interest changes wait for it
        self._state_busy = asyncio.Lock()
        # an act on the demand came while it was held, and is owed after
        self._act_owed = False
        # for status(): when the stream connected or was lost (wall clock),
        # and the last response of each type
        self._since: float | None = None
        self._last_response: dict[str, float] = {}
        # Series start at 0, so that alerts see the first change as one.
        metrics.upstream_connected.add(0, self._labels)
        metrics.upstream_reconnects.add(0, self._labels)
        for index in range(len(self.dialers)):
            metrics.upstream_server.add(int(index == 0), self._server_labels(index))

    @property
    def dialer(self) -> Dialer:
        """How to reach the server in use (the primary, or a fallback)."""
        return self.dialers[self._failover.in_use]

    @property
    def target(self) -> str:
        """The address of the server in use."""
        return self.dialer.target

    def status(self) -> UpstreamStatus:
        """What the client is doing now: a snapshot."""
        return UpstreamStatus(self.origin, tuple(d.target for d in self.dialers),
                              self._failover.in_use, self.connected_event.is_set(), self._since,
                              max(0, self.streams_opened - 1), dict(self._last_response))

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
        if self._state_busy.locked():
            self._act_owed = True  # (the state is making a piece of work in steps: see _in_steps)
            return
        changed = self._take_changed()
        refetches, self._refetches = self._refetches, {}
        if self._watching_demand and changed and \
                watches_uncached(self.state.cache, self.demand, changed):
            self._interrupt.set()  # time to fall back: see _pause
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
        """Connect, serve, reconnect (or move to another server); until cancelled."""
        # the known types' shadow types, made before any client waits on them
        prepare(sorted(KNOWN_TYPE_URLS))
        timer = asyncio.create_task(self._timer())
        self._stopped = False
        if self._failover.on_fallback and self._probe is None:  # run again
            self._probe = asyncio.create_task(self._probe_primary(), name="upstream-probe")
        try:
            while True:
                await self._attempt()
        finally:
            self._stopped = True
            timer.cancel()
            self._stop_probe()
            if self._window is not None:
                # Nothing to send it to: a new stream subscribes what is
                # wanted then (on_connect reads the demand whole).
                self._window.cancel()

    async def _attempt(self) -> None:
        """One stream on the server in use; then the wait before the next
        attempt, and the move to another server if A71's rule says so."""
        self._interrupt.clear()
        server = self._failover.in_use
        started = self.clock.now()
        answered = await self._one_stream(server)
        if self._failover.in_use != server:
            return  # the primary answered a probe: to it at once
        uncached = not answered and len(self.dialers) > 1 and \
            watches_uncached(self.state.cache, self.demand)
        step = self._failover.after_attempt(answered, uncached)
        if step.server != server:
            self._moved(server, "it is unreachable and clients want resources not cached")
            if not step.wait:
                return
        elif answered and self.clock.now() - started >= self.backoff.initial:
            log.info("reconnecting to origin %s now", self.target)
            return
        delay = self.backoff.next_delay()
        log.info("reconnecting to origin %s in %.2fs", self.target, delay)
        await self._pause(delay, may_fall_back=step.server == server and not answered and
                          len(self.dialers) > 1)

    async def _pause(self, delay: float, may_fall_back: bool) -> None:
        """Wait ``delay`` before the next attempt, or less: until the primary
        answers a probe, or (``may_fall_back``: the server in use was
        unreachable with everything cached) until clients want something the
        cache lacks, which moves to the next server at once (A71)."""
        server = self._failover.in_use
        self._watching_demand = may_fall_back
        try:
            woken = await wait_until(self.clock, self._interrupt, self.clock.now() + delay)
        finally:
            self._watching_demand = False
        if woken and may_fall_back and self._failover.in_use == server:
            self._failover.after_attempt(answered=False, uncached=True)
            self._moved(server, "it is unreachable and clients now want a resource not cached")

    async def _one_stream(self, server: int) -> bool:
        """One attempt on ``server``: dial, subscribe, serve until the stream
        ends (or the primary answers a probe, when ``server`` is a fallback).

        Returns whether the server responded on it (it was reachable).
        """
        dialer = self.dialers[server]
        try:
            channel = dialer.channel()
            metadata = dialer.metadata()
        except DialError as error:
            log.error("cannot connect to origin %s: %s", dialer.target, error)
            return False
        async with channel:
            requests = await self._subscribe()
            call = delta_ads_call(channel, metadata)
            self.streams_opened += 1
            if self.streams_opened > 1:
                self.metrics.upstream_reconnects.add(1, self._labels)
            outbox: asyncio.Queue[Request] = asyncio.Queue()
            self._outbox = outbox
            for request in requests:
                outbox.put_nowait(request)
            self._timer_changed.set()  # (a wildcard asked again may have set a deadline)
            writer = asyncio.create_task(self._write(call, outbox))
            session = asyncio.create_task(self._read(call, outbox, dialer))
            connected = asyncio.create_task(self._mark_connected(channel, dialer.target))
            interrupted = asyncio.create_task(self._interrupt.wait())
            try:
                done, _ = await asyncio.wait({session, connected, interrupted},
                                             timeout=dialer.connect_timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    log.warning("origin %s: not connected after %.1fs (%s.connect_timeout)",
                                dialer.target, dialer.connect_timeout, dialer.key)
                    return False
                if not (session.done() or interrupted.done()):
                    await asyncio.wait({session, interrupted},
                                       return_when=asyncio.FIRST_COMPLETED)
                if session.done():
                    return session.result()
                log.info("closing the stream to %s: the primary answered", dialer.target)
                return True
            finally:
                self._outbox = None
                self.state.on_disconnect()
                for task in (writer, session, connected, interrupted):
                    task.cancel()
                call.cancel()
                if self.connected_event.is_set():
                    self.connected_event.clear()
                    self._since = self._wall()
                    self.metrics.upstream_connected.add(-1, self._labels)
                    log.info("disconnected from origin %s", dialer.target)

    async def _subscribe(self) -> list[Request]:
        """A new stream's subscription (:meth:`UpstreamState.connect_steps`),
        made in turns of the event loop before the stream opens: a big
        client's 50,000 names held it 350-440 ms in one go."""
        try:
            return await self._in_steps(
                self.state.connect_steps(self.demand, self.clock.now()))
        except BaseException:  # (cancelled: no stream was opened for it)
            self.state.on_disconnect()
            raise

    async def _in_steps(self, steps: Generator[None, None, T]) -> T:
        """What the state's ``steps`` make, in turns of the event loop, once
        any other piece of work made so is done (the timer's and the
        reader's may come at once). Meanwhile interest changes and deadlines
        wait (the state is handed nothing else); they go on once it is made,
        after what it sends."""
        async with self._state_busy:
            try:
                return await made_in_turns(steps)
            finally:
                if self._act_owed:
                    self._act_owed = False
                    self._next_turn()

    async def _read(self, call: grpc.aio.StreamStreamCall,
                    outbox: asyncio.Queue[Request], dialer: Dialer) -> bool:
        """Hand responses to the state until the stream ends; whether any came."""
        responded = False
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    log.info("origin %s ended the stream", dialer.target)
                    return responded
                checked = await self._parse(response)
                if not responded:
                    # Only a response proves the origin serves us: reset backoff now.
                    responded = True
                    self.backoff.reset()
                self._last_response[checked.type_url] = self._wall()
                if isinstance(checked, ParsedResponse):
                    # (in steps: istiod's resend of 50,000 names held the loop 86-251 ms)
                    outcome: ResponseOutcome = await self._in_steps(
                        self.state.response_steps(checked, self.demand, self.clock.now()))
                else:
                    outcome = self.state.on_unusable(checked)
                self._apply(checked.type_url, outcome, outbox)
                # Nothing here keeps a response once it is applied: awaiting the
                # next one with these bound would keep this one (megabytes, and
                # objects here and there in the heap that a trim cannot return).
                del response, checked, outcome
        except UndecodableResponse as error:
            log.error("origin %s: %s; ending the stream", dialer.target, error)
            return responded
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._refused(error.details() or "")
            level = logging.ERROR if error.code() in _REFUSED else logging.WARNING
            hint = f" (check {dialer.key}.token_file and {dialer.key}.tls)" \
                if error.code() in _REFUSED else ""
            log.log(level, "origin stream to %s failed: %s %s%s", dialer.target,
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
        self.metrics.upstream_responses.add(
            1, {**self._labels, "type": short_name(type_url), "outcome": label})
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

    async def _parse(self, response: bytes) -> Checked:
        """Parse a response in steps, letting the event loop run between them:
        a response of 10,000 resources holds up no client for long. What the
        cache holds is handed to it: a resend of cached bodies is not decoded
        again (see :mod:`relay.upstream.bulk`)."""
        known = self.state.cache.served_to_all
        return await made_in_turns(parse_steps(response, known=known), _one_pass)

    async def _mark_connected(self, channel: grpc.aio.Channel, target: str) -> None:
        await channel.channel_ready()
        self.connected_event.set()
        self._since = self._wall()
        self.metrics.upstream_connected.add(1, self._labels)
        log.info("connected to origin %s", target)
        # With nothing subscribed the origin has nothing to answer: it has
        # accepted the relay once the stream outlives a refusal (an origin
        # refusing credentials ends it at once). This task ends with the stream.
        await self.clock.sleep(self.state.answer_grace)
        if not self.state.subscription_counts():
            self.synced_event.set()

    # -- fallback -------------------------------------------------------------

    def _server_labels(self, index: int) -> dict[str, str]:
        """``server`` its address, ``fallback`` its place (0: the primary)."""
        return {**self._labels, "server": self.dialers[index].target, "fallback": str(index)}

    def _describe(self, index: int) -> str:
        role = "primary" if index == 0 else f"fallback {index}"
        return f"{self.dialers[index].target} ({role})"

    def _moved(self, left: int, why: str) -> None:
        """The server in use changed from ``left`` (``why``): the metric says
        which is in use; the primary is probed while it is not."""
        now = self._failover.in_use
        self.state.on_server_changed()  # the next stream resyncs, declaring nothing
        self.metrics.upstream_server.add(-1, self._server_labels(left))
        self.metrics.upstream_server.add(1, self._server_labels(now))
        log.log(logging.INFO if now == 0 else logging.WARNING, "origin %s: leaving %s for %s: %s",
                self.origin, self._describe(left), self._describe(now), why)
        if now == 0:
            self._stop_probe()
        elif self._probe is None:
            self._probe = asyncio.create_task(self._probe_primary(), name="upstream-probe")

    def _stop_probe(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None

    async def _probe_primary(self) -> None:
        """While a fallback is in use: probe the primary after each step of a
        backoff of its own; once it answers, go back to it (the stream to the
        fallback is closed, see :meth:`_one_stream`)."""
        backoff = self.backoff.fresh()
        while not await self._primary_answers(backoff.next_delay()):
            pass
        left = self._failover.in_use
        self._probe = None  # this task: it ends here
        if self._failover.primary_answered():
            self._moved(left, "the primary answers again")
            self._interrupt.set()

    async def _primary_answers(self, delay: float) -> bool:
        """After ``delay``: one probe of the primary, on a stream of its own.
        Whether it sent a response to what :func:`probe_requests` asks (with
        nothing to ask: whether it kept the stream open ``answer_grace``)."""
        await self.clock.sleep(delay)
        dialer = self.dialers[0]
        try:
            channel = dialer.channel()
            metadata = dialer.metadata()
        except DialError as error:
            log.warning("cannot probe the primary %s: %s", dialer.target, error)
            return False
        async with channel:
            call = delta_ads_call(channel, metadata)
            answer = asyncio.create_task(self._probe_answer(call))
            connected = asyncio.create_task(channel.channel_ready())
            try:
                done, _ = await asyncio.wait({answer, connected}, timeout=dialer.connect_timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                return bool(done) and await answer
            finally:
                answer.cancel()
                connected.cancel()
                call.cancel()

    async def _probe_answer(self, call: grpc.aio.StreamStreamCall) -> bool:
        """Ask, and wait for the first response: a primary that keeps the probe
        open without answering is waited for on it, as a stream would be."""
        requests = probe_requests(self.state.node, self.state.cache, self.demand,
                                  DEFAULT_MAX_REQUEST_SIZE)
        try:
            for request in requests:
                await call.write(request)
            read = asyncio.ensure_future(call.read())
            if not requests:
                grace = asyncio.ensure_future(self.clock.sleep(self.state.answer_grace))
                await asyncio.wait({read, grace}, return_when=asyncio.FIRST_COMPLETED)
                grace.cancel()
                if not read.done():
                    read.cancel()
                    return True
            response = await read
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as error:
            log.info("the primary %s did not answer a probe: %s", self.dialers[0].target,
                     error.code().name if isinstance(error, grpc.aio.AioRpcError) else error)
            return False
        return response is not grpc.aio.EOF

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
                # (in steps: settling istiod's resend of 50,000 held the loop 40-70 ms)
                self._send(await self._in_steps(self._tick_steps()))

    def _tick_steps(self) -> Generator[None, None, list[Request]]:
        """The state's tick as of when it starts (it may wait for the lock)."""
        return (yield from self.state.tick_steps(self.demand, self.clock.now()))


async def _one_pass() -> None:
    """The pause between two steps of a response's check: one pass of the
    loop (a stream's requests wait behind it; a timer may wait a step)."""
    await asyncio.sleep(0)
