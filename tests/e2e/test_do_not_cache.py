"""End to end: cache_control.do_not_cache (invariant 23)."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import ENDPOINT
from tests.harness import ScriptedOrigin, endpoints, node, pack, running_stack


def uncacheable(port: int, version: str) -> discovery_pb2.DeltaDiscoveryResponse:
    response = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT)
    resource = response.resources.add(name="a", version=version,
                                      resource=pack(endpoints("a", port)))
    resource.cache_control.do_not_cache = True
    return response


async def test_invariant_23_do_not_cache_is_forwarded_but_never_served_from_cache() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        first = stack.client()
        await first.send(node=node("1"), type_url=ENDPOINT, resource_names_subscribe=["a"])
        await origin.next_request()
        origin.send_raw(uncacheable(1, "v1"))
        await origin.next_request()  # ACK
        got = await first.recv()
        assert [r.version for r in got.resources] == ["v1"]
        assert got.resources[0].cache_control.do_not_cache  # forwarded as is
        await first.ack(got)

        # A later client is not served the cached copy: the relay fetches again.
        late = stack.client(delta=False)
        await late.send(node=node("2"), type_url=ENDPOINT, resource_names=["a"])
        await late.expect_nothing()
        refetch = await origin.next_request()
        assert list(refetch.resource_names_subscribe) == ["a"]
        origin.send_raw(uncacheable(2, "v2"))
        fresh = await late.recv()
        body = fresh.resources[0]
        assert body.type_url == ENDPOINT
        # The client that already had it gets the new version as a normal update.
        update = await first.recv()
        assert [r.version for r in update.resources] == ["v2"]
        await first.ack(update)
        # The same version fetched again is not resent to who holds it.
        origin.send_raw(uncacheable(2, "v2"))
        await first.expect_nothing()
