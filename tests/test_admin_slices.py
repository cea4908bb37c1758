"""/clients lets the loop run within a big client's record: its comparison
with the cache is made in slices (relay.server.status.client_summary_slices),
the admin server runs others at each, and the record is the one made in one
go. Counted, not timed."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.admin import AdminServer
from relay.cache import ResourceCache, Update
from relay.protocol.snapshot import ResourceState, ResourceStatus, SessionSnapshot, TypeSnapshot
from relay.resource import CachedResource
from relay.server.status import (
    RESOURCES_PER_SLICE,
    ClientRecords,
    client_summary,
    client_summary_slices,
)
from relay.xds_types import CLUSTER

HELD = 2 * RESOURCES_PER_SLICE + 300
CACHED = HELD + 200  # a wildcard's names not sent yet are compared too


def cache_of(count: int) -> ResourceCache:
    cache = ResourceCache()
    cache.apply(CLUSTER, Update([
        CachedResource(CLUSTER, f"c{i:05d}", "v2", discovery_pb2.Resource(name=f"c{i:05d}"))
        for i in range(count)], complete=True))
    return cache


def wildcard_client(held: int, node_id: str = "big") -> SessionSnapshot:
    """A wildcard CDS stream holding ``held`` clusters, one at an old version, one NACKed."""
    names = [f"c{i:05d}" for i in range(held)]
    resources = tuple(
        ResourceState(name, ResourceStatus.NACKED if i == 7 else ResourceStatus.ACKED,
                      "v1" if i == 3 else "v2", "", name)
        for i, name in enumerate(names))
    state = TypeSnapshot(CLUSTER, (), True, tuple((name, "v2") for name in names), "v2",
                         None, None, resources)
    return SessionSnapshot(base_pb2.Node(id=node_id), "delta", (state,))


def made_in_slices(snapshot: SessionSnapshot, cache: ResourceCache) -> tuple[int, Any]:
    """How many times the record's making paused, and the record."""
    slices = client_summary_slices(snapshot, "ipv4:10.0.0.1:1", cache)
    pauses = 0
    while True:
        try:
            next(slices)
        except StopIteration as done:
            return pauses, done.value
        pauses += 1


def test_a_big_clients_record_is_made_in_slices_and_is_the_record_made_at_once() -> None:
    cache = cache_of(CACHED)
    snapshot = wildcard_client(HELD)
    pauses, record = made_in_slices(snapshot, cache)
    # one after the big snapshot, then every resource held and every cached
    # name, counted: a pause each slice
    assert pauses == 1 + (HELD + CACHED) // RESOURCES_PER_SLICE
    assert record == client_summary(snapshot, "ipv4:10.0.0.1:1", cache)
    unsynced = record["types"][CLUSTER]["unsynced"]
    assert sorted(unsynced) == ["c00003", "c00007", *(f"c{i:05d}" for i in range(HELD, CACHED))]
    assert record["types"][CLUSTER]["sync"] == "nacked"


def test_a_small_clients_record_is_made_without_a_pause() -> None:
    cache = cache_of(10)
    pauses, _ = made_in_slices(wildcard_client(10), cache)
    assert pauses == 0


def test_client_records_iterated_are_whole_records_and_sliced_have_the_pauses() -> None:
    def parts() -> Iterator[dict[str, Any] | None]:
        yield {"node_id": "a"}
        yield None
        yield None
        yield {"node_id": "b"}

    assert list(ClientRecords(parts())) == [{"node_id": "a"}, {"node_id": "b"}]
    assert list(ClientRecords(parts()).slices()) == [
        {"node_id": "a"}, None, None, {"node_id": "b"}]


async def test_clients_reply_lets_the_loop_run_at_each_slice_and_writes_the_same_json() -> None:
    cache = cache_of(CACHED)
    snapshots = [wildcard_client(HELD, f"n{i}") for i in range(3)]
    ticks = 0
    seen: list[int] = []  # the loop's ticks at each pause

    def parts() -> Iterator[dict[str, Any] | None]:
        for snapshot in snapshots:
            slices = client_summary_slices(snapshot, "ipv4:10.0.0.1:1", cache)
            while True:
                try:
                    next(slices)
                except StopIteration as done:
                    yield done.value
                    break
                seen.append(ticks)
                yield None

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    admin = AdminServer(cache, None, lambda: None, lambda: ClientRecords(parts()))
    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        reply = await admin.respond("GET", "/clients")
    finally:
        ticker.cancel()
    per_client = 1 + (HELD + CACHED) // RESOURCES_PER_SLICE
    assert len(seen) == 3 * per_client
    # between two pauses the loop ran others
    assert all(later > earlier for earlier, later in itertools.pairwise(seen))
    records = [client_summary(s, "ipv4:10.0.0.1:1", cache) for s in snapshots]
    assert reply.body == json.dumps({"clients": records}, indent=2).encode() + b"\n"


def test_a_relays_client_records_pause_within_a_big_stream_and_not_within_a_small() -> None:
    from tests.server.test_status import Delta, open_stream, send, serving

    ctx = serving()
    ctx.cache.apply(CLUSTER, Update([
        CachedResource(CLUSTER, f"c{i:05d}", "v2", discovery_pb2.Resource(name=f"c{i:05d}"))
        for i in range(HELD)], complete=True))
    big, small = open_stream(ctx, "delta", "big"), open_stream(ctx, "delta", "small")
    send(big, Delta(type_url=CLUSTER, resource_names_subscribe=["*"]))
    send(small, Delta(type_url=CLUSTER, resource_names_subscribe=["c00001"]))
    parts = list(ctx.iter_client_statuses().slices())
    shape = [part["node_id"] if part is not None else None for part in parts]
    # the big one's held names and the cache's, a pause each slice; the small one's none
    held = len(parts[shape.index("big")]["types"][CLUSTER]["versions"])  # type: ignore[index]
    pauses = (held + HELD) // RESOURCES_PER_SLICE + (held > RESOURCES_PER_SLICE)
    assert shape == [*[None] * pauses, "big", "small"]
    assert shape.count(None) >= 2
    assert [r["node_id"] for r in ctx.iter_client_statuses()] == ["big", "small"]
    assert [r for r in parts if r is not None] == ctx.client_statuses()
