"""End to end: TTLs and heartbeats from the origin (invariants 18 and 22)."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import CLUSTER
from tests.clock import ManualClock
from tests.harness import ScriptedOrigin, cluster, node, pack, running_stack
from tests.variants import RESOURCE_TYPE


def ttl_response(*, body: bool, version: str = "v1",
                 ttl_ms: int = 2000) -> discovery_pb2.DeltaDiscoveryResponse:
    response = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
    resource = response.resources.add(name="a", version=version)
    resource.ttl.FromMilliseconds(ttl_ms)
    if body:
        resource.resource.CopyFrom(pack(cluster("a")))
    return response


def aware_node(name: str) -> base_pb2.Node:
    n = node(name)
    n.client_features.append("xds.config.supports-resource-in-sotw")
    return n


async def test_invariant_18_22_heartbeats_reach_clients_as_heartbeats() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        delta, aware, plain = stack.client(), stack.client(delta=False), stack.client(delta=False)
        await delta.send(node=node("d"), type_url=CLUSTER, resource_names_subscribe=["a"])
        await aware.send(node=aware_node("aware"), type_url=CLUSTER, resource_names=["a"])
        await plain.send(node=node("plain"), type_url=CLUSTER, resource_names=["a"])
        await origin.next_request()
        origin.send_raw(ttl_response(body=True))
        first = await delta.recv()
        assert first.resources[0].HasField("resource")
        assert first.resources[0].ttl.ToMilliseconds() == 2000  # TTL forwarded
        await delta.ack(first)
        # invariant 18: wrapped in Resource only for the client that asked for it
        wrapped = await aware.recv()
        assert wrapped.resources[0].type_url == RESOURCE_TYPE
        inner = discovery_pb2.Resource.FromString(wrapped.resources[0].value)
        assert inner.ttl.ToMilliseconds() == 2000 and inner.HasField("resource")
        await aware.ack(wrapped, resource_names=["a"])
        bare = await plain.recv()
        assert bare.resources[0].type_url == CLUSTER
        await plain.ack(bare, resource_names=["a"])

        origin.send_raw(ttl_response(body=False))
        beat = await delta.recv()
        [resource] = beat.resources
        assert resource.name == "a" and resource.version == "v1"
        assert not resource.HasField("resource")  # a heartbeat, not an update
        await delta.ack(beat)
        sotw_beat = await aware.recv()
        inner = discovery_pb2.Resource.FromString(sotw_beat.resources[0].value)
        assert not inner.HasField("resource") and inner.version == "v1"
        assert sotw_beat.version_info == wrapped.version_info
        await plain.expect_nothing()  # it cannot express a heartbeat


async def test_invariant_22_lapsed_ttl_removes_the_resource_and_no_heartbeat_is_invented(
) -> None:
    origin = ScriptedOrigin(auto=False)
    clock = ManualClock()
    async with running_stack(origin, clock=clock) as stack:
        delta, sotw = stack.client(), stack.client(delta=False)
        await delta.send(node=node("d"), type_url=CLUSTER, resource_names_subscribe=["a"])
        await sotw.send(node=node("s"), type_url=CLUSTER, resource_names=["a"])
        await origin.next_request()
        origin.send_raw(ttl_response(body=True, ttl_ms=600))
        await delta.ack(await delta.recv())
        await sotw.ack(await sotw.recv(), resource_names=["a"])
        await origin.stop()  # the origin is gone: no heartbeat will come
        await clock.advance(0.5)
        await delta.expect_nothing()  # the relay does not invent one, nor expire early
        await clock.advance(0.1)  # the TTL lapses
        gone = await delta.recv()
        assert list(gone.removed_resources) == ["a"] and not gone.resources
        emptied = await sotw.recv()
        assert not emptied.resources  # full-state CDS: absence means deletion


async def test_invariant_22_an_unchanged_resend_restarts_the_clients_ttl_as_a_heartbeat(
) -> None:
    # The relay pushes nothing for an identical resend (istiod resends
    # everything on every new stream), but a client's TTL must not lapse
    # because the relay swallowed what refreshed it at the origin.
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        delta = stack.client()
        await delta.send(node=node("d"), type_url=CLUSTER, resource_names_subscribe=["a"])
        await origin.next_request()
        origin.send_raw(ttl_response(body=True))
        await delta.ack(await delta.recv())
        origin.send_raw(ttl_response(body=True))
        beat = await delta.recv()
        [resource] = beat.resources
        assert resource.version == "v1" and not resource.HasField("resource")
        assert resource.ttl.ToMilliseconds() == 2000
