"""One-shot fetches, answered from the cache: the gRPC ``Fetch*`` methods and
REST-JSON polling (:mod:`relay.server.rest`) both come here.

A fetch is a SotW request without a stream. A fresh
:class:`~relay.protocol.session.Session` checks it as a stream's first request
(limits, names the origin can take) and answers it as that stream's first
response: the same variant for the node's dynamic parameters, the same
``version_info`` for the same resources. Nothing of the session outlives the
fetch.

What a fetch needs from the origin it holds through a :class:`Lease`: a
subscriber of the interest index that is not a stream. Polls of the same
resources (type, wildcard, each name with its parameters) share one lease;
every poll renews it, and it is dropped ``lease`` seconds after the last one,
on the relay's clock, so a poller that stops does not keep the origin
subscription forever. A fetch waits for what it asked at most ``wait``
seconds from when its lease subscribed (or from its own asking for fresh
copies of do-not-cache resources): a poll of resources the origin never
answers for is not slowed down again and again.

The outcome of a fetch is one of :data:`FetchOutcome`; the gRPC and HTTP
adapters map it to a status each.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter, OrderedDict
from collections.abc import Generator, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

from envoy.service.discovery.v3 import discovery_pb2

from relay.authorization import PeerIdentity
from relay.cache import UNKNOWN
from relay.clock import Clock, ended, wait_until
from relay.constraints import Params
from relay.interest import InterestChange
from relay.protocol.delta import MAX_NAMES_PER_PIECE
from relay.protocol.limits import LimitExceeded, shown
from relay.protocol.outcome import ProtocolError
from relay.protocol.requests import SotwRequest
from relay.protocol.session import Received, Session
from relay.protocol.sotw import SotwResponsePlan, state_version
from relay.protocol.subscription import MAX_NAMES_PER_RESPONSE
from relay.protocol.view import NonceSource, ResourceView
from relay.resource import CachedResource, arrival_clock
from relay.server.serving import NAMES_PER_TURN, ServingContext, client_host
from relay.turns import Turn, give_turn, made, made_in_turns
from relay.xds_types import short_name

__all__ = ["DEFAULT_LEASE", "DEFAULT_WAIT", "NAMES_PER_PAGE", "NAMES_PER_SLICE", "NAMES_PER_SORT",
           "Denied", "FetchOutcome", "Fetcher", "Invalid", "Lease", "Limited", "Served",
           "Unanswered", "Unavailable", "sorted_slices", "unanswered", "unanswered_slices"]

log = logging.getLogger("relay.fetch")

#: ``rest.lease`` and ``rest.wait`` when not configured.
DEFAULT_LEASE = 60.0
DEFAULT_WAIT = 0.5
#: Names a fetch looks up in the cache, or answers, between two turns of the
#: event loop (see :mod:`relay.turns`): a page's worth, 5-10 ms. A first
#: poll of 5,000 names held the loop ~65 ms in one go, one of 50,000 ~0.5 s.
NAMES_PER_SLICE = MAX_NAMES_PER_RESPONSE
#: Names a fetch answers in one page (see :meth:`Fetcher._answer_in_chunks`)
#: between two turns: a page of resources no one was sent yet (whose
#: entries are made then) took 37-62 ms at 2,500 names (a stream's page),
#: 5-6 once made; pages of fewer names join to the same answer.
NAMES_PER_PAGE = 1_000
#: Names a fetch sorts between two turns (see :func:`sorted_slices`): sorting
#: costs 0.1-0.3 µs a name, a look-up some 2.
NAMES_PER_SORT = 10_000


@dataclass(frozen=True, slots=True)
class Served:
    """The response: ``plan`` (its nonce is the fetch's own), and the lease
    that keeps its resources subscribed (None: nothing was asked).

    ``generation``: the lease's :attr:`Lease.generation` when ``plan`` was
    made, when the plan is the whole answer and the same request gets it
    again for as long as the lease sees no change (see
    :meth:`Fetcher.unchanged`); None when it is not (something was missing,
    a do-not-cache resource, an origin's error).
    """

    plan: SotwResponsePlan
    lease: Lease | None = None
    generation: int | None = None


@dataclass(frozen=True, slots=True)
class Denied:
    """Refused by ``server.authorization`` (``reason``: node_binding)."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Invalid:
    """A request that breaks the protocol (a type that is not the method's, a
    name the relay could not forward to its origin)."""

    message: str


@dataclass(frozen=True, slots=True)
class Limited:
    """A request beyond ``limits.<limit>`` (counted, and logged rate-limited)."""

    limit: str
    message: str


@dataclass(frozen=True, slots=True)
class Unavailable:
    """Nothing to answer with yet: the origin has not sent what was asked."""

    message: str


FetchOutcome: TypeAlias = Served | Denied | Invalid | Limited | Unavailable

# (type URL, wildcard, the names, the parameters they are subscribed with,
# the pollers' scope of the type: pollers that may see different Secrets
# share no lease, nor the response rendered for it). When every name has the
# same parameters (the node's: most polls), the names and those parameters;
# otherwise each name with its parameters, and None. (The names alone are a
# set of strings whose hashes are known: keying 50,000 names by (name,
# parameters) pairs took 25-35 ms to make and look up, the names 10.)
LeaseKey: TypeAlias = tuple[str, bool, frozenset[Any], Params | None, Hashable]


class Lease:
    """The origin subscription that polls of one exact set of resources keep.

    A :class:`~relay.interest.Subscriber` of the interest index: the cache's
    changes to its names wake the fetches waiting on it. ``rendered`` is the
    last response body an adapter made for its pollers (REST's JSON), keyed by
    what decides it, so that a thousand pollers of the same set cost one
    encoding per change.
    """

    __slots__ = ("_changed", "expires", "generation", "host", "key", "refused", "rendered",
                 "subscribed_at")

    def __init__(self, key: LeaseKey, now: float, expires: float, host: str | None = None
                 ) -> None:
        self.key = key
        # the client host whose poll made it (its leases_per_host; None: none)
        self.host = host
        self.subscribed_at = now
        self.expires = expires
        self.rendered: tuple[Hashable, bytes] | None = None
        # set when the origin refused some of its names: the next poll starts afresh
        self.refused = False
        # counts the changes to its resources: an answer made at one generation
        # is the answer to the same request while it lasts
        self.generation = 0
        self._changed = asyncio.Event()

    @property
    def type_url(self) -> str:
        return self.key[0]

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next change to the lease's resources (take it before looking)."""
        return self._changed

    def resources_changed(self, type_url: str, names: frozenset[str], everything: bool) -> None:
        self.generation += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def heartbeats_received(self, type_url: str, names: frozenset[str]) -> None:
        """Nothing to do: a poll gets the resources, heartbeats or not."""

    def subscription_refused(self, type_url: str, names: frozenset[str], message: str) -> None:
        """The origin refused some of the names: polls waiting give up, the next
        is refused as a new lease would be."""
        self.refused = True
        self.resources_changed(type_url, names, False)


@dataclass(frozen=True, slots=True)
class Unanswered:
    """What the cache cannot answer yet for a fetch."""

    # names the origin has said nothing of ("*": the wildcard's complete set)
    missing: frozenset[str]
    # do-not-cache resources cached before the fetch asked: not its to have
    stale: frozenset[str]

    def __bool__(self) -> bool:
        return bool(self.missing or self.stale)


def unanswered(view: ResourceView, type_url: str, wanted: Mapping[str, Params],
               wildcard: bool, wildcard_held: bool, since: int) -> Unanswered:
    """Which of ``wanted`` (names with their parameters; ``wildcard``: every
    resource, known once the cache holds the wildcard's set, ``wildcard_held``:
    see :meth:`~relay.cache.ResourceCache.holds_wildcard`) the cache cannot answer
    for: neither present, nor said not to exist, nor reported in error. A
    do-not-cache resource that arrived by ``since`` (an arrival stamp) is
    stale. No I/O."""
    return made(unanswered_slices(view, type_url, wanted, wildcard, wildcard_held, since))


def unanswered_slices(view: ResourceView, type_url: str, wanted: Mapping[str, Params],
                      wildcard: bool, wildcard_held: bool, since: int,
                      per_slice: int = NAMES_PER_SLICE
                      ) -> Generator[None, None, Unanswered]:
    """:func:`unanswered`, pausing (yielding) after each ``per_slice`` names
    looked up; each name is looked up in the cache as it is then."""
    if not view.is_synced(type_url):
        return Unanswered(frozenset(wanted) | ({"*"} if wildcard else set()), frozenset())
    missing: set[str] = set()
    stale: set[str] = set()
    errors = view.has_errors(type_url)
    if wildcard and not wildcard_held:
        missing.add("*")
    left = per_slice
    for name, params in wanted.items():
        left -= 1
        if left < 0:
            left = per_slice - 1
            yield
        found = view.lookup(type_url, name, params)
        if found is UNKNOWN:
            if not (errors and view.error(type_url, name, params) is not None):
                missing.add(name)
        elif isinstance(found, CachedResource) and found.do_not_cache and \
                found.arrival <= since:
            stale.add(name)
    return Unanswered(frozenset(missing), frozenset(stale))


class Fetcher:
    """Answers fetches from the cache, holding what they need through leases."""

    def __init__(self, serving: ServingContext, clock: Clock, lease: float = DEFAULT_LEASE,
                 wait: float = DEFAULT_WAIT, per_slice: int = NAMES_PER_SLICE,
                 turn: Turn = give_turn, per_piece: int = MAX_NAMES_PER_PIECE) -> None:
        """``per_slice``: names looked up or answered between two awaits of
        ``turn`` (what lets the loop serve others; tests count them);
        ``per_piece``: names a new lease registers with the interest index
        between two (as a delta stream applies a big request's pieces)."""
        self._serving = serving
        self._clock = clock
        self.lease = lease
        self.wait = wait
        self._per_slice = max(1, per_slice)
        self._per_piece = max(1, per_piece)
        self._turn = turn
        # by key, the least recently renewed first: all leases last as long,
        # so this is also the order in which they expire
        self._leases: OrderedDict[LeaseKey, Lease] = OrderedDict()
        # leases being registered (a piece per turn), by key, each with what
        # is set when it is done: a poll of the same resources waits for it
        self._registering: dict[LeaseKey, _Registration] = {}
        self._per_host: Counter[str] = Counter()
        self._reaper: asyncio.Task[None] | None = None
        #: slices of a big request received one by one (tests count them)
        self.pieces_received = 0

    def lease_counts(self) -> dict[tuple[str, ...], int]:
        """Leases held per short type name (the ``xds_relay_fetch_leases`` gauge)."""
        counts: dict[tuple[str, ...], int] = {}
        for type_url, *_ in list(self._leases):
            key = (short_name(type_url),)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def leases(self) -> list[Lease]:
        """The leases held now, the soonest to expire first."""
        return list(self._leases.values())

    async def fetch(self, request: SotwRequest, type_url: str, peer: str,
                    identity: PeerIdentity | None = None, method: str = "") -> FetchOutcome:
        """Answer one DiscoveryRequest for ``type_url`` (what ``method``, the
        gRPC method or HTTP path it came on, serves) from ``peer``, whose
        certificate says ``identity`` (None: no certificate)."""
        serving, access = self._serving, self._serving.settings.access
        if access is not None:
            error = access.node_error(identity, request.node if request.HasField("node") else None)
            if error is not None:
                return Denied("node_binding", error)
        if request.type_url and request.type_url != type_url:
            return Invalid(f"type_url {shown(request.type_url, 200)!r} sent to {method}, which "
                           f"serves {type_url!r}")
        # many names: decoding, checks, lease each 5-40 ms at 50,000, a turn between
        big = len(request.resource_names) > self._per_slice
        if big:
            await self._turn()
        chunkable = big and _chunkable(request)
        taken = await self._received_in_pieces(request, type_url, peer) if chunkable else \
            self._received(request, type_url, peer)
        if not isinstance(taken, tuple):
            return taken
        session, asked = taken
        if big:
            await self._turn()
        since = arrival_clock()
        # what this client sees of the cache: without the Secrets it may not have
        view = serving.view if access is None else access.client_view(serving.view, identity)
        change = view.admit(type_url, asked)
        wildcard = bool(change.wildcard)
        key = _lease_key(type_url, change, view.scope_of(type_url))
        if big:  # (the key: ~10 ms at 50,000 names; a new lease's registering: 10-40)
            await self._turn()
        lease = await self._renew(key, change, client_host(peer))
        if isinstance(lease, Limited):
            serving.metrics.downstream_limited.add(1, {"limit": lease.limit})
            serving.warn_limited(peer, lease.limit, "refusing fetch from %s: %s", peer,
                                 lease.message)
            return lease
        if big:
            await self._turn()
        waiting = await self._wait(lease, view, type_url, change.added, wildcard, since)
        generation = None if lease is None else lease.generation
        if wildcard or len(change.added) <= MAX_NAMES_PER_RESPONSE or \
                not (chunkable or _chunkable(request)):
            many = wildcard or len(change.added) > MAX_NAMES_PER_RESPONSE
            # (received in pieces, then mostly not admitted: received whole, rarely)
            plan = await self._answer(session or self._whole(request, type_url, peer), view,
                                      request, many)
        else:
            plan = await self._answer_in_chunks(view, request, type_url)
        if plan is not None:
            whole = not waiting and not plan.errors and \
                not any(resource.do_not_cache for resource in plan.resources)
            return Served(plan, lease, generation if whole else None)
        if waiting.missing or waiting.stale:
            return Unavailable(_not_yet(type_url, waiting))
        # Every name said not to exist (SotW sends nothing then), or none asked.
        return Served(SotwResponsePlan(type_url, NonceSource().next(), state_version({}), []),
                      lease)

    def _received(self, request: SotwRequest, type_url: str, peer: str
                  ) -> tuple[Session, InterestChange] | Limited | Invalid:
        """A fresh session, and ``request`` received by it as a stream's
        first (how the interest in ``type_url`` changed); or the refusal of a
        request beyond the limits or breaking the protocol."""
        session = self._session(type_url)
        try:
            received = session.receive(request)
        except (LimitExceeded, ProtocolError) as error:
            return self._refused(error, peer)
        return session, _change_of(received, type_url)

    async def _received_in_pieces(self, request: SotwRequest, type_url: str, peer: str
                                  ) -> tuple[None, InterestChange] | Limited | Invalid:
        """:meth:`_received` for a request of many plain names (:func:`_chunkable`),
        its names received a slice at a time (``per_slice``), a turn between
        two, each slice by a session of its own (a name's parameters are its
        own and the node's, as :meth:`_answer_in_chunks` has it): received
        whole, 50,000 names held the loop 32-60 ms in one step.

        The slices' interest changes add up to the whole's, and nothing is
        held until they do (the sessions are the fetch's own). What a slice
        cannot know (how many names the request has, how many the stream
        would hold) and whatever a slice refuses is left to the whole: such a
        request is received whole, to be refused as it says (a refusal names
        what is wrong in all of it, e.g. its longest name). No session is
        kept (None): the answer is made in chunks.
        """
        names, limits = request.resource_names, self._serving.settings.limits
        template = discovery_pb2.DiscoveryRequest()
        template.CopyFrom(cast(discovery_pb2.DiscoveryRequest, request))
        template.ClearField("resource_names")
        added: dict[str, Params] = {}
        first: InterestChange | None = None
        for start in range(0, len(names) if len(names) <= limits.names_per_request else 0,
                           self._per_slice):
            await self._turn()
            part = discovery_pb2.DiscoveryRequest()
            part.CopyFrom(template)
            part.resource_names.extend(names[start:start + self._per_slice])
            try:
                change = _change_of(self._session(type_url).receive(part), type_url)
            except (LimitExceeded, ProtocolError):
                first = None
                break
            first = first or change
            added.update(change.added)
            self.pieces_received += 1
        if first is None or len(added) > limits.names_per_stream:
            taken = self._received(request, type_url, peer)
            return taken if not isinstance(taken, tuple) else (None, taken[1])
        return None, InterestChange(added, {}, first.wildcard, first.globs)

    def _whole(self, request: SotwRequest, type_url: str, peer: str) -> Session:
        """The session of :meth:`_received` for a request received in slices."""
        taken = self._received(request, type_url, peer)
        assert isinstance(taken, tuple)
        return taken[0]

    def _session(self, type_url: str) -> Session:
        """A fresh session: a fetch's, as a stream's first request finds it."""
        settings = self._serving.settings
        return Session("sotw", type_url, settings.max_locator_size, settings.limits)

    def _refused(self, error: LimitExceeded | ProtocolError, peer: str) -> Limited | Invalid:
        """The outcome of a request a session refused (counted and logged when
        over a limit)."""
        if isinstance(error, LimitExceeded):
            serving = self._serving
            serving.metrics.downstream_limited.add(1, {"limit": error.limit})
            serving.warn_limited(peer, error.limit, "refusing fetch from %s: %s", peer, error)
            return Limited(error.limit, str(error))
        return Invalid(str(error))

    def unchanged(self, served: Served) -> bool:
        """Whether ``served`` is still the answer to the request it answered,
        and if so renew its lease, as that request would: its lease is held
        (not lapsed, nothing of it refused) and has seen no change since.

        What the request may have asked and how it is checked (limits,
        ``server.authorization``) is the same for the same request, so the
        caller that knows the request is the same (REST: the same body,
        identity and settings) answers it again in O(1), not in its names.
        """
        lease, generation = served.lease, served.generation
        if lease is None or generation is None or lease.refused or \
                lease.generation != generation or self._leases.get(lease.key) is not lease:
            return False
        lease.expires = self._clock.now() + self.lease
        self._leases.move_to_end(lease.key)
        return True

    async def _answer(self, session: Session, view: ResourceView, request: SotwRequest,
                      many: bool) -> SotwResponsePlan | None:
        """The session's response, whole.

        A stream gets more than :data:`MAX_NAMES_PER_RESPONSE` names of a type
        that is not full-state over several responses, each ACKed before the
        next; a fetch has one, so when it may have ``many`` names, the parts
        are ACKed here and joined, the loop given a turn between two.
        """
        parts: list[SotwResponsePlan] = []
        while True:
            if parts:
                await self._turn()
            due = session.due(view)
            if not due.responses:
                break
            part = due.responses[0]
            assert isinstance(part, SotwResponsePlan)
            parts.append(part)
            if not many:
                break  # the whole of it (the common case: no copy of the request)
            ack = type(request)()
            ack.CopyFrom(request)
            ack.ClearField("node")
            ack.response_nonce, ack.version_info = part.nonce, part.version_info
            session.receive(ack)
        if len(parts) <= 1:
            return parts[0] if parts else None
        return _joined(parts, parts[-1].version_info)

    async def _answer_in_chunks(self, view: ResourceView, request: SotwRequest,
                                type_url: str) -> SotwResponsePlan | None:
        """:meth:`_answer` for many plain names, the same response in linear time.

        A stream's responses of many names are pages, each ACKed with the
        whole subscription before the next: joined, a fetch of N names
        would cost N / :data:`MAX_NAMES_PER_RESPONSE` times N. Instead the
        names, sorted, are answered a page's worth at a time, each by a
        session of its own (what decides a name's entry is the name, its
        parameters and the node, never its neighbours), and the pages are
        joined in order, as a stream's are; the version of the whole is the
        sum of the pages' (``state_version`` is a sum of one term per
        resource). The loop is given a turn before each page: each reads
        the cache as it is then, and its version is that of what it holds.
        """
        template = discovery_pb2.DiscoveryRequest()
        template.CopyFrom(cast(discovery_pb2.DiscoveryRequest, request))
        template.ClearField("resource_names")
        names = await made_in_turns(sorted_slices(request.resource_names), self._turn)
        parts: list[SotwResponsePlan] = []
        settings = self._serving.settings
        # (what decides a page is its names: pages of fewer names join to the same)
        page = min(self._per_slice, NAMES_PER_PAGE)
        for start in range(0, len(names), page):
            if len(names) > page:  # (the first after the sort's merge)
                await self._turn()
            part = discovery_pb2.DiscoveryRequest()
            part.CopyFrom(template)
            part.resource_names.extend(names[start:start + page])
            session = Session("sotw", type_url, settings.max_locator_size, settings.limits)
            session.receive(part)
            # one response: a fetch's session has no byte budget (max_response_size)
            answered = await self._answer(session, view, part, many=False)
            if answered is not None:
                parts.append(answered)
        if not parts:
            return None
        return _joined(parts, _version_sum(part.version_info for part in parts))

    async def _wait(self, lease: Lease | None, view: ResourceView, type_url: str,
                    wanted: Mapping[str, Params], wildcard: bool, since: int) -> Unanswered:
        """Until the cache answers for everything wanted, or the lease's wait is over."""
        serving, clock = self._serving, self._clock
        deadline = lease.subscribed_at + self.wait if lease is not None else clock.now()
        refetched = False
        while True:
            changed = lease.changed if lease is not None else None
            waiting = await made_in_turns(unanswered_slices(
                view, type_url, wanted, wildcard, view.holds_wildcard(type_url), since,
                self._per_slice), self._turn)
            if waiting.stale and not refetched:
                # Fresh copies for this fetch: worth a wait of its own.
                serving.index.request_refetch(type_url, waiting.stale)
                refetched = True
                deadline = max(deadline, clock.now() + self.wait)
            if not waiting or changed is None or clock.now() >= deadline:
                return waiting
            await wait_until(clock, changed, deadline)
            # Only what was still missing needs looking at again.
            wanted = {name: wanted[name] for name in waiting.missing | waiting.stale
                      if name in wanted}
            wildcard = wildcard and "*" in waiting.missing

    async def _renew(self, key: LeaseKey, change: InterestChange, host: str | None
                     ) -> Lease | Limited | None:
        """The lease of what ``change`` subscribes (its key: :func:`_lease_key`),
        renewed, or a new one (registered with the interest index, its names
        counting against ``host``'s share of the upstream demand); None when
        it subscribes nothing.

        A lease being registered (in pieces, see :meth:`_register`) is
        waited for by a poll of the same resources, which then takes it, or
        tries afresh if it was refused: two leases of one key would leave
        one in the index that no lapse ever removes.
        """
        if not change:
            return None
        while (registering := self._registering.get(key)) is not None:
            await registering.done.wait()
        lease = self._leases.get(key)
        if lease is not None and not lease.refused:
            lease.expires = self._clock.now() + self.lease
            self._leases.move_to_end(key)
            return lease
        registration = self._registering[key] = _Registration()
        try:
            if lease is not None:  # what the origin refused is asked afresh (and refused)
                self._drop(lease)
                await self._forget(lease)
            return await self._new_lease(key, change, host, registration)
        finally:
            del self._registering[key]
            registration.done.set()

    async def _new_lease(self, key: LeaseKey, change: InterestChange, host: str | None,
                         registration: _Registration) -> Lease | Limited:
        """A lease of ``key``, registered (see :meth:`_renew`), or why not."""
        limits = self._serving.settings.limits
        # (the others being registered count: this one is among them)
        if len(self._leases) + len(self._registering) > limits.streams:
            return Limited("streams", f"the relay holds {len(self._leases)} polling "
                           f"subscriptions, its most (limits.streams); poll another replica")
        if host is not None and self._per_host[host] >= limits.leases_per_host:
            return Limited("leases_per_host", (
                f"{shown(host, 64)} keeps {self._per_host[host]} polled resource sets "
                f"subscribed, the most one client host may (limits.leases_per_host); each "
                f"lapses rest.lease after its last poll"))
        now = self._clock.now()
        lease = Lease(key, now, now + self.lease, host)
        registration.lease = lease
        if host is not None:
            self._per_host[host] += 1  # (from now: a poll of another key counts it)
        try:
            refused = await self._register(lease, change, host)
        except BaseException:  # (cancelled: it holds nothing)
            self._unhost(host)
            raise
        if refused is not None:
            self._unhost(host)
            return refused
        lease.expires = self._clock.now() + self.lease  # (the order of _leases: of expiry)
        self._leases[key] = lease
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._expire(),
                                                                  name="fetch-leases")
        return lease

    async def _register(self, lease: Lease, change: InterestChange, host: str | None
                        ) -> Limited | None:
        """Register a new ``lease`` with the interest index, ``per_piece``
        names a turn of the event loop (one call of 50,000 names held the
        loop 47-92 ms), as a delta stream applies a big request; or why not.

        The pieces add up to ``change``: the index ends as one call would
        leave it. A piece beyond the upstream demand's bounds is refused
        whole (the index applies nothing of it), what the pieces before it
        took is given back, and the change is checked whole again, to be
        refused as one call is, saying how many names the whole would add
        (or taken at once, should others have made room meanwhile). A fetch
        cancelled between two pieces leaves nothing held either.
        """
        index, type_url = self._serving.index, lease.type_url
        try:
            try:
                for number, piece in enumerate(_pieces(change, self._per_piece)):
                    if number:
                        await self._turn()
                    index.apply(lease, type_url, piece, host)
                return None
            except LimitExceeded:
                await self._forget(lease)
            index.apply(lease, type_url, change, host)
            return None
        except LimitExceeded as error:  # (the whole change: nothing of it was applied)
            return Limited(error.limit, str(error))
        except BaseException:
            index.remove(lease)  # (at once: no turn may be awaited now)
            raise

    async def _forget(self, lease: Lease) -> None:
        """Have the interest index forget ``lease``, a slice of names per turn."""
        while not self._serving.index.remove(lease, NAMES_PER_TURN):
            await self._turn()

    async def _expire(self) -> None:
        """Drop each lease once it lapses, until none is left."""
        never = asyncio.Event()  # nothing wakes the reaper early: renewals only extend
        while self._leases:
            first = next(iter(self._leases.values()))
            if first.expires > self._clock.now():
                await wait_until(self._clock, never, first.expires)
                continue
            self._drop(first)
            log.debug("fetch lease of %d %s names lapsed", len(first.key[2]),
                      short_name(first.type_url))
            # A lease of many names is forgotten in slices, as a stream's is.
            while not self._serving.index.remove(first, NAMES_PER_TURN):  # noqa: ASYNC110
                await asyncio.sleep(0)

    def close(self) -> None:
        """Drop every lease at once (the relay stops: no fetch is in progress)."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for lease in [*self._leases.values(),
                      *(r.lease for r in self._registering.values() if r.lease)]:
            self._serving.index.remove(lease)
        self._leases.clear()
        self._per_host.clear()

    def _drop(self, lease: Lease) -> None:
        """Forget ``lease`` here (the index forgets it separately, maybe in slices)."""
        del self._leases[lease.key]
        self._unhost(lease.host)

    def _unhost(self, host: str | None) -> None:
        """One lease fewer counts against ``host`` (None: none did)."""
        if host is not None:
            left = self._per_host[host] - 1
            if left > 0:
                self._per_host[host] = left
            else:
                del self._per_host[host]

    async def aclose(self) -> None:
        """:meth:`close`, and wait for the reaper to end."""
        reaper = self._reaper
        self.close()
        await ended(reaper)


class _Registration:
    """A lease being registered (None: not made yet), and what is set when it is done."""

    __slots__ = ("done", "lease")

    def __init__(self) -> None:
        self.lease: Lease | None = None
        self.done = asyncio.Event()


def _lease_key(type_url: str, change: InterestChange, scope: Hashable) -> LeaseKey:
    """The key of the lease of what ``change`` subscribes (see :data:`LeaseKey`)."""
    added = change.added
    params = set(added.values())
    if len(params) == 1:
        return type_url, bool(change.wildcard), frozenset(added), params.pop(), scope
    return type_url, bool(change.wildcard), frozenset(added.items()), None, scope


def _pieces(change: InterestChange, size: int) -> Iterator[InterestChange]:
    """``change`` as changes of ``size`` added names at most, which, applied
    in order, are the change: its removals go first, its wildcard last (as one
    call applies them), each piece with the glob collections it adds."""
    added = change.added
    if len(added) <= size:
        yield change
        return
    items = iter(added.items())
    left = len(added)
    removed: Mapping[str, Params] = change.removed
    while left > 0:
        piece = dict(itertools.islice(items, size))
        left -= len(piece)
        yield InterestChange(piece, removed, change.wildcard if left == 0 else None,
                             change.globs.intersection(piece) if change.globs else frozenset())
        removed = {}


def _change_of(received: Received, type_url: str) -> InterestChange:
    """How a received request changed the interest in ``type_url`` (none: empty)."""
    return next((c for t, c in received.interest if t == type_url), InterestChange())


def _chunkable(request: SotwRequest) -> bool:
    """Whether a request of many names may be answered in chunks of names
    (:meth:`Fetcher._answer_in_chunks`): plain names only, no locators and
    no collection (whose members sort among the other names). (Their
    text joined is searched once: 50,000 names 1 ms, a loop over them 6.)"""
    return not request.resource_locators and "*" not in "".join(request.resource_names)


def sorted_slices(names: Iterable[str], per_slice: int = NAMES_PER_SORT
                  ) -> Generator[None, None, list[str]]:
    """``sorted(set(names))``, pausing (yielding) after each ``per_slice``
    names deduplicated, after each ``per_slice`` sorted and before the
    sorted runs are merged.

    Made at once, 50,000 names in a hash set's order took 20-40 ms. The
    names deduplicated in their order (a client's is often near sorted,
    which sorts in ~n), each slice sorted on its own, and the runs sorted
    together: the sort finds them and merges them in ~n log(runs). (Read
    out of a request and deduplicated at once, 50,000 names took 13-15 ms.)
    """
    found: dict[str, None] = {}
    left = iter(names)
    while some := list(itertools.islice(left, per_slice)):
        if found:
            yield
        found.update(dict.fromkeys(some))
    unique = list(found)
    if len(unique) <= per_slice:
        return sorted(unique)
    merged: list[str] = []
    for start in range(0, len(unique), per_slice):
        yield
        merged += sorted(unique[start:start + per_slice])
    yield
    merged.sort()
    return merged


def _joined(parts: list[SotwResponsePlan], version_info: str) -> SotwResponsePlan:
    """The responses ``parts``, in order, as one of ``version_info``."""
    last = parts[-1]
    return SotwResponsePlan(
        last.type_url, last.nonce, version_info,
        [resource for part in parts for resource in part.resources],
        frozenset().union(*(part.wrapped for part in parts)),
        [error for part in parts for error in part.errors])


def _version_sum(versions: Iterable[str]) -> str:
    """The ``version_info`` of states held together, from each one's: the sum of
    their terms (see :func:`relay.protocol.sotw.state_version`), written as a
    state's version is."""
    return f"{sum(int(version, 16) for version in versions) % (1 << 64):016x}"


def _not_yet(type_url: str, waiting: Unanswered) -> str:
    """Why a fetch has nothing to answer with yet."""
    what = short_name(type_url)
    names = sorted(waiting.missing - {"*"} | waiting.stale)
    if not names:
        return (f"the relay has not yet received the {what} resources from its origin; it "
                f"has subscribed to them: ask again shortly")
    return (f"the relay has not yet received {len(names)} of these {what} resources from "
            f"its origin (the first: {shown(names[0], 200)!r}); it has subscribed to them: "
            f"ask again shortly")
