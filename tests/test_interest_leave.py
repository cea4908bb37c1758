"""InterestIndex: a client's names let go together, as the loop lets them go.

A client leaving (or unsubscribing many names) whose names are all held
with the same parameters and by the same holders (itself alone, or one
group) has them dropped with a few operations on the whole set
(``InterestIndex._drop_together``) instead of the loop's work per name; the
host's share in the ledger is released per count, not per name
(``DemandLedger.release_all``). Each scenario here runs with it and with the
loop alone, and must leave the same index, the same notices upstream and the
same ledger; the work is counted.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pytest

from relay.constraints import EMPTY_PARAMS
from relay.demand import DemandLedger
from relay.interest import InterestChange, InterestIndex, _Regrouping
from relay.xds_types import ENDPOINT
from tests.test_interest_together import CANARY, NAMES, N, Step, counted, plain, run, state


def gone(names: list[str], params: Any = EMPTY_PARAMS) -> InterestChange:
    return InterestChange(removed=dict.fromkeys(names, params))


# Each scenario: (which subscriber, its change, its host), applied in order;
# then the subscribers in LEAVING leave, 1,000 names a slice.
SCENARIOS: dict[str, list[Step]] = {
    "the last holder": [(0, plain(NAMES), "a"), (0, gone(NAMES), "a")],
    "one of two (held by the other alone again)": [
        (0, plain(NAMES), "a"), (1, plain(NAMES), "a"), (1, gone(NAMES), "a")],
    "one of three, two hosts": [
        (0, plain(NAMES), "a"), (1, plain(NAMES), "b"), (2, plain(NAMES), "a"),
        (2, gone(NAMES), "a"), (0, gone(NAMES), "a")],
    "the last with its parameters": [
        (0, plain(NAMES), "a"), (1, plain(NAMES, CANARY), "b"), (1, gone(NAMES, CANARY), "b")],
    "a group that serves other names too": [
        (0, plain(NAMES), "a"), (1, plain(NAMES), "a"), (1, gone(NAMES[:1_000]), "a")],
    "a part, then the rest": [
        (0, plain(NAMES), "a"), (0, gone(NAMES[:1_000]), "a"), (0, gone(NAMES[1_000:]), "a")],
    "held by different holders (the loop)": [
        (0, plain(NAMES), "a"), (1, plain(NAMES[:100]), "a"), (0, gone(NAMES), "a")],
    "other parameters than held (the loop)": [
        (0, plain(NAMES), "a"), (0, gone(NAMES, CANARY), "a")],
    "some not held (the loop)": [
        (0, plain(NAMES[:2_000]), "a"), (0, gone(NAMES), "a")],
    "removed and added again (the loop)": [
        (0, plain(NAMES), "a"),
        (0, InterestChange(added=dict.fromkeys(NAMES[:10], CANARY),
                           removed=dict.fromkeys(NAMES, EMPTY_PARAMS)), "a")],
    "mixed holders and counts in the ledger (the loop)": [
        (0, plain(NAMES), "a"), (1, plain(NAMES[:500]), "a"), (2, plain(NAMES[:100]), "a"),
        (0, gone(NAMES), "a")],
}
LEAVING = {"one of two (held by the other alone again)": [0],
           "one of three, two hosts": [1],
           "a group that serves other names too": [0, 1],
           "mixed holders and counts in the ledger (the loop)": [1, 2]}


def left(steps: list[Step], leaving: list[int]) -> list[Any]:
    """The state after the steps, and after each leaving subscriber's every slice."""
    subs, index, up, ledger = run(steps)
    states = [state(subs, index, up, ledger)]
    for who in leaving:
        while not index.remove(subs[who], 1_000):
            states.append(state(subs, index, up, ledger))
        states.append(state(subs, index, up, ledger))
    return states


def per_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the loop, and the ledger released name by name."""
    monkeypatch.setattr(InterestIndex, "_drop_together", lambda *args: False)

    def one_by_one(self: DemandLedger, host: str, type_url: str, names: Collection[str]) -> None:
        for name in list(names):
            self.release(host, type_url, name)

    monkeypatch.setattr(DemandLedger, "release_all", one_by_one)


@pytest.mark.parametrize("name", SCENARIOS)
def test_names_dropped_together_leave_what_the_loop_leaves(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    together = left(SCENARIOS[name], LEAVING.get(name, []))
    per_name(monkeypatch)
    assert together == left(SCENARIOS[name], LEAVING.get(name, []))


# whether each removing step's names were dropped together (the rest: by the loop)
TOGETHER = {
    "the last holder": [True],
    "one of two (held by the other alone again)": [True],
    "one of three, two hosts": [True, True],
    "the last with its parameters": [True],
    "a group that serves other names too": [True],
    "a part, then the rest": [True, True],
    "held by different holders (the loop)": [False],
    "other parameters than held (the loop)": [False],
    "some not held (the loop)": [False],
    "removed and added again (the loop)": [False],
    "mixed holders and counts in the ledger (the loop)": [False],
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_names_are_dropped_together_only_where_they_may_be(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    decided: list[bool] = []
    original = InterestIndex._drop_together

    def recorded(*args: Any) -> bool:
        decided.append(original(*args))
        return decided[-1]

    monkeypatch.setattr(InterestIndex, "_drop_together", recorded)
    run(SCENARIOS[name])
    assert decided == TOGETHER[name]


def test_a_big_client_leaving_costs_no_work_per_name(monkeypatch: pytest.MonkeyPatch) -> None:
    regrouped = counted(monkeypatch, _Regrouping, "left")
    released = counted(monkeypatch, DemandLedger, "release")
    released_together = counted(monkeypatch, DemandLedger, "release_all")
    subs, index, up, ledger = run([(0, plain(NAMES), "a"), (1, plain(NAMES), "a")])
    while not index.remove(subs[1], 1_000):  # the warm one: their group, one per slice
        pass
    assert (regrouped[0], released[0], released_together[0]) == (3, 0, 3)
    assert ledger.held_by("a", ENDPOINT) == dict.fromkeys(NAMES, 1)
    while not index.remove(subs[0], 1_000):  # the last: no group at all
        pass
    assert (regrouped[0], released[0], released_together[0]) == (3, 0, 6)
    assert index.upstream_names == 0 and ledger.host_total("a") == 0
    assert up.names[-3:] == [sorted(NAMES[:1_000]), sorted(NAMES[1_000:2_000]),
                             sorted(NAMES[2_000:])]  # each slice told once


def test_a_leave_dropped_together_gives_the_tables_back() -> None:
    subs, index, _, ledger = run([(0, plain(NAMES), "a")])
    index.apply(subs[0], ENDPOINT, gone(NAMES[:N - 10]))
    # (what is left is copied into tables of its size: see relay.memory.oversized)
    assert len(index._per_subscriber[subs[0]][ENDPOINT].names) == 10
    assert len(index._holders[ENDPOINT]) == index.upstream_names == 10
    assert ledger.held_by("a", ENDPOINT) == dict.fromkeys(NAMES[N - 10:], 1)
    index.apply(subs[0], ENDPOINT, gone(NAMES[N - 10:]))
    assert ENDPOINT not in index._holders and ledger.host_total("a") == 0
