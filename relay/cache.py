"""The resource cache: what the origin has sent, keyed by type URL, name and variant.

The cache knows nothing about streams or gRPC. Sources (the upstream client,
the file source) write into it; it tells its listeners which names changed,
and protocol state objects read from it when they build a response.

A name is in one of three states for a reader:

* present: one or more variants are cached;
* :data:`ABSENT`: the origin said it does not exist (it removed the name, or
  the cache holds the complete set of that type and the name is not in it);
* :data:`UNKNOWN`: the origin has not said anything about it yet.

With variants, a subscriber's parameters pick one of the present variants
(see :mod:`relay.protocol.view`); when none matches, the name is absent for
those parameters once the origin has answered a subscription made with them
(the locator is *settled*), and unknown before.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from relay.constraints import Constraints, Params, compile_constraints, select_variant
from relay.resource import CachedResource


class Missing(enum.Enum):
    """Why a lookup found no resource."""

    ABSENT = "absent"
    UNKNOWN = "unknown"


ABSENT = Missing.ABSENT
UNKNOWN = Missing.UNKNOWN

Variants = Mapping[str, CachedResource]


@dataclass(frozen=True)
class CacheChange:
    """Names of one type whose state changed, in one write to the cache."""

    type_url: str
    names: frozenset[str]
    became_synced: bool = False
    # names whose origin heartbeat arrived (the resource itself is unchanged)
    heartbeats: frozenset[str] = frozenset()


ChangeListener = Callable[[CacheChange], None]


@dataclass
class _TypeEntry:
    variants: dict[str, dict[str, CachedResource]] = field(default_factory=dict)
    absent: set[str] = field(default_factory=set)
    synced: bool = False
    complete: bool = False
    settled: set[tuple[str, Params]] = field(default_factory=set)
    # name -> constraints key -> the origin's error for that variant (key ""
    # for an error about the name as a whole)
    errors: dict[str, dict[str, tuple[Constraints, discovery_pb2.ResourceError]]] = \
        field(default_factory=dict)
    # (name, variant key) -> clock time when its TTL lapses without a heartbeat
    expires: dict[tuple[str, str], float] = field(default_factory=dict)
    # alias -> canonical name (VHDS-style aliases in Resource.aliases)
    aliases: dict[str, str] = field(default_factory=dict)


class ResourceCache:
    """Resources by type URL, name and variant key, with change notification."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._types: dict[str, _TypeEntry] = {}
        self._listeners: list[ChangeListener] = []
        self._clock = clock

    def add_listener(self, listener: ChangeListener) -> None:
        """Call ``listener`` after every write that changes what readers see."""
        self._listeners.append(listener)

    # -- reading ---------------------------------------------------------

    def is_synced(self, type_url: str) -> bool:
        """Whether the origin has answered for this type at least once."""
        entry = self._types.get(type_url)
        return entry is not None and entry.synced

    def variants(self, type_url: str, name: str) -> Variants | Missing:
        """The cached variants of ``name``, or why there are none."""
        entry = self._types.get(type_url)
        if entry is None or not entry.synced:
            return UNKNOWN
        found = entry.variants.get(name)
        if not found and name in entry.aliases:
            found = entry.variants.get(entry.aliases[name])
        if found:
            return found
        if entry.complete or name in entry.absent:
            return ABSENT
        return UNKNOWN

    def error(self, type_url: str, name: str,
              params: Params) -> discovery_pb2.ResourceError | None:
        """The origin's current error for the variant of ``name`` a subscriber
        with ``params`` would get: errors carry constraints as resources do."""
        entry = self._types.get(type_url)
        by_key = entry.errors.get(name) if entry is not None else None
        if not by_key:
            return None
        error, _ = select_variant(by_key.values(), params)
        return error

    def aliases_of(self, type_url: str, name: str) -> set[str]:
        """The aliases under which the cached resource ``name`` is known."""
        entry = self._types.get(type_url)
        if entry is None:
            return set()
        return {alias for alias, canonical in entry.aliases.items() if canonical == name}

    def is_complete(self, type_url: str) -> bool:
        """Whether the cache holds every resource of the type (wildcard or files)."""
        entry = self._types.get(type_url)
        return entry is not None and entry.complete

    def is_settled(self, type_url: str, name: str, params: Params) -> bool:
        """Whether the origin has answered a subscription to ``name`` with ``params``."""
        entry = self._types.get(type_url)
        return entry is not None and (name, params) in entry.settled

    def settle(self, type_url: str, locators: Iterable[tuple[str, Params]]) -> None:
        """The origin has answered since these locators were subscribed.

        Subscribers whose parameters match none of the variants learn that
        the resource does not exist for them, so they are told.
        """
        entry = self._types.setdefault(type_url, _TypeEntry())
        new = set(locators) - entry.settled
        if new:
            entry.settled |= new
            self._notify(CacheChange(type_url, frozenset(name for name, _ in new)))

    def names(self, type_url: str) -> Iterable[str]:
        """Every cached name of a type."""
        entry = self._types.get(type_url)
        return entry.variants.keys() if entry is not None else ()

    def resources(self, type_url: str) -> Iterable[CachedResource]:
        """Every cached variant of a type."""
        entry = self._types.get(type_url)
        if entry is None:
            return ()
        return [r for by_key in entry.variants.values() for r in by_key.values()]

    def type_urls(self) -> list[str]:
        return sorted(self._types)

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per type URL: how many names are cached, and how many variants in all."""
        # Snapshots (list(...)): the OTLP exporter calls this from its own thread.
        return {type_url: (len(entry.variants),
                           sum(len(v) for v in list(entry.variants.values())))
                for type_url, entry in list(self._types.items())}

    # -- writing ---------------------------------------------------------

    def apply(self, type_url: str, upserts: Sequence[CachedResource],
              removed_names: Iterable[str] = (),
              removed_variants: Iterable[tuple[str, str]] = (),
              complete: bool | None = None,
              errors: Iterable[discovery_pb2.ResourceError] = ()) -> frozenset[str]:
        """Add or replace variants and remove names or single variants.

        Marks the type synced. ``complete`` says whether the cache now holds
        every resource of the type (a wildcard subscription or a file source),
        so that a missing name means the resource does not exist. ``errors``
        are the origin's per-resource errors; a resource that arrives clears
        its name's error. A variant resent unchanged is no change; if it has
        a TTL, listeners hear of it as a heartbeat (its TTL restarted).
        Returns the names whose state changed; listeners hear of them too.
        """
        entry = self._types.setdefault(type_url, _TypeEntry())
        changed: set[str] = set()
        # unchanged resends of resources with a TTL: their clients' TTL restarts too
        refreshed: set[str] = set()
        for error in errors:
            name = error.resource_name.name
            constraints = compile_constraints(
                error.resource_name.dynamic_parameter_constraints
                if error.resource_name.HasField("dynamic_parameter_constraints") else None)
            variant_errors = entry.errors.setdefault(name, {})
            known = variant_errors.get(constraints.key)
            if known is None or known[1] != error:
                variant_errors[constraints.key] = (constraints, error)
                changed.add(name)
        now = self._clock()
        for resource in upserts:
            # A variant that arrives clears its own error and the name's.
            cleared_from = entry.errors.get(resource.name)
            if cleared_from:
                cleared = [cleared_from.pop(key, None) for key in {resource.variant_key, ""}]
                if any(cleared):
                    changed.add(resource.name)
                if not cleared_from:
                    del entry.errors[resource.name]
            ttl = resource.ttl_seconds
            if ttl is None:
                entry.expires.pop((resource.name, resource.variant_key), None)
            else:
                entry.expires[(resource.name, resource.variant_key)] = now + ttl
            by_key = entry.variants.setdefault(resource.name, {})
            old = by_key.get(resource.variant_key)
            # Content decides, not the version string: an identical resend
            # (istiod resends everything on every new stream) is no news. A
            # do-not-cache resource is news each time it is fetched: the
            # subscribers that asked for a fresh copy are waiting for it.
            if old is None or old.digest != resource.digest or resource.do_not_cache:
                by_key[resource.variant_key] = resource
                changed.add(resource.name)
            elif ttl is not None:
                refreshed.add(resource.name)
            entry.absent.discard(resource.name)
            for alias in resource.resource.aliases:
                entry.aliases[alias] = resource.name
                entry.absent.discard(alias)
        for name in removed_names:
            if entry.variants.pop(name, None) is not None or name not in entry.absent:
                changed.add(name)
            entry.absent.add(name)
            for key in [k for k in entry.expires if k[0] == name]:
                del entry.expires[key]
        for name, variant_key in removed_variants:
            entry.expires.pop((name, variant_key), None)
            held = entry.variants.get(name)
            if held is not None and held.pop(variant_key, None) is not None:
                changed.add(name)
                if not held:
                    del entry.variants[name]
                    entry.absent.add(name)
        if entry.aliases:
            # Subscribers by alias hear of their canonical resource's changes;
            # the aliases of a resource that is gone are gone with it.
            aliased = {a for a, c in entry.aliases.items() if c in changed}
            for alias in aliased:
                if entry.aliases[alias] not in entry.variants:
                    del entry.aliases[alias]
                    entry.absent.add(alias)
            changed |= aliased
        if complete is not None:
            entry.complete = complete
        became_synced = not entry.synced
        entry.synced = True
        result = frozenset(changed)
        beats = frozenset(refreshed - changed)
        if result or became_synced or beats:
            self._notify(CacheChange(type_url, result, became_synced, beats))
        return result

    def replace_type(self, type_url: str, resources: Sequence[CachedResource]) -> frozenset[str]:
        """Make ``resources`` the complete state of a type (a file source's snapshot)."""
        entry = self._types.get(type_url)
        keep = {r.name for r in resources}
        gone = [n for n in (entry.variants if entry else ()) if n not in keep]
        # Variants of a kept name that are no longer listed go too.
        stale_variants: list[tuple[str, str]] = []
        if entry is not None:
            wanted = {(r.name, r.variant_key) for r in resources}
            stale_variants = [(n, k) for n, by_key in entry.variants.items() if n in keep
                              for k in by_key if (n, k) not in wanted]
        return self.apply(type_url, resources, gone, stale_variants, complete=True)

    def heartbeat(self, type_url: str, beats: Iterable[tuple[str, str, str]]) -> frozenset[str]:
        """The origin confirmed these (name, variant key, version): restart their TTL.

        A heartbeat for a version the cache does not hold changes nothing.
        Returns the names that were refreshed; listeners hear of them as
        heartbeats, not as changes.
        """
        entry = self._types.get(type_url)
        if entry is None:
            return frozenset()
        now = self._clock()
        refreshed = set()
        for name, variant_key, version in beats:
            variant = entry.variants.get(name, {}).get(variant_key)
            if variant is None or variant.origin_version != version:
                continue
            ttl = variant.ttl_seconds
            if ttl is not None:
                entry.expires[(name, variant_key)] = now + ttl
            refreshed.add(name)
        result = frozenset(refreshed)
        if result:
            self._notify(CacheChange(type_url, frozenset(), heartbeats=result))
        return result

    def next_expiry(self) -> float | None:
        """When the next TTL lapses (clock time), if any resource has one."""
        return min((d for e in self._types.values() for d in e.expires.values()), default=None)

    def expire(self) -> None:
        """Remove every variant whose TTL lapsed without a heartbeat."""
        now = self._clock()
        for type_url, entry in list(self._types.items()):
            lapsed = [key for key, deadline in entry.expires.items() if deadline <= now]
            if lapsed:
                self.apply(type_url, [], removed_variants=lapsed)

    def forget(self, type_url: str, names: Iterable[str], keep: Iterable[str] = ()) -> None:
        """Drop names nobody subscribes to any more (no listener is told).

        A forgotten alias takes its canonical resource along unless that is
        in ``keep`` or another alias still points at it.
        """
        entry = self._types.get(type_url)
        if entry is None:
            return
        gone = set(names)
        for alias in [a for a in gone if a in entry.aliases]:
            canonical = entry.aliases.pop(alias)
            if canonical not in set(keep) and canonical not in entry.aliases.values():
                gone.add(canonical)
        for name in gone:
            entry.variants.pop(name, None)
            entry.absent.discard(name)
            entry.errors.pop(name, None)
        entry.settled = {(n, p) for n, p in entry.settled if n not in gone}

    def forget_variants(self, type_url: str, name: str, keep: Iterable[str],
                        unsettle: Iterable[Params]) -> None:
        """Drop the variants of ``name`` not in ``keep`` (no subscription answers them)."""
        entry = self._types.get(type_url)
        if entry is None:
            return
        keys = set(keep)
        by_key = entry.variants.get(name, {})
        for key in [k for k in by_key if k not in keys]:
            del by_key[key]
        if name in entry.variants and not by_key:
            del entry.variants[name]
        entry.settled -= {(name, p) for p in unsettle}

    def forget_all_but(self, type_url: str, keep: set[str]) -> None:
        """After a wildcard subscription ends: keep only explicitly wanted names."""
        entry = self._types.get(type_url)
        if entry is None:
            return
        entry.complete = False
        for name in [n for n in entry.variants if n not in keep]:
            del entry.variants[name]
        entry.absent &= keep
        entry.settled = {(n, p) for n, p in entry.settled if n in keep}

    def _notify(self, change: CacheChange) -> None:
        for listener in self._listeners:
            listener(change)
