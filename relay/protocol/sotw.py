"""State-of-the-world xDS: one stream's subscription state for one type.

:class:`SotwSubscription` consumes ``DiscoveryRequest`` messages and cache
change notices and says what ``DiscoveryResponse`` to send. Listeners and
clusters always go out as the full subscribed set (absence means deletion);
other types carry only what changed or was newly subscribed, over several
responses (each ACKed before the next) where one would be too large.
``version_info`` is a digest of everything the client holds after the
response, so it changes whenever any resource does and two replicas serving
the same origin state report the same version.
"""

from __future__ import annotations

import hashlib
import operator
import weakref
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ABSENT, UNKNOWN
from relay.constraints import Params, params_of
from relay.protocol.cycle import NEW, OWED
from relay.protocol.held import Held
from relay.protocol.outcome import RequestOutcome
from relay.protocol.requests import SotwRequest
from relay.protocol.sizing import ResponseBudget
from relay.protocol.snapshot import ResourceStatus
from relay.protocol.subscription import SubscriptionState
from relay.protocol.view import NonceSource, ResourceView
from relay.resource import CachedResource
from relay.xds_types import FULL_STATE_TYPES, LEGACY_WILDCARD_TYPES, WILDCARD


@dataclass(slots=True)
class SotwResponsePlan:
    """One DiscoveryResponse to send."""

    type_url: str
    nonce: str
    version_info: str
    resources: list[CachedResource]
    # names subscribed with a ResourceLocator: sent wrapped in Resource, so
    # that their constraints travel with them
    wrapped: frozenset[str] = frozenset()
    errors: list[discovery_pb2.ResourceError] = field(default_factory=list)
    # names sent as heartbeats (wrapped Resource without a body)
    heartbeats: frozenset[str] = frozenset()
    # the resources' ``sotw_entry``, where the response's page read them
    # already to size it (None: the encoder reads them)
    entries: list[bytes] | None = None

    def head(self) -> discovery_pb2.DiscoveryResponse:
        """The response without its resources (they are appended pre-encoded)."""
        return discovery_pb2.DiscoveryResponse(
            type_url=self.type_url, nonce=self.nonce, version_info=self.version_info,
            resource_errors=self.errors)


def held_term(name: str, held: Held) -> int:
    """One resource's share of a client state's version (see :func:`state_version`):
    a digest of its name, version and variant key, each ended by a NUL, and
    its content digest. (Hashed in one call: a big client's 10,000 terms
    took 15 ms fed part by part, 8 ms so; the bytes, and the term, are the
    same.)"""
    return _from_bytes(_blake2b(
        f"{name}\0{held.version}\0{held.variant_key or ''}\0".encode() + (held.digest or b""),
        digest_size=8).digest(), "big")


_blake2b = hashlib.blake2b
_from_bytes = int.from_bytes

# A resource's term under its own name, kept while the resource lives: every
# SotW client sent it needs the same one (a warm big client's 10,000: 8 ms
# to hash). About 256 bytes a resource ever sent over SotW (186 when keyed
# by weak references: 70 more for ~1 ms less a 10,000 join). Keyed by the
# resource's id, found from C in one pass with no object made per resource
# (see :func:`own_terms`). An id is the resource's only while it lives: a
# weak reference to it (kept in :data:`_TERM_REFS`) forgets the term as it
# goes, before its id can be another's (CPython calls a weak reference's
# callback as the object is finalized, before its memory is freed).
_OWN_TERMS: dict[int, int] = {}


class _TermRef(weakref.ref[CachedResource]):
    """A weak reference that knows the id whose term it forgets."""

    __slots__ = ("key",)
    key: int


_TERM_REFS: dict[int, _TermRef] = {}


def _forget_term(gone: weakref.ref[CachedResource]) -> None:
    assert isinstance(gone, _TermRef)
    _OWN_TERMS.pop(gone.key, None)
    _TERM_REFS.pop(gone.key, None)


def own_term(resource: CachedResource) -> int:
    """``held_term(resource.name, resource)``, hashed once per resource."""
    key = id(resource)
    term = _OWN_TERMS.get(key)
    if term is None:
        term = held_term(resource.name, resource)
        ref = _TermRef(resource, _forget_term)
        ref.key = key
        _TERM_REFS[key] = ref
        _OWN_TERMS[key] = term
    return term


def own_terms(resources: Collection[CachedResource]) -> int:
    """The sum of :func:`own_term` over ``resources``: when every term is
    known, found and summed in one pass in C (a warm big client's 10,000:
    ~7 -> ~1 ms in the relay, where a weak reference made for each to look
    it up cost more than the look-up); else the rest hashed."""
    try:
        return sum(map(_OWN_TERMS.__getitem__, map(id, resources)))
    except KeyError:
        return sum(map(own_term, resources))


def _term(name: str, held: Held) -> int:
    """:func:`held_term`, through :func:`own_term` for a resource held under its own name."""
    if isinstance(held, CachedResource) and name == held.name:
        return own_term(held)
    return held_term(name, held)


def state_version(held: Mapping[str, Held]) -> str:
    """A digest of what the client holds: the ``version_info`` of a client state.

    It covers each resource's content digest too, so that new content under
    an unchanged origin version still changes ``version_info``. It is the sum
    of one term per resource, so a state keeps it up to date as resources
    come and go, in what changed rather than in all it holds.
    """
    return _version_text(held_sum(held))


def held_sum(held: Mapping[str, Held]) -> int:
    """The sum of :func:`held_term` over what a client holds (before the modulus)."""
    return sum(_term(name, entry) for name, entry in held.items())


def _version_text(total: int) -> str:
    return f"{total % _VERSION_MODULUS:016x}"


_VERSION_MODULUS = 1 << 64


class SotwSubscription(SubscriptionState):
    """SotW protocol state of one type on one stream.

    ``resource_in_sotw``: the client announced
    ``xds.config.supports-resource-in-sotw``, so resources with a TTL go
    wrapped in ``Resource``, and heartbeats reach it.
    """

    __slots__ = ("_held_sum", "_legacy_wildcard", "_wrap_ttl")

    def __init__(self, type_url: str, resource_in_sotw: bool = False) -> None:
        super().__init__(type_url)
        self._wrap_ttl = resource_in_sotw
        # the first request named nothing of a type where that means wildcard:
        # from then on, an empty list of names is the wildcard (fixed once)
        self._legacy_wildcard = False
        # the sum of ``held_term`` over ``_held``: the state's version, kept current
        self._held_sum = 0

    @property
    def _full_state(self) -> bool:
        """Listeners and clusters: every response carries the whole subscribed set."""
        return self._type_url in FULL_STATE_TYPES

    def only_first_answers(self, view: ResourceView) -> bool:
        # The names the client waits for are those subscribed and not held.
        # Lengths first (a stream holding every name it subscribes to, nearly
        # all on a fan-out's path, goes no further), then the cache, then
        # the set operations, in C.
        names, held, pending = self._names, self._held, self._pending
        if self._wildcard or self._backlog or len(held) >= len(names):
            return False
        if self._recheck_all:
            # (a first request, say: every name is looked at, so none may be held)
            return not held and view.serves_every(self._type_url, names) and \
                pending <= names
        if len(pending) != len(names) - len(held):
            return False
        waiting = names - held.keys()
        return waiting == pending and view.serves_every(self._type_url, waiting)

    def expect_request(self) -> None:
        """Answer the next request in full, even one that looks like a plain ACK.

        Envoy asks for endpoints again after a cluster update, and waits for
        the answer to finish warming its clusters.
        """
        self._cycle.expect_request()

    # -- input -----------------------------------------------------------

    def on_request(self, request: SotwRequest,
                   requesting: Sequence[str] | None = None) -> RequestOutcome:
        """Apply one request. A request answering an older response is ignored.

        A SotW request names the whole subscription, so it costs that much;
        what changed is found with set operations. ``requesting``: its
        ``resource_names`` read out already.
        """
        outcome = RequestOutcome()
        listed = list(request.resource_names) if requesting is None else requesting
        requested = set(listed)
        locators = {loc.name: params_of(loc.dynamic_parameters)
                    for loc in request.resource_locators}
        requested.update(locators)
        cycle = self._cycle
        if cycle.start():
            # The first request of a type on a stream is initial, whatever nonce
            # it carries; the client's state is unknown, so everything is sent.
            if requested:
                self._canonical(requested, locators, listed=listed)
            self._legacy_wildcard = not requested and self._type_url in LEGACY_WILDCARD_TYPES
            self._set_names(requested, locators, first=True, listed=listed)
            self._recheck_all = True
            if self._wildcard or (self._full_state and self._names):
                cycle.owe()
            return outcome

        nonce = request.response_nonce
        if cycle.last_nonce is not None and nonce != cycle.last_nonce:
            return outcome  # stale: the client has not seen our latest response yet
        same = requested == self._names
        if not same:
            # (xdstp names canonical: a client spelling one otherwise asks for
            # the same names again; checked only when they are not the same)
            self._canonical(requested, locators, listed=listed)
            same = requested == self._names
        self._take_answer(request, requested, outcome)
        if same and not (self._wildcard or locators or self._locator_params):
            return outcome  # the same plain names again (an ACK, most often)
        self._set_names(requested, locators, first=False, listed=listed)
        return outcome

    def _take_answer(self, request: SotwRequest, requested: set[str],
                     outcome: RequestOutcome) -> None:
        """What a request of the current nonce says of the last response:
        its ACK or NACK, and that what the client holds is what it names."""
        cycle, nonce = self._cycle, request.response_nonce
        if cycle.awaits(nonce):
            self._take_reply(request, outcome)
        if cycle.take_expected(nonce):
            for name in requested & self._held.keys():
                self._unhold(name)
            self._add_pending(requested)

    def on_reply(self, request: SotwRequest, most: int) -> RequestOutcome | None:
        """:meth:`on_request` for a request that names exactly the plain names
        subscribed (at most ``most`` of them, counted with repeats), no
        locators, no wildcard, and is not the type's first: an ACK or NACK
        (or one of a stale nonce), which carries the whole subscription;
        None for any other (:meth:`on_request` takes it).

        Such a request changes no subscription: the session need not check
        its names again (they were checked when subscribed), nor ask what
        the interest index must learn. Its names are read once, into the set
        compared, where the general path read them into a list, a set and
        two checks (10,000 names: ~1.9 ms an ACK).
        """
        cycle, names = self._cycle, request.resource_names
        if cycle.phase is NEW or self._wildcard or self._locator_params or \
                request.resource_locators or not len(self._names) <= len(names) <= most:
            return None
        requested = set(names)
        if requested != self._names:
            return None
        outcome = RequestOutcome()
        nonce = request.response_nonce
        if cycle.last_nonce is not None and nonce != cycle.last_nonce:
            return outcome  # stale, as in on_request
        self._take_answer(request, requested, outcome)
        return outcome

    def _set_names(self, requested: set[str], locators: dict[str, Params], first: bool,
                   listed: Sequence[str] | None = None) -> None:
        wildcard = WILDCARD in requested or (self._legacy_wildcard and not requested)
        requested.discard(WILDCARD)
        locators.pop(WILDCARD, None)
        added = requested - self._names
        if wildcard and not self._wildcard:
            self._start_wildcard()
            if not first:
                self._cycle.owe()
        self._wildcard = wildcard
        # Parameters changed: re-evaluate which variant it gets.
        kept = requested - added
        changed = {name for name in kept & (locators.keys() | self._locator_params.keys())
                   if self._locator_params.get(name) != locators.get(name)}
        self._touch_all(changed)
        for name in changed:
            if name in locators:
                self._locator_params[name] = locators[name]
            else:
                del self._locator_params[name]
        self._add_pending(changed)
        self._unsubscribe_names(self._names - requested)
        if not self._wildcard:
            # Forget what the client unsubscribed (it drops it), so that a
            # later resubscribe resends it.
            for name in self._held.keys() - self._names:
                self._unhold(name)
        if not first:
            for name in added & self._held.keys():
                self._unhold(name)
        # (the order listed helps only where every name is new: see _sorted)
        self._subscribe_names(added, {name: locators[name] for name in added & locators.keys()},
                              listed if len(added) == len(requested) else None)
        if added and self._full_state:
            self._cycle.owe()

    def heartbeats_received(self, names: frozenset[str]) -> None:
        """The origin confirmed these names unchanged (only Resource-aware clients hear it)."""
        if self._wrap_ttl:
            super().heartbeats_received(names)

    # -- output ----------------------------------------------------------

    def next_response(self, view: ResourceView, nonces: NonceSource,
                      max_size: int | None = None) -> SotwResponsePlan | None:
        """The response to send now, if any (none while one is in flight).

        A type that is not full-state keeps it to ``max_size`` bytes unless
        one resource alone is larger: what does not fit waits for the next
        response. A full-state type's response is the whole set, whatever
        its size (absence would mean deletion).
        """
        if not self._answerable(view):
            return None
        if self._full_state:
            return self._full_state_response(view, nonces)
        return self._paged(lambda: self._changes_response(view, nonces, max_size))

    def _subscribed(self, view: ResourceView) -> set[str]:
        names = set(self._names)
        if self._wildcard:
            names.update(view.names(self._type_url))
        return names

    def _full_state_response(self, view: ResourceView,
                             nonces: NonceSource) -> SotwResponsePlan | None:
        resources: list[CachedResource] = []
        current_errors: list[tuple[str, discovery_pb2.ResourceError | None]] = []
        for name in sorted(self._subscribed(view)):
            error = view.error(self._type_url, name, self.params_for(name))
            found = view.lookup(self._type_url, name, self.params_for(name))
            if found is UNKNOWN and error is None:
                # Absence would mean deletion to the client: wait until the
                # origin has said whether it exists (the cache will tell us).
                return None
            current_errors.append((name, error))
            if isinstance(found, CachedResource):
                if self._stale(found, name):
                    return None  # wait for the fresh copy rather than omit it
                resources.append(found)
        # Only now is a response certain: errors count as told from here on.
        errors = [forwarded for name, error in current_errors
                  if (forwarded := self._forward_error(name, error)) is not None]
        self._looked_at_everything()
        new_held = {r.name: r for r in resources}
        beats = frozenset(n for n in self._pending_heartbeats or ()
                          if (held := self._held.get(n)) is not None and n in new_held and
                          held.is_current(new_held[n]))
        self._pending_heartbeats = None
        unchanged = new_held.keys() == self._held.keys() and all(
            self._held[name].is_current(resource) for name, resource in new_held.items())
        if unchanged and self._cycle.phase is not OWED and not errors:
            if not beats:
                return None
            # Unchanged state: a heartbeat response, all others in full.
            return self._emit(resources, nonces, errors, beats)
        self._held = dict(new_held)
        self._held_sum = held_sum(new_held)
        return self._emit(resources, nonces, errors)

    def _changes_response(self, view: ResourceView, nonces: NonceSource,
                          max_size: int | None) -> SotwResponsePlan | None:
        candidates = self._take_candidates(view, lambda: self._names)
        errors: list[discovery_pb2.ResourceError] = []
        budget = ResponseBudget(max_size, self._type_url)
        # full_at: the first name the response had no room for
        served, whole, full_at, entries = self._whole_pages(view, candidates, budget)
        resources = whole if whole is not None else []
        for name, found in () if whole is not None else \
                self._lookups(view, candidates, errors, budget, served):
            if found is UNKNOWN:
                continue
            if found is ABSENT:
                # SotW cannot say "removed" for these types; just forget it.
                if name in self._held:
                    self._unhold(name)
                continue
            assert isinstance(found, CachedResource)
            if self._stale(found, name):
                continue
            held = self._held.get(name)
            if held is None or not held.is_current(found):
                if not budget.take(len(self._entry(found))):
                    full_at = name
                    break
                resources.append(found)
                if held is not None:
                    self._unhold(name)
                self._held[name] = found
                self._held_sum += _term(name, found)
        if full_at is not None and whole is None:
            self._leave_for_next(candidates, full_at)
        beats = self._heartbeats_that_fit(resources, view, budget, full_at is not None)
        if not resources and not errors and not beats and self._cycle.phase is not OWED:
            return None
        return self._emit(resources + beats, nonces, errors,
                          frozenset(r.name for r in beats),
                          entries if whole is not None and not beats else None)

    @staticmethod
    def _heartbeat_bytes(resource: CachedResource) -> bytes:
        return resource.sotw_heartbeat_entry

    # (pages sent whole: see SubscriptionState._all_new)

    _whole_entry = operator.attrgetter("sotw_entry")

    def _sent_whole(self, resources: list[CachedResource]) -> bool:
        """None goes wrapped (see :meth:`_wraps`): each is its ``sotw_entry``."""
        locators = self._locator_params
        return not (locators and any(r.name in locators for r in resources)) and \
            not (self._wrap_ttl and any(r.ttl_seconds is not None for r in resources))

    def _took_whole(self, served: Mapping[str, CachedResource], names: list[str]) -> None:
        super()._took_whole(served, names)
        # (``served`` maps each resource's own name to it)
        self._held_sum += own_terms(served.values())

    def _wraps(self, resource: CachedResource) -> bool:
        """Whether ``resource`` goes wrapped in ``Resource``: subscribed with a
        locator (its constraints travel with it), or with a TTL to a client
        that takes them."""
        return resource.name in self._locator_params or \
            (self._wrap_ttl and resource.ttl_seconds is not None)

    def _entry(self, resource: CachedResource) -> bytes:
        """The encoded entry ``resource`` goes out as (as
        :func:`relay.server.plans.encode_plan` chooses it)."""
        return resource.sotw_wrapped_entry if self._wraps(resource) else resource.sotw_entry

    def _emit(self, resources: list[CachedResource], nonces: NonceSource,
              errors: list[discovery_pb2.ResourceError] | None = None,
              heartbeats: frozenset[str] = frozenset(),
              entries: list[bytes] | None = None) -> SotwResponsePlan:
        nonce, version_info = nonces.next(), _version_text(self._held_sum)
        self._cycle.sent(nonce, version_info)  # (what a request expected waits for, too)
        # (nothing wraps without locators or TTLs to pass on: no pass over them)
        wrapped = frozenset(r.name for r in resources if self._wraps(r)) \
            if self._locator_params or self._wrap_ttl else frozenset()
        return SotwResponsePlan(self._type_url, nonce, version_info, resources, wrapped,
                                errors or [], heartbeats, entries)

    def _unhold(self, name: str) -> None:
        self._held_sum -= _term(name, self._held.pop(name))

    # -- snapshot ----------------------------------------------------------

    def _held_status(self, name: str, held: Held) -> ResourceStatus:
        # A response is accepted or rejected as a whole, and the state keeps no
        # record of which names it carried: every held name of the type shares
        # the fate of the latest response.
        cycle = self._cycle
        if cycle.in_flight is not None:
            return ResourceStatus.SENT
        if cycle.acked_version == cycle.version_info:
            return ResourceStatus.ACKED
        nack = cycle.last_nack
        if nack is not None and nack.version_info == cycle.version_info:
            return ResourceStatus.NACKED
        return ResourceStatus.SENT

    def _told_absent(self, name: str) -> bool:
        # Full-state types: a response that went out after the subscription and
        # did not list the name said that it does not exist. Other SotW types
        # cannot say it.
        return (self._full_state and self._cycle.last_nonce is not None and
                name not in self._pending and not self._recheck_all)

    def _acked(self) -> str | None:
        return self._cycle.acked_version
