"""End to end: make-before-break ordering, Envoy's EDS re-request, NACK records."""

from __future__ import annotations

from typing import Any

from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from tests.harness import (
    ScriptedOrigin,
    Stack,
    XdsClient,
    cluster,
    endpoints,
    eventually,
    listener,
    names_of,
    node,
    route,
    running_stack,
    type_url_of,
)


async def test_invariant_20_one_origin_burst_reaches_client_in_make_before_break_order() -> None:
    origin = ScriptedOrigin(auto=False)
    # one burst only if it arrives within the batch window (see below)
    async with running_stack(origin, server="batch_window: 500ms") as stack:
        client = stack.client()
        for type_url, names in ((ROUTE, ["r"]), (LISTENER, []), (ENDPOINT, ["c"]),
                                (CLUSTER, [])):
            await client.send(node=node(), type_url=type_url, resource_names_subscribe=names)
        for _ in range(4):
            await origin.next_request()
        # The origin answers type by type, in the worst order, back to back.
        burst = (route("r", "c"), listener("l"), endpoints("c", 1), cluster("c"))
        for msg in burst:
            origin.resources.setdefault(type_url_of(msg), {})
        origin.set(*burst)
        for msg in burst:
            origin.send(origin.stream, type_url_of(msg),
                        [getattr(msg, "name", "") or getattr(msg, "cluster_name", "")])
        order = [(await client.recv()).type_url for _ in range(4)]
        assert order == [CLUSTER, ENDPOINT, LISTENER, ROUTE]


def two_clusters_and_a_listener() -> ScriptedOrigin:
    """An origin of clusters "old" and "new" and listener "l" (on "old")."""
    origin = ScriptedOrigin()
    origin.set(cluster("old"), cluster("new"), listener("l"))
    return origin


async def subscribed_to_both(stack: Stack) -> tuple[XdsClient, dict[str, Any]]:
    """A delta client of every cluster and listener, and its first response
    of each type (not ACKed yet)."""
    client = stack.client()
    await client.send(node=node(), type_url=CLUSTER)
    await client.send(node=node(), type_url=LISTENER)
    responses = [await client.recv(), await client.recv()]
    return client, {response.type_url: response for response in responses}


async def assert_listener_then_removal(client: XdsClient) -> None:
    """The listener's move off "old" comes first, then the removal of "old"."""
    first, second = await client.recv(), await client.recv()
    assert first.type_url == LISTENER
    assert [r.name for r in first.resources] == ["l"]
    assert second.type_url == CLUSTER and list(second.removed_resources) == ["old"]


async def test_invariant_20_cluster_removals_go_after_the_listener_change() -> None:
    origin = two_clusters_and_a_listener()
    # The two origin responses below are one burst only if they arrive within
    # the batch window: a wide one, so that a busy machine cannot split them.
    async with running_stack(origin, server="batch_window: 500ms") as stack:
        client, responses = await subscribed_to_both(stack)
        for response in responses.values():
            await client.ack(response)
        # One change: the listener moves off "old", and "old" is deleted.
        origin.remove(CLUSTER, "old")
        origin.set(listener("l", port=10001))
        await assert_listener_then_removal(client)


async def test_invariant_20_an_ack_inside_the_batch_window_lets_no_half_burst_out() -> None:
    """The client's ACK arrives after the first half of a burst (the removal
    of "old") and before the second (the listener moving off it): woken by
    the ACK, the stream still waits for the window, so the listener change
    goes first. Before, the ACK's wake pushed the removal at once."""
    origin = two_clusters_and_a_listener()
    async with running_stack(origin, server="batch_window: 2s") as stack:
        client, held = await subscribed_to_both(stack)
        await client.ack(held[CLUSTER])  # the listener's ACK is kept for later
        (stream,) = stack.relay.serving.streams
        origin.remove(CLUSTER, "old")
        await eventually(lambda: "old" not in stack.relay.cache.names(CLUSTER))
        await client.ack(held[LISTENER])
        await eventually(lambda: LISTENER in stream.times().answered)
        await client.expect_nothing()  # the window is still open
        origin.set(listener("l", port=10001))
        await assert_listener_then_removal(client)


async def test_sotw_endpoints_are_answered_after_a_cluster_push_even_if_unchanged() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), endpoints("a", 1))
    async with running_stack(origin) as stack:
        client = stack.client(delta=False)
        await client.send(node=node(), type_url=CLUSTER)
        await client.send(node=node(), type_url=ENDPOINT, resource_names=["a"])
        eds = None
        for _ in range(2):
            response = await client.recv()
            if response.type_url == ENDPOINT:
                eds = response
                await client.ack(response, resource_names=["a"])
            else:
                await client.ack(response)
        assert eds is not None
        origin.set(cluster("a", timeout_s=7))
        cds = await client.recv()
        assert cds.type_url == CLUSTER
        await client.ack(cds)
        # Envoy warms the updated cluster: it asks for its endpoints again with
        # the last EDS nonce, and waits for an answer.
        await client.ack(eds, resource_names=["a"])
        again = await client.recv()
        assert again.type_url == ENDPOINT and names_of(again) == ["a"]
        await client.ack(again, resource_names=["a"])
        await client.expect_nothing()


async def test_invariant_10_downstream_nack_is_recorded_per_client_and_type() -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), version="v9")
    async with running_stack(origin) as stack:
        client = stack.client()
        await client.send(node=node("nacker"), type_url=CLUSTER)
        response = await client.recv()
        await client.ack(response, error_detail={"code": 3, "message": "cluster a is bad"})
        await client.expect_nothing()
        [status] = stack.relay.serving.client_statuses()
        assert status["node_id"] == "nacker" and status["protocol"] == "delta"
        assert status["types"][CLUSTER]["last_nack"] == {
            "nonce": response.nonce, "versions": {"a": "v9"}, "message": "cluster a is bad"}
        assert status["types"][CLUSTER]["wildcard"] is True


async def test_resource_errors_reach_subscribers_of_that_name_in_both_variants() -> None:
    origin = ScriptedOrigin(auto=False)
    async with running_stack(origin) as stack:
        delta, sotw = stack.client(), stack.client(delta=False)
        other = stack.client()
        await delta.send(node=node("d"), type_url=ENDPOINT, resource_names_subscribe=["a"])
        await sotw.send(node=node("s"), type_url=ENDPOINT, resource_names=["a"])
        await other.send(node=node("o"), type_url=ENDPOINT, resource_names_subscribe=["b"])
        # "a" once for both its subscribers, and "b": in one request or two, as
        # the clients' requests fall in one turn of the relay's loop or not.
        await eventually(lambda: {"a", "b"} <= {
            name for request in origin.subscription_requests()
            for name in request.resource_names_subscribe})
        failing = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT)
        error = failing.resource_errors.add()
        error.resource_name.name = "a"
        error.error_detail.code = 5
        error.error_detail.message = "no endpoints for a yet"
        origin.send_raw(failing)
        got_delta, got_sotw = await delta.recv(), await sotw.recv()
        for response in (got_delta, got_sotw):
            assert list(response.resources) == []
            [forwarded] = response.resource_errors
            assert forwarded == error
        await other.expect_nothing()
        await delta.ack(got_delta)
        await sotw.ack(got_sotw, resource_names=["a"])
        origin.resources[ENDPOINT] = {}
        origin.set(endpoints("a", 1))
        origin.send(origin.stream, ENDPOINT, ["a"])
        for client in (delta, sotw):
            healed = await client.recv()
            assert names_of(healed) == ["a"] and list(healed.resource_errors) == []
