"""End to end: scripted origin -> relay -> scripted clients, all real gRPC on loopback."""

from __future__ import annotations

import logging

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.app import build_relay
from relay.config import Address
from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE, WILDCARD
from tests.harness import (
    ADS,
    RecordingBackoff,
    ScriptedOrigin,
    cluster,
    endpoints,
    eventually,
    listener,
    names_of,
    node,
    pack,
    route,
    running_stack,
    version_of,
)


async def test_invariant_7_delta_client_receives_origin_resources_with_origin_versions() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), cluster("b"), version="v7")
    async with running_stack(origin) as stack:
        client = stack.client(delta=True)
        await client.send(node=node(), type_url=CLUSTER)
        response = await client.recv()
        assert response.type_url == CLUSTER
        assert sorted(names_of(response)) == ["a", "b"]
        assert {r.version for r in response.resources} == {"v7"}  # invariant 7
        assert response.nonce
        assert list(response.removed_resources) == []


async def test_invariant_25_fifty_clients_one_upstream_stream_one_subscription_per_name() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), endpoints("a", 1001), endpoints("b", 1002))
    async with running_stack(origin) as stack:
        clients = []
        for i in range(50):
            c = stack.client(delta=i % 2 == 0)
            await c.send(node=node(f"n{i}"), type_url=CLUSTER)
            if c.delta:
                await c.send(type_url=ENDPOINT, resource_names_subscribe=["a", "b"])
            else:
                await c.send(type_url=ENDPOINT, resource_names=["a", "b"])
            clients.append(c)
        for c in clients:
            got = {}
            for _ in range(2):
                r = await c.recv()
                got[r.type_url] = sorted(names_of(r))
            assert got == {CLUSTER: ["a"], ENDPOINT: ["a", "b"]}
        assert len(origin.streams) == 1
        subscribed = [(r.type_url, n) for r in origin.subscription_requests()
                      for n in r.resource_names_subscribe]
        assert sorted(subscribed) == [(CLUSTER, WILDCARD), (ENDPOINT, "a"), (ENDPOINT, "b")]


async def test_invariant_25_upstream_subscription_follows_clients_dropped_by_last() -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("a", 1), endpoints("b", 2))
    async with running_stack(origin) as stack:
        first, second = stack.client(), stack.client()
        await first.send(node=node("1"), type_url=ENDPOINT, resource_names_subscribe=["a"])
        await first.recv()
        await second.send(node=node("2"), type_url=ENDPOINT, resource_names_subscribe=["a", "b"])
        await second.recv()
        # b's subscription is out before a goes (else one batch window holds both)
        await eventually(lambda: len(origin.subscription_requests()) == 2)
        await first.send(type_url=ENDPOINT, resource_names_unsubscribe=["a"])
        await second.send(type_url=ENDPOINT, resource_names_unsubscribe=["a"])
        await eventually(lambda: any(list(r.resource_names_unsubscribe) == ["a"]
                                     for r in origin.subscription_requests()))
        second.close()
        await eventually(lambda: any(list(r.resource_names_unsubscribe) == ["b"]
                                     for r in origin.subscription_requests()))
        changes = [(list(r.resource_names_subscribe), list(r.resource_names_unsubscribe))
                   for r in origin.subscription_requests()]
        assert changes == [(["a"], []), (["b"], []), ([], ["a"]), ([], ["b"])]


async def test_invariant_19_origin_update_reaches_only_subscribers_of_that_name() -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("a", 1), endpoints("b", 2))
    async with running_stack(origin) as stack:
        on_a, on_b = stack.client(), stack.client(delta=False)
        await on_a.send(node=node("a"), type_url=ENDPOINT, resource_names_subscribe=["a"])
        await on_b.send(node=node("b"), type_url=ENDPOINT, resource_names=["b"])
        ra, rb = await on_a.recv(), await on_b.recv()
        await on_a.ack(ra)
        await on_b.ack(rb, resource_names=["b"])
        origin.set(endpoints("a", 11))
        update = await on_a.recv()
        assert names_of(update) == ["a"]
        assert update.resources[0].version == version_of(endpoints("a", 11))
        await on_b.expect_nothing()


async def test_invariant_14_15_sotw_cluster_response_lists_everything_and_omits_deleted() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), cluster("b"))
    async with running_stack(origin) as stack:
        client = stack.client(delta=False)
        await client.send(node=node(), type_url=CLUSTER)
        first = await client.recv()
        assert sorted(names_of(first)) == ["a", "b"]
        await client.ack(first)
        origin.remove(CLUSTER, "a")
        second = await client.recv()
        assert names_of(second) == ["b"]  # invariant 14: absence means deletion
        assert second.version_info != first.version_info  # invariant 15
        await client.ack(second)
        origin.set(cluster("b", timeout_s=5))
        third = await client.recv()
        assert names_of(third) == ["b"] and third.version_info != second.version_info


async def test_invariant_25_new_client_is_served_from_cache_without_upstream_round_trip() -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("a", 1))
    async with running_stack(origin) as stack:
        first = stack.client()
        await first.send(node=node("1"), type_url=ENDPOINT, resource_names_subscribe=["a"])
        await first.recv()
        # (the relay's ACK of the origin's answer may follow the client's copy)
        await eventually(lambda: any(r.response_nonce for r in origin.all_requests()))
        before = len(origin.all_requests())
        origin.auto = False  # the origin would no longer answer anything
        late = stack.client(delta=False)
        await late.send(node=node("2"), type_url=ENDPOINT, resource_names=["a"])
        response = await late.recv()
        assert names_of(response) == ["a"]
        assert len(origin.all_requests()) == before  # invariant 25: no new subscription


async def test_invariant_27_28_clients_keep_config_while_origin_is_down_and_resync_after() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        client = stack.client(delta=False)
        await client.send(node=node("1"), type_url=CLUSTER)
        await client.ack(await client.recv())
        port = origin.port
        await origin.stop()
        await client.expect_nothing(0.5)  # invariant 28: no removal, no empty response
        newcomer = stack.client()
        await newcomer.send(node=node("2"), type_url=CLUSTER)
        assert names_of(await newcomer.recv()) == ["a"]
        # The origin returns: the relay resends its subscription and what it caches.
        revived = ScriptedOrigin()
        revived.resources = origin.resources
        await revived.start(port)
        stack.origin = revived
        await eventually(lambda: revived.streams and revived.stream.log, timeout=10)
        first = revived.stream.log[0]
        assert first.type_url == CLUSTER
        assert list(first.resource_names_subscribe) == [WILDCARD]
        assert dict(first.initial_resource_versions) == {"a": version_of(cluster("a"))}
        assert first.node.id == "relay-test"
        await revived.stop()


async def test_invariant_29_client_waits_until_relay_has_synced_with_origin() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        client = stack.client(delta=False)
        await client.send(node=node(), type_url=CLUSTER)
        await client.expect_nothing()  # invariant 29: no empty answer before sync
        request = await origin.next_request()
        origin.resources[CLUSTER] = {}
        origin.send(origin.stream, CLUSTER, [])
        response = await client.recv()
        assert list(response.resources) == [] and response.type_url == CLUSTER
        assert request.resource_names_subscribe == [WILDCARD]


async def test_invariant_26_unusable_origin_response_nacked_and_kept_from_clients() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node(), type_url=CLUSTER, resource_names_subscribe=["a"])
        await origin.next_request()
        bad = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        bad.resources.add(name="a", version="1").resource.CopyFrom(pack(endpoints("a", 1)))
        origin.send_raw(bad)
        nack = await origin.next_request()
        assert nack.response_nonce == bad.nonce
        assert "has type" in nack.error_detail.message and nack.error_detail.code == 3
        await client.expect_nothing()
        duplicate = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        for _ in range(2):
            duplicate.resources.add(name="a", version="1").resource.CopyFrom(pack(cluster("a")))
        origin.send_raw(duplicate)
        nack = await origin.next_request()
        assert "more than once" in nack.error_detail.message
        undecodable = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        body = undecodable.resources.add(name="a", version="1").resource
        body.type_url, body.value = CLUSTER, b"\xff\xff\xff"
        origin.send_raw(undecodable)
        nack = await origin.next_request()
        assert "cannot be decoded" in nack.error_detail.message
        await client.expect_nothing()
        good = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        good.resources.add(name="a", version="2").resource.CopyFrom(pack(cluster("a")))
        origin.send_raw(good)
        ack = await origin.next_request()
        assert ack.response_nonce == good.nonce and not ack.HasField("error_detail")
        response = await client.recv()
        assert names_of(response) == ["a"] and response.resources[0].version == "2"


async def test_invariant_26_bytes_that_do_not_decode_are_nacked_or_end_only_the_stream(
        caplog: pytest.LogCaptureFixture) -> None:
    """The relay reads the origin's bytes itself (relay.upstream.bulk.undecoded):
    a resource that does not decode is NACKed with the response's nonce; what
    is not a response at all (no nonce to NACK) ends the stream, and the
    relay subscribes again on the next, its clients served from cache."""
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node(), type_url=CLUSTER, resource_names_subscribe=["a"])
        await origin.next_request()
        good = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        good.resources.add(name="a", version="1").resource.CopyFrom(pack(cluster("a")))
        origin.send_raw(good)
        assert (await origin.next_request()).response_nonce == good.nonce
        assert names_of(await client.recv()) == ["a"]
        bad_name = discovery_pb2.Resource(name="b", version="1", resource=pack(cluster("b")))
        entry = b"\x1a\x02\xff\xfe" + bad_name.SerializeToString()  # a name not UTF-8 first
        origin.stream.outbox.put_nowait(
            discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER, nonce="n9").SerializeToString()
            + b"\x12" + bytes([len(entry)]) + entry)
        nack = await origin.next_request()
        assert nack.response_nonce == "n9" and nack.error_detail.code == 3
        assert nack.error_detail.message.startswith("the response cannot be decoded: ")
        opened = stack.relay.upstream.streams_opened if stack.relay.upstream else 0
        origin.stream.outbox.put_nowait(b"\x22\x02\xff\xfe")  # a type URL not UTF-8
        await eventually(lambda: len(origin.streams) == 2)  # a new stream
        again = await origin.next_request()
        assert stack.relay.upstream is not None
        assert stack.relay.upstream.streams_opened == opened + 1
        assert list(again.resource_names_subscribe) == ["a"]
        assert dict(again.initial_resource_versions) == {"a": "1"}
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
            f"origin 127.0.0.1:{origin.port}: the origin sent what is not a "
            "DeltaDiscoveryResponse (4 bytes): Error parsing message with type "
            "'envoy.service.discovery.v3.DeltaDiscoveryResponse': String field had bad UTF-8; "
            "ending the stream"]
        await client.expect_nothing()
        newcomer = stack.client()
        await newcomer.send(node=node("n2"), type_url=CLUSTER, resource_names_subscribe=["a"])
        assert names_of(await newcomer.recv()) == ["a"]


async def test_invariant_10_downstream_nack_is_not_forwarded_and_causes_no_resend() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node(), type_url=CLUSTER)
        response = await client.recv()
        upstream_before = len(origin.all_requests())
        await client.ack(response, error_detail={"code": 3, "message": "bad cluster"})
        await client.expect_nothing()  # invariant 10
        assert len(origin.all_requests()) == upstream_before
        origin.set(cluster("a", timeout_s=9))
        assert names_of(await client.recv()) == ["a"]


async def test_malformed_requests_get_invalid_argument_and_others_keep_working() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        bad = stack.client()
        await bad.send(node=node())  # no type_url on ADS
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await bad.recv()
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "type_url is required" in (failure.value.details() or "")
        wrong = stack.client(delta=False,
                             method="/envoy.service.cluster.v3.ClusterDiscoveryService/"
                                    "StreamClusters")
        await wrong.send(node=node(), type_url=LISTENER)
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await wrong.recv()
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        good = stack.client()
        await good.send(node=node(), type_url=CLUSTER)
        assert names_of(await good.recv()) == ["a"]


@pytest.mark.parametrize("service,method,type_url,message", [
    ("cluster", "ClusterDiscoveryService/StreamClusters", CLUSTER, cluster("c1")),
    ("cluster", "ClusterDiscoveryService/DeltaClusters", CLUSTER, cluster("c1")),
    ("endpoint", "EndpointDiscoveryService/StreamEndpoints", ENDPOINT, endpoints("c1", 1)),
    ("endpoint", "EndpointDiscoveryService/DeltaEndpoints", ENDPOINT, endpoints("c1", 1)),
    ("listener", "ListenerDiscoveryService/StreamListeners", LISTENER, listener("c1")),
    ("listener", "ListenerDiscoveryService/DeltaListeners", LISTENER, listener("c1")),
    ("route", "RouteDiscoveryService/StreamRoutes", ROUTE, route("c1")),
    ("route", "RouteDiscoveryService/DeltaRoutes", ROUTE, route("c1")),
])
async def test_per_type_services_serve_their_type(service: str, method: str, type_url: str,
                                                  message: object) -> None:
    origin = ScriptedOrigin()
    origin.set(message)  # type: ignore[arg-type]
    async with running_stack(origin) as stack:
        delta = "/Delta" in "/" + method.split("/")[1]
        client = stack.client(delta=delta,
                              method=f"/envoy.service.{service}.v3.{method}")
        if delta:
            await client.send(node=node(), resource_names_subscribe=["c1"])
        else:
            await client.send(node=node(), resource_names=["c1"])
        response = await client.recv()
        assert response.type_url == type_url
        assert names_of(response) == ["c1"]


async def test_fetch_returns_current_state_subscribing_what_no_stream_wants() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        fetch = stack.channel.unary_unary(
            "/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters",
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
        # No stream wants clusters: the fetch subscribes them on the origin itself
        # (for rest.lease) and waits for them (see tests/e2e/test_rest.py).
        response = await fetch(discovery_pb2.DiscoveryRequest(node=node()))
        assert names_of(response) == ["a"]
        # A streaming client gets the same state.
        client = stack.client(delta=False)
        await client.send(node=node(), type_url=CLUSTER)
        assert (await client.recv()).version_info == response.version_info


async def test_invariant_21_slow_client_does_not_hold_up_others_and_gets_latest_state() -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("a", 0))
    async with running_stack(origin) as stack:
        slow, fast = stack.client(), stack.client()
        for c in (slow, fast):
            await c.send(node=node(), type_url=ENDPOINT, resource_names_subscribe=["a"])
            await c.recv()
        await fast.ack(fast.responses[-1])
        # ``slow`` does not ACK: at most one response stays in flight for it.
        for port in range(1, 6):
            origin.set(endpoints("a", port))
            response = await fast.recv()
            assert response.resources[0].version == version_of(endpoints("a", port))
            await fast.ack(response)
        await slow.expect_nothing()
        await slow.ack(slow.responses[-1])
        latest = await slow.recv()  # coalesced: only the latest state
        assert latest.resources[0].version == version_of(endpoints("a", 5))
        await slow.expect_nothing()


async def test_invariant_25_one_stream_per_relay_even_when_clients_come_and_go() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        for i in range(5):
            c = stack.client()
            await c.send(node=node(str(i)), type_url=CLUSTER)
            await c.recv()
            c.close()
            await eventually(lambda: not stack.relay.serving.streams)  # it has left
        assert len(origin.streams) == 1
        assert stack.relay.upstream is not None and stack.relay.upstream.streams_opened == 1


async def test_sotw_client_uses_ads_for_routes_by_name() -> None:
    origin = ScriptedOrigin()
    origin.set(route("r1"), route("r2"))
    async with running_stack(origin) as stack:
        client = stack.client(delta=False, method=ADS + "StreamAggregatedResources")
        await client.send(node=node(), type_url=ROUTE, resource_names=["r1"])
        r = await client.recv()
        assert names_of(r) == ["r1"]
        await client.ack(r, resource_names=["r1", "r2"])
        r2 = await client.recv()
        assert names_of(r2) == ["r2"]  # only what is new, for RDS


async def test_invariant_27_backoff_resets_only_after_origin_answers() -> None:
    origin = ScriptedOrigin(drop_first_streams=3)
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        assert stack.relay.upstream is not None
        backoff = RecordingBackoff()
        stack.relay.upstream.backoff = backoff
        client = stack.client()
        await client.send(node=node(), type_url=CLUSTER)
        assert names_of(await client.recv(timeout=10)) == ["a"]
        assert len(origin.streams) >= 4
        # Streams that were accepted but never answered did not reset the backoff.
        assert backoff.events[-1] == "reset"
        assert backoff.events.count("reset") == 1
        assert backoff.events.count("wait") >= 2


async def test_invariant_6_missing_name_reported_then_delivered_when_created() -> None:
    origin = ScriptedOrigin()
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node(), type_url=ENDPOINT, resource_names_subscribe=["later"])
        missing = await client.recv()
        assert list(missing.removed_resources) == ["later"] and list(missing.resources) == []
        await client.ack(missing)
        origin.set(endpoints("later", 7))
        created = await client.recv()  # no new subscribe needed
        assert names_of(created) == ["later"]
        assert list(created.removed_resources) == []


async def test_stopping_closes_every_stream_with_unavailable(
        caplog: pytest.LogCaptureFixture) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        delta, sotw = stack.client(delta=True), stack.client(delta=False)
        for client in (delta, sotw):
            await client.send(node=node(), type_url=CLUSTER)
            await client.ack(await client.recv())
        await stack.relay.stop(grace=2)
        for client in (delta, sotw):
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await client.recv()
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
            assert failure.value.details() == "the relay is shutting down"
    # gRPC logs an ERROR for every handler it has to cancel itself.
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


async def test_a_second_relay_on_a_port_in_use_fails_to_start() -> None:
    # gRPC would share the port (SO_REUSEPORT) and split the clients between
    # the two; only the workers of one relay (--workers) share a port.
    async with running_stack() as stack:
        config = stack.relay.config
        taken = Address("127.0.0.1", stack.relay.xds_port)
        second = build_relay(config.model_copy(update={
            "server": config.server.model_copy(update={"address": taken})}))
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{taken.port}"):
            await second.start()
        await second.stop(0)
