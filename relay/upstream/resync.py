"""What must be confirmed after a reconnect, and what is gone once it is not.

After a reconnect the cache may hold resources the origin deleted while the
relay was away. An origin that honours ``initial_resource_versions`` says so
with removals; one that ignores them (istiod) resends everything it has and
says nothing of the rest. So each cached variant must be either *declared*
to an origin that honours declarations, or confirmed on the new stream
(resent, heartbeated or reported in error); ``grace`` after the origin has
answered each request of the new stream's subscription of the type (a
response each, counted), the rest is removed (the *reconcile*): ``grace``
after its first response was too soon where the answer to a later request
was still on its way (istiod answers a reconnect of 50,000 names with a few
names, then 49,998, and a relay under load took over half a second to read
the second: it removed all but 4 of them, and its clients were sent the
removals, then the resources again). An origin that leaves a request
unanswered is reconciled :data:`PATIENCE` graces after its first response.
Which kind the origin is comes from the ``initial_versions`` setting, or,
with ``auto``, from what it does: sending a resource without a version (it
cannot compare versions), or resending one the relay declared it holds
unchanged, shows that it ignores them. See "resync", "reconcile" and "declared" in
``docs/glossary.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter, countOf
from typing import Literal

from envoy.service.discovery.v3 import discovery_pb2

from relay.resource import CachedResource
from relay.turns import slice_starts
from relay.upstream.deadlines import Deadlines, ReconcileDue
from relay.upstream.scoped import OriginCache
from relay.upstream.targets import subscribes
from relay.xds_types import short_name

log = logging.getLogger("relay.upstream")

_NAME = attrgetter("name")
#: A cached variant a resync awaits: its name where unconstrained (variant
#: key ""), else (name, variant key). A big client's names need no tuple each.
_Variant = str | tuple[str, str]
_VERSION = attrgetter("version")
_VARIANT_KEY = attrgetter("variant_key")

#: How many graces after its first response of the type an origin that has
#: not answered each request of the subscription is reconciled all the same.
PATIENCE = 10

# What the origin does with initial_resource_versions (see the module docstring).
InitialVersions = Literal["auto", "honoured", "ignored"]


@dataclass
class TypeResync:
    """A type's cache as it stood when a new stream opened, until the origin confirms it."""

    # every variant cached when the stream opened (see _Variant)
    cached: set[_Variant]
    # initial_resource_versions sent, by name
    declared: dict[str, str]
    # names subscribed by name: an origin resends these whatever it was told
    explicit: frozenset[str]
    confirmed: set[_Variant] = field(default_factory=set)
    # names the origin reported errors for: what is cached of them stays
    erred: set[str] = field(default_factory=set)
    # the subscription's requests an origin answers (each subscribing names,
    # or the type's first), and the responses of the type so far
    requests: int = 1
    responses: int = 0
    # when the origin's first response of the type arrived on the stream,
    # and the one that answered the last of the subscription's requests
    first_response_at: float | None = None
    answered_at: float | None = None

    def reconcile_at(self, grace: float) -> float | None:
        """When to reconcile: ``grace`` after the origin answered each of the
        subscription's requests (an in-order origin's first ``requests``
        responses), else :data:`PATIENCE` graces after its first response."""
        if self.first_response_at is None:
            return None
        patience = self.first_response_at + PATIENCE * grace
        return patience if self.answered_at is None else min(self.answered_at + grace, patience)


class Resync:
    """Per type, what the current stream must confirm of the cache; and, per
    type, whether the origin honours declarations."""

    def __init__(self, cache: OriginCache, grace: float, initial_versions: InitialVersions,
                 deadlines: Deadlines) -> None:
        self.cache = cache
        self.grace = grace
        self.initial_versions: InitialVersions = initial_versions
        self._deadlines = deadlines
        self._types: dict[str, TypeResync] = {}
        # types whose origin showed that it ignores initial_resource_versions
        self._ignores_declarations: set[str] = set()
        # the next stream goes to another server of the origin (a fallback, or
        # back to the primary): declare no versions to it (see server_changed)
        self.declare_nothing = False

    def server_changed(self) -> None:
        """The origin is followed at another of its servers from the next stream.

        What was learned of the last server's handling of declarations is
        forgotten, and the next stream declares no versions: the same version
        string may stand for other content on another server, and a resource
        kept on such a match would mix two servers' config in what clients
        hold. The new server resends what is subscribed; what it does not
        send is reconciled away, and clients are sent only what differs.
        """
        self._ignores_declarations.clear()
        self.declare_nothing = True

    def new_stream(self) -> None:
        """A stream opened or closed: what the last one was to confirm is moot."""
        self._types = {}

    def declaration_steps(self, type_url: str, subscribed: Collection[str], wildcard: bool,
                          step: int = 0
                          ) -> Generator[None, None, tuple[dict[str, str], list[CachedResource]]]:
        """What a new stream subscribing ``subscribed`` (and the wildcard, if
        ``wildcard``) declares of the cache: the versions of the names with
        one variant, with a wildcard of every cached name; and what is cached
        that it covers, the origin's to confirm (names a restored snapshot
        holds that nobody wants are not). A generator that pauses (yields)
        after every ``step`` names looked up (never with 0)."""
        initial: dict[str, str] = {}
        if not self.declare_nothing:
            names = list(subscribed)
            for start in slice_starts(len(names), step):
                if start:
                    yield
                initial.update(self._versions(type_url, names[start:start + step or None]))
            if step and names:
                yield
        cached = self.cache.resources(type_url)
        if not wildcard and (yield from self._covered(cached, subscribed, step)) < len(cached):
            # (some not subscribed by their own name: each looked at; where
            # all are, a big client's 50,000, no step each)
            cached = [r for r in cached if subscribes(self.cache, type_url, r.name, subscribed)]
        if wildcard and not self.declare_nothing:
            initial.update({r.name: r.version for r in cached
                            if r.name not in initial and r.name not in subscribed})
        return initial, cached

    @staticmethod
    def _covered(cached: list[CachedResource], subscribed: Collection[str], step: int
                 ) -> Generator[None, None, int]:
        """How many of ``cached`` are subscribed by their own name, looked up
        in C, ``step`` of them a pause (with ``step``, one before the first:
        the cache's list of 50,000 took 10-25 ms)."""
        covered = 0
        for start in slice_starts(len(cached), step):
            if step:
                yield
            covered += countOf(map(subscribed.__contains__,
                                   map(_NAME, cached[start:start + step or None])), True)
        return covered

    def _versions(self, type_url: str, names: list[str]) -> dict[str, str]:
        """The versions of those of ``names`` that hold one variant, in
        their order. Where each is served to all (one variant, unconstrained:
        a big client's), looked up in C (no step each); else one by one."""
        served = self.cache.served_to_all(type_url, names)
        if len(served) == len(names):
            return dict(zip(served, map(_VERSION, served.values()), strict=True))
        initial: dict[str, str] = {}
        for name in names:
            found = served.get(name)
            if found is not None:
                initial[name] = found.version
                continue
            variants = self.cache.variants(type_url, name)
            if isinstance(variants, Mapping) and len(variants) == 1:
                initial[name] = next(iter(variants.values())).version
        return initial

    def begin(self, type_url: str, cached: Collection[CachedResource], declared: dict[str, str],
              explicit: frozenset[str], requests: int = 1) -> None:
        """The stream subscribed the type declaring ``declared``, in ``requests``
        requests the origin answers: ``cached`` awaits confirmation."""
        awaiting = set(_variants(cached))
        if awaiting:
            self._types[type_url] = TypeResync(awaiting, declared, explicit, requests=requests)

    def drop(self, type_url: str) -> None:
        """The type is no longer subscribed: nothing of it awaits confirmation."""
        self._types.pop(type_url, None)

    def on_response(self, type_url: str, now: float, upserts: list[CachedResource],
                    heartbeats: Iterable[tuple[str, str, str]],
                    errors: Iterable[discovery_pb2.ResourceError]) -> None:
        """What a usable response of the type confirms (of what is subscribed)."""
        self._learn_declarations(type_url, upserts)
        resync = self._types.get(type_url)
        if resync is None:
            return
        if resync.first_response_at is None:
            resync.first_response_at = now
            self._deadlines.add(ReconcileDue(type_url, now + PATIENCE * self.grace))
        resync.responses += 1
        if resync.responses == resync.requests:
            resync.answered_at = now
            self._deadlines.add(ReconcileDue(type_url, now + self.grace))
        resync.confirmed.update(_variants(upserts))
        resync.confirmed.update(name if not key else (name, key) for name, key, _ in heartbeats)
        resync.erred.update(e.resource_name.name for e in errors)

    def reconcile(self, type_url: str, now: float) -> list[tuple[str, str]]:
        """Once the reconcile is due: the variants cached before the reconnect
        that the origin neither confirmed nor (to an origin that honours
        them) was told of, as (name, variant key). Empty before it is due,
        and after."""
        resync = self._types.get(type_url)
        due = None if resync is None else resync.reconcile_at(self.grace)
        if resync is None or due is None or now < due:
            return []
        del self._types[type_url]
        trusted = self.trusts_declarations(type_url)
        gone = []
        for variant in resync.cached - resync.confirmed:
            name, key = (variant, "") if isinstance(variant, str) else variant
            if name in resync.erred or (trusted and name in resync.declared):
                continue
            found = self.cache.variants(type_url, name)
            if isinstance(found, Mapping) and key in found:
                gone.append((name, key))
        if gone:
            log.info("origin no longer has %d %s resource(s) cached before the reconnect: "
                     "removing them", len(gone), short_name(type_url))
        return sorted(gone)

    def due(self, now: float) -> dict[str, list[tuple[str, str]]]:
        """Per type whose reconcile is due, what it removes (none left out)."""
        gone = {type_url: self.reconcile(type_url, now) for type_url in list(self._types)}
        return {type_url: variants for type_url, variants in gone.items() if variants}

    def stands(self, deadline: ReconcileDue) -> bool:
        resync = self._types.get(deadline.type_url)
        return resync is not None and resync.reconcile_at(self.grace) == deadline.at

    def trusts_declarations(self, type_url: str) -> bool:
        """Whether the origin is taken to honour initial_resource_versions for this type."""
        return self.initial_versions == "honoured" or (
            self.initial_versions == "auto" and type_url not in self._ignores_declarations)

    def _learn_declarations(self, type_url: str, resources: list[CachedResource]) -> None:
        """With ``initial_versions: auto``, notice an origin that ignores them."""
        if self.initial_versions != "auto" or type_url in self._ignores_declarations:
            return
        resync = self._types.get(type_url)
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


def _variants(resources: Collection[CachedResource]) -> Iterable[_Variant]:
    """Each of ``resources`` as a :data:`_Variant`: where each is unconstrained
    (a big client's 50,000), its name, taken in C (no step, and no tuple,
    each)."""
    if countOf(map(_VARIANT_KEY, resources), "") == len(resources):
        return map(_NAME, resources)
    return [r.name if not r.variant_key else (r.name, r.variant_key) for r in resources]
