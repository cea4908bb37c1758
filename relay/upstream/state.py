"""The relay's side of its Delta-ADS stream to the origin, without I/O.

:class:`UpstreamState` turns downstream interest into subscribe and
unsubscribe requests, checks each origin response, writes usable ones into
the cache and says whether to ACK or NACK. The client loop in
:mod:`relay.upstream.client` only moves its messages over gRPC.

Subscriptions are *locators*: a name plus the dynamic parameters a client
needs it with (none for a plain name). The relay subscribes the distinct
locators its clients use, except where a cached variant, obtained through a
locator already subscribed, also answers the new parameters: that client is
served from cache with no upstream round trip.

After a reconnect the cache may hold resources the origin deleted while the
relay was away. An origin that honours ``initial_resource_versions`` says so
with removals; one that ignores them (istiod) resends everything it has and
says nothing of the rest. So each cached variant must be either declared to
an origin that honours declarations, or confirmed on the new stream (resent,
heartbeated or reported in error); once the origin has answered the
resubscription (``answer_grace`` after it, as for :meth:`UpstreamState._settle`),
the rest is removed. Which kind the origin is comes from the
``initial_versions`` setting, or, with ``auto``, from what it does: sending a
resource without a version (it cannot compare versions), or resending one the
relay declared it holds unchanged, shows that it ignores them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import message
from google.rpc import code_pb2, status_pb2

from relay.cache import ResourceCache
from relay.constraints import (
    EMPTY_PARAMS,
    UNCONSTRAINED,
    Constraints,
    InvalidConstraints,
    Params,
    compile_constraints,
)
from relay.resource import CachedResource
from relay.subscriptions import Interest, SubscriptionIndex
from relay.upstream.requests import Split, SubscriptionChange, split_requests
from relay.xds_types import WILDCARD, message_class, short_name

log = logging.getLogger("relay.upstream")

# The generated messages carry no type information; this names what flows.
Request: TypeAlias = Any  # discovery_pb2.DeltaDiscoveryRequest
Locators = dict[str, set[Params]]
# What the origin does with initial_resource_versions (see the module docstring).
InitialVersions = Literal["auto", "honoured", "ignored"]

# gRPC's default receive limit is 4 MiB; a quarter of it leaves room.
DEFAULT_MAX_REQUEST_SIZE = 1024 * 1024
# A NACK's reason quotes names from the response; keep it readable and small.
_MAX_NACK_MESSAGE = 2048


class UnusableResponse(Exception):
    """An origin response the relay must NACK; the message is the NACK's reason."""


def constraints_of(resource: discovery_pb2.Resource) -> Constraints:
    """The compiled constraints of a resource (raises InvalidConstraints)."""
    if not resource.HasField("resource_name") or \
            not resource.resource_name.HasField("dynamic_parameter_constraints"):
        return compile_constraints(None)
    return compile_constraints(resource.resource_name.dynamic_parameter_constraints)


def resource_name_of(resource: discovery_pb2.Resource) -> str:
    name: str = (resource.resource_name.name if resource.HasField("resource_name")
                 else resource.name)
    return name


def _params_order(params: Params) -> list[tuple[str, str]]:
    return sorted(params)


@dataclass
class _TypeSubscription:
    """What the origin has been asked for on the current stream."""

    locators: Locators = field(default_factory=dict)
    wildcard: bool = False


@dataclass
class _Resync:
    """A type's cache as it stood when a new stream opened, until the origin confirms it."""

    # (name, variant key) of every variant cached when the stream opened
    cached: set[tuple[str, str]]
    # initial_resource_versions sent, by name
    declared: dict[str, str]
    # names subscribed by name: an origin resends these whatever it was told
    explicit: frozenset[str]
    confirmed: set[tuple[str, str]] = field(default_factory=set)
    # names the origin reported errors for: what is cached of them stays
    erred: set[str] = field(default_factory=set)
    # when the first response of the type arrived on the stream
    answered_at: float | None = None

    def due(self, grace: float) -> float | None:
        """When to reconcile: ``grace`` after the origin's first answer, for the
        rest of its answer (to a subscription split over several requests) to
        arrive."""
        return None if self.answered_at is None else self.answered_at + grace


# How long after subscribing a locator a response must arrive for the relay to
# take it as the origin's answer (see UpstreamState._settle): more than the time
# an origin takes to read a request, less than a client's patience. The
# default of config's upstream.answer_grace.
SETTLE_GRACE = 0.5


class UpstreamState:
    """Subscription and ACK bookkeeping for the one origin stream."""

    def __init__(self, node: base_pb2.Node, cache: ResourceCache, index: SubscriptionIndex,
                 linger: float = 0.0, answer_grace: float = SETTLE_GRACE,
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
                 initial_versions: InitialVersions = "auto") -> None:
        self.node = node
        self.answer_grace = answer_grace
        self.cache = cache
        self.index = index
        self.linger = linger
        self.max_request_size = max_request_size
        self.initial_versions: InitialVersions = initial_versions
        # types whose origin showed that it ignores initial_resource_versions
        self._ignores_declarations: set[str] = set()
        self._resync: dict[str, _Resync] = {}
        self.connected = False
        self._node_sent = False
        self._subscribed: dict[str, _TypeSubscription] = {}
        # (type_url, name or "*", params) -> monotonic time after which it may go
        self._lingering: dict[tuple[str, str, Params], float] = {}
        # locators subscribed on this stream that no response has followed yet,
        # with when they were subscribed
        self._unsettled: dict[str, dict[tuple[str, Params], float]] = {}
        # locators a response followed too soon to be sure it answered them:
        # settled at the time given (by the timer, or by a response after it)
        self._settling: dict[str, dict[tuple[str, Params], float]] = {}
        self.last_nack: dict[str, str] = {}
        # names re-subscribed to get a fresh do-not-cache copy, per type
        self._refetching: dict[str, set[str]] = {}

    def subscription_counts(self) -> dict[str, int]:
        """Per type URL: resource locators subscribed on the stream (a wildcard counts one)."""
        # Snapshots (list(...)): the OTLP exporter calls this from its own thread.
        return {type_url: sum(len(params) for params in list(sub.locators.values()))
                + sub.wildcard for type_url, sub in list(self._subscribed.items())}

    # -- connection lifecycle ---------------------------------------------

    def on_connect(self, now: float) -> list[Request]:
        """A new stream: resubscribe everything, telling the origin what is cached."""
        self.connected = True
        self._node_sent = False
        self._subscribed = {}
        self._unsettled = {}
        self._settling = {}
        self._resync = {}
        requests = []
        types = set(self.index.wanted_types()) | {t for t, _, _ in self._lingering}
        for type_url in sorted(types):
            target, wildcard = self._target(type_url, now)
            if not target and not wildcard:
                continue
            self._subscribed[type_url] = _TypeSubscription(
                {n: set(ps) for n, ps in target.items()}, wildcard)
            self._unsettled[type_url] = {(n, p): now for n, ps in target.items() for p in ps}
            initial = {}
            for name in target:
                found = self.cache.variants(type_url, name)
                if isinstance(found, Mapping) and len(found) == 1:
                    initial[name] = next(iter(found.values())).version
            cached = list(self.cache.resources(type_url))
            if wildcard:
                initial.update({r.name: r.version for r in cached
                                if r.name not in initial and r.name not in target})
            split = self._split(SubscriptionChange(
                type_url, target, wildcard=True if wildcard else None, initial_versions=initial))
            requests.extend(split.requests)
            if cached:
                self._resync[type_url] = _Resync(
                    {(r.name, r.variant_key) for r in cached}, split.declared,
                    frozenset(target))
        return requests

    def on_disconnect(self) -> None:
        self.connected = False
        self._resync = {}

    # -- interest -----------------------------------------------------------

    def on_interest_changed(self, type_url: str, now: float) -> list[Request]:
        """Downstream interest in ``type_url`` changed: the request to send, if any."""
        wanted = self.index.wanted_locators(type_url)
        wildcard = self.index.wants_wildcard(type_url)
        sub = self._subscribed.get(type_url, _TypeSubscription())
        # Whatever nobody wants any more starts lingering (or goes at once).
        for name, params_set in sub.locators.items():
            for params in params_set - wanted.get(name, frozenset()):
                self._lingering.setdefault((type_url, name, params), now + self.linger)
        if sub.wildcard and not wildcard:
            self._lingering.setdefault((type_url, WILDCARD, EMPTY_PARAMS), now + self.linger)
        for name, wanted_params in wanted.items():
            for params in wanted_params:
                self._lingering.pop((type_url, name, params), None)
        if wildcard:
            self._lingering.pop((type_url, WILDCARD, EMPTY_PARAMS), None)
        return self._sync_type(type_url, now)

    def on_refetch(self, type_url: str, names: frozenset[str]) -> list[Request]:
        """Subscribe these names again so the origin resends them (do-not-cache).

        A name already being refetched is not asked for twice; the next
        response for the type ends the wait.
        """
        sub = self._subscribed.get(type_url)
        if sub is None or not self.connected:
            return []
        asking = self._refetching.setdefault(type_url, set())
        fresh = {n: set(sub.locators[n]) for n in names if n in sub.locators and n not in asking}
        if not fresh:
            return []
        asking.update(fresh)
        return self._split(SubscriptionChange(type_url, fresh)).requests

    def on_tick(self, now: float) -> list[Request]:
        """Drop lingering subscriptions whose time is up; settle and reconcile what is due."""
        for type_url in list(self._settling):
            self._settle_due(type_url, now)
        for type_url in list(self._resync):
            self._finish_resync_if_due(type_url, now)
        due = sorted({t for (t, _, _), deadline in self._lingering.items() if deadline <= now})
        requests = []
        for type_url in due:
            requests.extend(self._sync_type(type_url, now))
        return requests

    def next_deadline(self) -> float | None:
        return min((*self._lingering.values(),
                    *(t for due in self._settling.values() for t in due.values()),
                    *(due for r in self._resync.values()
                      if (due := r.due(self.answer_grace)) is not None)),
                   default=None)

    def _settle(self, type_url: str, now: float) -> None:
        """A response arrived: the locators subscribed long enough before it are answered.

        A response tells nothing of which requests the origin had read when
        it sent it. One that follows a subscription closely may have crossed
        it on the wire, and taking it as the answer would tell the clients
        of that locator that their resource does not exist. Those locators
        are settled ``answer_grace`` after they were subscribed instead (or
        by a response that late), when the origin has had time to answer.
        """
        unsettled = self._unsettled.pop(type_url, {})
        settling = self._settling.setdefault(type_url, {})
        for locator, subscribed_at in unsettled.items():
            settling[locator] = subscribed_at + self.answer_grace
        self._settle_due(type_url, now)

    def _settle_due(self, type_url: str, now: float) -> None:
        settling = self._settling.get(type_url, {})
        due = [locator for locator, at in settling.items() if at <= now]
        for locator in due:
            del settling[locator]
        if not settling:
            self._settling.pop(type_url, None)
        if due:
            self.cache.settle(type_url, due)

    def _target(self, type_url: str, now: float) -> tuple[Locators, bool]:
        """The locators to be subscribed to: what is needed and not answered already."""
        needed = self.index.wanted_locators(type_url)
        wildcard = self.index.wants_wildcard(type_url)
        for (t, name, params), deadline in self._lingering.items():
            if t != type_url or deadline <= now:
                continue
            if name == WILDCARD:
                wildcard = True
            else:
                needed[name] = needed.get(name, frozenset()) | {params}
        current = self._subscribed.get(type_url, _TypeSubscription()).locators
        target: Locators = {}
        for name, params_set in needed.items():
            subscribed = current.get(name)
            chosen = set() if subscribed is None else subscribed & params_set
            for params in sorted(params_set - chosen, key=_params_order):
                if not self._answered(type_url, name, params, chosen):
                    chosen.add(params)
            target[name] = chosen
        return target, wildcard

    def _answered(self, type_url: str, name: str, params: Params, chosen: set[Params]) -> bool:
        """Whether a cached variant, obtained through ``chosen``, also fits ``params``."""
        if not chosen:
            return False  # nothing subscribed for the name brings a variant
        found = self.cache.variants(type_url, name)
        if not isinstance(found, Mapping):
            return False
        return any(variant.constraints.matches(params) and
                   any(variant.constraints.matches(q) for q in chosen)
                   for variant in found.values())

    def _sync_type(self, type_url: str, now: float) -> list[Request]:
        for key in [k for k, d in self._lingering.items() if k[0] == type_url and d <= now]:
            del self._lingering[key]
        target, wildcard = self._target(type_url, now)
        sub = self._subscribed.setdefault(type_url, _TypeSubscription())
        subscribe: Locators = {}
        unsubscribe: Locators = {}
        for name in sorted(set(target) | set(sub.locators)):
            new, old = target.get(name, set()), sub.locators.get(name, set())
            if new - old:
                subscribe[name] = new - old
            if old - new:
                unsubscribe[name] = old - new
                self._forget(type_url, name, new, old - new, wildcard, set(target))
        unsettled = self._unsettled.setdefault(type_url, {})
        unsettled.update({(n, p): now for n, ps in subscribe.items() for p in ps})
        for locator in ((n, p) for n, ps in unsubscribe.items() for p in ps):
            unsettled.pop(locator, None)
            self._settling.get(type_url, {}).pop(locator, None)
        was_wildcard = sub.wildcard
        if was_wildcard and not wildcard:
            self.cache.forget_all_but(type_url, set(target))
        sub.locators = {n: set(ps) for n, ps in target.items() if ps}
        sub.wildcard = wildcard
        if not sub.locators and not sub.wildcard:
            del self._subscribed[type_url]
            self._resync.pop(type_url, None)
        if not self.connected or not (subscribe or unsubscribe or was_wildcard != wildcard):
            return []
        return self._split(SubscriptionChange(
            type_url, subscribe, unsubscribe,
            wildcard=None if was_wildcard == wildcard else wildcard)).requests

    def _forget(self, type_url: str, name: str, kept: set[Params], dropped: set[Params],
                wildcard: bool, still_subscribed: set[str]) -> None:
        """Drop cached variants that no remaining subscription keeps current."""
        if wildcard:
            return  # the wildcard subscription still brings every variant
        if not kept:
            self.cache.forget(type_url, [name], keep=still_subscribed)
            return
        found = self.cache.variants(type_url, name)
        keep = [key for key, variant in found.items()
                if any(variant.constraints.matches(p) for p in kept)] \
            if isinstance(found, Mapping) else []
        self.cache.forget_variants(type_url, name, keep, dropped)

    def subscription(self, type_url: str) -> Interest:
        """What the origin has been asked for (for tests and the admin view)."""
        sub = self._subscribed.get(type_url)
        if sub is None:
            return Interest()
        params = frozenset((n, p) for n, ps in sub.locators.items() for p in ps if p)
        return Interest(frozenset(sub.locators), sub.wildcard, params)

    # -- responses ------------------------------------------------------------

    def on_response(self, response: discovery_pb2.DeltaDiscoveryResponse,
                    now: float = 0.0) -> list[Request]:
        """Check and apply one origin response; its ACK or NACK, then any resubscription."""
        type_url = response.type_url
        try:
            upserts, removed_variants, heartbeats = self._check(response)
        except UnusableResponse as error:
            self.last_nack[type_url] = str(error)
            log.warning("NACK to origin type=%s nonce=%s: %s", short_name(type_url),
                        response.nonce, error)
            return [self._request(type_url, nonce=response.nonce, error=str(error))]
        ack = self._request(type_url, nonce=response.nonce)
        sub = self._subscribed.get(type_url)
        if sub is None:
            # A response for a type we no longer subscribe to raced our
            # unsubscribe: nothing in it is wanted, but it was valid: ACK it.
            return [ack]
        wanted = [r for r in upserts if sub.wildcard or r.name in sub.locators
                  or any(alias in sub.locators for alias in r.resource.aliases)]
        removed = [n for n in response.removed_resources if sub.wildcard or n in sub.locators
                   or self.cache.aliases_of(type_url, n) & sub.locators.keys()]
        errors = [e for e in response.resource_errors
                  if sub.wildcard or e.resource_name.name in sub.locators]
        beats = [b for b in heartbeats if sub.wildcard or b[0] in sub.locators]
        self._learn_declarations(type_url, wanted)
        self.cache.apply(type_url, wanted, removed, removed_variants,
                         complete=True if sub.wildcard else None, errors=errors)
        self.cache.heartbeat(type_url, beats)
        resync = self._resync.get(type_url)
        if resync is not None:
            if resync.answered_at is None:
                resync.answered_at = now
            resync.confirmed.update((r.name, r.variant_key) for r in wanted)
            resync.confirmed.update((name, key) for name, key, _ in beats)
            resync.erred.update(e.resource_name.name for e in errors)
            self._finish_resync_if_due(type_url, now)
        self._settle(type_url, now)
        self._refetching.pop(type_url, None)
        if not (removed or removed_variants or
                any(r.constraints is not UNCONSTRAINED for r in wanted)):
            return [ack]
        # Variants changed: a client answered from cache may need its own locator.
        return [ack, *self._sync_type(type_url, now)]

    def _learn_declarations(self, type_url: str, resources: list[CachedResource]) -> None:
        """With ``initial_versions: auto``, notice an origin that ignores them."""
        if self.initial_versions != "auto" or type_url in self._ignores_declarations:
            return
        resync = self._resync.get(type_url)
        for resource in resources:
            if resource.derived_version:
                why = "it sends resources without a version"
            elif resync is not None and resource.name not in resync.explicit and \
                    resync.declared.get(resource.name) == resource.version:
                why = f"it resent {resource.name!r}, declared unchanged"
            else:
                continue
            self._ignores_declarations.add(type_url)
            log.info("origin ignores initial_resource_versions for %s (%s): after a reconnect, "
                     "what it does not resend is taken as removed", short_name(type_url), why)
            return

    def trusts_declarations(self, type_url: str) -> bool:
        """Whether the origin is taken to honour initial_resource_versions for this type."""
        return self.initial_versions == "honoured" or (
            self.initial_versions == "auto" and type_url not in self._ignores_declarations)

    def _finish_resync_if_due(self, type_url: str, now: float) -> None:
        """Once the origin has answered a new stream: remove what it no longer has."""
        resync = self._resync.get(type_url)
        due = None if resync is None else resync.due(self.answer_grace)
        if resync is None or due is None or now < due:
            return
        del self._resync[type_url]
        trusted = self.trusts_declarations(type_url)
        gone = []
        for name, key in resync.cached - resync.confirmed:
            if name in resync.erred or (trusted and name in resync.declared):
                continue
            found = self.cache.variants(type_url, name)
            if isinstance(found, Mapping) and key in found:
                gone.append((name, key))
        if gone:
            log.info("origin no longer has %d %s resource(s) cached before the reconnect: "
                     "removing them", len(gone), short_name(type_url))
            self.cache.apply(type_url, [], removed_variants=sorted(gone))

    def _check(self, response: discovery_pb2.DeltaDiscoveryResponse
               ) -> tuple[list[CachedResource], list[tuple[str, str]],
                          list[tuple[str, str, str]]]:
        """Parse a response: its upserts, removed variants and heartbeats."""
        type_url = response.type_url
        if not type_url:
            raise UnusableResponse("response has no type_url")
        if not response.nonce:
            raise UnusableResponse("response has no nonce")
        body_class = message_class(type_url)
        seen: set[tuple[str, str]] = set()
        upserts: list[CachedResource] = []
        heartbeats: list[tuple[str, str, str]] = []
        for resource in response.resources:
            name = resource_name_of(resource)
            if not name:
                raise UnusableResponse("a resource has no name")
            try:
                constraints = constraints_of(resource)
            except InvalidConstraints as error:
                raise UnusableResponse(
                    f"resource {name!r} has invalid dynamic parameter constraints: "
                    f"{error}") from None
            key = (name, constraints.key)
            if key in seen:
                raise UnusableResponse(f"resource {name!r} appears more than once")
            seen.add(key)
            if not resource.HasField("resource"):
                heartbeats.append((name, constraints.key, resource.version))
                continue  # a heartbeat: nothing changes, the TTL restarts
            body = resource.resource
            if body.type_url != type_url:
                raise UnusableResponse(
                    f"resource {name!r} has type {body.type_url!r} in a response for "
                    f"{type_url!r}")
            if body_class is not None:
                try:
                    body_class.FromString(body.value)
                except message.DecodeError as error:
                    raise UnusableResponse(
                        f"resource {name!r} cannot be decoded as {type_url}: {error}") from None
            upserts.append(CachedResource.from_origin(type_url, name, resource, constraints))
        removed_variants = []
        for removed in response.removed_resource_names:
            try:
                constraints = compile_constraints(
                    removed.dynamic_parameter_constraints
                    if removed.HasField("dynamic_parameter_constraints") else None)
            except InvalidConstraints as error:
                raise UnusableResponse(
                    f"removed resource {removed.name!r} has invalid dynamic parameter "
                    f"constraints: {error}") from None
            removed_variants.append((removed.name, constraints.key))
        for failed in response.resource_errors:
            name = failed.resource_name
            if not name.name:
                raise UnusableResponse("a resource error names no resource")
            try:
                compile_constraints(name.dynamic_parameter_constraints
                                    if name.HasField("dynamic_parameter_constraints") else None)
            except InvalidConstraints as error:
                raise UnusableResponse(
                    f"resource error for {name.name!r} has invalid dynamic parameter "
                    f"constraints: {error}") from None
        return upserts, removed_variants, heartbeats

    def _request(self, type_url: str, *, nonce: str = "", error: str | None = None) -> Request:
        """An ACK, or a NACK with ``error`` as its reason."""
        request = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=nonce)
        if error is not None:
            if len(error) > _MAX_NACK_MESSAGE:
                error = error[:_MAX_NACK_MESSAGE] + "..."
            request.error_detail.CopyFrom(
                status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=error))
        if not self._node_sent:
            request.node.CopyFrom(self.node)
            self._node_sent = True
        return request

    def _split(self, change: SubscriptionChange) -> Split:
        """A subscription change as requests the origin can read (the node in the first)."""
        split = split_requests(change, self.max_request_size,
                               None if self._node_sent else self.node)
        self._node_sent = True
        return split
