"""Settling on its own: when a subscribed locator counts as answered, without I/O."""

from __future__ import annotations

from relay.constraints import Locator, params_of
from relay.upstream.deadlines import Deadlines, SettleDue
from relay.upstream.settling import Settling
from relay.xds_types import CLUSTER, ENDPOINT
from tests.allocations import traced

GRACE = 0.5
A, B = Locator("a"), Locator("b")
DEV = Locator("c", params_of({"env": "dev"}))


def make() -> tuple[Settling, Deadlines]:
    deadlines = Deadlines()
    return Settling(GRACE, deadlines), deadlines


def test_a_response_grace_after_the_subscription_answers_it() -> None:
    settling, deadlines = make()
    settling.subscribed(ENDPOINT, [A, B], 10.0)
    assert settling.on_response(ENDPOINT, 10.0 + GRACE) == [A, B]
    assert len(deadlines) == 0


def test_locators_a_response_followed_too_soon_settle_together_on_one_deadline() -> None:
    settling, deadlines = make()
    settling.subscribed(ENDPOINT, [A, B], 10.0)
    settling.subscribed(ENDPOINT, [DEV], 10.25)
    assert settling.on_response(ENDPOINT, 10.1) == []
    assert len(deadlines) == 2  # one per moment, not one per locator
    assert deadlines.next(settling.stands) == 10.0 + GRACE
    assert settling.due(10.0 + GRACE) == {ENDPOINT: [A, B]}
    deadlines.drop_due(10.0 + GRACE)
    assert deadlines.next(settling.stands) == 10.25 + GRACE
    assert settling.due(10.25 + GRACE) == {ENDPOINT: [DEV]}
    assert settling.due(100.0) == {}


def test_an_unsubscribed_locator_never_settles_and_its_deadline_falls() -> None:
    settling, deadlines = make()
    settling.subscribed(CLUSTER, [DEV], 10.0)
    settling.on_response(CLUSTER, 10.1)
    assert settling.stands(SettleDue(CLUSTER, 10.0 + GRACE))
    settling.unsubscribed(CLUSTER, [DEV])
    assert not settling.stands(SettleDue(CLUSTER, 10.0 + GRACE))
    assert deadlines.next(settling.stands) is None
    assert settling.due(100.0) == {}


def test_a_new_stream_forgets_what_the_last_one_was_settling() -> None:
    settling, deadlines = make()
    settling.subscribed(CLUSTER, [A], 10.0)
    settling.on_response(CLUSTER, 10.1)
    settling.new_stream()
    assert deadlines.next(settling.stands) is None
    assert settling.unanswered_names(lambda _type_url, _locator: False) == {}


def test_unanswered_names_are_those_answered_nowhere_else_or_else_all_waiting() -> None:
    settling, _ = make()
    settling.subscribed(ENDPOINT, [A, B], 10.0)
    assert settling.unanswered_names(lambda _type_url, locator: locator == A) == \
        {ENDPOINT: {"b"}}
    assert settling.unanswered_names(lambda _type_url, _locator: True) == \
        {ENDPOINT: {"a", "b"}}


def test_a_plain_name_settling_costs_its_table_slots_not_a_locator() -> None:
    names = [f"made-up-{i}" for i in range(20_000)]
    settling, _ = make()
    with traced() as held:
        settling.subscribed(ENDPOINT, (Locator(name) for name in names), 10.0)
        unsettled = held() / len(names)
        settling.on_response(ENDPOINT, 10.1)  # too soon: they settle on a deadline
        waiting = held() / len(names)
    # A Locator kept for each cost 72 bytes more (56 with CPython's allocator).
    assert unsettled < 50 and waiting < 80, (unsettled, waiting)
    settled = settling.due(10.0 + GRACE)[ENDPOINT]
    assert settled[:2] == [Locator(names[0]), Locator(names[1])] and len(settled) == 20_000
    assert settling.unanswered_names(lambda _t, _l: False) == {}
