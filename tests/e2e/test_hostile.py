"""End to end: clients that misbehave get a clear status, and nobody else
notices. Dead peers are freed; garbage, oversized, unknown-type and
over-the-limit requests are refused with the status docs/limits.md states;
what clients say is kept bounded."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import status_pb2
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relay.app import build_relay
from relay.config import parse_config
from relay.xds_types import CLUSTER, ENDPOINT
from tests.harness import (
    ADS,
    TIMEOUT,
    ScriptedOrigin,
    Stack,
    XdsClient,
    cluster,
    eventually,
    names_of,
    node,
    running_stack,
)
from tests.ports import free_port

DELTA_ADS = ADS + "DeltaAggregatedResources"
SOTW_ADS = ADS + "StreamAggregatedResources"


def limited(stack: Stack, limit: str) -> float:
    families = text_string_to_metric_families(generate_latest(stack.relay.registry).decode())
    return sum(s.value for f in families for s in f.samples
               if s.name == "xds_relay_downstream_limited_streams_total"
               and s.labels.get("limit") == limit)


async def watcher(stack: Stack) -> XdsClient:
    """A well-behaved client of cluster ``a``, its first response read and ACKed."""
    client = stack.client()
    await client.send(node=node("watcher"), type_url=CLUSTER, resource_names_subscribe=["a"])
    await client.ack(await client.recv())
    return client


async def still_served(stack: Stack, client: XdsClient, timeout_s: int) -> None:
    """The origin changes ``a``: the watcher gets exactly that, and ACKs it."""
    stack.origin.set(cluster("a", timeout_s=timeout_s))
    update = await client.recv()
    assert names_of(update) == ["a"]
    await client.ack(update)


async def ended(client: XdsClient, **request: Any) -> grpc.aio.AioRpcError:
    """Send ``request`` and return the error that ends the stream."""
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await client.send(**request)
        await client.recv()
    return error.value


def raw_stream(channel: grpc.aio.Channel, method: str) -> Any:
    """A stream that sends bytes as they are (no serializer)."""
    return channel.stream_stream(method, request_serializer=lambda data: data,
                                 response_deserializer=lambda data: data)()


# -- dead peers ------------------------------------------------------------------

_FROZEN_CLIENT = """
import sys, time, grpc
from envoy.service.discovery.v3 import discovery_pb2
channel = grpc.insecure_channel(sys.argv[1])
call = channel.stream_stream(
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
    request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
    response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)
def requests():
    yield discovery_pb2.DeltaDiscoveryRequest(
        node={"id": "frozen"}, type_url=sys.argv[2], resource_names_subscribe=["a"])
    time.sleep(3600)
for response in call(requests()):
    print("served", flush=True)
"""


@contextlib.asynccontextmanager
async def frozen_client(port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    """A client process, served once, then stopped (SIGSTOP: a vanished host)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FROZEN_CLIENT, f"127.0.0.1:{port}", CLUSTER,
        stdout=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        assert await asyncio.wait_for(process.stdout.readline(), TIMEOUT) == b"served\n"
        yield process
    finally:
        process.kill()
        await process.wait()


@pytest.mark.parametrize("idle_first", [False, True])
async def test_a_frozen_client_is_freed_within_keepalive_time_and_timeout(
        idle_first: bool) -> None:
    """With server.keepalive {time: 1s, timeout: 1s}, a client that stops
    answering is gone from the relay in a few seconds, idle or not; the
    others keep being served."""
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, server="keepalive: {time: 1s, timeout: 1s}") as stack:
        client = await watcher(stack)
        async with frozen_client(stack.relay.xds_port) as process:
            await eventually(lambda: len(stack.relay.serving.streams) == 2)
            if idle_first:
                # idle past several pings (gRPC stops pinging a connection with
                # no data after two, unless told otherwise)
                await asyncio.sleep(3.5)
                assert len(stack.relay.serving.streams) == 2
            os.kill(process.pid, signal.SIGSTOP)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await eventually(lambda: len(stack.relay.serving.streams) == 1, timeout=20)
            # time + timeout is 2 s; a ping goes out at most `time` after the freeze
            assert loop.time() - started < 10
        assert [c["node_id"] for c in stack.relay.serving.client_statuses()] == ["watcher"]
        await still_served(stack, client, 3)


# -- undecodable and oversized requests ---------------------------------------------


@pytest.mark.parametrize(("method", "message"), [
    (DELTA_ADS, "DeltaDiscoveryRequest"), (SOTW_ADS, "DiscoveryRequest"),
    ("/envoy.service.cluster.v3.ClusterDiscoveryService/DeltaClusters",
     "DeltaDiscoveryRequest")])
async def test_garbage_ends_the_stream_with_invalid_argument_and_one_log_line(
        method: str, message: str, caplog: pytest.LogCaptureFixture) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        client = await watcher(stack)
        caplog.set_level(logging.WARNING, "relay.downstream")
        for _ in range(3):
            call = raw_stream(stack.channel, method)
            await call.write(b"\xff\xff\xff\xff garbage")
            assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = await call.details()
            assert details.startswith(f"the request is not a {message}: Error parsing message")
        lines = [r.getMessage() for r in caplog.records if "rejecting stream" in r.getMessage()]
        assert len(lines) == 1  # three times, one line: at most one per client host
        await eventually(lambda: len(stack.relay.serving.streams) == 1)  # the watcher
        await still_served(stack, client, 3)


async def test_garbage_to_the_fetch_method_is_invalid_argument() -> None:
    origin = ScriptedOrigin()
    async with running_stack(origin) as stack:
        fetch = stack.channel.unary_unary(
            "/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters",
            request_serializer=lambda data: data, response_deserializer=lambda data: data)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await fetch(b"\xff\xff\xff\xff", timeout=5)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details().startswith(
            "the request is not a DiscoveryRequest: Error parsing message")


async def test_a_request_over_request_size_is_resource_exhausted_naming_the_limit() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, limits="request_size: 16KiB") as stack:
        client = await watcher(stack)
        names = [f"n{i:05}-" + "x" * 100 for i in range(200)]  # about 22 KB
        error = await ended(stack.client(), node=node("big"), type_url=CLUSTER,
                            resource_names_subscribe=names)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.details().startswith("a request of ")
        assert error.details().endswith("bytes; the relay takes requests of at most 16384 "
                                        "(limits.request_size)")
        assert limited(stack, "request_size") == 1
        # Over twice the limit gRPC refuses it itself, with its own message.
        error = await ended(stack.client(), node=node("bigger"), type_url=CLUSTER,
                            resource_names_subscribe=names * 2)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await still_served(stack, client, 3)
        # nothing of theirs went upstream
        asked = stack.origin.stream.requests
        while not asked.empty():
            assert set(asked.get_nowait().resource_names_subscribe) <= {"a"}


# -- limits and unknown types -------------------------------------------------------------


LIMITS = ("names_per_request: 50, names_per_stream: 80, name_length: 100, node_size: 2KiB, "
          "dynamic_parameters: 2, streams: 6, streams_per_connection: 4")


@pytest.mark.parametrize(("request_fields", "code", "details", "limit"), [
    ({"resource_names_subscribe": [f"n{i}" for i in range(51)]},
     grpc.StatusCode.RESOURCE_EXHAUSTED,
     "the request names 51 resources; at most 50 per request (limits.names_per_request)",
     "names_per_request"),
    ({"resource_names_subscribe": ["x" * 101]}, grpc.StatusCode.RESOURCE_EXHAUSTED,
     "a resource name has 101 characters; at most 100 (limits.name_length)", "name_length"),
    ({"resource_locators_subscribe": [{"name": "a", "dynamic_parameters": {
        "k1": "1", "k2": "2", "k3": "3"}}]}, grpc.StatusCode.RESOURCE_EXHAUSTED,
     "locator 'a''s dynamic parameters number 3; at most 2 per locator "
     "(limits.dynamic_parameters)", "dynamic_parameters"),
    ({"type_url": "type.googleapis.com/made.Up"}, grpc.StatusCode.INVALID_ARGUMENT,
     "type_url 'type.googleapis.com/made.Up' is not a type this relay serves "
     "(server.extra_type_urls adds others)", None),
])
async def test_a_request_beyond_a_limit_ends_only_its_stream(
        request_fields: dict[str, Any], code: grpc.StatusCode, details: str,
        limit: str | None) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, limits=LIMITS) as stack:
        client = await watcher(stack)
        fields = {"node": node("hostile"), "type_url": CLUSTER, **request_fields}
        error = await ended(stack.client(), **fields)
        assert (error.code(), error.details()) == (code, details)
        if limit is not None:
            assert limited(stack, limit) == 1
        await still_served(stack, client, 3)


async def test_names_per_stream_counts_every_request_and_type() -> None:
    origin = ScriptedOrigin()
    async with running_stack(origin, limits=LIMITS) as stack:
        client = stack.client()
        await client.send(node=node("n"), type_url=CLUSTER,
                          resource_names_subscribe=[f"c{i}" for i in range(50)])
        error = await ended(client, type_url=ENDPOINT,
                            resource_names_subscribe=[f"e{i}" for i in range(31)])
        assert (error.code(), error.details()) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "the stream subscribes to 81 resources; at most 80 per stream "
            "(limits.names_per_stream)")


async def test_a_node_over_node_size_is_refused_and_only_part_of_a_node_is_kept() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, limits=LIMITS) as stack:
        heavy = node("heavy")
        heavy.metadata.update({"blob": "m" * 3000})
        error = await ended(stack.client(), node=heavy, type_url=CLUSTER,
                            resource_names_subscribe=["a"])
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.details().endswith("the relay takes nodes of at most 2048 "
                                        "(limits.node_size)")
        # Under the limit, the metadata is not what the relay keeps.
        light = node("x" * 300)
        light.metadata.update({"blob": "m" * 1000})
        client = stack.client()
        await client.send(node=light, type_url=CLUSTER, resource_names_subscribe=["a"])
        await client.recv()
        [kept] = [s.session.node for s in stack.relay.serving.streams]
        assert kept is not None and not kept.HasField("metadata")
        assert kept.id == "x" * 256 + "... (44 more characters)"


async def test_streams_beyond_the_connection_limit_wait_for_http2() -> None:
    """limits.streams_per_connection is HTTP/2's MAX_CONCURRENT_STREAMS: a
    fifth stream on a connection of four waits in the client until one ends."""
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, limits=LIMITS) as stack:
        held = [stack.client() for _ in range(4)]
        for i, client in enumerate(held):
            await client.send(node=node(f"c{i}"), type_url=CLUSTER,
                              resource_names_subscribe=["a"])
            await client.recv()
        fifth = stack.client()
        # gRPC holds the write until the connection has room for the stream.
        sending = asyncio.create_task(fifth.send(node=node("fifth"), type_url=CLUSTER,
                                                 resource_names_subscribe=["a"]))
        await fifth.expect_nothing()
        assert len(stack.relay.serving.streams) == 4
        held[0].close()
        await asyncio.wait_for(sending, TIMEOUT)
        assert names_of(await fifth.recv()) == ["a"]
        assert limited(stack, "streams_per_connection") == 0


def separate_channels(stack: Stack, count: int) -> list[grpc.aio.Channel]:
    """``count`` channels to the relay, each on a connection of its own."""
    return [grpc.aio.insecure_channel(f"127.0.0.1:{stack.relay.xds_port}",
                                      options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(count)]


async def test_streams_in_total_are_limited() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, limits=LIMITS) as stack:
        channels = separate_channels(stack, 4)
        try:
            for i, channel in enumerate(channels):
                for j in range(2 if i < 3 else 0):
                    client = XdsClient(channel, DELTA_ADS, delta=True)
                    stack.clients.append(client)
                    await client.send(node=node(f"o{i}-{j}"), type_url=CLUSTER,
                                      resource_names_subscribe=["a"])
                    await client.recv()
            error = await ended(XdsClient(channels[3], DELTA_ADS, delta=True),
                                node=node("seventh"), type_url=CLUSTER)
            assert (error.code(), error.details()) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "the relay serves 6 streams, its most (limits.streams); connect to another "
                "replica")
            assert limited(stack, "streams") == 1
        finally:
            for channel in channels:
                await channel.close()


async def test_streams_and_connections_per_host_are_limited() -> None:
    """One client host (every port of 127.0.0.1 here) may hold at most
    limits.streams_per_host streams, on at most limits.connections_per_host
    connections; a stream that ends makes room again."""
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, limits="streams_per_host: 3, connections_per_host: 2"
                             ) as stack:
        channels = separate_channels(stack, 3)
        try:
            first = []
            for i in range(2):
                client = XdsClient(channels[0], DELTA_ADS, delta=True)
                stack.clients.append(client)
                await client.send(node=node(f"a{i}"), type_url=CLUSTER,
                                  resource_names_subscribe=["a"])
                await client.recv()
                first.append(client)
            second = XdsClient(channels[1], DELTA_ADS, delta=True)
            stack.clients.append(second)
            await second.send(node=node("b"), type_url=CLUSTER, resource_names_subscribe=["a"])
            await second.recv()
            error = await ended(XdsClient(channels[1], DELTA_ADS, delta=True),
                                node=node("b2"), type_url=CLUSTER)
            assert (error.code(), error.details()) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "ipv4:127.0.0.1 has 3 streams open, the most one client host may "
                "(limits.streams_per_host)")
            first[0].close()
            await eventually(lambda: len(stack.relay.serving.streams) == 2)
            # Room for a stream, but not on a third connection.
            error = await ended(XdsClient(channels[2], DELTA_ADS, delta=True),
                                node=node("c"), type_url=CLUSTER)
            assert (error.code(), error.details()) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "ipv4:127.0.0.1 has 2 connections with streams open, the most one client "
                "host may (limits.connections_per_host)")
            again = XdsClient(channels[1], DELTA_ADS, delta=True)
            stack.clients.append(again)
            await again.send(node=node("b3"), type_url=CLUSTER, resource_names_subscribe=["a"])
            assert names_of(await again.recv()) == ["a"]
            assert limited(stack, "streams_per_host") == 1
            assert limited(stack, "connections_per_host") == 1
        finally:
            for channel in channels:
                await channel.close()


# -- what clients say is kept bounded ------------------------------------------------


async def test_nack_messages_are_cut_in_views_and_logged_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node("nacker"), type_url=CLUSTER, resource_names_subscribe=["a"])
        response = await client.recv()
        caplog.set_level(logging.WARNING, "relay.downstream")
        huge = "e" * 1_000_000
        for i in range(20):
            await client.ack(response, error_detail=status_pb2.Status(code=3, message=huge))
            origin.set(cluster("a", timeout_s=10 + i))
            response = await client.recv()
        await client.ack(response)
        nacks = [r.getMessage() for r in caplog.records if r.getMessage().startswith("NACK")]
        assert len(nacks) == 1 and len(nacks[0]) < 1300
        await eventually(lambda: stack.relay.serving.client_statuses()[0]["types"][CLUSTER][
            "in_flight"] is None)
        view = json.dumps(stack.relay.serving.client_statuses())
        assert len(view) < 3000
        message = stack.relay.serving.client_statuses()[0]["types"][CLUSTER]["last_nack"][
            "message"]
        assert message == "e" * 1024 + f"... ({1_000_000 - 1024} more characters)"


async def test_extra_type_urls_are_served() -> None:
    custom = "type.googleapis.com/example.Custom"
    origin = ScriptedOrigin()
    async with running_stack(origin, server=f"extra_type_urls: ['{custom}']") as stack:
        client = stack.client()
        await client.send(node=node("n"), type_url=custom, resource_names_subscribe=["x"])
        request = await origin.next_request()
        assert request.type_url == custom and list(request.resource_names_subscribe) == ["x"]


async def test_a_frozen_origin_is_left_within_keepalive_time_and_timeout(tmp_path: Path) -> None:
    """The relay's own connection: an origin process that stops answering
    (SIGSTOP) is given up on in seconds, not gRPC's default minute, and the
    relay goes on serving its clients from cache meanwhile."""
    port = free_port()
    config = tmp_path / "origin.yaml"
    config.write_text(f"""
node: {{id: origin}}
server: {{address: "127.0.0.1:{port}"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{files: "{tmp_path}"}}
""")
    (tmp_path / "clusters.yaml").write_text(
        "resources:\n- '@type': type.googleapis.com/envoy.config.cluster.v3.Cluster\n"
        "  name: a\n  connect_timeout: 1s\n")
    origin = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay", "run", "--config", str(config),
        stderr=asyncio.subprocess.DEVNULL)
    relay_config = f"""
node: {{id: zone}}
server: {{address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
upstream:
  address: "127.0.0.1:{port}"
  backoff: {{initial: 0.1s, max: 0.5s}}
  keepalive: {{time: 1s, timeout: 1s}}
"""
    relay = build_relay(parse_config(relay_config))
    await relay.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}")
    try:
        assert relay.upstream is not None
        await eventually(relay.upstream.synced_event.is_set, timeout=20)
        client = XdsClient(channel, DELTA_ADS, delta=True)
        await client.send(node=node("c"), type_url=CLUSTER, resource_names_subscribe=["a"])
        assert names_of(await client.recv(timeout=20)) == ["a"]
        opened = relay.upstream.streams_opened
        os.kill(origin.pid, signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await eventually(lambda: not relay.upstream.connected_event.is_set(), timeout=30)
        assert loop.time() - started < 15
        os.kill(origin.pid, signal.SIGCONT)
        await eventually(lambda: relay.upstream.streams_opened > opened, timeout=20)
        client.close()
    finally:
        await channel.close()
        await relay.stop(0)
        origin.kill()
        await origin.wait()


async def test_an_ended_stream_is_freed_without_waiting_for_a_full_collection() -> None:
    """The relay runs with rare full garbage collections (relay.runtime): an
    ended stream, and everything it was sent, must go by reference counting,
    not wait in a cycle with gRPC's call objects."""
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node("leaving"), type_url=CLUSTER, resource_names_subscribe=["a"])
        await client.ack(await client.recv())
        [stream] = stack.relay.serving.streams
        gone = weakref.ref(stream)
        del stream
        gc.collect()
        gc.disable()
        try:
            client.close()
            await eventually(lambda: not stack.relay.serving.streams)
            await eventually(lambda: gone() is None)
        finally:
            gc.enable()
