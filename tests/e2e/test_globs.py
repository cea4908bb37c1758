"""End to end: xdstp names and glob collections (issue 25, items 1 and 2).

A scripted origin on 127.0.0.1 answers by hand what the relay asks of it;
real delta and SotW clients subscribe through a real relay. Checked: the
members of a collection, their additions and removals, reach every
subscriber of it and of their own names; the collection is subscribed
upstream once, a second subscriber served from cache; context parameters
tell collections apart; a SotW glob, a malformed name and a name of another
type are refused with INVALID_ARGUMENT, others unaffected; names compared in
canonical form go back as each client spelled them.
"""

from __future__ import annotations

import json

import aiohttp
import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack
from tests.harness import ScriptedOrigin, XdsClient, eventually, node, running_stack

EDS = "envoy.config.endpoint.v3.ClusterLoadAssignment"
AUTH = "xdstp://east.example.com/" + EDS
GLOB = f"{AUTH}/pool/*?zone=b"
M1 = f"{AUTH}/pool/m1?zone=b"
M2 = f"{AUTH}/pool/m2?zone=b"
M3 = f"{AUTH}/pool/m3?zone=b"
GLOB_C = f"{AUTH}/pool/*?zone=c"
C1 = f"{AUTH}/pool/m1?zone=c"
NAME = f"{AUTH}/svc?region=a&zone=b"        # canonical
SPELLED = f"{AUTH}/svc?zone=b&region=a"     # the same name, spelled otherwise


def members(*named: tuple[str, str], removed: tuple[str, ...] = ()
            ) -> discovery_pb2.DeltaDiscoveryResponse:
    """An origin response carrying (name, version) resources and removals."""
    response = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT,
                                                    removed_resources=list(removed))
    for name, version in named:
        response.resources.add(name=name, version=version,
                               resource=pack(endpoints(name.rsplit("/", 1)[1], 1)))
    return response


def subscribed(origin: ScriptedOrigin, name: str) -> list[discovery_pb2.DeltaDiscoveryRequest]:
    """The origin's requests that subscribed ``name``."""
    return [r for r in origin.all_requests() if name in r.resource_names_subscribe]


def held(response: discovery_pb2.DeltaDiscoveryResponse) -> list[tuple[str, str]]:
    return sorted((r.name, r.version) for r in response.resources)


async def fence(origin: ScriptedOrigin, client: XdsClient, name: str) -> None:
    """Wait until the origin hears ``client`` subscribe ``name``: what the relay
    would have asked before then has reached the origin (one ordered stream)."""
    await client.send(node=node("fence"), type_url=ENDPOINT, resource_names_subscribe=[name])
    await eventually(lambda: subscribed(origin, name))


async def refused(client: XdsClient) -> grpc.aio.AioRpcError:
    """The status the relay ended ``client``'s stream with."""
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await client.recv()
    return raised.value


# -- glob collections ------------------------------------------------------------------


async def test_invariant_36_members_additions_and_removals_reach_every_subscriber() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        first = stack.client()
        await first.send(node=node("1"), type_url=ENDPOINT, resource_names_subscribe=[GLOB])
        await eventually(lambda: subscribed(origin, GLOB))
        [request] = subscribed(origin, GLOB)
        assert list(request.resource_names_subscribe) == [GLOB]  # literally, once
        origin.send_raw(members((M1, "1"), (M2, "1")))
        response = await first.recv()
        assert held(response) == [(M1, "1"), (M2, "1")]
        await first.ack(response)

        # A second subscriber is answered from cache: no new upstream subscription.
        second = stack.client()
        await second.send(node=node("2"), type_url=ENDPOINT, resource_names_subscribe=[GLOB])
        response = await second.recv()
        assert held(response) == [(M1, "1"), (M2, "1")]
        await second.ack(response)
        # A subscriber of one member's own name.
        single = stack.client()
        await single.send(node=node("3"), type_url=ENDPOINT, resource_names_subscribe=[M1])
        response = await single.recv()
        assert held(response) == [(M1, "1")]
        await single.ack(response)
        await fence(origin, stack.client(), "fence")
        assert len(subscribed(origin, GLOB)) == 1

        # An addition reaches the collection's subscribers only.
        origin.send_raw(members((M3, "1")))
        for client in (first, second):
            response = await client.recv()
            assert held(response) == [(M3, "1")]
            await client.ack(response)
        # An update of a member reaches them and the member's own subscriber.
        origin.send_raw(members((M1, "2")))
        for client in (first, second, single):
            response = await client.recv()
            assert held(response) == [(M1, "2")]
            await client.ack(response)
        # A removal too.
        origin.send_raw(members(removed=(M1, M2)))
        for client, gone in ((first, [M1, M2]), (second, [M1, M2]), (single, [M1])):
            response = await client.recv()
            assert (sorted(response.removed_resources), list(response.resources)) == (gone, [])
        await single.expect_nothing()


async def test_invariant_36_a_collection_matches_only_members_with_its_context() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        zone_b, zone_c = stack.client(), stack.client()
        await zone_b.send(node=node("b"), type_url=ENDPOINT, resource_names_subscribe=[GLOB])
        await zone_c.send(node=node("c"), type_url=ENDPOINT, resource_names_subscribe=[GLOB_C])
        await eventually(lambda: subscribed(origin, GLOB) and subscribed(origin, GLOB_C))
        # One response with members of both (and of no collection subscribed).
        origin.send_raw(members((M1, "1"), (C1, "1"), (f"{AUTH}/pool/m9?zone=d", "1"),
                                (f"{AUTH}/pool/m9", "1")))
        assert held(await zone_b.recv()) == [(M1, "1")]
        assert held(await zone_c.recv()) == [(C1, "1")]


async def test_invariant_36_the_last_subscriber_leaving_takes_the_members_along() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node("1"), type_url=ENDPOINT, resource_names_subscribe=[GLOB])
        await eventually(lambda: subscribed(origin, GLOB))
        origin.send_raw(members((M1, "1")))
        await client.ack(await client.recv())
        await client.send(type_url=ENDPOINT, resource_names_unsubscribe=[GLOB])
        await eventually(lambda: any(GLOB in r.resource_names_unsubscribe
                                     for r in origin.all_requests()))
        # Nothing of it is left to serve: a new subscriber makes the relay ask again.
        later = stack.client()
        await later.send(node=node("2"), type_url=ENDPOINT, resource_names_subscribe=[GLOB])
        await eventually(lambda: len(subscribed(origin, GLOB)) == 2)
        await later.expect_nothing()
        origin.send_raw(members((M2, "1")))
        assert held(await later.recv()) == [(M2, "1")]


async def test_invariant_36_a_sotw_request_for_a_glob_is_refused_others_unaffected() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        member = stack.client()
        await member.send(node=node("1"), type_url=ENDPOINT, resource_names_subscribe=[GLOB])
        await eventually(lambda: subscribed(origin, GLOB))
        origin.send_raw(members((M1, "1")))
        await member.ack(await member.recv())

        message = (f"resource name {GLOB!r} is a glob collection: xDS serves glob collections "
                   "over the incremental (delta) protocol only (TP1), not state of the world")
        for method in (None, "/envoy.service.endpoint.v3.EndpointDiscoveryService/"
                             "StreamEndpoints"):
            sotw = stack.client(delta=False, method=method)
            await sotw.send(node=node("sotw"), type_url=ENDPOINT, resource_names=[GLOB])
            error = await refused(sotw)
            assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                       message)
        fetch = stack.channel.unary_unary(
            "/envoy.service.endpoint.v3.EndpointDiscoveryService/FetchEndpoints",
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await fetch(discovery_pb2.DiscoveryRequest(node=node(), resource_names=[GLOB]))
        assert (raised.value.code(), raised.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT, message)

        # The delta subscriber of the collection is served as before.
        origin.send_raw(members((M1, "2")))
        assert held(await member.recv()) == [(M1, "2")]


async def test_invariant_36_a_rest_poll_for_a_glob_is_refused() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin, rest='address: "127.0.0.1:0"') as stack, \
            aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{stack.relay.rest_port}/v3/discovery:endpoints",
                             data=json.dumps({"resourceNames": [GLOB]}),
                             headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400
            assert (await response.text()).strip() == (
                f"resource name {GLOB!r} is a glob collection: xDS serves glob collections "
                "over the incremental (delta) protocol only (TP1), not state of the world")
        assert subscribed(origin, GLOB) == []


# -- xdstp names -----------------------------------------------------------------------


async def test_a_malformed_name_or_one_of_another_type_ends_only_its_stream() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        good = stack.client()
        await good.send(node=node("good"), type_url=ENDPOINT, resource_names_subscribe=[M1])
        await eventually(lambda: subscribed(origin, M1))
        origin.send_raw(members((M1, "1")))
        await good.ack(await good.recv())

        malformed = f"{AUTH}/pool/m1?zone"
        cluster = "xdstp://east.example.com/envoy.config.cluster.v3.Cluster/c1"
        for name, message in (
                (malformed, f"resource name {malformed!r} is not a valid xdstp name: "
                            "context parameter: 'zone' is not KEY=VALUE"),
                (cluster, f"resource name {cluster!r} is not a valid xdstp name: type: the "
                          f"name is of type envoy.config.cluster.v3.Cluster, the request "
                          f"is for {EDS}")):
            bad = stack.client()
            await bad.send(node=node("bad"), type_url=ENDPOINT,
                           resource_names_subscribe=["classic", name])
            error = await refused(bad)
            assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                       message)

        origin.send_raw(members((M1, "2")))
        assert held(await good.recv()) == [(M1, "2")]
        await fence(origin, stack.client(), "fence")
        assert not any({"classic", malformed, cluster} & set(r.resource_names_subscribe)
                       for r in origin.all_requests())


async def test_invariant_35_names_compared_canonical_go_back_as_each_client_spelled_them(
        ) -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        spelled, plain = stack.client(), stack.client()
        await spelled.send(node=node("1"), type_url=ENDPOINT, resource_names_subscribe=[SPELLED])
        await eventually(lambda: subscribed(origin, NAME))
        [request] = subscribed(origin, NAME)
        assert list(request.resource_names_subscribe) == [NAME]  # canonical upstream
        origin.send_raw(members((NAME, "1")))
        response = await spelled.recv()
        assert held(response) == [(SPELLED, "1")]
        await spelled.ack(response)

        await plain.send(node=node("2"), type_url=ENDPOINT, resource_names_subscribe=[NAME])
        response = await plain.recv()
        assert held(response) == [(NAME, "1")]
        await plain.ack(response)
        await fence(origin, stack.client(), "fence")
        assert len(subscribed(origin, NAME)) == 1 and subscribed(origin, SPELLED) == []

        origin.send_raw(members(removed=(NAME,)))
        assert list((await spelled.recv()).removed_resources) == [SPELLED]
        assert list((await plain.recv()).removed_resources) == [NAME]


async def test_invariant_36_after_a_reconnect_members_are_kept_and_reconciled() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node("1"), type_url=ENDPOINT, resource_names_subscribe=[GLOB])
        await eventually(lambda: subscribed(origin, GLOB))
        origin.send_raw(members((M1, "1"), (M2, "1")))
        await client.ack(await client.recv())
        port = origin.port
        await origin.stop()
        revived = ScriptedOrigin(auto=False)
        await revived.start(port)
        stack.origin = revived
        await eventually(lambda: revived.streams and revived.stream.log, timeout=10)
        assert list(revived.stream.log[0].resource_names_subscribe) == [GLOB]
        # M2 went while the origin was away: it answers with what the collection holds.
        revived.send_raw(members((M1, "1")))
        response = await client.recv()  # after the reconcile (upstream.answer_grace)
        assert (list(response.removed_resources), list(response.resources)) == ([M2], [])
        await client.ack(response)
        # M1 stayed in the cache (the collection covers it): a newcomer gets it there.
        newcomer = stack.client()
        await newcomer.send(node=node("2"), type_url=ENDPOINT, resource_names_subscribe=[GLOB])
        assert held(await newcomer.recv()) == [(M1, "1")]
        await revived.stop()
