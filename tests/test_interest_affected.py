"""InterestIndex telling subscribers which of their names changed in the
cache: a change of many names with one holder (what the origin sent a big
client, or its names forgotten once it left) is told to that holder's
subscribers in one pass with no call per name (counted), and every change is
told as the name-by-name loop tells it (who hears, of which names; the
order in which subscribers hear is not kept, as it is not for one name)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.cache import CacheChange
from relay.constraints import EMPTY_PARAMS, Params, params_of
from relay.interest import InterestChange, InterestIndex
from relay.xds_types import ENDPOINT
from tests.test_cache_served import steps_of
from tests.test_interest import Sub
from tests.test_interest_among import ASKED, NAMES, states

CANARY = params_of({"env": "canary"})


def by_name(index: InterestIndex, names: frozenset[str]) -> dict[object, frozenset[str]]:
    """Who the loop tells of a change of ``names``, of which."""
    return told(index._affected_by_name(
        index._holders.get(ENDPOINT, {}), index._wildcard.get(ENDPOINT, set()),
        ENDPOINT in index._globs, names))


def told(affected: Iterable[tuple[object, frozenset[str]]]) -> dict[object, frozenset[str]]:
    """Who is told of which names; each subscriber once."""
    pairs = list(affected)
    made = dict(pairs)
    assert len(made) == len(pairs)
    return made


@pytest.mark.parametrize("case", list(states()))
def test_each_change_is_told_as_the_loop_tells_it(case: str) -> None:
    index = states()[case]
    for names in (NAMES, NAMES[:1_000], NAMES[1_000:], ASKED, NAMES[1_550:1_600],
                  ["nobody", "else"], NAMES[:1]):
        change = frozenset(names)
        assert told(index._affected(ENDPOINT, change)) == by_name(index, change), names[:3]


def test_a_big_client_s_change_costs_the_same_steps_as_a_small_one() -> None:
    index, sub = InterestIndex(), Sub()
    index.apply(sub, ENDPOINT, InterestChange(added=dict.fromkeys(NAMES, EMPTY_PARAMS)))
    small, big = frozenset(NAMES[:20]), frozenset(NAMES)
    assert steps_of(lambda: index.on_cache_change(CacheChange(ENDPOINT, small))) == \
        steps_of(lambda: index.on_cache_change(CacheChange(ENDPOINT, big)))
    assert sub.seen == [(ENDPOINT, small, False), (ENDPOINT, big, False)]
    assert sub.seen[1][1] is big  # (told the change's own set: no copy made)
    # the loop takes steps for each name
    assert steps_of(lambda: by_name(index, big)) > 10 * len(big)


def test_names_of_nobody_are_told_to_the_wildcard_subscribers_alone() -> None:
    index, named, everything = InterestIndex(), Sub(), Sub()
    index.apply(named, ENDPOINT, InterestChange(added=dict.fromkeys(NAMES[:10], EMPTY_PARAMS)))
    index.apply(everything, ENDPOINT, InterestChange(wildcard=True))
    gone = frozenset(NAMES[100:200])
    index.on_cache_change(CacheChange(ENDPOINT, gone))
    assert named.seen == []
    assert everything.seen == [(ENDPOINT, gone, False)]


SUBSCRIBERS = 3
POOL = [f"n{i}" for i in range(12)]
GLOB = "xdstp://a/envoy.config.endpoint.v3.ClusterLoadAssignment/c/*"
MEMBERS = [f"xdstp://a/envoy.config.endpoint.v3.ClusterLoadAssignment/c/m{i}" for i in range(3)]

joins = st.lists(st.tuples(
    st.integers(0, SUBSCRIBERS - 1),
    st.one_of(st.just("wildcard"), st.just("glob"),
              st.lists(st.sampled_from(POOL + MEMBERS), min_size=1, max_size=12)),
    st.sampled_from([EMPTY_PARAMS, CANARY])), max_size=8)


@settings(max_examples=300, deadline=None)
@given(joins=joins, changes=st.lists(st.sets(st.sampled_from(POOL + MEMBERS + ["x"]),
                                             min_size=1), min_size=1, max_size=4))
def test_random_holders_hear_what_the_loop_tells(
        joins: list[tuple[int, str | list[str], Params]], changes: list[set[str]]) -> None:
    index = InterestIndex()
    subs = [Sub() for _ in range(SUBSCRIBERS)]
    for who, what, params in joins:
        if what == "wildcard":
            change = InterestChange(wildcard=True)
        elif what == "glob":
            change = InterestChange(added={GLOB: params}, globs=frozenset({GLOB}))
        else:
            change = InterestChange(added=dict.fromkeys(what, params))
        index.apply(subs[who], ENDPOINT, change)
    for names in changes:
        change_set = frozenset(names)
        assert told(index._affected(ENDPOINT, change_set)) == by_name(index, change_set)
