"""Incremental (delta) xDS: one stream's subscription state for one type.

:class:`DeltaSubscription` consumes ``DeltaDiscoveryRequest`` messages and
cache change notices, and answers :meth:`~DeltaSubscription.next_response`
with what to send, or ``None``. It keeps at most one response in flight: while
one is un-ACKed, changes pile up as a set of names (latest state wins, bounded
by the subscription) and go out together once the client answers. What does
not fit in one response (``max_size`` bytes) goes in the next, after the ACK.

A subscription to a glob collection (``xdstp://AUTHORITY/TYPE/PATH/*``)
covers the members the cache has of it, as they come and go; an xdstp name
goes back to the client as it spelled it (see :mod:`relay.protocol.spelling`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, cast

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ABSENT, UNKNOWN
from relay.constraints import params_of
from relay.encoding import field_size, text_size
from relay.protocol.cycle import IDLE, NEW, OWED
from relay.protocol.held import Declared, Held
from relay.protocol.outcome import RequestOutcome
from relay.protocol.requests import DeltaRequest, ErrorDetail, ResourceLocator
from relay.protocol.sizing import ResponseBudget
from relay.protocol.snapshot import ResourceStatus
from relay.protocol.spelling import respelled
from relay.protocol.subscription import SubscriptionState
from relay.protocol.view import NonceSource, ResourceView
from relay.protocol.xdstp import collection_of, in_request, is_glob
from relay.resource import CachedResource
from relay.xds_types import LEGACY_WILDCARD_TYPES, WILDCARD


@dataclass(slots=True)
class DeltaResponsePlan:
    """One DeltaDiscoveryResponse to send."""

    type_url: str
    nonce: str
    resources: list[CachedResource]
    removed: list[str]
    # variants that went out with constraints are removed by name + constraints
    removed_names: list[discovery_pb2.ResourceName] = field(default_factory=list)
    errors: list[discovery_pb2.ResourceError] = field(default_factory=list)
    # resources confirmed by an origin heartbeat: sent without their body
    heartbeats: list[CachedResource] = field(default_factory=list)
    # the resources' ``delta_entry``, where the response's page read them
    # already to size it (None: the encoder reads them)
    entries: list[bytes] | None = None

    def head(self) -> discovery_pb2.DeltaDiscoveryResponse:
        """The response without its resources (they are appended pre-encoded)."""
        return discovery_pb2.DeltaDiscoveryResponse(
            type_url=self.type_url, nonce=self.nonce, removed_resources=self.removed,
            removed_resource_names=self.removed_names, resource_errors=self.errors)

    def only_removes(self) -> bool:
        return not self.resources and bool(self.removed or self.removed_names)


_NOTHING: set[str] = set()  # never added to

# The most names one piece of a request carries (see :func:`split_request`).
MAX_NAMES_PER_PIECE = 2_000


def split_request(request: discovery_pb2.DeltaDiscoveryRequest,
                  limit: int = MAX_NAMES_PER_PIECE) -> list[discovery_pb2.DeltaDiscoveryRequest]:
    """A request naming more than ``limit`` names as several, each naming at
    most ``limit``: the same changes, in the same order, as a client could have
    sent them. The first piece keeps everything else (node, nonce, NACK,
    initial versions). The stream applies one piece per turn of the event
    loop, so that a client subscribing to 100,000 names holds up nobody."""
    if _named(request) <= limit:
        return [request]  # nearly always (every ACK): checked without a loop
    pieces, _ = _split(request, limit, None)
    return pieces


def read_in_pieces(request: discovery_pb2.DeltaDiscoveryRequest,
                   limit: int = MAX_NAMES_PER_PIECE
                   ) -> tuple[list[DeltaRequest], DeltaRequest]:
    """``(pieces, whole)``: :func:`split_request`'s pieces, and the request
    whole to check, with the names it subscribes read out of the message once
    (see :class:`Subscribing`), not by each step: the whole request's check
    (its names' lengths, its xdstp names), the split and each piece's
    receive each read a 10,000-name field anew, making every string each
    time. A request of at most ``limit`` names is its own only piece, as it
    came (``pieces == [request]``)."""
    if _named(request) <= limit:
        return [request], request
    names = list(request.resource_names_subscribe)  # (the one read)
    made, chunks = _split(request, limit, names)
    # (a Subscribing is a DeltaRequest whose fields are read-only)
    pieces = [piece if chunk is None else cast(DeltaRequest, Subscribing(piece, chunk))
              for piece, chunk in zip(made, chunks, strict=True)]
    return pieces, cast(DeltaRequest, Subscribing(request, names))


def _named(request: discovery_pb2.DeltaDiscoveryRequest) -> int:
    """How many names ``request`` carries, in all its lists."""
    return len(request.resource_names_subscribe) + len(request.resource_locators_subscribe) + \
        len(request.resource_names_unsubscribe) + len(request.resource_locators_unsubscribe)


_LISTS = ("resource_names_subscribe", "resource_locators_subscribe",
          "resource_names_unsubscribe", "resource_locators_unsubscribe")


def _split(request: discovery_pb2.DeltaDiscoveryRequest, limit: int, names: list[str] | None
           ) -> tuple[list[discovery_pb2.DeltaDiscoveryRequest], list[list[str] | None]]:
    """The pieces of :func:`split_request`, and per piece the names it
    subscribes where ``names`` (the request's, read out already) are given:
    then they are not written into the pieces (None: the piece subscribes
    none by name, or carries them)."""
    pieces = [_all_but_the_lists(request, _LISTS)]
    chunks: list[list[str] | None] = [None]
    room = limit
    for field_name in _LISTS:
        side = names is not None and field_name == "resource_names_subscribe"
        items: Sequence[Any] = names if side and names is not None else \
            getattr(request, field_name)
        start = 0
        while start < len(items):
            if room == 0:
                pieces.append(discovery_pb2.DeltaDiscoveryRequest(type_url=request.type_url))
                chunks.append(None)
                room = limit
            chunk = items[start:start + room]
            if side:  # (the first list: at most one chunk a piece)
                chunks[-1] = list(chunk)
            else:
                getattr(pieces[-1], field_name).extend(chunk)
            start += len(chunk)
            room -= len(chunk)
    return pieces, chunks


class Subscribing:
    """A delta request whose ``resource_names_subscribe`` are a list read out
    of the message already (a message field makes every string anew at each
    read); every other field is the message's own. What
    :func:`read_in_pieces` hands the session: its message need not carry the
    names at all (a piece's do not), and nothing reads them from it."""

    __slots__ = ("_message", "resource_names_subscribe")

    def __init__(self, message: discovery_pb2.DeltaDiscoveryRequest, names: list[str]) -> None:
        self._message = message
        self.resource_names_subscribe: Sequence[str] = names

    @property
    def type_url(self) -> str:
        return self._message.type_url  # type: ignore[no-any-return]

    @property
    def response_nonce(self) -> str:
        return self._message.response_nonce  # type: ignore[no-any-return]

    @property
    def node(self) -> base_pb2.Node:
        return self._message.node

    @property
    def error_detail(self) -> ErrorDetail:
        return self._message.error_detail  # type: ignore[no-any-return]

    @property
    def resource_names_unsubscribe(self) -> Sequence[str]:
        return self._message.resource_names_unsubscribe  # type: ignore[no-any-return]

    @property
    def resource_locators_subscribe(self) -> Sequence[ResourceLocator]:
        return self._message.resource_locators_subscribe  # type: ignore[no-any-return]

    @property
    def resource_locators_unsubscribe(self) -> Sequence[ResourceLocator]:
        return self._message.resource_locators_unsubscribe  # type: ignore[no-any-return]

    @property
    def initial_resource_versions(self) -> Mapping[str, str]:
        return self._message.initial_resource_versions  # type: ignore[no-any-return]

    def HasField(self, field_name: str) -> bool:
        return self._message.HasField(field_name)  # type: ignore[no-any-return]


def _all_but_the_lists(request: discovery_pb2.DeltaDiscoveryRequest,
                       lists: tuple[str, ...]) -> discovery_pb2.DeltaDiscoveryRequest:
    """``request`` without its name lists: built field by field, not copied
    whole and then cleared (for a client of 100,000 names, the copy was most of
    the request's memory a second time, at the peak of the subscription)."""
    first = discovery_pb2.DeltaDiscoveryRequest()
    for descriptor, value in request.ListFields():
        if descriptor.name in lists:
            continue
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            getattr(first, descriptor.name).update(value)
        elif descriptor.message_type is not None:
            getattr(first, descriptor.name).CopyFrom(value)
        else:
            setattr(first, descriptor.name, value)
    return first


class DeltaSubscription(SubscriptionState):
    """Delta protocol state of one type on one stream."""

    __slots__ = ("_resend", "_unanswered")

    _serves_globs = True

    def __init__(self, type_url: str) -> None:
        super().__init__(type_url)
        # subscribed names not yet answered with a resource or a removal
        # (None once all are answered, as they nearly always are)
        self._unanswered: set[str] | None = None
        # names subscribed again while held: sent again even if unchanged
        # (None while empty, as it nearly always is)
        self._resend: set[str] | None = None

    # -- input -----------------------------------------------------------

    def on_request(self, request: DeltaRequest,
                   subscribing: Sequence[str] | None = None) -> RequestOutcome:
        """Apply one request: ACK/NACK bookkeeping and subscription changes.

        Costs what the request names, never the whole subscription.
        ``subscribing``: its ``resource_names_subscribe`` read out already.
        """
        outcome = RequestOutcome()
        first = self._cycle.start()
        if self._cycle.awaits(request.response_nonce):
            self._take_reply(request, outcome)
        # A stale nonce still carries valid subscription changes: apply them.
        if not (request.resource_names_subscribe or request.resource_locators_subscribe or
                request.resource_names_unsubscribe or
                request.resource_locators_unsubscribe or first):
            return outcome  # a plain ACK: the bulk of all traffic
        self._subscribe_from(request, first, subscribing)
        self._unsubscribe_from(request)
        return outcome

    def on_reply(self, request: DeltaRequest) -> RequestOutcome | None:
        """:meth:`on_request` for a request that names nothing and is not the
        type's first: an ACK or NACK (or one of a stale nonce), the bulk of
        all traffic; None for any other (:meth:`on_request` takes it).

        Such a request changes no subscription: the session need not check
        its names nor ask what the interest index must learn (nothing).
        """
        if request.resource_names_subscribe or request.resource_locators_subscribe or \
                request.resource_names_unsubscribe or \
                request.resource_locators_unsubscribe or self._cycle.phase is NEW:
            return None
        outcome = RequestOutcome()
        if self._cycle.awaits(request.response_nonce):
            self._take_reply(request, outcome)
        return outcome

    def _subscribe_from(self, request: DeltaRequest, first: bool,
                        listed: Sequence[str] | None) -> None:
        """What ``request`` subscribes (and, the first, declares it holds)."""
        if listed is None:
            listed = list(request.resource_names_subscribe)
        subscribe = set(listed)
        params = {loc.name: params_of(loc.dynamic_parameters)
                  for loc in request.resource_locators_subscribe}
        subscribe.update(params)
        xdstp = self._canonical(subscribe, params, spell=True, listed=listed) \
            if subscribe else []
        globs = {name for name in xdstp if is_glob(name)} if xdstp else None
        if first:
            self._held = self._declared(request)
            if not subscribe and self._type_url in LEGACY_WILDCARD_TYPES:
                self._start_wildcard()
            # Whatever the client says it holds must be checked against the cache.
            self._add_pending(self._held)
        if WILDCARD in subscribe:
            subscribe.discard(WILDCARD)
            params.pop(WILDCARD, None)
            if not self._wildcard:
                self._start_wildcard()
        if subscribe:
            if not first:
                # The client may have dropped what it holds: always send a
                # subscribed name. (What it held is kept, so that a removal
                # can name the variant.)
                again = subscribe & self._held.keys()
                if globs:  # and what the client holds of a collection
                    again.update(n for n in self._held if collection_of(n) in globs)
                if again:
                    self._resend = again | (self._resend or set())
            self._subscribe_names(subscribe, params, listed)
            if globs:
                self._globs = globs | (self._globs or set())
                # (a collection is never answered by its own name)
                subscribe = subscribe - globs
            # (added to in place: a request in pieces, 2,000 names each, copied
            # what the pieces before had added, once per piece)
            if self._unanswered is None:
                self._unanswered = subscribe  # (a set of this request's own)
            else:
                self._unanswered |= subscribe

    def _declared(self, request: DeltaRequest) -> dict[str, Held]:
        """What the first request says the client holds, xdstp names canonical."""
        held: dict[str, Held] = {name: Declared(version)
                                 for name, version in request.initial_resource_versions.items()}
        if held:
            for name, canon in in_request(held.keys(), self._type_url, True).items():
                if canon != name:
                    held[canon] = held.pop(name)
                    self._spell(canon, name)
        return held

    def _unsubscribe_from(self, request: DeltaRequest) -> None:
        """What ``request`` unsubscribes."""
        unsubscribe = set(request.resource_names_unsubscribe)
        unsubscribe.update(loc.name for loc in request.resource_locators_unsubscribe)
        if unsubscribe:
            self._canonical(unsubscribe)
        if WILDCARD in unsubscribe:
            unsubscribe.discard(WILDCARD)
            self._wildcard = False
            self._recheck_all = False
            for held_name in [n for n in self._held if not self._covers(n)]:
                del self._held[held_name]
        collections = self._globs & unsubscribe if self._globs else None
        gone = self._unsubscribe_names(unsubscribe)
        if collections:
            # The client drops what it holds of a collection with it.
            gone |= {n for n in self._held if collection_of(n) in collections and
                     n not in self._names}
        if gone:
            if self._unanswered:
                self._unanswered -= gone
            if self._resend:
                self._resend -= gone
            for name in gone:
                self._held.pop(name, None)
            if self._wildcard:
                # The client dropped them, but wildcard still covers them: send
                # them again, or report them removed if they are gone.
                if collections:
                    gone -= collections
                self._unanswered = gone | (self._unanswered or set())
                self._add_pending(gone)

    def only_first_answers(self, view: ResourceView) -> bool:
        # A change of names the client holds (an update, a removal) is not
        # one. Lengths first, then the cache (which stops at the first name
        # it lacks: all but the last of a cold join's changes), then the set
        # compares (in C, ~0.1 ms a 10,000), once.
        unanswered, pending = self._unanswered, self._pending
        if not unanswered or self._backlog:
            return False
        recheck = self._recheck_all
        if (self._wildcard if recheck else len(unanswered) != len(pending)) or \
                not view.serves_every(self._type_url, unanswered):
            return False
        # (every name looked at, as at the type's first answer: every one
        # subscribed must be waiting, none held)
        return self._names <= unanswered and pending <= unanswered if recheck \
            else unanswered == pending

    def _start_wildcard(self) -> None:
        super()._start_wildcard()
        self._cycle.owe()  # Envoy waits for the first wildcard answer

    # -- output ----------------------------------------------------------

    def next_response(self, view: ResourceView, nonces: NonceSource,
                      max_size: int | None = None) -> DeltaResponsePlan | None:
        """The response to send now, if any (none while one is in flight), of
        at most ``max_size`` bytes unless one resource alone is larger: what
        does not fit waits for the next response."""
        pending = self._pending
        if len(pending) == 1 and self._cycle.phase is IDLE and self._backlog is None and \
                not self._recheck_all and self._globs is None and self._spelled is None and \
                not self._pending_heartbeats and not self._errors_sent:
            plan = self._one_changed(view, nonces, pending)
            if plan is not None:
                return plan
        return self._paged(lambda: self._next_page(view, nonces, max_size))

    def _one_changed(self, view: ResourceView, nonces: NonceSource,
                     pending: AbstractSet[str]) -> DeltaResponsePlan | None:
        """The response to the one name marked, where it sends that name's
        resource: a push of one changed resource, to each stream of the
        fan-out. What :meth:`_next_page` sends then (one resource fits any
        empty response), without its page, budget, sets and generator; None,
        changing nothing, where :meth:`_next_page` must look (nothing to
        send, a removal, an error, a do-not-cache copy).

        The caller saw the rest plain: no backlog, heartbeats, globs,
        respellings or errors told, nothing in flight or owed.
        """
        type_url = self._type_url
        [name] = pending
        if not (self._wildcard or name in self._names) or not view.is_synced(type_url) or \
                view.has_errors(type_url):
            return None
        found = view.lookup(type_url, name, self._locator_params.get(name, self._node_params))
        if not isinstance(found, CachedResource) or found.do_not_cache:
            return None
        held, resend = self._held.get(name), self._resend
        if held is not None and held.is_current(found) and not (resend and name in resend):
            return None
        self._looked_at_everything()
        self._pages_taken += 1
        self._held[name] = found
        if resend:
            resend.discard(name)
            self._resend = resend or None
        unanswered = self._unanswered
        if unanswered:
            unanswered.discard(name)
            self._unanswered = unanswered or None
        return self._emit(nonces, [found], [], [], [], [])

    def _next_page(self, view: ResourceView, nonces: NonceSource,
                   max_size: int | None) -> DeltaResponsePlan | None:
        """:meth:`next_response` from the next page of names (none: nothing in it to send)."""
        if not self._answerable(view):
            return None
        candidates = self._take_candidates(
            view, lambda: (*self._names, *self._held, *(self._unanswered or ()), *self._pending))
        resources: list[CachedResource] = []
        sending: set[int] = set()  # ids of ``resources``: a name and its alias, once
        removed: dict[str, None] = {}  # subscribed by name and by alias: once
        removed_names: dict[tuple[str, str], discovery_pb2.ResourceName] = {}
        errors: list[discovery_pb2.ResourceError] = []
        budget = ResponseBudget(max_size, self._type_url)
        held_now, unanswered = self._held, self._unanswered or _NOTHING
        resend = self._resend or _NOTHING
        # full_at: the first name the response had no room for
        served, all_new, full_at, entries = self._whole_pages(view, candidates, budget)
        for name, found in () if all_new is not None else \
                self._lookups(view, candidates, errors, budget, served):
            if found is UNKNOWN:
                continue
            if found is ABSENT:
                held = held_now.get(name)
                if (held is not None or name in unanswered) and \
                        not self._removal(name, held, budget, removed, removed_names):
                    full_at = name
                    break
                if resend:
                    resend.discard(name)
                held_now.pop(name, None)
                unanswered.discard(name)
                continue
            assert isinstance(found, CachedResource)
            if found.do_not_cache and self._stale(found, name):
                continue  # fetched before we asked: not ours to reuse
            held = held_now.get(name)
            if held is None or not held.is_current(found) or name in resend:
                # Moving to another variant is one update, never remove-then-add.
                if id(found) not in sending:
                    if not budget.take(len(found.delta_entry)):
                        full_at = name
                        break
                    sending.add(id(found))
                    resources.append(found)
                if resend:
                    resend.discard(name)
                held_now[name] = found
            unanswered.discard(name)
        if all_new is not None:
            resources = all_new
        elif full_at is not None:
            self._leave_for_next(candidates, full_at)
        # (emptied sets go back to None: an idle stream keeps none)
        self._resend, self._unanswered = self._resend or None, self._unanswered or None
        heartbeats = self._heartbeats_that_fit(resources, view, budget, full_at is not None)
        if not (resources or removed or removed_names or errors or heartbeats or
                self._cycle.phase is OWED):
            return None
        return self._emit(nonces, resources, list(removed), list(removed_names.values()),
                          errors, heartbeats, entries if all_new is not None else None)

    def _took_whole(self, served: Mapping[str, CachedResource], names: list[str]) -> None:
        super()._took_whole(served, names)
        for waiting in (self._unanswered, self._resend):
            if waiting:
                waiting.difference_update(names)

    def _emit(self, nonces: NonceSource, resources: list[CachedResource], removed: list[str],
              removed_names: list[discovery_pb2.ResourceName],
              errors: list[discovery_pb2.ResourceError],
              heartbeats: list[CachedResource], entries: list[bytes] | None = None
              ) -> DeltaResponsePlan:
        """The response, under a new nonce, with every name as the client
        asked for it (see :mod:`relay.protocol.spelling`); ``entries``: the
        resources' own, if read already."""
        nonce = nonces.next()
        self._cycle.sent(nonce, "", resources)
        plan = DeltaResponsePlan(self._type_url, nonce, resources, removed, removed_names,
                                 errors, heartbeats, entries)
        return plan if self._spelled is None else respelled(plan, self._spelled)

    @staticmethod
    def _removal(name: str, held: Held | None, budget: ResponseBudget,
                 removed: dict[str, None],
                 removed_names: dict[tuple[str, str], discovery_pb2.ResourceName]) -> bool:
        """Tell the client ``name`` is gone (held, or subscribed and never
        answered), once per resource; whether ``budget`` had room."""
        if held is not None and held.resource_name is not None:
            key = (held.resource_name.name, held.variant_key or "")
            if key not in removed_names:
                if not budget.take(field_size(held.resource_name.ByteSize())):
                    return False
                removed_names[key] = held.resource_name
            return True
        # A resource subscribed by alias went out under its own name.
        gone = (held.name or name) if held else name
        if gone not in removed:
            if not budget.take(text_size(gone)):
                return False
            removed[gone] = None
        return True

    @staticmethod
    def _heartbeat_bytes(resource: CachedResource) -> bytes:
        return resource.heartbeat_entry

    # -- snapshot ----------------------------------------------------------

    def _held_status(self, name: str, held: Held) -> ResourceStatus:
        sent = (held.name or name, held.version)
        if self._cycle.in_flight is not None and self._cycle.carries(*sent):
            return ResourceStatus.SENT
        last_nack = self._cycle.last_nack
        if last_nack is not None and sent in last_nack.resources:
            return ResourceStatus.NACKED
        # Answered with an ACK, or declared by the client in initial_resource_versions.
        return ResourceStatus.ACKED

    def _told_absent(self, name: str) -> bool:
        # Subscribed names leave ``_unanswered`` with the resource or its removal.
        return not self._unanswered or name not in self._unanswered

    def _acked(self) -> str | None:
        return self._cycle.acked_nonce
