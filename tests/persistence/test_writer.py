"""The writer keeps a real Redis in step with the cache, and a restore brings
it back: exactly what the origin said, never what it did not."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from relay.cache import ABSENT, UNKNOWN, ResourceCache, Update
from relay.persistence.entries import FORMAT, encode_entry
from relay.persistence.restore import restore
from relay.persistence.stores import RedisStore, SnapshotBatch, StoredSnapshot, TypeState
from relay.persistence.writer import SnapshotWriter
from relay.telemetry import new_metrics, prometheus_provider
from relay.upstream.backoff import Backoff
from relay.xds_types import CLUSTER
from tests.clock import ManualClock
from tests.persistence.test_entries import origin_resource
from tests.redis_server import RedisServer

WALL = 1_000_000.0  # the wall clock at the clock's 0


@dataclass
class Rig:
    cache: ResourceCache
    clock: ManualClock
    store: RedisStore
    writer: SnapshotWriter
    registry: CollectorRegistry

    def writes(self, outcome: str) -> float:
        return writes(self.registry, outcome)


    async def restored(self) -> tuple[ResourceCache, StoredSnapshot]:
        """A fresh cache holding what the store holds (as a restart would)."""
        loaded = await self.store.load()
        assert loaded is not None
        fresh = ResourceCache(self.clock.now)
        restore(fresh, loaded, "test", self.clock.now(), WALL + self.clock.now())
        return fresh, loaded


def writes(registry: CollectorRegistry, outcome: str) -> float:
    """``xds_relay_snapshot_writes_total`` of ``outcome``."""
    return registry.get_sample_value("xds_relay_snapshot_writes_total",
                                     {"outcome": outcome}) or 0.0


@pytest.fixture
async def rig(redis: RedisServer, prefix: str) -> AsyncIterator[Rig]:
    clock = ManualClock(0.0)
    cache = ResourceCache(clock.now)
    store = RedisStore(redis.url, prefix, timeout=1.0)
    provider, registry = prometheus_provider()
    writer = SnapshotWriter(cache, store, new_metrics(provider, registry), clock,
                            wall=lambda: WALL + clock.now(), retry=Backoff(0.01, 0.02))
    cache.add_listener(writer.on_cache_change)
    cache.add_forget_listener(writer.on_forget)
    yield Rig(cache, clock, store, writer, registry)
    await store.close()


def variants_of(cache: ResourceCache, name: str) -> dict[str, bytes]:
    found = cache.variants(CLUSTER, name)
    assert not isinstance(found, type(ABSENT)), f"{name}: {found}"
    return {key: r.digest for key, r in found.items()}


async def test_what_the_cache_holds_is_what_a_restore_brings_back(rig: Rig) -> None:
    prod, canary = origin_resource("a", env="prod"), origin_resource("a", env="canary")
    plain = origin_resource("b", version="")  # istiod: no version
    rig.cache.apply(CLUSTER, Update([prod, canary, plain], complete=True))
    assert await rig.writer.write_pending()
    fresh, _ = await rig.restored()
    assert variants_of(fresh, "a") == variants_of(rig.cache, "a")
    assert variants_of(fresh, "b") == variants_of(rig.cache, "b")
    assert fresh.is_synced(CLUSTER) and fresh.is_complete(CLUSTER)
    assert fresh.variants(CLUSTER, "never-sent") is ABSENT  # complete: the origin said so


async def test_removals_are_persisted(rig: Rig) -> None:
    rig.cache.apply(CLUSTER, Update([origin_resource("a"), origin_resource("b")]))
    await rig.writer.write_pending()
    rig.cache.apply(CLUSTER, Update(removed=["a"]))
    await rig.writer.write_pending()
    fresh, loaded = await rig.restored()
    assert list(loaded.entries[CLUSTER]) == ["b"]
    assert fresh.variants(CLUSTER, "a") is UNKNOWN


async def test_a_name_changed_twice_before_a_write_is_written_once_with_its_latest(
        rig: Rig) -> None:
    rig.cache.apply(CLUSTER, Update([origin_resource("a", "v1")]))
    rig.cache.apply(CLUSTER, Update([origin_resource("a", "v2")]))
    assert await rig.writer.write_pending()
    assert rig.writes("ok") == 1
    fresh, _ = await rig.restored()
    found = fresh.variants(CLUSTER, "a")
    assert not isinstance(found, type(ABSENT)) and found[""].version == "v2"


async def test_do_not_cache_resources_are_never_stored(rig: Rig) -> None:
    fresh_only = origin_resource("secret")
    fresh_only.resource.cache_control.do_not_cache = True
    rig.cache.apply(CLUSTER, Update([fresh_only, origin_resource("kept")]))
    await rig.writer.write_pending()
    _, loaded = await rig.restored()
    assert list(loaded.entries[CLUSTER]) == ["kept"]


async def test_an_alias_is_stored_once_under_its_resource(rig: Rig) -> None:
    rig.cache.apply(CLUSTER, Update([origin_resource("vhost", aliases=("alias-1",))]))
    await rig.writer.write_pending()
    fresh, loaded = await rig.restored()
    assert list(loaded.entries[CLUSTER]) == ["vhost"]
    assert fresh.aliases_of(CLUSTER, "vhost") == {"alias-1"}


async def test_a_ttl_lapses_at_the_same_wall_clock_moment_after_a_restore(rig: Rig) -> None:
    rig.cache.apply(CLUSTER, Update([origin_resource("a", ttl=30)]))
    await rig.clock.advance(10)  # a heartbeat at 10 s moves the lapse to 40 s
    rig.cache.apply(CLUSTER, Update(heartbeats=[("a", "", "v1")]))
    await rig.writer.write_pending()
    await rig.clock.advance(25)  # a restart at 35 s: 5 s left
    fresh, _ = await rig.restored()
    assert fresh.expiry(CLUSTER, "a", "") == pytest.approx(40)
    await rig.clock.advance(10)  # restarted at 45 s: lapsed while the relay was down
    fresh, _ = await rig.restored()
    assert fresh.variants(CLUSTER, "a") is UNKNOWN


async def test_a_corrupt_entry_is_skipped_with_a_line_naming_it(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    rig.cache.apply(CLUSTER, Update([origin_resource("good")]))
    await rig.writer.write_pending()
    await rig.store.write(SnapshotBatch(upserts={CLUSTER: {"bad": b"xr\x01garbage"}},
                                        types={CLUSTER: TypeState()}, written_at=WALL))
    caplog.set_level(logging.WARNING, "relay.persistence")
    fresh, _ = await rig.restored()
    assert variants_of(fresh, "good")
    assert fresh.variants(CLUSTER, "bad") is UNKNOWN
    assert [r.getMessage() for r in caplog.records if "bad" in r.getMessage()] == [
        "snapshot entry bad of Cluster at test skipped: truncated"]


def test_a_snapshot_of_another_format_is_ignored_whole(
        caplog: pytest.LogCaptureFixture) -> None:
    cache = ResourceCache()
    entry = encode_entry("a", [(origin_resource("a"), None)])
    other = StoredSnapshot(FORMAT + 1, WALL, {CLUSTER: TypeState()}, {CLUSTER: {"a": entry}})
    skipped: list[tuple[str, int]] = []
    done = restore(cache, other, "redis x", 0.0, WALL, lambda r, n: skipped.append((r, n)))
    assert (done.types, done.resources, skipped) == (0, 0, [("format", 1)])
    assert not cache.is_synced(CLUSTER)
    assert f"has format {FORMAT + 1}, this relay reads format {FORMAT}: ignored" in caplog.text


async def test_a_failing_store_is_retried_logged_once_and_caught_up(
        caplog: pytest.LogCaptureFixture, prefix: str) -> None:
    server = RedisServer().start()
    clock = ManualClock(0.0)
    cache = ResourceCache(clock.now)
    store = RedisStore(server.url, prefix, timeout=0.5)
    provider, registry = prometheus_provider()
    writer = SnapshotWriter(cache, store, new_metrics(provider, registry), clock,
                            retry=Backoff(0.01, 0.02))
    cache.add_listener(writer.on_cache_change)
    caplog.set_level(logging.INFO, "relay.persistence")
    try:
        cache.apply(CLUSTER, Update([origin_resource("a", "v1")]))
        assert await writer.write_pending()
        server.kill()
        for version in ("v2", "v3", "v4"):  # three responses while Redis is away
            cache.apply(CLUSTER, Update([origin_resource("a", version)]))
            assert not await writer.write_pending()
        assert writer.pending() == 1  # the name, once: its latest state is what gets written
        assert writes(registry, "failed") == 3
        assert sum("snapshot not saved" in r.getMessage() for r in caplog.records) == 1
        server.start()
        assert await writer.write_pending()
        assert sum("snapshot saved to" in r.getMessage() for r in caplog.records) == 1
        loaded = await store.load()
        assert loaded is not None
        fresh = ResourceCache()
        restore(fresh, loaded, "test", 0.0, 0.0)
        found = fresh.variants(CLUSTER, "a")
        assert not isinstance(found, type(ABSENT)) and found[""].version == "v4"
    finally:
        server.stop()
        await store.close()


async def test_the_run_loop_writes_after_changes_and_retries_on_its_own(rig: Rig) -> None:
    import asyncio

    task = asyncio.create_task(rig.writer.run())
    try:
        rig.cache.apply(CLUSTER, Update([origin_resource("a")]))
        await asyncio.wait_for(rig.writer.written.wait(), 5)
        assert rig.writer.pending() == 0
        # in seconds: a local write falls under 0.5 s (the SDK's default
        # buckets, meant for milliseconds, have no such bound)
        assert rig.registry.get_sample_value("xds_relay_snapshot_write_seconds_bucket",
                                             {"le": "0.5"}) == 1
    finally:
        task.cancel()



class HeldStore:
    """A store whose write waits until cancelled (a stop comes mid-write)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def write(self, batch: SnapshotBatch) -> None:
        self.entered.set()
        await asyncio.Event().wait()


async def test_a_write_cut_short_by_a_stop_is_made_by_the_last_write(rig: Rig) -> None:
    held = HeldStore()
    rig.writer.store = held  # type: ignore[assignment]
    task = asyncio.create_task(rig.writer.run())
    rig.cache.apply(CLUSTER, Update([origin_resource("a", "v1")]))
    await asyncio.wait_for(held.entered.wait(), 5)
    task.cancel()  # what Relay.stop does to the writer's task
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rig.writer.pending() == 1

    rig.writer.store = rig.store
    assert await rig.writer.write_pending()  # the write on the way out
    fresh, _ = await rig.restored()
    assert list(variants_of(fresh, "a")) == [""]


async def test_a_name_forgotten_before_its_write_keeps_the_state_last_written(rig: Rig) -> None:
    """Nobody subscribes to "a" any more and the cache forgets it: the snapshot
    keeps it as last written (a restart serves it until the origin says
    otherwise), never a deletion of it; a removal by the origin is one."""
    rig.cache.apply(CLUSTER, Update([origin_resource("a", "v1"), origin_resource("b", "v1")]))
    assert await rig.writer.write_pending()
    rig.cache.apply(CLUSTER, Update([origin_resource("a", "v2")], removed=["b"]))
    rig.cache.forget(CLUSTER, ["a", "b"])
    assert rig.writer.pending() == 1  # "b": removed, then forgotten
    assert await rig.writer.write_pending()
    fresh, loaded = await rig.restored()
    assert list(loaded.entries[CLUSTER]) == ["a"]
    found = fresh.variants(CLUSTER, "a")
    assert not isinstance(found, type(ABSENT)) and found[""].version == "v1"


async def test_a_write_cut_short_then_forgotten_is_not_written_as_a_deletion(rig: Rig) -> None:
    """The relay stops: its clients leave (the cache forgets their names) while
    the writer's write is cancelled; the write on the way out must not delete
    what the cancelled one was writing (a warm restart then served nothing)."""
    rig.cache.apply(CLUSTER, Update([origin_resource("a", "v1")]))
    assert await rig.writer.write_pending()

    held = HeldStore()
    rig.writer.store = held  # type: ignore[assignment]
    task = asyncio.create_task(rig.writer.run())
    rig.cache.apply(CLUSTER, Update([origin_resource("a", "v2")]))
    await asyncio.wait_for(held.entered.wait(), 5)
    rig.cache.forget(CLUSTER, ["a"])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rig.writer.pending() == 1  # the batch that was cut short, kept
    rig.writer.store = rig.store
    assert await rig.writer.write_pending()
    assert rig.writer.pending() == 0
    fresh, _ = await rig.restored()
    found = fresh.variants(CLUSTER, "a")
    assert not isinstance(found, type(ABSENT)) and found[""].version == "v2"


def test_a_batch_kept_then_a_later_one_write_as_one_with_the_later_winning() -> None:
    kept = SnapshotBatch(upserts={CLUSTER: {"a": b"a1", "b": b"b1", "c": b"c1"}},
                         deletes={CLUSTER: ["d", "e"]},
                         types={CLUSTER: TypeState()}, written_at=1.0)
    later = SnapshotBatch(upserts={CLUSTER: {"a": b"a2", "d": b"d2"}},
                          deletes={CLUSTER: ["b"]},
                          types={CLUSTER: TypeState(complete=True)}, written_at=2.0)
    merged = kept.then(later)
    assert merged.upserts == {CLUSTER: {"a": b"a2", "c": b"c1", "d": b"d2"}}
    assert sorted(merged.deletes[CLUSTER]) == ["b", "e"]
    assert merged.types == {CLUSTER: TypeState(complete=True)}
    assert merged.written_at == 2.0
