"""The fan-out's fast paths: a push of one changed resource, and its plain ACK
(and SotW's ACK, which names the whole subscription again).

Each stream of a fan-out gets one changed resource per update and ACKs it.
:meth:`DeltaSubscription._one_changed
<relay.protocol.delta.DeltaSubscription._one_changed>` builds that response
without the general page, and :meth:`DeltaSubscription.on_reply
<relay.protocol.delta.DeltaSubscription.on_reply>` takes the ACK without the
session's checks of names and interest. These tests count that the general
work is skipped, and hold both fast paths to what the general path gives:
the same bytes, outcomes, interest and snapshots, over histories that take
the fast path and ones that must leave it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.protocol.delta import DeltaSubscription
from relay.protocol.limits import LimitExceeded, Limits
from relay.protocol.session import Session
from relay.protocol.sotw import SotwSubscription
from relay.protocol.subscription import SubscriptionState
from relay.server.plans import encode_plan
from tests.protocol.fakes import FakeView

EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
Delta = discovery_pb2.DeltaDiscoveryRequest


def _counted(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> list[int]:
    """Count the calls of ``owner.name`` (a method), which still runs."""
    calls = [0]
    method = getattr(owner, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return method(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


def _subscribed(view: FakeView, names: list[str]) -> tuple[Session, str]:
    """A delta session of ``names``, answered and ACKed; the last nonce."""
    session = Session("delta")
    session.receive(Delta(type_url=EDS, resource_names_subscribe=names))
    [plan] = session.due(view).responses
    session.receive(Delta(type_url=EDS, response_nonce=plan.nonce))
    return session, plan.nonce


def test_a_push_of_one_change_and_its_ack_skip_the_general_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    view = FakeView(EDS, {"a": "1", "b": "1"})
    session, _ = _subscribed(view, ["a", "b"])
    pages = _counted(monkeypatch, DeltaSubscription, "_next_page")
    candidates = _counted(monkeypatch, SubscriptionState, "_take_candidates")
    checks = _counted(monkeypatch, Session, "_check_names")
    sizes = _counted(monkeypatch, Session, "_check_locator_sizes")
    interest = _counted(monkeypatch, SubscriptionState, "take_interest_change")
    for version in ("2", "3", "4"):
        view.set("a", version)
        session.mark_changed(EDS, frozenset(["a"]), False)
        [plan] = session.due(view).responses
        assert [(r.name, r.version) for r in plan.resources] == [("a", version)]
        received = session.receive(Delta(type_url=EDS, response_nonce=plan.nonce))
        assert received.outcome.ack_nonce == plan.nonce and received.interest == []
    assert (pages, candidates, checks, sizes, interest) == ([0], [0], [0], [0], [0])
    # Two names changed at once: the general page.
    view.set("a", "5")
    view.set("b", "5")
    session.mark_changed(EDS, frozenset(["a", "b"]), False)
    [plan] = session.due(view).responses
    assert [r.name for r in plan.resources] == ["a", "b"]
    assert (pages, candidates) == ([1], [1])


def test_a_request_that_subscribes_is_checked_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    view = FakeView(EDS, {"a": "1", "b": "1"})
    session, nonce = _subscribed(view, ["a"])
    checks = _counted(monkeypatch, Session, "_check_names")
    received = session.receive(Delta(type_url=EDS, response_nonce=nonce,
                                     resource_names_subscribe=["b"]))
    assert checks == [1] and received.outcome.interest_changed


def _history(view: FakeView) -> Iterator[tuple[str, Callable[[Session], Any]]]:
    """Steps on a stream (named, for the failure message), each given the session."""
    def change(*names: str, version: str) -> Callable[[Session], Any]:
        def step(session: Session) -> Any:
            for name in names:
                view.set(name, version)
            return session.mark_changed(EDS, frozenset(names), False)
        return step

    def delete(name: str) -> Callable[[Session], Any]:
        def step(session: Session) -> Any:
            view.delete(name)
            return session.mark_changed(EDS, frozenset([name]), False)
        return step

    def unchanged(name: str) -> Callable[[Session], Any]:
        return lambda session: session.mark_changed(EDS, frozenset([name]), False)

    def request(**fields: Any) -> Callable[[Session], Any]:
        return lambda session: session.receive(Delta(type_url=EDS, **fields))

    error = discovery_pb2.ResourceError()
    error.resource_name.name = "c"
    error.error_detail.message = "origin says no"

    def origin_error(session: Session) -> Any:
        view.errors["c"] = error
        return session.mark_changed(EDS, frozenset(["c"]), False)

    yield "subscribe", request(resource_names_subscribe=["a", "b", "c", "gone"])
    yield "push a", change("a", version="2")
    yield "a again, unchanged", unchanged("a")
    yield "b removed", delete("b")
    yield "a resubscribed (sent again)", request(resource_names_subscribe=["a"])
    yield "a unchanged while in flight", change("a", version="3")
    yield "c's error", origin_error
    yield "c back, error gone", lambda session: view.errors.clear()
    yield "push c", change("c", version="4")
    yield "an unknown name", request(resource_names_subscribe=["unknown"])
    yield "push a twice", change("a", version="5")
    yield "push a, a do-not-cache copy", lambda session: (
        view.set("a", "6", do_not_cache=True),
        session.mark_changed(EDS, frozenset(["a"]), False))[1]
    yield "push c", change("c", version="7")
    yield "unsubscribe c", request(resource_names_unsubscribe=["c"])
    yield "push c, unsubscribed", change("c", version="8")
    yield "wildcard", request(resource_names_subscribe=["*"])
    yield "push b, by wildcard", change("b", version="9")


def _replay(nack_at: set[int]) -> list[Any]:
    """What a stream gives over :func:`_history`, its responses as bytes,
    replying to each (NACKing at the steps in ``nack_at``)."""
    view = FakeView(EDS, {"a": "1", "b": "1", "c": "1", "gone": "1"})
    session = Session("delta")
    seen: list[Any] = []
    for i, (what, step) in enumerate(_history(view)):
        result = step(session)
        if hasattr(result, "outcome"):
            seen.append((what, result.outcome, result.interest))
        else:
            seen.append((what, result))
        due = session.due(view)
        seen.append((what, [encode_plan(plan) for plan in due.responses], due.refetch))
        for plan in due.responses:
            reply = Delta(type_url=EDS, response_nonce=plan.nonce)
            if i in nack_at:
                reply.error_detail.message = "no"
            received = session.receive(reply)
            seen.append((what, received.outcome, received.interest))
            again = session.due(view)
            seen.append((what, [encode_plan(p) for p in again.responses], again.refetch))
            for later in again.responses:
                session.receive(Delta(type_url=EDS, response_nonce=later.nonce))
        seen.append((what, session.snapshot()))
    # a stale nonce, and no reply at all
    seen.append(session.receive(Delta(type_url=EDS, response_nonce="stale")).outcome)
    return seen


@pytest.mark.parametrize("nack_at", [set(), {1, 4, 8}])
def test_the_fast_paths_give_what_the_general_path_gives(
        monkeypatch: pytest.MonkeyPatch, nack_at: set[int]) -> None:
    taken = [0]
    one_changed = DeltaSubscription._one_changed

    def counting(*args: Any) -> Any:
        plan = one_changed(*args)
        taken[0] += plan is not None
        return plan

    monkeypatch.setattr(DeltaSubscription, "_one_changed", counting)
    fast = _replay(nack_at)
    assert taken[0] >= 5  # (the history takes the fast path, and leaves it)
    with monkeypatch.context() as general:
        general.setattr(DeltaSubscription, "_one_changed", lambda *args: None)
        general.setattr(DeltaSubscription, "on_reply", lambda *args: None)
        slow = _replay(nack_at)
    assert len(fast) == len(slow)
    for fast_step, slow_step in zip(fast, slow, strict=True):
        assert fast_step == slow_step


# -- SotW: an ACK carries the whole subscription ---------------------------------

Sotw = discovery_pb2.DiscoveryRequest


def test_a_sotw_ack_of_the_names_subscribed_skips_their_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    view = FakeView(EDS, {"a": "1", "b": "1"})
    session = Session("sotw", limits=Limits(names_per_request=3))
    session.receive(Sotw(type_url=EDS, resource_names=["a", "b"]))
    [plan] = session.due(view).responses
    checks = _counted(monkeypatch, Session, "_check_names")
    sizes = _counted(monkeypatch, Session, "_check_locator_sizes")
    interest = _counted(monkeypatch, SubscriptionState, "take_interest_change")
    received = session.receive(Sotw(type_url=EDS, resource_names=["b", "a"],
                                    response_nonce=plan.nonce, version_info=plan.version_info))
    assert received.outcome.ack_nonce == plan.nonce and received.interest == []
    assert (checks, sizes, interest) == ([0], [0], [0])
    # The same names, repeated past the limit: refused as before.
    with pytest.raises(LimitExceeded, match="names 4 resources; at most 3"):
        session.receive(Sotw(type_url=EDS, resource_names=["a", "b", "a", "b"],
                             response_nonce=plan.nonce))
    # Other names: checked.
    session.receive(Sotw(type_url=EDS, resource_names=["a"], response_nonce=plan.nonce))
    assert checks == [2]


def _sotw_replay(nack_at: set[int]) -> list[Any]:
    """A SotW stream's requests, responses (as bytes) and snapshots over a
    history of ACKs, NACKs, stale nonces and changes of names."""
    view = FakeView(EDS, {"a": "1", "b": "1", "c": "1"})
    session = Session("sotw")
    seen: list[Any] = []
    subscriptions = [["a", "b"], ["a", "b"], ["b", "a", "a"], ["a", "b", "c"], ["c"], [],
                     ["a", "*"], ["a", "*"], ["a", "b"], ["a", "b"]]
    nonce, version = "", ""
    for i, names in enumerate(subscriptions):
        request = Sotw(type_url=EDS, resource_names=names, response_nonce=nonce,
                       version_info=version)
        if i in nack_at:
            request.error_detail.message = "no"
        received = session.receive(request)
        seen.append((received.outcome, received.interest))
        seen.append(session.receive(Sotw(type_url=EDS, resource_names=names,
                                         response_nonce="stale")).outcome)
        view.set("a", f"{i + 2}")
        session.mark_changed(EDS, frozenset(["a"]), False)
        for plan in session.due(view).responses:
            seen.append(encode_plan(plan))
            nonce, version = plan.nonce, plan.version_info
        seen.append(session.snapshot())
    # Warming: after a cluster push, an endpoint request that looks like a
    # plain ACK is answered in full.
    clusters = FakeView(CDS, {"x": "1"})
    session.receive(Sotw(type_url=CDS, resource_names=["x"]))
    [cluster_plan] = session.due(clusters).responses
    seen.append(encode_plan(cluster_plan))
    received = session.receive(Sotw(type_url=EDS, resource_names=["a", "b"],
                                    response_nonce=nonce, version_info=version))
    seen.append((received.outcome, received.interest))
    seen.extend(encode_plan(plan) for plan in session.due(view).responses)
    seen.append(session.snapshot())
    return seen


@pytest.mark.parametrize("nack_at", [set(), {2, 3}])
def test_the_sotw_fast_ack_gives_what_the_general_path_gives(
        monkeypatch: pytest.MonkeyPatch, nack_at: set[int]) -> None:
    taken = [0]
    on_reply = SotwSubscription.on_reply

    def counting(*args: Any) -> Any:
        outcome = on_reply(*args)
        taken[0] += outcome is not None
        return outcome

    monkeypatch.setattr(SotwSubscription, "on_reply", counting)
    fast = _sotw_replay(nack_at)
    assert taken[0] >= 5
    with monkeypatch.context() as general:
        general.setattr(SotwSubscription, "on_reply", lambda *args: None)
        slow = _sotw_replay(nack_at)
    assert fast == slow
