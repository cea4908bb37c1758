"""What every downstream stream, one-shot fetch and REST poll shares.

A :class:`ServingContext` is built whole, once per relay process: the shared
parts (cache, interest index, metrics, the cache view), and the
:class:`ServingSettings` the configuration fixes (limits, authorization, the
admission bucket, sizes). After that it is only read, save for what it counts:
the streams open, per connection and per client host, which change only
through :meth:`ServingContext.join` and :meth:`ServingContext.leave`, and the
drain, which starts once through :meth:`ServingContext.start_draining`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import types
from collections import Counter
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from relay.admission import TokenBucket
from relay.cache import ResourceCache
from relay.clock import Clock
from relay.interest import InterestIndex
from relay.logs import RateLimitedLog
from relay.memory import LARGE, STREAM, MemoryReturn
from relay.protocol.limits import DEFAULT_LIMITS, Limits, shown
from relay.protocol.snapshot import SessionSnapshot
from relay.protocol.view import CacheView, ClientView
from relay.server.access import ANONYMOUS, REFUSAL_LOG_INTERVAL, Access
from relay.server.plans import PlanEncoder
from relay.server.pollers import PollerBook
from relay.server.status import ClientRecords, client_summary_slices
from relay.telemetry import Metrics
from relay.xds_types import short_name

if TYPE_CHECKING:
    from relay.node_groups import NodeGroups
    from relay.server.streams import DownstreamStream

# Lines about clients (refusals, NACKs) go to the downstream log, as the
# streams' own lines do.
log = logging.getLogger("relay.downstream")

__all__ = ["NAMES_PER_TURN", "ServingContext", "ServingSettings", "client_host"]

# How many of a leaving stream's names the interest index forgets per turn
# of the event loop (see ServingContext.leave).
NAMES_PER_TURN = 2_000


def _refusal_log() -> RateLimitedLog:
    return RateLimitedLog(log, REFUSAL_LOG_INTERVAL, time.monotonic)


@dataclass(frozen=True, slots=True)
class ServingSettings:
    """What the configuration fixes for every stream, fetch and poll.

    The defaults serve anyone anything, at once: what a relay without a
    config (the tests' cores) and the private socket of ``--workers`` need.
    """

    # how long pushes wait for the rest of an origin's burst (server.batch_window)
    batch_window: float = 0.0
    # what clients may ask (limits.*, server.extra_type_urls)
    limits: Limits = DEFAULT_LIMITS
    # the authorization rules (None: everyone may do everything, as on the
    # private socket between the processes of --workers)
    access: Access | None = None
    # how fast new streams are taken (None: as fast as they come)
    admission: TokenBucket | None = None
    # lines about bad requests: at most one per kind and client host per interval
    refusal_log: RateLimitedLog = field(default_factory=_refusal_log)
    # the largest resource locator (name and parameters, encoded) a client may
    # subscribe to: what the relay can forward to its origin (None: no origin)
    max_locator_size: int | None = None
    # the most bytes a response takes (server.max_response_size; None: any)
    max_response_size: int | None = None
    # gives memory back once big streams left or large requests were refused
    # (see relay.memory; None: never asks)
    memory: MemoryReturn | None = None
    # the node groups streams join at their first request (upstream.node_groups;
    # None: every stream is served from the relay's own cache and index)
    groups: NodeGroups | None = None


class ServingContext:
    """What every downstream stream shares: built whole, then read.

    ``streams`` (the streams open), ``per_connection`` and ``draining`` are
    read-only views; the counts change through :meth:`join` and
    :meth:`leave`, the drain starts through :meth:`start_draining`.
    """

    def __init__(self, cache: ResourceCache, index: InterestIndex, metrics: Metrics,
                 view: CacheView, settings: ServingSettings | None = None) -> None:
        self.cache: Final = cache
        self.index: Final = index
        self.metrics: Final = metrics
        self.view: Final = view
        self.settings: Final = settings or ServingSettings()
        self.encoder: Final = PlanEncoder()
        # what every client without a certificate (a plaintext port: all of
        # them) sees of the cache: one view for all, not one a stream
        access = self.settings.access
        self.anonymous_view: Final[ClientView] = \
            view if access is None else access.client_view(view, ANONYMOUS)
        # the streams open (a dict for its read-only keys view; the values are unused)
        self._streams: dict[DownstreamStream, None] = {}
        # streams open per client connection (its peer address)
        self._per_connection: Counter[str] = Counter()
        # streams, and connections with a stream, open per client host
        self._per_host: Counter[str] = Counter()
        self._connections_per_host: Counter[str] = Counter()
        # set when the relay drains: new streams are refused
        self._draining = False
        # set while no stream is open
        self._idle = asyncio.Event()
        self._idle.set()
        # streams an origin change concerns, until the batch window closes: one
        # timer for the whole relay, however many streams a push reaches
        self._batched: set[DownstreamStream] = set()
        self._batch_timer: asyncio.TimerHandle | None = None
        # streams that left, still being forgotten by the interest index
        self._forgetting: set[asyncio.Task[None]] = set()
        # REST pollers seen lately, for /clients (as many as streams may be open,
        # and as leases one host may keep)
        limits = self.settings.limits
        self.pollers: Final = PollerBook(limits.streams, limits.leases_per_host)

    @classmethod
    def create(cls, cache: ResourceCache, index: InterestIndex, metrics: Metrics,
               settings: ServingSettings | None = None) -> ServingContext:
        """A context whose cache view counts variant conflicts in ``metrics``."""
        def conflict(type_url: str, name: str) -> None:
            metrics.variant_conflicts.add(1, {"type": short_name(type_url)})

        return cls(cache, index, metrics, CacheView(cache, conflict), settings)

    # -- what it counts, read-only -----------------------------------------------

    @property
    def streams(self) -> Set[DownstreamStream]:
        """The streams open now (a live, read-only view)."""
        return self._streams.keys()

    @property
    def batched(self) -> Set[DownstreamStream]:
        """The streams that wait for the open batch window (see
        :meth:`wake_after_batch`): they push nothing before it closes, even
        if a request of their client wakes them sooner, as the rest of the
        burst may change what is due and its order (make-before-break)."""
        return self._batched

    @property
    def per_connection(self) -> Mapping[str, int]:
        """Streams open per client connection (its peer address; 0 for none)."""
        return types.MappingProxyType(self._per_connection)

    @property
    def draining(self) -> bool:
        """Whether the relay drains: new streams, fetches and polls are refused."""
        return self._draining

    def start_draining(self) -> None:
        """Refuse new streams, fetches and polls from now on (for good)."""
        self._draining = True

    async def wait_idle(self, clock: Clock, timeout: float | None) -> bool:
        """Wait until no stream is open, ``timeout`` seconds at most on ``clock``;
        whether none is."""
        return await clock.wait(self._idle, timeout)

    # -- admission -------------------------------------------------------------

    def admission_error(self, peer: str) -> tuple[str, str] | None:
        """Why a new stream from ``peer`` is refused (the limit, the message), or None."""
        limits = self.settings.limits
        if len(self._streams) >= limits.streams:
            return "streams", (f"the relay serves {len(self._streams)} streams, its most "
                               f"(limits.streams); connect to another replica")
        host = client_host(peer)
        # A unix socket's peers cannot be told apart: they share no connection limit.
        if host is None:
            return None
        on_connection = self._per_connection[peer]
        if on_connection >= limits.streams_per_connection:
            return "streams_per_connection", (
                f"this connection has {on_connection} streams open, the most "
                f"(limits.streams_per_connection)")
        if self._per_host[host] >= limits.streams_per_host:
            return "streams_per_host", (
                f"{shown(host, 64)} has {self._per_host[host]} streams open, the most one "
                f"client host may (limits.streams_per_host)")
        if not on_connection and self._connections_per_host[host] >= limits.connections_per_host:
            return "connections_per_host", (
                f"{shown(host, 64)} has {self._connections_per_host[host]} connections with "
                f"streams open, the most one client host may (limits.connections_per_host)")
        return None

    def admission_wait(self, peer: str) -> float | None:
        """How long a new stream from ``peer`` waits for its turn (see
        :class:`~relay.admission.TokenBucket`), or None: refused. A unix
        socket's (the links of ``--workers``) never wait."""
        admission = self.settings.admission
        if admission is None or client_host(peer) is None:
            return 0.0
        return admission.reserve()

    def warn_limited(self, peer: str, kind: str, message: str, *args: object) -> None:
        """Log a line a client causes (a refusal, a NACK), at most once per kind and
        client host per interval (the port changes with every reconnect; the host
        does not), and a few per kind for all hosts together (see RateLimitedLog)."""
        host = peer.rsplit(":", 1)[0]
        self.settings.refusal_log.warning(kind, message, *args, host=host)

    # -- joining and leaving ---------------------------------------------------

    def join(self, stream: DownstreamStream) -> None:
        """``stream`` opened: count it (see :meth:`admission_error`)."""
        self._streams[stream] = None
        peer = stream.peer
        self._per_connection[peer] += 1
        host = client_host(peer)
        if host is not None:
            self._per_host[host] += 1
            if self._per_connection[peer] == 1:
                self._connections_per_host[host] += 1
        self._idle.clear()

    def leave(self, stream: DownstreamStream) -> None:
        """``stream`` ended: forget it everywhere.

        A stream holding many names is forgotten by the interest index (and
        so by the upstream) in slices, one per turn of the event loop, so that
        a client of 100,000 names leaving holds up nobody; outside an event
        loop, at once.
        """
        if stream in self._streams:
            del self._streams[stream]
            peer = stream.peer
            host = client_host(peer)
            self._per_connection[peer] -= 1
            if not self._per_connection[peer]:
                del self._per_connection[peer]
                if host is not None:
                    _take_one(self._connections_per_host, host)
            if host is not None:
                _take_one(self._per_host, host)
        self._batched.discard(stream)
        if not self._streams:
            self._idle.set()
        # the stream's index: the relay's, or its node group's
        index = stream.index
        held = index.names_held(stream) + STREAM
        if index.remove(stream, NAMES_PER_TURN):
            self.let_go(held)
            return
        try:
            task = asyncio.get_running_loop().create_task(self._forget_slowly(stream, held))
        except RuntimeError:  # no event loop
            index.remove(stream)
            self.let_go(held)
            return
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)

    async def _forget_slowly(self, stream: DownstreamStream, held: int) -> None:
        while True:
            await asyncio.sleep(0)
            if stream.index.remove(stream, NAMES_PER_TURN):
                self.let_go(held)
                return

    def let_go(self, amount: int = LARGE) -> None:
        """``amount`` names (or a large request) are no longer held: memory
        may be given back (see :mod:`relay.memory`)."""
        memory = self.settings.memory
        if memory is not None:
            memory.let_go(amount)

    # -- pushes ----------------------------------------------------------------

    def wake_after_batch(self, stream: DownstreamStream, now: bool = False) -> None:
        """Wake ``stream`` once the batch window closes, to let the rest of
        the origin's burst arrive first (at once without a window). With
        ``now``, at once, out of the open window if it was in it: what it has
        to send cannot change with the rest of the burst (see
        :meth:`Session.first_answers_ready
        <relay.protocol.session.Session.first_answers_ready>`)."""
        window = self.settings.batch_window
        if now:
            self._batched.discard(stream)
            window = 0.0
        if window <= 0:
            stream.wake()
            return
        self._batched.add(stream)
        if self._batch_timer is None:
            self._batch_timer = asyncio.get_running_loop().call_later(window, self._end_batch)

    def _end_batch(self) -> None:
        self._batch_timer = None
        batched, self._batched = self._batched, set()
        for stream in batched:
            stream.wake()

    def close_streams(self, reason: str) -> None:
        """Ask every downstream stream to end (see :meth:`DownstreamStream.close`)."""
        for stream in list(self._streams):
            stream.close(reason)

    # -- what the admin endpoints and metrics show -----------------------------

    def subscription_counts(self) -> Counter[tuple[str, ...]]:
        """Streams subscribed to each type, by (protocol, short type name)."""
        counts: Counter[tuple[str, ...]] = Counter()
        # Snapshots (list(...)): the OTLP exporter calls this from its own thread.
        for stream in list(self._streams):
            for type_url in stream.session.types():
                counts[stream.protocol, short_name(type_url)] += 1
        return counts

    def rejection_counts(self) -> Counter[tuple[str, ...]]:
        """Streams whose latest answered response of a type was NACKed, by
        (protocol, short type name): 0 for every pair some stream subscribes to."""
        counts: Counter[tuple[str, ...]] = Counter()
        for stream in list(self._streams):
            for type_url, rejected in stream.session.rejections():
                counts[stream.protocol, short_name(type_url)] += rejected
        return counts

    def snapshots(self) -> list[tuple[SessionSnapshot, str]]:
        """Every connected client's snapshot and peer, by node id and peer."""
        return sorted(((s.session.snapshot(), s.peer) for s in list(self._streams)),
                      key=lambda item: (item[0].node_id, item[1]))

    def client_statuses(self) -> list[dict[str, Any]]:
        """What ``/clients`` shows of every connected client (see
        :func:`relay.server.status.client_summary`), and of every REST poller
        seen lately (see :mod:`relay.server.pollers`)."""
        return list(self.iter_client_statuses())

    def iter_client_statuses(self) -> ClientRecords:
        """:meth:`client_statuses` one client at a time, each built as it is
        taken: a caller may let others run between them (the streams open
        when it started are listed, each as it is when its turn comes), and
        within a big client's, between the slices of
        :meth:`~relay.server.status.ClientRecords.slices`."""

        def parts() -> Iterator[dict[str, Any] | None]:
            streams = sorted(list(self._streams), key=lambda s: (s.node_id, s.peer))
            for stream in streams:
                summary = yield from client_summary_slices(
                    stream.session.snapshot(), stream.peer, stream.cache, stream.times())
                if stream.group is not None:
                    summary["group"] = {"id": stream.group.id, "key": stream.group.shown_key()}
                yield summary
            yield from self.pollers.summaries()

        return ClientRecords(parts())


def client_host(peer: str) -> str | None:
    """The host of a gRPC peer (``ipv4:10.0.0.7:41000``: ``ipv4:10.0.0.7``),
    what per-host limits count by; None for a unix socket, whose peers
    cannot be told apart."""
    if peer.startswith("unix:"):
        return None
    # one string a host, however many streams it opens (each of which keeps it)
    return sys.intern(peer.rsplit(":", 1)[0])


def _take_one(counts: Counter[str], key: str) -> None:
    left = counts[key] - 1
    if left > 0:
        counts[key] = left
    else:
        del counts[key]
