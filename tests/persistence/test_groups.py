"""A node group's registry entry: what a warm start restores a group from."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from envoy.config.core.v3 import base_pb2

from relay.cache import ResourceCache
from relay.persistence.entries import CorruptEntry
from relay.persistence.groups import (
    GroupOrigin,
    GroupSnapshot,
    StoredGroup,
    decode_group,
    encode_group,
    forget_group,
    seen_every,
)
from relay.persistence.stores import (
    DirectoryGroupRegistry,
    DirectoryStore,
    SnapshotBatch,
    TypeState,
)
from relay.telemetry import new_metrics, prometheus_provider
from relay.xds_types import CLUSTER
from tests.clock import ManualClock


def test_an_entry_reads_back_as_written() -> None:
    node = base_pb2.Node(id="relay-1", cluster="checkout")
    node.metadata.update({"NAMESPACE": "shop", "LABELS": {"app": "cart"}})
    group = StoredGroup("g-0123456789ab", ("cluster", "metadata.NAMESPACE"),
                        ("checkout", "shop"), node, 1234.5)
    assert decode_group(encode_group(group)) == group


@pytest.mark.parametrize(("entry", "why"), [
    (b"not json", "not a node group entry: Expecting value: line 1 column 1 (char 0)"),
    (b'{"id": "g-1", "fields": [], "key": []}', "not a node group entry: 'node'"),
    (b'{"id": "g-1", "fields": [], "key": [1], "node": ""}',
     "not a node group entry: id, fields and key are strings"),
    (b'{"id": "g-1", "fields": [], "key": [], "node": "%%"}',
     "not a node group entry: Only base64 data is allowed"),
])
def test_a_bad_entry_says_why(entry: bytes, why: str) -> None:
    with pytest.raises(CorruptEntry) as bad:
        decode_group(entry)
    assert str(bad.value) == why


# -- deleting a group's snapshot, and saying it is seen ------------------------------------


def _group(seen_at: float | None = None) -> StoredGroup:
    return StoredGroup("g-0123456789ab", ("cluster",), ("checkout",),
                       base_pb2.Node(id="relay-1", cluster="checkout"), seen_at)


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[DirectoryStore, DirectoryStore]]:
    """The relay's store and, sharing its thread, the group's."""
    relay = DirectoryStore(tmp_path)
    group = DirectoryStore(tmp_path / "groups" / "g-0123456789ab", share=relay)
    await group.write(SnapshotBatch(upserts={CLUSTER: {"backend": b"entry"}},
                                    types={CLUSTER: TypeState()}, written_at=1.0))
    yield relay, group
    await relay.close()


@pytest.mark.parametrize(("seen_ago", "deleted"), [
    (None, True),     # never seen (written by no relay with clients)
    (10.0, False),    # another relay served it 10s ago: kept
    (199.0, False),   # within two periods of a third of linger (300s)
    (201.0, True),    # nobody since: it goes
])
async def test_a_group_is_deleted_unless_a_relay_served_it_lately(
        stores: tuple[DirectoryStore, DirectoryStore], seen_ago: float | None,
        deleted: bool) -> None:
    relay, group = stores
    registry = DirectoryGroupRegistry(relay)
    now = 10_000.0
    await registry.put("g-0123456789ab", encode_group(
        _group(None if seen_ago is None else now - seen_ago)))
    assert await forget_group(registry, "g-0123456789ab", {"default": group}, 300.0, now,
                              "it closed, idle") is deleted
    assert (await group.load() is None) is deleted
    assert (await registry.get("g-0123456789ab") is None) is deleted


def _snapshot(registry: DirectoryGroupRegistry, group: DirectoryStore,
              clock: ManualClock) -> GroupSnapshot:
    """The group's snapshot on ``clock`` (the wall clock 5,000 s ahead; linger 30 s)."""
    return GroupSnapshot(_group(), registry, ResourceCache(clock.now),
                         {"default": GroupOrigin(group, ResourceCache(clock.now))},
                         new_metrics(prometheus_provider()[0]), clock, linger=30.0,
                         wall=lambda: clock.now() + 5_000)


async def test_a_running_group_says_it_is_seen_while_it_has_clients(
        stores: tuple[DirectoryStore, DirectoryStore]) -> None:
    relay, group = stores
    registry = DirectoryGroupRegistry(relay)
    clock = ManualClock()
    snapshot = _snapshot(registry, group, clock)
    clients = 1
    running = asyncio.create_task(snapshot.run(lambda: clients))

    async def seen_at() -> float | None:
        for _ in range(100):
            await asyncio.sleep(0)
        entry = await registry.get("g-0123456789ab")
        return None if entry is None else decode_group(entry).seen_at

    assert seen_every(30.0) == 10.0
    assert await seen_at() == 6_000.0  # at once: the group's first client joined
    await clock.advance(10.0)
    assert await seen_at() == 6_010.0
    clients = 0
    await clock.advance(10.0)
    assert await seen_at() == 6_010.0  # no client: not seen
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


async def test_a_group_stopped_before_its_first_listing_is_listed_by_the_flush(
        stores: tuple[DirectoryStore, DirectoryStore]) -> None:
    """A relay that stops within a turn of a group's first client still lists
    the group on its way out: a warm start finds its snapshot only there."""
    relay, group = stores
    registry = DirectoryGroupRegistry(relay)
    clock = ManualClock()
    snapshot = _snapshot(registry, group, clock)
    running = asyncio.create_task(snapshot.run(lambda: 1))
    running.cancel()  # before its first turn
    with contextlib.suppress(asyncio.CancelledError):
        await running
    assert await registry.get("g-0123456789ab") is None
    await clock.advance(3.0)
    await snapshot.flush()
    entry = await registry.get("g-0123456789ab")
    assert entry is not None and decode_group(entry).seen_at == 6_003.0
    # once listed, a flush leaves the registry to the turns
    await clock.advance(3.0)
    await snapshot.flush()
    entry = await registry.get("g-0123456789ab")
    assert entry is not None and decode_group(entry).seen_at == 6_003.0
