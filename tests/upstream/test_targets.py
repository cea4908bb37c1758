"""What the upstream subscribes, on its own: lingering and its deadlines, without I/O."""

from __future__ import annotations

import random
import sys

from relay.cache import ABSENT, ResourceCache, Update
from relay.constraints import EMPTY_PARAMS, params_of
from relay.interest import Interest, InterestIndex
from relay.upstream.deadlines import Deadlines, LingerEnds, WildcardLingerEnds
from relay.upstream.targets import TOGETHER, Lingering, Targets
from relay.xds_types import CLUSTER, ENDPOINT
from tests.allocations import traced
from tests.upstream.test_upstream_state import Sub

CANARY = params_of({"env": "canary"})


def test_names_let_go_together_are_one_batch_with_one_deadline() -> None:
    deadlines = Deadlines()
    lingering = Lingering(deadlines)
    lingering.start(ENDPOINT, 0.0, 30.0, [f"e{i}" for i in range(1000)])
    lingering.start(ENDPOINT, 0.0, 30.0, ["f"], [("g", CANARY)])  # the same moment: joined
    assert len(deadlines) == 1 and lingering.count() == 1002
    assert deadlines.next(lingering.stands) == 30.0


def test_a_linger_deadline_stands_until_its_batch_is_due() -> None:
    deadlines = Deadlines()
    lingering = Lingering(deadlines)
    lingering.start(ENDPOINT, 0.0, 30.0, ["a"])
    lingering.start(ENDPOINT, 1.0, 31.0, [], [("b", CANARY)])
    assert lingering.stands(LingerEnds(ENDPOINT, 30.0))
    assert lingering.due(30.0) == [(ENDPOINT, ["a"])]
    assert not lingering.stands(LingerEnds(ENDPOINT, 30.0))
    assert deadlines.next(lingering.stands) == 31.0
    assert lingering.due(31.0) == [(ENDPOINT, ["b"])]
    assert deadlines.next(lingering.stands) is None
    assert lingering.types() == set() and lingering.count() == 0


def test_what_lingers_is_due_once_its_time_is_up_and_taken_by_the_sync_of_its_names() -> None:
    deadlines = Deadlines()
    lingering = Lingering(deadlines)
    lingering.start(ENDPOINT, 0.0, 10.0, ["a"])
    lingering.start(ENDPOINT, 10.0, 20.0, ["b"], [("c", CANARY)])
    lingering.start_wildcard(CLUSTER, 20.0)
    assert lingering.due(9.0) == []
    assert lingering.due(10.0) == [(ENDPOINT, ["a"])]
    assert sorted(lingering.entries(ENDPOINT)) == [("b", EMPTY_PARAMS), ("c", CANARY)]
    assert lingering.due(20.0) == [(CLUSTER, []), (ENDPOINT, ["b", "c"])]
    assert lingering.wildcard_lingers(CLUSTER, 19.0)
    assert lingering.stands(WildcardLingerEnds(CLUSTER, 20.0))
    ending = lingering.take_ending(ENDPOINT, 20.0, ["a", "c"])
    assert ending.params("a") == {EMPTY_PARAMS} and ending.params("c") == {CANARY}
    assert ending.params("b") == set()
    assert lingering.take_ending(ENDPOINT, 20.0, None).params("b") == {EMPTY_PARAMS}
    assert not lingering.take_ending(ENDPOINT, 20.0, None)
    lingering.take_ending(CLUSTER, 20.0, None)
    assert not lingering.stands(WildcardLingerEnds(CLUSTER, 20.0))


def test_a_name_let_go_again_lingers_from_the_later_time() -> None:
    lingering = Lingering(Deadlines())
    lingering.start(ENDPOINT, 0.0, 30.0, ["a", "b"])
    lingering.start(ENDPOINT, 20.0, 50.0, ["a"])  # wanted again in between, then let go
    assert lingering.due(30.0) == [(ENDPOINT, ["b"])]
    assert lingering.due(50.0) == [(ENDPOINT, ["a"])]


def test_past_the_bound_the_oldest_stop_lingering_at_once() -> None:
    deadlines = Deadlines()
    lingering = Lingering(deadlines, limit=3)
    lingering.start(ENDPOINT, 0.0, 30.0, ["a", "b"])
    lingering.start(CLUSTER, 1.0, 31.0, ["c"])
    assert lingering.count() == 3 and deadlines.next(lingering.stands) == 30.0
    lingering.start(ENDPOINT, 2.0, 32.0, ["d", "e"])
    assert lingering.count() == 3
    assert deadlines.next(lingering.stands) == 2.0  # a and b: now
    assert lingering.due(2.0) == [(ENDPOINT, ["a", "b"])]
    assert sorted(lingering.entries(ENDPOINT)) == [("d", EMPTY_PARAMS), ("e", EMPTY_PARAMS)]
    lingering.start(ENDPOINT, 3.0, 33.0, ["f"])  # c is the oldest now, of another type
    assert lingering.due(3.0) == [(CLUSTER, ["c"])]
    assert lingering.count() == 3 and lingering.types() == {ENDPOINT}


def test_past_the_bound_the_oldest_departure_is_cut_first_and_each_batch_keeps_its_time(
        ) -> None:
    b, c, d, e = (f"made-up-{letter}" for letter in "bcde")
    deadlines = Deadlines()
    lingering = Lingering(deadlines, limit=3, together=2.0)
    lingering.start(ENDPOINT, 0.0, 30.0, ["a"])  # a departure of its own
    lingering.start(ENDPOINT, 5.0, 35.0, [b, c])  # a client leaving, learnt in slices
    lingering.start(ENDPOINT, 6.5, 36.5, [d])  # within 2 s: the same departure
    assert lingering.due(6.5) == [(ENDPOINT, ["a"])]  # the oldest departure, whole
    lingering.start(ENDPOINT, 8.0, 38.0, [e])
    [(_, [lowest])] = lingering.due(8.0)  # of one departure: the lowest in memory
    assert lowest is min((b, c, d, e), key=id)
    for at, names in ((35.0, [b, c]), (36.5, [d]), (38.0, [e])):  # each batch its own time
        rest = sorted(n for n in names if n is not lowest)
        assert [(t, sorted(due)) for t, due in lingering.due(at)] == \
            ([(ENDPOINT, rest)] if rest else [])
    assert lingering.count() == 0
    assert Targets(ResourceCache(), 30.0, Deadlines()).lingering.together == TOGETHER


def test_past_the_bound_the_names_kept_of_a_departure_are_those_highest_in_memory() -> None:
    names = [f"made-up-{i}" for i in range(1000)]
    random.Random(23).shuffle(names)  # let go in another order than they lie in memory
    lingering = Lingering(Deadlines(), limit=100, together=5.0)
    for start in range(0, 1000, 200):  # in slices, as a departure comes
        lingering.start(ENDPOINT, start / 1000, 30.0 + start / 1000, names[start:start + 200])
    assert lingering.count() == 100
    [(_, cut)] = lingering.due(1.0)  # cut short: at once
    kept = [name for name, _ in lingering.entries(ENDPOINT)]
    assert sorted(kept, key=id) == sorted(names, key=id)[-100:]
    assert sorted(cut) == sorted(set(names) - set(kept))


def test_a_lingering_name_costs_a_list_slot() -> None:
    names = [f"made-up-{i}" for i in range(20_000)]
    lingering = Lingering(Deadlines())
    with traced() as held:
        lingering.start(ENDPOINT, 0.0, 30.0, names)
        per_name = held() / len(names)
    # A {parameters: until} record per name cost 262 bytes.
    assert per_name < 12, per_name


def test_a_subscription_nobody_wants_lingers_then_goes_with_its_cached_copy() -> None:
    cache, index, deadlines = ResourceCache(), InterestIndex(), Deadlines()
    targets = Targets(cache, 30.0, deadlines)
    sub = Sub()
    index.update(sub, ENDPOINT, Interest(frozenset({"a"})))
    change = targets.sync(ENDPOINT, index, 0.0, {"a"})
    assert (change.subscribe, change.unsubscribe) == ({"a": {EMPTY_PARAMS}}, {})
    index.remove(sub)
    names = targets.interest_changed(ENDPOINT, index, 1.0, {"a"})
    assert targets.sync(ENDPOINT, index, 1.0, names).is_empty()  # it lingers
    assert deadlines.next(targets.lingering.stands) == 31.0
    [(type_url, due)] = targets.lingering.due(31.0)
    change = targets.sync(type_url, index, 31.0, due)
    assert (change.subscribe, change.unsubscribe) == ({}, {"a": {EMPTY_PARAMS}})
    assert targets.subscription(ENDPOINT) is None and not targets.has_subscriptions()


def test_past_linger_names_the_oldest_go_at_the_next_tick_and_the_rest_linger() -> None:
    cache, index, deadlines = ResourceCache(), InterestIndex(), Deadlines()
    targets = Targets(cache, 30.0, deadlines, linger_names=3)
    first, second = Sub(), Sub()
    index.update(first, ENDPOINT, Interest(frozenset({"a", "b"})))
    index.update(second, ENDPOINT, Interest(frozenset({"c", "d"})))
    targets.sync(ENDPOINT, index, 0.0, {"a", "b", "c", "d"})
    cache.apply(ENDPOINT, Update(removed=["a", "b", "c", "d"]))
    index.remove(first)
    assert targets.sync(ENDPOINT, index, 1.0,
                        targets.interest_changed(ENDPOINT, index, 1.0, {"a", "b"})).is_empty()
    index.remove(second)  # later than TOGETHER: a batch of its own
    assert targets.sync(ENDPOINT, index, 10.0,
                        targets.interest_changed(ENDPOINT, index, 10.0, {"c", "d"})).is_empty()
    assert deadlines.next(targets.lingering.stands) == 10.0  # one of a and b: now
    [(type_url, due)] = targets.lingering.due(10.0)
    change = targets.sync(type_url, index, 10.0, due)
    assert len(change.unsubscribe) == 1 and set(change.unsubscribe) < {"a", "b"}
    assert [n for n in "abcd" if cache.variants(ENDPOINT, n) is ABSENT] == [
        n for n in "abcd" if n not in change.unsubscribe]
    assert deadlines.next(targets.lingering.stands) == 31.0
    [(type_url, due)] = targets.lingering.due(31.0)
    assert set(targets.sync(type_url, index, 31.0, due).unsubscribe) == {"a", "b"} - set(
        change.unsubscribe)
    [(type_url, due)] = targets.lingering.due(40.0)
    assert set(targets.sync(type_url, index, 40.0, due).unsubscribe) == {"c", "d"}
    assert targets.subscription(ENDPOINT) is None
    assert [n for n in "abcd" if cache.variants(ENDPOINT, n) is ABSENT] == []


def test_a_name_wanted_again_when_its_linger_ends_stays_subscribed() -> None:
    cache, index, deadlines = ResourceCache(), InterestIndex(), Deadlines()
    targets = Targets(cache, 30.0, deadlines)
    sub = Sub()
    index.update(sub, ENDPOINT, Interest(frozenset({"a", "b"})))
    targets.sync(ENDPOINT, index, 0.0, {"a", "b"})
    index.remove(sub)
    targets.sync(ENDPOINT, index, 1.0, targets.interest_changed(ENDPOINT, index, 1.0, {"a", "b"}))
    back = Sub()  # the client reconnects within the linger: nothing to ask the origin
    index.update(back, ENDPOINT, Interest(frozenset({"a"})))
    assert targets.sync(ENDPOINT, index, 5.0,
                        targets.interest_changed(ENDPOINT, index, 5.0, {"a"})).is_empty()
    [(type_url, due)] = targets.lingering.due(31.0)
    change = targets.sync(type_url, index, 31.0, due)
    assert (change.subscribe, change.unsubscribe) == ({}, {"b": {EMPTY_PARAMS}})
    assert targets.subscription_counts() == {ENDPOINT: 1}


def test_a_new_stream_subscribes_what_lingers_and_not_what_is_due() -> None:
    cache, index, deadlines = ResourceCache(), InterestIndex(), Deadlines()
    targets = Targets(cache, 30.0, deadlines)
    subs = [Sub(), Sub()]
    index.update(subs[0], ENDPOINT, Interest(frozenset({"a"})))
    index.update(subs[1], ENDPOINT, Interest(frozenset({"b"}), False, frozenset({("b", CANARY)})))
    targets.sync(ENDPOINT, index, 0.0, {"a", "b"})
    for now, sub in zip((1.0, 10.0), subs, strict=True):  # (further apart than TOGETHER)
        index.remove(sub)
        targets.sync(ENDPOINT, index, now,
                     targets.interest_changed(ENDPOINT, index, now, None))
    assert targets.lingering.count() == 2  # each once, though every name was looked at
    assert targets.new_stream(index) == [ENDPOINT]
    sub = targets.resubscribe(ENDPOINT, index, 20.0)
    assert sub is not None and sub.locators == {"a": {EMPTY_PARAMS}, "b": {CANARY}}
    targets.lingering.due(31.0)  # a's linger ends, not yet synced
    assert targets.new_stream(index) == [ENDPOINT]
    sub = targets.resubscribe(ENDPOINT, index, 31.0)
    assert sub is not None and sub.locators == {"b": {CANARY}}


def test_what_a_sync_unsubscribes_the_cache_forgets_in_one_go() -> None:
    cache, index = ResourceCache(), InterestIndex()
    forgotten: list[int] = []
    cache.add_forget_listener(lambda forgot: forgotten.append(forgot.dropped))
    targets = Targets(cache, 0.0, Deadlines())
    sub = Sub()
    names = {f"e{i}" for i in range(1000)}
    index.update(sub, ENDPOINT, Interest(frozenset(names)))
    targets.sync(ENDPOINT, index, 0.0, names)
    cache.apply(ENDPOINT, Update(removed=sorted(names)))
    index.remove(sub)
    change = targets.sync(ENDPOINT, index, 1.0, targets.interest_changed(ENDPOINT, index, 1.0,
                                                                         names))
    assert set(change.unsubscribe) == names
    assert forgotten == [1000]  # one call, not one per name


def test_a_subscription_table_is_copied_once_most_of_it_went() -> None:
    cache, index = ResourceCache(), InterestIndex()
    targets = Targets(cache, 0.0, Deadlines())
    big, small = Sub(), Sub()
    names = [f"e{i}" for i in range(20_000)]
    index.update(big, ENDPOINT, Interest(frozenset(names)))
    index.update(small, ENDPOINT, Interest(frozenset(names[:100])))
    targets.sync(ENDPOINT, index, 0.0, set(names))
    sub = targets.subscription(ENDPOINT)
    assert sub is not None
    table = sub.locators
    index.remove(big)
    targets.sync(ENDPOINT, index, 1.0, targets.interest_changed(ENDPOINT, index, 1.0, names))
    assert sub.locators is not table and len(sub.locators) == 100
    assert sys.getsizeof(sub.locators) < sys.getsizeof(table) / 50
