"""Both stores behind one interface: what is written is what loads, and a
store that cannot be reached says so (it never hangs)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relay.persistence.entries import FORMAT
from relay.persistence.stores import (
    ENTRIES_PER_WRITE,
    DirectoryGroupRegistry,
    DirectoryStore,
    GroupRegistry,
    RedisGroupRegistry,
    RedisStore,
    SnapshotBatch,
    SnapshotStore,
    StoreError,
    TypeState,
    _type_state,
)
from relay.xds_types import CLUSTER, LISTENER
from tests.redis_server import RedisServer


@pytest.fixture(params=["redis", "directory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SnapshotStore]:
    made: SnapshotStore
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis")
        made = RedisStore(server.url, request.getfixturevalue("prefix"), timeout=2.0)
    else:
        made = DirectoryStore(tmp_path / "snapshot")
    yield made
    await made.close()


def entries_by_content(snapshot_entries: dict[str, bytes]) -> list[bytes]:
    """Entries regardless of where the store keeps them (a name, a file)."""
    return sorted(snapshot_entries.values())


async def test_nothing_stored_loads_as_none(store: SnapshotStore) -> None:
    assert await store.load() is None


async def test_what_is_written_loads_back_with_the_type_states(store: SnapshotStore) -> None:
    await store.write(SnapshotBatch(
        upserts={CLUSTER: {"a": b"entry-a", "b": b"entry-b"}, LISTENER: {"l": b"entry-l"}},
        types={CLUSTER: TypeState(complete=True, wildcard=True),
               LISTENER: TypeState(wildcard=True)}, written_at=1000.5))
    loaded = await store.load()
    assert loaded is not None
    assert (loaded.format, loaded.written_at) == (FORMAT, 1000.5)
    assert loaded.types == {CLUSTER: TypeState(complete=True, wildcard=True),
                            LISTENER: TypeState(wildcard=True)}
    assert entries_by_content(loaded.entries[CLUSTER]) == [b"entry-a", b"entry-b"]
    assert entries_by_content(loaded.entries[LISTENER]) == [b"entry-l"]


async def test_a_write_touches_only_its_names_and_types(store: SnapshotStore) -> None:
    await store.write(SnapshotBatch(
        upserts={CLUSTER: {"a": b"a1", "b": b"b1"}, LISTENER: {"l": b"l1"}},
        types={CLUSTER: TypeState(), LISTENER: TypeState()}, written_at=1.0))
    await store.write(SnapshotBatch(upserts={CLUSTER: {"a": b"a2"}}, deletes={CLUSTER: ["b"]},
                                    types={CLUSTER: TypeState(complete=True)}, written_at=2.0))
    loaded = await store.load()
    assert loaded is not None
    assert entries_by_content(loaded.entries[CLUSTER]) == [b"a2"]
    assert entries_by_content(loaded.entries[LISTENER]) == [b"l1"]
    assert loaded.types == {CLUSTER: TypeState(complete=True), LISTENER: TypeState()}
    assert loaded.written_at == 2.0


async def test_deleting_a_name_never_written_is_harmless(store: SnapshotStore) -> None:
    await store.write(SnapshotBatch(deletes={CLUSTER: ["never"]},
                                    types={CLUSTER: TypeState()}, written_at=1.0))
    loaded = await store.load()
    assert loaded is not None and loaded.entries[CLUSTER] == {}


async def test_redis_prefixes_keep_zones_apart(redis: RedisServer) -> None:
    zone_a, zone_b = RedisStore(redis.url, "zone-a-x", 2.0), RedisStore(redis.url, "zone-b-x", 2.0)
    try:
        await zone_a.write(SnapshotBatch(upserts={CLUSTER: {"a": b"only-a"}},
                                         types={CLUSTER: TypeState()}, written_at=1.0))
        assert await zone_b.load() is None
        loaded = await zone_a.load()
        assert loaded is not None and list(loaded.entries[CLUSTER].values()) == [b"only-a"]
    finally:
        await zone_a.close()
        await zone_b.close()


async def test_an_unreachable_redis_is_a_store_error_naming_it() -> None:
    gone = RedisServer()  # a free port nobody listens on
    store = RedisStore(gone.url, "p", timeout=1.0)
    try:
        with pytest.raises(StoreError, match=f"127\\.0\\.0\\.1:{gone.port}"):
            await store.load()
        with pytest.raises(StoreError, match=f"127\\.0\\.0\\.1:{gone.port}"):
            await store.write(SnapshotBatch(types={CLUSTER: TypeState()}))
    finally:
        await store.close()


async def test_a_redis_that_never_answers_is_a_store_error_after_the_timeout() -> None:
    frozen = RedisServer().start()
    store = RedisStore(frozen.url, "p", timeout=0.3)
    try:
        frozen.freeze()
        with pytest.raises(StoreError, match=r"no answer from redis .* within 0\.3s"):
            await store.write(SnapshotBatch(types={CLUSTER: TypeState()}))
        with pytest.raises(StoreError, match=r"no answer from redis .* within 0\.3s"):
            await store.load()
    finally:
        frozen.stop()
        await store.close()


async def test_a_directory_ignores_half_written_files(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    try:
        await store.write(SnapshotBatch(upserts={CLUSTER: {"a": b"entry-a"}},
                                        types={CLUSTER: TypeState()}, written_at=1.0))
        folder = next(p for p in (tmp_path / f"v{FORMAT}").iterdir() if p.is_dir())
        (folder / ".0123.entry.77.tmp").write_bytes(b"half")  # a writer killed mid-file
        loaded = await store.load()
        assert loaded is not None and list(loaded.entries[CLUSTER].values()) == [b"entry-a"]
    finally:
        await store.close()


async def test_an_unreadable_directory_meta_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / f"v{FORMAT}").mkdir()
    (tmp_path / f"v{FORMAT}" / "meta.json").write_text("{not json")
    store = DirectoryStore(tmp_path)
    try:
        with pytest.raises(StoreError, match="meta"):
            await store.load()
    finally:
        await store.close()


async def test_a_batch_larger_than_one_round_trip_is_written_and_deleted_whole(
        store: SnapshotStore) -> None:
    count = 2 * ENTRIES_PER_WRITE + 500  # three round trips to Redis
    entries = {f"n{i}": f"entry-{i}".encode() for i in range(count)}
    await store.write(SnapshotBatch(upserts={CLUSTER: entries},
                                    types={CLUSTER: TypeState()}, written_at=1.0))
    loaded = await store.load()
    assert loaded is not None
    assert entries_by_content(loaded.entries[CLUSTER]) == sorted(entries.values())
    await store.write(SnapshotBatch(deletes={CLUSTER: list(entries)[1:]},
                                    types={CLUSTER: TypeState()}, written_at=2.0))
    loaded = await store.load()
    assert loaded is not None and list(loaded.entries[CLUSTER].values()) == [b"entry-0"]


# -- node groups: key spaces sharing the relay's connections, clearing, the registry ------


def _sharing(store: SnapshotStore, name: str) -> RedisStore | DirectoryStore:
    """A store of another key space on ``store``'s connections (or thread)."""
    if isinstance(store, RedisStore):
        return RedisStore("redis://unused", f"{store.prefix}:group:{name}", store.timeout,
                          share=store)
    assert isinstance(store, DirectoryStore)
    return DirectoryStore(store.directory / "groups" / name, share=store)


def _registry(store: SnapshotStore) -> GroupRegistry:
    if isinstance(store, RedisStore):
        return RedisGroupRegistry(store)
    assert isinstance(store, DirectoryStore)
    return DirectoryGroupRegistry(store)


async def test_a_shared_store_keeps_apart_and_clears_only_its_own(store: SnapshotStore) -> None:
    group = _sharing(store, "g-1")
    await store.write(SnapshotBatch(upserts={CLUSTER: {"a": b"relay"}},
                                    types={CLUSTER: TypeState()}, written_at=1.0))
    await group.write(SnapshotBatch(upserts={CLUSTER: {"a": b"group"}, LISTENER: {"l": b"l"}},
                                    types={CLUSTER: TypeState(), LISTENER: TypeState()},
                                    written_at=2.0))
    loaded = await group.load()
    assert loaded is not None and entries_by_content(loaded.entries[CLUSTER]) == [b"group"]
    await group.clear()
    assert await group.load() is None
    await group.close()  # leaves the connections (the thread) to the relay's store
    loaded = await store.load()
    assert loaded is not None and entries_by_content(loaded.entries[CLUSTER]) == [b"relay"]


async def test_the_group_registry_lists_puts_and_drops(store: SnapshotStore) -> None:
    registry = _registry(store)
    assert await registry.load() == {}
    await registry.put("g-1", b'{"one": 1}')
    await registry.put("g-2", b'{"two": 2}')
    await registry.put("g-1", b'{"one": 2}')
    assert await registry.load() == {"g-1": b'{"one": 2}', "g-2": b'{"two": 2}'}
    assert (await registry.get("g-1"), await registry.get("g-3")) == (b'{"one": 2}', None)
    await registry.drop("g-1")
    await registry.drop("g-3")  # never listed: harmless
    assert await registry.load() == {"g-2": b'{"two": 2}'}
    assert await registry.get("g-1") is None


@pytest.mark.parametrize("passes", range(0, 30, 2))
async def test_a_write_cancelled_midway_ends_cancelled(store: SnapshotStore, passes: int) -> None:
    """The writer's task is cancelled as the relay stops: a write must not
    swallow that (redis-py 8's client does now and then; then the relay's stop
    waited for the writer forever)."""
    for _ in range(3):
        batch = SnapshotBatch(upserts={CLUSTER: {"a": b"entry-a"}},
                              types={CLUSTER: TypeState()}, written_at=1.0)
        task = asyncio.create_task(store.write(batch))
        for _ in range(passes):
            await asyncio.sleep(0)
        if task.cancel():
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            await task


def test_a_type_state_written_before_wildcards_were_kept_reads_as_not_held() -> None:
    assert _type_state({"complete": True}) == TypeState(complete=True, wildcard=False)
    assert _type_state({"complete": False, "wildcard": True}) == TypeState(wildcard=True)
