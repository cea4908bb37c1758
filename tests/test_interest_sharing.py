"""InterestIndex: names with the same holders share one holder group.

A client subscribing to the thousands of names another holds (a big client's
warm join) makes a handful of groups, not one set and dict per name; the
union the upstream reads and the fan-out are what they were with a group
per name. Counted (the distinct groups among the holders), not timed.
"""

from __future__ import annotations

from relay.cache import CacheChange
from relay.constraints import EMPTY_PARAMS, params_of
from relay.interest import InterestChange, InterestIndex
from relay.xds_types import ENDPOINT
from tests.test_interest import Sub, Up

N = 5_000
NAMES = [f"cla-{i}" for i in range(N)]
PLAIN = dict.fromkeys(NAMES, EMPTY_PARAMS)
CANARY = params_of({"env": "canary"})


def holder_groups(index: InterestIndex) -> int:
    """How many distinct holders (subscribers, or groups of them) the names have."""
    return len({id(found) for found in index._holders[ENDPOINT].values()})


def test_a_second_holder_of_many_names_makes_one_group() -> None:
    index = InterestIndex()
    first, second, third = Sub(), Sub(), Sub()
    index.apply(first, ENDPOINT, InterestChange(added=PLAIN))
    assert holder_groups(index) == 1  # the subscriber itself
    index.apply(second, ENDPOINT, InterestChange(added=PLAIN))
    assert holder_groups(index) == 1  # {first, second}, shared by every name
    index.apply(third, ENDPOINT, InterestChange(added=dict.fromkeys(NAMES[:100], CANARY)))
    assert holder_groups(index) == 2  # and {first, second, third} for 100 of them
    locators = index.wanted_locators(ENDPOINT)
    assert [locators[name] for name in (NAMES[0], NAMES[-1])] == [
        frozenset({EMPTY_PARAMS, CANARY}), frozenset({EMPTY_PARAMS})]


def test_holders_leaving_shared_names_leave_the_others_theirs() -> None:
    up, index = Up(), InterestIndex()
    index.link(up)
    first, second, third = Sub(), Sub(), Sub()
    index.apply(first, ENDPOINT, InterestChange(added=PLAIN))
    index.apply(second, ENDPOINT, InterestChange(added=PLAIN))
    index.apply(third, ENDPOINT, InterestChange(added=dict.fromkeys(NAMES[:100], CANARY)))
    up.names.clear()
    assert index.remove(second)
    # Nobody's parameters went: the union is the same, the upstream not told.
    assert up.names == []
    assert holder_groups(index) == 2  # first alone, and {first, third}
    assert index.remove(third)
    assert up.names == [sorted(NAMES[:100])]  # the canary parameters went
    assert holder_groups(index) == 1
    assert index.wanted_locators(ENDPOINT) == dict.fromkeys(NAMES, frozenset({EMPTY_PARAMS}))
    assert index.upstream_names == N


def test_a_holder_changing_parameters_of_shared_names() -> None:
    up, index = Up(), InterestIndex()
    index.link(up)
    first, second = Sub(), Sub()
    index.apply(first, ENDPOINT, InterestChange(added=PLAIN))
    index.apply(second, ENDPOINT, InterestChange(added=PLAIN))
    up.names.clear()
    moved = dict.fromkeys(NAMES[:10], CANARY)
    index.apply(second, ENDPOINT, InterestChange(added=moved, removed=dict.fromkeys(NAMES[:10],
                                                                                   EMPTY_PARAMS)))
    assert up.names == [sorted(NAMES[:10])]  # each gained the canary set (the plain one stays)
    assert holder_groups(index) == 2
    assert index.wanted_params(ENDPOINT, NAMES[0]) == frozenset({EMPTY_PARAMS, CANARY})
    # A change reaches both holders of a shared name, once each.
    index.on_cache_change(CacheChange(ENDPOINT, frozenset(NAMES[8:12])))
    assert first.seen == second.seen == [(ENDPOINT, frozenset(NAMES[8:12]), False)]


def test_streams_joining_and_leaving_one_name_change_its_group_in_place() -> None:
    # The fan-out: a thousand streams subscribe to one name, one by one. Its
    # group serves it alone: changed in place, never copied (a copy per
    # stream would cost the square of the streams).
    index = InterestIndex()
    streams = [Sub() for _ in range(1_000)]
    index.apply(streams[0], ENDPOINT, InterestChange(added={"x": EMPTY_PARAMS}))
    index.apply(streams[1], ENDPOINT, InterestChange(added={"x": EMPTY_PARAMS}))
    group = index._holders[ENDPOINT]["x"]
    for stream in streams[2:]:
        index.apply(stream, ENDPOINT, InterestChange(added={"x": EMPTY_PARAMS}))
    assert index._holders[ENDPOINT]["x"] is group
    for stream in streams[:-2]:
        index.remove(stream)
    assert index._holders[ENDPOINT]["x"] is group
    index.on_cache_change(CacheChange(ENDPOINT, frozenset({"x"})))
    assert [len(stream.seen) for stream in streams[-3:]] == [0, 1, 1]
    index.remove(streams[-2])
    assert index._holders[ENDPOINT]["x"] is streams[-1]
    assert index.wanted_params(ENDPOINT, "x") == frozenset({EMPTY_PARAMS})
