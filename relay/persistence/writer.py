"""Keeping the stored snapshot in step with the cache, off the serving path.

:class:`SnapshotWriter` listens to the cache: a change (one per origin
response the relay ACKed; a NACKed one never reaches the cache) only notes
which names changed. Its own task then writes their state *as it is when
written*: a name changed twice before a write is written once, with its
latest content, and a name the origin removed is deleted from the store.
Whatever piled up while a write was in flight goes in the next one, so a
burst of responses costs one round trip per write, not per response.

When the store fails (Redis down, slow or refusing), the names stay noted
and the write is retried after a backoff; serving never waits for it. The
first failure of an outage is logged, then nothing more until a write
succeeds again, which is logged too; every attempt is counted in
``xds_relay_snapshot_writes`` by outcome.

Never written: a do-not-cache resource; names the relay merely stopped
caching because no client wants them (the cache drops those without telling
its listeners), so a snapshot keeps the zone's last-known-good config.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from relay.cache import CacheChange, Forgotten, ResourceCache
from relay.clock import Clock, MonotonicClock
from relay.persistence.entries import encode_entry
from relay.persistence.stores import SnapshotBatch, SnapshotStore, StoreError, TypeState
from relay.telemetry import Metrics
from relay.upstream.backoff import Backoff

log = logging.getLogger("relay.persistence")

#: Names encoded between two turns of the event loop while a batch is built.
NAMES_PER_STEP = 1_000


class SnapshotWriter:
    """Writes what changed in ``cache`` to ``store``, for as long as :meth:`run` runs.

    ``clock`` times the retries (and converts TTL deadlines, which are on
    it); ``wall`` is the time written into the snapshot (a TTL's expiry is
    stored on the wall clock, so that it means the same after a restart).
    """

    def __init__(self, cache: ResourceCache, store: SnapshotStore, metrics: Metrics,
                 clock: Clock | None = None, wall: Callable[[], float] = time.time,
                 retry: Backoff | None = None,
                 owns: Callable[[str], bool] | None = None) -> None:
        self.cache = cache
        # the names this store keeps (None: all); with several origins, each
        # origin's snapshot holds its own names (see relay.upstream.origins)
        self.owns = owns
        self.store = store
        self.metrics = metrics
        self.clock: Clock = clock or MonotonicClock()
        self.wall = wall
        self.retry = retry or Backoff(0.5, 10.0)
        # per type URL: names whose state is not written yet; those a write
        # under way took (noted again if it does not happen)
        self._pending: dict[str, set[str]] = {}
        self._writing: dict[str, set[str]] = {}
        # a batch built but not written, a stop having cut its write short:
        # the write on the way out makes it first (its names may be forgotten
        # by the cache since, and rebuilt would be lost)
        self._unwritten: SnapshotBatch | None = None
        self._wake = asyncio.Event()
        self._failures = 0  # consecutive failed writes (0: the store is fine)
        self.written = asyncio.Event()  # set after each successful write (tests wait on it)

    def pending(self) -> int:
        """How many names wait to be written."""
        unwritten = 0 if self._unwritten is None else self._unwritten.names()
        return sum(map(len, list(self._pending.values()))) + unwritten

    def on_cache_change(self, change: CacheChange) -> None:
        """A cache listener: note what changed (heartbeats move a TTL's expiry)."""
        changed: Iterable[str] = change.names
        beats: Iterable[str] = change.heartbeats
        owns = self.owns
        if owns is not None:
            changed, beats = [n for n in changed if owns(n)], [n for n in beats if owns(n)]
            if not changed and not beats:
                return
        names = self._pending.setdefault(change.type_url, set())
        names.update(changed)
        names.update(beats)
        self._wake.set()

    def on_forget(self, forgotten: Forgotten) -> None:
        """A cache forget listener: names nobody subscribes to any more keep the
        state last written (a restart serves them until the origin says
        otherwise). A change of theirs not written yet is not written: the cache
        holds nothing of them now, which would be written as their deletion.
        (A name the origin removed held nothing: its deletion is written.)"""
        for noted in (self._pending.get(forgotten.type_url),
                      self._writing.get(forgotten.type_url)):
            if noted:
                noted.difference_update(forgotten.held)

    async def run(self) -> None:
        """Write whatever changed, retrying after failures; until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self.write_pending():
                await self.clock.sleep(self.retry.next_delay())
                self._wake.set()

    async def write_pending(self) -> bool:
        """One write of every noted name; whether it succeeded (on failure the
        names stay noted, to be rebuilt from the cache on the next try)."""
        if not self._pending and self._unwritten is None:
            return True
        pending, self._pending = self._pending, {}
        self._writing = pending  # what on_forget trims meanwhile
        batch: SnapshotBatch | None = None
        try:
            batch = await self._batch(pending)
            if self._unwritten is not None:
                batch = self._unwritten.then(batch)
            started = time.perf_counter()  # the write alone (building it yields the loop)
            await self.store.write(batch)
        except asyncio.CancelledError:
            # Stopped mid-write (the relay stopping): the last write on the way
            # out still makes it.
            self._keep(pending, batch)
            raise
        except StoreError as error:
            # (names, not the batch: a long outage would hold every entry)
            self._note(pending)
            self.metrics.snapshot_writes.add(1, {"outcome": "failed"})
            self._failures += 1
            if self._failures == 1:
                log.warning("snapshot not saved: %s; retrying with backoff, keeping the "
                            "latest state of %d names (logged again once it works)", error,
                            self.pending())
            return False
        finally:
            if self._writing is pending:
                self._writing = {}
        self._unwritten = None
        self.metrics.snapshot_writes.add(1, {"outcome": "ok"})
        self.metrics.snapshot_write_seconds.record(time.perf_counter() - started)
        if self._failures:
            log.info("snapshot saved to %s again after %d failed writes; caught up (%d names)",
                     self.store.description, self._failures, batch.names())
            self._failures = 0
            self.retry.reset()
        self.written.set()
        return True

    def _keep(self, pending: Mapping[str, set[str]], batch: SnapshotBatch | None) -> None:
        """A stop cut the write of ``pending`` short: keep its batch for the
        last write (None: cut short while built; its names are noted again)."""
        if batch is not None:
            self._unwritten = batch
        else:
            self._note(pending)

    def _note(self, pending: Mapping[str, set[str]]) -> None:
        """Note ``pending`` again (a write of them did not happen)."""
        for type_url, names in pending.items():
            self._pending.setdefault(type_url, set()).update(names)

    async def _batch(self, pending: Mapping[str, set[str]]) -> SnapshotBatch:
        """The entries of ``pending`` names as the cache holds them now."""
        batch = SnapshotBatch(written_at=self.wall())
        offset = batch.written_at - self.clock.now()  # clock time -> wall time
        step = 0
        for type_url, names in pending.items():
            if not self.cache.is_synced(type_url):
                continue
            batch.types[type_url] = TypeState(
                complete=self.owns is None and self.cache.is_complete(type_url),
                wildcard=self.cache.holds_wildcard(type_url))
            upserts = batch.upserts.setdefault(type_url, {})
            deletes = batch.deletes.setdefault(type_url, [])
            for name in list(names):  # (forgotten ones leave the set meanwhile)
                step += 1
                if step % NAMES_PER_STEP == 0:
                    await asyncio.sleep(0)
                if name not in names:
                    continue
                found = self.cache.variants(type_url, name)
                # By name, not through an alias: each name's own variants.
                kept = [] if not isinstance(found, Mapping) else [
                    (resource, self._expires_at(type_url, resource.name, key, offset))
                    for key, resource in found.items()
                    if resource.name == name and not resource.do_not_cache]
                if kept:
                    upserts[name] = encode_entry(name, kept)
                else:
                    deletes.append(name)
        return batch

    def _expires_at(self, type_url: str, name: str, key: str, offset: float) -> float | None:
        deadline = self.cache.expiry(type_url, name, key)
        return None if deadline is None else deadline + offset
