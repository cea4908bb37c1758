"""Settling.subscribed_all: a subscription's names settle as they do given one
Locator at a time, and new plain names go in without a Locator made for each."""

from __future__ import annotations

import gc
import math
import sys
from typing import Any

import pytest

from relay.constraints import EMPTY_PARAMS, Locator, Params, params_of
from relay.upstream import settling as settling_module
from relay.upstream.deadlines import Deadlines
from relay.upstream.settling import Settling
from relay.xds_types import ENDPOINT

GRACE = 0.5
PLAIN = frozenset({EMPTY_PARAMS})
DEV = params_of({"env": "dev"})


Step = tuple[dict[str, frozenset[Params]], float] | float


def history(steps: list[Step], together: bool) -> list[object]:
    """What a settling says as time goes on, told of these subscriptions
    (names, when) and responses (when) in turn."""
    deadlines = Deadlines()
    settling = Settling(GRACE, deadlines)
    seen: list[object] = []
    for step in steps:
        if isinstance(step, float):
            seen.append(settling.on_response(ENDPOINT, step))
            seen.append(len(deadlines))
            continue
        locators, now = step
        if together:
            settling.subscribed_all(ENDPOINT, locators, now)
        else:
            settling.subscribed(ENDPOINT, [Locator(name, params) for name, params_set in
                                           locators.items() for params in params_set], now)
        seen.append(settling.unanswered_names(lambda type_url, locator: False))
    seen.append(settling.on_response(ENDPOINT, 10.2))
    seen.append(len(deadlines))
    seen.append(settling.due(10.6))
    seen.append(settling.due(11.0))
    return seen


CASES: dict[str, list[Step]] = {
    "new plain names": [({f"n{i}": PLAIN for i in range(50)}, 10.0)],
    "a name subscribed again": [({"a": PLAIN, "b": PLAIN}, 10.0), ({"a": PLAIN}, 10.4)],
    "with parameters": [({"a": PLAIN, "v": frozenset({EMPTY_PARAMS, DEV})}, 10.0)],
    "then more plain names": [({"a": PLAIN}, 10.0), ({"b": PLAIN, "c": PLAIN}, 10.3)],
    "again while settling": [({"a": PLAIN, "b": PLAIN}, 10.0), 10.1, ({"a": PLAIN}, 10.15),
                             ({"c": PLAIN}, 10.15)],
    "answered, then more": [({"a": PLAIN}, 9.0), 9.6, ({"b": PLAIN}, 10.0)],
}


@pytest.mark.parametrize("case", CASES)
def test_names_subscribed_together_settle_as_locators_one_by_one(case: str) -> None:
    assert history(CASES[case], together=True) == history(CASES[case], together=False)


@pytest.mark.parametrize("case", CASES)
def test_names_answered_together_settle_as_the_loop_settles_them(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    moved: list[object] = []
    original = settling_module._move_together

    def counting(*args: Any) -> Any:
        moved.append(result := original(*args))
        return result

    monkeypatch.setattr(settling_module, "_move_together", counting)
    together = history(CASES[case], together=True)
    assert any(dues is not None for dues in moved)  # (each case takes it at least once)
    monkeypatch.setattr(settling_module, "_move_together", lambda *args: None)
    assert together == history(CASES[case], together=True)


def test_new_plain_names_are_subscribed_without_a_locator_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    def counting(name: str, params: Params = EMPTY_PARAMS) -> Any:
        made.append(name)
        return Locator(name, params)

    monkeypatch.setattr(settling_module, "Locator", counting)
    settling = Settling(GRACE, Deadlines())
    settling.subscribed_all(ENDPOINT, {f"n{i}": PLAIN for i in range(1_000)}, 10.0)
    settling.subscribed_all(ENDPOINT, {"m": PLAIN}, 10.1)
    assert made == []
    settling.subscribed_all(ENDPOINT, {"n3": PLAIN}, 10.2)  # again: its place moves
    assert made == ["n3"]


def test_a_locator_subscribed_again_while_settling_comes_due_after_the_others() -> None:
    deadlines = Deadlines()
    settling = Settling(GRACE, deadlines)
    settling.subscribed_all(ENDPOINT, {"a": PLAIN, "b": PLAIN}, 10.0)
    assert settling.on_response(ENDPOINT, 10.1) == []  # too soon: both settle at 10.5
    settling.subscribed_all(ENDPOINT, {"a": PLAIN, "c": PLAIN}, 10.15)
    assert settling.on_response(ENDPOINT, 10.2) == []
    assert len(deadlines) == 2  # 10.5 and 10.65
    assert settling.due(10.6) == {ENDPOINT: [Locator("b")]}
    assert settling.due(10.7) == {ENDPOINT: [Locator("a"), Locator("c")]}


def test_a_big_clients_names_settle_with_no_step_or_object_per_name() -> None:
    """Subscribed and answered together: no Python step per name (the
    subscription is counted in C) and no object per name when answered
    (the maps hold when each was subscribed: nothing computed per name)."""
    from tests.test_cache_served import steps_of

    def cold_join(names: int) -> tuple[int, int]:
        settling = Settling(GRACE, Deadlines())
        locators = {f"n{i}": PLAIN for i in range(names)}
        steps = steps_of(lambda: settling.subscribed_all(ENDPOINT, locators, 10.0))
        gc.disable()
        try:
            before = sys.getallocatedblocks()
            answered = settling.answered_keys(ENDPOINT, 10.1)  # too soon: all settle
            made = sys.getallocatedblocks() - before
        finally:
            gc.enable()
        assert answered == []
        return steps, made

    small, big = cold_join(10), cold_join(5_000)
    assert big[0] == small[0]  # (the general path: a step or more per name)
    assert big[1] < 100  # (a due time per name was 5,000 floats)


def test_times_that_come_due_at_once_get_one_deadline() -> None:
    """Names subscribed at two times that the grace makes one due time (the
    sum rounds alike) settle on one deadline, as when each name's due time
    was kept: the deadlines are grouped by due time, not by subscription."""
    later = math.nextafter(1.0, 2.0)
    assert later + 8.0 == 9.0 and later != 1.0  # (the premise)
    deadlines = Deadlines()
    settling = Settling(8.0, deadlines)
    settling.subscribed_all(ENDPOINT, {"a": PLAIN}, 1.0)
    settling.subscribed_all(ENDPOINT, {"b": PLAIN}, later)
    assert settling.on_response(ENDPOINT, 2.0) == []
    assert len(deadlines) == 1
    assert settling.due(9.0) == {ENDPOINT: [Locator("a"), Locator("b")]}
