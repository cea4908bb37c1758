"""Paged responses never leave a stream idle with names still waiting.

A subscription of more than MAX_NAMES_PER_RESPONSE names is answered a page
at a time, each after the ACK of the one before. A page may hold nothing to
send: its names were marked changed again (an origin resending them, a
glob's members arriving after the collection was expanded) while the client
already holds them as they are. The state must then look at the next page at
once; before, it returned no response and the stream slept with thousands of
names never sent (found by benchmarks.federation: 37 of 100 glob subscribers
stalled; the "never answered" names of benchmarks.memory).
"""

from __future__ import annotations

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.protocol import subscription
from relay.protocol.delta import DeltaSubscription
from relay.protocol.sotw import SotwSubscription
from relay.protocol.subscription import MAX_NAMES_PER_RESPONSE
from relay.protocol.view import NonceSource
from relay.xds_types import ENDPOINT
from tests.protocol.fakes import FakeView

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest
GLOB = "xdstp://auth/envoy.config.endpoint.v3.ClusterLoadAssignment/pool/*"
COUNT = 4 * MAX_NAMES_PER_RESPONSE


@pytest.fixture(autouse=True)
def _a_page_per_response(monkeypatch: pytest.MonkeyPatch) -> None:
    """Delta responses of a page each: pages a client holds none of are
    otherwise sent several at once (tests/server/test_big_pages.py)."""
    monkeypatch.setattr(subscription, "MAX_NAMES_PER_WHOLE_PAGE", MAX_NAMES_PER_RESPONSE)


def delta_until_idle(state: DeltaSubscription, view: FakeView, nonces: NonceSource,
                     first: discovery_pb2.DeltaDiscoveryResponse | None = None
                     ) -> tuple[set[str], int]:
    """Every name sent, ACKing each response, until there is none; and how many."""
    sent: set[str] = set()
    responses = 0
    while (plan := state.next_response(view, nonces)) is not None:
        responses += 1
        sent |= {r.name for r in plan.resources}
        state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce))
    return sent, responses


def test_a_page_of_names_held_unchanged_does_not_stall_a_glob_subscriber() -> None:
    members = [GLOB[:-1] + f"m{i:05}" for i in range(COUNT)]
    state, view, nonces = DeltaSubscription(ENDPOINT), FakeView(
        ENDPOINT, dict.fromkeys(members, "1")), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[GLOB]))
    plan = state.next_response(view, nonces)
    assert plan is not None and len(plan.resources) == MAX_NAMES_PER_RESPONSE
    # the members arrive from the origin: every one of them is marked changed
    state.mark_changed(frozenset(members), False)
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce))
    sent, responses = delta_until_idle(state, view, nonces)
    assert sent | {r.name for r in plan.resources} == set(members)
    assert responses == 3 and not state.has_work()


def test_a_page_of_plain_names_held_unchanged_does_not_stall_a_stream() -> None:
    names = [f"n{i:05}" for i in range(COUNT)]
    state, view, nonces = DeltaSubscription(ENDPOINT), FakeView(
        ENDPOINT, dict.fromkeys(names, "1")), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names))
    plan = state.next_response(view, nonces)
    assert plan is not None
    first = {r.name for r in plan.resources}
    state.mark_changed(frozenset(first), False)  # resent unchanged by the origin
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce))
    sent, _ = delta_until_idle(state, view, nonces)
    assert sent == set(names) - first
    assert not state.has_work()


def test_a_name_marked_again_while_it_waits_waits_once() -> None:
    names = [f"n{i:05}" for i in range(COUNT)]
    state, view, nonces = DeltaSubscription(ENDPOINT), FakeView(
        ENDPOINT, dict.fromkeys(names, "1")), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names))
    plan = state.next_response(view, nonces)
    assert plan is not None
    for _ in range(3):  # marked again and again while waiting
        state.mark_changed(frozenset(names), False)
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce))
    state.next_response(view, nonces)
    backlog = state._backlog or []
    assert len(backlog) == len(set(backlog))


def test_sotw_pages_of_names_held_unchanged_do_not_stall_a_stream() -> None:
    names = [f"n{i:05}" for i in range(COUNT)]
    state, view, nonces = SotwSubscription(ENDPOINT), FakeView(
        ENDPOINT, dict.fromkeys(names, "1")), NonceSource()
    state.on_request(Sotw(type_url=ENDPOINT, resource_names=names))
    plan = state.next_response(view, nonces)
    assert plan is not None
    sent = {r.name for r in plan.resources}
    state.mark_changed(frozenset(sent), False)
    while plan is not None:
        state.on_request(Sotw(type_url=ENDPOINT, resource_names=names,
                              response_nonce=plan.nonce, version_info=plan.version_info))
        plan = state.next_response(view, nonces)
        if plan is not None:
            sent |= {r.name for r in plan.resources}
    assert sent == set(names) and not state.has_work()


def test_a_collection_marked_again_mid_paging_does_not_stall_its_last_page() -> None:
    """The collection's own name marked (its answer settling) expands it to
    every member again on a page: more names wait than before, and paging
    must still go on to the last page."""
    members = [GLOB[:-1] + f"m{i:05}" for i in range(COUNT)]
    state, view, nonces = DeltaSubscription(ENDPOINT), FakeView(
        ENDPOINT, dict.fromkeys(members, "1")), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[GLOB]))
    sent: set[str] = set()
    for _ in range(3):
        plan = state.next_response(view, nonces)
        assert plan is not None
        sent |= {r.name for r in plan.resources}
        state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce))
    assert len(sent) == COUNT - MAX_NAMES_PER_RESPONSE
    state.mark_changed(frozenset({GLOB}), False)
    rest, _ = delta_until_idle(state, view, nonces)
    assert sent | rest == set(members) and not state.has_work()
