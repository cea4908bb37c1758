"""The relay's side of one Delta-ADS stream to an origin, without I/O.

:class:`UpstreamState` is given what downstream clients want (a
:class:`Demand`, read when it acts) and turns it into subscribe and
unsubscribe requests; it takes each parsed origin response, writes what is
subscribed of it into the cache (one :class:`~relay.cache.Update` per
response) and returns the outcome, :class:`Acked` or :class:`Nacked`. The
client loop in :mod:`relay.upstream.client` parses responses, moves messages
over gRPC and applies outcomes.

It is made of one small object per idea, each built by its constructor from
the origin's settings, so that a second origin is a second ``UpstreamState``:

* :class:`~relay.upstream.targets.Targets`: what to subscribe (what clients
  want, what lingers, what the cache already serves);
* :class:`~relay.upstream.settling.Settling`: which subscribed locators the
  origin has answered, and from when;
* :class:`~relay.upstream.resync.Resync`: what must be confirmed after a
  reconnect, and what goes once it is not;
* :class:`~relay.upstream.requests.RequestCutter`: how requests are cut;
* :class:`~relay.upstream.deadlines.Deadlines`: when each of them next has
  something to do, one heap of typed records.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Generator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import assert_never

from envoy.config.core.v3 import base_pb2

from relay.cache import Update
from relay.constraints import UNCONSTRAINED
from relay.resource import CachedResource
from relay.turns import made, slice_starts
from relay.upstream.deadlines import (
    Deadline,
    Deadlines,
    LingerEnds,
    ReconcileDue,
    SettleDue,
    WildcardAnswerDue,
    WildcardLingerEnds,
)
from relay.upstream.requests import (
    Request,
    RequestCutter,
    SubscriptionChange,
    answered_requests,
)
from relay.upstream.responses import ParsedResponse, Unusable
from relay.upstream.resync import InitialVersions, Resync
from relay.upstream.scoped import OriginCache
from relay.upstream.settling import Settling
from relay.upstream.targets import (
    DEFAULT_LINGER_NAMES,
    Demand,
    Targets,
    TypeSubscription,
    in_collection,
    locators_of,
)
from relay.upstream.wildcards import WildcardAnswers
from relay.xds_types import short_name

__all__ = ["DEFAULT_LINGER_NAMES", "DEFAULT_MAX_REQUEST_SIZE", "SETTLE_GRACE", "Acked", "Demand",
           "InitialVersions", "Nacked", "ResponseOutcome", "UpstreamState"]

log = logging.getLogger("relay.upstream")

_NAME = attrgetter("name")

#: Names :meth:`UpstreamState.connect_steps` takes between two pauses: at
#: 10,000, a step holds the event loop ~10-25 ms on a 2-core machine.
NAMES_PER_STEP = 10_000

# gRPC's default receive limit is 4 MiB; a quarter of it leaves room.
DEFAULT_MAX_REQUEST_SIZE = 1024 * 1024

# How long after subscribing a locator a response must arrive for the relay to
# take it as the origin's answer (see relay.upstream.settling): more than the
# time an origin takes to read a request, less than a client's patience. The
# default of config's upstream.answer_grace.
SETTLE_GRACE = 0.5


@dataclass(frozen=True)
class Acked:
    """A usable response, applied: ``requests`` are its ACK, then any
    resubscription it calls for; ``update`` is what the cache was told (None:
    a response for a type no longer subscribed, of which nothing is kept)."""

    requests: list[Request]
    update: Update | None


@dataclass(frozen=True)
class Nacked:
    """An unusable response: ``requests`` is its NACK, giving ``reason``;
    nothing of it was used."""

    reason: str
    requests: list[Request]


ResponseOutcome = Acked | Nacked


class UpstreamState:
    """Subscriptions, settling, resync and requests of one origin stream.

    Everything it holds is built here from its arguments: nothing is shared
    with another instance but the cache and the demand it is given.
    """

    def __init__(self, node: base_pb2.Node, cache: OriginCache,
                 linger: float = 0.0, answer_grace: float = SETTLE_GRACE,
                 max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
                 initial_versions: InitialVersions = "auto",
                 linger_names: int | None = DEFAULT_LINGER_NAMES) -> None:
        self.cache = cache
        self._deadlines = Deadlines()
        # (linger_names: the most locators lingering at once; None: no bound)
        self._targets = Targets(cache, linger, self._deadlines, linger_names)
        self._settling = Settling(answer_grace, self._deadlines)
        self._resync = Resync(cache, answer_grace, initial_versions, self._deadlines)
        self._wildcards = WildcardAnswers(answer_grace, self._deadlines)
        self._requests = RequestCutter(node, max_request_size)
        self.connected = False
        # whether a usable response has arrived on any stream: the relay is synced
        self._synced = False

    @property
    def answer_grace(self) -> float:
        return self._settling.grace

    @property
    def node(self) -> base_pb2.Node:
        """The node the relay presents to the origin (a probe of its primary presents it too)."""
        return self._requests.node

    @property
    def synced(self) -> bool:
        """Whether the origin has sent a usable response, on this stream or an earlier one."""
        return self._synced

    def subscription_counts(self) -> dict[str, int]:
        """Per type URL: resource locators subscribed on the stream (a wildcard counts one)."""
        return self._targets.subscription_counts()

    def unanswered_names(self) -> dict[str, set[str]]:
        """Per type, the names subscribed on the current stream that the origin
        has answered neither here nor on an earlier stream: what it refused,
        when it refuses the stream. All those no response has followed yet
        when none is new (a first stream, say)."""
        return self._settling.unanswered_names(self.cache.is_answered)

    def trusts_declarations(self, type_url: str) -> bool:
        """Whether the origin is taken to honour initial_resource_versions for this type."""
        return self._resync.trusts_declarations(type_url)

    # -- connection lifecycle ---------------------------------------------

    def on_connect(self, demand: Demand, now: float) -> list[Request]:
        """A new stream: resubscribe everything, telling the origin what is cached."""
        return made(self.connect_steps(demand, now, step=0))

    def connect_steps(self, demand: Demand, now: float, step: int | None = None
                      ) -> Generator[None, None, list[Request]]:
        """:meth:`on_connect` in steps: a generator that pauses (yields)
        between types, and every ``step`` names of one (never with 0;
        :data:`NAMES_PER_STEP` unless given). A big client's 50,000 names
        took the event loop 350-440 ms in one go (benchmarks/reconnect_steps.py).
        Until it returns the state must be handed nothing else (the upstream
        client holds interest changes and deadlines meanwhile)."""
        step = NAMES_PER_STEP if step is None else step
        self.connected = True
        self._requests.new_stream()
        self._settling.new_stream()
        self._resync.new_stream()
        self._wildcards.new_stream()
        requests = []
        for type_url in self._targets.new_stream(demand):
            sub = self._targets.resubscribe(type_url, demand, now)
            if sub is None:
                continue
            if step and len(sub.locators) > step:
                yield  # (what is wanted, found and copied: 30-40 ms of 50,000 names)
            self._settling.subscribed_all(type_url, sub.locators, now)
            if sub.wildcard and not self.cache.holds_wildcard(type_url):
                self._wildcards.asked(type_url, now)
            if step:
                yield
            initial, cached = yield from self._resync.declaration_steps(
                type_url, sub.locators, sub.wildcard, step)
            split = yield from self._requests.split_steps(SubscriptionChange(
                type_url, sub.locators, wildcard=True if sub.wildcard else None,
                initial_versions=initial), step)
            requests.extend(split.requests)
            self._resync.begin(type_url, cached, split.declared, frozenset(sub.locators),
                               answered_requests(split.requests))
            if step:
                yield
        self._resync.declare_nothing = False
        return requests

    def on_server_changed(self) -> None:
        """The next stream goes to another server of the origin (see
        :meth:`Resync.server_changed`): it is resynced as after a reconnect,
        declaring nothing."""
        self._resync.server_changed()

    def on_disconnect(self) -> None:
        self.connected = False
        self._resync.new_stream()
        self._wildcards.new_stream()

    # -- interest -----------------------------------------------------------

    def on_interest_changed(self, type_url: str, demand: Demand, now: float,
                            names: Collection[str] | None = None) -> list[Request]:
        """Downstream interest in ``type_url`` changed for ``names`` (None: look at
        every name): the requests to send, if any. Costs the names given."""
        names = self._targets.interest_changed(type_url, demand, now, names)
        return self._sync_type(type_url, demand, now, names)

    def on_refetch(self, type_url: str, names: frozenset[str]) -> list[Request]:
        """Subscribe these names again so the origin resends them (do-not-cache)."""
        change = self._targets.refetch(type_url, names) if self.connected else None
        return [] if change is None else self._requests.split(change).requests

    def _sync_type(self, type_url: str, demand: Demand, now: float,
                   names: Collection[str] | None = None) -> list[Request]:
        """Bring the subscription of ``names`` (None: every name) and of the
        wildcard in line with what is needed: the requests that say so."""
        change = self._targets.sync(type_url, demand, now, names)
        self._settling.subscribed_all(type_url, change.subscribe, now)
        self._settling.unsubscribed(type_url, locators_of(change.unsubscribe))
        if self._targets.subscription(type_url) is None:
            self._resync.drop(type_url)
        if change.wildcard is False:
            self._wildcards.settled(type_url)
        if not self.connected or change.is_empty():
            return []
        if change.wildcard and not self.cache.holds_wildcard(type_url):
            self._wildcards.asked(type_url, now)
        return self._requests.split(change).requests

    # -- time -------------------------------------------------------------------

    def on_tick(self, demand: Demand, now: float) -> list[Request]:
        """Drop lingering subscriptions whose time is up; settle and reconcile what is due."""
        return made(self.tick_steps(demand, now, step=0))

    def tick_steps(self, demand: Demand, now: float, step: int | None = None
                   ) -> Generator[None, None, list[Request]]:
        """:meth:`on_tick` in steps: a generator that pauses (yields) every
        ``step`` locators settled (never with 0; :data:`NAMES_PER_STEP`
        unless given), each slice answered in the cache by a write of its
        own. After istiod's resend of 50,000 names, settling them in one go
        held the event loop 40-70 ms, to find each answered already. Until it
        returns the state must be handed nothing else (as for
        :meth:`connect_steps`)."""
        step = NAMES_PER_STEP if step is None else step
        self._deadlines.drop_due(now)
        for type_url, settled in self._settling.due_keys(now).items():
            for start in slice_starts(len(settled), step):
                if start:
                    yield
                self.cache.apply(type_url, Update(answered=settled[start:start + step]
                                                  if step else settled))
        for type_url, gone in self._resync.due(now).items():
            self.cache.apply(type_url, Update(removed_variants=gone))
        for type_url in self._wildcards.due(now):
            # (a type never answered still waits for the origin's first response)
            sub = self._targets.subscription(type_url)
            if sub is not None and sub.wildcard and self.cache.is_synced(type_url):
                self.cache.apply(type_url, Update(wildcard_answered=True))
        requests = []
        for type_url, names in self._targets.lingering.due(now):
            requests.extend(self._sync_type(type_url, demand, now, names))
        return requests

    def next_deadline(self) -> float | None:
        """When :meth:`on_tick` has something to do next."""
        return self._deadlines.next(self._stands)

    def _stands(self, deadline: Deadline) -> bool:
        """Whether a deadline set earlier still holds: its setter says."""
        match deadline:
            case LingerEnds() | WildcardLingerEnds():
                return self._targets.lingering.stands(deadline)
            case SettleDue():
                return self._settling.stands(deadline)
            case ReconcileDue():
                return self._resync.stands(deadline)
            case WildcardAnswerDue():
                return self._wildcards.stands(deadline)
            case _:
                assert_never(deadline)

    # -- responses ------------------------------------------------------------

    def on_response(self, parsed: ParsedResponse, demand: Demand, now: float) -> Acked:
        """Apply a usable response: its ACK, then any resubscription it calls for."""
        return made(self.response_steps(parsed, demand, now, step=0))

    def response_steps(self, parsed: ParsedResponse, demand: Demand, now: float,
                       step: int | None = None) -> Generator[None, None, Acked]:
        """:meth:`on_response` in steps, where the response carries more than
        ``step`` resources (:data:`NAMES_PER_STEP` unless given; never with
        0): a generator that pauses (yields) after the stream's first prune,
        between what is subscribed and the resync's bookkeeping, and as the
        cache writes it (see :meth:`~relay.cache.ResourceCache.apply_steps`).
        istiod's resend of 50,000 took the event loop 86-251 ms in one go
        (with no step per name left in it). Until it returns the state must
        be handed nothing else (as for :meth:`connect_steps`)."""
        step = NAMES_PER_STEP if step is None else step
        if len(parsed.upserts) <= step:
            step = 0
        type_url = parsed.type_url
        self._synced = True
        self._targets.prune_once()
        ack = self._requests.ack(type_url, parsed.nonce)
        sub = self._targets.subscription(type_url)
        if sub is None:
            # A response for a type we no longer subscribe to raced our
            # unsubscribe: nothing in it is wanted, but it was valid: ACK it.
            return Acked([ack], None)
        if step:
            yield
        update = yield from self._update(parsed, sub, now, step)
        if step:
            yield
        yield from self.cache.apply_steps(type_url, update, step)
        self._targets.responded(type_url)
        upserts, removed = update.upserts, list(update.removed)
        removed_variants = list(update.removed_variants)
        if not (removed or removed_variants or (not parsed.plain and
                any(r.constraints is not UNCONSTRAINED for r in upserts))):
            return Acked([ack], update)
        # Variants changed: a client served from cache may need its own locator.
        touched = {*(r.name for r in upserts), *removed,
                   *(name for name, _ in removed_variants)}
        return Acked([ack, *self._sync_type(type_url, demand, now, touched)], update)

    def on_unusable(self, unusable: Unusable) -> Nacked:
        """A response the relay cannot use: NACK it; nothing of it is kept."""
        log.warning("NACK to origin type=%s nonce=%s: %s", short_name(unusable.type_url),
                    unusable.nonce, unusable.reason)
        return Nacked(unusable.reason, [
            self._requests.nack(unusable.type_url, unusable.nonce, unusable.reason)])

    def _update(self, parsed: ParsedResponse, sub: TypeSubscription, now: float, step: int
                ) -> Generator[None, None, Update]:
        """What the cache is told of a response: what of it is subscribed,
        what the reconcile removes, the locators it answers. Pauses once
        (with ``step``), between what is subscribed and the resync's
        bookkeeping."""
        type_url = parsed.type_url
        locators = sub.locators
        # (a member of a glob collection subscribed is subscribed: in_collection)
        wanted = _all_subscribed(parsed.upserts, sub)
        if wanted is None:
            wanted = [r for r in parsed.upserts if sub.wildcard or r.name in locators
                      or in_collection(r.name, locators)
                      or any(alias in locators for alias in r.aliases)]
        removed = [n for n in parsed.removed if sub.wildcard or n in locators
                   or in_collection(n, locators)
                   or self.cache.aliases_of(type_url, n) & locators.keys()]
        errors = [e for e in parsed.errors if sub.wildcard or e.resource_name.name in locators
                  or in_collection(e.resource_name.name, locators)]
        beats = [b for b in parsed.heartbeats if sub.wildcard or b[0] in locators
                 or in_collection(b[0], locators)]
        if step:
            yield
        self._resync.on_response(type_url, now, wanted, beats, errors)
        if sub.wildcard:
            self._wildcards.settled(type_url)
        gone = self._resync.reconcile(type_url, now)
        return Update(wanted, removed, [*parsed.removed_variants, *gone], errors, beats,
                      answered=self._settling.answered_keys(type_url, now),
                      complete=True if sub.wildcard else None, wildcard_answered=sub.wildcard)


def _all_subscribed(upserts: Sequence[CachedResource], sub: TypeSubscription
                    ) -> list[CachedResource] | None:
    """What :meth:`UpstreamState._update` keeps of ``upserts`` where each is
    subscribed by its own name (or the wildcard is): all of them, looked up
    in C (a cold client's 10,000); None where some are not (the loop looks
    for collections and aliases)."""
    if sub.wildcard or all(map(sub.locators.__contains__, map(_NAME, upserts))):
        return list(upserts)
    return None
