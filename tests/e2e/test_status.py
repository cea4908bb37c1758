"""End to end: health, reflection and CSDS on the relay's xDS port, over real gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from envoy.admin.v3 import config_dump_shared_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
from envoy.type.matcher.v3 import node_pb2, string_pb2
from google.protobuf import descriptor_pb2
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from relay.app import build_relay
from relay.config import parse_config
from relay.xds_types import CLUSTER, ENDPOINT
from tests.clock import ManualClock
from tests.harness import (
    TIMEOUT,
    ScriptedOrigin,
    cluster,
    endpoints,
    eventually,
    node,
    pack,
    relay_config,
    running_stack,
    version_of,
)

Config = csds_pb2.ClientConfig.GenericXdsConfig
Client = config_dump_shared_pb2.ClientResourceStatus
Status = csds_pb2.ConfigStatus
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"


def acked(type_url: str, name: str, body: Any) -> Any:
    return Config(type_url=type_url, name=name, version_info=version_of(body),
                  xds_config=pack(body), client_status=Client.ACKED,
                  config_status=Status.SYNCED)


async def fetch_until(stub: Any, done: Callable[[Any], bool],
                      request: Any = None) -> Any:
    """Fetch client status until ``done(response)``: ACKs reach the relay asynchronously."""
    request = request or csds_pb2.ClientStatusRequest()
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while True:
        response = await stub.FetchClientStatus(request)
        if done(response):
            return response
        assert asyncio.get_running_loop().time() < deadline, f"last answer: {response}"
        await asyncio.sleep(0.01)


def all_acked(response: Any) -> bool:
    return bool(response.config) and all(
        c.client_status == Client.ACKED for cfg in response.config
        for c in cfg.generic_xds_configs)


# -- health ------------------------------------------------------------------------


async def test_health_serving_after_start_and_not_serving_after_set_not_serving() -> None:
    async with running_stack() as stack:
        stub = health_pb2_grpc.HealthStub(stack.channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == SERVING
        await eventually(lambda: stack.relay.not_ready_reason() is None)
        ads = stub.Watch(health_pb2.HealthCheckRequest(service=ADS_SERVICE))
        assert (await asyncio.wait_for(ads.read(), TIMEOUT)).status == SERVING
        ads.cancel()
        for service in ("", ADS_SERVICE, "envoy.service.cluster.v3.ClusterDiscoveryService"):
            response = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert response.status == SERVING
        await stack.relay.set_not_serving()
        assert (await asyncio.wait_for(watch.read(), TIMEOUT)).status == NOT_SERVING
        for service in ("", ADS_SERVICE):
            response = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert response.status == NOT_SERVING
        watch.cancel()


async def test_xds_services_are_not_serving_until_the_relay_has_synced() -> None:
    origin = await ScriptedOrigin().start()
    port = origin.port
    await origin.stop()  # nothing listens: the relay cannot sync
    relay = build_relay(parse_config(relay_config(port), "relay.yaml"))
    await relay.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            overall = await stub.Check(health_pb2.HealthCheckRequest(service=""))
            ads = await stub.Check(health_pb2.HealthCheckRequest(service=ADS_SERVICE))
            assert (overall.status, ads.status) == (SERVING, NOT_SERVING)
            assert relay.not_ready_reason() == "not yet synced with the origin"
            revived = await ScriptedOrigin().start(port)
            try:
                await eventually(lambda: relay.not_ready_reason() is None)
                watch = stub.Watch(health_pb2.HealthCheckRequest(service=ADS_SERVICE))
                while (await asyncio.wait_for(watch.read(), TIMEOUT)).status != SERVING:
                    pass
                watch.cancel()
            finally:
                await revived.stop()
            # The origin is gone again: the relay serves from cache, and stays ready.
            assert relay.upstream is not None
            await eventually(lambda: not relay.upstream.connected_event.is_set())
            assert relay.not_ready_reason() is None
            ads = await stub.Check(health_pb2.HealthCheckRequest(service=ADS_SERVICE))
            assert ads.status == SERVING
    finally:
        await relay.stop(0)


async def test_health_of_an_unknown_service_is_not_found() -> None:
    async with running_stack() as stack:
        stub = health_pb2_grpc.HealthStub(stack.channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


# -- reflection --------------------------------------------------------------------


async def reflect(stack: Any, **request: Any) -> Any:
    call = reflection_pb2_grpc.ServerReflectionStub(stack.channel).ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(**request))
    response = await call.read()
    call.cancel()
    return response


async def test_reflection_lists_every_service_on_the_xds_port() -> None:
    async with running_stack() as stack:
        response = await reflect(stack, list_services="")
        assert sorted(s.name for s in response.list_services_response.service) == [
            "envoy.service.cluster.v3.ClusterDiscoveryService",
            ADS_SERVICE,
            "envoy.service.endpoint.v3.EndpointDiscoveryService",
            "envoy.service.listener.v3.ListenerDiscoveryService",
            "envoy.service.load_stats.v3.LoadReportingService",
            "envoy.service.route.v3.RouteDiscoveryService",
            "envoy.service.route.v3.ScopedRoutesDiscoveryService",
            "envoy.service.route.v3.VirtualHostDiscoveryService",
            "envoy.service.runtime.v3.RuntimeDiscoveryService",
            "envoy.service.secret.v3.SecretDiscoveryService",
            "envoy.service.status.v3.ClientStatusDiscoveryService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        ]


async def test_reflection_describes_the_ads_service() -> None:
    async with running_stack() as stack:
        response = await reflect(stack, file_containing_symbol=ADS_SERVICE)
        files = [descriptor_pb2.FileDescriptorProto.FromString(f)
                 for f in response.file_descriptor_response.file_descriptor_proto]
        ads = next(f for f in files if f.name == "envoy/service/discovery/v3/ads.proto")
        assert [m.name for m in ads.service[0].method] == [
            "StreamAggregatedResources", "DeltaAggregatedResources"]


# -- CSDS --------------------------------------------------------------------------


async def test_csds_reports_what_each_delta_and_sotw_client_acked() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), endpoints("e", 1))
    async with running_stack(origin) as stack:
        delta, sotw = stack.client(delta=True), stack.client(delta=False)
        await delta.send(node=node("delta-1"), type_url=CLUSTER, resource_names_subscribe=["a"])
        await sotw.send(node=node("sotw-1"), type_url=ENDPOINT, resource_names=["e"])
        await delta.ack(await delta.recv())
        await sotw.ack(await sotw.recv(), resource_names=["e"])
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(stack.channel)
        response = await fetch_until(stub, all_acked)
        assert response == csds_pb2.ClientStatusResponse(config=[
            csds_pb2.ClientConfig(node=node("delta-1"),
                                  generic_xds_configs=[acked(CLUSTER, "a", cluster("a"))]),
            csds_pb2.ClientConfig(node=node("sotw-1"),
                                  generic_xds_configs=[acked(ENDPOINT, "e", endpoints("e", 1))]),
        ])


async def test_csds_reports_a_nacked_resource_with_the_client_error() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node("n"), type_url=CLUSTER, resource_names_subscribe=["a"])
        await client.ack(await client.recv())
        origin.set(cluster("a", timeout_s=9))
        await client.ack(await client.recv(),
                         error_detail=status_pb2.Status(code=3, message="timeout too long"))
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(stack.channel)
        response = await fetch_until(stub, lambda r: r.config[0].generic_xds_configs[0]
                                     .client_status == Client.NACKED)
        version = version_of(cluster("a", timeout_s=9))
        assert list(response.config[0].generic_xds_configs) == [Config(
            type_url=CLUSTER, name="a", version_info=version,
            xds_config=pack(cluster("a", timeout_s=9)), client_status=Client.NACKED,
            config_status=Status.ERROR,
            error_state=config_dump_shared_pb2.UpdateFailureState(
                details="timeout too long", version_info=version))]


async def test_csds_node_matchers_filter_clients_and_stream_answers_each_request() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        for node_id in ("edge-1", "edge-2", "core-1"):
            client = stack.client()
            await client.send(node=node(node_id), type_url=CLUSTER,
                              resource_names_subscribe=["a"])
            await client.ack(await client.recv())
        await eventually(lambda: len(stack.relay.serving.streams) == 3)
        call = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(
            stack.channel).StreamClientStatus()
        for pattern, expected in (({"exact": "edge-2"}, ["edge-2"]),
                                  ({"prefix": "edge-"}, ["edge-1", "edge-2"]),
                                  (None, ["core-1", "edge-1", "edge-2"])):
            matchers = [] if pattern is None else [
                node_pb2.NodeMatcher(node_id=string_pb2.StringMatcher(**pattern))]
            await call.write(csds_pb2.ClientStatusRequest(node_matchers=matchers))
            response = await asyncio.wait_for(call.read(), TIMEOUT)
            assert [c.node.id for c in response.config] == expected
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF


async def test_csds_refuses_an_unsupported_matcher_with_invalid_argument() -> None:
    async with running_stack() as stack:
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(stack.channel)
        regex = node_pb2.NodeMatcher(node_id=string_pb2.StringMatcher(
            safe_regex={"regex": "edge-.*"}))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.FetchClientStatus(csds_pb2.ClientStatusRequest(node_matchers=[regex]))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.details() == (
            "node_matchers: 'safe_regex' is not supported; use exact, prefix, suffix or contains")


async def test_csds_forgets_a_stream_once_it_closes() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        leaving, staying = stack.client(), stack.client()
        for client, node_id in ((leaving, "leaving"), (staying, "staying")):
            await client.send(node=node(node_id), type_url=CLUSTER,
                              resource_names_subscribe=["a"])
            await client.recv()
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(stack.channel)
        response = await fetch_until(stub, lambda r: len(r.config) == 2)
        leaving.close()
        response = await fetch_until(stub, lambda r: len(r.config) == 1)
        assert [c.node.id for c in response.config] == ["staying"]


# -- ready follows the origin's first valid answer -----------------------------------------


async def test_a_relay_waits_for_its_origins_first_answer_to_be_ready() -> None:
    clock = ManualClock()
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin, clock=clock) as stack:
        client = stack.client()
        await client.send(node=node("d"), type_url=CLUSTER)
        await origin.next_request()  # connected and subscribed: not yet an answer
        await clock.advance(5.0)
        assert stack.relay.not_ready_reason() == "not yet synced with the origin"
        origin.send_raw(discovery_pb2.DeltaDiscoveryResponse(
            type_url=CLUSTER, resources=[{"name": "a", "version": "1",
                                          "resource": pack(cluster("a"))}]))
        await client.recv()
        assert stack.relay.not_ready_reason() is None


async def test_an_idle_relay_is_ready_once_the_origin_keeps_its_stream_open() -> None:
    # With no client yet there is nothing to answer: the origin has accepted
    # the relay once its stream outlives answer_grace (a refusal ends it at once).
    clock = ManualClock()
    async with running_stack(ScriptedOrigin(), clock=clock) as stack:
        assert stack.relay.upstream is not None
        await eventually(lambda: stack.relay.upstream.connected_event.is_set())
        await clock.advance(0.25)
        assert stack.relay.not_ready_reason() == "not yet synced with the origin"
        await clock.advance(0.25)
        await eventually(lambda: stack.relay.not_ready_reason() is None)
