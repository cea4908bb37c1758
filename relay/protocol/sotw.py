"""State-of-the-world xDS: one stream's subscription state for one type.

:class:`SotwSubscription` consumes ``DiscoveryRequest`` messages and cache
change notices and says what ``DiscoveryResponse`` to send. Listeners and
clusters always go out as the full subscribed set (absence means deletion);
other types carry only what changed or was newly subscribed. ``version_info``
is a digest of everything the client holds after the response, so it changes
whenever any resource does and two replicas serving the same origin state
report the same version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ABSENT, UNKNOWN
from relay.constraints import params_of
from relay.protocol.held import Held
from relay.protocol.outcome import Nack, RequestOutcome
from relay.protocol.subscription import SubscriptionState, forward_error, heartbeats_due
from relay.protocol.view import NonceSource, ResourceView
from relay.resource import CachedResource, arrival_clock
from relay.xds_types import FULL_STATE_TYPES, LEGACY_WILDCARD_TYPES, WILDCARD


@dataclass(frozen=True)
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

    def head(self) -> discovery_pb2.DiscoveryResponse:
        """The response without its resources (they are appended pre-encoded)."""
        return discovery_pb2.DiscoveryResponse(
            type_url=self.type_url, nonce=self.nonce, version_info=self.version_info,
            resource_errors=self.errors)


def state_version(held: dict[str, Held]) -> str:
    """A digest of what the client holds: the ``version_info`` of a client state.

    It covers each resource's content digest too, so that new content under
    an unchanged origin version still changes ``version_info``.
    """
    digest = hashlib.blake2b(digest_size=8)
    for name in sorted(held):
        entry = held[name]
        for part in (name, entry.version, entry.variant_key or ""):
            digest.update(part.encode())
            digest.update(b"\0")
        digest.update(entry.digest or b"")
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass
class SotwSubscription(SubscriptionState):
    """SotW protocol state of one type on one stream."""

    # the client announced xds.config.supports-resource-in-sotw: resources with
    # a TTL go wrapped in Resource, and heartbeats reach it
    wrap_ttl: bool = False
    legacy_wildcard: bool = False
    last_nonce: str | None = None       # nonce of the latest response sent
    # (``inflight_nonce`` is that response, until the client answers it)
    version_info: str = ""              # of the latest response sent
    acked_version: str = ""
    # set after a cluster push: the next request is answered in full even if
    # it looks like a plain ACK (Envoy re-requests endpoints to warm clusters)
    answer_next_request: bool = False

    @property
    def full_state(self) -> bool:
        return self.type_url in FULL_STATE_TYPES

    # -- input -----------------------------------------------------------

    def on_request(self, request: discovery_pb2.DiscoveryRequest) -> RequestOutcome:
        """Apply one request. A request answering an older response is ignored."""
        outcome = RequestOutcome()
        before = self.interest()
        requested = set(request.resource_names)
        requested.update(loc.name for loc in request.resource_locators)
        locators = {loc.name: params_of(loc.dynamic_parameters)
                    for loc in request.resource_locators}

        if not self.started:
            # The first request of a type on a stream is initial, whatever nonce
            # it carries; the client's state is unknown, so everything is sent.
            self.started = True
            self.legacy_wildcard = not requested and self.type_url in LEGACY_WILDCARD_TYPES
            self.locator_params = locators
            self._set_names(requested, first=True)
            self.recheck_all = True
            self.must_answer = self.wildcard or (self.full_state and bool(self.names))
            outcome.interest_changed = self.interest() != before
            return outcome

        if self.last_nonce is not None and request.response_nonce != self.last_nonce:
            return outcome  # stale: the client has not seen our latest response yet
        if self.inflight_nonce is not None:
            outcome.ack_nonce = self.inflight_nonce
            if request.HasField("error_detail"):
                self.last_nack = Nack(self.inflight_nonce, request.error_detail.message,
                                      request.error_detail.code, self.version_info)
                outcome.nack = self.last_nack
            else:
                self.acked_version = self.version_info
            self.inflight_nonce = None

        if self.answer_next_request and request.response_nonce == self.last_nonce:
            self.answer_next_request = False
            self.held = {n: h for n, h in self.held.items() if n not in requested}
            self.pending.update(requested)
            self.must_answer = True
        for name in self.names & requested:
            if self.locator_params.get(name) != locators.get(name):
                # Parameters changed: re-evaluate which variant it gets.
                self.pending.add(name)
        self.locator_params = locators
        self._set_names(requested, first=False)
        outcome.interest_changed = self.interest() != before
        return outcome

    def _set_names(self, requested: set[str], first: bool) -> None:
        wildcard = WILDCARD in requested or (self.legacy_wildcard and not requested)
        names = requested - {WILDCARD}
        added = names - self.names
        if wildcard and not self.wildcard and not first:
            self.recheck_all = True
            self.must_answer = True
        self.wildcard = wildcard
        self.names = names
        if not self.wildcard:
            # Forget what the client unsubscribed (it drops it), so that a
            # later resubscribe resends it.
            for name in [n for n in self.held if n not in self.names]:
                del self.held[name]
        for name in added:
            if not first:
                self.held.pop(name, None)
            self.since[name] = arrival_clock()
            self.pending.add(name)
        if added and self.full_state:
            self.must_answer = True

    def heartbeats_received(self, names: frozenset[str]) -> None:
        """The origin confirmed these names unchanged (only Resource-aware clients hear it)."""
        if self.wrap_ttl:
            self.pending_heartbeats.update(names)

    # -- output ----------------------------------------------------------

    def has_work(self) -> bool:
        return self.started and self.inflight_nonce is None and (
            bool(self.pending) or self.recheck_all or self.must_answer or
            bool(self.pending_heartbeats))

    def next_response(self, view: ResourceView, nonces: NonceSource) -> SotwResponsePlan | None:
        """The response to send now, if any (none while one is in flight)."""
        if not self.has_work() or not view.is_synced(self.type_url):
            return None
        if self.full_state:
            return self._full_state_response(view, nonces)
        return self._changes_response(view, nonces)

    def _subscribed(self, view: ResourceView) -> set[str]:
        names = set(self.names)
        if self.wildcard:
            names.update(view.names(self.type_url))
        return names

    def _full_state_response(self, view: ResourceView,
                             nonces: NonceSource) -> SotwResponsePlan | None:
        resources: list[CachedResource] = []
        errors: list[discovery_pb2.ResourceError] = []
        for name in sorted(self._subscribed(view)):
            error = view.error(self.type_url, name, self.params_for(name))
            found = view.lookup(self.type_url, name, self.params_for(name))
            if found is UNKNOWN and error is None:
                # Absence would mean deletion to the client: wait until the
                # origin has said whether it exists (the cache will tell us).
                return None
            forwarded = forward_error(error, name, self.errors_sent)
            if forwarded is not None:
                errors.append(forwarded)
            if isinstance(found, CachedResource):
                if self._stale_for_us(found):
                    return None  # wait for the fresh copy rather than omit it
                resources.append(found)
        self.pending = set()
        self.changed = set()
        self.recheck_all = False
        new_held = {r.name: Held.of(r) for r in resources}
        beats = frozenset(n for n in self.pending_heartbeats
                          if n in self.held and n in new_held and self.held[n] == new_held[n])
        self.pending_heartbeats = set()
        if new_held == self.held and not self.must_answer and not errors:
            if not beats:
                return None
            # Unchanged state: a heartbeat response, all others in full.
            return self._emit(resources, nonces, errors, beats)
        self.held = new_held
        return self._emit(resources, nonces, errors)

    def _changes_response(self, view: ResourceView,
                          nonces: NonceSource) -> SotwResponsePlan | None:
        candidates = self._subscribed(view) if self.recheck_all else self.pending
        self.pending = set()
        self.changed = set()
        self.recheck_all = False
        resources: list[CachedResource] = []
        errors: list[discovery_pb2.ResourceError] = []
        for name in sorted(candidates):
            if not (self.wildcard or name in self.names):
                continue
            forwarded = forward_error(view.error(self.type_url, name, self.params_for(name)),
                                      name, self.errors_sent)
            if forwarded is not None:
                errors.append(forwarded)
            found = view.lookup(self.type_url, name, self.params_for(name))
            if found is UNKNOWN:
                continue
            if found is ABSENT:
                # SotW cannot say "removed" for these types; just forget it.
                self.held.pop(name, None)
                continue
            assert isinstance(found, CachedResource)
            if self._stale_for_us(found):
                continue
            held = self.held.get(name)
            if held is None or not held.is_current(found):
                resources.append(found)
                self.held[name] = Held.of(found)
        beats = heartbeats_due(self.pending_heartbeats, resources, view, self.type_url,
                               self.held, self.params_for,
                               lambda n: self.wildcard or n in self.names)
        self.pending_heartbeats = set()
        if not resources and not errors and not beats and not self.must_answer:
            return None
        return self._emit(resources + beats, nonces, errors,
                          frozenset(r.name for r in beats))

    def _stale_for_us(self, found: CachedResource) -> bool:
        """A do-not-cache copy fetched before this client asked: fetch it afresh."""
        held = self.held.get(found.name)
        if not found.do_not_cache or (held is not None and held.is_current(found)):
            return False
        if found.arrival <= self.since.get(found.name, 0):
            self.refetch.add(found.name)
            return True
        return False

    def _emit(self, resources: list[CachedResource], nonces: NonceSource,
              errors: list[discovery_pb2.ResourceError] | None = None,
              heartbeats: frozenset[str] = frozenset()) -> SotwResponsePlan:
        self.must_answer = False
        self.answer_next_request = False  # this response already answers it
        nonce = nonces.next()
        self.last_nonce = nonce
        self.inflight_nonce = nonce
        self.version_info = state_version(self.held)
        wrapped = frozenset(r.name for r in resources if r.name in self.locator_params or
                            (self.wrap_ttl and r.ttl_seconds is not None))
        return SotwResponsePlan(self.type_url, nonce, self.version_info, resources, wrapped,
                                errors or [], heartbeats)
