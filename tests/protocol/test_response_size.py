"""Responses sized for the client (``server.max_response_size``), with no I/O.

Resources get bodies of chosen sizes; each response is encoded as the stream
would send it, and its bytes compared with the limit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.protocol.delta import DeltaSubscription
from relay.protocol.session import SUPPORTS_RESOURCE_IN_SOTW, Session
from relay.protocol.sizing import ResponseBudget
from relay.protocol.snapshot import ResourceStatus
from relay.protocol.sotw import SotwSubscription, state_version
from relay.protocol.view import NonceSource
from relay.resource import CachedResource
from relay.server.plans import encode_plan
from relay.xds_types import CLUSTER, ENDPOINT, ROUTE
from tests.protocol.fakes import FakeView

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest

BODY = 1_000  # bytes of each resource's body
# Three resources of BODY fit, four do not (the head takes far less than the slack).
LIMIT = 3 * (BODY + 20) + 500


def view_of(type_url: str, count: int, body: int = BODY, **sized: int) -> FakeView:
    """``count`` resources n00, n01, ... of ``body`` bytes, and ``sized`` ones of their own."""
    view = FakeView(type_url, {})
    for i in range(count):
        view.set(f"n{i:02}", "1", body=b"x" * body)
    for name, size in sized.items():
        view.set(name, "1", body=b"x" * size)
    return view


# Three bare bodies of this size fit LIMIT with room to spare; three wrapped
# in Resource (name, version, TTL, an Any around it all) do not.
WRAPPED_BODY = 1_050


def three_fit_bare_only(view: FakeView) -> bool:
    """Whether three entries of n00 fit LIMIT bare (with room for the head),
    and three wrapped do not: what tells a wrong measure from the right one."""
    found = view.lookup(view.type_url, "n00", {})
    assert isinstance(found, CachedResource)
    return 3 * len(found.sotw_entry) + 150 <= LIMIT < 3 * len(found.sotw_wrapped_entry)


def delta_parts(state: DeltaSubscription, view: FakeView, nonces: NonceSource,
                max_size: int | None = LIMIT) -> list[Any]:
    """Every response due, each ACKed before the next is asked for."""
    parts = []
    while (plan := state.next_response(view, nonces, max_size)) is not None:
        assert state.next_response(view, nonces, max_size) is None  # one in flight
        parts.append(plan)
        state.on_request(Delta(type_url=state.snapshot().type_url, response_nonce=plan.nonce))
    return parts


def sotw_parts(state: SotwSubscription, view: FakeView, nonces: NonceSource,
               request: Callable[[], Sotw], max_size: int | None = LIMIT) -> list[Any]:
    parts = []
    while (plan := state.next_response(view, nonces, max_size)) is not None:
        assert state.next_response(view, nonces, max_size) is None
        parts.append(plan)
        ack = request()
        ack.response_nonce, ack.version_info = plan.nonce, plan.version_info
        state.on_request(ack)
    return parts


def names(plan: Any) -> list[str]:
    return [r.name for r in plan.resources]


# -- the budget -------------------------------------------------------------------


def test_the_first_entry_fits_however_large_and_then_only_what_is_left() -> None:
    budget = ResponseBudget(1_000, ENDPOINT)
    assert budget.take(5_000)  # alone: no split makes it smaller
    assert not budget.take(1)
    budget = ResponseBudget(1_000, ENDPOINT)
    assert budget.fitting([300, 300, 300, 300]) == 2  # the head takes its share
    assert not budget.take(300) and budget.take(100)


def test_without_a_limit_everything_fits() -> None:
    budget = ResponseBudget(None, ENDPOINT)
    assert budget.fitting([1 << 40] * 3) == 3


def test_an_entry_that_goes_regardless_counts_against_the_rest() -> None:
    budget = ResponseBudget(1_000, ENDPOINT)
    budget.count(800)
    assert not budget.take(300)


# -- delta ------------------------------------------------------------------------


def test_a_delta_subscription_larger_than_the_limit_comes_in_parts_each_within_it() -> None:
    view = view_of(ENDPOINT, 10)
    state, nonces = DeltaSubscription(ENDPOINT), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT,
                           resource_names_subscribe=[f"n{i:02}" for i in range(10)]))
    parts = delta_parts(state, view, nonces)
    assert [names(p) for p in parts] == [
        ["n00", "n01", "n02"], ["n03", "n04", "n05"], ["n06", "n07", "n08"], ["n09"]]
    assert all(len(encode_plan(p)) <= LIMIT for p in parts)
    assert len({p.nonce for p in parts}) == 4


def test_without_a_limit_a_delta_response_carries_everything() -> None:
    view = view_of(ENDPOINT, 10)
    state, nonces = DeltaSubscription(ENDPOINT), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT,
                           resource_names_subscribe=[f"n{i:02}" for i in range(10)]))
    assert [len(p.resources) for p in delta_parts(state, view, nonces, None)] == [10]


def test_a_resource_larger_than_the_limit_goes_alone() -> None:
    view = view_of(ENDPOINT, 0, a=BODY, b=5 * LIMIT, c=BODY)
    state, nonces = DeltaSubscription(ENDPOINT), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["a", "b", "c"]))
    parts = delta_parts(state, view, nonces)
    assert [names(p) for p in parts] == [["a"], ["b"], ["c"]]
    assert len(encode_plan(parts[1])) > LIMIT
    assert all(len(encode_plan(p)) <= LIMIT for p in (parts[0], parts[2]))


def test_names_waiting_for_a_later_part_are_not_taken_as_held() -> None:
    view = view_of(ENDPOINT, 4)
    state, nonces = DeltaSubscription(ENDPOINT), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT,
                           resource_names_subscribe=[f"n{i:02}" for i in range(4)]))
    first = state.next_response(view, nonces, LIMIT)
    assert first is not None and names(first) == ["n00", "n01", "n02"]
    statuses = {r.name: r.status for r in state.snapshot().resources}
    assert statuses == {"n00": ResourceStatus.SENT, "n01": ResourceStatus.SENT,
                        "n02": ResourceStatus.SENT, "n03": ResourceStatus.REQUESTED}
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=first.nonce))
    statuses = {r.name: r.status for r in state.snapshot().resources}
    assert statuses["n02"] is ResourceStatus.ACKED
    assert statuses["n03"] is ResourceStatus.REQUESTED
    assert state.snapshot().acked == first.nonce


def test_a_nacked_part_does_not_hold_back_the_rest() -> None:
    view = view_of(ENDPOINT, 4)
    state, nonces = DeltaSubscription(ENDPOINT), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT,
                           resource_names_subscribe=[f"n{i:02}" for i in range(4)]))
    first = state.next_response(view, nonces, LIMIT)
    assert first is not None
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=first.nonce,
                           error_detail={"code": 3, "message": "no"}))
    second = state.next_response(view, nonces, LIMIT)
    assert second is not None and names(second) == ["n03"]


def test_a_change_while_parts_are_under_way_goes_out_once_latest_wins() -> None:
    view = view_of(ENDPOINT, 7)
    state, nonces = DeltaSubscription(ENDPOINT), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT,
                           resource_names_subscribe=[f"n{i:02}" for i in range(7)]))
    first = state.next_response(view, nonces, LIMIT)
    assert first is not None and names(first) == ["n00", "n01", "n02"]
    view.set("n01", "2", body=b"y" * BODY)  # sent, changed again
    view.set("n05", "2", body=b"y" * BODY)  # not sent yet
    state.mark_changed(frozenset({"n01", "n05"}), False)
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=first.nonce))
    rest = delta_parts(state, view, nonces)
    sent = [(r.name, r.version) for p in rest for r in p.resources]
    assert sorted(sent) == [("n01", "2"), ("n03", "1"), ("n04", "1"), ("n05", "2"),
                            ("n06", "1")]
    assert all(len(encode_plan(p)) <= LIMIT for p in rest)


def test_removals_count_towards_the_limit() -> None:
    long = [f"{'r' * 1_000}{i}" for i in range(10)]
    view = FakeView(ENDPOINT, {})
    for name in long:
        view.delete(name)
    state, nonces = DeltaSubscription(ENDPOINT), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=long,
                           initial_resource_versions=dict.fromkeys(long, "1")))
    parts = delta_parts(state, view, nonces)
    assert [len(p.removed) for p in parts] == [3, 3, 3, 1]
    assert [name for p in parts for name in p.removed] == sorted(long)
    assert all(len(encode_plan(p)) <= LIMIT for p in parts)


def test_the_origins_errors_count_towards_the_limit() -> None:
    view = view_of(ENDPOINT, 3)
    view.errors["a"] = discovery_pb2.ResourceError(
        resource_name={"name": "a"}, error_detail={"code": 5, "message": "e" * 1_500})
    state, nonces = DeltaSubscription(ENDPOINT), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["a", "n00", "n01",
                                                                        "n02"]))
    parts = delta_parts(state, view, nonces)
    assert [(len(p.errors), names(p)) for p in parts] == [(1, ["n00"]), (0, ["n01", "n02"])]
    assert all(len(encode_plan(p)) <= LIMIT for p in parts)


def test_heartbeats_beyond_the_limit_wait_for_the_next_response() -> None:
    view = FakeView(ENDPOINT, {})
    # A heartbeat carries the name, not the body: names make them large.
    beating = [f"{'h' * 400}{i:02}" for i in range(12)]
    for name in beating:
        view.set(name, "1", body=b"x" * 10, ttl=30)
    state, nonces = DeltaSubscription(ENDPOINT), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=beating))
    assert [len(p.resources) for p in delta_parts(state, view, nonces, None)] == [12]
    state.heartbeats_received(frozenset(beating))
    parts = delta_parts(state, view, nonces)
    assert len(parts) > 1 and all(not p.resources for p in parts)
    assert sorted(r.name for p in parts for r in p.heartbeats) == beating  # each once
    assert all(len(encode_plan(p)) <= LIMIT for p in parts)


def test_heartbeats_wait_behind_resources_that_did_not_fit() -> None:
    view = view_of(ENDPOINT, 5)
    view.set("beat", "1", body=b"x", ttl=30)
    state, nonces = DeltaSubscription(ENDPOINT), NonceSource()
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["beat"]))
    delta_parts(state, view, nonces)
    state.on_request(Delta(type_url=ENDPOINT,
                           resource_names_subscribe=[f"n{i:02}" for i in range(5)]))
    state.heartbeats_received(frozenset({"beat"}))
    parts = delta_parts(state, view, nonces)
    assert [(names(p), [r.name for r in p.heartbeats]) for p in parts] == [
        (["n00", "n01", "n02"], []), (["n03", "n04"], ["beat"])]


# -- state of the world -----------------------------------------------------------


def test_sotw_endpoints_come_in_parts_whose_versions_say_what_the_client_holds() -> None:
    view = view_of(ENDPOINT, 7)
    state, nonces = SotwSubscription(ENDPOINT), NonceSource()
    wanted = [f"n{i:02}" for i in range(7)]
    state.on_request(Sotw(type_url=ENDPOINT, resource_names=wanted))
    parts = sotw_parts(state, view, nonces, lambda: Sotw(type_url=ENDPOINT,
                                                         resource_names=wanted))
    assert [names(p) for p in parts] == [wanted[:3], wanted[3:6], wanted[6:]]
    assert all(len(encode_plan(p)) <= LIMIT for p in parts)
    held: dict[str, Any] = {}
    for part in parts:
        held.update({r.name: r for r in part.resources})
        assert part.version_info == state_version(held)
    assert state.snapshot().acked == parts[-1].version_info


def test_sotw_routes_wrapped_for_a_locator_are_measured_wrapped() -> None:
    view = view_of(ROUTE, 3, WRAPPED_BODY)
    assert three_fit_bare_only(view)
    state, nonces = SotwSubscription(ROUTE), NonceSource()
    locators = [{"name": f"n{i:02}", "dynamic_parameters": {"k": "v"}} for i in range(3)]
    request = lambda: Sotw(type_url=ROUTE, resource_locators=locators)  # noqa: E731
    state.on_request(request())
    parts = sotw_parts(state, view, nonces, request)
    assert [len(p.resources) for p in parts] == [2, 1] and all(p.wrapped for p in parts)
    assert all(len(encode_plan(p)) <= LIMIT for p in parts)


def test_full_state_clusters_are_never_split() -> None:
    view = view_of(CLUSTER, 10)
    view.complete = True
    state, nonces = SotwSubscription(CLUSTER), NonceSource()
    state.on_request(Sotw(type_url=CLUSTER))
    parts = sotw_parts(state, view, nonces, lambda: Sotw(type_url=CLUSTER))
    assert [len(p.resources) for p in parts] == [10]
    assert len(encode_plan(parts[0])) > LIMIT


# -- the session ------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["delta", "sotw"])
def test_a_session_keeps_its_responses_within_max_response_size(protocol: Any) -> None:
    view = view_of(ENDPOINT, 10)
    session = Session(protocol, max_response_size=LIMIT)
    wanted = [f"n{i:02}" for i in range(10)]
    session.receive(Delta(type_url=ENDPOINT, resource_names_subscribe=wanted)
                    if protocol == "delta" else Sotw(type_url=ENDPOINT, resource_names=wanted))
    sent: list[str] = []
    while responses := session.due(view).responses:
        [plan] = responses
        assert len(encode_plan(plan)) <= LIMIT
        sent += names(plan)
        session.receive(Delta(type_url=ENDPOINT, response_nonce=plan.nonce)
                        if protocol == "delta" else
                        Sotw(type_url=ENDPOINT, resource_names=wanted,
                             response_nonce=plan.nonce, version_info=plan.version_info))
    assert sent == wanted


def test_a_session_without_a_limit_answers_whole_as_a_fetch_needs() -> None:
    view = view_of(ENDPOINT, 10)
    session = Session("sotw", ENDPOINT)
    session.receive(Sotw(type_url=ENDPOINT, resource_names=[f"n{i:02}" for i in range(10)]))
    [plan] = session.due(view).responses
    assert len(plan.resources) == 10


def test_a_ttl_aware_sotw_client_is_measured_with_its_wrappers() -> None:
    view = FakeView(ENDPOINT, {})
    for i in range(6):
        view.set(f"n{i:02}", "1", body=b"x" * WRAPPED_BODY, ttl=30)
    assert three_fit_bare_only(view)
    node = {"id": "n", "client_features": [SUPPORTS_RESOURCE_IN_SOTW]}
    session = Session("sotw", max_response_size=LIMIT)
    wanted = [f"n{i:02}" for i in range(6)]
    session.receive(Sotw(type_url=ENDPOINT, resource_names=wanted, node=node))
    sizes = []
    while responses := session.due(view).responses:
        [plan] = responses
        assert plan.wrapped
        sizes.append(len(encode_plan(plan)))
        session.receive(Sotw(type_url=ENDPOINT, resource_names=wanted,
                             response_nonce=plan.nonce, version_info=plan.version_info))
    assert len(sizes) == 3 and max(sizes) <= LIMIT
