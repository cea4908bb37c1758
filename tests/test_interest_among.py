"""InterestIndex.wanted_among: what clients want of many names at once (the
upstream's targets ask it for each slice of a big client's names) is what
wanted_params says name by name; where one holder holds them all it is
looked up with no call per name (counted), and a subscriber's own table is
not looked through where its names all have the same parameters."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.constraints import EMPTY_PARAMS, params_of
from relay.interest import InterestChange, InterestIndex
from relay.upstream.origins import RoutedDemand, Routes
from relay.xds_types import CLUSTER, ENDPOINT
from tests.test_interest import Sub
from tests.test_interest_demand_once import Counted

N = 2_000
NAMES = [f"cla-{i}" for i in range(N)]
CANARY = params_of({"env": "canary"})
ASKED = [*NAMES[:50], "nobody", *NAMES[1_500:1_600], NAMES[7]]


def states() -> dict[str, InterestIndex]:
    """Indexes whose names are held in each way a name can be held."""
    made: dict[str, InterestIndex] = {}
    subs = [Sub() for _ in range(3)]
    for case, joins in {
        "one holder, plain": [(0, NAMES, EMPTY_PARAMS)],
        "one holder, with parameters": [(0, NAMES, CANARY)],
        "one holder, mixed parameters": [(0, NAMES[:1_000], EMPTY_PARAMS),
                                         (0, NAMES[1_000:], CANARY)],
        "one group of two": [(0, NAMES, EMPTY_PARAMS), (1, NAMES, CANARY)],
        "holders of some": [(0, NAMES, EMPTY_PARAMS), (1, NAMES[:20], CANARY),
                            (2, NAMES[1_550:], EMPTY_PARAMS)],
        "a wildcard and names": [(0, NAMES[:1_000], EMPTY_PARAMS)],
        "nobody": [],
    }.items():
        index = made[case] = InterestIndex()
        if case == "a wildcard and names":
            index.apply(subs[1], ENDPOINT, InterestChange(wildcard=True))
        for who, names, params in joins:
            index.apply(subs[who], ENDPOINT, InterestChange(added=dict.fromkeys(names, params)))
    return made


@pytest.mark.parametrize("case", list(states()))
def test_wanted_among_is_wanted_params_of_each(case: str) -> None:
    index = states()[case]
    for names in (ASKED, NAMES[100:200], []):
        assert index.wanted_among(ENDPOINT, names) == [
            index.wanted_params(ENDPOINT, name) for name in names]
    assert index.wanted_among(CLUSTER, ASKED) == [frozenset()] * len(ASKED)


@pytest.mark.parametrize("case", ["one holder, plain", "one holder, with parameters",
                                  "one group of two", "a wildcard and names"])
def test_names_of_one_holder_are_looked_up_with_no_call_each(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    index = states()[case]
    calls: list[str] = []
    original = InterestIndex._params_of

    def counting(self: InterestIndex, type_url: str, name: str, found: Any) -> Any:
        calls.append(name)
        return original(self, type_url, name, found)

    monkeypatch.setattr(InterestIndex, "_params_of", counting)
    assert len(index.wanted_among(ENDPOINT, NAMES[:1_000])) == 1_000  # (all held in each case)
    assert calls == []


def test_a_routed_demand_wants_only_its_origins_names() -> None:
    index = states()["one holder, plain"]
    other = "xdstp://other.example/envoy.config.endpoint.v3.ClusterLoadAssignment/x"
    index.apply(Sub(), ENDPOINT, InterestChange(added={other: EMPTY_PARAMS}))
    routes = Routes(["other.example"], default=True)
    for origin in routes.origins():
        demand = RoutedDemand(index, routes, origin)
        names = [*NAMES[:5], other, "nobody"]
        assert demand.wanted_among(ENDPOINT, names) == [
            demand.wanted_params(ENDPOINT, name) for name in names]


@pytest.mark.parametrize("params", [EMPTY_PARAMS, CANARY])
def test_a_holder_whose_names_are_alike_is_not_looked_up(params: Any) -> None:
    index, sub = InterestIndex(), Sub()
    for piece in (NAMES[:1_000], NAMES[1_000:]):  # (in pieces: its table not read whole)
        index.apply(sub, ENDPOINT, InterestChange(added=dict.fromkeys(piece, params)))
    mine = index._per_subscriber[sub][ENDPOINT]
    mine.names = Counted(mine.names)
    assert index.wanted_among(ENDPOINT, NAMES[500:1_500]) == \
        [index.wanted_params(ENDPOINT, NAMES[0])] * 1_000
    assert mine.names.items == 1  # (wanted_params' own look-up)


POOL = [f"n{i:02d}" for i in range(40)]
spans = st.sampled_from([(0, 20), (20, 40), (0, 40), (10, 30), (5, 6)])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), spans, st.booleans(), st.booleans()), max_size=8),
       st.lists(st.one_of(st.sampled_from(POOL), st.just("nobody")), max_size=30), spans)
def test_wanted_among_is_wanted_params_of_each_after_random_changes(
        plan: list[tuple[int, tuple[int, int], bool, bool]], asked: list[str],
        span: tuple[int, int]) -> None:
    index, subs = InterestIndex(), [Sub() for _ in range(3)]
    for who, (start, stop), canary, adding in plan:
        names = dict.fromkeys(POOL[start:stop], CANARY if canary else EMPTY_PARAMS)
        index.apply(subs[who], ENDPOINT,
                    InterestChange(added=names) if adding else InterestChange(removed=names))
    for names in (asked, POOL[slice(*span)]):
        assert index.wanted_among(ENDPOINT, names) == [
            index.wanted_params(ENDPOINT, name) for name in names]


def test_names_nobody_holds_are_looked_up_once() -> None:
    # (the upstream asks of a leaving client's names, once they are gone)
    index, left, stays = InterestIndex(), Sub(), Sub()
    index.apply(left, ENDPOINT, InterestChange(added=dict.fromkeys(NAMES, EMPTY_PARAMS)))
    index.apply(stays, ENDPOINT, InterestChange(added={"other": EMPTY_PARAMS}))
    index.remove(left)
    holders = index._holders[ENDPOINT] = Counted(index._holders[ENDPOINT])
    assert index.wanted_among(ENDPOINT, NAMES) == [frozenset()] * N
    assert holders.calls == N + 1  # (their one holder, nobody, found in one pass)
