"""End to end: several origins behind one relay, routed by the authority of
``xdstp://`` names (issue 25 item 3; invariants 35 and 36).

Two scripted origins on loopback: the default one (``upstream:``) and the
origin of ``east.example.com`` (``authorities:``). Real delta and SotW
clients subscribe names of both; each origin must be asked for its own names
only, over one stream each, and one origin's outage must touch only its
names.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import ClientSession
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.app import Relay, build_relay
from relay.config import parse_config
from relay.xds_types import CLUSTER
from tests.builders import cluster, version_of
from tests.e2e.test_metrics import labels, scrape, series
from tests.harness import (
    ADS,
    QUIET,
    TIMEOUT,
    ScriptedOrigin,
    XdsClient,
    eventually,
    node,
    serving_relay,
)

DELTA_ADS = ADS + "DeltaAggregatedResources"
EAST = "east.example.com"
EAST_CLUSTER = f"xdstp://{EAST}/envoy.config.cluster.v3.Cluster/backend-east"
WEST_CLUSTER = "xdstp://west.example.com/envoy.config.cluster.v3.Cluster/backend-west"


def config_text(default_port: int | None, east_port: int, extra: str = "") -> str:
    default = "" if default_port is None else f"""
upstream:
  address: "127.0.0.1:{default_port}"
  answer_grace: 0.3s
  backoff: {{initial: 0.05s, max: 0.2s}}"""
    return f"""
node: {{id: relay-test, cluster: xds-relay}}
server: {{address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}{default}
authorities:
  {EAST}:
    address: "127.0.0.1:{east_port}"
    answer_grace: 0.3s
    backoff: {{initial: 0.05s, max: 0.2s}}
{extra}"""


@contextlib.asynccontextmanager
async def relay_for(default_port: int | None, east_port: int, extra: str = ""
                    ) -> AsyncIterator[tuple[Relay, grpc.aio.Channel]]:
    relay = build_relay(parse_config(config_text(default_port, east_port, extra)))
    async with serving_relay(relay) as channel:
        yield relay, channel


@pytest.fixture
async def origins() -> AsyncIterator[tuple[ScriptedOrigin, ScriptedOrigin]]:
    default, east = ScriptedOrigin(), ScriptedOrigin()
    default.set(cluster("backend-default"), cluster(WEST_CLUSTER))
    east.set(cluster(EAST_CLUSTER))
    await default.start()
    await east.start()
    yield default, east
    await default.stop()
    await east.stop()


def subscribed_names(origin: ScriptedOrigin) -> set[str]:
    return {name for request in origin.all_requests() for name in request.resource_names_subscribe}


async def delta_client(channel: grpc.aio.Channel, names: list[str]) -> XdsClient:
    client = XdsClient(channel, DELTA_ADS, delta=True)
    await client.send(node=node("client-1"), type_url=CLUSTER, resource_names_subscribe=names)
    return client


async def collect(client: XdsClient, count: int) -> dict[str, str]:
    """Responses ACKed until ``count`` names were answered: name -> version or "removed"."""
    seen: dict[str, str] = {}
    while len(seen) < count:
        response = await client.recv()
        await client.ack(response)
        seen.update({r.name: r.version for r in response.resources})
        seen.update(dict.fromkeys(response.removed_resources, "removed"))
    return seen


async def test_invariant_37_each_origin_is_asked_for_its_own_names_only(
        origins: tuple[ScriptedOrigin, ScriptedOrigin]) -> None:
    default, east = origins
    async with relay_for(default.port, east.port) as (relay, channel):
        client = await delta_client(channel, ["backend-default", EAST_CLUSTER, WEST_CLUSTER])
        got = await collect(client, 3)
        assert got == {"backend-default": version_of(cluster("backend-default")),
                       EAST_CLUSTER: version_of(cluster(EAST_CLUSTER)),
                       WEST_CLUSTER: version_of(cluster(WEST_CLUSTER))}
        # an unlisted authority (west) goes to the default origin
        assert subscribed_names(default) == {"backend-default", WEST_CLUSTER}
        assert subscribed_names(east) == {EAST_CLUSTER}
        # one stream per origin, never per client
        second = await delta_client(channel, ["backend-default", EAST_CLUSTER])
        assert await collect(second, 2) == {k: got[k] for k in ("backend-default", EAST_CLUSTER)}
        assert (len(default.streams), len(east.streams)) == (1, 1)
        client.close()
        second.close()
        assert relay.not_ready_reason() is None
        samples = await scrape(relay.admin_port)
        assert series(samples, "xds_relay_upstream_subscriptions") == {
            labels(origin="default", type="Cluster"): 2, labels(origin=EAST, type="Cluster"): 1}


async def test_invariant_37_one_origin_down_touches_only_its_names(
        origins: tuple[ScriptedOrigin, ScriptedOrigin]) -> None:
    default, east = origins
    async with relay_for(default.port, east.port) as (relay, channel):
        client = await delta_client(channel, ["backend-default", EAST_CLUSTER])
        await collect(client, 2)
        await east.stop()
        assert relay.origins is not None
        east_client = relay.origins.clients[EAST]
        await eventually(lambda: not east_client.connected_event.is_set())
        # the other origin's updates keep flowing; the east cluster stays
        changed = cluster("backend-default", timeout_s=7)
        default.set(changed)
        assert await collect(client, 1) == {"backend-default": version_of(changed)}
        await client.expect_nothing(QUIET)
        async with ClientSession() as http, \
                http.get(f"http://127.0.0.1:{relay.admin_port}/ready") as reply:
            body = await reply.text()
        assert reply.status == 200
        assert re.search(f"origin {EAST} at 127.0.0.1:{east.port} unreachable since "
                         r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(serving what it sent\)", body), body
        assert "synced with origin default" in body
        # east back: the relay resyncs it, declaring what it holds; the
        # client is sent nothing it has
        streams = len(east.streams)
        await east.start(east.port)
        await eventually(lambda: len(east.streams) > streams, TIMEOUT)
        await eventually(lambda: east_client.connected_event.is_set())
        first = east.stream.log[0] if east.stream.log else await east.next_request()
        assert dict(first.initial_resource_versions) == {
            EAST_CLUSTER: version_of(cluster(EAST_CLUSTER))}
        await client.expect_nothing(QUIET)
        # and a change on east reaches the client again
        moved = cluster(EAST_CLUSTER, timeout_s=9)
        await eventually(lambda: EAST_CLUSTER in east.stream.subscribed.get(CLUSTER, set()))
        east.set(moved)
        assert await collect(client, 1) == {EAST_CLUSTER: version_of(moved)}
        client.close()


async def test_invariant_37_an_origins_nack_touches_only_its_names(
        origins: tuple[ScriptedOrigin, ScriptedOrigin]) -> None:
    default, east = origins
    async with relay_for(default.port, east.port) as (_, channel):
        client = await delta_client(channel, ["backend-default", EAST_CLUSTER])
        held = await collect(client, 2)
        bad = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER, nonce="bad-1")
        bad.resources.add(name=EAST_CLUSTER, version="broken",
                          resource=any_pb2.Any(type_url=CLUSTER, value=b"\xff\xff\xff"))
        east.send_raw(bad)
        await eventually(lambda: any(r.response_nonce == "bad-1" for r in east.all_requests()))
        [nack] = [r for r in east.all_requests() if r.response_nonce == "bad-1"]
        assert "cannot be decoded" in nack.error_detail.message
        await client.expect_nothing(QUIET)
        # the default origin heard of no error, and its updates still flow
        assert not any(r.HasField("error_detail") for r in default.all_requests())
        changed = cluster("backend-default", timeout_s=3)
        default.set(changed)
        assert await collect(client, 1) == {"backend-default": version_of(changed)}
        assert held[EAST_CLUSTER] == version_of(cluster(EAST_CLUSTER))
        client.close()


async def test_without_a_default_origin_names_of_no_origin_are_refused(
        origins: tuple[ScriptedOrigin, ScriptedOrigin]) -> None:
    _, east = origins
    async with relay_for(None, east.port) as (_, channel):
        served = await delta_client(channel, [EAST_CLUSTER])
        assert await collect(served, 1) == {EAST_CLUSTER: version_of(cluster(EAST_CLUSTER))}
        for name, why in (
                (WEST_CLUSTER, "no origin of the relay serves the authority "
                               "'west.example.com' of "),
                ("backend-default", "'backend-default' is not an xdstp:// name, and the "
                                    "relay has no default origin (upstream:)")):
            refused = await delta_client(channel, [name])
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await refused.recv()
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert why in (error.value.details() or "")
            refused.close()
        # the refused clients cost the others nothing, and no origin heard of them
        assert subscribed_names(east) == {EAST_CLUSTER}
        await served.expect_nothing(QUIET)
        served.close()


async def test_restart_from_the_snapshot_with_two_origins(
        origins: tuple[ScriptedOrigin, ScriptedOrigin], tmp_path: Path) -> None:
    default, east = origins
    persistence = f'persistence: {{directory: "{tmp_path}"}}'
    async with relay_for(default.port, east.port, persistence) as (relay, channel):
        client = await delta_client(channel, ["backend-default", EAST_CLUSTER])
        held = await collect(client, 2)
        client.close()
        for writer in relay.snapshot_writers.values():
            await eventually(lambda w=writer: w.pending() == 0)  # type: ignore[misc]
        assert set(relay.snapshot_writers) == {"default", EAST}
    # each origin's snapshot is in a key space of its own
    assert (tmp_path / "authorities" / "east%2Eexample%2Ecom").is_dir()
    await default.stop()
    await east.stop()
    # both origins away: a restarted relay serves both parts from the snapshot
    async with relay_for(default.port, east.port, persistence) as (relay, channel):
        assert relay.not_ready_reason() is None
        restored = {origin: relay.restored_of(origin) for origin in ("default", EAST)}
        assert {o: (r.resources if r else 0) for o, r in restored.items()} == {
            "default": 1, EAST: 1}
        client = await delta_client(channel, ["backend-default", EAST_CLUSTER])
        assert await collect(client, 2) == held
        client.close()


def test_two_origins_config_errors_name_the_key(tmp_path: Path) -> None:
    from relay.config import ConfigError

    cases: list[tuple[str, str]] = [
        ('authorities: {"a/b": {address: "x:1"}}', "authorities.a/b"),
        ('authorities: {default: {address: "x:1"}}', "authorities.default"),
        (f'authorities: {{east: {{files: "{tmp_path}"}}}}', "authorities.east.files"),
    ]
    for text, field in cases:
        with pytest.raises(ConfigError) as error:
            parse_config("node: {id: a}\n" + text + "\n")
        assert error.value.field == field, error.value
    only: Any = parse_config('node: {id: a}\nauthorities: {east: {address: "x:1"}}\n')
    assert list(only.origins()) == ["east"]


async def test_a_wildcard_is_served_from_the_snapshot_with_two_origins(
        origins: tuple[ScriptedOrigin, ScriptedOrigin], tmp_path: Path) -> None:
    """No type is ever complete with several origins; the snapshot says the
    wildcard set was held (``TypeState.wildcard``), so a wildcard client of a
    relay restarted while both origins are away is served, not kept waiting
    for an answer that cannot come."""
    default, east = origins
    persistence = f'persistence: {{directory: "{tmp_path}"}}'
    async with relay_for(default.port, east.port, persistence) as (relay, channel):
        client = await delta_client(channel, ["*", EAST_CLUSTER])
        held = await collect(client, 3)
        assert relay.cache.holds_wildcard(CLUSTER) and not relay.cache.is_complete(CLUSTER)
        client.close()
        for writer in relay.snapshot_writers.values():
            await eventually(lambda w=writer: w.pending() == 0)  # type: ignore[misc]
    await default.stop()
    await east.stop()
    async with relay_for(default.port, east.port, persistence) as (relay, channel):
        assert relay.cache.holds_wildcard(CLUSTER)
        client = await delta_client(channel, ["*"])
        assert await collect(client, 3) == held
        client.close()
