"""What to subscribe on the origin stream: what clients want, what lingers.

Subscriptions are *locators*: a name plus the dynamic parameters a client
needs it with (none for a plain name). The relay subscribes the distinct
locators its clients use (read from a :class:`Demand`), except where a cached
variant, obtained through a locator already subscribed, also fits the new
parameters: that client is served from cache with no upstream round trip. A
subscription nobody wants any more *lingers* ``linger`` seconds before it
goes, :data:`DEFAULT_LINGER_NAMES` of them at most (see "linger" in
``docs/glossary.md``). What is no longer subscribed is dropped from the
cache, which nothing would keep current.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Collection, Container, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from operator import countOf
from typing import Protocol, cast

from relay.constraints import EMPTY_PARAMS, Locator, Params
from relay.memory import oversized
from relay.protocol.xdstp import PREFIX, collection_of
from relay.upstream.deadlines import Deadlines, LingerEnds, WildcardLingerEnds
from relay.upstream.requests import PLAIN, SubscriptionChange
from relay.upstream.scoped import OriginCache

Locators = dict[str, Set[Params]]
#: The parameter sets of a plain name as subscribed: one frozenset for every
#: such name (a set of its own costs 216 bytes a name; a client of 100,000
#: names would cost 20 MiB here alone).
_PLAIN: frozenset[Params] = PLAIN
_NOTHING: frozenset[Params] = frozenset()


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

    def wanted_among(self, type_url: str, names: Collection[str]) -> list[frozenset[Params]]:
        """:meth:`wanted_params` of each of ``names``, in their order."""

    def wants_wildcard(self, type_url: str) -> bool:
        """Whether any client wants every resource of the type."""

    def origin_refused(self, type_url: str, names: Iterable[str], message: str) -> int:
        """The origin refused a subscription carrying ``names``: clients may
        not have them (for a while); how many clients held them."""


def subscribes(cache: OriginCache, type_url: str, name: str, names: Container[str]) -> bool:
    """Whether a subscription to ``names`` covers the cached ``name``, by itself,
    by the glob collection it is a member of, or by an alias."""
    return name in names or in_collection(name, names) or \
        any(alias in names for alias in cache.aliases_of(type_url, name))


def in_collection(name: str, names: Container[str]) -> bool:
    """Whether ``name`` is a member of a glob collection among ``names`` (see
    :mod:`relay.protocol.xdstp`): what the origin sends of a collection is
    as subscribed as the collection."""
    if not name.startswith(PREFIX):
        return False  # a classic name
    glob = collection_of(name)
    return glob is not None and glob in names


def locators_of(locators: Mapping[str, Iterable[Params]]) -> Iterator[Locator]:
    return (Locator(name, params) for name, params_set in locators.items()
            for params in params_set)


def _params_order(params: Params) -> list[tuple[str, str]]:
    return sorted(params)


@dataclass
class TypeSubscription:
    """What the origin has been asked for of one type on the current stream."""

    locators: dict[str, frozenset[Params]] = field(default_factory=dict)
    wildcard: bool = False

    def count(self) -> int:
        """Locators subscribed, a wildcard counting one."""
        # A snapshot (list(...)): the OTLP exporter calls this from its own thread.
        return sum(len(params) for params in list(self.locators.values())) + self.wildcard


#: How many locators may linger at once (see :class:`Lingering`), the default of
#: ``upstream.linger_names``: what 20,000 names cost while they linger (3.5 MiB,
#: kept together in the heap) leaves a relay within 4-5 % of its RSS once a
#: client of 100,000 names has left (``python -m benchmarks.memory``, delta and
#: SotW), and any client of up to 20,000 names comes back at no cost to the
#: origin.
DEFAULT_LINGER_NAMES = 20_000

#: Locators let go within this many seconds of the ones before count as let go
#: together when the bound cuts (see :meth:`Lingering._bound`): a client's
#: departure reaches the upstream in slices, a few thousand names a turn of the
#: event loop, over many seconds on a busy relay.
TOGETHER = 2.0


#: The most locators whose linger ends in one tick of the upstream (see
#: :meth:`Lingering.due`): each costs its sync, its unsubscribe and its cache
#: record forgotten (~5 us), so 2,000 keep a tick within ~10 ms, as the
#: interest index and the upstream take a leaving client's names 2,000 a turn.
ENDING_PER_TICK = 2_000


class _Batch:
    """Locators of one type let go together, lingering until ``until``: a list
    slot each (8 bytes), not a record of their own."""

    __slots__ = ("counted", "departure", "in_memory_order", "names", "until", "variants")

    def __init__(self, until: float, counted: bool = True, departure: int = 0) -> None:
        self.until = until
        self.names: list[str] = []  # plain names (no parameters): nearly all
        self.variants: list[tuple[str, Params]] = []  # a name with parameters
        # False once cut short by the bound: no longer counted against it
        self.counted = counted
        # batches let go one after another, TOGETHER apart at most, share it
        self.departure = departure
        # whether ``names`` are sorted by their place in memory (see Lingering._bound)
        self.in_memory_order = False

    def __len__(self) -> int:
        return len(self.names) + len(self.variants)


class _Ending:
    """Locators of one type whose linger :meth:`Lingering.due` found ended, until
    the sync of their names takes them (:meth:`Lingering.take_ending`)."""

    __slots__ = ("names", "variants")

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.variants: dict[str, set[Params]] = {}

    def __bool__(self) -> bool:
        return bool(self.names or self.variants)

    def params(self, name: str) -> Set[Params]:
        """The parameter sets of ``name`` whose linger ended."""
        ended = self.variants.get(name)
        if ended is None:  # (a plain name: nearly always, and no set made for it)
            return _PLAIN if name in self.names else _NOTHING
        return ended | {EMPTY_PARAMS} if name in self.names else ended

    def take(self, names: Collection[str] | None) -> _Ending:
        """What of ``names`` (None: all) ended, taken out of this record."""
        taken = _Ending()
        if names is None:
            taken.names, self.names = self.names, set()
            taken.variants, self.variants = self.variants, {}
            return taken
        for name in names:
            if name in self.names:
                self.names.discard(name)
                taken.names.add(name)
            ended = self.variants.pop(name, None)
            if ended is not None:
                taken.variants[name] = ended
        return taken


class Lingering:
    """What nobody wants any more, per type, until it may go.

    Kept as *batches*: the locators let go at one moment (a client leaving
    with 100,000 names) are one list, appended once, with one deadline, rather
    than a deadline per locator (a {parameters: until} record per name cost
    262 bytes; a list slot costs 8). A locator let go is not looked up while
    it lingers: it lingers because it is subscribed and nobody wants it (see
    :meth:`Targets.target`), and when its batch is due, what of it is not in a
    later batch (let go again since) has its linger end, whether it is wanted
    by then or not: :meth:`Targets.sync` keeps what is wanted. One consequence:
    a locator already lingering that is let go again (another parameter set
    of its name came and went) lingers from the later time.

    At most ``limit`` locators linger at once (``upstream.linger_names``):
    past it, the oldest stop lingering at once. Batches let go within
    ``together`` seconds of the one before are one *departure* (a client
    leaving, which the upstream learns of in slices); the oldest departure is
    cut first, and within it the names lowest in memory (see :meth:`_bound`);
    each batch keeps its own time. A client of 100,000 names leaving would
    otherwise keep their subscriptions, cache records and names (about 180
    bytes a name, 18 MiB) for the whole linger; a client of more than
    ``limit`` names that comes back costs the origin the rest.
    """

    def __init__(self, deadlines: Deadlines, limit: int | None = None,
                 together: float = 0.0, per_tick: int | None = ENDING_PER_TICK) -> None:
        self._deadlines = deadlines
        self.limit = limit
        self.together = together
        self.per_tick = per_tick  # the most names whose linger ends per tick (None: all)
        self._departures = 0  # departures numbered, per Lingering
        # per type, oldest first (``until`` ascending)
        self._batches: dict[str, deque[_Batch]] = {}
        self._count = 0  # locators in counted batches
        self._ending: dict[str, _Ending] = {}
        self._wildcard: dict[str, float] = {}

    def count(self) -> int:
        """Locators lingering (those cut short by the bound not counted)."""
        return self._count

    def types(self) -> set[str]:
        """Types with something lingering."""
        return {*self._batches, *self._wildcard}

    def entries(self, type_url: str) -> Iterator[tuple[str, Params]]:
        """Every locator of the type let go and not yet due, repeats included."""
        for batch in self._batches.get(type_url, ()):
            yield from ((name, EMPTY_PARAMS) for name in batch.names)
            yield from batch.variants

    def wildcard_lingers(self, type_url: str, now: float) -> bool:
        return self._wildcard.get(type_url, -math.inf) > now

    def start(self, type_url: str, now: float, until: float, names: Collection[str] = (),
              variants: Collection[tuple[str, Params]] = ()) -> None:
        """Plain ``names`` and ``variants`` (name, parameters) were let go at
        ``now``: they may go at ``until``, unless let go again later."""
        if not names and not variants:
            return
        batches = self._batches.setdefault(type_url, deque())
        last = batches[-1] if batches and batches[-1].counted else None
        if last is not None and last.until == until:
            batch = last
        else:
            if last is None or until - last.until > self.together:
                self._departures += 1
            batch = _Batch(until, departure=self._departures)
            self._insert(type_url, batch)
        if names:
            batch.names.extend(names)
            batch.in_memory_order = False
        batch.variants.extend(variants)
        self._count += len(names) + len(variants)
        self._bound(now)

    def start_wildcard(self, type_url: str, until: float) -> None:
        if type_url not in self._wildcard:
            self._wildcard[type_url] = until
            self._deadlines.add(WildcardLingerEnds(type_url, until))

    def cancel_wildcard(self, type_url: str) -> None:
        self._wildcard.pop(type_url, None)

    def due(self, now: float) -> list[tuple[str, list[str]]]:
        """Per type with something that may go by ``now``: the names whose
        linger ended (kept for the sync of those names: :meth:`take_ending`).

        Of lingers that end, at most :attr:`per_tick` locators, all types
        together (type by type): a linger of 20,000 names ending is synced a
        slice at a time, each the work of a few milliseconds, rather than in
        one step of the event loop. What is due and not taken keeps a
        deadline that is due already, so the next tick goes on. What the
        bound cut goes whole, as it did: it is cut a few thousand names a
        turn as a client's departure reaches the upstream, and spreading it
        over more ticks left ~1 MiB more of a 100,000-name client behind
        while the rest lingered (``benchmarks.memory``: +6 % against +5 %)."""
        found = []
        room = math.inf if self.per_tick is None else self.per_tick
        for type_url in sorted(self.types()):
            names, taken = self._end_due(type_url, now, room)
            room -= taken
            if names or self._wildcard.get(type_url, math.inf) <= now:
                found.append((type_url, names))
        for type_url, batches in self._batches.items():
            if batches[0].until <= now:  # due, left for the next tick
                self._deadlines.add(LingerEnds(type_url, batches[0].until))
        return found

    def take_ending(self, type_url: str, now: float, names: Collection[str] | None) -> _Ending:
        """What of ``names`` (None: all) :meth:`due` found ended; a wildcard
        whose time is up stops lingering."""
        if self._wildcard.get(type_url, math.inf) <= now:
            del self._wildcard[type_url]
        ending = self._ending.get(type_url)
        if ending is None:
            return _Ending()
        taken = ending.take(names)
        if not ending:
            del self._ending[type_url]
        return taken

    def new_stream(self) -> None:
        """Nothing is subscribed any more: what :meth:`due` found ended is not
        (it is no longer let go: only what is is subscribed on the new stream)."""
        self._ending.clear()

    def stands(self, deadline: LingerEnds | WildcardLingerEnds) -> bool:
        if isinstance(deadline, WildcardLingerEnds):
            return self._wildcard.get(deadline.type_url) == deadline.at
        return any(batch.until == deadline.at
                   for batch in self._batches.get(deadline.type_url, ()))

    def _end_due(self, type_url: str, now: float, room: float) -> tuple[list[str], int]:
        """Take the batches of the type due by ``now``, of the locators whose
        linger ends ``room`` at most (the rest stay at the front of the
        batches; what the bound cut is taken whole): the names whose linger
        ends, and how many of ``room`` they took."""
        batches = self._batches.get(type_url)
        if not batches or batches[0].until > now or (room <= 0 and batches[0].counted):
            return [], 0
        order: list[str] = []  # the names in the order their batches hold them
        names: set[str] = set()
        variants: set[tuple[str, Params]] = set()
        cut = 0  # whether the first batch left was cut (the rest of one let go with these)
        taken = 0
        while batches and batches[0].until <= now and (room > 0 or not batches[0].counted):
            batch = batches[0]
            if len(batch) <= room or not batch.counted:  # (what the bound cut: whole)
                batches.popleft()
            else:
                batch, cut = _first_of(batch, int(room)), 1
            if batch.counted:
                room -= len(batch)
                taken += len(batch)
            if batch.counted:
                self._count -= len(batch)
            order += batch.names
            order += (name for name, _ in batch.variants)
            names.update(batch.names)
            variants.update(batch.variants)
        for later in itertools.islice(batches, cut, None):  # let go again since: they linger on
            if names:
                names.difference_update(later.names)
            if variants:
                variants.difference_update(later.variants)
        if not batches:
            del self._batches[type_url]
        ending = self._ending.setdefault(type_url, _Ending())
        ending.names |= names
        for name, params in variants:
            ending.variants.setdefault(name, set()).add(params)
        ended = names | {name for name, _ in variants}
        found = []
        for name in order:  # each once, in order
            if name in ended:
                ended.discard(name)
                found.append(name)
        return found, taken

    def _insert(self, type_url: str, batch: _Batch) -> None:
        """Add ``batch`` in ``until`` order (at the end, but for a cut-short one)."""
        batches = self._batches.setdefault(type_url, deque())
        index = len(batches)
        while index and batches[index - 1].until > batch.until:
            index -= 1
        batches.insert(index, batch)
        self._deadlines.add(LingerEnds(type_url, batch.until))

    def _bound(self, now: float) -> None:
        """Past :attr:`limit` locators lingering, the oldest stop lingering now.

        Of the oldest departure, the plain names that stop lingering are
        those lowest in memory (``id``), so that those kept lie together: a
        client's names were allocated one here and one there among its other
        objects, and 20,000 kept of 100,000 in the order they were let go
        would keep a live string in nearly every heap page they took, none of
        which could go back to the system (``benchmarks.memory``, SotW:
        +11-12 % 5 s after the client left, against +4-5 % kept in memory
        order). Each cut sorts what the departure keeps (at most ``limit``
        names, in order already, and those added since).
        """
        excess = 0 if self.limit is None else self._count - self.limit
        while excess > 0:
            type_url, oldest = min(
                ((t, next(b for b in batches if b.counted))
                 for t, batches in self._batches.items() if any(b.counted for b in batches)),
                key=lambda found: found[1].until)
            batches = self._batches[type_url]
            departure = [b for b in batches if b.counted and b.departure == oldest.departure]
            cut = _Batch(now, counted=False)
            cut.names = _lowest_in_memory(departure, excess)
            if not cut.names:  # only names with parameters left: the oldest first
                cut.variants = oldest.variants[:excess]
                del oldest.variants[:excess]
            self._count -= len(cut)
            excess -= len(cut)
            for batch in departure:
                if not batch:
                    batches.remove(batch)
            self._insert(type_url, cut)


def _first_of(batch: _Batch, count: int) -> _Batch:
    """Take the first ``count`` locators out of ``batch`` (its plain names
    first), as a batch of their own with the same time."""
    first = _Batch(batch.until, batch.counted, batch.departure)
    first.names = batch.names[:count]
    del batch.names[:count]
    rest = count - len(first.names)
    if rest:
        first.variants = batch.variants[:rest]
        del batch.variants[:rest]
    return first


def _lowest_in_memory(batches: list[_Batch], count: int) -> list[str]:
    """Take the ``count`` plain names lowest in memory out of ``batches`` (all
    of them if there are no more; a name let go more than once goes with all
    its entries); each batch keeps the rest, in memory order.

    Each batch is sorted once (a batch cut before is sorted already), and the
    lowest are merged from them: the work is that of the names let go since
    and of those taken, not of all that linger."""
    for batch in batches:
        if not batch.in_memory_order:
            batch.names.sort(key=id)
            batch.in_memory_order = True
    runs = [batch.names for batch in batches if batch.names]
    lowest = list(itertools.islice(heapq.merge(*runs, key=id), count))
    if not lowest:
        return []
    highest = id(lowest[-1])
    taken: list[str] = []
    for batch in batches:
        end = bisect.bisect_right(batch.names, highest, key=id)
        taken += batch.names[:end]
        del batch.names[:end]
    return taken


class Targets:
    """Per type, the locators (and wildcard) subscribed on the current stream,
    brought in line with what clients want and what lingers."""

    def __init__(self, cache: OriginCache, linger: float, deadlines: Deadlines,
                 linger_names: int | None = DEFAULT_LINGER_NAMES) -> None:
        self.cache = cache
        self.linger = linger
        self.lingering = Lingering(deadlines, linger_names, TOGETHER)
        self._subscribed: dict[str, TypeSubscription] = {}
        # names re-subscribed to get a fresh do-not-cache copy, per type
        self._refetching: dict[str, set[str]] = {}
        # whether what the current stream does not subscribe to was forgotten
        self._pruned = True

    def subscription(self, type_url: str) -> TypeSubscription | None:
        return self._subscribed.get(type_url)

    def has_subscriptions(self) -> bool:
        return bool(self._subscribed)

    def subscription_counts(self) -> dict[str, int]:
        """Per type URL: locators subscribed on the stream (a wildcard counts one)."""
        return {type_url: sub.count() for type_url, sub in list(self._subscribed.items())}

    # -- a new stream ---------------------------------------------------------

    def new_stream(self, demand: Demand) -> list[str]:
        """A new stream, nothing subscribed on it yet: the types to subscribe."""
        self._subscribed = {}
        self._pruned = False
        self.lingering.new_stream()
        return sorted({*demand.wanted_types(), *self.lingering.types()})

    def resubscribe(self, type_url: str, demand: Demand, now: float) -> TypeSubscription | None:
        """Subscribe on a new stream everything wanted of the type (None: nothing is)."""
        target, wildcard = self.target(type_url, demand, now, None)
        if not target and not wildcard:
            return None
        # (each frozen already, a big client's: the dict copied, no step per name)
        locators = cast(dict[str, frozenset[Params]], dict(target)) \
            if countOf(map(type, target.values()), frozenset) == len(target) else \
            {n: _PLAIN if ps == _PLAIN else frozenset(ps) for n, ps in target.items()}
        sub = self._subscribed[type_url] = TypeSubscription(locators, wildcard)
        return sub

    def prune_once(self) -> None:
        """The origin answered a new stream: forget what its subscription does
        not cover (once per stream). The origin will neither confirm nor
        remove it, so it would go stale (names a restored snapshot holds that
        no client wants). A type the cache held whole is not whole without a
        wildcard subscription."""
        if self._pruned:
            return
        self._pruned = True
        for type_url in self.cache.type_urls():
            sub = self._subscribed.get(type_url, TypeSubscription())
            if sub.wildcard:
                continue
            names = self.cache.names(type_url)
            if countOf(map(sub.locators.__contains__, names), True) == len(names) and \
                    not self.cache.is_complete(type_url):
                continue  # each subscribed by its own name (a big client's: no step each)
            keep = {name for name in names
                    if subscribes(self.cache, type_url, name, sub.locators)}
            if len(keep) < len(names) or self.cache.is_complete(type_url):
                self.cache.end_wildcard(type_url, keep)

    # -- interest ---------------------------------------------------------------

    def interest_changed(self, type_url: str, demand: Demand, now: float,
                         names: Collection[str] | None) -> Collection[str]:
        """Whatever of ``names`` (None: every name) is subscribed and nobody
        wants any more starts lingering (what is wanted again needs nothing:
        see :class:`Lingering`). The names to sync."""
        sub = self._subscribed.get(type_url, TypeSubscription())
        already: set[tuple[str, Params]] = set()
        if names is None:
            already = set(self.lingering.entries(type_url))
            names = {*sub.locators, *demand.wanted_locators(type_url),
                     *(name for name, _ in already)}
        until = now + self.linger
        if self.linger > 0:
            # (what is not subscribed cannot be let go: a client joining asks nothing here)
            held = list(filter(sub.locators.__contains__, names))
            plain, variants = _let_go(sub.locators, held, _wanted(demand, type_url, held),
                                      already)
            self.lingering.start(type_url, now, until, plain, variants)
        if demand.wants_wildcard(type_url):
            self.lingering.cancel_wildcard(type_url)
        elif sub.wildcard:
            self.lingering.start_wildcard(type_url, until)
        return names

    def sync(self, type_url: str, demand: Demand, now: float,
             names: Collection[str] | None = None) -> SubscriptionChange:
        """Bring the subscription of ``names`` (None: every name) and of the
        wildcard in line with what is needed: the change, and what is no
        longer subscribed dropped from the cache."""
        ending = self.lingering.take_ending(type_url, now, names)
        target, wildcard = self.target(type_url, demand, now, names, ending)
        sub = self._subscribed.setdefault(type_url, TypeSubscription())
        subscribe, unsubscribe = _replace(sub, target, names is None)
        if unsubscribe and oversized(sub.locators):  # most of it went: a table as small as the rest
            sub.locators = dict(sub.locators)
        if not wildcard:  # (the wildcard subscription still brings every variant)
            # names no subscription keeps: forgotten together, told once
            gone = [] if any(map(target.get, unsubscribe)) else list(unsubscribe)
            for name, dropped in unsubscribe.items() if not gone else ():
                kept = target.get(name, set())
                if kept:
                    self._forget_variants(type_url, name, kept, dropped)
                else:
                    gone.append(name)
            if gone:
                self.cache.forget(type_url, gone, keep=sub.locators)
        was_wildcard = sub.wildcard
        if was_wildcard and not wildcard:
            self.cache.end_wildcard(type_url, sub.locators.keys())
        sub.wildcard = wildcard
        if not sub.locators and not sub.wildcard:
            del self._subscribed[type_url]
        return SubscriptionChange(type_url, subscribe, unsubscribe,
                                  wildcard=None if was_wildcard == wildcard else wildcard)

    def refetch(self, type_url: str, names: frozenset[str]) -> SubscriptionChange | None:
        """Subscribe these names again so the origin resends them (do-not-cache).

        A name already being refetched is not asked for twice; the next
        response for the type ends the wait (:meth:`responded`).
        """
        sub = self._subscribed.get(type_url)
        if sub is None:
            return None
        asking = self._refetching.setdefault(type_url, set())
        fresh = {n: set(sub.locators[n]) for n in names if n in sub.locators and n not in asking}
        if not fresh:
            return None
        asking.update(fresh)
        return SubscriptionChange(type_url, fresh)

    def responded(self, type_url: str) -> None:
        """A response of the type: what was being refetched has come (or will not)."""
        self._refetching.pop(type_url, None)

    # -- targets ------------------------------------------------------------------

    def target(self, type_url: str, demand: Demand, now: float,
               names: Collection[str] | None,
               ending: _Ending | None = None) -> tuple[Locators, bool]:
        """The locators to be subscribed to: what is needed and not served
        from cache already, for ``names`` (None: every name; of those given,
        one whose subscription stays as it is may be left out), and whether
        the wildcard is. Needed is what clients want and what lingers: a locator
        subscribed that nobody wants, unless its linger is ``ending``; on a
        new stream, nothing is subscribed yet: what was let go and is not
        due."""
        wildcard = demand.wants_wildcard(type_url) or \
            self.lingering.wildcard_lingers(type_url, now)
        current = self._subscribed.get(type_url, TypeSubscription()).locators
        needed: dict[str, frozenset[Params]]
        if names is None:
            needed = demand.wanted_locators(type_url)
            for name, params in self.lingering.entries(type_url):
                if ending is None or params not in ending.params(name):
                    needed[name] = needed.get(name, frozenset()) | {params}
            names = {*needed, *current}
        else:
            wants = _wanted(demand, type_url, names)
            joining = _joining_together(current, names, wants)
            if joining is not None:
                return joining, wildcard
            wanted_only = _wanted_only(names, wants) if self.linger > 0 and not ending else None
            if wanted_only is not None:
                needed, names = wanted_only, wanted_only.keys()
            elif ending and _all_ended(current, names, wants, ending):
                return dict.fromkeys(names, _NOTHING), wildcard
            else:
                needed = dict(zip(names, wants, strict=True))
        if self.linger > 0:
            for name in names:
                subscribed = current.get(name)
                if not subscribed:
                    continue
                wanted = needed.get(name, _NOTHING)
                if subscribed <= wanted:
                    continue  # wanted as subscribed: nothing lingers
                held = subscribed - wanted if wanted else subscribed
                if ending:
                    held = held - ending.params(name)
                if held:
                    needed[name] = wanted | held if wanted else held
        return self._chosen(type_url, needed, current), wildcard

    def _chosen(self, type_url: str, needed: Mapping[str, Set[Params]],
                current: Mapping[str, Set[Params]]) -> Locators:
        """:meth:`target`'s locators of ``needed`` (``current``: what is subscribed)."""
        if not current and countOf(needed.values(), _PLAIN) == len(needed):
            # (a new stream's plain names, each new: subscribed as they are,
            # with no step per name; the loop below takes these so one by one)
            return dict(needed)
        target: Locators = {}
        for name, params_set in needed.items():
            subscribed = current.get(name)
            if (subscribed is None and len(params_set) == 1) or not params_set:
                # The common cases: one plain name, new (nothing subscribed
                # for it can serve it from cache: it is subscribed as it is),
                # and a name nobody needs (a client of many names left).
                target[name] = params_set
                continue
            chosen = set() if subscribed is None else set(subscribed & params_set)
            for params in sorted(params_set - chosen, key=_params_order):
                if not self._served_from_cache(type_url, name, params, chosen):
                    chosen.add(params)
            target[name] = chosen
        return target

    def _served_from_cache(self, type_url: str, name: str, params: Params,
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

    def _forget_variants(self, type_url: str, name: str, kept: Set[Params],
                         dropped: Set[Params]) -> None:
        """Drop cached variants of ``name`` that no remaining subscription keeps current."""
        found = self.cache.variants(type_url, name)
        keep = [key for key, variant in found.items()
                if any(variant.constraints.matches(p) for p in kept)] \
            if isinstance(found, Mapping) else []
        self.cache.forget_variants(type_url, name, keep, dropped)


def _wanted(demand: Demand, type_url: str, names: Collection[str]) -> list[frozenset[Params]]:
    """What clients want of each of ``names``, in their order (the demand
    looks them up together: a big client's names at once)."""
    return demand.wanted_among(type_url, names)


def _all_plain(subscribed: Mapping[str, Set[Params]], names: Collection[str]) -> bool:
    """Whether each of ``names`` is subscribed as a plain name, and nothing else."""
    return countOf(map(subscribed.get, names), _PLAIN) == len(names)


# -- whole-set paths --------------------------------------------------------------
#
# A client of many plain names leaving reaches the targets a slice at a time,
# each slice's names alike: nobody wants them, each is subscribed plain, and
# later their linger ends together. Each function below does for such a
# slice, with a few operations on the whole set, what the loop after it does
# name by name; None where the names are not all alike (the loop then runs).
# tests/upstream/test_targets_together.py holds each to its loop.


def _let_go_together(subscribed: Mapping[str, Set[Params]], names: Collection[str],
                     wanted: list[frozenset[Params]],
                     already: Container[tuple[str, Params]]) -> list[str] | None:
    """The names let go, where none of ``names`` is wanted or lingers
    ``already`` and each is subscribed plain: all of them."""
    if already or any(wanted) or not _all_plain(subscribed, names):
        return None
    return list(names)


def _wanted_only(names: Collection[str], wanted: list[frozenset[Params]]
                 ) -> dict[str, frozenset[Params]] | None:
    """What is needed of ``names`` where names nobody wants keep what they
    have (their linger goes on, or nothing is subscribed): only the wanted
    ones, each with what is wanted of it (what the others need is what is
    subscribed: left out, as their subscriptions stay)."""
    return dict(zip(itertools.compress(names, wanted), filter(None, wanted), strict=True))


def _all_ended(current: Mapping[str, Set[Params]], names: Collection[str],
               wanted: list[frozenset[Params]], ending: _Ending) -> bool:
    """Whether ``names`` are plain names whose linger ended (all of
    ``ending``) and nobody wants: all of them go."""
    return not any(wanted) and not ending.variants and ending.names.issuperset(names) and \
        _all_plain(current, names)


def _replace_together(sub: TypeSubscription, target: Locators) -> Locators | None:
    """What :func:`_replace` does where every name of ``target`` is let go
    and subscribed: all unsubscribed, in name order."""
    if not target or any(target.values()) or not all(map(sub.locators.__contains__, target)):
        return None
    names = sorted(target)
    return dict(zip(names, map(sub.locators.pop, names), strict=True))


def _subscribe_together(sub: TypeSubscription, target: Locators) -> Locators | None:
    """What :func:`_replace` does where every name of ``target`` is wanted
    plain and none is subscribed (a big client joining): all subscribed, in
    name order."""
    if not target or countOf(target.values(), _PLAIN) != len(target) or \
            not sub.locators.keys().isdisjoint(target):
        return None
    joined = dict.fromkeys(sorted(target), _PLAIN)
    sub.locators.update(joined)
    return cast(Locators, joined)


def _joining_together(current: Mapping[str, Set[Params]], names: Collection[str],
                      wanted: list[frozenset[Params]]) -> Locators | None:
    """What :meth:`Targets.target` needs of ``names`` where each is wanted
    plain and none is subscribed (a big client joining: nothing of them
    lingers or is served from cache): each plain, in their order. Counted
    in C: the demand answers such names with one object repeated, found by
    identity."""
    if not wanted or wanted[0] != _PLAIN or countOf(wanted, wanted[0]) != len(wanted) or \
            not current.keys().isdisjoint(names):
        return None
    return dict.fromkeys(names, _PLAIN)


def _let_go(subscribed: Mapping[str, Set[Params]], names: Collection[str],
            wanted: list[frozenset[Params]], already: Container[tuple[str, Params]]
            ) -> tuple[list[str], list[tuple[str, Params]]]:
    """The locators of ``names`` subscribed that nobody wants (``wanted``: what
    clients want of each) and not ``already`` lingering: plain names, and
    names with parameters."""
    together = _let_go_together(subscribed, names, wanted, already)
    if together is not None:
        return together, []
    plain: list[str] = []
    variants: list[tuple[str, Params]] = []
    for name, wants in zip(names, wanted, strict=True):
        held = subscribed.get(name)
        if not held:
            continue
        for params in held - wants:
            if (name, params) in already:
                continue
            if params == EMPTY_PARAMS:
                plain.append(name)
            else:
                variants.append((name, params))
    return plain, variants


def _replace(sub: TypeSubscription, target: Locators, whole: bool) -> tuple[Locators, Locators]:
    """Subscribe ``target`` for its names (``whole``: and nothing else): what
    is subscribed and what unsubscribed, by name."""
    subscribe: Locators = {}
    together = None if whole else _replace_together(sub, target)
    if together is not None:
        return subscribe, together
    joined = None if whole else _subscribe_together(sub, target)
    if joined is not None:
        return joined, {}
    unsubscribe: Locators = {}
    scope = {*target, *sub.locators} if whole else set(target)
    for name in sorted(scope):
        new, old = target.get(name, _NOTHING), sub.locators.get(name, _NOTHING)
        if not new:  # (a name let go: a client of many names left)
            if old:
                unsubscribe[name] = old
                del sub.locators[name]
            continue
        if new - old:
            subscribe[name] = new - old
        if old - new:
            unsubscribe[name] = old - new
        sub.locators[name] = _PLAIN if new == _PLAIN else frozenset(new)
    return subscribe, unsubscribe
