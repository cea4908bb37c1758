"""Names new to a subscription, touched together (``SubscriptionState._touch_fresh``).

A big client's request pieces subscribe names the state holds none of: they
are the names themselves (no set made of them anew) and, nothing touched
since the interest index was last told, they are touched as one dict. These
tests hold it to the general path (the difference, the touched dict updated),
through any requests of either protocol, and count what it makes.
"""

from __future__ import annotations

import tracemalloc

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.constraints import EMPTY_PARAMS, params_of
from relay.protocol.delta import DeltaSubscription
from relay.protocol.sotw import SotwSubscription
from relay.protocol.subscription import SubscriptionState
from relay.protocol.view import NonceSource
from relay.xds_types import ENDPOINT
from tests.protocol.fakes import FakeView

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest
Locator = discovery_pb2.ResourceLocator

NAMES = [f"n{i}" for i in range(10)]
BIG = [f"cla-{i:05d}" for i in range(2_000)]


def general(self: SubscriptionState, names: set[str]) -> set[str]:
    """The general path: the difference, and the touched dict updated."""
    fresh = names - self._names
    self._touched.update(dict.fromkeys(fresh - self._touched.keys()))
    return fresh


def test_a_piece_of_new_names_is_touched_as_itself() -> None:
    state = DeltaSubscription(ENDPOINT)
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=BIG[:1_000]))
    state.take_interest_change()
    names = set(BIG[1_000:])
    tracemalloc.start()
    try:
        fresh = state._touch_fresh(names)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fresh is names  # (no set made of them)
    assert state._touched == dict.fromkeys(BIG[1_000:])
    # One dict made, its table the most of it: no set (a table as large) beside.
    made = dict.fromkeys(names)
    assert peak < made.__sizeof__() + set(names).__sizeof__() // 2


def test_names_subscribed_already_or_touched_take_the_general_path() -> None:
    state = DeltaSubscription(ENDPOINT)
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=BIG[:10]))
    state.take_interest_change()
    state._touched = {"x": None}
    fresh = state._touch_fresh(set(BIG[5:20]))
    assert fresh == set(BIG[10:20])
    assert state._touched == {"x": None, **dict.fromkeys(BIG[10:20])}


NAME = st.sampled_from([*NAMES, "*"])
STEP = st.one_of(
    st.tuples(st.just("subscribe"), st.lists(NAME, max_size=6),
              st.lists(st.sampled_from(NAMES), max_size=2)),
    st.tuples(st.just("unsubscribe"), st.lists(NAME, max_size=4), st.just([])),
    st.tuples(st.just("node"), st.lists(st.sampled_from(["a", "b"]), max_size=1), st.just([])),
    st.tuples(st.just("tell"), st.just([]), st.just([])),
    st.tuples(st.just("respond"), st.just([]), st.just([])),
)


def _run(delta: bool, steps: list[tuple[str, list[str], list[str]]]) -> list[object]:
    """Every interest change, response and snapshot of a state through ``steps``."""
    view = FakeView(ENDPOINT, {name: "1" for name in NAMES[::2]})
    state: SubscriptionState = DeltaSubscription(ENDPOINT) if delta else SotwSubscription(ENDPOINT)
    nonces, seen, sotw_names, nonce = NonceSource(), [], set(), ""
    for kind, names, locators in steps:
        if kind == "subscribe" and isinstance(state, DeltaSubscription):
            state.on_request(Delta(
                type_url=ENDPOINT, resource_names_subscribe=names, response_nonce=nonce,
                resource_locators_subscribe=[
                    Locator(name=n, dynamic_parameters={"env": "canary"}) for n in locators]))
        elif kind == "unsubscribe" and isinstance(state, DeltaSubscription):
            state.on_request(Delta(type_url=ENDPOINT, resource_names_unsubscribe=names))
        elif kind in ("subscribe", "unsubscribe") and isinstance(state, SotwSubscription):
            sotw_names = sotw_names | set(names) if kind == "subscribe" else sotw_names - set(names)
            state.on_request(Sotw(type_url=ENDPOINT, resource_names=sorted(sotw_names),
                                  response_nonce=nonce))
        elif kind == "node":
            state.set_node_params(params_of({"env": names[0]}) if names else EMPTY_PARAMS)
        elif kind == "tell":
            seen.append(state.take_interest_change())
        else:
            plan = state.next_response(view, nonces)
            if plan is not None:
                nonce = plan.nonce
                seen.append(([r.name for r in plan.resources], plan.nonce))
    seen.append(state.take_interest_change())
    return [*seen, state.snapshot(), dict(state._touched)]


@settings(max_examples=200, deadline=None)
@given(delta=st.booleans(), steps=st.lists(STEP, max_size=14))
def test_any_requests_see_what_the_general_path_sees(
        delta: bool, steps: list[tuple[str, list[str], list[str]]]) -> None:
    fast = _run(delta, steps)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(SubscriptionState, "_touch_fresh", general)
        assert _run(delta, steps) == fast
