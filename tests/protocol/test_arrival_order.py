"""Names looked at in the order they were subscribed, then sorted.

A response looks at its candidate names sorted. Sorting a set of 10,000
names is a full sort; sorting them in the order the client listed them is a
pass or a few, as most clients list names in an order of their own (gRPC's
xDS client sorts them). The state keeps that order as a hint
(``SubscriptionState._sorted``), checked before use: these tests hold it to
the plain sort (the same responses, in the same order, for any requests)
and count the comparisons it saves.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.protocol import subscription
from relay.protocol.delta import DeltaSubscription
from relay.protocol.sotw import SotwSubscription
from relay.protocol.subscription import SubscriptionState
from relay.protocol.view import NonceSource
from relay.xds_types import ENDPOINT
from tests.protocol.fakes import FakeView

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest
Locator = discovery_pb2.ResourceLocator

NAMES = [f"n{i}" for i in range(12)]  # (n10 sorts before n2: runs, as generated names have)


class Counted(str):
    """A name that counts the comparisons a sort makes of it."""

    compared = 0

    def __lt__(self, other: str) -> bool:
        Counted.compared += 1
        return str.__lt__(self, other)


def _comparisons(names: list[str], listed: list[str]) -> int:
    """Comparisons made planning the first response to a delta client that
    subscribes ``listed`` (all of ``names``, which the view holds)."""
    view = FakeView(ENDPOINT, dict.fromkeys(names, "1"))
    state = DeltaSubscription(ENDPOINT)
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=listed),
                     [Counted(name) for name in listed])
    Counted.compared = 0
    plan = state.next_response(view, NonceSource())
    assert plan is not None and [r.name for r in plan.resources] == sorted(names)
    return Counted.compared


def test_names_listed_in_order_are_sorted_in_one_pass() -> None:
    names = [f"big-{i:05}" for i in range(2_000)]
    assert _comparisons(names, names) == len(names) - 1
    shuffled = random.Random(7).sample(names, len(names))
    assert _comparisons(names, shuffled) > 5 * len(names)  # (a full sort: n log n)


def test_a_sotw_client_s_names_listed_in_order_are_sorted_in_one_pass() -> None:
    names = [f"big-{i:05}" for i in range(2_000)]
    view = FakeView(ENDPOINT, dict.fromkeys(names, "1"))
    state = SotwSubscription(ENDPOINT)
    listed = [Counted(name) for name in names]
    state.on_request(Sotw(type_url=ENDPOINT, resource_names=names), listed)
    Counted.compared = 0
    plan = state.next_response(view, NonceSource())
    assert plan is not None and [r.name for r in plan.resources] == names
    assert Counted.compared == len(names) - 1


def test_generated_names_in_a_few_runs_cost_a_few_passes() -> None:
    names = [f"big-{i}" for i in range(2_000)]  # big-0 .. big-9, big-10 .. big-99, ...
    assert _comparisons(names, names) < 3 * len(names)


def test_a_request_in_pieces_keeps_its_order() -> None:
    names = [f"big-{i:05}" for i in range(1_000)]
    view = FakeView(ENDPOINT, dict.fromkeys(names, "1"))
    state = DeltaSubscription(ENDPOINT)
    for start in range(0, len(names), 250):
        piece = [Counted(name) for name in names[start:start + 250]]
        state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=piece), piece)
    Counted.compared = 0
    plan = state.next_response(view, NonceSource())
    assert plan is not None and [r.name for r in plan.resources] == names
    assert Counted.compared == len(names) - 1


@pytest.mark.parametrize("hint", [
    [["n1", "n2"], ["n2"]],  # a name twice, as many as the candidates
    [["n1", "n3"]],  # a name that is not a candidate
    [["n1"]],  # fewer
    [["n3", "n2", "n1", "n0"]],  # more
])
def test_a_hint_that_is_not_the_candidates_is_not_used(hint: list[list[str]]) -> None:
    state = SubscriptionState(ENDPOINT)
    state._arrival = list(hint)
    candidates = {"n0", "n1", "n2"}
    assert state._sorted(candidates) == ["n0", "n1", "n2"]
    assert state._arrival is None


# -- any requests: the same responses with the hint and without ------------------

NAME = st.sampled_from([*NAMES, "*"])
DELTA_STEP = st.one_of(
    st.tuples(st.just("subscribe"), st.lists(NAME, max_size=6),
              st.lists(st.sampled_from(NAMES), max_size=2)),
    st.tuples(st.just("unsubscribe"), st.lists(NAME, max_size=4), st.just([])),
    st.tuples(st.just("changed"), st.lists(st.sampled_from(NAMES), max_size=4), st.just([])),
    st.tuples(st.just("respond"), st.just([]), st.just([])),
)


def _with_and_without_hint(monkeypatch: pytest.MonkeyPatch,
                           run: Callable[[], list[object]]) -> tuple[list[object], list[object]]:
    hinted = run()
    with monkeypatch.context() as patched:
        patched.setattr(SubscriptionState, "_note_arrival",
                        lambda self, listed: setattr(self, "_arrival", None))
        plain = run()
    return hinted, plain


def _delta_run(steps: list[tuple[str, list[str], list[str]]], held: list[str]) -> list[object]:
    view = FakeView(ENDPOINT, {name: "1" for name in NAMES[::2]})
    state, nonces, seen = DeltaSubscription(ENDPOINT), NonceSource(), []
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=NAMES[3:9],
                           initial_resource_versions=dict.fromkeys(held, "0")))
    for kind, names, locators in steps:
        if kind == "subscribe":
            state.on_request(Delta(
                type_url=ENDPOINT, resource_names_subscribe=names,
                resource_locators_subscribe=[Locator(name=n) for n in locators]))
        elif kind == "unsubscribe":
            state.on_request(Delta(type_url=ENDPOINT, resource_names_unsubscribe=names))
        elif kind == "changed":
            for name in names:
                view.set(name, "2")
            state.mark_changed(frozenset(names), False)
        else:
            plan = state.next_response(view, nonces)
            if plan is not None:
                seen.append(([r.name for r in plan.resources], plan.removed, plan.nonce))
                state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce))
    return [*seen, state.snapshot()]


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(DELTA_STEP, max_size=12),
       held=st.lists(st.sampled_from(NAMES), max_size=3),
       page=st.integers(1, 5))
def test_delta_responses_are_those_of_the_plain_sort(
        steps: list[tuple[str, list[str], list[str]]], held: list[str], page: int) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        # (small pages: the order decides what each response carries)
        monkeypatch.setattr(subscription, "MAX_NAMES_PER_RESPONSE", page)
        monkeypatch.setattr(subscription, "MAX_NAMES_PER_WHOLE_PAGE", page)
        monkeypatch.setattr(subscription, "PREFETCH_FROM", 2)
        hinted, plain = _with_and_without_hint(monkeypatch, lambda: _delta_run(steps, held))
    assert hinted == plain


def _sotw_run(requests: list[list[str]]) -> list[object]:
    view = FakeView(ENDPOINT, {name: "1" for name in NAMES[1::2]})
    state, nonces, seen = SotwSubscription(ENDPOINT), NonceSource(), []
    nonce = ""
    for names in requests:
        state.on_request(Sotw(type_url=ENDPOINT, resource_names=names, response_nonce=nonce))
        while (plan := state.next_response(view, nonces)) is not None:
            seen.append(([r.name for r in plan.resources], plan.nonce))
            nonce = plan.nonce
            state.on_request(Sotw(type_url=ENDPOINT, resource_names=names,
                                  response_nonce=nonce, version_info=plan.version_info))
    return [*seen, state.snapshot()]


@settings(max_examples=100, deadline=None)
@given(requests=st.lists(st.lists(NAME, max_size=8), min_size=1, max_size=5),
       page=st.integers(1, 5))
def test_sotw_responses_are_those_of_the_plain_sort(requests: list[list[str]], page: int) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(subscription, "MAX_NAMES_PER_RESPONSE", page)
        monkeypatch.setattr(subscription, "PREFETCH_FROM", 2)
        hinted, plain = _with_and_without_hint(monkeypatch, lambda: _sotw_run(requests))
    assert hinted == plain


@given(chunks=st.lists(st.lists(st.sampled_from(NAMES), max_size=5), max_size=3),
       candidates=st.sets(st.sampled_from(NAMES)))
def test_the_sort_is_the_plain_sort_whatever_the_hint(chunks: list[list[str]],
                                                       candidates: set[str]) -> None:
    state = SubscriptionState(ENDPOINT)
    state._arrival = [*chunks] if chunks else None
    assert state._sorted(set(candidates)) == sorted(candidates)
