"""What the delta and SotW subscription states share.

Both track, for one type on one stream, which names the client subscribed to
(with which dynamic parameters), what it holds, and which names to look at
again before the next response. They differ in how requests are read and
what a response looks like; see :mod:`relay.protocol.delta` and
:mod:`relay.protocol.sotw`. The rules they have in common live here once:
subscribing a name, re-evaluating after a cache change or a parameter
change, passing on the origin's errors and heartbeats, refusing to serve a
do-not-cache copy fetched before the client asked, and what the snapshot
says a client holds.

The request/response/ACK cycle both follow is a
:class:`~relay.protocol.cycle.Cycle`, one per state; whether a response may
be due (:meth:`SubscriptionState.has_work`) is decided here, once.

Names of the ``xdstp://`` form (see :mod:`relay.protocol.xdstp`) are kept in
canonical form, so that two spellings of one name are one subscription; the
spelling each client used is kept beside, where it differs, for what is sent
back to it (delta). A delta subscription to a glob collection covers every
member of it that the view has (:meth:`ResourceView.members
<relay.protocol.view.ResourceView.members>`); a SotW one is refused.

Their bookkeeping is private; the stream sees requests in, responses out,
and a :class:`~relay.protocol.snapshot.TypeSnapshot`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import chain
from operator import countOf
from typing import TypeVar

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import Missing
from relay.constraints import EMPTY_PARAMS, Params
from relay.encoding import field_size
from relay.interest import InterestChange
from relay.protocol.cycle import IDLE, IN_FLIGHT, IN_FLIGHT_OWING, OWED, Cycle
from relay.protocol.held import Held
from relay.protocol.limits import MAX_NACK_MESSAGE, shown
from relay.protocol.outcome import RequestOutcome
from relay.protocol.requests import Request
from relay.protocol.sizing import ResponseBudget, cut_heartbeats
from relay.protocol.snapshot import ResourceState, ResourceStatus, TypeSnapshot
from relay.protocol.view import ResourceView
from relay.protocol.xdstp import collection_of, in_request, is_glob
from relay.resource import CachedResource, arrival_clock, do_not_cache_seen

# The most names one response looks at: a client subscribing to more gets
# them over several responses (each ACKed before the next), so that building
# one never holds the event loop for long. Full-state SotW types (listeners,
# clusters) cannot be split: each response is the whole set.
MAX_NAMES_PER_RESPONSE = 2_500

# The most names one response takes when each page after its first is sent
# whole, found with a few operations on whole sets (a big client's pages of
# names it holds none of: see ``DeltaSubscription._more_new``), where its
# pages one at a time would each wait for the client's ACK. Built and encoded
# in 13-30 ms on a loaded 2-core machine (20,000: 45-130 ms, past the 50 ms
# a request may hold the loop). ``server.max_response_size`` still bounds it.
MAX_NAMES_PER_WHOLE_PAGE = 10_000

# A page of at least this many names looks them up together first (see
# ``_whole_pages``, and ``DeltaSubscription._lookups``); a push of a few
# changed names, the fan-out, asks one by one.
PREFETCH_FROM = 32

_DO_NOT_CACHE = operator.attrgetter("do_not_cache")

_NO_NAMES: frozenset[str] = frozenset()

T = TypeVar("T")


class SubscriptionState:
    """Subscription state of one type on one stream, either protocol."""

    # (slots: one state per type per stream, thousands of streams; a slot
    # costs a pointer where an instance dict costs a few hundred bytes)
    __slots__ = (
        "_arrival",
        "_backlog",
        "_changed",
        "_cycle",
        "_errors_sent",
        "_globs",
        "_held",
        "_locator_params",
        "_names",
        "_node_params",
        "_pages_taken",
        "_pending",
        "_pending_heartbeats",
        "_recheck_all",
        "_refetch",
        "_since",
        "_spelled",
        "_touched",
        "_type_url",
        "_wildcard",
        "_wildcard_since",
        "_wildcard_told",
    )

    #: Whether a glob collection may be subscribed (TP1: delta only).
    _serves_globs = False

    def __init__(self, type_url: str) -> None:
        self._type_url = type_url
        self._wildcard = False
        # arrival stamp when the wildcard was subscribed (see ``_since``)
        self._wildcard_since = 0
        self._names: set[str] = set()
        # dynamic parameters of names subscribed with a ResourceLocator
        self._locator_params: dict[str, Params] = {}
        # the node's dynamic parameters for this type: they apply to plain names
        self._node_params: Params = EMPTY_PARAMS
        # name -> what the client holds, as far as we know
        self._held: dict[str, Held] = {}
        # names to re-evaluate on the next response; ``_recheck_all``: every name.
        # A frozenset until added to (see _add_pending): none, or a cache
        # change's own names, shared by every stream it reaches (a push of
        # 50,000 names copied them once a stream, 5-7 ms each)
        self._pending: AbstractSet[str] = _NO_NAMES
        # the names subscribed since ``_pending`` was last empty, in the order
        # the client listed them, as the requests' own lists (not copied; None:
        # unknown). A hint only, checked where it is used: see ``_sorted``.
        self._arrival: list[Sequence[str]] | None = None
        # names a response had no room for (see ``_take_candidates``), in order
        self._backlog: list[str] | None = None
        # how many pages of names responses were built from (see _paged)
        self._pages_taken = 0
        self._recheck_all = False
        # (sets that are empty nearly always are None until needed: an idle
        # stream's memory is mostly its empty sets)
        self._pending_heartbeats: set[str] | None = None
        # names the cache changed since the last response was built (a subset of
        # ``_pending``, which also holds names just subscribed); the change's
        # own frozenset until another comes
        self._changed: AbstractSet[str] | None = None
        # arrival stamp when each name was subscribed; a do-not-cache copy that
        # arrived before is not this client's to have (``_refetch``). Names
        # subscribed before any such copy arrived have none (see _stale).
        self._since: dict[str, int] = {}
        self._refetch: set[str] | None = None
        # the request/response/ACK cycle: what is in flight, what is owed
        self._cycle = Cycle()
        # name -> the origin's error as last forwarded, so each is sent once
        self._errors_sent: dict[str, discovery_pb2.ResourceError] = {}
        # names whose subscription may have changed since the interest index
        # was last told, with the parameters it was told (None: not subscribed)
        self._touched: dict[str, Params | None] = {}
        self._wildcard_told = False
        # xdstp names: canonical -> as the client spelled it, where that
        # differs (None while none does, as for every classic client)
        self._spelled: dict[str, str] | None = None
        # the glob collections subscribed, canonical (a subset of ``_names``)
        self._globs: set[str] | None = None

    # -- what others may read ---------------------------------------------------

    @property
    def rejected(self) -> bool:
        """Whether the client NACKed the latest response it replied to (no ACK since)."""
        return self._cycle.rejected

    def has_work(self) -> bool:
        """Whether ``next_response`` may have a response to send now: one is
        owed, or something is marked to look at and nothing is in flight."""
        phase = self._cycle.phase
        return phase is OWED or (phase is IDLE and (
            bool(self._pending) or self._recheck_all or bool(self._backlog) or
            bool(self._pending_heartbeats)))

    def _answerable(self, view: ResourceView) -> bool:
        """Whether a response may be made now: there is work, the origin has
        answered for the type, and a wildcard subscription's set is held
        (see :meth:`ResourceView.holds_wildcard`)."""
        return self.has_work() and view.is_synced(self._type_url) and \
            (not self._wildcard or view.holds_wildcard(self._type_url))

    def has_changes(self) -> bool:
        """Whether names are marked to look at for the next response."""
        return bool(self._pending) or self._recheck_all

    def only_first_answers(self, view: ResourceView) -> bool:
        """Whether what is marked to look at is exactly the names the client
        waits for a first answer to, each in the cache now (each protocol
        knows which those are)."""
        raise NotImplementedError

    def take_interest_change(self) -> InterestChange | None:
        """How the subscription changed since this was last called, if it did:
        what the interest index must learn. Costs the names touched since."""
        added: dict[str, Params] = {}
        removed: dict[str, Params] = {}
        touched, names = self._touched, self._names
        self._touched = {}
        if touched and not self._locator_params and names.issuperset(touched) and \
                countOf(touched.values(), None) == len(touched):
            # Names new to the index, all plain (a big client's subscribe):
            # each added with the node's parameters, in one operation.
            added = dict.fromkeys(touched, self._node_params)
            touched = {}
        for name, before in touched.items():
            after = self.params_for(name) if name in names else None
            if after == before:
                continue
            if before is not None:
                removed[name] = before
            if after is not None:
                added[name] = after
        wildcard = None if self._wildcard == self._wildcard_told else self._wildcard
        self._wildcard_told = self._wildcard
        if not (added or removed or wildcard is not None):
            return None
        globs = self._globs
        return InterestChange(added, removed, wildcard, frozenset(
            globs.intersection(added) if globs is not None else ()))

    def name_count(self) -> int:
        """How many names the stream subscribes to (a wildcard counts none)."""
        return len(self._names)

    def params_for(self, name: str) -> Params:
        """A locator's own parameters, else the node's for this type."""
        return self._locator_params.get(name, self._node_params)

    # -- cache and node changes --------------------------------------------------

    def mark_changed(self, names: frozenset[str], everything: bool) -> int:
        """Mark these names changed in the cache (or, with ``everything``,
        possibly any), to look at for the next response; returns how many
        changes coalesced.

        That is how many of ``names`` were already waiting behind a response
        the client has not ACKed or NACKed yet: the change before this one
        will never reach it (coalesced, latest wins).
        """
        if everything:
            self._recheck_all = True
        changed = self._changed
        if changed is None:
            self._changed = names  # (not copied: see _pending)
            coalesced = 0
        else:
            phase = self._cycle.phase
            coalesced = len(changed & names) \
                if phase is IN_FLIGHT or phase is IN_FLIGHT_OWING else 0
            if not isinstance(changed, set):
                changed = self._changed = set(changed)
            changed.update(names)
        if self._pending:
            self._add_pending(names)
        else:
            self._pending = names
        return coalesced

    def _add_pending(self, names: Iterable[str]) -> None:
        """Mark ``names`` to look at, in a set of the stream's own (made
        first where ``_pending`` is a frozenset: none, or a change's, shared)."""
        pending = self._pending
        if not isinstance(pending, set):
            pending = self._pending = set(pending)
        pending.update(names)

    def heartbeats_received(self, names: frozenset[str]) -> None:
        """The origin confirmed these names unchanged: pass the heartbeat on."""
        if self._pending_heartbeats is None:
            self._pending_heartbeats = set()
        self._pending_heartbeats.update(names)

    def set_node_params(self, params: Params) -> None:
        """The node's parameters for this type changed: re-evaluate plain names."""
        if params == self._node_params:
            return
        plain = [n for n in self._names if n not in self._locator_params]
        self._touch_all(plain)
        self._node_params = params
        self._add_pending(plain)
        if self._wildcard:
            self._recheck_all = True

    def take_refetch(self) -> frozenset[str]:
        """Names whose cached do-not-cache copy predates this client's interest:
        they need a fresh fetch from the origin (taken once)."""
        if self._refetch is None:
            return _NO_NAMES  # (nearly always: no set made)
        names, self._refetch = frozenset(self._refetch), None
        return names

    def expect_request(self) -> None:
        """A cluster push went out: Envoy asks for endpoints again, and waits
        for the response to warm its clusters. Nothing to do where that request
        is an explicit resubscribe (delta); see the SotW state."""

    # -- rules both protocols follow ---------------------------------------------

    def _canonical(self, names: set[str], params: dict[str, Params] | None = None,
                   spell: bool = False, listed: Sequence[str] | None = None) -> list[str]:
        """Put the xdstp names among ``names`` (and the keys of ``params``) in
        canonical form, in place; returns them (canonical). ``spell``: they
        are subscribed now, as the client spelled them. ``listed``: the plain
        names of ``names`` as a list, which is read faster than the set.

        Raises :class:`~relay.protocol.outcome.ProtocolError` for a
        malformed one, one of another type, or a glob collection the
        protocol does not serve. Costs one pass in C over classic names.
        """
        type_url, globs = self._type_url, self._serves_globs
        if listed is None:
            found = in_request(names, type_url, globs)
        else:
            found = in_request(listed, type_url, globs) if listed else {}
            if params:
                found.update(in_request(params.keys(), type_url, globs))
        if not found:
            return []
        for name, canon in found.items():
            if spell and (canon != name or self._spelled):
                self._spell(canon, name)
            if canon == name:
                continue
            names.discard(name)
            names.add(canon)
            if params is not None and name in params:
                params[canon] = params.pop(name)
        return list(set(found.values()))

    def _spell(self, canon: str, spelled: str) -> None:
        """Remember how the client spells ``canon`` (not at all: as it is)."""
        if canon == spelled or is_glob(canon):
            # (what a collection holds goes out under the origin's names)
            if self._spelled is not None:
                self._spelled.pop(canon, None)
                if not self._spelled:
                    self._spelled = None
            return
        if self._spelled is None:
            self._spelled = {}
        self._spelled[canon] = spelled

    def _covers(self, name: str) -> bool:
        """Whether the subscription covers ``name``: the wildcard, the name
        itself, or a glob collection it is a member of."""
        return self._wildcard or name in self._names or (
            self._globs is not None and collection_of(name) in self._globs)

    def _covered_params(self, name: str) -> Params:
        """The parameters ``name`` is looked up with: its own, else those of the
        glob collection that covers it, else the node's."""
        if name in self._names or self._globs is None:
            return self._locator_params.get(name, self._node_params)
        return self._locator_params.get(collection_of(name) or name, self._node_params)

    def _take_reply(self, request: Request, outcome: RequestOutcome) -> None:
        """``request`` is the ACK or NACK of the response in flight: note which."""
        outcome.ack_nonce = request.response_nonce
        if request.HasField("error_detail"):
            detail = request.error_detail
            outcome.nack = self._cycle.nacked(shown(detail.message, MAX_NACK_MESSAGE),
                                              detail.code)
        else:
            self._cycle.acked()

    def _touch_all(self, names: Iterable[str]) -> None:
        """These names' subscriptions are about to change: remember what the
        interest index knows of each (once, until it is told again)."""
        touched = self._touched
        for name in names:
            if name not in touched:
                touched[name] = self.params_for(name) if name in self._names else None

    def _subscribe_names(self, names: set[str], params: dict[str, Params],
                         listed: Sequence[str] | None = None) -> None:
        """Subscribe ``names`` (plain, or with their locator's ``params``), new or
        again: look at them for the next response. Costs the names given.
        ``listed``: the names as the request listed them, in its order."""
        self._note_arrival(listed)
        fresh = self._touch_fresh(names)
        self._touch_all(names & self._locator_params.keys())
        self._touch_all(params.keys() - fresh)
        for name in names & self._locator_params.keys() - params.keys():
            del self._locator_params[name]
        self._locator_params.update(params)
        self._names |= names
        if do_not_cache_seen():  # (else none can be stale: 38 bytes a name saved)
            since, stamp = self._since, arrival_clock()
            for name in names:  # (dict.update would presize: twice the memory for one name)
                since[name] = stamp
        self._add_pending(names)

    def _touch_fresh(self, names: set[str]) -> set[str]:
        """Those of ``names`` not subscribed yet, touched: unsubscribed as far
        as the index knows (or touched already), so no lookup per name.

        A big client's piece of names all new to the state is ``names``
        itself, where the difference made a set of them anew (~0.08 us a
        name), and, nothing touched since the index was last told (as after
        each request), they are touched as one dict, where a set and a dict
        were made to update it: ~0.75 ms of a 10,000-name join.
        """
        subscribed, touched = self._names, self._touched
        fresh = names if subscribed.isdisjoint(names) else names - subscribed
        if touched:
            touched.update(dict.fromkeys(fresh - touched.keys()))
        else:
            self._touched = dict.fromkeys(fresh)
        return fresh

    def _note_arrival(self, listed: Sequence[str] | None) -> None:
        """Keep the order in which names are subscribed (see ``_sorted``), while
        every name waiting to be looked at came so (no longer than that: the
        list is as long as ``_pending`` at most)."""
        arrival = self._arrival
        if listed is None or sum(map(len, arrival or ())) != len(self._pending):
            self._arrival = None
        elif arrival is None:
            self._arrival = [listed]
        else:
            arrival.append(listed)

    def _sorted(self, candidates: AbstractSet[str]) -> list[str]:
        """``sorted(candidates)``, from the names in the order they were
        subscribed where those are exactly the candidates: most clients list
        their names in an order of their own making (gRPC's xDS client: sorted;
        generated names: a few ascending runs), which Python's sort merges in a
        pass or a few, where a set's order costs the full sort (10,000 names:
        ~0.9 ms with the check below, against ~2.8). The hint is checked, not
        trusted: its names, as a set, are the candidates (and as many: none
        twice)."""
        arrival, self._arrival = self._arrival, None
        if arrival is not None and sum(map(len, arrival)) == len(candidates) and \
                set(chain.from_iterable(arrival)) == candidates:
            return sorted(chain.from_iterable(arrival))
        return sorted(candidates)

    def _unsubscribe_names(self, names: Iterable[str]) -> set[str]:
        """Unsubscribe those of ``names`` that are subscribed; returns them."""
        gone = self._names.intersection(names)
        self._touch_all(gone)
        self._names -= gone
        for name in gone & self._locator_params.keys():
            del self._locator_params[name]
        for name in gone:
            self._since.pop(name, None)
        if self._globs is not None:
            self._globs -= gone
            self._globs = self._globs or None
        if self._spelled is not None:
            for name in gone & self._spelled.keys():
                del self._spelled[name]
            self._spelled = self._spelled or None
        return gone

    def _start_wildcard(self) -> None:
        """Subscribe the wildcard (whether or not it was)."""
        self._wildcard_since = arrival_clock()
        self._wildcard = True
        self._recheck_all = True

    def _stale(self, found: CachedResource, name: str) -> bool:
        """A do-not-cache copy fetched before this client subscribed to ``name``:
        not its to have.

        The client waits for a fresh copy, which :meth:`take_refetch` asks
        for; a client that already holds exactly this copy is not refused it.
        """
        if not found.do_not_cache:
            return False
        held = self._held.get(name)
        if held is not None and held.is_current(found):
            return False
        # A name subscribed with no stamp was subscribed before any
        # do-not-cache copy arrived: no copy is older than its subscription.
        since = self._since.get(name, 0 if name in self._names else self._wildcard_since)
        if found.arrival <= since:
            if self._refetch is None:
                self._refetch = set()
            self._refetch.add(name)
            return True
        return False

    def _forward_error(self, name: str, error: discovery_pb2.ResourceError | None
                       ) -> discovery_pb2.ResourceError | None:
        """The origin's current ``error`` for ``name`` if this client has not been
        told it yet (None also forgets what it was told)."""
        if error is None:
            self._errors_sent.pop(name, None)
            return None
        if self._errors_sent.get(name) == error:
            return None
        self._errors_sent[name] = error
        return error

    def _looked_up(self, view: ResourceView, candidates: list[str],
                   errors: list[discovery_pb2.ResourceError], budget: ResponseBudget
                   ) -> Iterator[tuple[str, CachedResource | Missing]]:
        """Each subscribed name among ``candidates`` (in order) with the variant
        this client gets, or why there is none; the origin's errors not yet
        passed on go into ``errors`` on the way, counted in ``budget`` whether
        they fit or not (they are marked as passed on already)."""
        type_url, wildcard, names = self._type_url, self._wildcard, self._names
        locator_params, node_params = self._locator_params, self._node_params
        globs = self._globs
        # Errors are rare: look them up only in a type that has any, or for
        # names whose error this client was told (to forget it once gone).
        any_errors = view.has_errors(type_url)
        errors_sent = self._errors_sent
        lookup = view.lookup
        for name in candidates:
            if globs is None:
                if not (wildcard or name in names):
                    continue
                params = locator_params.get(name, node_params)
            else:  # (a delta client of glob collections)
                if not self._covers(name):
                    continue
                params = self._covered_params(name)
            if any_errors or name in errors_sent:
                forwarded = self._forward_error(name, view.error(type_url, name, params))
                if forwarded is not None:
                    errors.append(forwarded)
                    budget.count(field_size(forwarded.ByteSize()))
            yield name, lookup(type_url, name, params)

    def _heartbeats_due(self, sending: Iterable[CachedResource],
                        view: ResourceView) -> list[CachedResource]:
        """Resources to send as heartbeats: confirmed, held by the client, not being sent."""
        if not self._pending_heartbeats:
            return []
        out = []
        being_sent = {r.name for r in sending}
        for name in sorted(self._pending_heartbeats - being_sent):
            if not self._covers(name):
                continue
            found = view.lookup(self._type_url, name, self._covered_params(name))
            current = self._held.get(name)
            if isinstance(found, CachedResource) and current is not None and \
                    current.is_current(found):
                out.append(found)
        self._pending_heartbeats = None
        return out

    @staticmethod
    def _heartbeat_bytes(resource: CachedResource) -> bytes:
        """What a heartbeat of ``resource`` takes in this protocol's responses."""
        raise NotImplementedError

    def _heartbeats_that_fit(self, resources: list[CachedResource], view: ResourceView,
                             budget: ResponseBudget, full: bool) -> list[CachedResource]:
        """The heartbeats due that fit in the response; the others stay due."""
        due = self._pending_heartbeats
        if full or not due:
            return []  # (a full response leaves them all for the next)
        heartbeats = self._heartbeats_due(resources, view)
        self._pending_heartbeats = cut_heartbeats(
            budget, heartbeats, self._heartbeat_bytes, due, resources)
        return heartbeats

    def _take_candidates(self, view: ResourceView,
                         everything: Callable[[], Iterable[str]]) -> list[str]:
        """The names to look at for the next response, sorted; their pending
        marks go. ``everything`` gives every name the state knows, when all are
        due. Beyond :data:`MAX_NAMES_PER_RESPONSE`, the rest wait for the next."""
        backlog = self._backlog
        candidates: AbstractSet[str]
        if self._recheck_all:
            candidates = every = set(everything())
            if self._wildcard:
                every.update(view.names(self._type_url))
            backlog = None  # every name is a candidate again
        else:
            candidates = self._pending
        globs = self._globs
        if globs is not None and not globs.isdisjoint(candidates):
            # A collection is looked at as its members, never by its own name.
            collections = globs.intersection(candidates)
            members = set(candidates)  # (its own: _pending may be shared)
            members -= globs
            for glob in collections:
                members.update(view.members(self._type_url, glob))
            candidates = members
        ordered = self._sorted(candidates)
        self._looked_at_everything()
        self._pages_taken += 1
        if len(ordered) > MAX_NAMES_PER_RESPONSE:
            later = ordered[MAX_NAMES_PER_RESPONSE:]
            if backlog:
                # A name marked again while it waited waits once, not twice.
                waiting = set(later)
                later += [name for name in backlog if name not in waiting]
            backlog = later
            del ordered[MAX_NAMES_PER_RESPONSE:]
        elif backlog:
            # Names left over from a big response come next, in their order
            # (sorted once, when they were left over: never sorted again).
            room = MAX_NAMES_PER_RESPONSE - len(ordered)
            taken = set(ordered)
            ordered += [name for name in backlog[:room] if name not in taken]
            del backlog[:room]
        self._backlog = backlog or None
        return ordered

    def _whole_pages(self, view: ResourceView, candidates: list[str], budget: ResponseBudget
                     ) -> tuple[Mapping[str, CachedResource] | None,
                                list[CachedResource] | None, str | None, list[bytes]]:
        """``(served, all_new, full_at, entries)`` for a page of ``candidates``.

        ``served``: a page of many names, without the origin's errors, looked
        up together (else None). ``all_new``: when the client holds none of
        them and each is served to every subscriber or unknown to all, the
        page sent whole, with the next pages that qualify too (else None, and
        the name-by-name loop makes the page). ``full_at``: the first name
        the response had no room for, the rest put back for the next.
        ``entries``: those of ``all_new`` (see :attr:`_whole_entry`), in
        order, for the encoder: read once, sized here and sent from there.
        """
        served = view.served_to_all(self._type_url, candidates) \
            if len(candidates) >= PREFETCH_FROM and not self._errors_sent and \
            not view.has_errors(self._type_url) else None
        entries: list[bytes] = []
        taken = self._all_new(view, served, candidates, budget, entries) \
            if served is not None else None
        if taken is None:
            return served, None, None, entries
        all_new, full_at = taken
        if full_at is not None:  # (it and the rest did not fit)
            self._put_back(candidates[candidates.index(full_at):])
            return served, all_new, full_at, entries
        return served, all_new, self._more_new(view, all_new, len(candidates), budget,
                                               entries), entries

    def _all_new(self, view: ResourceView, served: Mapping[str, CachedResource],
                 candidates: list[str], budget: ResponseBudget, entries: list[bytes]
                 ) -> tuple[list[CachedResource], str | None] | None:
        """The resources of a page sent whole, when that is plain to see,
        and the name of the first that did not fit (None: all did). A page
        of many names the client subscribed to and holds
        none of, each a resource every subscriber gets (no variants, aliases,
        errors or do-not-cache, nothing :meth:`_sent_whole` refuses) or a
        name the view knows nothing of for anybody (UNKNOWN: the loop skips
        it, left subscribed and unanswered, as here): the names subscribed,
        or the members of a glob collection. As many as fit in ``budget``,
        in order (the first of them always, into an empty one): the caller
        puts the rest back. What the name-by-name loop of the protocol's
        response would send, found with a few operations on whole sets
        instead (a big client's pages, the first time, and a cold one's
        while its names arrive); None where the loop must look (it then does
        all of it). ``served``: what the view serves every subscriber of
        ``candidates``. The entries of the resources returned are added to
        ``entries``."""
        whole = len(served) == len(candidates)
        if not (whole or len(served) +
                view.unknown_to_all(self._type_url, candidates) == len(candidates)) or \
                not self._covers_all(candidates) or \
                not self._held.keys().isdisjoint(candidates):  # (candidates are distinct)
            return None
        resources = list(served.values())
        # (no do-not-cache copy ever seen, none is one: a pass over them saved)
        if (do_not_cache_seen() and any(map(_DO_NOT_CACHE, resources))) or \
                not self._sent_whole(resources):
            return None
        names = candidates if whole else list(served)
        page = list(map(self._whole_entry, resources))
        full_at = None
        if not budget.take_all(sum(map(len, page))):
            # (the loop's own rule, entry by entry: where the sum does not fit)
            fit = budget.fitting(list(map(len, page)))
            full_at = names[fit] if fit < len(names) else None  # (one, alone, too big: fits)
            del resources[fit:], page[fit:]
            names = names[:fit]
            served = dict(zip(names, resources, strict=True))
        self._took_whole(served, names)
        entries += page
        return resources, full_at

    # (hooks of the protocols for whole pages)

    #: the encoded entry a resource of a page sent whole goes out as
    _whole_entry: Callable[[CachedResource], bytes] = operator.attrgetter("delta_entry")

    def _sent_whole(self, resources: list[CachedResource]) -> bool:
        """Whether these resources may go out in a page sent whole (see
        :meth:`_all_new`) as the protocol's loop would send them."""
        return True

    def _took_whole(self, served: Mapping[str, CachedResource], names: list[str]) -> None:
        """The client is sent ``served`` (name -> resource), ``names`` in order:
        it holds them once this response is ACKed."""
        self._held.update(served)

    def _more_new(self, view: ResourceView, resources: list[CachedResource], looked: int,
                  budget: ResponseBudget, entries: list[bytes]) -> str | None:
        """Add the next pages of the backlog to a response that sends a whole
        page (``resources``, in place; ``looked``: its names) while they too
        are sent whole (see :meth:`_all_new`), up to
        :data:`MAX_NAMES_PER_WHOLE_PAGE` names looked at and ``budget``: a
        big client's names in one response, or a few, where a page at a time
        waited for an ACK each (10,000 names: 4-5 round trips). Returns the
        first name that did not fit (None: all did, or the next page is not
        sent whole; it waits for the next response). At most one page is
        looked at and not taken."""
        type_url = self._type_url
        while self._backlog and looked < MAX_NAMES_PER_WHOLE_PAGE:
            more = self._take_more(min(MAX_NAMES_PER_RESPONSE, MAX_NAMES_PER_WHOLE_PAGE - looked))
            taken = self._all_new(view, view.served_to_all(type_url, more), more, budget,
                                  entries)
            if taken is None:
                self._put_back(more)
                return None
            new, full_at = taken
            resources += new
            looked += len(more)
            if full_at is not None:  # (it and the rest did not fit)
                self._put_back(more[more.index(full_at):])
                return full_at
        return None

    def _covers_all(self, names: list[str]) -> bool:
        """Whether the subscription covers every one of ``names`` (see
        :meth:`_covers`): a glob collection's members, by their collection."""
        if self._wildcard:
            return True
        subscribed, globs = self._names, self._globs
        if globs is None:
            return subscribed.issuperset(names)
        return all(name in subscribed or collection_of(name) in globs for name in names)

    def _lookups(self, view: ResourceView, candidates: list[str],
                 errors: list[discovery_pb2.ResourceError], budget: ResponseBudget,
                 served: Mapping[str, CachedResource] | None
                 ) -> Iterable[tuple[str, CachedResource | Missing]]:
        """What :meth:`_looked_up` gives; for a page of many names without
        globs or the origin's errors (a big client's, nearly always), in one
        list built at once, the resources in ``served`` (what the view
        serves every subscriber: see :meth:`ResourceView.served_to_all
        <relay.protocol.view.ResourceView.served_to_all>`, and
        :meth:`_whole_pages`) found in it."""
        if served is None or self._globs is not None:
            return self._looked_up(view, candidates, errors, budget)
        type_url, found_in = self._type_url, served.get
        lookup, wildcard, names = view.lookup, self._wildcard, self._names
        locator_params, node_params = self._locator_params, self._node_params
        return [(name, found_in(name) or
                 lookup(type_url, name, locator_params.get(name, node_params)))
                for name in candidates if wildcard or name in names]

    def _paged(self, page: Callable[[], T | None]) -> T | None:
        """The first of ``page()``'s responses that holds something, taking the
        waiting names a page at a time.

        A page of the backlog may hold nothing to send (names marked again that
        the client already holds as they are): the next page is looked at at
        once, rather than leaving the stream idle with names still waiting.
        """
        while True:
            taken = self._pages_taken
            response = page()
            if response is not None or not self._backlog or self._pages_taken == taken:
                return response  # sent, all looked at, or no page taken (in flight, say)
            # Terminates: marks come only from outside, so every page after the
            # first takes its names from the backlog alone, which shrinks.

    def _take_more(self, limit: int) -> list[str]:
        """Up to ``limit`` names off the front of the backlog, in order: a
        response that has room takes the next page too. :meth:`_put_back`
        what it does not send."""
        backlog = self._backlog
        if not backlog:
            return []
        more = backlog[:limit]
        del backlog[:limit]
        self._backlog = backlog or None
        return more

    def _put_back(self, names: list[str]) -> None:
        """Names taken for a response that did not send them: they wait, in
        order, at the front of the backlog (as :meth:`_leave_for_next`)."""
        if names:
            self._backlog = names + (self._backlog or [])

    def _leave_for_next(self, candidates: list[str], full_at: str) -> None:
        """A response had no room for ``full_at`` and the candidates after it:
        they wait, in order, for the next response (after the ACK).

        ``full_at`` is at its first place among the candidates: a name seen
        earlier would have been sent or skipped there.
        """
        self._backlog = candidates[candidates.index(full_at):] + (self._backlog or [])

    def _looked_at_everything(self) -> None:
        """A response was built from every name marked: the marks go."""
        self._pending = _NO_NAMES
        self._arrival = None
        self._changed = None
        self._recheck_all = False
        # (the backlog stays: it is what the response could not take)

    # -- what the snapshot says --------------------------------------------------

    def snapshot(self) -> TypeSnapshot:
        """What the client subscribes to and holds, and how its last responses went."""
        resources = []
        last_nack = self._cycle.last_nack
        for name, held in self._held.items():
            if not self._covers(name):
                continue  # declared in initial_resource_versions, never subscribed
            status = self._held_status(name, held)
            message = last_nack.message if status is ResourceStatus.NACKED and \
                last_nack is not None else ""
            resources.append(ResourceState(held.name or name, status, held.version,
                                           held.variant_key, name, message))
        # (a glob collection is its members: none is a resource of its own)
        for name in sorted(self._names - self._held.keys() - (self._globs or set())):
            error = self._errors_sent.get(name)
            if error is not None:
                resources.append(ResourceState(name, ResourceStatus.RECEIVED_ERROR,
                                               subscribed_as=name,
                                               message=error.error_detail.message))
            elif self._told_absent(name):
                resources.append(ResourceState(name, ResourceStatus.DOES_NOT_EXIST,
                                               subscribed_as=name))
            else:
                resources.append(ResourceState(name, ResourceStatus.REQUESTED,
                                               subscribed_as=name))
        resources.sort(key=lambda r: r.name)
        return TypeSnapshot(
            self._type_url, tuple(sorted(self._names)), self._wildcard,
            tuple((name, held.version) for name, held in sorted(self._held.items())),
            self._acked(), self._cycle.in_flight, last_nack, tuple(resources))

    def _held_status(self, name: str, held: Held) -> ResourceStatus:
        raise NotImplementedError

    def _told_absent(self, name: str) -> bool:
        raise NotImplementedError

    def _acked(self) -> str | None:
        raise NotImplementedError

