"""xdstp names and glob collections in the protocol state, with no I/O.

Names compared in canonical form and sent back as the client spelled them;
malformed names, names of another type and SotW globs refused; a delta glob
subscription covering the members of its collection as they come and go.
"""

from __future__ import annotations

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.constraints import EMPTY_PARAMS
from relay.interest import InterestChange
from relay.protocol.delta import DeltaSubscription
from relay.protocol.outcome import ProtocolError
from relay.protocol.session import Session
from relay.protocol.snapshot import ResourceStatus
from relay.protocol.sotw import SotwSubscription
from relay.protocol.view import NonceSource
from relay.protocol.xdstp import GlobRefused, XdstpError
from relay.server.plans import encode_plan
from relay.xds_types import CLUSTER, ENDPOINT
from tests.protocol.fakes import FakeView

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest

EDS = "envoy.config.endpoint.v3.ClusterLoadAssignment"
NAME = f"xdstp://east.example.com/{EDS}/svc?region=a&zone=b"      # canonical
SPELLED = f"xdstp://east.example.com/{EDS}/svc?zone=b&region=a"   # the same name
GLOB = f"xdstp://east.example.com/{EDS}/pool/*?zone=b"
M1 = f"xdstp://east.example.com/{EDS}/pool/m1?zone=b"
M2 = f"xdstp://east.example.com/{EDS}/pool/m2?zone=b"
OTHER_ZONE = f"xdstp://east.example.com/{EDS}/pool/m3?zone=c"
DEEPER = f"xdstp://east.example.com/{EDS}/pool/sub/m4?zone=b"


def delta(**resources: str) -> tuple[DeltaSubscription, FakeView, NonceSource]:
    return DeltaSubscription(ENDPOINT), FakeView(ENDPOINT, resources), NonceSource()


def wire(plan: object) -> discovery_pb2.DeltaDiscoveryResponse:
    """The response as the client reads it."""
    return discovery_pb2.DeltaDiscoveryResponse.FromString(encode_plan(plan))  # type: ignore[arg-type]


# -- names in canonical form, sent back as spelled -----------------------------------


def test_invariant_35_a_name_spelled_otherwise_is_served_under_the_clients_spelling() -> None:
    state, view, nonces = delta(**{NAME: "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[SPELLED]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    response = wire(plan)
    assert [(r.name, r.version) for r in response.resources] == [(SPELLED, "1")]
    # what the index (and so the origin) hears of is the canonical name
    assert state.take_interest_change() == InterestChange(added={NAME: EMPTY_PARAMS})


def test_invariant_35_a_removal_names_the_resource_as_the_client_spelled_it() -> None:
    state, view, nonces = delta(**{NAME: "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[SPELLED]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce))
    view.delete(NAME)
    state.mark_changed(frozenset({NAME}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and wire(plan).removed_resources == [SPELLED]


def test_invariant_35_an_error_names_the_resource_as_the_client_spelled_it() -> None:
    state, view, nonces = delta()
    view.errors[NAME] = discovery_pb2.ResourceError(
        resource_name=discovery_pb2.ResourceName(name=NAME),
        error_detail={"code": 5, "message": "no such thing"})
    view.complete = True
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[SPELLED]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    assert [e.resource_name.name for e in wire(plan).resource_errors] == [SPELLED]


def test_invariant_35_unsubscribing_by_another_spelling_unsubscribes() -> None:
    state, _, _ = delta(**{NAME: "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[SPELLED]))
    state.take_interest_change()
    state.on_request(Delta(type_url=ENDPOINT, resource_names_unsubscribe=[NAME]))
    assert state.take_interest_change() == InterestChange(removed={NAME: EMPTY_PARAMS})
    assert state.snapshot().subscribed == ()


def test_invariant_35_a_canonical_spelling_goes_out_as_the_cache_holds_it() -> None:
    state, view, nonces = delta(**{NAME: "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[NAME]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    [resource] = plan.resources
    assert resource is view.lookup(ENDPOINT, NAME, EMPTY_PARAMS)  # no copy made


def test_invariant_35_sotw_compares_names_in_canonical_form() -> None:
    state, view, nonces = SotwSubscription(ENDPOINT), FakeView(ENDPOINT, {NAME: "1"}), \
        NonceSource()
    state.on_request(Sotw(type_url=ENDPOINT, resource_names=[SPELLED]))
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == [NAME]
    # its ACK, spelled as before, changes nothing
    state.on_request(Sotw(type_url=ENDPOINT, resource_names=[SPELLED], response_nonce=plan.nonce,
                          version_info=plan.version_info))
    assert state.take_interest_change() == InterestChange(added={NAME: EMPTY_PARAMS})
    assert state.next_response(view, nonces) is None


def test_classic_names_are_untouched() -> None:
    state, view, nonces = delta(**{"outbound|80||svc": "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["outbound|80||svc"]))
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in wire(plan).resources] == ["outbound|80||svc"]


# -- refusals -------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["delta", "sotw"])
def test_a_malformed_name_is_refused_naming_the_part(protocol: str) -> None:
    bad = f"xdstp://east.example.com/{EDS}/svc?zone"
    request = Delta(type_url=ENDPOINT, resource_names_subscribe=[bad]) if protocol == "delta" \
        else Sotw(type_url=ENDPOINT, resource_names=[bad])
    with pytest.raises(XdstpError) as raised:
        Session(protocol).receive(request)  # type: ignore[arg-type]
    assert str(raised.value) == (f"resource name {bad!r} is not a valid xdstp name: "
                                 "context parameter: 'zone' is not KEY=VALUE")


def test_a_malformed_name_in_an_unsubscribe_or_a_declaration_is_refused() -> None:
    session = Session("delta")
    session.receive(Delta(type_url=ENDPOINT, resource_names_subscribe=[NAME]))
    with pytest.raises(XdstpError, match="id: missing"):
        session.receive(Delta(type_url=ENDPOINT,
                              resource_names_unsubscribe=[f"xdstp://a/{EDS}"]))
    with pytest.raises(XdstpError, match="fragment"):
        Session("delta").receive(Delta(type_url=ENDPOINT, initial_resource_versions={
            f"xdstp://a/{EDS}/x#y": "1"}))


def test_a_name_of_another_type_is_refused() -> None:
    cluster_name = "xdstp://east.example.com/envoy.config.cluster.v3.Cluster/c"
    with pytest.raises(XdstpError) as raised:
        Session("delta").receive(Delta(type_url=ENDPOINT,
                                       resource_names_subscribe=[cluster_name]))
    assert raised.value.part == "type"
    assert str(raised.value) == (
        f"resource name {cluster_name!r} is not a valid xdstp name: type: the name is of "
        f"type envoy.config.cluster.v3.Cluster, the request is for {EDS}")


def test_invariant_36_a_sotw_request_for_a_glob_is_refused() -> None:
    for session in (Session("sotw"), Session("sotw", ENDPOINT)):
        with pytest.raises(GlobRefused) as raised:
            session.receive(Sotw(type_url=ENDPOINT, resource_names=["a", GLOB]))
        assert str(raised.value) == (
            f"resource name {GLOB!r} is a glob collection: xDS serves glob collections "
            "over the incremental (delta) protocol only (TP1), not state of the world")
        assert isinstance(raised.value, ProtocolError)  # INVALID_ARGUMENT


def test_a_request_checked_whole_is_refused_before_any_piece_is_applied() -> None:
    names = [f"n{i}" for i in range(5_000)] + [f"xdstp://a/{CLUSTER.rsplit('/', 1)[1]}/x"]
    session = Session("delta")
    with pytest.raises(XdstpError, match="the request is for"):
        session.check(Delta(type_url=ENDPOINT, resource_names_subscribe=names))
    assert session.types() == []


# -- glob collections (delta) ----------------------------------------------------------


def test_invariant_36_a_glob_subscription_gets_the_members_with_its_context() -> None:
    state, view, nonces = delta(**{M1: "1", M2: "1", OTHER_ZONE: "1", DEEPER: "1", NAME: "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[GLOB]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    assert sorted(r.name for r in wire(plan).resources) == [M1, M2]
    assert wire(plan).removed_resources == []  # the collection is no resource of its own
    # the collection goes upstream by its own name, once
    assert state.take_interest_change() == InterestChange(added={GLOB: EMPTY_PARAMS},
                                                          globs=frozenset({GLOB}))


def test_invariant_36_members_added_and_removed_reach_the_glob_subscriber() -> None:
    state, view, nonces = delta(**{M1: "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[GLOB]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce))
    view.set(M2, "1")
    view.set(OTHER_ZONE, "1")
    state.mark_changed(frozenset({M2, OTHER_ZONE}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == [M2]
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce))
    view.delete(M1)
    state.mark_changed(frozenset({M1}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and plan.removed == [M1] and plan.resources == []


def test_a_member_subscribed_by_name_and_by_its_collection_goes_out_once() -> None:
    state, view, nonces = delta(**{M1: "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[GLOB, M1]))
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == [M1]
    # unsubscribing the collection keeps the member it also subscribes by name
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce,
                           resource_names_unsubscribe=[GLOB]))
    view.set(M1, "2")
    state.mark_changed(frozenset({M1}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.version for r in plan.resources] == ["2"]


def test_unsubscribing_a_glob_drops_its_members_silently() -> None:
    state, view, nonces = delta(**{M1: "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[GLOB]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce,
                           resource_names_unsubscribe=[GLOB]))
    assert state.take_interest_change() is None  # subscribed and gone: no news upstream
    view.set(M1, "2")
    view.set(M2, "1")
    state.mark_changed(frozenset({M1, M2}), False)
    assert state.next_response(view, nonces) is None
    assert state.snapshot().resources == ()


def test_subscribing_a_glob_again_resends_its_members() -> None:
    state, view, nonces = delta(**{M1: "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[GLOB]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(Delta(type_url=ENDPOINT, response_nonce=plan.nonce,
                           resource_names_subscribe=[GLOB]))
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.name for r in plan.resources] == [M1]


def test_invariant_5_declared_members_of_a_glob_unchanged_are_not_resent() -> None:
    state, view, nonces = delta(**{M1: "1", M2: "2"})
    view.complete = True  # the origin has said what the collection holds
    gone = f"xdstp://east.example.com/{EDS}/pool/m9?zone=b"
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[GLOB],
                           initial_resource_versions={M1: "1", M2: "1", gone: "1"}))
    plan = state.next_response(view, nonces)
    assert plan is not None
    assert [(r.name, r.version) for r in plan.resources] == [(M2, "2")]
    assert plan.removed == [gone]


def test_the_snapshot_lists_members_held_and_not_the_glob_as_a_resource() -> None:
    state, view, nonces = delta(**{M1: "1"})
    state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=[GLOB]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    snapshot = state.snapshot()
    assert snapshot.subscribed == (GLOB,)
    assert [(r.name, r.status) for r in snapshot.resources] == [(M1, ResourceStatus.SENT)]
