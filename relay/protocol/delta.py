"""Incremental (delta) xDS: one stream's subscription state for one type.

:class:`DeltaSubscription` consumes ``DeltaDiscoveryRequest`` messages and
cache change notices, and answers :meth:`~DeltaSubscription.next_response`
with what to send, or ``None``. It keeps at most one response in flight: while
one is un-ACKed, changes pile up as a set of names (latest state wins, bounded
by the subscription) and go out together once the client answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ABSENT, UNKNOWN
from relay.constraints import Params, params_of
from relay.protocol.held import Held
from relay.protocol.outcome import Nack, RequestOutcome
from relay.protocol.subscription import SubscriptionState, forward_error, heartbeats_due
from relay.protocol.view import NonceSource, ResourceView
from relay.resource import CachedResource, arrival_clock
from relay.xds_types import LEGACY_WILDCARD_TYPES, WILDCARD


@dataclass(frozen=True)
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

    def head(self) -> discovery_pb2.DeltaDiscoveryResponse:
        """The response without its resources (they are appended pre-encoded)."""
        return discovery_pb2.DeltaDiscoveryResponse(
            type_url=self.type_url, nonce=self.nonce, removed_resources=self.removed,
            removed_resource_names=self.removed_names, resource_errors=self.errors)


@dataclass
class DeltaSubscription(SubscriptionState):
    """Delta protocol state of one type on one stream."""

    # subscribed names not yet answered with a resource or a removal
    unanswered: set[str] = field(default_factory=set)
    # arrival stamp when the wildcard was subscribed (see ``since``)
    wildcard_since: int = 0
    # names subscribed again while held: sent again even if unchanged
    resend: set[str] = field(default_factory=set)
    inflight_versions: str = ""  # "name=version,..." of the response in flight
    acked_nonce: str | None = None

    # -- input -----------------------------------------------------------

    def on_request(self, request: discovery_pb2.DeltaDiscoveryRequest) -> RequestOutcome:
        """Apply one request: ACK/NACK bookkeeping and subscription changes."""
        outcome = RequestOutcome()
        before = self.interest()
        first = not self.started
        self.started = True

        nonce = request.response_nonce
        if nonce and nonce == self.inflight_nonce:
            self.inflight_nonce = None
            outcome.ack_nonce = nonce
            if request.HasField("error_detail"):
                # The client keeps what it had; we do not resend the same
                # versions (``held`` already records them), only later changes.
                self.last_nack = Nack(nonce, request.error_detail.message,
                                      request.error_detail.code, self.inflight_versions)
                outcome.nack = self.last_nack
            else:
                self.acked_nonce = nonce
        # A stale nonce still carries valid subscription changes: apply them.

        subscribe: list[tuple[str, Params | None]] = [
            (name, None) for name in request.resource_names_subscribe]
        subscribe += [(loc.name, params_of(loc.dynamic_parameters))
                      for loc in request.resource_locators_subscribe]
        unsubscribe = list(request.resource_names_unsubscribe)
        unsubscribe += [loc.name for loc in request.resource_locators_unsubscribe]

        if first:
            self.held = {name: Held(version)
                         for name, version in request.initial_resource_versions.items()}
            if not subscribe and self.type_url in LEGACY_WILDCARD_TYPES:
                self._start_wildcard()
            # Whatever the client says it holds must be checked against the cache.
            self.pending.update(self.held)

        for name, params in subscribe:
            if name == WILDCARD:
                if not self.wildcard:
                    self._start_wildcard()
                continue
            if params is None:
                self.locator_params.pop(name, None)
            else:
                self.locator_params[name] = params
            self.names.add(name)
            self.since[name] = arrival_clock()
            self.unanswered.add(name)
            self.pending.add(name)
            if not first and name in self.held:
                # The client may have dropped it: always send a subscribed name.
                # (What it held is kept, so that a removal can name the variant.)
                self.resend.add(name)

        for name in unsubscribe:
            if name == WILDCARD:
                self.wildcard = False
                self.recheck_all = False
                for held_name in [n for n in self.held if n not in self.names]:
                    del self.held[held_name]
                continue
            if name not in self.names:
                continue
            self.names.discard(name)
            self.locator_params.pop(name, None)
            self.unanswered.discard(name)
            self.held.pop(name, None)
            self.resend.discard(name)
            if self.wildcard:
                # The client dropped it, but wildcard still covers it: send it
                # again, or report it removed if it is gone.
                self.unanswered.add(name)
                self.pending.add(name)

        outcome.interest_changed = self.interest() != before
        return outcome

    def _start_wildcard(self) -> None:
        self.wildcard_since = arrival_clock()
        self.wildcard = True
        self.must_answer = True
        self.recheck_all = True

    def heartbeats_received(self, names: frozenset[str]) -> None:
        """The origin confirmed these names unchanged: pass the heartbeat on."""
        self.pending_heartbeats.update(names)

    # -- output ----------------------------------------------------------

    def has_work(self) -> bool:
        return self.inflight_nonce is None and (
            bool(self.pending) or self.recheck_all or self.must_answer or
            bool(self.pending_heartbeats))

    def next_response(self, view: ResourceView, nonces: NonceSource) -> DeltaResponsePlan | None:
        """The response to send now, if any (none while one is in flight)."""
        if not self.has_work() or not view.is_synced(self.type_url):
            return None
        if self.recheck_all:
            candidates = set(self.names) | set(self.held) | self.unanswered | self.pending
            if self.wildcard:
                candidates.update(view.names(self.type_url))
        else:
            candidates = self.pending
        self.pending = set()
        self.changed = set()
        self.recheck_all = False

        resources: list[CachedResource] = []
        removed: list[str] = []
        removed_names: list[discovery_pb2.ResourceName] = []
        errors: list[discovery_pb2.ResourceError] = []
        for name in sorted(candidates):
            if not (self.wildcard or name in self.names):
                continue
            error = forward_error(view.error(self.type_url, name, self.params_for(name)),
                                  name, self.errors_sent)
            if error is not None:
                errors.append(error)
            found = view.lookup(self.type_url, name, self.params_for(name))
            if found is UNKNOWN:
                continue
            if found is ABSENT:
                self.resend.discard(name)
                held = self.held.pop(name, None)
                if held is not None and held.resource_name is not None:
                    if held.resource_name not in removed_names:
                        removed_names.append(held.resource_name)
                elif held is not None or name in self.unanswered:
                    # A resource subscribed by alias went out under its own name.
                    gone = (held.canonical or name) if held else name
                    if gone not in removed:  # subscribed by name and by alias
                        removed.append(gone)
                self.unanswered.discard(name)
                continue
            assert isinstance(found, CachedResource)
            if found.do_not_cache and found.arrival <= self.since.get(name, self.wildcard_since):
                self.refetch.add(name)  # fetched before we asked: not ours to reuse
                continue
            self.unanswered.discard(name)
            held = self.held.get(name)
            if held is None or not held.is_current(found) or name in self.resend:
                self.resend.discard(name)
                # Moving to another variant is one update, never remove-then-add.
                if found not in resources:  # subscribed by name and by alias
                    resources.append(found)
                self.held[name] = Held.of(found, name)

        heartbeats = heartbeats_due(self.pending_heartbeats, resources, view, self.type_url,
                                    self.held, self.params_for,
                                    lambda n: self.wildcard or n in self.names)
        self.pending_heartbeats = set()
        if not (resources or removed or removed_names or errors or heartbeats or
                self.must_answer):
            return None
        self.must_answer = False
        nonce = nonces.next()
        self.inflight_nonce = nonce
        self.inflight_versions = ",".join(f"{r.name}={r.version}" for r in resources)
        return DeltaResponsePlan(self.type_url, nonce, resources, removed, removed_names,
                                 errors, heartbeats)
