"""Upstream demand: the names clients make the relay subscribe on its origin
stream, and the bounds on them.

Every name a client subscribes to that no other client holds becomes a name
on the relay's one origin stream. Unbounded, a few clients asking for made-up
names can push that stream past what the origin accepts, and an origin that
refuses it cuts the whole zone off (issue 22). So, before the interest index
takes a subscription, :class:`DemandLedger` checks it against

* ``limits.upstream_names``: the names on the origin stream, all types;
* ``limits.upstream_names_per_host``: the distinct names one client host's
  streams and polls hold (its share);
* the names the origin itself refused lately (see :meth:`DemandLedger.refuse`).

With node groups each group has an interest index and origin streams of its
own; their ledgers are :meth:`DemandLedger.member` ledgers of one ledger of
the relay's, so that both bounds hold across all groups (one budget): the
names on all groups' origin streams together, and a host's names whatever
groups its clients are in. Refusals by the origin stay each group's own, as
the stream the origin refused was.

A request that would pass a bound is refused whole (:class:`LimitExceeded`,
RESOURCE_EXHAUSTED naming the key) before anything of it is applied: the
origin never sees it. The ledger does no I/O and knows nothing of streams.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Mapping
from itertools import repeat
from operator import countOf

from relay.memory import oversized
from relay.protocol.limits import ORIGIN_REFUSED, LimitExceeded, shown
from relay.protocol.outcome import ProtocolError
from relay.xds_types import short_name

__all__ = ["ORIGIN_REFUSED", "REFUSAL_COOLDOWN", "DemandLedger"]

_NONE: Mapping[str, int] = {}  # never added to

#: How long names the origin refused stay refused to clients, in seconds: long
#: enough that a client reconnecting in a loop cannot put them back on the
#: origin stream at once, short enough that an origin raising its limit is
#: soon followed.
REFUSAL_COOLDOWN = 60.0


class DemandLedger:
    """What each client host holds, and the bounds a new subscription must keep.

    ``per_host`` counts, per host and type, how many of the host's
    subscribers hold each name: a name held by ten streams of one host costs
    that host one name, as it costs the origin one.
    """

    def __init__(self, upstream_names: int, upstream_names_per_host: int,
                 now: Callable[[], float], max_refused: int | None = None,
                 routes: Callable[[str], str | None] | None = None) -> None:
        self.upstream_names = upstream_names
        # why no origin serves a name (None: one does); see Routes.refusal
        self._routes = routes
        self.upstream_names_per_host = upstream_names_per_host
        self._now = now
        # host -> type URL -> name -> how many of the host's subscribers hold it
        self._held: dict[str, dict[str, dict[str, int]]] = {}
        self._host_totals: dict[str, int] = {}
        # (type URL, name) -> until when the origin's refusal holds, oldest first;
        # bounded, so that a refusal of millions of names costs no more than this
        self._refused: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._max_refused = max_refused if max_refused is not None else upstream_names
        # the members sharing this ledger's budget, each with how many names its
        # index holds upstream (empty: a ledger of one index, which says so itself)
        self._members: dict[DemandLedger, Callable[[], int]] = {}
        self._budget: DemandLedger = self
        # how many indexes limit their demand by this ledger, and whether its
        # host table is (or was) shared with member ledgers: see counted_by_one
        self._indexes = 0
        self._shared = False

    def member(self, upstream_names: Callable[[], int]) -> DemandLedger:
        """A ledger for one more interest index whose names go upstream (a node
        group's), sharing this ledger's budget: ``limits.upstream_names`` counts
        the names of every member's index (``upstream_names()``: one index's),
        and a host's share counts its names in every member. Each member keeps
        its own origin refusals. :meth:`leave` when its index is gone."""
        budget = self._budget
        joined = DemandLedger(budget.upstream_names, budget.upstream_names_per_host, budget._now,
                              budget._max_refused, budget._routes)
        joined._held, joined._host_totals = budget._held, budget._host_totals
        joined._budget = budget
        joined._shared = budget._shared = True  # (for good: the table holds others' names)
        budget._members[joined] = upstream_names
        return joined

    def leave(self) -> None:
        """This member's index is gone (its group closed): its names count no more."""
        self._budget._members.pop(self, None)

    def members(self) -> int:
        """How many member ledgers share this ledger's budget."""
        return len(self._budget._members)

    def _upstream_total(self, own: int) -> int:
        """The names upstream that ``limits.upstream_names`` bounds: ``own`` (the
        asking index's), or every member's together."""
        members = self._budget._members
        if self not in members:
            return own
        # O(groups) per subscription adding names; an addition per group's
        # index would need the index to report every change here
        return sum(count() for count in list(members.values()))

    def attach(self) -> None:
        """One more interest index limits its demand by this ledger (see
        :meth:`~relay.interest.InterestIndex.limit_demand`)."""
        self._indexes += 1

    def counted_by_one(self) -> bool:
        """Whether one index alone holds and releases names in this ledger
        (attached to one, never sharing its host table with member ledgers):
        how often a host holds a name is then how many of the name's holders
        in that index count against the host, which the index may tell
        :meth:`hold_all` and :meth:`release_all` (their ``alike``) instead of
        their counting it name by name."""
        return self._indexes == 1 and not self._shared

    def host_total(self, host: str) -> int:
        """The distinct names (all types) ``host`` holds."""
        return self._host_totals.get(host, 0)

    def holds(self, host: str, type_url: str, name: str) -> bool:
        """Whether some subscriber of ``host`` holds ``name``."""
        return name in self._held.get(host, {}).get(type_url, {})

    def held_by(self, host: str, type_url: str) -> Mapping[str, int]:
        """The names of ``type_url`` some subscriber of ``host`` holds, each
        with how many do (read only: :meth:`holds` for a request's many names
        at once)."""
        return self._held.get(host, {}).get(type_url, _NONE)

    def held_count(self, host: str, type_url: str, name: str) -> int:
        """How many subscribers of ``host`` hold ``name``."""
        return self._held.get(host, {}).get(type_url, {}).get(name, 0)

    def check(self, host: str | None, type_url: str, upstream_total: int,
              new_upstream: int, new_for_host: int, added: Iterable[str]) -> None:
        """Raise :class:`LimitExceeded` if a subscription adding ``new_upstream``
        names to the origin stream (which holds ``upstream_total``) and
        ``new_for_host`` to ``host``'s share (None: a host without a share, a
        unix socket's) may not be taken; ``added`` are its names nobody holds
        yet, checked against the routes and the origin's recent refusals."""
        if new_upstream:
            grouped = self in self._budget._members
            upstream_total = self._upstream_total(upstream_total)
            if upstream_total + new_upstream > self.upstream_names:
                asked = "its origins, all node groups together," if grouped else "its origin"
                raise LimitExceeded(
                    "upstream_names",
                    f"subscribing {new_upstream} more names would have the relay ask {asked} "
                    f"for {upstream_total + new_upstream}, more than it may "
                    f"(limits.upstream_names: {self.upstream_names})")
        if host is not None and new_for_host:
            held = self.host_total(host)
            if held + new_for_host > self.upstream_names_per_host:
                raise LimitExceeded(
                    "upstream_names_per_host",
                    f"clients at {shown(host, 64)} would hold {held + new_for_host} names, "
                    f"more than one host may (limits.upstream_names_per_host: "
                    f"{self.upstream_names_per_host})")
        if self._routes is not None:
            added = list(added)
            for name in added:
                why = self._routes(name)
                if why is not None:
                    raise ProtocolError(why)
        if self._refused:
            self._forget_lapsed()
            for name in added:
                if (type_url, name) in self._refused:
                    raise LimitExceeded(
                        ORIGIN_REFUSED,
                        f"the origin refused the relay's subscription to "
                        f"{short_name(type_url)} {shown(name, 200)!r} lately; not asked "
                        f"again for {REFUSAL_COOLDOWN:.0f}s")

    def hold(self, host: str, type_url: str, name: str) -> None:
        """One more subscriber of ``host`` holds ``name``."""
        names = self._held.setdefault(host, {}).setdefault(type_url, {})
        count = names.get(name, 0)
        names[name] = count + 1
        if not count:
            self._host_totals[host] = self._host_totals.get(host, 0) + 1

    def held_alike(self, host: str, type_url: str, names: Collection[str]) -> int | None:
        """How many of ``host``'s subscribers hold each of ``names``, where
        they are all held as often (0: none is held), else None: one pass in
        C. A big client's names nearly always are (new to the host, or held
        by the host's one other client of them); :meth:`hold_all` may be
        given the answer, so that the names are looked at once, not twice."""
        if not names:
            return 0
        held = self._held.get(host, {}).get(type_url, _NONE)
        first = held.get(next(iter(names)))
        if countOf(map(held.get, names), first) != len(names):
            return None
        return 0 if first is None else first

    def hold_all(self, host: str, type_url: str, names: Collection[str],
                 alike: int | None = None) -> None:
        """:meth:`hold` each of ``names`` (distinct): the names new to the
        host (a big client's, nearly all) added together, with no call or
        lookup per name. ``alike``: what :meth:`held_alike` said of these
        names (or of more), nothing held or let go since (not counted again)."""
        if not names:
            return
        held = self._held.setdefault(host, {}).setdefault(type_url, {})
        if alike is None:
            alike = self.held_alike(host, type_url, names)
        if alike is not None:
            # the common cases: all new to the host, or all held as often
            if alike:  # (there already: overwritten from pairs, no table of them made)
                held.update(zip(names, repeat(alike + 1)))
                return
            held.update(dict.fromkeys(names, 1))
            self._host_totals[host] = self._host_totals.get(host, 0) + len(names)
            return
        again = held.keys() & names
        counts = {name: held[name] + 1 for name in again} if again else None
        held.update(dict.fromkeys(names, 1))
        if counts:
            held.update(counts)
        if len(names) > len(again):
            self._host_totals[host] = self._host_totals.get(host, 0) + len(names) - len(again)

    def release(self, host: str, type_url: str, name: str) -> None:
        """One subscriber of ``host`` fewer holds ``name``."""
        names = self._held.get(host, {}).get(type_url, {})
        count = names.get(name, 0)
        if count > 1:
            names[name] = count - 1
        elif count:
            del names[name]
            self._let_go(host, type_url, 1)

    def release_all(self, host: str, type_url: str, names: Collection[str],
                    alike: int | None = None) -> None:
        """:meth:`release` each of ``names`` (distinct): a subscriber's names
        let go together (a client leaving), by how many of the host's
        subscribers held each (nearly always one count for all: the host's
        last holder of them, or each the same few), a few operations on the
        whole set per count, with no call per name. ``alike``: how many held
        each of them, all as many (see :meth:`counted_by_one`), not counted
        again."""
        held = self._held.get(host, {}).get(type_url)
        if held is None or not names:
            return
        first = held.get(next(iter(names)), 0) if alike is None else alike
        by_count: Mapping[int, Collection[str]]
        if alike is not None or countOf(map(held.get, names), first) == len(names):
            by_count = {first: names}  # (the common case: no list made)
        else:
            grouped: dict[int, list[str]] = {}
            for name, count in zip(names, map(held.get, names), strict=True):
                if count:
                    grouped.setdefault(count, []).append(name)
            by_count = grouped
        gone = 0
        for count, some in by_count.items():
            if count == 1:
                deque(map(held.__delitem__, some), maxlen=0)  # (in C: no loop here)
                gone = len(some)
            elif count:
                held.update(zip(some, repeat(count - 1)))  # (as in hold_all)
        if gone:
            self._let_go(host, type_url, gone)

    def _let_go(self, host: str, type_url: str, gone: int) -> None:
        """``gone`` names of ``type_url`` no subscriber of ``host`` holds any more
        were taken out: the host's total follows, and what the host holds
        shrinks or is forgotten (its memory comes back)."""
        total = self._host_totals[host] - gone
        per_type = self._held[host]
        if total:
            self._host_totals[host] = total
            names = per_type[type_url]
            if not names:
                del per_type[type_url]
            elif oversized(names):  # most of what the host held went
                per_type[type_url] = dict(names)
            return
        # the host holds nothing more: forget it
        del self._host_totals[host]
        del self._held[host]

    def refuse(self, type_url: str, names: Iterable[str]) -> None:
        """The origin refused a subscription to ``names``: refuse them to
        clients for :data:`REFUSAL_COOLDOWN` seconds."""
        until = self._now() + REFUSAL_COOLDOWN
        for name in names:
            key = (type_url, name)
            self._refused.pop(key, None)
            self._refused[key] = until
        while len(self._refused) > self._max_refused:
            self._refused.popitem(last=False)

    def refused_count(self) -> int:
        """Names the origin refused whose refusal still holds."""
        self._forget_lapsed()
        return len(self._refused)

    def _forget_lapsed(self) -> None:
        now = self._now()
        while self._refused:
            key, until = next(iter(self._refused.items()))
            if until > now:
                return
            del self._refused[key]
