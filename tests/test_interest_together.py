"""InterestIndex: a big client's names added together, as the loop adds them.

A subscribe of thousands of names, all new to the subscriber, with the same
parameters and held by the same holders (nobody, one other subscriber, or
one group), is added with a few operations on the whole set
(``InterestIndex._add_together``) instead of the loop's work per name; the
host's share in the ledger too (``DemandLedger.hold_all``). Each scenario
here runs with it and with the loop alone, and must leave the same index,
the same notices upstream and the same ledger; the work is counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from relay.constraints import EMPTY_PARAMS, Params, params_of
from relay.demand import DemandLedger
from relay.interest import InterestChange, InterestIndex, _Regrouping, _Shared
from relay.xds_types import ENDPOINT
from tests.test_interest import Sub, Up

N = 3_000
NAMES = [f"cla-{i:05d}" for i in range(N)]
CANARY = params_of({"env": "canary"})


def plain(names: list[str], params: Params = EMPTY_PARAMS) -> InterestChange:
    return InterestChange(added=dict.fromkeys(names, params))


# Each scenario: (which subscriber, its change, its host), applied in order.
Step = tuple[int, InterestChange, str]
SCENARIOS: dict[str, list[Step]] = {
    "first, second, third of the same names": [
        (0, plain(NAMES), "a"), (1, plain(NAMES), "a"), (2, plain(NAMES), "b")],
    "a second with other parameters": [(0, plain(NAMES), "a"), (1, plain(NAMES, CANARY), "a")],
    "a third with other parameters": [
        (0, plain(NAMES), "a"), (1, plain(NAMES), "b"), (2, plain(NAMES, CANARY), "b")],
    "a subset, then the rest": [
        (0, plain(NAMES), "a"), (1, plain(NAMES[:1_000]), "a"), (1, plain(NAMES[1_000:]), "a"),
        (2, plain(NAMES[500:]), "a")],
    "held by different holders (the loop)": [
        (0, plain(NAMES[:100]), "a"), (1, plain(NAMES), "a")],
    "some held already (the loop)": [
        (0, plain(NAMES), "a"), (1, plain(NAMES[:10]), "a"), (1, plain(NAMES[5:]), "a")],
    "mixed parameters (the loop)": [
        (0, InterestChange(added={**dict.fromkeys(NAMES, EMPTY_PARAMS), NAMES[7]: CANARY}), "a"),
        (1, plain(NAMES), "a")],
    "holders with mixed parameters (the loop)": [
        (0, plain(NAMES[:10], CANARY), "a"), (0, plain(NAMES[10:]), "a"), (1, plain(NAMES), "a")],
    "a leave and a join again": [
        (0, plain(NAMES), "a"), (1, plain(NAMES), "a"),
        (1, InterestChange(removed=dict.fromkeys(NAMES, EMPTY_PARAMS)), "a"),
        (1, plain(NAMES), "a")],
}


def run(steps: list[Step]) -> tuple[list[Sub], InterestIndex, Up, DemandLedger]:
    subs, index, up = [Sub(), Sub(), Sub()], InterestIndex(), Up()
    ledger = DemandLedger(10**6, 10**6, time.monotonic)
    index.link(up)
    index.limit_demand(ledger)
    for who, change, host in steps:
        index.apply(subs[who], ENDPOINT, change, host)
    return subs, index, up, ledger


def state(subs: list[Sub], index: InterestIndex, up: Up, ledger: DemandLedger) -> Any:
    """Everything the index and the ledger hold, subscribers by number."""
    number = {id(sub): i for i, sub in enumerate(subs)}
    holders = index._holders[ENDPOINT]

    def holder(found: object) -> object:
        if isinstance(found, _Shared):
            return (sorted(number[id(s)] for s in found.subscribers),
                    sorted(found.counts.items(), key=repr), found.uses)
        return number[id(found)]

    groups = {id(found) for found in holders.values()}
    return (list(holders), [holder(found) for found in holders.values()], len(groups),
            index.upstream_names, index.wanted_locators(ENDPOINT), up.names,
            [dict(sorted(ledger.held_by(host, ENDPOINT).items())) for host in "ab"],
            [ledger.host_total(host) for host in "ab"],
            [{n: p for n, p in index._per_subscriber[sub][ENDPOINT].names.items()}
             for sub in subs if sub in index._per_subscriber])


@pytest.mark.parametrize("steps", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_names_added_together_leave_what_the_loop_leaves(
        steps: list[Step], monkeypatch: pytest.MonkeyPatch) -> None:
    together = state(*run(steps))
    monkeypatch.setattr(InterestIndex, "_add_together", lambda *args: False)
    assert together == state(*run(steps))


def counted(monkeypatch: pytest.MonkeyPatch, cls: type, method: str) -> list[int]:
    calls = [0]
    original: Callable[..., object] = getattr(cls, method)

    def counting(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(cls, method, counting)
    return calls


def test_a_big_clients_names_are_added_without_work_per_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    joined = counted(monkeypatch, _Regrouping, "joined")
    held = counted(monkeypatch, DemandLedger, "hold")
    held_together = counted(monkeypatch, DemandLedger, "hold_all")
    _, index, up, ledger = run(SCENARIOS["first, second, third of the same names"])
    # one group made by the second, one by the third; no call per name anywhere
    assert (joined[0], held[0], held_together[0]) == (2, 0, 3)
    assert index.upstream_names == N and up.names == [NAMES]  # told once, the first
    assert ledger.held_by("a", ENDPOINT) == dict.fromkeys(NAMES, 2)
    assert (ledger.host_total("a"), ledger.host_total("b")) == (N, N)


# whether each step's names were added together (the rest: by the loop)
TOGETHER = {
    "first, second, third of the same names": [True, True, True],
    "a second with other parameters": [True, True],
    "a third with other parameters": [True, True, True],
    "a subset, then the rest": [True, True, True, False],
    "held by different holders (the loop)": [True, False],
    "some held already (the loop)": [True, True, False],
    "mixed parameters (the loop)": [False, False],
    "holders with mixed parameters (the loop)": [True, True, False],
    "a leave and a join again": [True, True, False, True],
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_names_are_added_together_only_where_they_may_be(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    decided: list[bool] = []
    original = InterestIndex._add_together

    def recorded(*args: Any) -> bool:
        decided.append(original(*args))
        return decided[-1]

    monkeypatch.setattr(InterestIndex, "_add_together", recorded)
    run(SCENARIOS[name])
    # (a step that only removes adds nothing: not asked)
    assert decided == [d for d, (_, change, _) in zip(TOGETHER[name], SCENARIOS[name],
                                                     strict=True) if change.added]


def test_hold_all_counts_as_hold_does() -> None:
    one, together = (DemandLedger(10**6, 10**6, time.monotonic) for _ in range(2))
    for ledger in (one, together):
        ledger.hold("h", ENDPOINT, "x")
        ledger.hold("h", ENDPOINT, "y")
    for name in ["y", "z", "w"]:
        one.hold("h", ENDPOINT, name)
    together.hold_all("h", ENDPOINT, ["y", "z", "w"])
    together.hold_all("h", ENDPOINT, [])
    assert together.held_by("h", ENDPOINT) == one.held_by("h", ENDPOINT) == \
        {"x": 1, "y": 2, "z": 1, "w": 1}
    assert together.host_total("h") == one.host_total("h") == 4
    assert together.held_by("elsewhere", ENDPOINT) == {}
