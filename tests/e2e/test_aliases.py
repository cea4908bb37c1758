"""End to end: subscribing by alias, VHDS style (invariant 12)."""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import VIRTUAL_HOST
from tests.harness import ScriptedOrigin, eventually, node, pack, running_stack

ALIAS = "routes/example.com"
CANONICAL = "routes/vh1"


def virtual_host(version: str) -> discovery_pb2.DeltaDiscoveryResponse:
    response = discovery_pb2.DeltaDiscoveryResponse(type_url=VIRTUAL_HOST)
    response.resources.add(
        name=CANONICAL, version=version, aliases=[ALIAS],
        resource=pack(route_components_pb2.VirtualHost(name=CANONICAL,
                                                       domains=["example.com"])))
    return response


async def test_invariant_12_alias_subscription_delivers_canonical_name_with_aliases() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node(), type_url=VIRTUAL_HOST, resource_names_subscribe=[ALIAS])
        subscribe = await origin.next_request()
        assert list(subscribe.resource_names_subscribe) == [ALIAS]
        origin.send_raw(virtual_host("1"))
        await origin.next_request()  # the relay's ACK
        response = await client.recv()
        [resource] = response.resources
        assert resource.name == CANONICAL and list(resource.aliases) == [ALIAS]
        await client.ack(response)

        # A second client by the same alias is served from cache.
        second = stack.client()
        await second.send(node=node("2"), type_url=VIRTUAL_HOST, resource_names_subscribe=[ALIAS])
        assert [r.name for r in (await second.recv()).resources] == [CANONICAL]

        # An update of the canonical resource reaches alias subscribers.
        origin.send_raw(virtual_host("2"))
        update = await client.recv()
        assert [(r.name, r.version) for r in update.resources] == [(CANONICAL, "2")]
        await client.ack(update)

        # Removal of the canonical resource is reported under its own name.
        origin.send_raw(discovery_pb2.DeltaDiscoveryResponse(
            type_url=VIRTUAL_HOST, removed_resources=[CANONICAL]))
        gone = await client.recv()
        assert list(gone.removed_resources) == [CANONICAL] and not gone.resources

        # Unsubscribing the alias, by everyone, unsubscribes it upstream.
        await client.send(type_url=VIRTUAL_HOST, resource_names_unsubscribe=[ALIAS])
        await second.send(type_url=VIRTUAL_HOST, resource_names_unsubscribe=[ALIAS])
        await eventually(lambda: any(list(r.resource_names_unsubscribe) == [ALIAS]
                                     for r in origin.all_requests()))


async def test_invariant_8_subscribed_by_alias_and_by_name_the_resource_goes_out_once() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node(), type_url=VIRTUAL_HOST,
                          resource_names_subscribe=[ALIAS, CANONICAL])
        await origin.next_request()
        origin.send_raw(virtual_host("1"))
        response = await client.recv()
        assert [r.name for r in response.resources] == [CANONICAL]
        await client.ack(response)

        origin.send_raw(discovery_pb2.DeltaDiscoveryResponse(
            type_url=VIRTUAL_HOST, removed_resources=[CANONICAL]))
        gone = await client.recv()
        assert list(gone.removed_resources) == [CANONICAL] and not gone.resources
