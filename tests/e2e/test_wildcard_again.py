"""A wildcard subscriber waits for the origin's answer to the wildcard
(relay/cache.py's ``holds_wildcard``) where the cache holds only names
subscribed by name:

* once the last wildcard subscriber of a type is gone and its linger is over
  (here at once: ``linger: 0s``), the relay ends the wildcard at its origin
  and forgets what only it held;
* a type that clients subscribe by name only (gRPC's xDS clients ask CDS
  and LDS so) was never answered for the wildcard.

A response from the cache would be short, which a SotW client of a
full-state type (CDS) takes as every other cluster deleted. Before this was
fixed the newcomer got an empty, or short, first response.
"""

from __future__ import annotations

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints
from tests.harness import (
    DELTA,
    OriginStream,
    ScriptedOrigin,
    Stack,
    XdsClient,
    eventually,
    names_of,
    node,
    running_stack,
)


def origin_of(type_url: str) -> ScriptedOrigin:
    origin = ScriptedOrigin()
    made = cluster if type_url == CLUSTER else endpoints
    origin.set(made("a"), made("b"))
    return origin


async def wildcard_held_then_ended(stack: Stack, type_url: str) -> None:
    """A delta client subscribes the wildcard, gets a and b, and leaves; the
    relay then ends the wildcard at its origin."""
    first = stack.client(delta=True)
    await first.send(node=node("first"), type_url=type_url, resource_names_subscribe=["*"])
    assert sorted(names_of(await first.recv())) == ["a", "b"]
    first.close()

    def ended() -> bool:
        return any("*" in request.resource_names_unsubscribe
                   for request in stack.origin.all_requests() if request.type_url == type_url)

    await eventually(ended)
    assert not stack.relay.cache.holds_wildcard(type_url)


async def wildcard_client(stack: Stack, type_url: str, delta: bool, legacy: bool = False
                          ) -> XdsClient:
    """A client subscribing the wildcard (SotW: ``*``, or no names with ``legacy``)."""
    client = stack.client(delta=delta)
    if delta:
        await client.send(node=node("new"), type_url=type_url, resource_names_subscribe=["*"])
    else:
        await client.send(node=node("new"), type_url=type_url,
                          resource_names=[] if legacy else ["*"])
    return client


@pytest.mark.parametrize("type_url", [CLUSTER, ENDPOINT], ids=["cds", "eds"])
@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_invariant_14_a_wildcard_after_the_last_one_ended_waits_for_the_origins_answer(
        type_url: str, delta: bool) -> None:
    async with running_stack(origin_of(type_url), linger="0s") as stack:
        await wildcard_held_then_ended(stack, type_url)
        newcomer = await wildcard_client(stack, type_url, delta)
        got = await newcomer.recv()
        assert sorted(names_of(got)) == ["a", "b"]
        if delta:
            assert list(got.removed_resources) == []
        assert stack.relay.cache.holds_wildcard(type_url)
        await newcomer.ack(got)
        await newcomer.expect_nothing()


async def test_names_kept_for_their_subscribers_are_not_the_wildcards_answer() -> None:
    """A name subscribed by name stays cached when the wildcard ends, and its
    subscribers are served from the cache as ever; a wildcard newcomer gets
    every name, not just the kept one."""
    async with running_stack(origin_of(ENDPOINT), linger="0s") as stack:
        await wildcard_held_then_ended(stack, ENDPOINT)
        named = stack.client(delta=True)
        await named.send(node=node("named"), type_url=ENDPOINT, resource_names_subscribe=["a"])
        assert names_of(await named.recv()) == ["a"]
        assert cache_names(stack) == ["a"] and not stack.relay.cache.holds_wildcard(ENDPOINT)
        late = stack.client(delta=True)
        await late.send(node=node("late"), type_url=ENDPOINT, resource_names_subscribe=["a"])
        assert names_of(await late.recv()) == ["a"]
        newcomer = stack.client(delta=False)
        await newcomer.send(node=node("new"), type_url=ENDPOINT, resource_names=["*"])
        assert sorted(names_of(await newcomer.recv())) == ["a", "b"]


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_invariant_14_the_first_wildcard_on_a_type_held_by_name_gets_every_resource(
        delta: bool) -> None:
    async with running_stack(origin_of(CLUSTER), linger="30s") as stack:
        grpc_client = stack.client(delta=True)  # (CDS by name, as gRPC asks)
        await grpc_client.send(node=node("grpc"), type_url=CLUSTER,
                               resource_names_subscribe=["a"])
        assert names_of(await grpc_client.recv()) == ["a"]
        assert stack.relay.cache.is_synced(CLUSTER)
        assert not stack.relay.cache.holds_wildcard(CLUSTER)
        envoy = await wildcard_client(stack, CLUSTER, delta, legacy=True)
        got = await envoy.recv()
        assert sorted(names_of(got)) == ["a", "b"]  # (not ["a"]: "b" deleted, to SotW)
        await envoy.ack(got)
        await envoy.expect_nothing()


class QuietOnAWildcardAdded(ScriptedOrigin):
    """Answers names; a ``*`` added to a type it already serves on the stream
    goes unanswered, as go-control-plane's delta server leaves it when it has
    nothing new to send."""

    def _answer(self, stream: OriginStream, request: DELTA) -> None:
        if "*" in request.resource_names_subscribe and stream.subscribed.get(request.type_url):
            stream.subscribed[request.type_url].add("*")
            return
        super()._answer(stream, request)


async def test_invariant_1_a_wildcard_the_origin_never_answers_is_answered_after_the_grace(
        ) -> None:
    """The wildcard counts as answered with what the cache holds once
    ``answer_grace`` (0.5 s here) passes with no response on the stream: an
    Envoy waits for its first answer to start up."""
    origin = QuietOnAWildcardAdded()
    origin.set(cluster("a"), cluster("b"))
    async with running_stack(origin, linger="30s") as stack:
        named = stack.client(delta=True)
        await named.send(node=node("grpc"), type_url=CLUSTER, resource_names_subscribe=["a"])
        assert names_of(await named.recv()) == ["a"]
        envoy = await wildcard_client(stack, CLUSTER, delta=True)
        await envoy.expect_nothing(0.2)  # (the origin may still answer: 0.5 s)
        got = await envoy.recv()
        assert names_of(got) == ["a"] and list(got.removed_resources) == []
        assert stack.relay.cache.holds_wildcard(CLUSTER)


def cache_names(stack: Stack) -> list[str]:
    return sorted(stack.relay.cache.names(ENDPOINT))


async def test_an_origin_that_answers_the_new_wildcard_with_nothing_is_passed_on() -> None:
    """The wait ends with the origin's answer, whatever it holds: a type the
    origin has emptied meanwhile gives the newcomer an empty response."""
    async with running_stack(origin_of(ENDPOINT), linger="0s") as stack:
        await wildcard_held_then_ended(stack, ENDPOINT)
        stack.origin.remove(ENDPOINT, "a")
        stack.origin.remove(ENDPOINT, "b")
        newcomer = stack.client(delta=False)
        await newcomer.send(node=node("new"), type_url=ENDPOINT, resource_names=["*"])
        got: discovery_pb2.DiscoveryResponse = await newcomer.recv()
        assert names_of(got) == []
        assert stack.relay.cache.holds_wildcard(ENDPOINT)
