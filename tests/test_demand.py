"""Upstream demand: the bounds the interest index keeps on what clients make
the relay subscribe upstream (limits.upstream_names, upstream_names_per_host),
and names the origin refused (relay.demand)."""

from __future__ import annotations

import sys

import pytest

from relay.constraints import EMPTY_PARAMS
from relay.demand import ORIGIN_REFUSED, REFUSAL_COOLDOWN, DemandLedger
from relay.interest import InterestChange, InterestIndex
from relay.protocol.limits import LimitExceeded
from relay.xds_types import CLUSTER, ENDPOINT
from tests.allocations import traced
from tests.test_interest import Sub, Up


class Clock:
    def __init__(self) -> None:
        self.time = 100.0

    def now(self) -> float:
        return self.time


def adding(*names: str) -> InterestChange:
    return InterestChange(added=dict.fromkeys(names, EMPTY_PARAMS))


def removing(*names: str) -> InterestChange:
    return InterestChange(removed=dict.fromkeys(names, EMPTY_PARAMS))


def limited_index(total: int, per_host: int) -> tuple[InterestIndex, DemandLedger, Clock]:
    clock = Clock()
    ledger = DemandLedger(total, per_host, clock.now)
    index = InterestIndex()
    index.link(Up())
    index.limit_demand(ledger)
    return index, ledger, clock


def test_names_past_the_upstream_total_are_refused_and_nothing_is_applied() -> None:
    index, _, _ = limited_index(total=4, per_host=100)
    a, b = Sub(), Sub()
    index.apply(a, CLUSTER, adding("x", "y", "z"), "ipv4:10.0.0.1")
    with pytest.raises(LimitExceeded) as refused:
        index.apply(b, ENDPOINT, adding("p", "q"), "ipv4:10.0.0.2")
    assert refused.value.limit == "upstream_names"
    assert str(refused.value) == (
        "subscribing 2 more names would have the relay ask its origin for 5, more than it may "
        "(limits.upstream_names: 4)")
    assert index.upstream_names == 3
    assert index.wanted_locators(ENDPOINT) == {}
    # Names already on the origin stream cost it nothing more.
    index.apply(b, CLUSTER, adding("x", "y", "z", "w"), "ipv4:10.0.0.2")
    assert index.upstream_names == 4


def test_what_a_change_removes_makes_room_for_what_it_adds() -> None:
    index, _, _ = limited_index(total=3, per_host=3)
    a = Sub()
    index.apply(a, CLUSTER, adding("x", "y", "z"), "ipv4:10.0.0.1")
    index.apply(a, CLUSTER, InterestChange(added={"w": EMPTY_PARAMS},
                                           removed={"x": EMPTY_PARAMS}))
    assert sorted(index.wanted_locators(CLUSTER)) == ["w", "y", "z"]


def test_a_host_share_counts_its_distinct_names_across_its_subscribers() -> None:
    index, ledger, _ = limited_index(total=100, per_host=3)
    a, b, other = Sub(), Sub(), Sub()
    host = "ipv4:10.0.0.1"
    index.apply(a, CLUSTER, adding("x", "y"), host)
    index.apply(b, CLUSTER, adding("x", "y", "z"), host)  # x and y: the host has them
    assert ledger.host_total(host) == 3
    with pytest.raises(LimitExceeded) as refused:
        index.apply(b, ENDPOINT, adding("x"), host)  # another type: another name
    assert refused.value.limit == "upstream_names_per_host"
    assert str(refused.value) == (
        "clients at ipv4:10.0.0.1 would hold 4 names, more than one host may "
        "(limits.upstream_names_per_host: 3)")
    # Other hosts have shares of their own; a unix socket's peers (None) none.
    index.apply(other, ENDPOINT, adding("p", "q", "r"), "ipv4:10.0.0.2")
    index.apply(Sub(), ENDPOINT, adding("s", "t", "u", "v"), None)
    # A name one subscriber of the host leaves, another holds: still the host's.
    index.apply(a, CLUSTER, removing("x"))
    assert ledger.host_total(host) == 3
    index.remove(b)
    assert ledger.host_total(host) == 1  # y, held by a
    index.remove(a)
    assert ledger.host_total(host) == 0
    assert not ledger._held.get(host)  # the host's bookkeeping is gone with its names


def test_a_host_that_let_most_of_its_names_go_gives_their_table_back() -> None:
    names = [f"made-up-{i}" for i in range(20_000)]
    ledger = DemandLedger(100_000, 100_000, Clock().now)
    index = InterestIndex()  # no way up: what it is told is not the index's cost
    index.limit_demand(ledger)
    host = "ipv4:10.0.0.1"
    staying, leaving = Sub(), Sub()
    with traced() as held:
        index.apply(staying, CLUSTER, adding(*names[:10]), host)
        index.apply(leaving, CLUSTER, adding(*names), host)
        full = held()
        index.remove(leaving)
        left = held()
    assert ledger.host_total(host) == 10
    assert left < full / 20, (left, full)


def test_names_the_origin_refused_leave_their_subscribers_and_are_refused_a_while() -> None:
    index, ledger, clock = limited_index(total=100, per_host=100)
    a, b, bystander = Sub(), Sub(), Sub()
    index.apply(a, CLUSTER, adding("bad1", "good"), "ipv4:10.0.0.1")
    index.apply(b, CLUSTER, adding("bad2"), "ipv4:10.0.0.2")
    index.apply(bystander, CLUSTER, adding("good"), "ipv4:10.0.0.3")
    assert index.origin_refused(CLUSTER, ["bad1", "bad2"], "too many") == 2
    assert a.refused == [(CLUSTER, frozenset({"bad1"}), "too many")]
    assert b.refused == [(CLUSTER, frozenset({"bad2"}), "too many")]
    assert bystander.refused == []
    assert sorted(index.wanted_locators(CLUSTER)) == ["good"]
    with pytest.raises(LimitExceeded) as refused:
        index.apply(Sub(), CLUSTER, adding("bad2"), "ipv4:10.0.0.4")
    assert refused.value.limit == "origin"
    assert str(refused.value) == (
        "the origin refused the relay's subscription to Cluster 'bad2' lately; not asked "
        f"again for {REFUSAL_COOLDOWN:.0f}s")
    clock.time += REFUSAL_COOLDOWN
    index.apply(Sub(), CLUSTER, adding("bad2"), "ipv4:10.0.0.4")
    assert ledger.refused_count() == 0


def test_the_refused_names_kept_are_bounded() -> None:
    clock = Clock()
    ledger = DemandLedger(10, 10, clock.now, max_refused=3)
    ledger.refuse(CLUSTER, ["a", "b", "c", "d", "e"])
    assert ledger.refused_count() == 3
    ledger.check(None, CLUSTER, 0, 0, 0, ["a", "b"])  # the oldest went first
    with pytest.raises(LimitExceeded):
        ledger.check(None, CLUSTER, 0, 0, 0, ["e"])


def grouped_indexes(total: int, per_host: int, groups: int
                    ) -> tuple[list[InterestIndex], list[DemandLedger], DemandLedger]:
    """``groups`` indexes (node groups'), each with a member ledger of one budget."""
    budget = DemandLedger(total, per_host, Clock().now)
    indexes, members = [], []
    for _ in range(groups):
        index = InterestIndex()
        index.link(Up())
        member = budget.member(lambda index=index: index.upstream_names)  # type: ignore[misc]
        index.limit_demand(member)
        indexes.append(index)
        members.append(member)
    return indexes, members, budget


def test_the_upstream_total_is_one_budget_across_node_groups() -> None:
    (first, second), members, budget = grouped_indexes(total=4, per_host=100, groups=2)
    first.apply(Sub(), CLUSTER, adding("x", "y", "z"), "ipv4:10.0.0.1")
    # the same name in another group is another name on another origin stream
    second.apply(Sub(), CLUSTER, adding("x"), "ipv4:10.0.0.2")
    with pytest.raises(LimitExceeded) as refused:
        second.apply(Sub(), CLUSTER, adding("w"), "ipv4:10.0.0.2")
    assert refused.value.limit == "upstream_names"
    assert str(refused.value) == (
        "subscribing 1 more names would have the relay ask its origins, all node groups "
        "together, for 5, more than it may (limits.upstream_names: 4)")
    assert (first.upstream_names, second.upstream_names) == (3, 1)
    # a group gone (closed) counts no more
    assert budget.members() == 2
    members[0].leave()
    assert budget.members() == 1
    second.apply(Sub(), CLUSTER, adding("w", "v", "u"), "ipv4:10.0.0.2")
    assert second.upstream_names == 4


def test_a_hosts_share_counts_its_names_in_every_node_group() -> None:
    (first, second), _, _ = grouped_indexes(total=100, per_host=3, groups=2)
    first.apply(Sub(), CLUSTER, adding("a", "b"), "ipv4:10.0.0.1")
    with pytest.raises(LimitExceeded) as refused:
        second.apply(Sub(), ENDPOINT, adding("c", "d"), "ipv4:10.0.0.1")
    assert refused.value.limit == "upstream_names_per_host"
    assert str(refused.value) == (
        "clients at ipv4:10.0.0.1 would hold 4 names, more than one host may "
        "(limits.upstream_names_per_host: 3)")
    second.apply(Sub(), ENDPOINT, adding("c"), "ipv4:10.0.0.1")
    second.apply(Sub(), ENDPOINT, adding("c", "d"), "ipv4:10.0.0.2")  # another host's share


def test_origin_refusals_stay_with_their_node_group() -> None:
    (first, second), members, _ = grouped_indexes(total=100, per_host=100, groups=2)
    members[0].refuse(CLUSTER, ["x"])
    with pytest.raises(LimitExceeded) as refused:
        first.apply(Sub(), CLUSTER, adding("x"), "ipv4:10.0.0.1")
    assert refused.value.limit == ORIGIN_REFUSED
    second.apply(Sub(), CLUSTER, adding("x"), "ipv4:10.0.0.1")
    assert second.upstream_names == 1


def test_release_all_leaves_what_release_leaves_name_by_name() -> None:
    """Per count together (all ones, all twos, mixed, some not held), as
    :meth:`DemandLedger.release` one name at a time leaves it."""
    names = [f"n{i}" for i in range(300)]
    cases = [names, names[:100], [*names[50:250], "never-held"], ["never-held"], [], names]
    one, together = (DemandLedger(10**6, 10**6, Clock().now) for _ in range(2))
    for ledger in (one, together):
        ledger.hold_all("h", ENDPOINT, names)
        ledger.hold_all("h", ENDPOINT, names[:200])
        ledger.hold_all("h", ENDPOINT, names[100:150])
        ledger.hold("other", ENDPOINT, "x")
    for released in cases:
        for name in released:
            one.release("h", ENDPOINT, name)
        together.release_all("h", ENDPOINT, released)
        assert together.held_by("h", ENDPOINT) == one.held_by("h", ENDPOINT)
        assert together.host_total("h") == one.host_total("h")
    # the host held nothing more: forgotten; another host untouched
    assert together._held.keys() == one._held.keys() == {"other"}
    assert together.host_total("other") == 1
    together.release_all("gone", ENDPOINT, names)  # a host never seen: nothing


def test_a_host_releasing_most_of_its_names_together_gives_their_table_back() -> None:
    names = [f"n{i}" for i in range(20_000)]
    ledger = DemandLedger(10**6, 10**6, Clock().now)
    ledger.hold_all("h", ENDPOINT, names)
    ledger.hold_all("h", CLUSTER, ["c"])
    ledger.release_all("h", ENDPOINT, names[10:])
    table = ledger.held_by("h", ENDPOINT)
    assert table == dict.fromkeys(names[:10], 1) and ledger.host_total("h") == 11
    assert sys.getsizeof(table) < 1_000  # copied to its size: the 20,000 slots gone
    ledger.release_all("h", ENDPOINT, names[:10])
    assert ledger.held_by("h", ENDPOINT) == {} and ledger.host_total("h") == 1


def test_hold_all_of_names_held_as_often_counts_each_once_more() -> None:
    one, together = (DemandLedger(10**6, 10**6, Clock().now) for _ in range(2))
    for ledger in (one, together):
        ledger.hold_all("h", ENDPOINT, ["a", "b", "c"])
    for name in ["a", "b", "c"]:
        one.hold("h", ENDPOINT, name)
    together.hold_all("h", ENDPOINT, ["a", "b", "c"])  # all held once: all twice now
    assert together.held_by("h", ENDPOINT) == one.held_by("h", ENDPOINT) == \
        {"a": 2, "b": 2, "c": 2}
    assert together.host_total("h") == one.host_total("h") == 3


def test_names_held_already_are_not_checked_again_name_by_name() -> None:
    """A client joining names others hold: only names nobody holds are
    checked against the routes (the origin's refusals too), none here."""
    checked: list[str] = []

    def routes(name: str) -> str | None:
        checked.append(name)
        return None

    index = InterestIndex()
    index.limit_demand(DemandLedger(10**6, 10**6, Clock().now, routes=routes))
    names = [f"n{i}" for i in range(1_000)]
    index.apply(Sub(), ENDPOINT, adding(*names), "h")
    assert len(checked) == 1_000
    index.apply(Sub(), ENDPOINT, adding(*names), "h2")
    index.apply(Sub(), ENDPOINT, adding(*names[:10], "new"), "h")
    assert checked[1_000:] == ["new"]
