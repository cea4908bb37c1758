"""A resource's JSON is written once for every poll that answers it
(relay.server.json_fragments): answers joined from kept fragments are the
answers written whole, to the byte; a fragment goes with its resource and
the table holds no more than its limit. Counted (fragments made, pauses),
not timed."""

from __future__ import annotations

import dataclasses
import gc
import json

import aiohttp
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.config.values import Address
from relay.protocol.sotw import SotwResponsePlan
from relay.resource import CachedResource
from relay.server import rest
from relay.server.fetch import Served
from relay.server.json_fragments import OVERHEAD, PLAIN, JsonFragments
from relay.server.rest import RestServer, Unrenderable, render_json, render_json_slices
from relay.turns import made
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack
from tests.test_fetch_linear import setup
from tests.test_no_stall import names, pauses, plan_of


def written(plan: SotwResponsePlan, fragments: JsonFragments, per_slice: int = 300
            ) -> tuple[int, int, bytes]:
    """Pauses, fragments made, and the JSON of ``plan``."""
    before = fragments.made
    count, body = pauses(render_json_slices(plan, per_slice, fragments))
    return count, fragments.made - before, body


@pytest.mark.parametrize(("wrapped", "errors", "heartbeats"), [(0, 0, 0), (40, 3, 5)])
def test_an_answer_joined_from_kept_fragments_is_the_answer_written_whole(
        wrapped: int, errors: int, heartbeats: int) -> None:
    plan = plan_of(1_000, wrapped, errors)
    plan.heartbeats = frozenset(names(1_000)[-heartbeats:]) if heartbeats else frozenset()
    fragments = JsonFragments()
    assert written(plan, fragments) == (3, 1_000, render_json(plan))
    assert len(fragments) == 1_000
    # again (another lease of the same resources): joined, none written, no pause
    assert written(plan, fragments) == (0, 0, render_json(plan))


def test_a_small_answer_is_joined_from_fragments_too() -> None:
    plan = plan_of(10)
    fragments = JsonFragments()
    assert written(plan, fragments) == (0, 10, render_json(plan))
    assert written(plan, fragments) == (0, 0, render_json(plan))
    empty = dataclasses.replace(plan, resources=[])
    assert written(empty, fragments) == (0, 0, render_json(empty))


def test_after_a_change_only_the_resource_changed_is_written_again() -> None:
    plan = plan_of(1_000)
    fragments = JsonFragments()
    written(plan, fragments)
    changed = list(plan.resources)
    changed[10] = CachedResource.from_message(ENDPOINT, pack(endpoints("e00010", 9)),
                                              "e00010", "v-new")
    after = dataclasses.replace(plan, resources=changed, version_info="00000000000000bb")
    assert written(after, fragments) == (0, 1, render_json(after))


def test_a_resource_wrapped_and_plain_has_a_fragment_of_each() -> None:
    plain = plan_of(50)
    wrapped = dataclasses.replace(plain, wrapped=frozenset(names(50)))
    fragments = JsonFragments()
    assert written(plain, fragments)[1:] == (50, render_json(plain))
    assert written(wrapped, fragments)[1:] == (50, render_json(wrapped))
    assert written(plain, fragments)[1:] == (0, render_json(plain))
    assert written(wrapped, fragments)[1:] == (0, render_json(wrapped))
    assert len(fragments) == 100


def test_found_fragments_are_joined_a_slice_of_look_ups_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rest, "LOOKUPS_PER_RENDER", 300)
    plan = plan_of(1_000)
    fragments = JsonFragments()
    written(plan, fragments, per_slice=5_000)
    assert written(plan, fragments) == (3, 0, render_json(plan))


def test_fragments_go_with_their_resources() -> None:
    plan = plan_of(100)
    fragments = JsonFragments()
    written(plan, fragments)
    assert len(fragments) == 100
    kept = plan.resources[:3]
    assert fragments.size == sum(len(fragment) + OVERHEAD for fragment in [
        fragments.get(resource, PLAIN) for resource in plan.resources] if fragment)
    del plan
    gc.collect()
    assert len(fragments) == 3  # what still holds its resources
    assert fragments.size == sum(len(fragments.get(resource, PLAIN) or b"") + OVERHEAD
                                 for resource in kept)
    del kept
    gc.collect()
    assert (len(fragments), fragments.size) == (0, 0)


def test_fragments_hold_no_more_than_their_limit() -> None:
    plan = plan_of(100)
    one = len(json.dumps(json.loads(render_json(plan))["resources"][0])) + OVERHEAD
    fragments = JsonFragments(limit=10 * one)
    assert written(plan, fragments)[1:] == (100, render_json(plan))
    assert 8 <= len(fragments) <= 10
    assert fragments.size <= fragments.limit
    # those not kept are written again, those kept are not
    assert written(plan, fragments)[1:] == (100 - len(fragments), render_json(plan))


def test_an_unrenderable_resource_is_kept_by_no_fragment() -> None:
    unknown = any_pb2.Any(type_url="type.googleapis.com/example.Unknown", value=b"\x08\x01")
    plan = SotwResponsePlan(ENDPOINT, "1", "v", [
        CachedResource.from_message(ENDPOINT, unknown, f"x{i}", "1") for i in range(3)])
    fragments = JsonFragments()
    with pytest.raises(Unrenderable):
        made(render_json_slices(plan, 1, fragments))
    assert len(fragments) == 0


async def test_a_new_lease_over_resources_another_answered_writes_none_of_them() -> None:
    count = 600
    core, fetcher = setup(names(count))
    server = RestServer(core.serving, fetcher, Address("127.0.0.1", 0), render_slice=100)
    url = f"http://127.0.0.1:{await server.start()}/v3/discovery:endpoints"

    def body(node: dict[str, object], asked: list[str]) -> bytes:
        return json.dumps({"node": node, "resourceNames": asked}).encode()

    zoned = {"id": "z", "dynamicParameters": {ENDPOINT: {"params": {"zone": "a"}}}}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=body({"id": "n"}, names(count))) as reply:
                assert reply.status == 200
                first = await reply.read()
            assert server.fragments.made == count
            # other parameters (a lease of its own), and fewer names (another)
            async with http.post(url, data=body(zoned, names(count))) as reply:
                assert (reply.status, await reply.read()) == (200, first)
            async with http.post(url, data=body({"id": "n"}, names(count - 1))) as reply:
                assert reply.status == 200
                fewer = await reply.read()
    finally:
        await server.stop()
    assert len(fetcher.leases()) == 3
    assert server.fragments.made == count  # none written again
    outcome = await fetcher.fetch(discovery_pb2.DiscoveryRequest(
        node={"id": "n"}, resource_names=names(count - 1)), ENDPOINT, "ipv4:127.0.0.1:2")
    assert isinstance(outcome, Served)
    assert fewer == render_json(outcome.plan)
