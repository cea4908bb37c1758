"""End to end: the variant rules of dynamic-parameters.md over real gRPC.

A scripted origin publishes variants of cluster (and endpoints) "svc"; each
variant's body says which one it is, so every test can assert exactly what
each client received, with which constraints, and that nothing else came.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from typing import Any, TypeAlias

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.service.discovery.v3 import discovery_pb2
from prometheus_client.parser import text_string_to_metric_families

from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import endpoints, pack
from tests.clock import ManualClock
from tests.harness import (
    DPC,
    ScriptedOrigin,
    Stack,
    XdsClient,
    eventually,
    node,
    running_stack,
)
from tests.variants import CANARY, ENV_VARIANTS, PORTS, PROD, label_of, unwrapped

ZONE_B = DPC(constraint={"key": "zone", "value": "b"})
ResourceName: TypeAlias = discovery_pb2.ResourceName


def both(*constraints: DPC) -> DPC:
    return DPC(and_constraints={"constraints": list(constraints)})


def svc(label: str, name: str = "svc") -> cluster_pb2.Cluster:
    """Cluster ``name`` whose alt_stat_name says which variant it is."""
    return cluster_pb2.Cluster(name=name, alt_stat_name=label)


def publish(origin: ScriptedOrigin, name: str = "svc") -> ScriptedOrigin:
    """Canary, prod and default (no env) variants of cluster and endpoints ``name``."""
    for label, constraints in ENV_VARIANTS.items():
        origin.set_variant(svc(label, name), constraints, f"{label}-1")
        origin.set_variant(endpoints(name, PORTS[label]), constraints, f"{label}-1")
    return origin


def named(constraints: DPC, name: str = "svc") -> ResourceName:
    return ResourceName(name=name, dynamic_parameter_constraints=constraints)


def labels(response: Any) -> list[str]:
    return [label_of(r) for r in response.resources]


def params_node(env: str | None = None, types: tuple[str, ...] = (CLUSTER, ENDPOINT),
                node_id: str = "client") -> Any:
    """A node whose dynamic parameters for ``types`` are env=``env`` (none if None)."""
    out = node(node_id)
    if env is not None:
        for type_url in types:
            out.dynamic_parameters[type_url].params["env"] = env
    return out


def locator(**params: str) -> list[dict[str, Any]]:
    return [{"name": "svc", "dynamic_parameters": params}]


async def sotw_ack(client: XdsClient, response: Any, **fields: Any) -> None:
    """ACK with the full subscription again (``resource_names=["svc"]`` by default)."""
    if "resource_locators" not in fields:
        fields.setdefault("resource_names", ["svc"])
    await client.ack(response, **fields)


async def quiet(*clients: XdsClient) -> None:
    await asyncio.gather(*(c.expect_nothing() for c in clients))


def located(requests: list[discovery_pb2.DeltaDiscoveryRequest], type_url: str = CLUSTER,
            subscribe: bool = True) -> list[list[tuple[str, dict[str, str]]]]:
    """Per request of ``type_url``, the locators it (un)subscribes, empty lists left out."""
    out = []
    for request in requests:
        if request.type_url != type_url:
            continue
        locs = request.resource_locators_subscribe if subscribe else \
            request.resource_locators_unsubscribe
        if locs:
            out.append([(loc.name, dict(loc.dynamic_parameters)) for loc in locs])
    return out


async def subscribed_canary(stack: Stack, delta: bool) -> tuple[XdsClient, Any]:
    """A plain-name CDS client with node env=canary that holds (and ACKed) canary."""
    client = stack.client(delta=delta)
    if delta:
        await client.send(node=params_node("canary"), type_url=CLUSTER,
                          resource_names_subscribe=["svc"])
    else:
        await client.send(node=params_node("canary"), type_url=CLUSTER, resource_names=["svc"])
    first = await client.recv()
    assert labels(first) == ["canary"]
    await (client.ack(first) if delta else sotw_ack(client, first))
    return client, first


# -- which parameters apply ----------------------------------------------------------


async def test_invariant_30_a_locators_own_parameters_win_over_the_node_parameters() -> None:
    async with running_stack(publish(ScriptedOrigin())) as stack:
        delta, sotw = stack.client(delta=True), stack.client(delta=False)
        await delta.send(node=params_node("canary"), type_url=CLUSTER,
                         resource_locators_subscribe=locator(env="prod"))
        await sotw.send(node=params_node("canary"), type_url=CLUSTER,
                        resource_locators=locator(env="prod"))
        [sent] = (await delta.recv()).resources
        assert label_of(sent) == "prod" and sent.resource_name == named(PROD)
        assert labels(await sotw.recv()) == ["prod"]
        # The node's env=canary was never asked of the origin.
        assert located(stack.origin.subscription_requests()) == [
            [("svc", {"env": "prod"})]]


async def test_invariant_30_node_parameters_given_for_another_type_count_as_empty() -> None:
    async with running_stack(publish(ScriptedOrigin())) as stack:
        delta, sotw = stack.client(delta=True), stack.client(delta=False)
        elsewhere = params_node("canary", types=(ENDPOINT,))
        await delta.send(node=elsewhere, type_url=CLUSTER, resource_names_subscribe=["svc"])
        await sotw.send(node=elsewhere, type_url=CLUSTER, resource_names=["svc"])
        assert labels(await delta.recv()) == ["default"]
        assert labels(await sotw.recv()) == ["default"]
        [request] = stack.origin.subscription_requests()
        assert list(request.resource_names_subscribe) == ["svc"]
        assert list(request.resource_locators_subscribe) == []


# -- parameter changes ------------------------------------------------------------------


async def test_invariant_13_14_31_parameters_matching_nothing_remove_the_old_variant() -> None:
    async with running_stack(publish(ScriptedOrigin())) as stack:
        # A prod client keeps the other variants of svc in the relay's cache.
        bystander = stack.client(delta=True)
        await bystander.send(node=params_node("prod"), type_url=CLUSTER,
                             resource_names_subscribe=["svc"])
        await bystander.ack(await bystander.recv())
        delta, _ = await subscribed_canary(stack, delta=True)
        sotw, held = await subscribed_canary(stack, delta=False)

        await delta.send(node=params_node("dev"), type_url=CLUSTER)
        gone = await delta.recv()
        assert list(gone.resources) == [] and list(gone.removed_resources) == []
        assert list(gone.removed_resource_names) == [named(CANARY)]
        await delta.ack(gone)

        await sotw.send(node=params_node("dev"), type_url=CLUSTER, resource_names=["svc"],
                        response_nonce=held.nonce, version_info=held.version_info)
        emptied = await sotw.recv()
        assert emptied.type_url == CLUSTER and list(emptied.resources) == []
        await sotw_ack(sotw, emptied)
        await quiet(bystander, delta, sotw)


async def test_invariant_13_14_31_a_lone_holder_matching_nothing_is_told_of_the_removal(
        ) -> None:
    origin = publish(publish(ScriptedOrigin()), "other")
    async with running_stack(origin) as stack:
        delta, _ = await subscribed_canary(stack, delta=True)
        sotw = stack.client(delta=False)
        await sotw.send(node=params_node("canary"), type_url=CLUSTER, resource_names=["other"])
        held = await sotw.recv()
        assert labels(held) == ["canary"]
        await sotw_ack(sotw, held, resource_names=["other"])

        await delta.send(node=params_node("dev"), type_url=CLUSTER)
        await sotw.send(node=params_node("dev"), type_url=CLUSTER, resource_names=["other"],
                        response_nonce=held.nonce, version_info=held.version_info)
        # Within the answer grace (upstream.answer_grace, 0.5 s) and a margin.
        gone, emptied = await asyncio.gather(delta.recv(timeout=3), sotw.recv(timeout=3))
        assert list(gone.resources) == [] and list(gone.removed_resources) == []
        assert list(gone.removed_resource_names) == [named(CANARY)]
        assert list(emptied.resources) == []


async def test_invariant_31_sotw_plain_names_follow_a_node_parameter_change_mid_stream(
        ) -> None:
    async with running_stack(publish(ScriptedOrigin())) as stack:
        client = stack.client(delta=False)
        held = {}
        for type_url in (CLUSTER, ENDPOINT):
            await client.send(node=params_node("canary"), type_url=type_url,
                              resource_names=["svc"])
            held[type_url] = await client.recv()
            assert held[type_url].type_url == type_url and labels(held[type_url]) == ["canary"]
            await sotw_ack(client, held[type_url])
        # A later request carries the new node; the subscription stays the same.
        await client.send(node=params_node("prod"), type_url=CLUSTER, resource_names=["svc"],
                          response_nonce=held[CLUSTER].nonce,
                          version_info=held[CLUSTER].version_info)
        moved = {}
        for _ in range(2):
            response = await client.recv()
            moved[response.type_url] = labels(response)
            await sotw_ack(client, response)
        assert moved == {CLUSTER: ["prod"], ENDPOINT: ["prod"]}


async def test_a_delta_locator_resubscribed_with_new_parameters_moves_in_one_update() -> None:
    async with running_stack(publish(ScriptedOrigin())) as stack:
        client = stack.client(delta=True)
        await client.send(node=node("c"), type_url=CLUSTER,
                          resource_locators_subscribe=locator(env="canary"))
        first = await client.recv()
        assert labels(first) == ["canary"]
        await client.send(type_url=CLUSTER, response_nonce=first.nonce,
                          resource_locators_subscribe=locator(env="prod"))
        moved = await client.recv()
        [sent] = moved.resources
        assert label_of(sent) == "prod" and sent.resource_name == named(PROD)
        assert list(moved.removed_resources) == [] and list(moved.removed_resource_names) == []
        await client.ack(moved)
        await quiet(client)


# -- atomic re-partition -------------------------------------------------------------------


async def test_sotw_cds_repartition_in_one_origin_response_is_one_response(
        ) -> None:
    origin = ScriptedOrigin()
    origin.set_variant(svc("canary"), CANARY, "canary-1")
    async with running_stack(origin) as stack:
        client = stack.client(delta=False)
        params = locator(env="canary", zone="b")
        await client.send(node=node("c"), type_url=CLUSTER, resource_locators=params)
        first = await client.recv()
        assert labels(first) == ["canary"]
        await sotw_ack(client, first, resource_locators=params)

        split = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        split.removed_resource_names.append(named(CANARY))
        zone_b, zone_not_b = both(CANARY, ZONE_B), both(CANARY, DPC(not_constraints=ZONE_B))
        for label, constraints in (("canary-b", zone_b), ("canary-not-b", zone_not_b)):
            added = split.resources.add(version="2", resource=pack(svc(label)))
            added.resource_name.CopyFrom(named(constraints))
        origin.send_raw(split)

        moved = await client.recv()
        assert labels(moved) == ["canary-b"]
        assert [unwrapped(e).resource_name for e in moved.resources] == [named(zone_b)]
        await sotw_ack(client, moved, resource_locators=params)
        await quiet(client)


# -- constraints on the wire -----------------------------------------------------------------


async def test_variants_go_downstream_with_their_constraints() -> None:
    async with running_stack(publish(ScriptedOrigin())) as stack:
        by_node, by_locator = stack.client(delta=True), stack.client(delta=True)
        sotw_located, sotw_plain = stack.client(delta=False), stack.client(delta=False)
        # One after the other, so that each response below belongs to one client.
        await by_node.send(node=params_node("prod"), type_url=CLUSTER,
                           resource_names_subscribe=["svc"])
        [sent] = (await by_node.recv()).resources
        assert sent.resource_name == named(PROD) and sent.version == "prod-1"
        await by_locator.send(node=node("l"), type_url=CLUSTER,
                              resource_locators_subscribe=locator(env="canary"))
        [sent] = (await by_locator.recv()).resources
        assert sent.resource_name == named(CANARY) and sent.version == "canary-1"

        await sotw_located.send(node=node("s"), type_url=CLUSTER,
                                resource_locators=locator(env="canary"))
        [wrapped] = (await sotw_located.recv()).resources
        resource = unwrapped(wrapped)
        assert resource.resource_name == named(CANARY) and resource.version == "canary-1"
        assert label_of(resource) == "canary"
        # A SotW client that named the resource plainly gets the bare resource.
        await sotw_plain.send(node=params_node("prod"), type_url=CLUSTER,
                              resource_names=["svc"])
        [bare] = (await sotw_plain.recv()).resources
        assert bare.type_url == CLUSTER and label_of(bare) == "prod"


async def test_a_client_is_not_told_of_absence_before_the_origin_answered_its_locator(
        ) -> None:
    origin = ScriptedOrigin(auto=False)
    # A grace long enough that a loaded test machine answers within it.
    async with running_stack(origin, answer_grace="3s") as stack:
        prod = stack.client(delta=True)
        await prod.send(node=params_node("prod"), type_url=CLUSTER,
                        resource_names_subscribe=["svc"])
        assert located([await origin.next_request()]) == [[("svc", {"env": "prod"})]]
        canary, sotw = stack.client(delta=True), stack.client(delta=False)
        await canary.send(node=params_node("canary"), type_url=CLUSTER,
                          resource_names_subscribe=["svc"])
        await sotw.send(node=params_node("canary"), type_url=CLUSTER, resource_names=["svc"])
        assert located([await origin.next_request()]) == [[("svc", {"env": "canary"})]]
        await eventually(lambda: sum(CLUSTER in s.session.types()
                                     for s in stack.relay.serving.streams) == 3)

        # The origin answers the first locator; it has not read the second yet.
        answer = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        answer.resources.add(version="prod-1", resource=pack(svc("prod")),
                             resource_name=named(PROD))
        origin.send_raw(answer)
        assert labels(await prod.recv()) == ["prod"]
        # Not told "does not exist": the answer came too soon after their
        # locator to be its answer.
        await quiet(canary, sotw)

        answer = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        answer.resources.add(version="canary-1", resource=pack(svc("canary")),
                             resource_name=named(CANARY))
        origin.send_raw(answer)
        assert labels(await canary.recv()) == ["canary"]
        assert labels(await sotw.recv()) == ["canary"]


# -- ambiguity --------------------------------------------------------------------------------


async def conflicts_counted(admin_port: int) -> float:
    """xds_relay_variant_conflicts_total for clusters, read from /metrics."""
    def fetch() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    text = await asyncio.get_running_loop().run_in_executor(None, fetch)
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples
               if s.name == "xds_relay_variant_conflicts_total" and
               s.labels.get("type") == "Cluster")


async def test_overlapping_variants_resolve_deterministically_counted_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    canary_eu = both(CANARY, DPC(constraint={"key": "region", "exists": {}}))
    origin = ScriptedOrigin()
    origin.set_variant(svc("canary-eu"), canary_eu, "1")
    origin.set_variant(svc("canary"), CANARY, "1")
    async with running_stack(origin) as stack:
        clients = [stack.client(delta=True), stack.client(delta=False)]
        with caplog.at_level(logging.WARNING, logger="relay.variants"):
            await clients[0].send(node=params_node("canary"), type_url=CLUSTER,
                                  resource_locators_subscribe=locator(env="canary",
                                                                      region="eu"))
            [sent] = (await clients[0].recv()).resources
            assert sent.resource_name == named(canary_eu)
            await clients[1].send(node=node("s"), type_url=CLUSTER,
                                  resource_locators=locator(env="canary", region="eu"))
            assert labels(await clients[1].recv()) == ["canary-eu"]
        assert await conflicts_counted(stack.relay.admin_port) == 2
        warnings = [r.getMessage() for r in caplog.records if r.name == "relay.variants"]
        assert len(warnings) == 1
        assert "several variants of Cluster 'svc' match the same parameters" in warnings[0]


# -- what the origin sends ----------------------------------------------------------------------


async def test_invariant_26_invalid_constraints_in_a_removal_are_nacked_clients_keep_theirs(
        ) -> None:
    async with running_stack(publish(ScriptedOrigin())) as stack:
        delta, _ = await subscribed_canary(stack, delta=True)
        sotw, _ = await subscribed_canary(stack, delta=False)
        bad = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        changed = bad.resources.add(version="canary-2", resource=pack(svc("canary-2")))
        changed.resource_name.CopyFrom(named(CANARY))
        bad.removed_resource_names.append(named(DPC(constraint={"key": "env"})))
        stack.origin.send_raw(bad)

        def nacked() -> list[discovery_pb2.DeltaDiscoveryRequest]:
            return [r for r in stack.origin.all_requests() if r.response_nonce == bad.nonce]

        await eventually(nacked)
        [nack] = nacked()
        assert nack.error_detail.code == 3 and nack.error_detail.message == (
            "removed resource 'svc' has invalid dynamic parameter constraints: "
            "constraint: key 'env' has neither value nor exists")
        await quiet(delta, sotw)
        # The cache kept canary-1: a new canary client is served it.
        _, served = await subscribed_canary(stack, delta=True)
        assert [r.version for r in served.resources] == ["canary-1"]


async def test_invariant_30_a_removal_with_reordered_and_children_removes_the_variant(
        ) -> None:
    origin = ScriptedOrigin()
    as_sent = both(CANARY, ZONE_B)
    origin.set_variant(svc("canary-b"), as_sent, "1")
    async with running_stack(origin) as stack:
        delta, sotw = stack.client(delta=True), stack.client(delta=False)
        params = locator(env="canary", zone="b")
        await delta.send(node=node("d"), type_url=CLUSTER, resource_locators_subscribe=params)
        await sotw.send(node=node("s"), type_url=CLUSTER, resource_locators=params)
        await delta.ack(await delta.recv())
        await sotw_ack(sotw, await sotw.recv(), resource_locators=params)

        reordered = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        reordered.removed_resource_names.append(named(both(ZONE_B, CANARY)))
        origin.send_raw(reordered)
        gone = await delta.recv()
        assert list(gone.removed_resource_names) == [named(as_sent)]
        assert list(gone.resources) == [] and list(gone.removed_resources) == []
        emptied = await sotw.recv()
        assert emptied.type_url == CLUSTER and list(emptied.resources) == []


async def test_invariant_13_a_plain_removal_reaches_each_holder_with_its_constraints() -> None:
    async with running_stack(publish(ScriptedOrigin())) as stack:
        canary, _ = await subscribed_canary(stack, delta=True)
        prod = stack.client(delta=True)
        await prod.send(node=params_node("prod"), type_url=CLUSTER,
                        resource_names_subscribe=["svc"])
        await prod.ack(await prod.recv())
        sotw, _ = await subscribed_canary(stack, delta=False)

        stack.origin.send_raw(discovery_pb2.DeltaDiscoveryResponse(
            type_url=CLUSTER, removed_resources=["svc"]))
        for client, constraints in ((canary, CANARY), (prod, PROD)):
            gone = await client.recv()
            assert list(gone.removed_resource_names) == [named(constraints)]
            assert list(gone.removed_resources) == [] and list(gone.resources) == []
        emptied = await sotw.recv()
        assert emptied.type_url == CLUSTER and list(emptied.resources) == []


async def test_invariant_30_an_unconstrained_origin_resource_serves_clients_with_parameters(
        ) -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        first = stack.client(delta=True)
        await first.send(node=node("first"), type_url=CLUSTER,
                         resource_locators_subscribe=locator(env="canary"))
        assert located([await origin.next_request()]) == [[("svc", {"env": "canary"})]]
        # The origin answers the locator with a plain-named resource.
        plain = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        plain.resources.add(name="svc", version="1", resource=pack(svc("plain")))
        origin.send_raw(plain)
        [sent] = (await first.recv()).resources
        assert sent.name == "svc" and not sent.HasField("resource_name")
        assert label_of(sent) == "plain"

        by_node, sotw_located = stack.client(delta=True), stack.client(delta=False)
        sotw_by_node = stack.client(delta=False)
        await by_node.send(node=params_node("prod"), type_url=CLUSTER,
                           resource_names_subscribe=["svc"])
        await sotw_located.send(node=node("s"), type_url=CLUSTER,
                                resource_locators=locator(env="dev"))
        await sotw_by_node.send(node=params_node("canary"), type_url=CLUSTER,
                                resource_names=["svc"])
        assert labels(await by_node.recv()) == ["plain"]
        [wrapped] = (await sotw_located.recv()).resources
        assert unwrapped(wrapped).name == "svc" and label_of(wrapped) == "plain"
        assert labels(await sotw_by_node.recv()) == ["plain"]
        # All served from cache: the origin was asked once.
        assert len(origin.subscription_requests()) == 1


# -- upstream locators follow the clients ---------------------------------------------------------


async def test_invariant_25_31_a_parameter_change_swaps_the_upstream_locator() -> None:
    async with running_stack(publish(ScriptedOrigin())) as stack:
        client, _ = await subscribed_canary(stack, delta=True)
        await client.send(node=params_node("prod"), type_url=CLUSTER)
        assert labels(await client.recv()) == ["prod"]
        requests = stack.origin.subscription_requests()
        assert located(requests) == [[("svc", {"env": "canary"})], [("svc", {"env": "prod"})]]
        assert located(requests, subscribe=False) == [[("svc", {"env": "canary"})]]
        # Subscribe and unsubscribe go in one request: the variant never lapses.
        assert list(requests[-1].resource_locators_unsubscribe) == [
            discovery_pb2.ResourceLocator(name="svc", dynamic_parameters={"env": "canary"})]


async def test_invariant_25_31_with_linger_the_old_locator_goes_only_after_the_linger(
        ) -> None:
    clock = ManualClock()
    async with running_stack(publish(ScriptedOrigin()), linger="0.2s", clock=clock) as stack:
        origin = stack.origin
        client, _ = await subscribed_canary(stack, delta=True)
        await client.send(node=params_node("prod"), type_url=CLUSTER)
        assert labels(await client.recv()) == ["prod"]
        # The old locator lingers: no unsubscribe until the linger is over.
        await clock.advance(0.15)
        await client.expect_nothing()
        assert not located(origin.subscription_requests(), subscribe=False)
        await clock.advance(0.1)  # past the linger
        await eventually(lambda: bool(located(origin.subscription_requests(),
                                              subscribe=False)))
        requests = origin.subscription_requests()
        assert located(requests) == [[("svc", {"env": "canary"})], [("svc", {"env": "prod"})]]
        assert located(requests, subscribe=False) == [[("svc", {"env": "canary"})]]
        assert located(requests[-1:], subscribe=False) == [[("svc", {"env": "canary"})]]
