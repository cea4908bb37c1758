"""The make-run topology: a file-source origin relay, a zone relay, a client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from relay.app import build_relay
from relay.config import parse_config
from relay.xds_types import CLUSTER
from tests.harness import XdsClient, node

ADS_DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"


def cluster_yaml(name: str, timeout: str = "1s") -> str:
    return f"""
"@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
name: {name}
connect_timeout: {timeout}
type: EDS
eds_cluster_config: {{eds_config: {{ads: {{}}, resource_api_version: V3}}}}
"""


@contextlib.asynccontextmanager
async def chain(directory: Path) -> AsyncIterator[XdsClient]:
    origin = build_relay(parse_config(f"""
node: {{id: origin}}
server: {{address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{files: "{directory}", poll_interval: 0.05s}}
"""))
    await origin.start()
    zone = build_relay(parse_config(f"""
node: {{id: zone-a}}
server: {{address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{address: "127.0.0.1:{origin.xds_port}", backoff: {{initial: 0.05s, max: 0.5s}}}}
"""))
    await zone.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{zone.xds_port}")
    client = XdsClient(channel, ADS_DELTA, delta=True)
    try:
        yield client
    finally:
        client.close()
        await channel.close()
        await zone.stop(0)
        await origin.stop(0)


async def test_file_edits_reach_clients_through_two_relays(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(cluster_yaml("a"))
    (tmp_path / "b.yaml").write_text(cluster_yaml("b"))
    async with chain(tmp_path) as client:
        await client.send(node=node(), type_url=CLUSTER)
        first = await client.recv()
        versions = {r.name: r.version for r in first.resources}
        assert sorted(versions) == ["a", "b"]
        await client.ack(first)

        (tmp_path / "a.yaml").write_text(cluster_yaml("a", "5s"))
        changed = await client.recv()
        assert [r.name for r in changed.resources] == ["a"]  # only what changed
        assert changed.resources[0].version != versions["a"]
        await client.ack(changed)

        (tmp_path / "b.yaml").write_text("name: [unclosed\n")
        await client.expect_nothing(0.5)  # a broken file keeps its last good content

        (tmp_path / "b.yaml").unlink()
        removed = await client.recv()
        assert list(removed.removed_resources) == ["b"] and list(removed.resources) == []
