"""SotwSubscription as a pure state machine."""

from __future__ import annotations

import hashlib

from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import code_pb2, status_pb2

from relay.protocol.held import Declared
from relay.protocol.sotw import SotwSubscription, held_term, state_version
from relay.protocol.view import NonceSource
from relay.resource import CachedResource
from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from tests.protocol.fakes import FakeView

Req = discovery_pb2.DiscoveryRequest


def setup(type_url: str = CLUSTER, **resources: str) -> tuple[SotwSubscription, FakeView,
                                                             NonceSource]:
    view = FakeView(type_url, resources)
    view.complete = type_url in (CLUSTER, LISTENER)
    return SotwSubscription(type_url), view, NonceSource()


def names(plan: object) -> list[str]:
    return [r.name for r in plan.resources]  # type: ignore[attr-defined]


def test_invariant_14_cluster_responses_list_every_resource() -> None:
    state, view, nonces = setup(a="1", b="1")
    state.on_request(Req(type_url=CLUSTER))
    plan = state.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a", "b"]
    state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce,
                         version_info=plan.version_info))
    view.set("b", "2")
    state.mark_changed(frozenset({"b"}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a", "b"]
    state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce))
    view.delete("a")
    state.mark_changed(frozenset({"a"}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and names(plan) == ["b"]


def test_invariant_14_endpoint_responses_carry_only_changes() -> None:
    state, view, nonces = setup(ENDPOINT, a="1", b="1")
    state.on_request(Req(type_url=ENDPOINT, resource_names=["a", "b"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a", "b"]
    state.on_request(Req(type_url=ENDPOINT, response_nonce=plan.nonce,
                         resource_names=["a", "b"]))
    view.set("b", "2")
    state.mark_changed(frozenset({"b"}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and names(plan) == ["b"]


def test_invariant_14_listener_named_subscription_waits_for_unknown_names() -> None:
    state, view, nonces = setup(LISTENER, a="1")
    view.complete = False
    state.on_request(Req(type_url=LISTENER, resource_names=["a", "x"]))
    assert state.next_response(view, nonces) is None  # "x" unknown: absence would delete
    view.delete("x")
    state.mark_changed(frozenset({"x"}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a"]


def test_invariant_15_version_changes_with_content_and_is_deterministic() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER))
    first = state.next_response(view, nonces)
    assert first is not None and first.version_info == state_version({"a": first.resources[0]})
    state.on_request(Req(type_url=CLUSTER, response_nonce=first.nonce))
    view.set("a", "2")
    state.mark_changed(frozenset({"a"}), False)
    second = state.next_response(view, nonces)
    assert second is not None and second.version_info != first.version_info


def test_invariant_15_the_version_kept_up_to_date_is_the_digest_of_what_is_held() -> None:
    state, view, nonces = setup(ENDPOINT, a="1", b="1", c="1")
    subscribed = ["a", "b", "c"]

    def respond(*changed: str) -> str:
        state.mark_changed(frozenset(changed), False)
        plan = state.next_response(view, nonces)
        assert plan is not None
        state.on_request(Req(type_url=ENDPOINT, response_nonce=plan.nonce,
                             resource_names=subscribed))
        return plan.version_info

    state.on_request(Req(type_url=ENDPOINT, resource_names=subscribed))
    assert respond() == state_version({n: view.lookup(ENDPOINT, n, frozenset())  # type: ignore
                                       for n in "abc"})
    view.set("b", "2")
    assert respond("b") == state_version({n: view.lookup(ENDPOINT, n, frozenset())  # type: ignore
                                          for n in "abc"})
    subscribed = ["a", "c"]  # b unsubscribed: no longer held
    view.set("c", "2")
    state.on_request(Req(type_url=ENDPOINT, response_nonce="2", resource_names=subscribed))
    assert respond("c") == state_version({n: view.lookup(ENDPOINT, n, frozenset())  # type: ignore
                                          for n in "ac"})


def test_invariant_15_foreign_version_on_new_stream_gets_full_resend() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER, version_info="from-another-relay",
                         response_nonce="other"))
    plan = state.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a"]


def test_invariant_16_stale_nonce_is_ignored() -> None:
    state, view, nonces = setup(ENDPOINT, a="1", b="1")
    state.on_request(Req(type_url=ENDPOINT, resource_names=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    outcome = state.on_request(Req(type_url=ENDPOINT, response_nonce="old",
                                   resource_names=["a", "b"]))
    assert outcome.ack_nonce is None and state.snapshot().subscribed == ("a",)
    assert state.next_response(view, nonces) is None


def test_invariant_16_first_request_is_initial_whatever_its_nonce() -> None:
    state, view, nonces = setup(ENDPOINT, a="1")
    state.on_request(Req(type_url=ENDPOINT, response_nonce="from-old-stream",
                         resource_names=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a"]


def test_invariant_17_empty_names_after_names_means_nothing() -> None:
    state, view, nonces = setup(ROUTE, a="1")
    state.on_request(Req(type_url=ROUTE, resource_names=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Req(type_url=ROUTE, response_nonce=plan.nonce, resource_names=[]))
    assert not state.snapshot().wildcard and state.snapshot().subscribed == ()
    view.set("a", "2")
    state.mark_changed(frozenset({"a"}), False)
    assert state.next_response(view, nonces) is None


def test_invariant_17_resubscribe_resends_at_unchanged_version() -> None:
    state, view, nonces = setup(ROUTE, a="1")
    state.on_request(Req(type_url=ROUTE, resource_names=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Req(type_url=ROUTE, response_nonce=plan.nonce, resource_names=[]))
    state.on_request(Req(type_url=ROUTE, response_nonce=plan.nonce, resource_names=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and names(plan) == ["a"]


def test_invariant_9_ack_produces_nothing() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER))
    plan = state.next_response(view, nonces)
    assert plan is not None
    outcome = state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce,
                                   version_info=plan.version_info))
    assert outcome.ack_nonce == plan.nonce and state.snapshot().acked == plan.version_info
    assert state.next_response(view, nonces) is None


def test_invariant_10_nack_does_not_cause_resend() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER))
    plan = state.next_response(view, nonces)
    assert plan is not None
    outcome = state.on_request(Req(type_url=CLUSTER, response_nonce=plan.nonce,
                                   error_detail={"message": "bad"}))
    assert outcome.nack is not None and state.snapshot().last_nack is not None
    assert state.next_response(view, nonces) is None


def test_invariant_21_one_in_flight_then_latest_state() -> None:
    state, view, nonces = setup(ENDPOINT, a="1")
    state.on_request(Req(type_url=ENDPOINT, resource_names=["a"]))
    first = state.next_response(view, nonces)
    assert first is not None
    for version in "234":
        view.set("a", version)
        state.mark_changed(frozenset({"a"}), False)
        assert state.next_response(view, nonces) is None
    state.on_request(Req(type_url=ENDPOINT, response_nonce=first.nonce,
                         resource_names=["a"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.version for r in plan.resources] == ["4"]


def test_invariant_19_nothing_for_an_unrequested_type() -> None:
    state, view, nonces = setup(ENDPOINT, a="1")
    state.mark_changed(frozenset({"a"}), True)
    assert not state.has_work()  # no request yet: nothing is due, whatever changed
    assert state.next_response(view, nonces) is None


def test_wildcard_cluster_with_nothing_cached_gets_empty_answer_once_synced() -> None:
    state, view, nonces = setup()
    view.synced = False
    state.on_request(Req(type_url=CLUSTER))
    assert state.next_response(view, nonces) is None  # invariant 29
    view.synced = True
    plan = state.next_response(view, nonces)
    assert plan is not None and plan.resources == []


def test_invariant_15_new_content_under_an_unchanged_version_changes_version_info() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER))
    first = state.next_response(view, nonces)
    assert first is not None
    state.on_request(Req(type_url=CLUSTER, response_nonce=first.nonce,
                         version_info=first.version_info))
    view.set("a", "1", body=b"\x0a\x01x")
    state.mark_changed(frozenset({"a"}), False)
    second = state.next_response(view, nonces)
    assert second is not None and names(second) == ["a"]
    assert second.version_info != first.version_info


def test_an_origin_error_held_back_while_a_full_state_response_waits_still_goes_out() -> None:
    # "a" is in error at the origin, "b" not known yet: the full-state
    # response waits for "b" (absence would delete it), and once it can go,
    # it carries the error for "a".
    state, view, nonces = setup(LISTENER)
    view.complete = False
    view.errors["a"] = discovery_pb2.ResourceError(
        resource_name=discovery_pb2.ResourceName(name="a"),
        error_detail=status_pb2.Status(code=code_pb2.UNAVAILABLE, message="a is broken"))
    state.on_request(Req(type_url=LISTENER, resource_names=["a", "b"]))
    assert state.next_response(view, nonces) is None
    view.set("b", "1")
    state.mark_changed(frozenset({"b"}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and names(plan) == ["b"]
    assert list(plan.errors) == [view.errors["a"]]


def test_a_nack_marks_the_type_rejected_until_an_ack() -> None:
    state, view, nonces = setup(a="1")
    state.on_request(Req(type_url=CLUSTER))
    first = state.next_response(view, nonces)
    assert first is not None and not state.rejected
    state.on_request(Req(type_url=CLUSTER, response_nonce=first.nonce,
                         error_detail={"message": "bad"}))
    assert state.rejected
    view.set("a", "2")
    state.mark_changed(frozenset({"a"}), False)
    second = state.next_response(view, nonces)
    assert second is not None
    state.on_request(Req(type_url=CLUSTER, response_nonce="stale"))
    assert state.rejected  # a stale nonce answers nothing
    state.on_request(Req(type_url=CLUSTER, response_nonce=second.nonce,
                         version_info=second.version_info))
    assert not state.rejected


def test_a_held_term_is_the_digest_of_its_parts_each_ended_by_nul() -> None:
    """A state's version must not change with the relay's code (replicas of
    two releases report the same one): a term is blake2b-64 of the name,
    version and variant key, each followed by NUL, then the content digest."""
    view = FakeView(ENDPOINT, {"é-name": "v7"})
    sent = view.lookup(ENDPOINT, "é-name", frozenset())
    assert isinstance(sent, CachedResource)
    for name, held in (("é-name", sent), ("alias", sent), ("declared", Declared("3"))):
        digest = hashlib.blake2b(digest_size=8)
        for part in (name, held.version, held.variant_key or ""):
            digest.update(part.encode() + b"\0")
        digest.update(held.digest or b"")
        assert held_term(name, held) == int.from_bytes(digest.digest(), "big")
