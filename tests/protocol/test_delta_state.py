"""DeltaSubscription as a pure state machine: requests and cache changes in, plans out."""

from __future__ import annotations

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.protocol import subscription
from relay.protocol.delta import DeltaSubscription, split_request
from relay.protocol.subscription import MAX_NAMES_PER_RESPONSE
from relay.protocol.view import NonceSource
from relay.xds_types import CLUSTER, ENDPOINT
from tests.protocol.fakes import FakeView

Req = discovery_pb2.DeltaDiscoveryRequest


def setup(type_url: str = CLUSTER, **resources: str) -> tuple[DeltaSubscription, FakeView,
                                                             NonceSource]:
    view = FakeView(type_url, resources)
    return DeltaSubscription(type_url), view, NonceSource()


def test_invariant_1_first_empty_request_is_wildcard_and_always_answered() -> None:
    state, view, nonces = setup()
    state.on_request(Req(type_url=CLUSTER))
    plan = state.next_response(view, nonces)
    assert plan is not None and plan.resources == [] and plan.removed == [] and plan.nonce
    assert state.snapshot().wildcard


def test_invariant_1_empty_first_request_for_endpoints_is_not_wildcard() -> None:
    state, view, nonces = setup(ENDPOINT, a="1")
    state.on_request(Req(type_url=ENDPOINT))
    assert not state.snapshot().wildcard
    assert state.next_response(view, nonces) is None


def test_invariant_1_explicit_star_makes_any_type_wildcard() -> None:
    state, view, nonces = setup(ENDPOINT, a="1")
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["*"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == ["a"]


def test_invariant_2_empty_subscribe_after_names_does_not_switch_wildcard_on() -> None:
    state, view, nonces = setup(a="1", b="1")
    state.on_request(Req(type_url=CLUSTER, resource_names_subscribe=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce))
    assert not state.snapshot().wildcard
    assert state.next_response(view, nonces) is None


def test_invariant_2_unsubscribing_star_keeps_named_resources_flowing() -> None:
    state, view, nonces = setup(a="1", b="1")
    state.on_request(Req(type_url=CLUSTER, resource_names_subscribe=["*", "a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and sorted(r.name for r in plan.resources) == ["a", "b"]
    state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce,
                         resource_names_unsubscribe=["*"]))
    assert not state.snapshot().wildcard
    view.set("a", "2")
    view.set("b", "2")
    state.mark_changed(frozenset({"a", "b"}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == ["a"]


def test_invariant_3_unsubscribing_a_name_while_wildcard_resends_it() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER, resource_names_subscribe=["*", "a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce,
                         resource_names_unsubscribe=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == ["a"]


def test_invariant_3_unsubscribing_a_gone_name_while_wildcard_reports_it_removed() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER, resource_names_subscribe=["*", "a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    view.delete("a")
    state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce,
                         resource_names_unsubscribe=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and plan.resources == [] and plan.removed == ["a"]


def test_invariant_4_subscribed_name_is_sent_even_if_client_should_hold_it() -> None:
    state, view, nonces = setup(ENDPOINT, a="1")
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Req(type_url=ENDPOINT, response_nonce=plan.nonce,
                         resource_names_subscribe=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == ["a"]


def test_invariant_5_initial_versions_skip_unchanged_and_remove_gone() -> None:
    state, view, nonces = setup(a="1", b="2")
    view.complete = True
    state.on_request(Req(type_url=CLUSTER, initial_resource_versions={
        "a": "1", "b": "1", "c": "1"}))
    plan = state.next_response(view, nonces)
    assert plan is not None
    assert [(r.name, r.version) for r in plan.resources] == [("b", "2")]
    assert plan.removed == ["c"]


def test_invariant_6_missing_name_is_reported_and_subscription_kept() -> None:
    state, view, nonces = setup(ENDPOINT)
    view.delete("x")
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["x"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and plan.removed == ["x"] and plan.resources == []
    state.on_request(Req(type_url=ENDPOINT, response_nonce=plan.nonce))
    view.set("x", "1")
    state.mark_changed(frozenset({"x"}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == ["x"]


def test_unknown_names_wait_for_the_origin() -> None:
    state, view, nonces = setup(ENDPOINT)
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["x"]))
    assert state.next_response(view, nonces) is None


def test_invariant_8_nonces_are_unique_and_names_not_repeated() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER))
    seen = set()
    for version in "2345":
        plan = state.next_response(view, nonces)
        assert plan is not None and plan.nonce not in seen
        names = [r.name for r in plan.resources]
        assert len(names) == len(set(names)) and not set(names) & set(plan.removed)
        seen.add(plan.nonce)
        state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce))
        view.set("a", version)
        state.mark_changed(frozenset({"a"}), False)


def test_invariant_9_plain_ack_produces_nothing() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce))
    assert state.next_response(view, nonces) is None


def test_invariant_10_nack_recorded_and_same_versions_not_resent() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER))
    plan = state.next_response(view, nonces)
    assert plan is not None
    outcome = state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce,
                                   error_detail={"code": 3, "message": "no"}))
    assert outcome.nack is not None and outcome.nack.message == "no"
    assert state.snapshot().last_nack == outcome.nack
    assert state.next_response(view, nonces) is None
    view.set("a", "2")
    state.mark_changed(frozenset({"a"}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and plan.resources[0].version == "2"


def test_invariant_11_stale_nonce_still_changes_subscription() -> None:
    state, view, nonces = setup(ENDPOINT, a="1", b="1")
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    first = state.next_response(view, nonces)
    assert first is not None
    state.on_request(Req(type_url=ENDPOINT, response_nonce="stale",
                         resource_names_subscribe=["b"]))
    assert "b" in state.snapshot().subscribed
    assert state.next_response(view, nonces) is None  # first is still un-ACKed
    state.on_request(Req(type_url=ENDPOINT, response_nonce=first.nonce))
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == ["b"]


def test_invariant_21_one_response_in_flight_and_changes_coalesce() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER))
    first = state.next_response(view, nonces)
    assert first is not None
    for version in "234":
        view.set("a", version)
        state.mark_changed(frozenset({"a"}), False)
        assert state.next_response(view, nonces) is None
    state.on_request(Req(type_url=CLUSTER, response_nonce=first.nonce))
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.version for r in plan.resources] == ["4"]


def test_not_synced_type_waits() -> None:
    state, view, nonces = setup()
    view.synced = False
    state.on_request(Req(type_url=CLUSTER))
    assert state.next_response(view, nonces) is None
    view.synced = True
    plan = state.next_response(view, nonces)
    assert plan is not None  # invariant 29: answered once synced


def test_changes_behind_an_unanswered_response_are_counted_as_coalesced() -> None:
    state, view, nonces = setup(a="1", b="1")
    state.on_request(Req(type_url=CLUSTER, resource_names_subscribe=["a", "b"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and state.snapshot().in_flight == plan.nonce
    # The first change behind the unanswered response waits; the next one
    # for the same name supersedes it.
    assert state.mark_changed(frozenset({"a"}), everything=False) == 0
    assert state.mark_changed(frozenset({"a", "b"}), everything=False) == 1
    assert state.mark_changed(frozenset({"a", "b"}), everything=False) == 2
    state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce))
    assert state.snapshot().in_flight is None
    # Nothing in flight: a change goes out with the next response, nothing lost.
    assert state.mark_changed(frozenset({"a"}), everything=False) == 0
    view.set("a", "2")
    plan = state.next_response(view, nonces)
    assert plan is not None and state.snapshot().in_flight == plan.nonce
    # A name subscribed behind the unanswered response waits too, but its
    # first change supersedes nothing.
    state.on_request(Req(type_url=CLUSTER, resource_names_subscribe=["c"]))
    assert state.mark_changed(frozenset({"c"}), everything=False) == 0


def test_invariant_7_new_content_under_an_unchanged_version_is_sent() -> None:
    state, view, nonces = setup(ENDPOINT, a="1")
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Req(type_url=ENDPOINT, response_nonce=plan.nonce))
    view.set("a", "1", body=b"\x0a\x01x")  # the origin changed it but not its version
    state.mark_changed(frozenset({"a"}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == ["a"]
    state.on_request(Req(type_url=ENDPOINT, response_nonce=plan.nonce))
    view.set("a", "1", body=b"\x0a\x01x")  # a resend of the same: nothing to send
    state.mark_changed(frozenset({"a"}), False)
    assert state.next_response(view, nonces) is None


def test_invariant_5_a_declared_version_vouches_for_whatever_content_it_names() -> None:
    # A reconnecting client declares versions only: an equal one is trusted
    # (derived versions name their content; an origin's are its word).
    state, view, nonces = setup(ENDPOINT, a="1")
    view.set("a", "1", body=b"\x0a\x01y")
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["a"],
                         initial_resource_versions={"a": "1"}))
    assert state.next_response(view, nonces) is None


def test_a_big_subscription_comes_in_responses_of_bounded_size_each_acked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # (a page per response: see tests/server/test_big_pages.py for pages sent whole)
    monkeypatch.setattr(subscription, "MAX_NAMES_PER_WHOLE_PAGE", MAX_NAMES_PER_RESPONSE)
    count = MAX_NAMES_PER_RESPONSE + 10
    state, view, nonces = setup(ENDPOINT, **{f"n{i:05}": "1" for i in range(count)})
    state.on_request(Req(type_url=ENDPOINT,
                         resource_names_subscribe=[f"n{i:05}" for i in range(count)]))
    first = state.next_response(view, nonces)
    assert first is not None and len(first.resources) == MAX_NAMES_PER_RESPONSE
    assert state.next_response(view, nonces) is None  # one in flight at a time
    state.on_request(Req(type_url=ENDPOINT, response_nonce=first.nonce))
    second = state.next_response(view, nonces)
    assert second is not None and [r.name for r in second.resources] == \
        [f"n{i:05}" for i in range(MAX_NAMES_PER_RESPONSE, count)]


def test_a_request_naming_too_many_names_is_split_into_pieces_that_say_the_same() -> None:
    request = Req(type_url=ENDPOINT, node={"id": "n"}, response_nonce="4",
                  initial_resource_versions={"a0": "1"},
                  resource_names_subscribe=[f"a{i}" for i in range(12)],
                  resource_names_unsubscribe=["x", "y", "z"])
    pieces = split_request(request, limit=5)
    assert [(list(p.resource_names_subscribe), list(p.resource_names_unsubscribe))
            for p in pieces] == [
        ([f"a{i}" for i in range(5)], []), ([f"a{i}" for i in range(5, 10)], []),
        (["a10", "a11"], ["x", "y", "z"])]
    assert pieces[0].node.id == "n" and pieces[0].response_nonce == "4"
    assert dict(pieces[0].initial_resource_versions) == {"a0": "1"}
    assert all(p.type_url == ENDPOINT and not p.HasField("node") and not p.response_nonce
               for p in pieces[1:])
    assert split_request(request, limit=15) == [request]


def test_a_split_requests_first_piece_keeps_every_field_but_the_name_lists() -> None:
    """The first piece is built field by field (not copied whole): every field
    the client set that is not a name list is there, as sent, NACK included."""
    request = Req(type_url=ENDPOINT, response_nonce="7", initial_resource_versions={"a": "1"},
                  resource_names_subscribe=[f"a{i}" for i in range(4)],
                  resource_names_unsubscribe=["x"])
    request.node.id = "n"
    request.node.metadata.fields["k"].string_value = "v"
    request.error_detail.code = 3
    request.error_detail.message = "bad cluster"
    request.resource_locators_subscribe.add(name="l1")
    request.resource_locators_unsubscribe.add(name="l2")
    expected = Req()
    expected.CopyFrom(request)
    for names in ("resource_names_subscribe", "resource_locators_subscribe",
                  "resource_names_unsubscribe", "resource_locators_unsubscribe"):
        expected.ClearField(names)
    first = split_request(request, limit=2)[0]
    assert list(first.resource_names_subscribe) == ["a0", "a1"]
    first.ClearField("resource_names_subscribe")
    assert first == expected


def test_names_subscribed_while_a_big_subscription_is_under_way_come_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # (a page per response: see tests/server/test_big_pages.py for pages sent whole)
    monkeypatch.setattr(subscription, "MAX_NAMES_PER_WHOLE_PAGE", MAX_NAMES_PER_RESPONSE)
    limit = MAX_NAMES_PER_RESPONSE
    first = [f"a{i:05}" for i in range(limit + 5)]
    later = [f"b{i:05}" for i in range(limit + 1)]
    state, view, nonces = setup(ENDPOINT, **dict.fromkeys(first + later, "1"))
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=first))
    plan = state.next_response(view, nonces)
    assert plan is not None and len(plan.resources) == limit
    state.on_request(Req(type_url=ENDPOINT, response_nonce=plan.nonce,
                         resource_names_subscribe=later))
    sent: list[str] = []
    while (plan := state.next_response(view, nonces)) is not None:
        assert len(plan.resources) <= limit  # however many wait
        sent += [r.name for r in plan.resources]
        state.on_request(Req(type_url=ENDPOINT, response_nonce=plan.nonce))
    # The new names first (sorted), then what the first response had no room for.
    assert sent == later + first[limit:]


def test_invariant_19_nothing_for_an_unrequested_type() -> None:
    state, view, nonces = setup(ENDPOINT, a="1")
    state.mark_changed(frozenset({"a"}), True)
    assert not state.has_work()  # no request yet: nothing is due, whatever changed
    assert state.next_response(view, nonces) is None


def test_a_nack_marks_the_type_rejected_until_an_ack() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER))
    first = state.next_response(view, nonces)
    assert first is not None and not state.rejected
    state.on_request(Req(type_url=CLUSTER, response_nonce=first.nonce,
                         error_detail={"code": 3, "message": "no"}))
    assert state.rejected
    view.set("a", "2")
    state.mark_changed(frozenset({"a"}), False)
    second = state.next_response(view, nonces)
    assert second is not None
    state.on_request(Req(type_url=CLUSTER, response_nonce=second.nonce))
    assert not state.rejected


def test_a_request_in_pieces_adds_each_piece_to_what_waits_in_place() -> None:
    """A client of 100,000 names is applied in 50 pieces: what waits for an
    answer grows by each piece's names, never copied whole per piece (the
    copies made the pieces O(n^2): 100,000 names 166 ms, now 62)."""
    names = [f"n{i:06}" for i in range(5 * 2_000)]
    state = DeltaSubscription(ENDPOINT)
    waiting = []
    request = discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT,
                                                  resource_names_subscribe=names)
    for piece in split_request(request):
        state.on_request(piece)
        waiting.append(state._unanswered)
    assert len(waiting) == 5 and all(w is waiting[0] for w in waiting)
    assert waiting[0] == set(names)
