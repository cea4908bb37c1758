"""End to end: responses no larger than a client with gRPC's defaults accepts.

The clients' channels keep gRPC's default receive limit (4 MiB) unless a test
says otherwise: a response over it would end their stream with
RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

from typing import Any

import grpc
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import ENDPOINT
from tests.harness import XdsClient, names_of, node, running_stack

MiB = 1024 * 1024
GRPC_DEFAULT_RECEIVE = 4 * MiB
COUNT = 100
NAMES = [f"e{i:03}" for i in range(COUNT)]
FETCH_ENDPOINTS = "/envoy.service.endpoint.v3.EndpointDiscoveryService/FetchEndpoints"


def sized_endpoints(name: str, size: int) -> endpoint_pb2.ClusterLoadAssignment:
    """A ClusterLoadAssignment of about ``size`` bytes (a long hostname)."""
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    cla.endpoints.add().lb_endpoints.add().endpoint.hostname = "h" * size
    return cla


def fifty_kb_each() -> list[endpoint_pb2.ClusterLoadAssignment]:
    return [sized_endpoints(name, 50_000) for name in NAMES]


async def receive_all(client: XdsClient, limit: int, received: tuple[str, ...] = (),
                      **ack: Any) -> list[Any]:
    """Responses until every one of NAMES arrived (``received``: some already
    had), each within ``limit`` bytes and ACKed; then nothing more comes."""
    responses: list[Any] = []
    names = list(received)
    while len(names) < COUNT:
        response = await client.recv()
        assert response.ByteSize() <= limit
        responses.append(response)
        names += names_of(response)
        await client.ack(response, **ack)
    assert sorted(names) == NAMES  # each once
    await client.expect_nothing()
    return responses


async def test_invariant_34_a_delta_client_with_grpcs_default_limit_gets_100_of_50kb() -> None:
    async with running_stack() as stack:
        stack.origin.set(*fifty_kb_each())
        client = stack.client(delta=True)
        await client.send(node=node(), type_url=ENDPOINT, resource_names_subscribe=NAMES)
        first = await client.recv()
        assert 0 < len(first.resources) < COUNT
        await client.expect_nothing()  # the next part waits for the ACK
        await client.ack(first)
        assert first.ByteSize() <= GRPC_DEFAULT_RECEIVE
        rest = await receive_all(client, GRPC_DEFAULT_RECEIVE, tuple(names_of(first)))
        assert rest and len({first.nonce, *(r.nonce for r in rest)}) == 1 + len(rest)


async def test_a_sotw_endpoint_client_with_grpcs_default_limit_gets_them_all() -> None:
    async with running_stack() as stack:
        stack.origin.set(*fifty_kb_each())
        client = stack.client(delta=False)
        await client.send(node=node(), type_url=ENDPOINT, resource_names=NAMES)
        responses = await receive_all(client, GRPC_DEFAULT_RECEIVE, resource_names=NAMES)
        assert len(responses) >= 2


async def test_server_max_response_size_sets_the_limit() -> None:
    async with running_stack(server="max_response_size: 1MiB") as stack:
        stack.origin.set(*fifty_kb_each())
        client = stack.client(delta=True)
        await client.send(node=node(), type_url=ENDPOINT, resource_names_subscribe=NAMES)
        responses = await receive_all(client, MiB)
        assert len(responses) >= 5  # 5 MB in responses of at most 1 MiB


async def test_invariant_34_one_resource_larger_than_the_limit_goes_alone() -> None:
    # This client takes large messages; the relay still keeps to 4 MiB where it can.
    options = [("grpc.max_receive_message_length", 16 * MiB)]
    async with running_stack(channel_options=options) as stack:
        stack.origin.set(sized_endpoints("a", 3 * MiB), sized_endpoints("b", 5 * MiB),
                         sized_endpoints("c", 3 * MiB))
        client = stack.client(delta=True)
        await client.send(node=node(), type_url=ENDPOINT,
                          resource_names_subscribe=["a", "b", "c"])
        parts = []
        for _ in range(3):
            response = await client.recv()
            parts.append((names_of(response), response.ByteSize() > GRPC_DEFAULT_RECEIVE))
            await client.ack(response)
        assert parts == [(["a"], False), (["b"], True), (["c"], False)]
        await client.expect_nothing()


async def test_a_grpc_fetch_still_answers_whole() -> None:
    # One-shot: a fetch has one response to give, so it is not split.
    options = [("grpc.max_receive_message_length", 16 * MiB)]
    async with running_stack(channel_options=options) as stack:
        stack.origin.set(*fifty_kb_each())
        client = stack.client(delta=True)  # brings the resources into the cache
        await client.send(node=node(), type_url=ENDPOINT, resource_names_subscribe=NAMES)
        await receive_all(client, GRPC_DEFAULT_RECEIVE)
        fetch = stack.channel.unary_unary(
            FETCH_ENDPOINTS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
        response = await fetch(discovery_pb2.DiscoveryRequest(node=node("fetcher"),
                                                              resource_names=NAMES))
        assert sorted(names_of(response)) == NAMES
        assert response.ByteSize() > GRPC_DEFAULT_RECEIVE


async def test_a_default_client_cannot_take_a_larger_fetch() -> None:
    # What the split spares streams: gRPC refuses a message over the client's limit.
    async with running_stack() as stack:
        stack.origin.set(*fifty_kb_each())
        client = stack.client(delta=True)
        await client.send(node=node(), type_url=ENDPOINT, resource_names_subscribe=NAMES)
        await receive_all(client, GRPC_DEFAULT_RECEIVE)
        fetch = stack.channel.unary_unary(
            FETCH_ENDPOINTS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
        try:
            await fetch(discovery_pb2.DiscoveryRequest(node=node("fetcher"),
                                                       resource_names=NAMES))
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        else:
            raise AssertionError("a response over 4 MiB reached a client with gRPC's defaults")
