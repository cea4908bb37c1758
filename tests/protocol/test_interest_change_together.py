"""take_interest_change: a big subscribe of plain names, told in one operation.

A request subscribing to thousands of names the index does not know of for
this subscriber, none with a locator's parameters, is told to the interest
index as every name with the node's parameters, built at once
(``dict.fromkeys``), where the loop asks each name's parameters. It must say
what the loop says: checked against the loop's answer, and the asking counted.
"""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.constraints import EMPTY_PARAMS, Params, params_of
from relay.interest import InterestChange
from relay.protocol.delta import DeltaSubscription
from relay.protocol.sotw import SotwSubscription
from relay.protocol.subscription import SubscriptionState
from relay.xds_types import ENDPOINT

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest
NAMES = [f"cla-{i:05d}" for i in range(3_000)]
CANARY = params_of({"env": "canary"})


def loop_change(state: SubscriptionState, touched: dict[str, Params | None]) -> dict[str, Params]:
    """What the loop adds for ``touched`` (as take_interest_change did)."""
    return {name: state.params_for(name) for name, before in touched.items()
            if name in state._names and state.params_for(name) != before}


def counted_params_for(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    original = SubscriptionState.params_for

    def counting(self: SubscriptionState, name: str) -> Params:
        calls[0] += 1
        return original(self, name)

    monkeypatch.setattr(SubscriptionState, "params_for", counting)
    return calls


def test_a_big_delta_subscribe_is_told_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    state = DeltaSubscription(ENDPOINT)
    state.set_node_params(CANARY)
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=NAMES))
    expected = loop_change(state, dict(state._touched))
    asked = counted_params_for(monkeypatch)
    change = state.take_interest_change()
    assert change == InterestChange(added=expected)
    assert change.added == dict.fromkeys(NAMES, CANARY)
    assert asked[0] == 0
    assert state.take_interest_change() is None  # told once


def test_a_big_sotw_subscribe_is_told_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    state = SotwSubscription(ENDPOINT)
    state.on_request(Sotw(type_url=ENDPOINT, resource_names=NAMES))
    asked = counted_params_for(monkeypatch)
    change = state.take_interest_change()
    assert change is not None and change.added == dict.fromkeys(NAMES, EMPTY_PARAMS)
    assert asked[0] == 0


def locator(name: str) -> discovery_pb2.ResourceLocator:
    return discovery_pb2.ResourceLocator(name=name, dynamic_parameters={"env": "canary"})


@pytest.mark.parametrize(("second", "together"), [
    ("locators", False), ("unsubscribing", False), ("some again", True)])
def test_other_changes_say_what_the_loop_says(
        second: str, together: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    state = DeltaSubscription(ENDPOINT)
    state.on_request(Delta(type_url=ENDPOINT, node=base_pb2.Node(id="n"),
                           resource_names_subscribe=NAMES[:2_000]))
    state.take_interest_change()
    request = {
        "locators": Delta(type_url=ENDPOINT, resource_names_subscribe=NAMES[2_000:],
                          resource_locators_subscribe=[locator(NAMES[0]), locator("x")]),
        # (the names subscribed already are not touched: the new ones go together)
        "some again": Delta(type_url=ENDPOINT, resource_names_subscribe=NAMES[1_000:]),
        "unsubscribing": Delta(type_url=ENDPOINT, resource_names_subscribe=NAMES[2_000:],
                               resource_names_unsubscribe=NAMES[:10]),
    }[second]
    state.on_request(request)
    expected = loop_change(state, dict(state._touched))
    asked = counted_params_for(monkeypatch)
    change = state.take_interest_change()
    assert change is not None and dict(change.added) == expected
    assert (asked[0] == 0) is together
    if second == "unsubscribing":
        assert dict(change.removed) == dict.fromkeys(NAMES[:10], EMPTY_PARAMS)
    if second == "locators":
        assert change.added[NAMES[0]] == change.added["x"] == CANARY
        assert dict(change.removed) == {NAMES[0]: EMPTY_PARAMS}
    if second == "some again":
        assert dict(change.added) == dict.fromkeys(NAMES[2_000:], EMPTY_PARAMS)
