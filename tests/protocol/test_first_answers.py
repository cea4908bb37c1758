"""Session.first_answers_ready: when a stream's push need not wait for the
rest of the origin's burst (the batch window), with no I/O.

It may go at once only when what it would send is exactly the first
answers its client waits for, every one in the cache: nothing it holds
changed (an update or a removal keeps the window, invariant 20), and no
other type has anything marked. tests/e2e/test_first_answers.py runs the
same through a relay.
"""

from __future__ import annotations

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import Update
from relay.constraints import compile_constraints
from relay.protocol.session import Session
from relay.resource import CachedResource
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints, pack
from tests.protocol.test_session import Origin

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest


def changed(session: Session, type_url: str, *names: str, everything: bool = False) -> None:
    session.mark_changed(type_url, frozenset(names), everything)


def joined(origin: Origin, *names: str) -> Session:
    """A delta client subscribed to ``names`` of clusters, looked at once
    (nothing there yet: every one awaited)."""
    session = Session("delta")
    session.receive(Delta(type_url=CLUSTER, resource_names_subscribe=list(names)))
    assert session.due(origin.view).responses == []
    return session


def holding_a(origin: Origin, protocol: str, type_url: str = CLUSTER) -> Session:
    """A client of ``protocol`` holding ``a`` of ``type_url`` (in the cache
    already), its answer ACKed; a SotW client's ACK subscribes ``b`` too."""
    session = Session(protocol)
    if protocol == "delta":
        session.receive(Delta(type_url=type_url, resource_names_subscribe=["a"]))
        [answer] = session.due(origin.view).responses
        session.receive(Delta(type_url=type_url, response_nonce=answer.nonce))
    else:
        session.receive(Sotw(type_url=type_url, resource_names=["a"]))
        [answer] = session.due(origin.view).responses
        session.receive(Sotw(type_url=type_url, resource_names=["a", "b"],
                             response_nonce=answer.nonce, version_info=answer.version_info))
    return session


def test_ready_once_the_last_awaited_name_is_in_and_not_before() -> None:
    origin = Origin()
    origin.put(CLUSTER, "other", cluster("other"))  # (the type is synced)
    session = joined(origin, "a", "b")
    origin.put(CLUSTER, "a", cluster("a"))
    changed(session, CLUSTER, "a")
    assert not session.first_answers_ready(CLUSTER, origin.view)
    origin.put(CLUSTER, "b", cluster("b"))
    changed(session, CLUSTER, "b")
    assert session.first_answers_ready(CLUSTER, origin.view)
    [answer] = session.due(origin.view).responses
    assert sorted(r.name for r in answer.resources) == ["a", "b"]
    session.receive(Delta(type_url=CLUSTER, response_nonce=answer.nonce))
    # Answered: an update of what the client holds waits for the window.
    origin.put(CLUSTER, "a", cluster("a", timeout_s=3), version="2")
    changed(session, CLUSTER, "a")
    assert not session.first_answers_ready(CLUSTER, origin.view)


def test_the_types_first_answer_checks_every_name_at_once() -> None:
    # The type's first answer marks every name to look at (everything).
    origin = Origin()
    session = Session("delta")
    session.receive(Delta(type_url=CLUSTER, resource_names_subscribe=["a", "b"]))
    assert session.due(origin.view).responses == []  # (not synced: nothing looked at)
    origin.put(CLUSTER, "a", cluster("a"))
    changed(session, CLUSTER, "a", everything=True)
    assert not session.first_answers_ready(CLUSTER, origin.view)
    origin.put(CLUSTER, "b", cluster("b"))
    changed(session, CLUSTER, "b")
    assert session.first_answers_ready(CLUSTER, origin.view)


def test_not_ready_when_a_held_name_changed_too() -> None:
    origin = Origin()
    origin.put(CLUSTER, "a", cluster("a"))
    session = holding_a(origin, "delta")
    session.receive(Delta(type_url=CLUSTER, resource_names_subscribe=["b"]))
    assert session.due(origin.view).responses == []  # (b awaited)
    origin.put(CLUSTER, "a", cluster("a", timeout_s=3), version="2")
    changed(session, CLUSTER, "a")
    origin.put(CLUSTER, "b", cluster("b"))
    changed(session, CLUSTER, "b")
    # b is all the client waits for, but a's update goes with it: the window.
    assert not session.first_answers_ready(CLUSTER, origin.view)
    changed(session, CLUSTER, everything=True)  # (every name looked at: a too)
    assert not session.first_answers_ready(CLUSTER, origin.view)


def test_not_ready_when_every_name_is_looked_at_and_one_is_held() -> None:
    origin = Origin()
    origin.put(CLUSTER, "a", cluster("a"))
    session = holding_a(origin, "delta")
    session.receive(Delta(type_url=CLUSTER, resource_names_subscribe=["b"]))
    assert session.due(origin.view).responses == []
    origin.put(CLUSTER, "b", cluster("b"))
    changed(session, CLUSTER, "b", everything=True)
    assert not session.first_answers_ready(CLUSTER, origin.view)


def test_not_ready_when_another_type_has_changes() -> None:
    origin = Origin()
    origin.put(ENDPOINT, "e", endpoints("e"))
    origin.put(CLUSTER, "other", cluster("other"))
    session = joined(origin, "a")
    session.receive(Delta(type_url=ENDPOINT, resource_names_subscribe=["e"]))
    [eds] = session.due(origin.view).responses
    session.receive(Delta(type_url=ENDPOINT, response_nonce=eds.nonce))
    origin.put(ENDPOINT, "e", endpoints("e", 1001), version="2")
    changed(session, ENDPOINT, "e")
    origin.put(CLUSTER, "a", cluster("a"))
    changed(session, CLUSTER, "a")
    assert not session.first_answers_ready(CLUSTER, origin.view)


def test_not_ready_for_a_name_with_variants_or_gone() -> None:
    origin = Origin()
    origin.put(CLUSTER, "other", cluster("other"))
    session = joined(origin, "a", "gone")
    constraints = discovery_pb2.DynamicParameterConstraints()
    constraints.constraint.key = "env"
    constraints.constraint.value = "prod"
    resource = discovery_pb2.Resource(version="1", resource=pack(cluster("a")))
    resource.resource_name.name = "a"
    resource.resource_name.dynamic_parameter_constraints.CopyFrom(constraints)
    origin.core.cache.apply(CLUSTER, Update([CachedResource(
        CLUSTER, "a", "1", resource, compile_constraints(constraints))]))
    changed(session, CLUSTER, "a")
    origin.remove(CLUSTER, "gone")
    changed(session, CLUSTER, "gone")
    # (a variant is its subscriber's to pick, an absence is not a resource:
    # the window, as before)
    assert not session.first_answers_ready(CLUSTER, origin.view)


def test_never_for_a_stream_that_awaits_nothing() -> None:
    origin = Origin()
    origin.put(CLUSTER, "a", cluster("a"))
    session = holding_a(origin, "delta")
    changed(session, CLUSTER, "a")
    assert not session.first_answers_ready(CLUSTER, origin.view)
    assert not session.first_answers_ready(ENDPOINT, origin.view)  # (not subscribed)


@pytest.mark.parametrize("type_url", [CLUSTER, ENDPOINT])  # full state, and not
def test_sotw_ready_once_every_name_subscribed_and_not_held_is_in(type_url: str) -> None:
    made = cluster if type_url == CLUSTER else endpoints
    origin = Origin()
    origin.put(type_url, "other", made("other"))
    session = Session("sotw")
    session.receive(Sotw(type_url=type_url, resource_names=["a", "b"]))
    assert session.due(origin.view).responses == []
    origin.put(type_url, "a", made("a"))
    changed(session, type_url, "a")
    assert not session.first_answers_ready(type_url, origin.view)
    origin.put(type_url, "b", made("b"))
    changed(session, type_url, "b")
    assert session.first_answers_ready(type_url, origin.view)
    [answer] = session.due(origin.view).responses
    assert sorted(r.name for r in answer.resources) == ["a", "b"]
    session.receive(Sotw(type_url=type_url, resource_names=["a", "b"],
                         response_nonce=answer.nonce, version_info=answer.version_info))
    # Holding all it subscribes to: an update waits for the window.
    origin.put(type_url, "a", made("a", timeout_s=3) if type_url == CLUSTER
               else made("a", 1001), version="2")
    changed(session, type_url, "a")
    assert not session.first_answers_ready(type_url, origin.view)
    # A new name, with a held one changed meanwhile: the window too.
    [update] = session.due(origin.view).responses
    session.receive(Sotw(type_url=type_url, resource_names=["a", "b"],
                         response_nonce=update.nonce, version_info=update.version_info))
    session.receive(Sotw(type_url=type_url, resource_names=["a", "b", "c"],
                         response_nonce=update.nonce, version_info=update.version_info))
    assert session.due(origin.view).responses == []
    origin.put(type_url, "b", made("b", timeout_s=3) if type_url == CLUSTER
               else made("b", 1001), version="2")
    changed(session, type_url, "b")
    origin.put(type_url, "c", made("c"))
    changed(session, type_url, "c")
    assert not session.first_answers_ready(type_url, origin.view)


def test_sotw_not_ready_when_every_name_is_looked_at_and_one_is_held() -> None:
    origin = Origin()
    origin.put(ENDPOINT, "a", endpoints("a"))
    session = holding_a(origin, "sotw", ENDPOINT)
    assert session.due(origin.view).responses == []
    origin.put(ENDPOINT, "b", endpoints("b"))
    changed(session, ENDPOINT, "b", everything=True)  # (a may have changed too)
    assert not session.first_answers_ready(ENDPOINT, origin.view)
