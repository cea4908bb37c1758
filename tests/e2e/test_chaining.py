"""Zone relays chained under a regional relay: origin -> regional -> zones -> clients.

Each relay follows the one above it over Delta ADS, as it would any origin.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc

from relay.app import Relay, build_relay
from relay.config import parse_config
from relay.xds_types import CLUSTER, ENDPOINT
from tests.harness import (
    ADS,
    ScriptedOrigin,
    XdsClient,
    cluster,
    endpoints,
    eventually,
    names_of,
    node,
    relay_config,
)


def following(port: int, node_id: str) -> Relay:
    """A relay following whatever serves Delta ADS on ``port``."""
    config = parse_config(relay_config(port))
    return build_relay(config.model_copy(update={
        "node": config.node.model_copy(update={"id": node_id})}))


@contextlib.asynccontextmanager
async def clients_of(relay: Relay) -> AsyncIterator[tuple[XdsClient, XdsClient]]:
    """A delta and a SotW ADS client of ``relay``."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}") as channel:
        delta = XdsClient(channel, ADS + "DeltaAggregatedResources", True)
        sotw = XdsClient(channel, ADS + "StreamAggregatedResources", False)
        try:
            yield delta, sotw
        finally:
            delta.close()
            sotw.close()


async def test_zone_relays_under_a_regional_relay_pass_changes_and_removals_down() -> None:
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"), cluster("b"), endpoints("a", 1), version="v1")
    regional = following(origin.port, "relay-region")
    await regional.start()
    zones = [following(regional.xds_port, f"relay-zone-{zone}") for zone in "ab"]
    for zone in zones:
        await zone.start()
    try:
        async with clients_of(zones[0]) as (delta, sotw), clients_of(zones[1]) as (other, _):
            await delta.send(node=node("envoy-a1"), type_url=CLUSTER)
            await sotw.send(node=node("envoy-a2"), type_url=ENDPOINT, resource_names=["a"])
            await other.send(node=node("envoy-b1"), type_url=CLUSTER)
            first = await delta.recv()
            assert sorted(names_of(first)) == ["a", "b"]
            assert {r.version for r in first.resources} == {"v1"}  # the origin's, unchanged
            await delta.ack(first)
            await other.ack(await other.recv())
            await sotw.ack(await sotw.recv(), resource_names=["a"])

            # The origin serves one stream, to the regional relay, under its node;
            # the regional relay one per zone relay.
            assert len(origin.streams) == 1
            assert origin.streams[0].log[0].node.id == "relay-region"
            await eventually(lambda: len(regional.serving.streams) == 2)
            zones_seen = {s["node_id"] for s in regional.serving.client_statuses()}
            assert zones_seen == {"relay-zone-a", "relay-zone-b"}

            origin.set(cluster("a", timeout_s=9), version="v2")
            changed = await delta.recv()
            assert [(r.name, r.version) for r in changed.resources] == [("a", "v2")]
            await delta.ack(changed)
            changed = await other.recv()
            assert [(r.name, r.version) for r in changed.resources] == [("a", "v2")]
            await other.ack(changed)

            origin.set(endpoints("a", 2), version="v2")
            assert names_of(await sotw.recv()) == ["a"]

            origin.remove(CLUSTER, "b")
            removal = await delta.recv()
            assert list(removal.removed_resources) == ["b"] and not removal.resources
            assert list((await other.recv()).removed_resources) == ["b"]
            assert len(origin.streams) == 1
    finally:
        for relay in (*zones, regional):
            await relay.stop(0)
        await origin.stop()
