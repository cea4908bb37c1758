"""End to end: REST pollers in /clients and ``xds-relay status``, and their
NACKs (a poll carrying ``error_detail``) logged, counted and shown like a
stream's, against a real relay with a real aiohttp client."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from relay.status_command import run_status
from relay.xds_types import CLUSTER
from tests.e2e.test_rest import CLUSTERS, metric, poll, rest_stack
from tests.harness import ScriptedOrigin, Stack, cluster


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def pollers(stack: Stack) -> list[dict[str, Any]]:
    return [c for c in stack.relay.serving.client_statuses() if c["protocol"] == "rest"]


async def first_version(http: aiohttp.ClientSession, stack: Stack,
                        request: dict[str, Any]) -> str:
    status, body, _ = await poll(http, stack, CLUSTERS, request)
    assert status == 200
    return str(json.loads(body)["versionInfo"])


async def test_a_poller_that_holds_the_current_version_is_listed_synced(
        http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with rest_stack(origin) as stack:
        request = {"node": {"id": "poller-1"}, "resourceNames": ["a"]}
        version = await first_version(http, stack, request)
        [sent] = pollers(stack)
        assert (sent["types"][CLUSTER]["sync"], sent["types"][CLUSTER]["in_flight"]) == (
            "stale", version)  # sent; its next poll says whether it took it
        status, _, _ = await poll(http, stack, CLUSTERS, {**request, "versionInfo": version})
        assert status == 304
        [listed] = pollers(stack)
    assert (listed["node_id"], listed["peer"], listed["service"]) == (
        "poller-1", "ipv4:127.0.0.1", "REST")
    polled = listed["types"][CLUSTER]
    assert (polled["subscribed"], polled["wildcard"], polled["acked"], polled["sync"],
            polled["last_nack"]) == (["a"], False, version, "synced", None)
    assert listed["connected_since"] <= listed["last_poll"] == polled["acked_at"]
    assert listed["acked_at"] == polled["acked_at"]


async def test_a_rest_nack_is_logged_counted_and_shown_like_a_streams(
        http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with rest_stack(origin) as stack:
        request = {"node": {"id": "poller-1"}, "resourceNames": ["a"]}
        version = await first_version(http, stack, request)
        nack = {**request, "versionInfo": "", "errorDetail": {"message": "bad cluster a"}}
        with caplog.at_level(logging.WARNING, logger="relay.downstream"):
            for _ in range(2):  # the second within the interval: counted, not logged
                status, _, _ = await poll(http, stack, CLUSTERS, nack)
                assert status == 200
        assert metric(stack, "xds_relay_downstream_nacks_total", protocol="rest",
                      type="Cluster") == 2
        [listed] = pollers(stack)
    lines = [r.getMessage() for r in caplog.records if "NACK" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("NACK from node='poller-1' peer=ipv4:127.0.0.1:")
    assert lines[0].endswith(" type=Cluster version=: bad cluster a")
    polled = listed["types"][CLUSTER]
    assert (polled["sync"], polled["last_nack"]) == (
        "nacked", {"version": "", "message": "bad cluster a"})
    assert listed["nacked_at"] == polled["nacked_at"] is not None
    assert version  # it holds nothing: the version it was sent is what it rejected


async def test_status_lists_rest_pollers_and_their_nacks(http: aiohttp.ClientSession) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with rest_stack(origin) as stack:
        request = {"node": {"id": "poller-1"}, "resourceNames": ["a"]}
        await first_version(http, stack, request)
        await poll(http, stack, CLUSTERS, {**request, "errorDetail": {"message": "no"}})
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(run_status, f"http://127.0.0.1:{stack.relay.admin_port}",
                                       out=out, err=err, check=True)
    assert (code, err.getvalue()) == (4, "")
    [header, row] = [line.split() for line in out.getvalue().splitlines()
                     if line.startswith(("NODE", "poller-1"))]
    assert header[:4] == ["NODE", "PEER", "PROTOCOL", "Cluster"]
    assert row == ["poller-1", "ipv4:127.0.0.1", "rest", "NACKED", "Cluster:", "no"]
