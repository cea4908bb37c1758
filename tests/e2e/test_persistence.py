"""End to end, in process: relays with a snapshot in a real Redis (or a
directory), a scripted origin that goes away and comes back, real clients.
The same with real processes and SIGKILL is in ``test_persistence_processes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from relay.app import Relay, build_relay
from relay.config import parse_config
from relay.persistence.stores import RedisStore
from relay.server.ecosystem import ADS_SERVICE
from relay.xds_types import CLUSTER
from tests.harness import (
    ADS,
    TIMEOUT,
    ScriptedOrigin,
    XdsClient,
    cluster,
    eventually,
    node,
    relay_config,
    serving_relay,
    version_of,
)
from tests.istiod import IstiodOrigin
from tests.persistence.test_writer import writes
from tests.redis_server import RedisServer, redis_server

DELTA_ADS = ADS + "DeltaAggregatedResources"
SOTW_ADS = ADS + "StreamAggregatedResources"


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


_zones = iter(range(1, 1_000_000))


@pytest.fixture
def persistence(redis: RedisServer) -> str:
    """A persistence section of a zone of the test's own."""
    return (f'persistence: {{redis: {{url: "{redis.url}", key_prefix: "zone-{next(_zones)}", '
            f'timeout: 1s}}}}')


def config(origin_port: int, persistence: str, **options: str) -> Any:
    return parse_config(relay_config(origin_port, **options) + persistence, "relay.yaml")


@contextlib.asynccontextmanager
async def running(origin_port: int, persistence: str, **options: str
                  ) -> AsyncIterator[tuple[Relay, grpc.aio.Channel]]:
    relay = build_relay(config(origin_port, persistence, **options))
    async with serving_relay(relay) as channel:
        yield relay, channel


async def subscribed(channel: grpc.aio.Channel, client_id: str, names: list[str] | None = None,
                     delta: bool = True) -> XdsClient:
    """A client subscribed to CDS: ``names``, or every cluster (wildcard)."""
    client = XdsClient(channel, DELTA_ADS if delta else SOTW_ADS, delta)
    if delta:
        await client.send(node=node(client_id), type_url=CLUSTER,
                          resource_names_subscribe=names or ["*"])
    else:
        await client.send(node=node(client_id), type_url=CLUSTER, resource_names=names or [])
    return client


async def received(client: XdsClient) -> dict[str, str]:
    """One response, ACKed: name -> version (delta: removals as "removed")."""
    response = await client.recv()
    await client.ack(response)
    if client.delta:
        return {**{r.name: r.version for r in response.resources},
                **dict.fromkeys(response.removed_resources, "removed")}
    return {cluster_name(body): response.version_info for body in response.resources}


def cluster_name(body: Any) -> str:
    from envoy.config.cluster.v3 import cluster_pb2

    return str(cluster_pb2.Cluster.FromString(body.value).name)


async def written(relay: Relay) -> None:
    """Wait until the relay's snapshot holds everything its cache changed."""
    writer = relay.snapshot_writer
    assert writer is not None
    while writer.pending():
        writer.written.clear()
        await asyncio.wait_for(writer.written.wait(), TIMEOUT)


async def sync_and_stop(origin: ScriptedOrigin | IstiodOrigin, persistence: str,
                        names: list[str] | None = None) -> dict[str, str]:
    """A relay synced with ``origin`` through one client, its snapshot saved;
    then the relay stopped. What the client got."""
    async with running(origin.port, persistence) as (relay, channel):
        client = await subscribed(channel, "first", names)
        got = await received(client)
        await written(relay)
        client.close()
    return got


async def test_a_restarted_relay_serves_its_snapshot_and_resumes_with_only_the_differences(
        persistence: str) -> None:
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"), cluster("b"), cluster("c"))
    first = await sync_and_stop(origin, persistence)
    assert first == {n: version_of(cluster(n)) for n in "abc"}
    port = origin.port
    await origin.stop()  # the origin goes away; the relay restarts meanwhile

    async with running(port, persistence) as (relay, channel):
        assert relay.not_ready_reason() is None
        assert relay.ready_detail().startswith(
            "serving a snapshot (3 resources of 1 types from redis 127.0.0.1:")
        health = health_pb2_grpc.HealthStub(channel)
        checked = await health.Check(health_pb2.HealthCheckRequest(service=ADS_SERVICE))
        assert checked.status == health_pb2.HealthCheckResponse.SERVING
        client = await subscribed(channel, "after-restart")
        assert await received(client) == first
        sotw = await subscribed(channel, "sotw", delta=False)
        assert set(await received(sotw)) == {"a", "b", "c"}

        # The origin returns with one change and one deletion.
        revived = ScriptedOrigin()
        revived.set(cluster("a"), cluster("b", timeout_s=9))
        await revived.start(port)
        try:
            request = await revived.next_request()
            assert dict(request.initial_resource_versions) == first
            changes: dict[str, str] = {}
            while len(changes) < 2:
                changes.update(await received(client))
            assert changes == {"b": version_of(cluster("b", timeout_s=9)), "c": "removed"}
            await client.expect_nothing()
            assert set(await received(sotw)) == {"a", "b"}
            await sotw.expect_nothing()
            assert relay.ready_detail() == f"synced with the origin at 127.0.0.1:{port}"
            await written(relay)
        finally:
            client.close()
            sotw.close()
            await revived.stop()

    loaded = await RedisStore(relay.config.persistence.redis.url,  # type: ignore[union-attr]
                              relay.config.snapshot_prefix(), 1.0).load()
    assert loaded is not None and sorted(loaded.entries[CLUSTER]) == ["a", "b"]


async def test_after_an_istiod_like_origin_returns_only_what_changed_is_pushed(
        persistence: str, tmp_path: Path) -> None:
    # istiod sends no versions and ignores initial_resource_versions: it
    # resends everything, and says nothing of what it deleted meanwhile.
    origin = await IstiodOrigin().start()
    origin.set(cluster("a"), cluster("b"), cluster("c"))
    first = await sync_and_stop(origin, persistence)
    port = origin.port
    await origin.stop()
    async with running(port, persistence) as (_relay, channel):
        client = await subscribed(channel, "after-restart")
        assert await received(client) == first
        revived = IstiodOrigin()
        revived.set(cluster("a"), cluster("b", timeout_s=9))
        await revived.start(port)
        try:
            changes: dict[str, str] = {}
            while len(changes) < 2:
                changes.update(await received(client))
            assert set(changes) == {"b", "c"} and changes["c"] == "removed"
            assert changes["b"] != first["b"]
            await client.expect_nothing(within=1.0)  # past the reconcile grace
        finally:
            client.close()
            await revived.stop()


async def test_restored_names_no_client_wants_are_dropped_when_the_origin_returns(
        persistence: str) -> None:
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"), cluster("b"))
    await sync_and_stop(origin, persistence, ["a", "b"])
    port = origin.port
    await origin.stop()
    async with running(port, persistence) as (relay, channel):
        assert sorted(relay.cache.names(CLUSTER)) == ["a", "b"]
        client = await subscribed(channel, "wants-a", ["a"])
        assert await received(client) == {"a": version_of(cluster("a"))}
        revived = await ScriptedOrigin().start(port)
        revived.set(cluster("a"))
        try:
            request = await revived.next_request()
            # Only what a client wants is declared; "b" is forgotten, not
            # removed: the snapshot keeps it for the next restart.
            assert dict(request.initial_resource_versions) == {"a": version_of(cluster("a"))}
            await eventually(lambda: relay.cache.names(CLUSTER) == ["a"])
            await written(relay)
        finally:
            client.close()
            await revived.stop()
    loaded = await RedisStore(relay.config.persistence.redis.url,  # type: ignore[union-attr]
                              relay.config.snapshot_prefix(), 1.0).load()
    assert loaded is not None and sorted(loaded.entries[CLUSTER]) == ["a", "b"]


async def test_a_nacked_origin_response_is_never_stored(persistence: str) -> None:
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"))
    async with running(origin.port, persistence) as (relay, channel):
        client = await subscribed(channel, "c1")
        assert await received(client) == {"a": version_of(cluster("a"))}
        await written(relay)
        bad = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        bad.resources.add(name="a", version="broken").resource.type_url = "wrong-type"
        origin.send_raw(bad)
        await eventually(lambda: any(r.HasField("error_detail")
                                     for r in origin.all_requests()))
        client.close()
    await origin.stop()
    loaded = await RedisStore(relay.config.persistence.redis.url,  # type: ignore[union-attr]
                              relay.config.snapshot_prefix(), 1.0).load()
    assert loaded is not None
    fresh = build_relay(relay.config)
    from relay.persistence.restore import restore

    restore(fresh.cache, loaded, "test", 0.0, 0.0)
    found = fresh.cache.variants(CLUSTER, "a")
    assert isinstance(found, dict) and found[""].version == version_of(cluster("a"))


async def test_redis_killed_under_load_goes_unnoticed_and_the_snapshot_catches_up(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "relay.persistence")
    server = RedisServer().start()
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"))
    section = f'persistence: {{redis: {{url: "{server.url}", key_prefix: "load", timeout: 1s}}}}'
    try:
        async with running(origin.port, section) as (relay, channel):
            clients = [await subscribed(channel, f"c{i}") for i in range(5)]
            for client in clients:
                await received(client)
            await written(relay)
            server.kill()
            for timeout_s in range(2, 12):  # ten origin updates with Redis gone
                origin.set(cluster("a", timeout_s=timeout_s))
                for client in clients:
                    assert await received(client) == {
                        "a": version_of(cluster("a", timeout_s=timeout_s))}
            await eventually(lambda: writes(relay.registry, "failed") >= 1)
            assert relay.not_ready_reason() is None
            server.start()  # same port, empty: everything is written again as it changes
            origin.set(cluster("a", timeout_s=99))
            for client in clients:
                await received(client)
            await eventually(lambda: relay.snapshot_writer is not None and
                             relay.snapshot_writer.pending() == 0 and
                             writes(relay.registry, "ok") >= 2, timeout=15)
            for client in clients:
                client.close()
        outage_lines = [r for r in caplog.records if "snapshot not saved" in r.getMessage()]
        assert len(outage_lines) == 1, [r.getMessage() for r in outage_lines]
        assert any("snapshot saved to" in r.getMessage() and "again after" in r.getMessage()
                   for r in caplog.records)
        loaded = await RedisStore(server.url, "load", 1.0).load()
        assert loaded is not None and list(loaded.entries[CLUSTER]) == ["a"]
    finally:
        server.stop()
        await origin.stop()


async def test_a_frozen_redis_at_start_delays_serving_by_load_timeout_at_most(
        caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer().start()
    server.freeze()
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"))
    section = (f'persistence: {{redis: {{url: "{server.url}", timeout: 200ms}}, '
               f'load_timeout: 300ms}}')
    try:
        async with running(origin.port, section) as (relay, channel):
            assert relay.restored is None
            assert "snapshot not loaded" in caplog.text
            client = await subscribed(channel, "c1")
            assert await received(client) == {"a": version_of(cluster("a"))}
            client.close()
    finally:
        server.stop()
        await origin.stop()


async def test_a_directory_snapshot_serves_a_restarted_relay(tmp_path: Path) -> None:
    section = f'persistence: {{directory: "{tmp_path / "snapshot"}"}}'
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"), cluster("b"))
    first = await sync_and_stop(origin, section)
    port = origin.port
    await origin.stop()
    async with running(port, section) as (relay, channel):
        assert relay.ready_detail().startswith("serving a snapshot (2 resources")
        client = await subscribed(channel, "after-restart")
        assert await received(client) == first
        client.close()


async def test_without_a_snapshot_the_relay_waits_for_the_origin_as_before(
        persistence: str) -> None:
    origin = await ScriptedOrigin().start()
    port = origin.port
    await origin.stop()
    async with running(port, persistence) as (relay, _):
        assert relay.not_ready_reason() == "not yet synced with the origin"
        assert relay.restored is None
