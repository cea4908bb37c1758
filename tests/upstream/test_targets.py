"""What the upstream subscribes, on its own: lingering and its deadlines, without I/O."""

from __future__ import annotations

from relay.cache import ResourceCache
from relay.constraints import EMPTY_PARAMS, params_of
from relay.interest import Interest, InterestIndex
from relay.upstream.deadlines import Deadlines, LingerEnds, WildcardLingerEnds
from relay.upstream.targets import Lingering, Targets
from relay.xds_types import CLUSTER, ENDPOINT
from tests.upstream.test_upstream_state import Sub

CANARY = params_of({"env": "canary"})


def test_names_that_stop_lingering_together_share_one_deadline() -> None:
    deadlines = Deadlines()
    lingering = Lingering(deadlines)
    for i in range(1000):
        lingering.start(ENDPOINT, f"e{i}", EMPTY_PARAMS, 30.0)
    assert len(deadlines) == 1
    assert deadlines.next(lingering.stands) == 30.0


def test_a_linger_deadline_stands_while_one_of_its_names_lingers() -> None:
    deadlines = Deadlines()
    lingering = Lingering(deadlines)
    lingering.start(ENDPOINT, "a", EMPTY_PARAMS, 30.0)
    lingering.start(ENDPOINT, "b", CANARY, 30.0)
    lingering.cancel(ENDPOINT, "a", [EMPTY_PARAMS])
    assert lingering.stands(LingerEnds(ENDPOINT, 30.0))
    lingering.cancel(ENDPOINT, "b", [CANARY])
    assert not lingering.stands(LingerEnds(ENDPOINT, 30.0))
    assert deadlines.next(lingering.stands) is None
    assert lingering.types() == set()


def test_what_lingers_is_due_once_its_time_is_up_and_then_expires() -> None:
    deadlines = Deadlines()
    lingering = Lingering(deadlines)
    lingering.start(ENDPOINT, "a", EMPTY_PARAMS, 10.0)
    lingering.start(ENDPOINT, "b", EMPTY_PARAMS, 20.0)
    lingering.start_wildcard(CLUSTER, 20.0)
    assert lingering.due(9.0) == []
    assert lingering.due(10.0) == [(ENDPOINT, ["a"])]
    assert lingering.due(20.0) == [(CLUSTER, []), (ENDPOINT, ["a", "b"])]
    lingering.expire(ENDPOINT, 10.0, None)
    assert lingering.of_type(ENDPOINT) == {"b": {EMPTY_PARAMS: 20.0}}
    assert lingering.wildcard_lingers(CLUSTER, 19.0)
    assert lingering.stands(WildcardLingerEnds(CLUSTER, 20.0))
    lingering.expire(CLUSTER, 20.0, None)
    assert not lingering.stands(WildcardLingerEnds(CLUSTER, 20.0))


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
