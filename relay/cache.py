"""The resource cache: what the origin has sent, keyed by type URL, name and variant.

The cache knows nothing about streams, gRPC or the upstream protocol. Sources
(the upstream state, the file source) write into it with :meth:`ResourceCache.apply`,
one :class:`Update` per origin response and one change notification for it;
protocol state objects read from it when they build a response.

Everything the cache knows of one (type, name) is one record: its variants,
the origin's errors, TTL deadlines, aliases, whether the origin said it does
not exist, and which subscriptions the origin has answered. Forgetting a name
drops that record, and all of it goes at once. A name that holds one plain
resource and nothing more (a big client's, nearly every one) has a shared
record, its resource in its type's table of plain names only: a cold client's
10,000 names are written with no record made for each.

A name is in one of three states for a reader:

* present: one or more variants are cached;
* :data:`ABSENT`: the origin said it does not exist (it removed the name, or
  the cache holds the complete set of that type and the name is not in it);
* :data:`UNKNOWN`: the origin has not said anything about it yet.

With variants, a subscriber's parameters pick one of the present variants
(see :mod:`relay.protocol.view`); when none matches, the name is absent for
those parameters once the origin has answered a subscription made with them
(the locator is *answered*), and unknown before.
"""

from __future__ import annotations

import enum
import heapq
import time
from collections.abc import Callable, Container, Generator, Iterable, Mapping, Sequence, Sized
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, countOf, eq, is_, ne, not_
from typing import cast

from envoy.service.discovery.v3 import discovery_pb2

from relay.constraints import (
    EMPTY_PARAMS,
    UNCONSTRAINED,
    Constraints,
    Locator,
    Params,
    compile_constraints,
    select_variant,
)
from relay.memory import oversized
from relay.protocol.xdstp import PREFIX, collection_of, is_glob, xdstp_among
from relay.resource import CachedResource, note_do_not_cache


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
    # the cache holds the type's wildcard set now, and did not before (see
    # ResourceCache.holds_wildcard): wildcard subscribers, who waited, look again
    wildcard_held: bool = False


ChangeListener = Callable[[CacheChange], None]


@dataclass(frozen=True)
class Forgotten:
    """What one :meth:`ResourceCache.forget` dropped of one type: how many
    names (memory the process may give back), and those of them that held a
    resource (a snapshot keeps them as it last wrote them)."""

    type_url: str
    dropped: int
    held: frozenset[str]


ForgetListener = Callable[[Forgotten], None]


@dataclass(frozen=True)
class Update:
    """One write to one type: what an origin response (or a file load) says.

    ``removed`` are names the origin removed, ``removed_variants`` single
    variants as (name, variant key). ``errors`` are the origin's
    per-resource errors; a resource that arrives clears its name's error.
    ``heartbeats`` are (name, variant key, the origin's version) whose TTL
    restarts. ``answered`` are locators the origin has answered since they
    were subscribed (a subscriber whose parameters match no variant then
    learns the name does not exist for it); a plain name may be given as its
    name alone (no :class:`Locator` made for each of a big client's names).
    ``complete`` says whether the cache now holds every resource of the type
    (a wildcard subscription or a file source), so that a missing name means
    the resource does not exist. ``wildcard_answered`` says the origin
    answered the relay's wildcard subscription of the type (with several
    origins, where no type is ever complete, the default origin's answer),
    or a snapshot restores a type whose wildcard set the cache held.
    ``deadlines`` give, by (name, variant key), the clock time at which an
    upsert's TTL lapses when it is not its TTL from now (a restored snapshot).
    """

    upserts: Sequence[CachedResource] = ()
    removed: Iterable[str] = ()
    removed_variants: Iterable[tuple[str, str]] = ()
    errors: Iterable[discovery_pb2.ResourceError] = ()
    heartbeats: Iterable[tuple[str, str, str]] = ()
    answered: Iterable[Locator | str] = ()
    complete: bool | None = None
    deadlines: Mapping[tuple[str, str], float] = field(default_factory=dict)
    wildcard_answered: bool = False


#: The errors and TTL deadlines of every record that has none, shared: a
#: cached name costs no dict for either (two empty dicts were ~1.3 MB a
#: 10,000 names). Only read, popped and cleared: :meth:`_Record.own_errors`
#: and :meth:`_Record.own_expires` give a record its own dict to write to.
_NO_ERRORS: dict[str, tuple[Constraints, discovery_pb2.ResourceError]] = {}
_NO_EXPIRES: dict[str, float] = {}


@dataclass(slots=True)
class _Record:
    """Everything the cache knows of one (type, name).

    A client may subscribe to any number of names that do not exist, each
    held as a record the origin answered "absent". A record that says no
    more than that (absent or not, a plain subscription answered or not) is
    one of a few shared, never written (see :data:`_BARE`): such a name costs
    the cache its slot in a dict, not a record of its own.
    """

    variants: dict[str, CachedResource] = field(default_factory=dict)
    # constraints key -> the origin's error for that variant ("" for the whole
    # name); until the first, the shared empty :data:`_NO_ERRORS` (never written)
    errors: dict[str, tuple[Constraints, discovery_pb2.ResourceError]] = \
        field(default_factory=lambda: _NO_ERRORS)
    # variant key -> clock time when its TTL lapses without a heartbeat; until
    # the first, the shared empty :data:`_NO_EXPIRES` (never written)
    expires: dict[str, float] = field(default_factory=lambda: _NO_EXPIRES)
    # the origin said the name does not exist
    absent: bool = False
    # parameter sets whose subscription the origin has answered
    answered: frozenset[Params] = frozenset()
    # other names this resource goes by (VHDS-style Resource.aliases)
    aliases: frozenset[str] = frozenset()

    def own_errors(self) -> dict[str, tuple[Constraints, discovery_pb2.ResourceError]]:
        """The record's errors, to write to: a dict of its own from the first."""
        if self.errors is _NO_ERRORS:
            self.errors = {}
        return self.errors

    def own_expires(self) -> dict[str, float]:
        """The record's TTL deadlines, to write to: a dict of its own from the first."""
        if self.expires is _NO_EXPIRES:
            self.expires = {}
        return self.expires

    def is_bare(self) -> bool:
        """Whether the record says nothing beyond ``absent`` and ``answered``."""
        return not (self.variants or self.errors or self.expires or self.aliases) and \
            self.variants is not _IN_PLAIN


#: The answered set of a plain name (no dynamic parameters), shared by every record.
_ANSWERED_PLAIN: frozenset[Params] = frozenset({EMPTY_PARAMS})
_NO_NAMES: frozenset[str] = frozenset()
#: The records that say only (absent, answered), shared by every name in that
#: state, by (absent, answered); never written (``_TypeEntry.record`` copies
#: one first). A record that says nothing at all is not kept.
_BARE: dict[tuple[bool, frozenset[Params]], _Record] = {
    (absent, answered): _Record(absent=absent, answered=answered)
    for absent, answered in ((True, frozenset()), (True, _ANSWERED_PLAIN),
                             (False, _ANSWERED_PLAIN))}
#: The variants of a plain record (:data:`_PLAIN_NEW`, :data:`_PLAIN_ANSWERED`):
#: never written, and not what the name holds: its one variant is the
#: type's ``plain[name]`` (see :meth:`_TypeEntry.variants_of`).
_IN_PLAIN: dict[str, CachedResource] = {}
#: The records of names that hold one plain resource (see
#: :attr:`CachedResource.plain`) and nothing more, shared by every such name,
#: unanswered or answered as a plain name: the resource is in the type's
#: ``plain`` only. A cold client's 10,000 names are written in bulk (C code,
#: see :meth:`ResourceCache._upserts`), with no record made for each (a
#: record was ~0.33 us of the ~0.85 us a name ``apply`` took). Never written:
#: ``_TypeEntry.record`` gives a name its own record when it needs more.
_PLAIN_NEW = _Record(_IN_PLAIN, _NO_ERRORS, _NO_EXPIRES)
_PLAIN_ANSWERED = _Record(_IN_PLAIN, _NO_ERRORS, _NO_EXPIRES, answered=_ANSWERED_PLAIN)
_SHARED = frozenset(map(id, [*_BARE.values(), _PLAIN_NEW, _PLAIN_ANSWERED]))
_NAME = attrgetter("name")
_IS_PLAIN = attrgetter("plain")
_DIGEST = attrgetter("digest")
#: ``id`` of what ``records.get`` gives a name: new, or plain (see
#: :meth:`ResourceCache._plain_upserts`).
_NONE_ID = id(None)
_PLAIN_NEW_ID, _PLAIN_ANSWERED_ID = id(_PLAIN_NEW), id(_PLAIN_ANSWERED)
_NEW_OR_PLAIN = frozenset({_NONE_ID, id(_PLAIN_NEW), id(_PLAIN_ANSWERED)})
#: A write of plain upserts looked at beforehand: the new names' resources,
#: the changed ones', and the copies these replace (ResourceCache.apply_steps).
_Prepared = tuple[dict[str, CachedResource], dict[str, CachedResource], list[CachedResource]]


@dataclass
class _TypeEntry:
    records: dict[str, _Record] = field(default_factory=dict)
    # alias -> canonical name, for lookups by alias (each alias is also in
    # its canonical record's ``aliases``)
    aliases: dict[str, str] = field(default_factory=dict)
    # names whose record holds an error of the origin's
    erred: set[str] = field(default_factory=set)
    # name -> its record's one variant, for each record that holds exactly one,
    # unconstrained (what every subscriber gets, whatever its parameters): a
    # page of 10,000 names is looked up in it by C code (see ``served_to_all``),
    # where a loop over the records took ~3-4.5 ms. Kept in step by every write
    # to a record's variants (see ``settled``); for a name whose record is a
    # plain one (:data:`_PLAIN_NEW`, :data:`_PLAIN_ANSWERED`) the only place
    # its resource is held.
    plain: dict[str, CachedResource] = field(default_factory=dict)
    # glob collection -> the names with variants that are its members; None
    # until somebody asks (see ``indexed``): a type nobody subscribes a
    # collection of, every classic one, pays nothing for it
    collections: dict[str, set[str]] | None = None
    synced: bool = False
    complete: bool = False
    # whether the origin has answered a glob collection of the type (never
    # reset): an xdstp name it does not hold may then be absent to a
    # subscriber (see ``unknown_to_all``)
    globs_answered: bool = False
    # the origin has answered a wildcard subscription of the type (or the
    # type came whole, from files or a snapshot that held it) and the
    # wildcard has not ended since (``end_wildcard``: what only it held is
    # forgotten); see ``holds_wildcard``
    wildcard_held: bool = False
    # how many writes the type has taken: a write prepared over several
    # turns (ResourceCache.apply_steps) is made only if none came meanwhile
    writes: int = 0

    def indexed(self) -> dict[str, set[str]]:
        """The collections, indexed from the records the first time."""
        if self.collections is None:
            self.collections = {}
            for name in xdstp_among(list(self.records)):
                if self.records[name].variants or name in self.plain:
                    self.joined(name)
        return self.collections

    def joined(self, name: str) -> None:
        """``name`` (an xdstp name) has a variant now: a member of its collection."""
        glob = collection_of(name)
        if glob is not None and self.collections is not None:
            self.collections.setdefault(glob, set()).add(name)

    def left(self, name: str) -> None:
        """``name`` has no variant any more (or is forgotten): no member now."""
        glob = collection_of(name)
        if glob is None or self.collections is None:
            return
        members = self.collections.get(glob)
        if members is not None:
            members.discard(name)
            if not members:
                del self.collections[glob]

    def settled(self, name: str, record: _Record) -> None:
        """The variants of ``name``'s record (``record``) changed: ``plain`` follows."""
        variants = record.variants
        if len(variants) == 1 and (only := variants.get("")) is not None and \
                only.constraints is UNCONSTRAINED:
            self.plain[name] = only
        else:
            self.plain.pop(name, None)

    def variants_of(self, name: str, record: _Record) -> dict[str, CachedResource]:
        """The variants ``name``'s record (``record``) holds: to read, not to write."""
        return {"": self.plain[name]} if record.variants is _IN_PLAIN else record.variants

    def record(self, name: str) -> _Record:
        """The record of ``name`` to write to: a new one, or a copy of a shared one."""
        found = self.records.get(name)
        if found is None:
            found = self.records[name] = _Record()
        elif id(found) in _SHARED:
            found = self.records[name] = _Record(dict(self.variants_of(name, found)),
                                                 absent=found.absent, answered=found.answered)
        return found

    def set_bare(self, name: str, absent: bool, answered: frozenset[Params]) -> None:
        """Make ``name``'s record a bare one (see :data:`_BARE`); it must be bare now."""
        shared = _BARE.get((absent, answered))
        if shared is not None:
            self.records[name] = shared
        elif absent or answered:
            self.records[name] = _Record(absent=absent, answered=answered)
        else:
            self.records.pop(name, None)

    def compact(self, name: str) -> None:
        """Keep the record of ``name`` as small as what it says allows: none if
        it says nothing any more, a shared one if it is bare."""
        found = self.records.get(name)
        if found is not None and id(found) not in _SHARED and found.is_bare():
            self.set_bare(name, found.absent, found.answered)


class ResourceCache:
    """Resources by type URL, name and variant key, with change notification."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._types: dict[str, _TypeEntry] = {}
        self._listeners: list[ChangeListener] = []
        self._clock = clock
        # (deadline, type URL, name, variant key): TTL deadlines, soonest first.
        # A heartbeat pushes a new entry; the stale one is dropped when it
        # comes up (its record no longer holds that deadline).
        self._deadlines: list[tuple[float, str, str, str]] = []
        self._forget_listeners: list[ForgetListener] = []

    def add_listener(self, listener: ChangeListener) -> None:
        """Call ``listener`` after every write that changes what readers see."""
        self._listeners.append(listener)

    def add_forget_listener(self, listener: ForgetListener) -> None:
        """Call ``listener`` with what each :meth:`forget` dropped (see
        :class:`Forgotten`; :mod:`relay.memory` gives memory back)."""
        self._forget_listeners.append(listener)

    # -- reading ---------------------------------------------------------

    def is_synced(self, type_url: str) -> bool:
        """Whether the origin has answered for this type at least once."""
        entry = self._types.get(type_url)
        return entry is not None and entry.synced

    def variants(self, type_url: str, name: str) -> Variants | Missing:
        """The cached variants of ``name`` (or of what it is an alias of), or why there are none."""
        entry = self._types.get(type_url)
        if entry is None or not entry.synced:
            return UNKNOWN
        own = entry.records.get(name)
        variants = None if own is None else entry.variants_of(name, own)
        if not variants and name in entry.aliases:
            canonical = entry.aliases[name]
            found = entry.records.get(canonical)
            variants = None if found is None else entry.variants_of(canonical, found)
        if variants:
            return variants
        if entry.complete or (own is not None and own.absent):
            return ABSENT
        return UNKNOWN

    def served_to_all(self, type_url: str, names: Iterable[str]) -> dict[str, CachedResource]:
        """Those of ``names`` whose own record holds one variant, unconstrained,
        with it, in the order of ``names``: what :meth:`variants` gives and
        every subscriber gets, whatever its parameters. The others (aliases,
        variants with constraints, absent or unknown names) are left out.

        Looked up in the type's ``plain`` by C code (``map``, ``filter``,
        ``dict``): a page of 10,000 names costs no Python-level step per name
        (~1 ms, where a loop over the records was ~3-4.5).
        """
        entry = self._types.get(type_url)
        if entry is None or not entry.synced:
            return {}
        plain = entry.plain
        page = names if isinstance(names, list) else list(names)
        try:  # (a big client's page: every name served to all, nearly always)
            return dict(zip(page, map(plain.__getitem__, page), strict=True))
        except KeyError:
            page = list(filter(plain.__contains__, page))
            return dict(zip(page, map(plain.__getitem__, page), strict=True))

    def served_one(self, type_url: str, name: str) -> CachedResource | None:
        """The one variant, unconstrained, that ``name``'s own record holds:
        what every subscriber gets, whatever its parameters (None where
        :meth:`served_to_all` would leave ``name`` out).

        For a reader that looks names up one by one: a plain name's
        :meth:`variants` is a dict made for the call (its record is a shared
        one, see :data:`_PLAIN_NEW`), ~0.04-0.08 us more a call than when
        each name had a record of its own; this makes none.
        """
        entry = self._types.get(type_url)
        if entry is None or not entry.synced:
            return None
        return entry.plain.get(name)

    def serves_every(self, type_url: str, names: AbstractSet[str]) -> bool:
        """Whether :meth:`served_to_all` would give every one of ``names``
        (one resource, unconstrained, under its own name): a membership test
        a name, in C, for a client's thousands."""
        entry = self._types.get(type_url)
        return entry is not None and entry.synced and entry.plain.keys() >= names

    def unknown_to_all(self, type_url: str, names: Sequence[str]) -> int:
        """How many of ``names`` (distinct) the cache knows nothing of, for
        any subscriber: no record (no variant, error, absence or answer), no
        alias, in a type that is not complete and has no glob collection
        answered. Each is UNKNOWN to every subscriber, whatever its
        parameters (see :meth:`relay.protocol.view.CacheView.lookup`).

        A lower bound: a name that is an alias and has a record of its own
        counts twice as known, and a type with a glob collection answered
        counts none (an xdstp name may be absent from it). Counted by C code
        (``countOf`` over ``map``): a page of 10,000 names costs no
        Python-level step per name.
        """
        entry = self._types.get(type_url)
        if entry is None:
            return len(names)
        if entry.complete or entry.globs_answered:
            return 0
        known = countOf(map(entry.records.__contains__, names), True)
        aliases = entry.aliases
        if aliases:  # (nearly never: VHDS-style aliases)
            known += countOf(map(aliases.__contains__, names), True)
        return max(len(names) - known, 0)

    def error(self, type_url: str, name: str,
              params: Params) -> discovery_pb2.ResourceError | None:
        """The origin's current error for the variant of ``name`` a subscriber
        with ``params`` would get: errors carry constraints as resources do."""
        entry = self._types.get(type_url)
        record = entry.records.get(name) if entry is not None else None
        if record is None or not record.errors:
            return None
        error, _ = select_variant(record.errors.values(), params)
        return error

    def has_errors(self, type_url: str) -> bool:
        """Whether the origin reports an error for any resource of the type."""
        entry = self._types.get(type_url)
        return entry is not None and bool(entry.erred)

    def aliases_of(self, type_url: str, name: str) -> set[str]:
        """The aliases under which the cached resource ``name`` is known."""
        entry = self._types.get(type_url)
        record = entry.records.get(name) if entry is not None else None
        return set(record.aliases) if record is not None else set()

    def holds_wildcard(self, type_url: str) -> bool:
        """Whether a wildcard subscriber may be answered from the cache: the
        origin has answered a wildcard subscription of the type (or the type
        came whole from files or a snapshot) and the wildcard has not ended
        since. Otherwise the cache holds only names subscribed by name (gRPC
        clients subscribe CDS and LDS so), or what was left when the wildcard
        ended: a response from it would tell a SotW client of a full-state
        type (LDS, CDS) that every other resource was deleted."""
        entry = self._types.get(type_url)
        return entry is not None and entry.wildcard_held

    def is_complete(self, type_url: str) -> bool:
        """Whether the cache holds every resource of the type (wildcard or files)."""
        entry = self._types.get(type_url)
        return entry is not None and entry.complete

    def is_answered(self, type_url: str, locator: Locator) -> bool:
        """Whether the origin has answered a subscription to this locator."""
        entry = self._types.get(type_url)
        record = entry.records.get(locator.name) if entry is not None else None
        return record is not None and locator.params in record.answered

    def members(self, type_url: str, glob: str) -> list[str]:
        """The cached members of the glob collection ``glob`` (a canonical
        name, see :mod:`relay.protocol.xdstp`): names with a variant."""
        entry = self._types.get(type_url)
        if entry is None:
            return []
        return list(entry.indexed().get(glob, ()))

    def names(self, type_url: str) -> list[str]:
        """Every name of a type that has a cached variant."""
        entry = self._types.get(type_url)
        if entry is None:
            return []
        plain = entry.plain
        if len(plain) == len(entry.records):  # (each holds one resource: no step each)
            return list(entry.records)
        return [name for name, record in entry.records.items()
                if record.variants or name in plain]

    def resources(self, type_url: str) -> list[CachedResource]:
        """Every cached variant of a type."""
        entry = self._types.get(type_url)
        if entry is None:
            return []
        if len(entry.plain) == len(entry.records):  # (each holds one resource: no step each)
            return list(map(entry.plain.__getitem__, entry.records))
        return [r for name, record in entry.records.items()
                for r in entry.variants_of(name, record).values()]

    def type_urls(self) -> list[str]:
        return sorted(self._types)

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per type URL: how many names are cached, and how many variants in all."""
        # Snapshots (list(...)): the OTLP exporter calls this from its own thread.
        out = {}
        for type_url, entry in list(self._types.items()):
            sizes = [1 if r.variants is _IN_PLAIN else len(r.variants)
                     for r in list(entry.records.values())]
            sizes = [size for size in sizes if size]
            out[type_url] = (len(sizes), sum(sizes))
        return out

    def next_expiry(self) -> float | None:
        """When the next TTL lapses (clock time), if any resource has one."""
        while self._deadlines:
            deadline, type_url, name, key = self._deadlines[0]
            if self.expiry(type_url, name, key) == deadline:
                return deadline
            heapq.heappop(self._deadlines)  # refreshed or gone since
        return None

    def expiry(self, type_url: str, name: str, key: str) -> float | None:
        """When (clock time) a variant's TTL lapses without a heartbeat; None
        when it has no TTL (or is not cached)."""
        entry = self._types.get(type_url)
        record = entry.records.get(name) if entry is not None else None
        return record.expires.get(key) if record is not None else None

    # -- writing ---------------------------------------------------------

    def apply(self, type_url: str, update: Update) -> frozenset[str]:
        """Write what one origin response (or file load) says; notify listeners once.

        Marks the type synced. A variant resent unchanged is no change; if it
        has a TTL, listeners hear of it as a heartbeat (its TTL restarted).
        Returns the names whose state changed.
        """
        return self._apply(type_url, update, None)

    def apply_steps(self, type_url: str, update: Update, step: int
                    ) -> Generator[None, None, frozenset[str]]:
        """:meth:`apply` in steps, where ``update`` is a big write of plain
        upserts and nothing else (istiod's resend of 50,000 names: written
        in one go, it held the event loop 86-251 ms): a generator that pauses
        (yields) after every ``step`` upserts looked at (never with 0).

        What to write is found a slice at a time, writing nothing; then all
        of it is written in one step, so a reader never sees half of it, and
        listeners are told once. Where the type was written meanwhile, or a
        slice cannot be written in bulk, the update is applied in one go, as
        :meth:`apply` does. The copies it replaces are let go a slice at a
        time after (freeing 50,000 took 25-80 ms)."""
        entry = self._types.get(type_url)
        if not step or entry is None or len(update.upserts) <= step or not _only_upserts(update):
            return self.apply(type_url, update)
        writes = entry.writes
        prepared = yield from self._prepared(entry, update.upserts, step)
        if prepared is not None:
            yield  # (the write is a step of its own)
        if prepared is None or entry.writes != writes:
            return self.apply(type_url, update)
        retired = prepared[2]
        written = self._apply(type_url, update, prepared)
        while retired:
            yield
            del retired[-step:]
        return written

    def _apply(self, type_url: str, update: Update, prepared: _Prepared | None
               ) -> frozenset[str]:
        """:meth:`apply`; its plain upserts as ``prepared`` where they were
        looked at beforehand (:meth:`apply_steps`)."""
        entry = self._types.setdefault(type_url, _TypeEntry())
        entry.writes += 1
        changed: set[str] = set()
        beats: set[str] = set()
        now = self._clock()
        for error in update.errors:
            self._set_error(entry, error, changed)
        if prepared is None:
            fresh = self._upserts(type_url, entry, update, now, changed, beats)
        else:
            fresh = self._write_plain(entry, *prepared[:2])
        for name in update.removed:
            self._remove_name(entry, name, changed)
        for name, variant_key in update.removed_variants:
            self._remove_variant(entry, name, variant_key, changed)
        for name, variant_key, version in update.heartbeats:
            self._heartbeat(type_url, entry, name, variant_key, version, now, beats)
        self._answer(entry, update.answered, changed)
        # Subscribers by alias hear of their canonical resource's changes.
        for name in list(changed):
            found = entry.records.get(name)
            if found is not None:
                changed.update(found.aliases)
        records = entry.records
        for name in changed:
            found = records.get(name)
            if found is not None and not found.variants:  # (one that has is not bare)
                entry.compact(name)
        if update.complete is not None:
            entry.complete = update.complete
        held = not entry.wildcard_held and (update.wildcard_answered or bool(update.complete))
        if held:
            entry.wildcard_held = True
        became_synced = not entry.synced
        entry.synced = True
        # (a plain record, with no alias: nothing more to do; a cold client's
        # response changes no other name: its names are not copied twice)
        result = frozenset(changed | fresh if changed else fresh)
        heartbeats = frozenset(beats - result) if beats else frozenset()
        if result or became_synced or heartbeats or held:
            self._notify(CacheChange(type_url, result, became_synced, heartbeats, held))
        return result

    def replace_type(self, type_url: str, resources: Sequence[CachedResource]) -> frozenset[str]:
        """Make ``resources`` the complete state of a type (a file source's snapshot)."""
        entry = self._types.get(type_url)
        wanted = {(r.name, r.variant_key) for r in resources}
        keep = {name for name, _ in wanted}
        gone: list[str] = []
        stale_variants: list[tuple[str, str]] = []
        if entry is not None:
            for name, record in entry.records.items():
                variants = entry.variants_of(name, record)
                if not variants:
                    continue
                if name not in keep:
                    gone.append(name)
                else:
                    # Variants of a kept name that are no longer listed go too.
                    stale_variants += [(name, k) for k in variants
                                       if (name, k) not in wanted]
        return self.apply(type_url, Update(resources, removed=gone,
                                           removed_variants=stale_variants, complete=True))

    def expire(self) -> None:
        """Remove every variant whose TTL lapsed without a heartbeat."""
        now = self._clock()
        lapsed: dict[str, list[tuple[str, str]]] = {}
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, type_url, name, key = heapq.heappop(self._deadlines)
            if self.expiry(type_url, name, key) == deadline:
                lapsed.setdefault(type_url, []).append((name, key))
        for type_url, variants in lapsed.items():
            self.apply(type_url, Update(removed_variants=variants))

    def forget(self, type_url: str, names: Iterable[str], keep: Container[str] = ()) -> None:
        """Drop all the cache knows of names nobody subscribes to any more (no
        listener is told).

        A forgotten alias takes its canonical resource along unless that is
        in ``keep`` or another alias still points at it.
        """
        entry = self._types.get(type_url)
        if entry is None:
            return
        entry.writes += 1
        gone = set(names)
        for name in gone:
            # (Most calls forget one classic name: a '*' is looked for first.)
            if "*" in name:
                self._with_members(entry, gone, keep)
                break
        for alias in [name for name in gone if name in entry.aliases]:
            canonical = entry.aliases.pop(alias)
            record = entry.records.get(canonical)
            if record is not None:
                record.aliases -= {alias}
                if canonical not in keep and not record.aliases:
                    gone.add(canonical)
        dropped, held = 0, []
        collections, plain = entry.collections, entry.plain
        for name in gone:
            record = entry.records.pop(name, None)
            entry.erred.discard(name)
            if record is not None:
                dropped += 1
                for alias in record.aliases:
                    entry.aliases.pop(alias, None)
                if record.variants or record.variants is _IN_PLAIN:
                    held.append(name)
                    plain.pop(name, None)
                    if collections:
                        entry.left(name)
        if dropped:
            if oversized(entry.records):
                entry.records = dict(entry.records)
            if oversized(entry.plain):
                entry.plain = dict(entry.plain)
            forgotten = Forgotten(type_url, dropped, frozenset(held))
            for listener in self._forget_listeners:
                listener(forgotten)

    @staticmethod
    def _with_members(entry: _TypeEntry, gone: set[str], keep: Container[str]) -> None:
        """The glob collections among ``gone`` go with their members, but those kept."""
        for glob in [name for name in gone if is_glob(name)]:
            gone.update(m for m in entry.indexed().get(glob, ()) if m not in keep)

    def forget_variants(self, type_url: str, name: str, keep: Iterable[str],
                        unanswer: Iterable[Params]) -> None:
        """Drop the variants of ``name`` not in ``keep`` (no subscription brings
        them any more) and the answers to the dropped parameters."""
        entry = self._types.get(type_url)
        record = entry.records.get(name) if entry is not None else None
        if entry is None or record is None:
            return
        keys = set(keep)
        dropped = [k for k in entry.variants_of(name, record) if k not in keys]
        answered = record.answered - frozenset(unanswer)
        if not dropped and answered == record.answered:
            return
        entry.writes += 1
        record = entry.record(name)
        for key in dropped:
            del record.variants[key]
            record.expires.pop(key, None)
        entry.settled(name, record)
        record.answered = answered
        entry.compact(name)

    def end_wildcard(self, type_url: str, keep: Container[str], *,
                     lets_wildcard_go: bool = True) -> None:
        """A wildcard subscription ended: keep only the explicitly wanted names
        (and the members of wanted glob collections). With several origins,
        one that wildcards do not go to prunes its names so too, without
        ``lets_wildcard_go``: the wildcard set the default origin keeps is
        still held."""
        entry = self._types.get(type_url)
        if entry is None:
            return
        entry.complete = False
        if lets_wildcard_go:
            entry.wildcard_held = False
        self.forget(type_url, [name for name in entry.records if name not in keep and not (
            name.startswith(PREFIX) and _in_kept_collection(name, keep))], keep)

    # -- one write, piece by piece --------------------------------------------

    def _upserts(self, type_url: str, entry: _TypeEntry, update: Update, now: float,
                 changed: set[str], beats: set[str]) -> set[str]:
        """Write the update's upserts. The names written in bulk (see
        :meth:`_plain_upserts`) are returned, not added to ``changed``: each
        has a shared record (:data:`_PLAIN_NEW`, :data:`_PLAIN_ANSWERED`),
        its resource in the type's ``plain``, and needs no more (no alias
        to tell, nothing to compact)."""
        upserts = update.upserts
        if upserts and all(map(_IS_PLAIN, upserts)):
            written = self._plain_upserts(entry, upserts)
            if written is not None:
                return written - changed
        return self._upserts_one_by_one(type_url, entry, update, now, changed, beats)

    @staticmethod
    def _plain_upserts(entry: _TypeEntry, upserts: Sequence[CachedResource]) -> set[str] | None:
        """Plain upserts (see :attr:`CachedResource.plain`), each of a name
        new to the cache or that holds one plain resource and nothing more,
        written in bulk by C code (``map``, ``compress``, ``dict.update``): no
        Python-level step per name. The names written (new, or whose content
        changed) are returned; None where a name is neither, or comes twice.

        A cold client's 10,000 names arrive so, each new (the loop was ~0.45
        us a name with no record made, ~0.8 with one); so does istiod's
        resend of everything it holds on each new stream, each name known
        (its loop, 50,000 names 150-190 ms, held the event loop for all of
        it)."""
        plan = ResourceCache._plain_plan(entry, list(map(_NAME, upserts)), upserts)
        return None if plan is None else ResourceCache._write_plain(entry, *plan)

    @staticmethod
    def _plain_plan(entry: _TypeEntry, names: list[str], upserts: Sequence[CachedResource]
                    ) -> tuple[dict[str, CachedResource], dict[str, CachedResource]] | None:
        """What :meth:`_plain_upserts` writes of ``upserts`` (named ``names``):
        the new names' resources, and those of known names whose content
        changed; None where it cannot write them. Writes nothing. A resource
        resent as the cache holds it (the very copy: see
        :meth:`CachedResource.from_resent_many`), or with the same content
        (its digest), is no news, as in :meth:`_upsert`."""
        records, plain = entry.records, entry.plain
        if records.keys().isdisjoint(names):  # (each new: a cold client's)
            new = dict(zip(names, upserts, strict=True))
            # (a name twice: written once, then again)
            return None if len(new) != len(names) else (new, {})
        if entry.erred and not entry.erred.isdisjoint(names):
            return None  # (an upsert clears its name's error: one by one)
        if len(set(names)) != len(names):
            return None
        resent = list(map(is_, map(plain.get, names), upserts))
        if countOf(resent, True):  # (the copies held: nothing to write of them)
            fresh = list(map(not_, resent))
            names, upserts = list(compress(names, fresh)), list(compress(upserts, fresh))
        held = list(map(id, map(records.get, names)))
        if not set(held) <= _NEW_OR_PLAIN:
            return None
        is_new = list(map(eq, held, repeat(_NONE_ID)))
        new = dict(compress(zip(names, upserts, strict=True), is_new))
        if len(new) == len(names):
            return new, {}
        known = list(map(not_, is_new))
        known_names = list(compress(names, known))
        known_upserts = list(compress(upserts, known))
        differs = map(ne, map(_DIGEST, map(plain.__getitem__, known_names)),
                      map(_DIGEST, known_upserts))
        return new, dict(compress(zip(known_names, known_upserts, strict=True), differs))

    @staticmethod
    def _write_plain(entry: _TypeEntry, new: dict[str, CachedResource],
                     replaced: dict[str, CachedResource]) -> set[str]:
        """Write what :meth:`_plain_plan` found. The names written."""
        plain = entry.plain
        if replaced:
            plain.update(replaced)
        if new:
            entry.records.update(dict.fromkeys(new, _PLAIN_NEW))
            plain.update(new)
            if entry.collections is not None:
                for name in xdstp_among(list(new)):
                    entry.joined(name)
        return new.keys() | replaced.keys()

    @staticmethod
    def _prepared(entry: _TypeEntry, upserts: Sequence[CachedResource], step: int
                  ) -> Generator[None, None, _Prepared | None]:
        """:meth:`_plain_plan` of ``upserts``, ``step`` of them a pause, writing
        nothing (see :meth:`apply_steps`), with the copies the write will
        replace (found here, a slice at a time: the write has one pass less);
        None where any slice cannot be written in bulk, or a name comes twice."""
        new: dict[str, CachedResource] = {}
        replaced: dict[str, CachedResource] = {}
        retired: list[CachedResource] = []
        seen: set[str] = set()
        for start in range(0, len(upserts), step):
            if start:
                yield
            some = upserts[start:start + step]
            names = list(map(_NAME, some))
            seen.update(names)
            plan = ResourceCache._plain_plan(entry, names, some) \
                if all(map(_IS_PLAIN, some)) and len(seen) == start + len(names) else None
            if plan is None:
                return None
            new.update(plan[0])
            replaced.update(plan[1])
            retired += map(entry.plain.__getitem__, plan[1])
        return new, replaced, retired

    def _upserts_one_by_one(self, type_url: str, entry: _TypeEntry, update: Update,
                            now: float, changed: set[str], beats: set[str]) -> set[str]:
        """:meth:`_upserts` where some upserts are not plain, or some names hold
        more than one plain resource: the new plain ones are stored as in
        bulk, the others by :meth:`_upsert`. Each
        new one is one of the type's ``plain`` too, added by one ``update``
        after the loop (a store per name in the loop was ~0.3 ms a 10,000)."""
        records = entry.records
        collections = entry.collections
        fresh: dict[str, CachedResource] = {}
        for resource in update.upserts:
            name = resource.name
            if resource.plain and name not in records:  # (so once: twice is not new)
                records[name] = _PLAIN_NEW
                fresh[name] = resource
                if collections is not None and name.startswith(PREFIX):
                    entry.joined(name)
            else:
                if name in fresh:  # (new here, written again: a record of its own first)
                    record = records[name] = _Record({"": fresh.pop(name)}, _NO_ERRORS,
                                                     _NO_EXPIRES)
                    entry.settled(name, record)
                    changed.add(name)
                self._upsert(type_url, entry, resource, now, changed, beats, update.deadlines)
        entry.plain.update(fresh)
        return fresh.keys() - changed

    @staticmethod
    def _answer(entry: _TypeEntry, locators: Iterable[Locator | str], changed: set[str]) -> None:
        """The origin has answered these locators (see :attr:`Update.answered`).

        Only what a reader can see changes a name. A name whose record holds
        one variant, unconstrained, is that variant to every subscriber,
        answered or not (see :meth:`served_to_all`): its answer is written and
        nobody is told. So the settling of a big client's names, cached by
        the response that answered them, tells nobody of thousands of names
        (each subscriber would look each of them up again, to send nothing).
        Where each is a plain name with a plain record, not yet answered (a
        cold client's, cached by the same response) or answered already (a
        reconnect's), all are answered in bulk by C code.
        """
        records = entry.records
        page = locators if isinstance(locators, list) else list(locators)
        held = list(map(id, map(records.get, page)))
        new = countOf(held, _PLAIN_NEW_ID)
        if page and new + countOf(held, _PLAIN_ANSWERED_ID) == len(page):
            # (each plain, answered now or already: a reconnect's resend
            # answers a big client's names again, each answered before)
            if not new:
                return
            names = cast(list[str], page)  # (each a key of records: a str)
            if "*" not in "\n".join(names):  # (a glob's answer is news: see below)
                records.update(dict.fromkeys(names, _PLAIN_ANSWERED))
                return
        get = records.get
        for locator in page:
            if isinstance(locator, str):
                name, params = locator, EMPTY_PARAMS
            else:
                name, params = locator
            found = get(name)
            answered = found.answered if found is not None else frozenset()
            if params in answered:
                continue
            answered = _ANSWERED_PLAIN if not answered and \
                params == EMPTY_PARAMS else answered | {params}
            if found is not None and found.variants is _IN_PLAIN:
                if answered is _ANSWERED_PLAIN and "*" not in name:
                    records[name] = _PLAIN_ANSWERED
                    continue
                found = entry.record(name)  # (one of its own, written below)
            if found is None or (not found.variants and found.is_bare()):
                entry.set_bare(name, found is not None and found.absent, answered)
                changed.add(name)
                if "*" in name:
                    entry.globs_answered = True
                continue
            found.answered = answered  # (a record with more is never shared)
            if len(variants := found.variants) != 1 or \
                    (only := variants.get("")) is None or \
                    only.constraints is not UNCONSTRAINED or "*" in name:
                changed.add(name)  # (a glob's answer is news to its members' subscribers)
                if "*" in name:
                    entry.globs_answered = True

    @staticmethod
    def _set_error(entry: _TypeEntry, error: discovery_pb2.ResourceError,
                   changed: set[str]) -> None:
        name = error.resource_name.name
        constraints = compile_constraints(error.resource_name.dynamic_parameter_constraints)
        errors = entry.record(name).own_errors()
        known = errors.get(constraints.key)
        if known is None or known[1] != error:
            errors[constraints.key] = (constraints, error)
            entry.erred.add(name)
            changed.add(name)

    def _upsert(self, type_url: str, entry: _TypeEntry, resource: CachedResource,
                now: float, changed: set[str], beats: set[str],
                deadlines: Mapping[tuple[str, str], float]) -> None:
        name, key = resource.name, resource.variant_key
        if resource.plain and (found := entry.records.get(name)) is not None and \
                found.variants is _IN_PLAIN:
            # (its one variant plain too: all there is to do is in ``plain``)
            if entry.plain[name].digest != resource.digest:
                entry.plain[name] = resource
                changed.add(name)
            return
        record = entry.record(name)
        # A variant that arrives clears its own error and the name's.
        if record.errors and any([record.errors.pop(k, None) for k in {key, ""}]):
            changed.add(name)
            if not record.errors:
                entry.erred.discard(name)
        ttl = resource.ttl_seconds
        if ttl is None:
            record.expires.pop(key, None)
        else:
            deadline = deadlines.get((name, key)) if deadlines else None
            self._set_deadline(type_url, record, name, key,
                               now + ttl if deadline is None else deadline)
        old = record.variants.get(key)
        # Content decides, not the version string: an identical resend
        # (istiod resends everything on every new stream) is no news. A
        # do-not-cache resource is news each time it is fetched: the
        # subscribers that asked for a fresh copy are waiting for it.
        if old is None or old.digest != resource.digest or resource.do_not_cache:
            if entry.collections is not None and not record.variants and \
                    name.startswith(PREFIX):
                entry.joined(name)
            if resource.do_not_cache:
                note_do_not_cache()  # (subscribers stamp their names from now on)
            record.variants[key] = resource
            entry.settled(name, record)
            changed.add(name)
        elif ttl is not None:
            beats.add(name)  # its TTL restarted at the origin: so at the clients
        record.absent = False
        for alias in resource.aliases:
            entry.aliases[alias] = name
            record.aliases |= {alias}
            alias_record = entry.records.get(alias)
            if alias_record is not None and alias_record.absent:
                entry.record(alias).absent = False
                entry.compact(alias)

    @staticmethod
    def _remove_name(entry: _TypeEntry, name: str, changed: set[str]) -> None:
        found = entry.records.get(name)
        if found is None or found.is_bare():
            # The common case, a name that never existed: no record of its own.
            if found is None or not found.absent:
                entry.set_bare(name, True, found.answered if found is not None else frozenset())
                changed.add(name)
            return
        record = entry.record(name)
        if record.variants or not record.absent:
            changed.add(name)
        if record.variants and entry.collections:
            entry.left(name)
        record.variants.clear()
        entry.plain.pop(name, None)
        record.expires.clear()
        record.absent = True
        _drop_aliases(entry, name, record, changed)

    @staticmethod
    def _remove_variant(entry: _TypeEntry, name: str, variant_key: str,
                        changed: set[str]) -> None:
        found = entry.records.get(name)
        if found is None or not (variant_key in entry.variants_of(name, found) or
                                 variant_key in found.expires):
            return
        record = entry.record(name)
        record.expires.pop(variant_key, None)
        if record.variants.pop(variant_key, None) is None:
            return
        entry.settled(name, record)
        changed.add(name)
        if not record.variants:
            if entry.collections:
                entry.left(name)
            record.absent = True
            _drop_aliases(entry, name, record, changed)

    def _heartbeat(self, type_url: str, entry: _TypeEntry, name: str, variant_key: str,
                   version: str, now: float, beats: set[str]) -> None:
        """The origin confirmed a variant unchanged: restart its TTL.

        A heartbeat for a version the cache does not hold changes nothing.
        """
        record = entry.records.get(name)
        variant = entry.variants_of(name, record).get(variant_key) \
            if record is not None else None
        if record is None or variant is None or variant.origin_version != version:
            return
        ttl = variant.ttl_seconds
        if ttl is not None:
            self._set_deadline(type_url, entry.record(name), name, variant_key, now + ttl)
        beats.add(name)

    def _set_deadline(self, type_url: str, record: _Record, name: str, key: str,
                      deadline: float) -> None:
        record.own_expires()[key] = deadline
        heapq.heappush(self._deadlines, (deadline, type_url, name, key))

    def _notify(self, change: CacheChange) -> None:
        for listener in self._listeners:
            listener(change)


def _only_upserts(update: Update) -> bool:
    """Whether ``update`` writes upserts and nothing else that
    :meth:`ResourceCache.apply_steps` would have to look at (answers and
    completeness it may carry: they are written with the upserts)."""
    # (an iterable of unknown length, a generator, is taken as writing something)
    return all(isinstance(part, Sized) and not len(part)
               for part in (update.removed, update.removed_variants, update.errors,
                            update.heartbeats)) and not update.deadlines


def _in_kept_collection(name: str, keep: Container[str]) -> bool:
    glob = collection_of(name)
    return glob is not None and glob in keep


def _drop_aliases(entry: _TypeEntry, name: str, record: _Record, changed: set[str]) -> None:
    """The resource ``name`` is gone: its aliases are gone with it."""
    for alias in record.aliases:
        entry.aliases.pop(alias, None)
        found = entry.records.get(alias)
        if found is None or found.is_bare():
            entry.set_bare(alias, True, found.answered if found is not None else frozenset())
        else:
            entry.record(alias).absent = True
        changed.add(alias)
    if record.aliases:
        record.aliases = _NO_NAMES
