"""InterestIndex with a DemandLedger: a warm big client's names looked at
once, not twice.

The check of a subscribe looks up the added names' one holder (one pass);
where the ledger counts this index's names alone (``counted_by_one``), how
often the host holds them is told by that holder (``InterestIndex._host_count``:
how many of its subscribers count against the host), else the ledger is asked
(``DemandLedger.held_alike``: one pass); the names are then held by those
answers (``hold_all`` told, ``_add_together`` told) instead of being looked
up again, and a leave's release is told its count too. Here the work is
counted, and random subscribes, leaves and limits are held to the per-name
paths (the index's loop, no count told; the ledger's ``hold`` and
``release`` of each name, counted without ``held_alike``): the same
refusals, with the same messages, the same ledger and the same index.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.constraints import EMPTY_PARAMS, params_of
from relay.demand import DemandLedger
from relay.interest import InterestChange, InterestIndex
from relay.protocol.limits import LimitExceeded
from relay.xds_types import ENDPOINT
from tests.test_interest import Sub, Up

N = 3_000
NAMES = [f"cla-{i:05d}" for i in range(N)]
CANARY = params_of({"env": "canary"})


class Counted(dict[str, Any]):
    """A table that counts its look-ups made by a call each (``map(t.get, ...)``);
    those made in C on the whole set (keys views, ``update``) are not calls.
    ``items`` counts ``t[name]`` apart, ``views`` the keys views asked for
    (a pass over the smaller side of a keys-to-keys comparison)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls = self.items = self.views = 0

    def __getitem__(self, key: str) -> Any:
        self.items += 1
        return super().__getitem__(key)

    def keys(self) -> Any:
        self.views += 1
        return super().keys()

    def get(self, key: str, default: Any = None) -> Any:
        self.calls += 1
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.calls += 1
        return super().__contains__(key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.calls += 1
        super().__setitem__(key, value)


def indexed() -> tuple[InterestIndex, DemandLedger]:
    index, ledger = InterestIndex(), DemandLedger(10**6, 10**6, time.monotonic)
    index.link(Up())
    index.limit_demand(ledger)
    return index, ledger


def test_a_warm_join_looks_its_names_up_once_in_each_table() -> None:
    index, ledger = indexed()
    index.apply(Sub(), ENDPOINT, InterestChange(added=dict.fromkeys(NAMES, EMPTY_PARAMS)), "a")
    table = ledger._held["a"][ENDPOINT] = Counted(ledger._held["a"][ENDPOINT])
    holders = index._holders[ENDPOINT] = Counted(index._holders[ENDPOINT])
    index.apply(Sub(), ENDPOINT, InterestChange(added=dict.fromkeys(NAMES, EMPTY_PARAMS)), "a")
    # none: their one holder (of host a) told the check they are held once,
    # and hold_all was told so; it overwrote the table from pairs
    assert table.calls == 0
    assert ledger.held_by("a", ENDPOINT) == dict.fromkeys(NAMES, 2)
    assert ledger.host_total("a") == N
    # their one holder looked up by the check (the first name once more);
    # _add_together was told; both tables were overwritten whole from pairs
    # (no call per name either)
    assert holders.calls == N + 1
    assert index.upstream_names == N


def test_a_join_in_pieces_reads_neither_subscribers_table() -> None:
    # (the relay applies a request 2,000 names at a time)
    index, _ = indexed()
    first, second = join(index, "a"), Sub()
    theirs = index._per_subscriber[first][ENDPOINT]
    theirs.names = Counted(theirs.names)
    for piece in range(5):
        names = NAMES[piece * N // 5:(piece + 1) * N // 5]
        index.apply(second, ENDPOINT, InterestChange(added=dict.fromkeys(names, EMPTY_PARAMS)),
                    "a")
        mine = index._per_subscriber[second][ENDPOINT]
        if piece == 0:
            mine.names = Counted(mine.names)
    # their parameters known (all alike), not looked up; the second's own
    # names not looked through (their one holder, the first, says it holds none)
    assert (theirs.names.items, mine.names.items, mine.names.views) == (0, 0, 0)
    assert mine.names == dict.fromkeys(NAMES, EMPTY_PARAMS) and mine.alike == EMPTY_PARAMS
    assert index.wanted_among(ENDPOINT, NAMES) == [frozenset({EMPTY_PARAMS})] * N
    assert all(set(index._subscribers(found)) == {first, second}
               for found in index._holders[ENDPOINT].values())


def test_names_with_other_parameters_are_not_known_alike() -> None:
    index, _ = indexed()
    first = join(index, "a", NAMES[:10])
    assert index._per_subscriber[first][ENDPOINT].alike == EMPTY_PARAMS
    index.apply(first, ENDPOINT, InterestChange(added=dict.fromkeys(NAMES[10:20], CANARY)), "a")
    assert index._per_subscriber[first][ENDPOINT].alike is None
    join(index, "b", NAMES[:20])  # (their parameters looked up: two sets)
    assert index.wanted_among(ENDPOINT, NAMES[:20]) == \
        [frozenset({EMPTY_PARAMS})] * 10 + [frozenset({EMPTY_PARAMS, CANARY})] * 10
    other = join(index, "a", NAMES[30:40])
    index.apply(other, ENDPOINT, InterestChange(added=dict.fromkeys(NAMES[35:45], CANARY)), "a")
    assert index._per_subscriber[other][ENDPOINT].alike is None  # (by the loop)


def test_a_warm_leave_overwrites_both_tables_without_a_call_per_name() -> None:
    index, ledger = indexed()
    first, second = Sub(), Sub()
    for sub in (first, second):
        index.apply(sub, ENDPOINT, InterestChange(added=dict.fromkeys(NAMES, EMPTY_PARAMS)), "a")
    table = ledger._held["a"][ENDPOINT] = Counted(ledger._held["a"][ENDPOINT])
    holders = index._holders[ENDPOINT] = Counted(index._holders[ENDPOINT])
    index.remove(second)
    assert (table.calls, holders.calls) == (0, 0)  # (release_all told: two of host a held them)
    assert ledger.held_by("a", ENDPOINT) == dict.fromkeys(NAMES, 1)
    assert set(map(id, holders.values())) == {id(first)} and index.upstream_names == N


def asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the name sets DemandLedger.held_alike is asked about, from now on."""
    sizes: list[int] = []
    held_alike = DemandLedger.held_alike

    def counted(self: DemandLedger, host: str, type_url: str,
                names: Collection[str]) -> int | None:
        sizes.append(len(names))
        return held_alike(self, host, type_url, names)

    monkeypatch.setattr(DemandLedger, "held_alike", counted)
    return sizes


def join(index: InterestIndex, host: str | None, names: list[str] = NAMES) -> Sub:
    sub = Sub()
    index.apply(sub, ENDPOINT, InterestChange(added=dict.fromkeys(names, EMPTY_PARAMS)), host)
    return sub


def test_the_host_counts_of_a_big_client_are_told_by_their_one_holder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    index, ledger = indexed()
    sizes = asked(monkeypatch)
    join(index, "a")  # (nobody holds them: held by none of host a)
    join(index, "b")  # (one subscriber, of host a)
    third = join(index, "a")  # (a group of two, one of host a)
    join(index, None)  # (a host without a share: no count asked)
    assert sizes == []
    assert ledger.held_by("a", ENDPOINT) == dict.fromkeys(NAMES, 2)
    assert ledger.held_by("b", ENDPOINT) == dict.fromkeys(NAMES, 1)
    assert (ledger.host_total("a"), ledger.host_total("b")) == (N, N)
    index.remove(third)  # (told: two of host a held them)
    assert ledger.held_by("a", ENDPOINT) == dict.fromkeys(NAMES, 1)
    # a group of more subscribers than names: the ledger is asked
    join(index, "a", NAMES[:2])
    assert sizes == [2]
    assert ledger.held_by("a", ENDPOINT) == \
        {**dict.fromkeys(NAMES, 1), **dict.fromkeys(NAMES[:2], 2)}


def test_a_ledger_others_count_in_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = asked(monkeypatch)
    # node groups: member ledgers share the host table (a holds them in the first group)
    budget = DemandLedger(10**6, 10**6, time.monotonic)
    first, second = InterestIndex(), InterestIndex()
    for index in (first, second):
        index.limit_demand(budget.member(lambda: 0))
    join(first, "a")
    join(second, "a")
    assert budget.held_by("a", ENDPOINT) == dict.fromkeys(NAMES, 2)
    assert budget.host_total("a") == N
    assert sizes == [N, N]
    # one ledger given to two indexes
    ledger = DemandLedger(10**6, 10**6, time.monotonic)
    first, second = InterestIndex(), InterestIndex()
    first.limit_demand(ledger)
    second.limit_demand(ledger)
    join(first, "a")
    join(second, "a")
    assert ledger.held_by("a", ENDPOINT) == dict.fromkeys(NAMES, 2)
    assert sizes == [N, N, N, N]
    # an index that held names before it was given the ledger (not counted in it)
    late = InterestIndex()
    join(late, "a")
    ledger = DemandLedger(10**6, 10**6, time.monotonic)
    late.limit_demand(ledger)
    join(late, "a")
    assert ledger.held_by("a", ENDPOINT) == dict.fromkeys(NAMES, 1)
    assert sizes == [N, N, N, N, N]


def test_held_alike_says_how_often_all_are_held_or_none() -> None:
    ledger = DemandLedger(10**6, 10**6, time.monotonic)
    assert ledger.held_alike("a", ENDPOINT, ["x", "y"]) == 0  # a host never seen
    ledger.hold_all("a", ENDPOINT, ["x", "y", "z"])
    ledger.hold_all("a", ENDPOINT, ["x", "y"])
    assert ledger.held_alike("a", ENDPOINT, []) == 0
    assert ledger.held_alike("a", ENDPOINT, ["w", "v"]) == 0
    assert ledger.held_alike("a", ENDPOINT, ["z"]) == 1
    assert ledger.held_alike("a", ENDPOINT, ["y", "x"]) == 2
    assert ledger.held_alike("a", ENDPOINT, ["x", "z"]) is None
    assert ledger.held_alike("a", ENDPOINT, ["z", "w"]) is None
    assert ledger.held_alike("a", ENDPOINT, ["w", "z"]) is None


class NameByName(DemandLedger):
    """The ledger's general path: no answer given, each name held by itself."""

    def held_alike(self, host: str, type_url: str, names: Collection[str]) -> int | None:
        return None

    def member(self, upstream_names: Callable[[], int]) -> DemandLedger:
        joined = super().member(upstream_names)
        joined.__class__ = NameByName  # (name by name too)
        return joined

    def hold_all(self, host: str, type_url: str, names: Collection[str],
                 alike: int | None = None) -> None:
        for name in names:
            self.hold(host, type_url, name)

    def release_all(self, host: str, type_url: str, names: Collection[str],
                    alike: int | None = None) -> None:
        for name in names:
            self.release(host, type_url, name)


class Loop(InterestIndex):
    """The index's general path: names added and dropped one by one."""

    def _add_together(self, *args: Any) -> bool:
        return False

    def _drop_together(self, *args: Any) -> bool:
        return False

    def _host_count(self, *args: Any) -> int | None:
        return None  # (the ledger asked: held_alike, whose NameByName says nothing)


POOL = [f"n{i:03d}" for i in range(60)]
# (which subscriber, what: "add"/"remove"/"leave", a slice of POOL, canary or not)
# (slices often alike, with the same parameters, so that clients often hold
# the same names: one group of them, joined and left whole)
step = st.tuples(st.integers(0, 3), st.sampled_from(["add", "add", "remove", "leave"]),
                 st.one_of(st.sampled_from([(0, 30), (30, 60), (0, 60), (10, 40)]),
                           st.tuples(st.integers(0, 60), st.integers(0, 60))),
                 st.sampled_from([False, False, True]))
steps = st.lists(step.map(lambda s: (s[0], s[1], *s[2], s[3])), max_size=12)


def run(index: InterestIndex, ledger: DemandLedger, shared: bool,
        plan: list[tuple[int, str, int, int, bool]]) -> list[Any]:
    """Apply ``plan``; what each step did (refused: how) and all held after it.
    ``shared``: the index's ledger a member of ``ledger`` (node groups), not it."""
    index.link(Up())
    index.limit_demand(ledger.member(lambda: index.upstream_names) if shared else ledger)
    subs = [Sub() for _ in range(4)]
    hosts = ["a", "a", "b", None]  # (the last: a host without a share)
    seen = []
    for who, what, start, stop, canary in plan:
        names = POOL[min(start, stop):max(start, stop)]
        params = CANARY if canary else EMPTY_PARAMS
        if what == "add":
            change = InterestChange(added=dict.fromkeys(names, params))
        elif what == "remove":
            change = InterestChange(removed=dict.fromkeys(names, params))
        else:
            mine = index._per_subscriber.get(subs[who], {}).get(ENDPOINT)
            change = InterestChange(removed={} if mine is None else dict(mine.names))
        try:
            index.apply(subs[who], ENDPOINT, change, hosts[who])
            outcome: object = "taken"
        except LimitExceeded as refused:
            outcome = (refused.limit, str(refused))
        holders = index._holders.get(ENDPOINT, {})
        seen.append((outcome, index.upstream_names, index.wanted_locators(ENDPOINT),
                     [sorted(map(subs.index, index._subscribers(found)))
                      for found in holders.values()],
                     [dict(sorted(ledger.held_by(h, ENDPOINT).items())) for h in "ab"],
                     [ledger.host_total(h) for h in "ab"]))
    return seen


@settings(max_examples=150, deadline=None)
@given(steps, st.integers(1, 70), st.integers(1, 70), st.booleans())
def test_what_the_check_learned_refuses_and_holds_as_the_per_name_path(
        plan: list[tuple[int, str, int, int, bool]], total: int, per_host: int,
        shared: bool) -> None:
    assert run(InterestIndex(), DemandLedger(total, per_host, time.monotonic), shared, plan) == \
        run(Loop(), NameByName(total, per_host, time.monotonic), shared, plan)


# clients joining the same few slices whole, then all leaving: groups joined
# and left whole, where the host counts are told (random plans seldom do so)
joins = st.lists(st.tuples(st.integers(0, 3), st.just("add"),
                           st.sampled_from([(0, 30), (30, 60), (0, 60), (20, 40)]),
                           st.sampled_from([False, False, False, True])),
                 min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(joins, st.permutations(range(4)), st.integers(20, 140), st.integers(20, 70), st.booleans())
def test_groups_joined_and_left_whole_hold_as_the_per_name_path(
        plan: list[tuple[int, str, tuple[int, int], bool]], leaving: list[int], total: int,
        per_host: int, shared: bool) -> None:
    whole = [(who, what, *bounds, canary) for who, what, bounds, canary in plan] + \
        [(who, "leave", 0, 0, False) for who in leaving]
    assert run(InterestIndex(), DemandLedger(total, per_host, time.monotonic), shared, whole) == \
        run(Loop(), NameByName(total, per_host, time.monotonic), shared, whole)
