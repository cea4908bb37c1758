"""Variants through the protocol state: selection, moves, removals (no I/O).

The state objects read a real cache through the real CacheView, so these
tests cover the constraints evaluator, the cache and the state together.
"""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ResourceCache, Update
from relay.constraints import Constraints, Locator, compile_constraints, params_of
from relay.interest import InterestChange
from relay.protocol.delta import DeltaResponsePlan, DeltaSubscription
from relay.protocol.sotw import SotwSubscription
from relay.protocol.view import CacheView, NonceSource
from relay.resource import CachedResource
from relay.xds_types import CLUSTER
from tests.builders import cluster, pack
from tests.variants import CANARY, NO_ENV, PROD

DPC = discovery_pb2.DynamicParameterConstraints


def variant(name: str, version: str, constraints: DPC) -> CachedResource:
    resource = discovery_pb2.Resource(version=version, resource=pack(cluster(name)))
    resource.resource_name.name = name
    resource.resource_name.dynamic_parameter_constraints.CopyFrom(constraints)
    return CachedResource(CLUSTER, name, version, resource, compile_constraints(constraints))


def key(constraints: DPC) -> str:
    compiled: Constraints = compile_constraints(constraints)
    return compiled.key


def three_variants() -> tuple[ResourceCache, CacheView, list[str]]:
    cache = ResourceCache()
    cache.apply(CLUSTER, Update([variant("c", "1", CANARY), variant("c", "1", PROD),
                                 variant("c", "1", NO_ENV)], complete=False))
    conflicts: list[str] = []
    return cache, CacheView(cache, lambda t, n: conflicts.append(n)), conflicts


def ack(state: DeltaSubscription) -> None:
    """The client ACKs the response in flight."""
    state.on_request(discovery_pb2.DeltaDiscoveryRequest(
        type_url=CLUSTER, response_nonce=state.snapshot().in_flight))


def delta_client(view: CacheView, params: dict[str, str] | None,
                 locator: bool = True) -> tuple[DeltaSubscription, DeltaResponsePlan | None]:
    state = DeltaSubscription(CLUSTER)
    if locator and params is not None:
        state.on_request(discovery_pb2.DeltaDiscoveryRequest(
            type_url=CLUSTER, resource_locators_subscribe=[
                {"name": "c", "dynamic_parameters": params}]))
    else:
        state.set_node_params(params_of(params or {}))
        state.on_request(discovery_pb2.DeltaDiscoveryRequest(
            type_url=CLUSTER, resource_names_subscribe=["c"]))
    return state, state.next_response(view, NonceSource())


def test_each_subscriber_gets_the_variant_its_locator_parameters_match() -> None:
    _, view, conflicts = three_variants()
    for params, expected in (({"env": "canary"}, CANARY), ({"env": "prod"}, PROD),
                             ({}, NO_ENV), ({"env": "prod", "region": "x"}, PROD)):
        _, plan = delta_client(view, params)
        assert plan is not None and len(plan.resources) == 1
        sent = plan.resources[0]
        assert sent.variant_key == key(expected)
        # The variant goes downstream with its constraints.
        assert sent.resource.resource_name.dynamic_parameter_constraints == expected
    assert conflicts == []


def test_plain_names_use_the_node_parameters_of_the_type() -> None:
    _, view, _ = three_variants()
    _, plan = delta_client(view, {"env": "canary"}, locator=False)
    assert plan is not None and plan.resources[0].variant_key == key(CANARY)


def test_matching_nothing_waits_until_the_origin_has_answered_then_does_not_exist() -> None:
    cache, view, _ = three_variants()
    state, plan = delta_client(view, {"env": "dev"})
    assert plan is None  # the origin may still have a variant for env=dev
    cache.apply(CLUSTER, Update(answered=[Locator("c", params_of({"env": "dev"}))]))
    state.mark_changed(frozenset({"c"}), False)
    plan = state.next_response(view, NonceSource())
    assert plan is not None and plan.removed == ["c"] and plan.resources == []


def test_invariant_31_parameter_change_moves_to_the_new_variant_in_one_update() -> None:
    _, view, _ = three_variants()
    nonces = NonceSource()
    state, plan = delta_client(view, {"env": "canary"}, locator=False)
    assert plan is not None
    state.on_request(discovery_pb2.DeltaDiscoveryRequest(type_url=CLUSTER,
                                                         response_nonce=plan.nonce))
    state.take_interest_change()
    state.set_node_params(params_of({"env": "prod"}))
    assert state.take_interest_change() == InterestChange(  # the index learns it
        added={"c": params_of({"env": "prod"})}, removed={"c": params_of({"env": "canary"})})
    plan = state.next_response(view, nonces)
    assert plan is not None
    assert [r.variant_key for r in plan.resources] == [key(PROD)]
    assert plan.removed == [] and plan.removed_names == []  # no remove-then-add


def test_invariant_13_removed_variant_goes_by_name_and_constraints_to_its_holders() -> None:
    cache, view, _ = three_variants()
    canary, _ = delta_client(view, {"env": "canary"})
    prod, _ = delta_client(view, {"env": "prod"})
    for state in (canary, prod):
        ack(state)  # both ACKed
    cache.apply(CLUSTER, Update(removed_variants=[("c", key(CANARY))]))
    cache.apply(CLUSTER, Update(answered=[Locator("c", params_of({"env": "canary"}))]))
    for state in (canary, prod):
        state.mark_changed(frozenset({"c"}), False)
    plan = canary.next_response(view, NonceSource())
    assert plan is not None and plan.removed == [] and plan.resources == []
    [removed] = plan.removed_names
    assert removed.name == "c" and removed.dynamic_parameter_constraints == CANARY
    assert prod.next_response(view, NonceSource()) is None  # untouched


def test_invariant_30_sotw_locator_subscribers_get_resources_wrapped() -> None:
    _, view, _ = three_variants()
    state = SotwSubscription(CLUSTER)
    state.on_request(discovery_pb2.DiscoveryRequest(
        type_url=CLUSTER, resource_locators=[{"name": "c",
                                              "dynamic_parameters": {"env": "prod"}}]))
    plan = state.next_response(view, NonceSource())
    assert plan is not None and plan.wrapped == frozenset({"c"})
    assert plan.resources[0].variant_key == key(PROD)


def test_sotw_full_state_omits_a_variant_that_stops_matching() -> None:
    cache, view, _ = three_variants()
    nonces = NonceSource()
    state = SotwSubscription(CLUSTER)
    state.on_request(discovery_pb2.DiscoveryRequest(
        type_url=CLUSTER, resource_locators=[{"name": "c",
                                              "dynamic_parameters": {"env": "prod"}}]))
    plan = state.next_response(view, nonces)
    assert plan is not None
    state.on_request(discovery_pb2.DiscoveryRequest(
        type_url=CLUSTER, response_nonce=plan.nonce, resource_locators=[
            {"name": "c", "dynamic_parameters": {"env": "prod"}}]))
    cache.apply(CLUSTER, Update(removed_variants=[("c", key(PROD))]))
    cache.apply(CLUSTER, Update(answered=[Locator("c", params_of({"env": "prod"}))]))
    state.mark_changed(frozenset({"c"}), False)
    plan = state.next_response(view, nonces)
    assert plan is not None and plan.resources == []  # absence means deletion


def test_several_matching_variants_resolve_deterministically_and_are_counted() -> None:
    cache = ResourceCache()
    both = DPC(and_constraints={"constraints": [CANARY, DPC(
        constraint={"key": "region", "exists": {}})]})
    cache.apply(CLUSTER, Update([variant("c", "1", CANARY), variant("c", "1", both)]))
    conflicts: list[str] = []
    view = CacheView(cache, lambda t, n: conflicts.append(n))
    params = params_of({"env": "canary", "region": "eu"})
    first = view.lookup(CLUSTER, "c", params)
    second = view.lookup(CLUSTER, "c", params)
    assert isinstance(first, CachedResource) and first is second
    assert first.variant_key == key(both)  # mentions more keys
    assert conflicts == ["c", "c"]


def test_repartition_in_one_origin_response_is_one_update_for_the_client() -> None:
    cache, view, _ = three_variants()
    state, plan = delta_client(view, {"env": "canary", "zone": "b"})
    assert plan is not None and plan.resources[0].variant_key == key(CANARY)
    ack(state)
    # The origin splits "canary" by zone: old variant out, new ones in, atomically.
    zone_b = DPC(and_constraints={"constraints": [CANARY, DPC(
        constraint={"key": "zone", "value": "b"})]})
    zone_not_b = DPC(and_constraints={"constraints": [CANARY, DPC(
        not_constraints=DPC(constraint={"key": "zone", "value": "b"}))]})
    cache.apply(CLUSTER, Update([variant("c", "2", zone_b), variant("c", "2", zone_not_b)],
                                removed_variants=[("c", key(CANARY))]))
    state.mark_changed(frozenset({"c"}), False)
    plan = state.next_response(view, NonceSource())
    assert plan is not None
    assert [r.variant_key for r in plan.resources] == [key(zone_b)]
    assert plan.removed == [] and plan.removed_names == []


def test_invariant_31_sotw_locator_parameter_change_resends_the_new_variant() -> None:
    _, view, _ = three_variants()
    nonces = NonceSource()
    state = SotwSubscription(CLUSTER)

    def request(env: str, nonce: str = "") -> discovery_pb2.DiscoveryRequest:
        return discovery_pb2.DiscoveryRequest(type_url=CLUSTER, response_nonce=nonce,
                                              resource_locators=[{
                                                  "name": "c",
                                                  "dynamic_parameters": {"env": env}}])

    state.on_request(request("canary"))
    state.take_interest_change()
    plan = state.next_response(view, nonces)
    assert plan is not None and plan.resources[0].variant_key == key(CANARY)
    state.on_request(request("prod", plan.nonce))
    assert state.take_interest_change() == InterestChange(
        added={"c": params_of({"env": "prod"})}, removed={"c": params_of({"env": "canary"})})
    plan = state.next_response(view, nonces)
    assert plan is not None and [r.variant_key for r in plan.resources] == [key(PROD)]


def test_invariant_5_a_declared_version_does_not_vouch_for_a_variant() -> None:
    # Reconnecting with initial_resource_versions {"c": "1"}: every variant of
    # c has version "1", and the client may hold canary while its parameters
    # now select prod. The relay cannot tell, so it sends the prod variant.
    _, view, _ = three_variants()
    state = DeltaSubscription(CLUSTER)
    state.set_node_params(params_of({"env": "prod"}))
    state.on_request(discovery_pb2.DeltaDiscoveryRequest(
        type_url=CLUSTER, resource_names_subscribe=["c"], initial_resource_versions={"c": "1"}))
    plan = state.next_response(view, NonceSource())
    assert plan is not None and [r.variant_key for r in plan.resources] == [key(PROD)]


def test_invariant_5_a_declared_version_still_vouches_for_a_plain_resource() -> None:
    cache = ResourceCache()
    plain = discovery_pb2.Resource(name="p", version="1", resource=pack(cluster("p")))
    cache.apply(CLUSTER, Update([CachedResource(CLUSTER, "p", "1", plain)], complete=False))
    state = DeltaSubscription(CLUSTER)
    state.on_request(discovery_pb2.DeltaDiscoveryRequest(
        type_url=CLUSTER, resource_names_subscribe=["p"], initial_resource_versions={"p": "1"}))
    assert state.next_response(CacheView(cache), NonceSource()) is None
