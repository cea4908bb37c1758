"""The relay's side of its Delta-ADS stream to the origin, without I/O.

:class:`UpstreamState` is given what downstream clients want (a
:class:`Demand`, read when it acts) and turns it into subscribe and
unsubscribe requests; it checks each origin response, writes usable ones
into the cache (one :class:`~relay.cache.Update` per response) and says
whether to ACK or NACK. The client loop in :mod:`relay.upstream.client` only
moves its messages over gRPC.

Subscriptions are *locators*: a name plus the dynamic parameters a client
needs it with (none for a plain name). The relay subscribes the distinct
locators its clients use, except where a cached variant, obtained through a
locator already subscribed, also answers the new parameters: that client is
served from cache with no upstream round trip.

A response tells nothing of which requests the origin had read when it sent
it. A locator is taken as *answered* (its clients may be told that nothing
exists for them) only by a response at least ``answer_grace`` after it was
subscribed, or ``answer_grace`` after a response that followed it sooner.

After a reconnect the cache may hold resources the origin deleted while the
relay was away. An origin that honours ``initial_resource_versions`` says so
with removals; one that ignores them (istiod) resends everything it has and
says nothing of the rest. So each cached variant must be either declared to
an origin that honours declarations, or confirmed on the new stream (resent,
heartbeated or reported in error); ``answer_grace`` after the origin's first
answer, the rest is removed. Which kind the origin is comes from the
``initial_versions`` setting, or, with ``auto``, from what it does: sending a
resource without a version (it cannot compare versions), or resending one the
relay declared it holds unchanged, shows that it ignores them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Collection, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import code_pb2, status_pb2

from relay.cache import ResourceCache, Update
from relay.constraints import UNCONSTRAINED, Locator, Params
from relay.resource import CachedResource
from relay.upstream.requests import Request, Split, SubscriptionChange, split_requests
from relay.upstream.responses import ParsedResponse, UnusableResponse, parse_response
from relay.xds_types import short_name

log = logging.getLogger("relay.upstream")

Locators = dict[str, set[Params]]
# What a deadline is for: ("linger", type URL, name, params), ("wildcard", type
# URL), ("settle", type URL, locator) or ("reconcile", type URL).
_Deadline = tuple[Any, ...]
# What the origin does with initial_resource_versions (see the module docstring).
InitialVersions = Literal["auto", "honoured", "ignored"]

# gRPC's default receive limit is 4 MiB; a quarter of it leaves room.
DEFAULT_MAX_REQUEST_SIZE = 1024 * 1024
# A NACK's reason quotes names from the response; keep it readable and small.
_MAX_NACK_MESSAGE = 2048

# How long after subscribing a locator a response must arrive for the relay to
# take it as the origin's answer (see the module docstring): more than the
# time an origin takes to read a request, less than a client's patience. The
# default of config's upstream.answer_grace.
SETTLE_GRACE = 0.5


class Demand(Protocol):
    """What downstream clients want of the origin: all the upstream reads from below.

    :class:`relay.interest.InterestIndex` provides it.
    """

    def wanted_types(self) -> list[str]:
        """Types with at least one name or wildcard subscription."""

    def wanted_locators(self, type_url: str) -> dict[str, frozenset[Params]]:
        """Per name, the distinct parameter sets clients want it with (a new dict)."""

    def wanted_params(self, type_url: str, name: str) -> frozenset[Params]:
        """The distinct parameter sets clients want one name with (empty: none)."""

    def wants_wildcard(self, type_url: str) -> bool:
        """Whether any client wants every resource of the type."""

    def origin_refused(self, type_url: str, names: Iterable[str], message: str) -> int:
        """The origin refused a subscription carrying ``names``: clients may
        not have them (for a while); how many clients held them."""


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


class UpstreamState:
    """Subscription and ACK bookkeeping for the one origin stream."""

    def __init__(self, node: base_pb2.Node, cache: ResourceCache,
                 linger: float = 0.0, answer_grace: float = SETTLE_GRACE,
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
                 initial_versions: InitialVersions = "auto") -> None:
        self.node = node
        self.answer_grace = answer_grace
        self.cache = cache
        self.linger = linger
        self.max_request_size = max_request_size
        self.initial_versions: InitialVersions = initial_versions
        # types whose origin showed that it ignores initial_resource_versions
        self._ignores_declarations: set[str] = set()
        self._resync: dict[str, _Resync] = {}
        self.connected = False
        # whether a valid response has arrived on any stream: the relay is synced
        self.answered = False
        self._node_sent = False
        # whether what the current stream does not subscribe to was forgotten
        self._pruned = True
        self._subscribed: dict[str, _TypeSubscription] = {}
        # what nobody wants any more, until it may go: per type URL, name and
        # parameter set (or the wildcard), the time after which it may go
        self._lingering: dict[str, dict[str, dict[Params, float]]] = {}
        self._lingering_wildcard: dict[str, float] = {}
        # every deadline set (lingering, settling, reconciling), soonest first,
        # with what it is for: one no longer standing is dropped when it comes up
        self._deadlines: list[tuple[float, int, _Deadline]] = []
        self._deadline_order = itertools.count()
        # locators subscribed on this stream that no response has followed yet,
        # with when they were subscribed
        self._unsettled: dict[str, dict[Locator, float]] = {}
        # locators a response followed too soon to be sure it answered them:
        # answered at the time given (by the timer, or by a response after it),
        # in the order they come due
        self._settling: dict[str, dict[Locator, float]] = {}
        # names re-subscribed to get a fresh do-not-cache copy, per type
        self._refetching: dict[str, set[str]] = {}

    def has_subscriptions(self) -> bool:
        """Whether anything is subscribed on the current stream."""
        return bool(self._subscribed)

    def subscription_counts(self) -> dict[str, int]:
        """Per type URL: resource locators subscribed on the stream (a wildcard counts one)."""
        # Snapshots (list(...)): the OTLP exporter calls this from its own thread.
        return {type_url: sum(len(params) for params in list(sub.locators.values()))
                + sub.wildcard for type_url, sub in list(self._subscribed.items())}

    def unanswered_names(self) -> dict[str, set[str]]:
        """Per type, the names subscribed on the current stream that the origin
        has answered neither here nor on an earlier stream: what it refused,
        when it refuses the stream. All those no response has followed yet
        when none is new (a first stream, say)."""
        suspects: dict[str, set[str]] = {}
        waiting: dict[str, set[str]] = {}
        for type_url, locators in self._unsettled.items():
            for locator in locators:
                waiting.setdefault(type_url, set()).add(locator.name)
                if not self.cache.is_answered(type_url, locator):
                    suspects.setdefault(type_url, set()).add(locator.name)
        return suspects or waiting

    # -- connection lifecycle ---------------------------------------------

    def on_connect(self, demand: Demand, now: float) -> list[Request]:
        """A new stream: resubscribe everything, telling the origin what is cached."""
        self.connected = True
        self._node_sent = False
        self._subscribed = {}
        self._unsettled = {}
        self._settling = {}
        self._resync = {}
        requests = []
        types = {*demand.wanted_types(), *self._lingering, *self._lingering_wildcard}
        self._pruned = False
        for type_url in sorted(types):
            target, wildcard = self._target(type_url, demand, now, None)
            if not target and not wildcard:
                continue
            self._subscribed[type_url] = _TypeSubscription(
                {n: set(ps) for n, ps in target.items()}, wildcard)
            self._unsettled[type_url] = {Locator(n, p): now
                                         for n, ps in target.items() for p in ps}
            initial = {}
            for name in target:
                found = self.cache.variants(type_url, name)
                if isinstance(found, Mapping) and len(found) == 1:
                    initial[name] = next(iter(found.values())).version
            # What the stream does not subscribe to is not the origin's to
            # confirm (names a restored snapshot holds that nobody wants).
            cached = [r for r in self.cache.resources(type_url)
                      if wildcard or self._covers(type_url, r.name, target)]
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

    def _covers(self, type_url: str, name: str, locators: Container[str]) -> bool:
        """Whether a cached ``name`` is subscribed, by itself or by an alias."""
        return name in locators or any(
            alias in locators for alias in self.cache.aliases_of(type_url, name))

    def _prune_unsubscribed(self) -> None:
        """The origin answered a new stream: forget what its subscription does
        not cover. The origin will neither confirm nor remove it, so it would
        go stale (names a restored snapshot holds that no client wants). A
        type the cache held whole is not whole without a wildcard subscription.
        """
        self._pruned = True
        for type_url in self.cache.type_urls():
            sub = self._subscribed.get(type_url, _TypeSubscription())
            if sub.wildcard:
                continue
            names = self.cache.names(type_url)
            keep = {name for name in names if self._covers(type_url, name, sub.locators)}
            if len(keep) < len(names) or self.cache.is_complete(type_url):
                self.cache.end_wildcard(type_url, keep)

    def on_disconnect(self) -> None:
        self.connected = False
        self._resync = {}

    # -- interest -----------------------------------------------------------

    def on_interest_changed(self, type_url: str, demand: Demand, now: float,
                            names: Collection[str] | None = None) -> list[Request]:
        """Downstream interest in ``type_url`` changed for ``names`` (None: look at
        every name): the requests to send, if any. Costs the names given."""
        sub = self._subscribed.get(type_url, _TypeSubscription())
        lingering = self._lingering.setdefault(type_url, {})
        if names is None:
            names = {*sub.locators, *demand.wanted_locators(type_url), *lingering}
        # Whatever nobody wants any more starts lingering (or goes at once).
        for name in names:
            wanted = demand.wanted_params(type_url, name)
            subscribed = sub.locators.get(name)
            if subscribed:
                for params in subscribed - wanted:
                    self._linger(type_url, name, params, now + self.linger)
            waiting = lingering.get(name)
            if wanted and waiting:
                for params in wanted:
                    waiting.pop(params, None)
                if not waiting:
                    del lingering[name]
        if demand.wants_wildcard(type_url):
            self._lingering_wildcard.pop(type_url, None)
        elif sub.wildcard and type_url not in self._lingering_wildcard:
            self._lingering_wildcard[type_url] = now + self.linger
            self._add_deadline(now + self.linger, ("wildcard", type_url))
        return self._sync_type(type_url, demand, now, names)

    def _linger(self, type_url: str, name: str, params: Params, until: float) -> None:
        waiting = self._lingering.setdefault(type_url, {}).setdefault(name, {})
        if params not in waiting:
            waiting[params] = until
            self._add_deadline(until, ("linger", type_url, name, params))

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

    def on_tick(self, demand: Demand, now: float) -> list[Request]:
        """Drop lingering subscriptions whose time is up; settle and reconcile what is due."""
        while self._deadlines and self._deadlines[0][0] <= now:
            heapq.heappop(self._deadlines)
        for type_url in list(self._settling):
            due = self._settle_due(type_url, now)
            if due:
                self.cache.apply(type_url, Update(answered=due))
        for type_url in list(self._resync):
            gone = self._reconcile_due(type_url, now)
            if gone:
                self.cache.apply(type_url, Update(removed_variants=gone))
        requests = []
        for type_url in sorted({*self._lingering, *self._lingering_wildcard}):
            due_names = [name for name, waiting in self._lingering.get(type_url, {}).items()
                         if min(waiting.values()) <= now]
            if due_names or self._lingering_wildcard.get(type_url, math.inf) <= now:
                requests.extend(self._sync_type(type_url, demand, now, due_names))
        return requests

    def next_deadline(self) -> float | None:
        """When :meth:`on_tick` has something to do next."""
        while self._deadlines:
            deadline, _, what = self._deadlines[0]
            if self._stands(deadline, what):
                return deadline
            heapq.heappop(self._deadlines)
        return None

    def _add_deadline(self, deadline: float, what: _Deadline) -> None:
        heapq.heappush(self._deadlines, (deadline, next(self._deadline_order), what))

    def _stands(self, deadline: float, what: _Deadline) -> bool:
        """Whether a deadline set earlier still holds (nothing moved or cancelled it)."""
        type_url = what[1]
        if what[0] == "linger":
            _, _, name, params = what
            return self._lingering.get(type_url, {}).get(name, {}).get(params) == deadline
        if what[0] == "wildcard":
            return self._lingering_wildcard.get(type_url) == deadline
        if what[0] == "settle":
            return self._settling.get(type_url, {}).get(what[2]) == deadline
        resync = self._resync.get(type_url)
        return resync is not None and resync.due(self.answer_grace) == deadline

    def _settle(self, type_url: str, now: float) -> list[Locator]:
        """A response arrived: the locators it answers (subscribed long enough
        before it); those subscribed sooner are due ``answer_grace`` after
        they were subscribed (see the module docstring)."""
        unsettled = self._unsettled.pop(type_url, {})
        settling = self._settling.setdefault(type_url, {})
        for locator, subscribed_at in unsettled.items():
            due = subscribed_at + self.answer_grace
            settling.pop(locator, None)  # kept in the order they come due
            settling[locator] = due
            if due > now:
                self._add_deadline(due, ("settle", type_url, locator))
        return self._settle_due(type_url, now)

    def _settle_due(self, type_url: str, now: float) -> list[Locator]:
        settling = self._settling.get(type_url, {})
        due = []
        for locator, at in settling.items():
            if at > now:
                break
            due.append(locator)
        for locator in due:
            del settling[locator]
        if not settling:
            self._settling.pop(type_url, None)
        return due

    def _target(self, type_url: str, demand: Demand, now: float,
                names: Collection[str] | None) -> tuple[Locators, bool]:
        """The locators to be subscribed to: what is needed and not answered
        already, for ``names`` (None: every name), and whether the wildcard is."""
        lingering = self._lingering.get(type_url, {})
        wildcard = demand.wants_wildcard(type_url) or \
            self._lingering_wildcard.get(type_url, -math.inf) > now
        needed: dict[str, frozenset[Params]]
        if names is None:
            needed = demand.wanted_locators(type_url)
            names = {*needed, *lingering}
        else:
            needed = {name: demand.wanted_params(type_url, name) for name in names}
        for name in names:
            waiting = lingering.get(name)
            if waiting:
                live = {params for params, until in waiting.items() if until > now}
                needed[name] = needed.get(name, frozenset()) | live
        current = self._subscribed.get(type_url, _TypeSubscription()).locators
        target: Locators = {}
        for name, params_set in needed.items():
            subscribed = current.get(name)
            if subscribed is None and len(params_set) == 1:
                # The common case: one plain name, new. Nothing subscribed
                # for it can answer from cache: it is subscribed as it is.
                target[name] = set(params_set)
                continue
            chosen = set() if subscribed is None else subscribed & params_set
            for params in sorted(params_set - chosen, key=_params_order):
                if not self._answered_by_cache(type_url, name, params, chosen):
                    chosen.add(params)
            target[name] = chosen
        return target, wildcard

    def _answered_by_cache(self, type_url: str, name: str, params: Params,
                           chosen: set[Params]) -> bool:
        """Whether a cached variant, obtained through ``chosen``, also fits ``params``."""
        if not chosen:
            return False  # nothing subscribed for the name brings a variant
        found = self.cache.variants(type_url, name)
        if not isinstance(found, Mapping):
            return False
        return any(variant.constraints.matches(params) and
                   any(variant.constraints.matches(q) for q in chosen)
                   for variant in found.values())

    def _sync_type(self, type_url: str, demand: Demand, now: float,
                   names: Collection[str] | None = None) -> list[Request]:
        """Bring the subscription of ``names`` (None: every name) and of the
        wildcard in line with what is needed."""
        self._drop_expired(type_url, now, names)
        target, wildcard = self._target(type_url, demand, now, names)
        sub = self._subscribed.setdefault(type_url, _TypeSubscription())
        scope = set(target) if names is not None else {*target, *sub.locators}
        subscribe: Locators = {}
        unsubscribe: Locators = {}
        for name in sorted(scope):
            new, old = target.get(name, set()), sub.locators.get(name, set())
            if new - old:
                subscribe[name] = new - old
            if old - new:
                unsubscribe[name] = old - new
            if new:
                sub.locators[name] = set(new)
            else:
                sub.locators.pop(name, None)
        for name, dropped in unsubscribe.items():
            self._forget(type_url, name, target.get(name, set()), dropped, wildcard,
                         sub.locators)
        unsettled = self._unsettled.setdefault(type_url, {})
        for locator in (Locator(n, p) for n, ps in subscribe.items() for p in ps):
            unsettled.pop(locator, None)  # kept in the order they were subscribed
            unsettled[locator] = now
        for locator in (Locator(n, p) for n, ps in unsubscribe.items() for p in ps):
            unsettled.pop(locator, None)
            self._settling.get(type_url, {}).pop(locator, None)
        was_wildcard = sub.wildcard
        if was_wildcard and not wildcard:
            self.cache.end_wildcard(type_url, sub.locators.keys())
        sub.wildcard = wildcard
        if not sub.locators and not sub.wildcard:
            del self._subscribed[type_url]
            self._resync.pop(type_url, None)
        if not self.connected or not (subscribe or unsubscribe or was_wildcard != wildcard):
            return []
        return self._split(SubscriptionChange(
            type_url, subscribe, unsubscribe,
            wildcard=None if was_wildcard == wildcard else wildcard)).requests

    def _drop_expired(self, type_url: str, now: float, names: Collection[str] | None) -> None:
        """Forget lingering subscriptions of ``names`` (None: all) whose time is up."""
        lingering = self._lingering.get(type_url)
        if lingering:
            for name in list(lingering) if names is None else \
                    [n for n in names if n in lingering]:
                waiting = lingering[name]
                for params in [p for p, until in waiting.items() if until <= now]:
                    del waiting[params]
                if not waiting:
                    del lingering[name]
        if not lingering:
            self._lingering.pop(type_url, None)
        if self._lingering_wildcard.get(type_url, math.inf) <= now:
            del self._lingering_wildcard[type_url]

    def _forget(self, type_url: str, name: str, kept: set[Params], dropped: set[Params],
                wildcard: bool, still_subscribed: Container[str]) -> None:
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

    # -- responses ------------------------------------------------------------

    def on_response(self, response: discovery_pb2.DeltaDiscoveryResponse, demand: Demand,
                    now: float = 0.0,
                    checked: ParsedResponse | UnusableResponse | None = None) -> list[Request]:
        """Check and apply one origin response; its ACK or NACK, then any resubscription.

        ``checked``: the response already parsed (see
        :func:`~relay.upstream.responses.parse_steps`), or why it cannot be used.
        """
        type_url = response.type_url
        try:
            if isinstance(checked, UnusableResponse):
                raise checked
            parsed = parse_response(response) if checked is None else checked
        except UnusableResponse as error:
            log.warning("NACK to origin type=%s nonce=%s: %s", short_name(type_url),
                        response.nonce, error)
            return [self._request(type_url, nonce=response.nonce, error=str(error))]
        self.answered = True
        if not self._pruned:
            self._prune_unsubscribed()
        ack = self._request(type_url, nonce=response.nonce)
        sub = self._subscribed.get(type_url)
        if sub is None:
            # A response for a type we no longer subscribe to raced our
            # unsubscribe: nothing in it is wanted, but it was valid: ACK it.
            return [ack]
        wanted = [r for r in parsed.upserts if sub.wildcard or r.name in sub.locators
                  or any(alias in sub.locators for alias in r.resource.aliases)]
        removed = [n for n in response.removed_resources if sub.wildcard or n in sub.locators
                   or self.cache.aliases_of(type_url, n) & sub.locators.keys()]
        errors = [e for e in response.resource_errors
                  if sub.wildcard or e.resource_name.name in sub.locators]
        beats = [b for b in parsed.heartbeats if sub.wildcard or b[0] in sub.locators]
        self._learn_declarations(type_url, wanted)
        resync = self._resync.get(type_url)
        if resync is not None:
            if resync.answered_at is None:
                resync.answered_at = now
                self._add_deadline(now + self.answer_grace, ("reconcile", type_url))
            resync.confirmed.update((r.name, r.variant_key) for r in wanted)
            resync.confirmed.update((name, key) for name, key, _ in beats)
            resync.erred.update(e.resource_name.name for e in errors)
        gone = self._reconcile_due(type_url, now)
        self.cache.apply(type_url, Update(
            wanted, removed, [*parsed.removed_variants, *gone], errors, beats,
            answered=self._settle(type_url, now), complete=True if sub.wildcard else None))
        self._refetching.pop(type_url, None)
        if not (removed or parsed.removed_variants or gone or
                any(r.constraints is not UNCONSTRAINED for r in wanted)):
            return [ack]
        # Variants changed: a client answered from cache may need its own locator.
        touched = {*(r.name for r in wanted), *removed,
                   *(name for name, _ in (*parsed.removed_variants, *gone))}
        return [ack, *self._sync_type(type_url, demand, now, touched)]

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

    def _reconcile_due(self, type_url: str, now: float) -> list[tuple[str, str]]:
        """Once the origin has answered a new stream: what it no longer has.

        The variants cached before the reconnect that it neither confirmed
        nor (to an origin that honours them) was told of; empty before the
        reconcile is due, and after it.
        """
        resync = self._resync.get(type_url)
        due = None if resync is None else resync.due(self.answer_grace)
        if resync is None or due is None or now < due:
            return []
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
        return sorted(gone)

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
