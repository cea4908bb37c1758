"""Session: one stream's protocol across types, with no I/O (issue 10's session core)."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import Update
from relay.constraints import EMPTY_PARAMS
from relay.core import Core
from relay.interest import InterestChange
from relay.protocol.outcome import ProtocolError
from relay.protocol.session import SUPPORTS_RESOURCE_IN_SOTW, Session
from relay.protocol.snapshot import ResourceStatus
from relay.resource import CachedResource
from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE, RUNTIME
from tests.builders import cluster, endpoints, listener, pack, route

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest


class Origin:
    """A cache written as the origin would, and the view sessions read it through."""

    def __init__(self) -> None:
        self.core = Core.create()

    @property
    def view(self) -> Any:
        return self.core.serving.view

    def put(self, type_url: str, name: str, msg: Any, version: str = "1",
            do_not_cache: bool = False) -> None:
        resource = discovery_pb2.Resource(name=name, version=version, resource=pack(msg))
        resource.cache_control.do_not_cache = do_not_cache
        # (as it answers the relay's wildcard too: wildcard clients here are served)
        self.core.cache.apply(type_url, Update([CachedResource(type_url, name, version,
                                                                resource)], wildcard_answered=True))

    def remove(self, type_url: str, name: str) -> None:
        self.core.cache.apply(type_url, Update(removed=[name]))


def types_of(session: Session, origin: Origin) -> list[str]:
    return [plan.type_url for plan in session.due(origin.view).responses]


def test_invariant_20_types_go_out_in_make_before_break_order() -> None:
    origin = Origin()
    session = Session("delta")
    for type_url, names in ((RUNTIME, ["rt"]), (ROUTE, ["x"]), (LISTENER, []),
                            (ENDPOINT, ["x"]), (CLUSTER, [])):
        session.receive(Delta(type_url=type_url, resource_names_subscribe=names))
    for type_url, name, msg in ((ROUTE, "x", route("x")), (RUNTIME, "rt", cluster("rt")),
                                (LISTENER, "l", listener("l")), (ENDPOINT, "x", endpoints("x")),
                                (CLUSTER, "x", cluster("x"))):
        origin.put(type_url, name, msg)
    assert types_of(session, origin) == [CLUSTER, ENDPOINT, LISTENER, ROUTE, RUNTIME]


def test_invariant_20_a_delta_response_that_only_removes_clusters_goes_last() -> None:
    origin = Origin()
    origin.put(CLUSTER, "old", cluster("old"))
    origin.put(ENDPOINT, "x", endpoints("x"))
    session = Session("delta")
    for type_url, names in ((CLUSTER, ["old"]), (ENDPOINT, ["x"])):
        session.receive(Delta(type_url=type_url, resource_names_subscribe=names))
    for plan in session.due(origin.view).responses:
        session.receive(Delta(type_url=plan.type_url, response_nonce=plan.nonce))
    origin.remove(CLUSTER, "old")
    origin.put(ENDPOINT, "x", endpoints("x", 9), version="2")
    for type_url in (CLUSTER, ENDPOINT):
        session.mark_changed(type_url, frozenset({"old", "x"}), False)
    responses = session.due(origin.view).responses
    assert [p.type_url for p in responses] == [ENDPOINT, CLUSTER]
    assert getattr(responses[1], "removed", None) == ["old"]


def test_after_a_sotw_cluster_push_the_next_endpoint_request_is_answered() -> None:
    # Envoy asks for endpoints again after a cluster update, to warm the
    # clusters, and waits for the answer even if nothing changed.
    origin = Origin()
    origin.put(CLUSTER, "c", cluster("c"))
    origin.put(ENDPOINT, "c", endpoints("c"))
    session = Session("sotw")
    session.receive(Sotw(type_url=CLUSTER))
    session.receive(Sotw(type_url=ENDPOINT, resource_names=["c"]))
    cds, eds = session.due(origin.view).responses
    session.receive(Sotw(type_url=ENDPOINT, resource_names=["c"], response_nonce=eds.nonce,
                         version_info=eds.version_info))
    session.receive(Sotw(type_url=CLUSTER, response_nonce=cds.nonce,
                         version_info=cds.version_info))
    assert session.due(origin.view).responses == []  # plain ACKs: nothing
    origin.put(CLUSTER, "c", cluster("c", timeout_s=3), version="2")
    session.mark_changed(CLUSTER, frozenset({"c"}), False)
    [pushed] = session.due(origin.view).responses
    session.receive(Sotw(type_url=CLUSTER, response_nonce=pushed.nonce,
                         version_info=pushed.version_info))
    session.receive(Sotw(type_url=ENDPOINT, resource_names=["c"], response_nonce=eds.nonce,
                         version_info=eds.version_info))
    [answer] = session.due(origin.view).responses
    assert answer.type_url == ENDPOINT and [r.name for r in answer.resources] == ["c"]


def test_after_a_delta_cluster_push_only_a_resubscribe_gets_the_endpoints_again() -> None:
    # A delta client asks for what it wants again by subscribing to it: a
    # plain ACK is only an ACK, even after a cluster push.
    origin = Origin()
    origin.put(CLUSTER, "c", cluster("c"))
    origin.put(ENDPOINT, "c", endpoints("c"))
    session = Session("delta")
    session.receive(Delta(type_url=CLUSTER, resource_names_subscribe=["c"]))
    session.receive(Delta(type_url=ENDPOINT, resource_names_subscribe=["c"]))
    cds, eds = session.due(origin.view).responses
    session.receive(Delta(type_url=ENDPOINT, response_nonce=eds.nonce))
    session.receive(Delta(type_url=CLUSTER, response_nonce=cds.nonce))
    origin.put(CLUSTER, "c", cluster("c", timeout_s=3), version="2")
    session.mark_changed(CLUSTER, frozenset({"c"}), False)
    [pushed] = session.due(origin.view).responses
    session.receive(Delta(type_url=CLUSTER, response_nonce=pushed.nonce))
    session.receive(Delta(type_url=ENDPOINT, response_nonce=eds.nonce))
    assert session.due(origin.view).responses == []
    session.receive(Delta(type_url=ENDPOINT, resource_names_subscribe=["c"]))
    [answer] = session.due(origin.view).responses
    assert answer.type_url == ENDPOINT and [r.name for r in answer.resources] == ["c"]


def test_invariant_24_node_of_first_request_is_kept() -> None:
    session = Session("delta")
    session.receive(Delta(type_url=CLUSTER, node={"id": "first"}))
    session.receive(Delta(type_url=ENDPOINT, node={"id": "second"},
                          resource_names_subscribe=["a"]))
    assert session.node_id == "first"


def test_invariant_19_no_response_for_unsubscribed_type() -> None:
    origin = Origin()
    session = Session("delta")
    session.receive(Delta(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    assert session.mark_changed(CLUSTER, frozenset({"a"}), False) is None
    origin.put(CLUSTER, "a", cluster("a"))
    origin.put(ENDPOINT, "b", endpoints("b"))
    assert session.due(origin.view).responses == []


@pytest.mark.parametrize("fixed,type_url,problem", [
    (None, "", "type_url is required"),
    (CLUSTER, LISTENER, "sent on the discovery service for"),
])
def test_malformed_requests_raise_protocol_errors(fixed: str | None, type_url: str,
                                                  problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        Session("delta", fixed).receive(Delta(type_url=type_url))


def test_per_type_stream_accepts_empty_type_url() -> None:
    origin = Origin()
    origin.put(CLUSTER, "a", cluster("a"))
    session = Session("delta", CLUSTER)
    session.receive(Delta())
    [response] = session.due(origin.view).responses
    assert response.type_url == CLUSTER and [r.name for r in response.resources] == ["a"]


def test_a_name_too_large_to_forward_is_refused() -> None:
    session = Session("delta", max_locator_size=100)
    with pytest.raises(ProtocolError, match=r"upstream\.max_request_size"):
        session.receive(Delta(type_url=ENDPOINT, resource_names_subscribe=["n" * 200]))
    sotw = Session("sotw", max_locator_size=100)
    with pytest.raises(ProtocolError, match="with its dynamic parameters"):
        sotw.receive(Sotw(type_url=ENDPOINT, resource_locators=[
            {"name": "a", "dynamic_parameters": {"k": "v" * 200}}]))


def test_interest_is_registered_by_requests_that_change_it_not_by_plain_acks() -> None:
    origin = Origin()
    origin.put(ENDPOINT, "a", endpoints("a"))
    session = Session("delta")
    received = session.receive(Delta(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    assert received.interest == [(ENDPOINT, InterestChange(added={"a": EMPTY_PARAMS}))]
    [plan] = session.due(origin.view).responses
    ack = session.receive(Delta(type_url=ENDPOINT, response_nonce=plan.nonce))
    assert ack.outcome.ack_nonce == plan.nonce and ack.interest == []
    # Subscribed again, and to one more: only the new name is news.
    again = session.receive(Delta(type_url=ENDPOINT, resource_names_subscribe=["a", "b"]))
    assert again.interest == [(ENDPOINT, InterestChange(added={"b": EMPTY_PARAMS}))]
    gone = session.receive(Delta(type_url=ENDPOINT, resource_names_unsubscribe=["a", "x"]))
    assert gone.interest == [(ENDPOINT, InterestChange(removed={"a": EMPTY_PARAMS}))]


def test_a_first_request_with_no_names_registers_the_stream_for_its_type() -> None:
    session = Session("delta")
    received = session.receive(Delta(type_url=ENDPOINT))
    assert received.interest == [(ENDPOINT, InterestChange())]
    assert session.receive(Delta(type_url=ENDPOINT)).interest == []


def test_a_node_parameter_change_re_registers_every_type_it_touches() -> None:
    session = Session("delta")
    session.receive(Delta(type_url=CLUSTER, resource_names_subscribe=["c"]))
    session.receive(Delta(type_url=ENDPOINT, resource_names_subscribe=["e"]))
    node = {"id": "n", "dynamic_parameters": {CLUSTER: {"params": {"env": "canary"}}}}
    received = session.receive(Delta(type_url=ENDPOINT, node=node))
    assert received.interest == [(CLUSTER, InterestChange(
        added={"c": frozenset({("env", "canary")})}, removed={"c": EMPTY_PARAMS}))]


def test_a_do_not_cache_copy_older_than_the_subscription_is_fetched_afresh() -> None:
    origin = Origin()
    origin.put(ENDPOINT, "a", endpoints("a"), do_not_cache=True)
    for session, request in ((Session("delta"), Delta(type_url=ENDPOINT,
                                                      resource_names_subscribe=["a"])),
                             (Session("sotw"), Sotw(type_url=ENDPOINT, resource_names=["a"]))):
        session.receive(request)
        due = session.due(origin.view)
        assert due.responses == [] and due.refetch == {ENDPOINT: frozenset({"a"})}
        assert session.due(origin.view).refetch == {}  # asked for once


def test_a_sotw_wildcard_client_too_waits_for_a_fresh_do_not_cache_copy() -> None:
    # SotW and delta follow one do-not-cache rule: a wildcard subscriber is
    # not served a copy fetched before it subscribed, either.
    origin = Origin()
    origin.put(CLUSTER, "a", cluster("a"), do_not_cache=True)
    session = Session("sotw")
    session.receive(Sotw(type_url=CLUSTER))
    due = session.due(origin.view)
    assert due.responses == [] and due.refetch == {CLUSTER: frozenset({"a"})}
    origin.put(CLUSTER, "a", cluster("a"), do_not_cache=True)  # the fresh copy
    session.mark_changed(CLUSTER, frozenset({"a"}), False)
    [plan] = session.due(origin.view).responses
    assert [r.name for r in plan.resources] == ["a"]


def test_resource_in_sotw_follows_the_nodes_client_features() -> None:
    origin = Origin()
    resource = discovery_pb2.Resource(name="a", version="1", resource=pack(cluster("a")))
    resource.ttl.seconds = 30
    origin.core.cache.apply(CLUSTER, Update([CachedResource(CLUSTER, "a", "1", resource)],
                                            wildcard_answered=True))
    for features, wrapped in (([SUPPORTS_RESOURCE_IN_SOTW], frozenset({"a"})), ([], frozenset())):
        session = Session("sotw")
        session.receive(Sotw(type_url=CLUSTER, node={"id": "n", "client_features": features}))
        [plan] = session.due(origin.view).responses
        assert getattr(plan, "wrapped", None) == wrapped


def test_the_snapshot_says_what_each_client_holds() -> None:
    origin = Origin()
    origin.put(CLUSTER, "a", cluster("a"))
    session = Session("delta")
    session.receive(Delta(type_url=CLUSTER, node={"id": "n1"},
                          resource_names_subscribe=["a", "later"]))
    [plan] = session.due(origin.view).responses
    sent = session.snapshot()
    [clusters] = sent.types
    assert sent.node_id == "n1" and sent.protocol == "delta"
    assert clusters.subscribed == ("a", "later") and clusters.in_flight == plan.nonce
    assert [(r.name, r.status) for r in clusters.resources] == [
        ("a", ResourceStatus.SENT), ("later", ResourceStatus.REQUESTED)]
    session.receive(Delta(type_url=CLUSTER, response_nonce=plan.nonce))
    [clusters] = session.snapshot().types
    assert clusters.acked == plan.nonce and clusters.versions == (("a", "1"),)
    assert clusters.resources[0].status is ResourceStatus.ACKED
