"""InterestIndex: fan-out of cache changes and the union kept for the upstream."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from relay.cache import CacheChange
from relay.constraints import EMPTY_PARAMS, params_of
from relay.interest import Interest, InterestChange, InterestIndex
from relay.xds_types import CLUSTER, ENDPOINT
from tests.allocations import traced


@dataclass(eq=False)
class Sub:
    seen: list[tuple[str, frozenset[str], bool]] = field(default_factory=list)
    beats: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    refused: list[tuple[str, frozenset[str], str]] = field(default_factory=list)

    def __hash__(self) -> int:
        return id(self)

    def resources_changed(self, type_url: str, names: frozenset[str], everything: bool) -> None:
        self.seen.append((type_url, names, everything))

    def heartbeats_received(self, type_url: str, names: frozenset[str]) -> None:
        self.beats.append((type_url, names))

    def subscription_refused(self, type_url: str, names: frozenset[str], message: str) -> None:
        self.refused.append((type_url, names, message))


@dataclass
class Up:
    """What reached the upstream side through the index's one way up."""

    interest: list[str] = field(default_factory=list)
    # the names each interest change was for
    names: list[list[str]] = field(default_factory=list)
    refetches: list[tuple[str, frozenset[str]]] = field(default_factory=list)

    def interest_changed(self, type_url: str, names: Iterable[str]) -> None:
        self.interest.append(type_url)
        self.names.append(sorted(names))

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        self.refetches.append((type_url, names))


def interest(*names: str, wildcard: bool = False) -> Interest:
    return Interest(frozenset(names), wildcard)


def union(index: InterestIndex, type_url: str) -> Interest:
    """What the upstream reads of the index: every name wanted, and the wildcard."""
    return Interest(frozenset(index.wanted_locators(type_url)), index.wants_wildcard(type_url))


def test_union_and_interest_events() -> None:
    index = InterestIndex()
    up = Up()
    index.link(up)
    events = up.interest
    a, b = Sub(), Sub()
    index.update(a, ENDPOINT, interest("x", "y"))
    index.update(b, ENDPOINT, interest("y"))
    assert union(index, ENDPOINT) == interest("x", "y")
    assert events == [ENDPOINT]  # b added nothing new to the union
    index.update(a, ENDPOINT, interest("y"))
    assert union(index, ENDPOINT) == interest("y") and events == [ENDPOINT, ENDPOINT]
    index.remove(b)
    assert len(events) == 2  # a still wants y
    index.remove(a)
    assert union(index, ENDPOINT) == interest() and len(events) == 3
    assert index.wanted_types() == []
    # Each change names only what entered or left the union.
    assert up.names == [["x", "y"], ["x"], ["y"]]


def test_wildcard_union() -> None:
    index = InterestIndex()
    up = Up()
    index.link(up)
    events = up.interest
    a, b = Sub(), Sub()
    index.update(a, CLUSTER, interest(wildcard=True))
    index.update(b, CLUSTER, interest(wildcard=True))
    assert union(index, CLUSTER) == interest(wildcard=True) and events == [CLUSTER]
    index.remove(a)
    assert events == [CLUSTER]
    index.remove(b)
    assert union(index, CLUSTER) == interest() and events == [CLUSTER, CLUSTER]


def test_change_reaches_only_subscribers_of_the_name_and_wildcards() -> None:
    index = InterestIndex()
    on_x, on_y, everything, other_type = Sub(), Sub(), Sub(), Sub()
    index.update(on_x, CLUSTER, interest("x"))
    index.update(on_y, CLUSTER, interest("y"))
    index.update(everything, CLUSTER, interest(wildcard=True))
    index.update(other_type, ENDPOINT, interest("x"))
    index.on_cache_change(CacheChange(CLUSTER, frozenset({"x"})))
    assert on_x.seen == [(CLUSTER, frozenset({"x"}), False)]
    assert on_y.seen == [] and other_type.seen == []
    assert everything.seen == [(CLUSTER, frozenset({"x"}), False)]


def test_sync_reaches_every_subscriber_of_the_type() -> None:
    index = InterestIndex()
    named, idle = Sub(), Sub()
    index.update(named, CLUSTER, interest("x"))
    index.update(idle, CLUSTER, interest())
    index.on_cache_change(CacheChange(CLUSTER, frozenset(), True))
    assert named.seen == [(CLUSTER, frozenset(), True)]
    assert idle.seen == [(CLUSTER, frozenset(), True)]


def test_a_refetch_goes_up_and_nothing_else_does() -> None:
    index = InterestIndex()
    up = Up()
    index.link(up)
    index.request_refetch(ENDPOINT, frozenset({"x"}))
    assert up.refetches == [(ENDPOINT, frozenset({"x"}))] and up.interest == []


def test_heartbeats_reach_subscribers_of_those_names_and_wildcards_only() -> None:
    index = InterestIndex()
    on_x, on_y, everything = Sub(), Sub(), Sub()
    index.update(on_x, CLUSTER, interest("x"))
    index.update(on_y, CLUSTER, interest("y"))
    index.update(everything, CLUSTER, interest(wildcard=True))
    index.on_cache_change(CacheChange(CLUSTER, frozenset(), heartbeats=frozenset({"x"})))
    assert on_x.beats == [(CLUSTER, frozenset({"x"}))]
    assert everything.beats == [(CLUSTER, frozenset({"x"}))]
    assert on_y.beats == [] and on_x.seen == on_y.seen == everything.seen == []


def test_locators_and_the_union_of_parameters() -> None:
    index = InterestIndex()
    a, b = Sub(), Sub()
    canary, prod = params_of({"env": "canary"}), params_of({"env": "prod"})
    index.update(a, CLUSTER, Interest(frozenset({"c", "d"}), params=frozenset({("c", canary)})))
    index.update(b, CLUSTER, Interest(frozenset({"c"}), params=frozenset({("c", prod)})))
    assert Interest(frozenset({"c", "d"}), params=frozenset({("c", canary)})).by_name() == \
        {"c": canary, "d": EMPTY_PARAMS}
    assert index.wanted_locators(CLUSTER) == {"c": frozenset({canary, prod}),
                                              "d": frozenset({EMPTY_PARAMS})}
    assert not index.wants_wildcard(CLUSTER)


def test_a_subscriber_can_be_forgotten_a_slice_at_a_time() -> None:
    index = InterestIndex()
    up = Up()
    index.link(up)
    leaving, staying = Sub(), Sub()
    index.update(leaving, ENDPOINT, interest(*(f"n{i}" for i in range(5))))
    index.update(leaving, CLUSTER, interest("c"))
    index.update(staying, ENDPOINT, interest("m"))
    assert not index.remove(leaving, limit=3)
    assert len(index.wanted_locators(ENDPOINT)) == 3  # m (staying's) and two left
    assert index.remove(leaving, limit=3)  # the last two names, and the cluster
    assert index.wanted_locators(ENDPOINT) == {"m": frozenset({EMPTY_PARAMS})}
    assert index.wanted_types() == [ENDPOINT]
    assert index.remove(leaving)  # nothing left: done at once


def test_new_parameters_for_a_name_replace_the_old_even_if_not_said_removed() -> None:
    index = InterestIndex()
    sub = Sub()
    canary, prod = params_of({"env": "canary"}), params_of({"env": "prod"})
    index.apply(sub, CLUSTER, InterestChange(added={"c": canary}))
    index.apply(sub, CLUSTER, InterestChange(added={"c": prod}))
    assert index.wanted_locators(CLUSTER) == {"c": frozenset({prod})}
    assert index.remove(sub) and index.wanted_types() == []


def test_a_name_held_by_one_subscriber_costs_the_index_no_object_of_its_own() -> None:
    names = dict.fromkeys((f"made-up-{i}" for i in range(10_000)), EMPTY_PARAMS)
    index = InterestIndex()
    sub = Sub()
    with traced() as held:
        index.apply(sub, ENDPOINT, InterestChange(added=names))
        per_name = held() / len(names)
    # Slots in two tables; a set of holders and a count per name took 520 bytes.
    assert per_name < 150, per_name
    assert index.upstream_names == len(names)
    assert index.wanted_params(ENDPOINT, "made-up-7") == frozenset({EMPTY_PARAMS})


def test_a_name_several_hold_goes_back_to_one_holder_as_they_leave() -> None:
    index = InterestIndex()
    up = Up()
    index.link(up)
    canary, prod = params_of({"env": "canary"}), params_of({"env": "prod"})
    a, b, c = Sub(), Sub(), Sub()
    index.apply(a, CLUSTER, InterestChange(added={"x": canary}))
    index.apply(b, CLUSTER, InterestChange(added={"x": prod}))
    index.apply(c, CLUSTER, InterestChange(added={"x": canary}))
    assert index.wanted_locators(CLUSTER) == {"x": frozenset({canary, prod})}
    index.on_cache_change(CacheChange(CLUSTER, frozenset({"x"})))
    assert [len(s.seen) for s in (a, b, c)] == [1, 1, 1]
    index.remove(b)
    assert index.wanted_params(CLUSTER, "x") == frozenset({canary})
    index.apply(c, CLUSTER, InterestChange(removed={"x": canary}, added={"x": prod}))
    assert index.wanted_params(CLUSTER, "x") == frozenset({canary, prod})
    index.remove(a)
    assert index.wanted_params(CLUSTER, "x") == frozenset({prod})  # c alone holds it
    index.apply(c, CLUSTER, InterestChange(added={"x": EMPTY_PARAMS}))
    assert index.wanted_params(CLUSTER, "x") == frozenset({EMPTY_PARAMS})
    index.on_cache_change(CacheChange(CLUSTER, frozenset({"x"})))
    assert [len(s.seen) for s in (a, b, c)] == [1, 1, 2]
    assert index.upstream_names == 1
    index.remove(c)
    assert index.wanted_types() == [] and index.upstream_names == 0
    # Each change named x only when a parameter set entered or left the union.
    assert up.names == [["x"], ["x"], ["x"], ["x"], ["x"], ["x"], ["x"]]


def test_names_held_counts_every_type() -> None:
    index = InterestIndex()
    sub = Sub()
    index.update(sub, ENDPOINT, interest("a", "b"))
    index.update(sub, CLUSTER, interest("c", wildcard=True))
    assert index.names_held(sub) == 3 and index.names_held(Sub()) == 0


def test_a_subscriber_that_leaves_gives_back_the_tables_it_filled() -> None:
    names = [f"made-up-{i}" for i in range(20_000)]
    index = InterestIndex()
    staying, leaving = Sub(), Sub()
    with traced() as held:
        index.update(staying, ENDPOINT, interest(*names[:10]))
        index.update(leaving, ENDPOINT, interest(*names))
        full = held()
        index.remove(leaving)
        left = held()
    # Dicts do not shrink as entries go: the tables are copied once most are gone.
    assert left < full / 20, (left, full)
    assert len(index.wanted_locators(ENDPOINT)) == 10
