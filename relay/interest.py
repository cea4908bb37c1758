"""Who wants what: the fleet-wide index of what downstream clients subscribe to.

Two jobs, both driven by the same bookkeeping:

* fan a :class:`~relay.cache.CacheChange` out to exactly the subscribers of
  the changed names (and the wildcard subscribers of the type);
* keep the union of all subscriptions per type, for the upstream to read.

A glob collection (``xdstp://AUTHORITY/TYPE/PATH/*``, see
:mod:`relay.protocol.xdstp`) is held as a name, so that the union carries it
once, literally, for all its subscribers; a change to one of its members
reaches the subscribers of the collection as well as those of the member.

Data flows down (origin, upstream, cache, this index, streams). The one way
back up is :class:`Upward`, wired once (see :mod:`relay.core`): the index
tells it when the union for a type changed, and which names clients need a
fresh copy of; the upstream then reads the union from the index.
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque
from collections.abc import Collection, Hashable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from operator import countOf, is_
from typing import Protocol

from relay.cache import CacheChange
from relay.constraints import EMPTY_PARAMS, Params
from relay.demand import DemandLedger
from relay.memory import oversized
from relay.protocol.xdstp import collection_of, is_glob, xdstp_among


class Subscriber(Hashable, Protocol):
    """Something that holds subscriptions: one downstream stream."""

    def resources_changed(self, type_url: str, names: frozenset[str], everything: bool) -> None:
        """Names of ``type_url`` changed in the cache (``everything``: re-check all)."""

    def heartbeats_received(self, type_url: str, names: frozenset[str]) -> None:
        """The origin sent heartbeats for these names (nothing changed)."""

    def subscription_refused(self, type_url: str, names: frozenset[str], message: str) -> None:
        """The origin refused these names, which the index no longer holds for
        the subscriber; ``message`` says so, for its client."""


@dataclass(frozen=True)
class Interest:
    """Everything one subscriber wants of one type, stated whole.

    ``params`` gives the dynamic parameters of the names that have any
    (from a ``ResourceLocator`` or the node); other names have none.
    """

    names: frozenset[str] = frozenset()
    wildcard: bool = False
    params: frozenset[tuple[str, Params]] = frozenset()

    def by_name(self) -> dict[str, Params]:
        """Each name with the parameters it is subscribed with."""
        with_params = dict(self.params)
        return {name: with_params.get(name, EMPTY_PARAMS) for name in self.names}


@dataclass(frozen=True)
class InterestChange:
    """How one subscriber's interest in one type changed since it last said.

    ``added`` are names it now subscribes to, with their parameters;
    ``removed`` names it no longer subscribes to, with the parameters they
    had. A name whose parameters changed is in both. ``wildcard`` is its new
    wildcard state, None when unchanged. ``globs`` are the glob collections
    among ``added`` (the subscriber took the names apart already: the index
    need not look at every name). The size of a change is what the request
    touched, never the whole subscription.
    """

    added: Mapping[str, Params] = field(default_factory=dict)
    removed: Mapping[str, Params] = field(default_factory=dict)
    wildcard: bool | None = None
    globs: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.wildcard is not None)


class Upward(Protocol):
    """The one way back up, from the clients to the origin side.

    Both calls only say that something is wanted; whoever receives them reads
    the details from the index when it acts (the upstream does so in a later
    turn of the event loop, never inside a client's request).
    """

    def interest_changed(self, type_url: str, names: Iterable[str]) -> None:
        """The union of what clients want of ``type_url`` changed for these
        names (none: only the wildcard changed)."""

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        """Clients need fresh copies of these resources (do-not-cache: the
        cached copy was fetched before they asked)."""


@dataclass(slots=True)
class _Subscription:
    """What the index knows one subscriber wants of one type, and the client
    host whose share of the upstream demand it counts against (None: none)."""

    names: dict[str, Params] = field(default_factory=dict)
    wildcard: bool = False
    host: str | None = None
    #: the parameters every one of ``names`` has, where the index knows they
    #: all have the same (None: not known so): a big client's names come so
    alike: Params | None = None


@dataclass(slots=True, eq=False)
class _Shared:
    """The holders of a name two or more subscribers hold, and how many of
    them use each parameter set (the name's share of the union).

    One group serves every name with the same holders that one change made
    so (see :class:`_Regrouping`): a client subscribing to the 100,000 names
    another holds costs a few groups, not 100,000 sets and dicts. ``uses``
    counts the names it serves: a group of one name changes in place (a
    thousand streams joining one name cost what they did), a group of more
    is copied first (its other names keep their holders).
    """

    subscribers: set[Subscriber]
    counts: dict[Params, int]
    uses: int = 0


class _Regrouping:
    """The holder groups one change to one subscriber's interest makes, each
    made once: every name that had the same holders (with the same
    parameters) gets the same new group. Each method returns what holds the
    name now, its ``uses`` counted; the caller puts it in the name's place."""

    __slots__ = ("_made", "subscriber")

    def __init__(self, subscriber: Subscriber) -> None:
        self.subscriber = subscriber
        self._made: dict[tuple[object, ...], Subscriber | _Shared] = {}

    def joined(self, found: Subscriber | _Shared, theirs: Params | None,
               params: Params) -> _Shared:
        """The holders ``found`` (one subscriber holding with ``theirs``, or
        a group) and the subscriber, holding with ``params``."""
        key = (found, theirs, params)
        made = self._made.get(key)
        if made is None:
            if isinstance(found, _Shared):
                if found.uses == 1:  # this name's own: changed in place
                    found.subscribers.add(self.subscriber)
                    found.counts[params] = found.counts.get(params, 0) + 1
                    return found
                made = _Shared({*found.subscribers, self.subscriber},
                               _counted(found.counts, params, 1))
            else:
                assert theirs is not None
                made = _Shared({found, self.subscriber}, _counted({theirs: 1}, params, 1))
            self._made[key] = made
        joined = _moved_to(found, made)
        assert isinstance(joined, _Shared)
        return joined

    def left(self, found: _Shared, params: Params) -> Subscriber | _Shared:
        """The holders ``found`` without the subscriber (which held with
        ``params``): the one left, or a group."""
        key = ("left", found, params)
        made = self._made.get(key)
        if made is None:
            if len(found.subscribers) == 2:
                # held by one again: the subscriber itself is the holder
                [made] = found.subscribers - {self.subscriber}
            elif found.uses == 1:
                found.subscribers.discard(self.subscriber)
                found.counts = _counted(found.counts, params, -1)
                return found
            else:
                made = _Shared(found.subscribers - {self.subscriber},
                               _counted(found.counts, params, -1))
            self._made[key] = made
        return _moved_to(found, made)

    def moved(self, found: _Shared, old: Params, new: Params) -> _Shared:
        """The holders ``found``, the subscriber holding with ``new`` instead of ``old``."""
        key = ("moved", found, old, new)
        made = self._made.get(key)
        if made is None:
            counts = _counted(_counted(found.counts, old, -1), new, 1)
            if found.uses == 1:
                found.counts = counts
                return found
            made = self._made[key] = _Shared(set(found.subscribers), counts)
        moved = _moved_to(found, made)
        assert isinstance(moved, _Shared)
        return moved


def _moved_to(found: Subscriber | _Shared, made: _Shared | Subscriber) -> _Shared | Subscriber:
    """A name held by ``found`` is held by ``made`` now: the groups' uses counted."""
    if isinstance(found, _Shared):
        found.uses -= 1
    if isinstance(made, _Shared):
        made.uses += 1
    return made


def _one_holder(holders: Mapping[str, Subscriber | _Shared], names: Iterable[str]
                ) -> tuple[Subscriber | _Shared | None, ...]:
    """The one holder (None: nobody) of each of ``names`` (not empty), in a
    tuple; () where they have several. By identity (a subscriber may compare
    equal to another), in C: no call each."""
    found = holders.get(next(iter(names)))
    return (found,) if all(map(is_, map(holders.get, names), itertools.repeat(found))) else ()


def _counted(counts: Mapping[Params, int], params: Params, by: int) -> dict[Params, int]:
    """A copy of ``counts`` with that of ``params`` changed ``by`` (gone at 0)."""
    out = dict(counts)
    count = out.get(params, 0) + by
    if count:
        out[params] = count
    else:
        del out[params]
    return out


@dataclass(frozen=True, slots=True)
class _Checked:
    """What the demand check learned of a change's added names, so that
    applying it need not look them up again (what it looked at stays so in
    between: the change's removals are of other names, and take nothing
    from the host's counts of these)."""

    #: :meth:`~relay.demand.DemandLedger.held_alike` of them (None: not asked)
    alike: int | None = None
    #: their one holder, by identity (None: nobody's), in a tuple; () where
    #: they have several; None: not asked
    held: tuple[Subscriber | _Shared | None, ...] | None = None


_UNCHECKED = _Checked()

#: The parameter sets of a name held by plain subscriptions only: one frozenset
#: for every such name (the upstream reads one per name).
_PLAIN: frozenset[Params] = frozenset({EMPTY_PARAMS})
_NONE: frozenset[Params] = frozenset()  # (what nobody wants)


class InterestIndex:
    """Subscriptions of all downstream streams, by type and name.

    Every update costs what it changes: a subscriber tells the index how its
    interest changed (:meth:`apply`), never its whole interest again.

    A name is held, nearly always, by one subscriber: the index then keeps
    the subscriber itself as its holder, whose own subscription says with
    which parameters. Only a name held by several costs a :class:`_Shared`
    (a set of them and a count per parameter set). The union the upstream
    reads is the holders' names, oldest first, and their parameter sets.
    """

    def __init__(self) -> None:
        # type URL -> name -> who holds it (one subscriber, or several)
        self._holders: dict[str, dict[str, Subscriber | _Shared]] = defaultdict(dict)
        self._wildcard: dict[str, set[Subscriber]] = defaultdict(set)
        # type URL -> the glob collections held (none: no type has any)
        self._globs: dict[str, set[str]] = {}
        self._union_names = 0  # names held, all types: the union's size
        self._per_subscriber: dict[Subscriber, dict[str, _Subscription]] = {}
        self._upward: Upward | None = None
        self._demand: DemandLedger | None = None
        # whether the ledger counted every name held here (none were held before it)
        self._counted_here = False

    def limit_demand(self, ledger: DemandLedger) -> None:
        """Check every subscription against ``ledger`` from now on (see
        :mod:`relay.demand`): where the union goes to an origin."""
        ledger.attach()
        self._demand = ledger
        self._counted_here = not self._per_subscriber

    @property
    def upstream_names(self) -> int:
        """Names in the union, all types: what the origin stream subscribes."""
        return self._union_names

    def link(self, upward: Upward) -> None:
        """Tell ``upward`` of interest changes and re-fetches from now on (one only)."""
        self._upward = upward

    def request_refetch(self, type_url: str, names: frozenset[str]) -> None:
        """A subscriber may not be served these (do-not-cache) from cache: fetch again."""
        if self._upward is not None:
            self._upward.refetch(type_url, names)

    # -- downstream side -------------------------------------------------

    def apply(self, subscriber: Subscriber, type_url: str, change: InterestChange,
              host: str | None = None) -> None:
        """Record how ``subscriber``'s interest in ``type_url`` changed.

        ``host`` is the client host whose share of the upstream demand the
        subscriber's names count against (taken at its first change; None:
        none). With a :class:`~relay.demand.DemandLedger`, a change that would
        pass its bounds raises :class:`~relay.protocol.limits.LimitExceeded`
        before anything of it is applied.

        Registers the subscriber for the type even when nothing changed, so
        that it hears when the type becomes synced.
        """
        mine = self._per_subscriber.get(subscriber, {}).get(type_url)
        demand = self._demand
        checked = _UNCHECKED
        if demand is not None and change.added:
            checked = self._check_demand(demand, subscriber, mine,
                                         host if mine is None else mine.host, type_url, change)
        if mine is None:
            mine = self._per_subscriber.setdefault(subscriber, {})[type_url] = \
                _Subscription(host=host)
        # whose share the names count against, where shares are counted
        ledger, holder = (demand, mine.host) if demand is not None and mine.host is not None \
            else (None, "")
        holders = self._holders[type_url]
        touched: list[str] = []
        regrouping = _Regrouping(subscriber)
        if change.removed:
            self._drop(regrouping, type_url, mine, holders, change, touched, ledger, holder)
        if change.added:
            self._add(subscriber, regrouping, type_url, mine, holders, change.added,
                      touched, ledger, holder, checked)
        if change.globs or type_url in self._globs:
            self._note_globs(type_url, holders, change.globs, touched)
        if change.removed:
            self._compact(type_url, holders, mine)
        wildcard_changed = change.wildcard is not None and \
            self._set_wildcard(subscriber, type_url, mine, change.wildcard)
        if (touched or wildcard_changed) and self._upward is not None:
            self._upward.interest_changed(type_url, touched)

    def _add(self, subscriber: Subscriber, regrouping: _Regrouping, type_url: str,
             mine: _Subscription,
             holders: dict[str, Subscriber | _Shared], added: Mapping[str, Params],
             touched: list[str], ledger: DemandLedger | None, holder: str,
             checked: _Checked) -> None:
        """``subscriber`` now holds ``added`` (new, or with other parameters).

        One request may add 100,000 names: :meth:`_hold` inline, in one loop
        with no call per name, in the order they came (the ledger told of the
        new ones together, after; ``checked``: what the check learned of them).
        """
        if self._add_together(subscriber, regrouping, type_url, mine, holders, added,
                              touched, ledger, holder, checked):
            return
        names = mine.names
        if mine.alike is not None and countOf(added.values(), mine.alike) != len(added):
            mine.alike = None  # (the loop may give some other parameters)
        # the names another holder holds, by holder (looked up once each)
        theirs: dict[Subscriber, dict[str, Params]] = {}
        # the groups of names one other subscriber held, by (it, its
        # parameters, ours): what regrouping.joined gives, without a call each
        pairs: dict[tuple[Subscriber, Params, Params], _Shared] = {}
        union = 0
        new: list[str] = []
        for name, params in added.items():
            had = names.get(name)
            if had is not None:
                if had != params:  # other parameters (said to be removed or not): they are
                    names[name] = params
                    self._reparameterize(regrouping, holders, name, had, params, touched)
                continue  # (or already subscribed so)
            names[name] = params
            new.append(name)
            found = holders.get(name)
            if found is None:
                holders[name] = subscriber
                union += 1
                touched.append(name)
                continue
            if isinstance(found, _Shared):
                if params not in found.counts:  # (asked first: the group may change)
                    touched.append(name)
                holders[name] = regrouping.joined(found, None, params)
                continue
            other = theirs.get(found)
            if other is None:
                other = theirs[found] = self._per_subscriber[found][type_url].names
            their_params = other[name]
            key = (found, their_params, params)
            made = pairs.get(key)
            if made is None:
                made = pairs[key] = regrouping.joined(found, their_params, params)
            else:
                made.uses += 1  # (as joined counts it: a subscriber was no group)
            holders[name] = made
            if params != their_params:
                touched.append(name)
        self._union_names += union
        if ledger is not None:
            ledger.hold_all(holder, type_url, new, checked.alike)

    def _add_together(self, subscriber: Subscriber, regrouping: _Regrouping, type_url: str,
                      mine: _Subscription, holders: dict[str, Subscriber | _Shared],
                      added: Mapping[str, Params], touched: list[str],
                      ledger: DemandLedger | None, holder: str, checked: _Checked) -> bool:
        """What :meth:`_add` does, for the names of a big client's subscribe
        as they nearly always come: all new to the subscriber, all with the
        same parameters, and all held by the same holders (none: the first
        client of them; one other subscriber, or one group: the clients
        before it). Done with a few operations on the whole set, where the
        loop costs ~1 us a name; False (nothing done) where it is not so."""
        if len(added) < 2 or checked.held == ():
            return False
        params = next(iter(added.values()))
        if countOf(added.values(), params) != len(added):
            return False
        # (the check looked them up, where there was one)
        one = checked.held if checked.held is not None else _one_holder(holders, added)
        if not one:
            return False
        [found] = one
        # (the subscriber holds a name where it is among its holders: all of
        # them or none, no look-up in its own table)
        if found is subscriber or (isinstance(found, _Shared) and
                                   subscriber in found.subscribers):
            return False
        made: _Shared | None = None
        if isinstance(found, _Shared):
            fresh = params not in found.counts  # (asked first: the group may change)
            made = regrouping.joined(found, None, params)
        elif found is not None:
            theirs = self._their_params(self._per_subscriber[found][type_url], added)
            if theirs is None:
                return False
            fresh = params != theirs
            made = regrouping.joined(found, theirs, params)
        # (the checks are over: from here the change is made)
        mine.alike = params if not mine.names or mine.alike == params else None
        mine.names.update(added)
        if found is None:
            holders.update(dict.fromkeys(added, subscriber))
            self._union_names += len(added)
            touched.extend(added)
        else:
            assert made is not None
            # the first name moved in joined; the rest as it would have moved them
            more = len(added) - 1
            made.uses += more
            if isinstance(found, _Shared):
                found.uses -= more
            # (names there already: overwritten from pairs, no table of them made)
            holders.update(zip(added, itertools.repeat(made)))
            if fresh:
                touched.extend(added)
        if ledger is not None:
            ledger.hold_all(holder, type_url, added, checked.alike)
        return True

    @staticmethod
    def _their_params(theirs: _Subscription, added: Collection[str]) -> Params | None:
        """The parameters with which a subscriber alone holds each of
        ``added`` (it holds them all), where it holds them all with the same
        (else None): known (``alike``), or read whole where it holds as many
        (these are all its names), not looked up each."""
        if theirs.alike is not None:
            return theirs.alike
        other = theirs.names
        params = other[next(iter(added))]
        if countOf(other.values() if len(other) == len(added) else
                   map(other.__getitem__, added), params) != len(added):
            return None
        return params

    def _drop(self, regrouping: _Regrouping, type_url: str, mine: _Subscription,
              holders: dict[str, Subscriber | _Shared], change: InterestChange,
              touched: list[str], ledger: DemandLedger | None, holder: str) -> None:
        """``subscriber`` no longer holds what ``change`` removes (but what it
        adds again with other parameters): :meth:`_release` inline, as
        :meth:`_add` is, for a client of 100,000 names leaving; the ledger
        told of them together, after."""
        if self._drop_together(regrouping, type_url, mine, holders, change, touched,
                               ledger, holder):
            return
        names, added = mine.names, change.added
        union = 0
        gone: list[str] = []
        for name, params in change.removed.items():
            if names.get(name) != params:
                continue  # not subscribed so: nothing to take back
            if name in added:
                continue  # held still, with other parameters: in _add
            del names[name]
            gone.append(name)
            found = holders[name]
            if not isinstance(found, _Shared):
                del holders[name]
                union += 1
                touched.append(name)
                continue
            if found.counts[params] == 1:  # (asked first: the group may change)
                touched.append(name)  # the last holder with these parameters
            holders[name] = regrouping.left(found, params)
        self._union_names -= union
        if ledger is not None:
            ledger.release_all(holder, type_url, gone)

    def _drop_together(self, regrouping: _Regrouping, type_url: str, mine: _Subscription,
                       holders: dict[str, Subscriber | _Shared], change: InterestChange,
                       touched: list[str], ledger: DemandLedger | None, holder: str) -> bool:
        """What :meth:`_drop` does, for the names of a client leaving (or
        unsubscribing many) as they nearly always go: all held by the
        subscriber, with the same parameters, none added again, and all held
        by the same holders (the subscriber alone: the last client of them;
        or one group: the clients with it). Done with a few operations on the
        whole set, where the loop costs ~1 us a name; False (nothing done)
        where it is not so."""
        removed, names = change.removed, mine.names
        if len(removed) < 2 or not change.added.keys().isdisjoint(removed.keys()):
            return False
        params = next(iter(removed.values()))
        if countOf(removed.values(), params) != len(removed) or \
                countOf(map(names.get, removed), params) != len(removed):
            return False
        founds = list(map(holders.__getitem__, removed))
        found = founds[0]
        # (holders by identity: a subscriber may compare equal to another)
        if not all(map(is_, founds, itertools.repeat(found))) or \
                not (isinstance(found, _Shared) or found is regrouping.subscriber):
            return False
        # (asked before the holders change)
        alike = None if ledger is None else \
            self._host_count(ledger, found, type_url, holder, len(removed))
        # (the checks are over: from here the change is made)
        if isinstance(found, _Shared):
            last = found.counts[params] == 1  # (asked first: the group may change)
            made = regrouping.left(found, params)
            # the first name moved in left; the rest as it would have moved them
            more = len(removed) - 1
            found.uses -= more
            if isinstance(made, _Shared):
                made.uses += more
            holders.update(zip(removed, itertools.repeat(made)))  # (as in _add_together)
            if last:
                touched.extend(removed)
        else:  # the last holder of them all
            deque(map(holders.__delitem__, removed), maxlen=0)  # (in C: no loop here)
            self._union_names -= len(removed)
            touched.extend(removed)
        if len(removed) == len(names):
            names.clear()
        else:
            deque(map(names.__delitem__, removed), maxlen=0)
        if ledger is not None:
            ledger.release_all(holder, type_url, removed.keys(), alike)
        return True

    def _host_count(self, demand: DemandLedger, found: Subscriber | _Shared | None,
                    type_url: str, host: str, most: int) -> int | None:
        """How often ``demand`` counts ``host`` holding each name ``found``
        holds (None: nobody), told by the index where the ledger counts this
        index's names alone (see :meth:`DemandLedger.counted_by_one`): how
        many of ``found``'s subscribers count against the host. So a big
        client's names are not looked up in the host's table to count them.
        None where that is not so, or where ``found`` is a group of more than
        ``most`` subscribers (the names' look-ups cost less)."""
        if not (self._counted_here and demand.counted_by_one()):
            return None
        if found is None:
            return 0
        if not isinstance(found, _Shared):
            return int(self._per_subscriber[found][type_url].host == host)
        if len(found.subscribers) > most:
            return None
        return sum(self._per_subscriber[subscriber][type_url].host == host
                   for subscriber in found.subscribers)

    def _set_wildcard(self, subscriber: Subscriber, type_url: str, mine: _Subscription,
                      wildcard: bool) -> bool:
        """``subscriber`` wants (or no longer wants) every resource of the type:
        whether the union's wildcard changed."""
        if wildcard == mine.wildcard:
            return False
        mine.wildcard = wildcard
        holding = self._wildcard[type_url]
        before = bool(holding)
        if wildcard:
            holding.add(subscriber)
        else:
            holding.discard(subscriber)
        return before != bool(holding)

    def _check_demand(self, demand: DemandLedger, subscriber: Subscriber,
                      mine: _Subscription | None, host: str | None, type_url: str,
                      change: InterestChange) -> _Checked:
        """Raise LimitExceeded if ``change`` would pass a bound of ``demand``.

        Costs what the change touches; its removals are counted only when its
        additions alone would pass a bound. Only names nobody holds yet are
        checked against the origin's refusals and the routes: a name held was
        checked when its first holder took it, and a name the origin refuses
        is taken from every holder at once (:meth:`origin_refused`), so that
        a client joining others' names costs no look-up per name.

        Returns what it learned of the added names (their one holder, how
        often the host holds them), for applying them by: a big client's
        names looked up in each table once."""
        holders = self._holders.get(type_url, {})
        held = mine.names if mine is not None else {}
        added = change.added
        # (a request of 100,000 names: counted in C, no call per name; nearly
        # always held by one holder, a warm client's, or by nobody)
        one = _one_holder(holders, added)
        new_upstream = (0 if one[0] is not None else len(added)) if one else \
            countOf(map(holders.__contains__, added), False)
        fresh = itertools.filterfalse(holders.__contains__, added) if new_upstream else ()
        # (what the subscriber holds, its host holds: counted in the ledger,
        # or told by their one holder)
        alike = None
        if host is not None:
            if one:
                alike = self._host_count(demand, one[0], type_url, host, len(added))
            if alike is None:
                alike = demand.held_alike(host, type_url, added)
        new_for_host = 0 if host is None or alike else len(added) if alike == 0 else \
            countOf(map(demand.held_by(host, type_url).__contains__, added), False)
        total = self._union_names
        over_total = total + new_upstream > demand.upstream_names
        over_host = host is not None and \
            demand.host_total(host) + new_for_host > demand.upstream_names_per_host
        if over_total or over_host:
            # What the change takes away makes room for what it adds.
            for name, params in change.removed.items():
                if name in change.added or held.get(name) != params:
                    continue
                if holders.get(name) is subscriber:  # its only holder
                    new_upstream -= 1
                if host is not None and demand.held_count(host, type_url, name) == 1:
                    new_for_host -= 1
        demand.check(host, type_url, total, max(0, new_upstream), max(0, new_for_host), fresh)
        return _Checked(alike, one)

    def update(self, subscriber: Subscriber, type_url: str, interest: Interest) -> None:
        """Set the whole of what ``subscriber`` wants of ``type_url``.

        Costs the size of both subscriptions: for a subscriber that states its
        interest whole; streams say what changed with :meth:`apply`.
        """
        mine = self._per_subscriber.get(subscriber, {}).get(type_url, _Subscription())
        new = interest.by_name()
        added = {n: p for n, p in new.items() if mine.names.get(n) != p}
        self.apply(subscriber, type_url, InterestChange(
            added, {n: p for n, p in mine.names.items() if new.get(n) != p},
            interest.wildcard, frozenset(filter(is_glob, xdstp_among(added)))))

    def names_held(self, subscriber: Subscriber) -> int:
        """How many names ``subscriber`` holds, all types together."""
        return sum(len(mine.names) for mine in self._per_subscriber.get(subscriber, {}).values())

    def remove(self, subscriber: Subscriber, limit: int | None = None) -> bool:
        """Forget the subscriptions of a subscriber that went away: all of
        them, or at most ``limit`` names. Returns whether none are left."""
        per_type = self._per_subscriber.get(subscriber, {})
        for type_url, mine in list(per_type.items()):
            if limit is not None and len(mine.names) > limit:
                taken = dict(itertools.islice(mine.names.items(), limit))
                self.apply(subscriber, type_url, InterestChange(removed=taken))
                return False
            count = len(mine.names)
            self.apply(subscriber, type_url, InterestChange(removed=dict(mine.names),
                                                            wildcard=False))
            del per_type[type_url]
            if limit is not None:
                limit -= count
        self._per_subscriber.pop(subscriber, None)
        return True

    def _note_globs(self, type_url: str, holders: dict[str, Subscriber | _Shared],
                    added: frozenset[str], touched: list[str]) -> None:
        """Keep the glob collections held of the type: ``added`` ones held now,
        and those of ``touched`` (whose holding changed) no longer held."""
        globs = self._globs.get(type_url)
        if added:
            if globs is None:
                globs = self._globs[type_url] = set()
            globs.update(glob for glob in added if glob in holders)
        if globs:
            globs.difference_update([name for name in touched
                                     if name in globs and name not in holders])
        if not globs:
            self._globs.pop(type_url, None)

    def _compact(self, type_url: str, holders: dict[str, Subscriber | _Shared],
                 mine: _Subscription) -> None:
        """Names went: tables far larger than what is left of them are copied
        (see :func:`~relay.memory.oversized`), a type nobody holds anything of
        forgotten."""
        if oversized(mine.names):
            mine.names = dict(mine.names)
        if not holders:
            del self._holders[type_url]
        elif oversized(holders):
            self._holders[type_url] = dict(holders)

    # -- the holders of a name ------------------------------------------------
    #
    # ``touched`` gets the name whenever the union changes for it: a parameter
    # set gained or lost.

    @staticmethod
    def _reparameterize(regrouping: _Regrouping, holders: dict[str, Subscriber | _Shared],
                        name: str, old: Params, new: Params, touched: list[str]) -> None:
        """A holder of ``name`` now uses ``new`` parameters instead of ``old``."""
        found = holders[name]
        if not isinstance(found, _Shared):
            touched.append(name)  # one set gone, another come
            return
        # (asked first: the group may change)
        if found.counts[old] == 1:
            touched.append(name)  # the last holder with the old parameters
        if new not in found.counts:
            touched.append(name)  # the first with the new
        holders[name] = regrouping.moved(found, old, new)

    def _params_of(self, type_url: str, name: str,
                   found: Subscriber | _Shared) -> frozenset[Params]:
        """The distinct parameter sets the holders of ``name`` use."""
        if isinstance(found, _Shared):
            return frozenset(found.counts)
        params = self._per_subscriber[found][type_url].names[name]
        return _PLAIN if params == EMPTY_PARAMS else frozenset((params,))

    @staticmethod
    def _subscribers(found: Subscriber | _Shared | None) -> Iterable[Subscriber]:
        if found is None:
            return ()
        return found.subscribers if isinstance(found, _Shared) else (found,)

    # -- upstream side ---------------------------------------------------

    def origin_refused(self, type_url: str, names: Iterable[str], message: str) -> int:
        """The origin refused a subscription that carried ``names``: no
        subscriber holds them any more (the union loses them at once, so the
        next origin stream does not carry them), each is told why, and the
        ledger refuses them to new subscriptions for a while. Returns how many
        subscribers were refused."""
        names = list(names)
        if self._demand is not None:
            self._demand.refuse(type_url, names)
        holders = self._holders.get(type_url, {})
        taken: dict[Subscriber, dict[str, Params]] = {}
        for name in names:
            for subscriber in self._subscribers(holders.get(name)):
                held = self._per_subscriber[subscriber][type_url].names
                taken.setdefault(subscriber, {})[name] = held[name]
        for subscriber, removed in taken.items():
            self.apply(subscriber, type_url, InterestChange(removed=removed))
            subscriber.subscription_refused(type_url, frozenset(removed), message)
        return len(taken)

    def wants_wildcard(self, type_url: str) -> bool:
        """Whether any subscriber wants every resource of the type."""
        return bool(self._wildcard.get(type_url))

    def wanted_locators(self, type_url: str) -> dict[str, frozenset[Params]]:
        """Per name, the distinct parameter sets subscribers use for it (a new
        dict, oldest name first): looked up as :meth:`wanted_among` looks
        them up, all at once where one holder holds them all (a big client's
        50,000 names on a new origin stream: a call per name was ~1 us)."""
        names = list(self._holders.get(type_url, {}))
        return dict(zip(names, self.wanted_among(type_url, names), strict=True))

    def wanted_params(self, type_url: str, name: str) -> frozenset[Params]:
        """The distinct parameter sets subscribers use for one name (empty: none wants it)."""
        found = self._holders.get(type_url, {}).get(name)
        return frozenset() if found is None else self._params_of(type_url, name, found)

    def wanted_among(self, type_url: str, names: Collection[str]) -> list[frozenset[Params]]:
        """:meth:`wanted_params` of each of ``names``, in their order. Where one
        holder (a subscriber, or one group of them) holds them all, as a big
        client's names are held, all are looked up at once: no call per name
        (found by identity in one pass; a subscriber whose names all have
        the same parameters, ``alike``, not looked up again)."""
        holders = self._holders.get(type_url, {})
        one = _one_holder(holders, names) if names else ()
        if one:
            first = one[0]
            if first is None:  # (a client's names nobody holds any more: it left)
                return [_NONE] * len(names)
            if isinstance(first, _Shared):
                return [frozenset(first.counts)] * len(names)
            params = self._their_params(self._per_subscriber[first][type_url], names)
            if params is not None:
                return [_PLAIN if params == EMPTY_PARAMS else frozenset((params,))] * len(names)
        return [_NONE if holder is None else self._params_of(type_url, name, holder)
                for name, holder in zip(names, map(holders.get, names), strict=True)]

    def wanted_types(self) -> list[str]:
        """Types with at least one name or wildcard subscription."""
        types = {t for t, names in self._holders.items() if names}
        types |= {t for t, subs in self._wildcard.items() if subs}
        return sorted(types)

    # -- cache side ------------------------------------------------------

    def on_cache_change(self, change: CacheChange) -> None:
        """Tell each affected subscriber which of its names changed."""
        type_url = change.type_url
        if change.became_synced:
            for subscriber, per_type in list(self._per_subscriber.items()):
                if type_url in per_type:
                    subscriber.resources_changed(type_url, change.names, True)
            return
        if change.wildcard_held:  # (they waited for it: see ResourceCache.holds_wildcard)
            for subscriber in list(self._wildcard.get(type_url, ())):
                subscriber.resources_changed(type_url, change.names, True)
        for subscriber, names in self._affected(type_url, change.names):
            subscriber.resources_changed(type_url, names, False)
        for subscriber, names in self._affected(type_url, change.heartbeats):
            subscriber.heartbeats_received(type_url, names)

    def _affected(self, type_url: str, names: frozenset[str]
                  ) -> Iterable[tuple[Subscriber, frozenset[str]]]:
        """Subscribers of any of ``names`` (and wildcard subscribers), with their names."""
        if not names:
            return ()
        holders = self._holders.get(type_url, {})
        wildcard = self._wildcard.get(type_url, set())
        globs = type_url in self._globs
        if len(names) == 1 and not globs:
            # The common case (one resource changed): every subscriber hears
            # of the same set.
            [name] = names
            return [(s, names) for s in wildcard.union(self._subscribers(holders.get(name)))]
        if not globs:
            one = _one_holder(holders, names)
            if one:
                # Many names with one holder (what the origin sent a big
                # client, or its names forgotten once it left): each of the
                # holder's subscribers hears of all of them, in one pass in C,
                # where the loop below took ~0.4 us a name.
                return [*((s, names) for s in self._subscribers(one[0]) if s not in wildcard),
                        *((s, names) for s in wildcard)]
        return self._affected_by_name(holders, wildcard, globs, names)

    def _affected_by_name(self, holders: Mapping[str, Subscriber | _Shared],
                          wildcard: Set[Subscriber], globs: bool, names: frozenset[str]
                          ) -> list[tuple[Subscriber, frozenset[str]]]:
        """:meth:`_affected`, name by name."""
        affected: dict[Subscriber, set[str]] = {}
        for name in names:
            for subscriber in self._subscribers(holders.get(name)):
                if subscriber not in wildcard:
                    affected.setdefault(subscriber, set()).add(name)
            if globs and (glob := collection_of(name)) is not None:
                # a member: the subscribers of its collection hear of it too
                for subscriber in self._subscribers(holders.get(glob)):
                    if subscriber not in wildcard:
                        affected.setdefault(subscriber, set()).add(name)
        return [*((s, frozenset(n)) for s, n in affected.items()),
                *((s, names) for s in wildcard)]
