"""Targets: a big client's names, new and plain, are targeted together
(``_joining_together``) as the loops target them one by one.

Such a slice (a cold client's 2,000 names a turn: each wanted plain, none
subscribed) needs nothing looked up per name: nothing of it lingers or is
served from cache. Random plans of joins, leaves and ticks (names plain or
with parameters, held by one client or several, lingering or not) give the
same changes for the origin and the same subscriptions, lingering names and
cache with the whole-set path as without it; and it takes no step per name.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.cache import ResourceCache
from relay.constraints import EMPTY_PARAMS
from relay.interest import Interest, InterestIndex
from relay.upstream import targets as targets_module
from relay.upstream.deadlines import Deadlines
from relay.upstream.targets import Targets
from relay.xds_types import ENDPOINT
from tests.test_cache_served import steps_of
from tests.test_interest import Sub
from tests.upstream.test_targets_together import CANARY, NAMES, Relay

POOL = NAMES[:24]

STEP = st.one_of(
    st.tuples(st.just("join"), st.integers(0, 2), st.lists(st.sampled_from(POOL), min_size=1),
              st.sampled_from([EMPTY_PARAMS, CANARY])),
    st.tuples(st.just("leave"), st.integers(0, 2)),
    st.tuples(st.just("tick"), st.sampled_from([1.0, 40.0])))


def played(plan: list[Any], linger: float) -> Relay:
    relay = Relay(linger=linger, linger_names=10)
    now = 0.0
    for step in plan:
        now += 1.0
        if step[0] == "join":
            relay.join(step[1], step[2], now, step[3])
        elif step[0] == "leave":
            relay.leave(step[1], now)
        else:
            now += step[1]
            relay.tick(now)
    relay.tick(now + 100.0)
    return relay


@settings(max_examples=200, deadline=None)
@given(plan=st.lists(STEP, max_size=8), linger=st.sampled_from([0.0, 30.0]))
def test_names_joining_together_are_targeted_as_the_loops_target_them(
        plan: list[Any], linger: float) -> None:
    together = played(plan, linger)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(targets_module, "_joining_together", lambda *args: None)
        alone = played(plan, linger)
    assert [list(map(list, change)) for change in together.changes] == \
        [list(map(list, change)) for change in alone.changes]
    assert together.states == alone.states


@pytest.mark.parametrize("linger", [0.0, 30.0])
def test_a_cold_clients_names_are_targeted_with_no_step_per_name(linger: float) -> None:
    def steps(names: int) -> int:
        index, targets = InterestIndex(), Targets(ResourceCache(), linger, Deadlines())
        index.update(Sub(), ENDPOINT, Interest(frozenset({"held"})))
        targets.sync(ENDPOINT, index, 0.0, ["held"])  # (one name subscribed before)
        joined = [f"big-{i}" for i in range(names)]
        index.update(Sub(), ENDPOINT, Interest(frozenset(joined)))
        return steps_of(lambda: targets.target(ENDPOINT, index, 0.0, set(joined)))

    assert steps(2_000) == steps(10)  # (the loops: a step or more per name)
