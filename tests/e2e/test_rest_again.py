"""End to end: a poll the REST server answered before, from an unchanged
lease, is answered again without being decoded or fetched (the same bytes,
counted, recorded and renewing its lease as any poll), and a change, a
lapsed lease, another body or a NACK sends it the whole way."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from relay.server.rest import RestServer
from relay.xds_types import ENDPOINT
from tests.builders import endpoints
from tests.clock import ManualClock
from tests.e2e.test_rest import ENDPOINTS, metric, poll, rest_stack
from tests.harness import ScriptedOrigin, Stack, eventually


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def rest_of(stack: Stack) -> RestServer:
    rest = stack.relay.rest
    assert rest is not None
    return rest


def acks(stack: Stack) -> float:
    return metric(stack, "xds_relay_downstream_acks_total", protocol="rest")


async def test_the_same_poll_again_is_answered_with_the_same_bytes_without_a_fetch(
        http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("e1", 1), endpoints("e2", 1))
    async with rest_stack(origin) as stack:
        rest = rest_of(stack)
        request = {"node": {"id": "n1"}, "resourceNames": ["e1", "e2"]}
        first = await poll(http, stack, ENDPOINTS, request)
        again = await poll(http, stack, ENDPOINTS, request)
        assert rest.answered_again == 1
        assert (again[0], again[1]) == (first[0], first[1]) == (200, first[1])
        current = {**request, "versionInfo": json.loads(first[1])["versionInfo"]}
        assert (await poll(http, stack, ENDPOINTS, current))[:2] == (304, b"")
        assert rest.answered_again == 1  # another body: fetched
        for count in (2, 3):
            assert (await poll(http, stack, ENDPOINTS, current))[:2] == (304, b"")
            assert rest.answered_again == count
        # counted as any poll: 2 pushes, 3 ACKs
        assert metric(stack, "xds_relay_downstream_pushes_total", protocol="rest") == 2
        assert acks(stack) == 3
        # and recorded for /clients
        (poller,) = stack.relay.serving.pollers.summaries()
        assert poller["types"][ENDPOINT]["sync"] == "synced"
        assert poller["types"][ENDPOINT]["subscribed"] == ["e1", "e2"]


async def test_a_change_to_the_polled_resources_sends_the_next_poll_the_whole_way(
        http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("e1", 1), endpoints("e2", 1))
    async with rest_stack(origin) as stack:
        rest = rest_of(stack)
        request = {"node": {"id": "n1"}, "resourceNames": ["e1"]}
        _, body, _ = await poll(http, stack, ENDPOINTS, request)
        current = {**request, "versionInfo": json.loads(body)["versionInfo"]}
        assert (await poll(http, stack, ENDPOINTS, current))[0] == 304
        assert (await poll(http, stack, ENDPOINTS, current))[0] == 304
        assert rest.answered_again == 1
        # a change to another name is no change to this poll's lease
        origin.set(endpoints("e2", 2))
        await asyncio.sleep(0.1)
        assert (await poll(http, stack, ENDPOINTS, current))[0] == 304
        assert rest.answered_again == 2
        origin.set(endpoints("e1", 2))
        status, changed, _ = await poll(http, stack, ENDPOINTS, current)
        for _ in range(250):  # until the change reached the cache (5 s at most)
            if status != 304:
                break
            await asyncio.sleep(0.02)
            status, changed, _ = await poll(http, stack, ENDPOINTS, current)
        assert status == 200
        assert json.loads(changed)["versionInfo"] != current["versionInfo"]
        assert json.loads(changed)["resources"][0]["endpoints"][0]["lbEndpoints"][0][
            "endpoint"]["address"]["socketAddress"]["portValue"] == 2


async def test_a_lapsed_lease_is_subscribed_afresh_by_the_same_poll(
        http: aiohttp.ClientSession) -> None:
    clock = ManualClock()
    origin = ScriptedOrigin()
    origin.set(endpoints("e1", 1))
    async with rest_stack(origin, clock=clock, rest="lease: 60s") as stack:
        rest = rest_of(stack)
        request = {"node": {"id": "n1"}, "resourceNames": ["e1"]}
        _, body, _ = await poll(http, stack, ENDPOINTS, request)
        current = {**request, "versionInfo": json.loads(body)["versionInfo"]}
        await clock.advance(30)  # (the origin's names settle: a change to the lease)
        assert (await poll(http, stack, ENDPOINTS, current))[0] == 304
        await clock.advance(29)
        assert (await poll(http, stack, ENDPOINTS, current))[0] == 304
        assert rest.answered_again == 1  # and renewed: 60 s from now
        await asyncio.sleep(0.05)
        await clock.advance(59)
        await asyncio.sleep(0.05)
        assert origin.stream.subscribed[ENDPOINT] == {"e1"}
        await clock.advance(2)
        await eventually(lambda: not origin.stream.subscribed[ENDPOINT])
        assert (await poll(http, stack, ENDPOINTS, current))[0] == 304
        assert rest.answered_again == 1  # fetched: a new lease
        assert origin.stream.subscribed[ENDPOINT] == {"e1"}


async def test_another_node_or_a_nack_is_not_answered_again(
        http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    origin.set(endpoints("e1", 1))
    async with rest_stack(origin) as stack:
        rest = rest_of(stack)
        request: dict[str, Any] = {"node": {"id": "n1"}, "resourceNames": ["e1"]}
        _, body, _ = await poll(http, stack, ENDPOINTS, request)
        version = json.loads(body)["versionInfo"]
        for node_id in ("n2", "n3"):
            assert (await poll(http, stack, ENDPOINTS, {
                **request, "node": {"id": node_id}, "versionInfo": version}))[0] == 304
        nack = {**request, "versionInfo": version,
                "errorDetail": {"code": 3, "message": "bad endpoint"}}
        for _ in range(2):
            assert (await poll(http, stack, ENDPOINTS, nack))[0] == 304
        assert rest.answered_again == 0
        assert metric(stack, "xds_relay_downstream_nacks_total", protocol="rest") == 2


async def test_the_answers_kept_are_bounded_the_least_recently_used_go_first(
        http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch) -> None:
    import relay.server.rest

    monkeypatch.setattr(relay.server.rest, "ANSWERS_KEPT", 2)
    origin = ScriptedOrigin()
    origin.set(endpoints("e1", 1))
    async with rest_stack(origin) as stack:
        rest = rest_of(stack)
        _, body, _ = await poll(http, stack, ENDPOINTS, {"resourceNames": ["e1"]})
        version = json.loads(body)["versionInfo"]
        polls = {node_id: {"node": {"id": node_id}, "resourceNames": ["e1"],
                           "versionInfo": version} for node_id in ("a", "b", "c")}
        for node_id in ("a", "b", "a", "c"):  # c's answer makes room: b's goes
            assert (await poll(http, stack, ENDPOINTS, polls[node_id]))[0] == 304
        assert rest.answered_again == 1
        assert (await poll(http, stack, ENDPOINTS, polls["b"]))[0] == 304
        assert rest.answered_again == 1  # fetched again (and a's goes)
        for node_id in ("c", "b"):
            assert (await poll(http, stack, ENDPOINTS, polls[node_id]))[0] == 304
        assert rest.answered_again == 3
