"""Node groups' snapshots: each group's resources under a key space of its own.

With ``upstream.node_groups`` every group is served from a cache of its own
(see :mod:`relay.node_groups`), so each group persists its own snapshot, per
origin, beside the relay's: in Redis under ``<prefix>:group:<group id>``
(an authority's adds ``:authority:NAME``), in a directory under
``groups/<group id>/``. The group id is a hash of the key's values, as in the
group's origin label, so that no node's values end up in a key name.

A :class:`~relay.persistence.stores.GroupRegistry` lists the groups that have
a snapshot, each with its key and the node its origin streams carry (the
``copy`` fields came from its first client, who may not come back): a warm
start restores each group from it, and the group's origin stream asks as
the same node once a client joins.

Bounded: a group is written only once a client joined it; a group closed for
being idle (``linger`` after its last client left, or to make room under
``max_groups``) has its snapshot deleted, and so does a restored group that
no client joins within ``linger``. A relay that stops keeps them all.

Replicas of a zone share one snapshot (one key prefix), so one replica's
idle group may be another's busy one. While a group has clients its entry
is *seen*: its ``seen_at`` (wall time) is written again every
:func:`seen_every` (a third of ``linger``). A group is deleted only when its
entry was not seen for two of those: no replica served it since this one's
last client left (``linger`` ago), so none serves it now.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from envoy.config.core.v3 import base_pb2
from google.protobuf import message

from relay.cache import ResourceCache
from relay.clock import Clock, within
from relay.persistence.entries import CorruptEntry
from relay.persistence.restore import Restored, restore
from relay.persistence.stores import ClearableStore, GroupRegistry, StoreError
from relay.persistence.writer import SnapshotWriter
from relay.telemetry import Metrics
from relay.upstream.scoped import OriginCache

log = logging.getLogger("relay.persistence")

#: How long a stopping relay waits for a group's last writes.
FLUSH_TIMEOUT = 2.0
#: The shortest time between two writes of a group's ``seen_at``, in seconds.
MIN_SEEN_EVERY = 1.0


def seen_every(linger: float) -> float:
    """How often a group with clients says so (``seen_at``): a third of
    ``linger``, so that a replica whose last client left ``linger`` ago
    last said so two periods before another replica's group could be
    thought gone (see :meth:`GroupSnapshot.forget`)."""
    return max(linger / 3, MIN_SEEN_EVERY)


@dataclass(frozen=True)
class StoredGroup:
    """A group as the registry keeps it."""

    id: str
    fields: tuple[str, ...]  # upstream.node_groups.key when it was written
    key: tuple[str, ...]
    node: base_pb2.Node  # what its origin streams ask as
    # when (wall clock) a relay last served it clients (None: not yet written)
    seen_at: float | None = None


def encode_group(group: StoredGroup) -> bytes:
    """The registry entry of ``group`` (JSON; the node as base64 protobuf)."""
    return json.dumps({"id": group.id, "fields": list(group.fields), "key": list(group.key),
                       "node": base64.b64encode(group.node.SerializeToString()).decode(),
                       "seen_at": group.seen_at}, sort_keys=True).encode()


def decode_group(entry: bytes) -> StoredGroup:
    """A registry entry read back; raises :class:`CorruptEntry`."""
    try:
        data = json.loads(entry)
        node = base_pb2.Node.FromString(base64.b64decode(data["node"], validate=True))
        fields, key, seen_at = data["fields"], data["key"], data.get("seen_at")
        if not isinstance(data["id"], str) or not all(
                isinstance(value, str) for value in [*fields, *key]):
            raise ValueError("id, fields and key are strings")
        if seen_at is not None and not isinstance(seen_at, int | float):
            raise ValueError("seen_at is a number")
        return StoredGroup(data["id"], tuple(fields), tuple(key), node,
                           None if seen_at is None else float(seen_at))
    except (ValueError, KeyError, TypeError, message.DecodeError) as error:
        raise CorruptEntry(f"not a node group entry: {error}") from None


@dataclass(frozen=True)
class GroupOrigin:
    """One origin of a group: where its snapshot lives, the cache as the origin
    writes it, and which names are its (None: all)."""

    store: ClearableStore
    cache: OriginCache
    owns: Callable[[str], bool] | None = None


async def forget_group(registry: GroupRegistry, gid: str,
                       stores: Mapping[str, ClearableStore], linger: float, wall_now: float,
                       why: str) -> bool:
    """Delete the snapshot of group ``gid`` (its ``stores``) and its entry, unless
    a relay served it clients lately (``why`` says why this one would delete it,
    for the log). Whether it did. Raises :class:`StoreError`."""
    entry = await registry.get(gid)
    if entry is not None:
        with contextlib.suppress(CorruptEntry):
            seen_at = decode_group(entry).seen_at
            if seen_at is not None and seen_at > wall_now - 2 * seen_every(linger):
                log.info("node group %s kept in the snapshot although %s: a relay sharing "
                         "it served it clients %.0fs ago", gid, why, max(0.0, wall_now - seen_at))
                return False
    for store in stores.values():
        await store.clear()
    await registry.drop(gid)
    log.info("node group %s deleted from the snapshot: %s", gid, why)
    return True


class GroupSnapshot:
    """One group's snapshot: restored into its cache, written back while the
    group runs, deleted once it closed for good (see :func:`forget_group`).

    ``wall`` is the wall clock as the relay's ``clock`` runs (``seen_at`` is
    compared across replicas, and with the group's ``linger``, on the relay's
    clock); ``linger`` is ``node_groups.linger``.
    """

    def __init__(self, group: StoredGroup, registry: GroupRegistry, cache: ResourceCache,
                 origins: Mapping[str, GroupOrigin], metrics: Metrics, clock: Clock,
                 linger: float, wall: Callable[[], float] = time.time) -> None:
        self.group = group
        self.linger = linger
        self._wall = wall
        self._registry = registry
        self._cache = cache
        self._origins = dict(origins)
        self._metrics = metrics
        self._clock = clock
        self.writers = {origin: SnapshotWriter(cache, part.store, metrics, clock, owns=part.owns)
                        for origin, part in self._origins.items()}
        self.restored: dict[str, Restored] = {}
        self._forgotten = False
        # whether the registry listed the group once (a warm start finds it)
        self._listed = False

    async def restore(self, timeout: float, wall_now: float) -> None:
        """Load each origin's snapshot into the cache (``timeout`` each at most)."""
        for origin, part in self._origins.items():
            where = part.store.description
            try:
                stored = await within(part.store.load(), timeout)
            except TimeoutError:
                log.warning("node group %s: snapshot not loaded: no answer from %s within "
                            "%gs (persistence.load_timeout)", self.group.id, where, timeout)
                continue
            except StoreError as error:
                log.warning("node group %s: snapshot not loaded: %s", self.group.id, error)
                continue
            if stored is None:
                continue

            def skipped(reason: str, count: int) -> None:
                self._metrics.snapshot_skipped.add(count, {"reason": reason})

            done = self.restored[origin] = restore(part.cache, stored, where,
                                                   self._clock.now(), wall_now, skipped)
            self._metrics.snapshot_restored.add(done.resources)

    def restored_types(self) -> int:
        """Types restored, all origins together (0: nothing to serve from it)."""
        return sum(done.types for done in self.restored.values())

    async def run(self, clients: Callable[[], int]) -> None:
        """Keep the snapshot in step with the cache, from when the group's first
        client joined: the writers write what changes; while ``clients()``, the
        registry lists the group as seen now (every :func:`seen_every`)."""
        for writer in self.writers.values():
            self._cache.add_listener(writer.on_cache_change)
            self._cache.add_forget_listener(writer.on_forget)
        async with asyncio.TaskGroup() as tasks:
            for origin, writer in self.writers.items():
                tasks.create_task(writer.run(), name=f"snapshot-{self.group.id}-{origin}")
            tasks.create_task(self._say_seen(clients), name=f"snapshot-{self.group.id}-seen")

    async def _say_seen(self, clients: Callable[[], int]) -> None:
        failing = False
        while True:
            if clients():
                try:
                    await self._list()
                    failing = False
                except StoreError as error:
                    # its resources are still written; the next turn lists it
                    if not failing:
                        log.warning("node group %s not listed in %s: %s", self.group.id,
                                    self._registry.description, error)
                    failing = True
            await self._clock.sleep(seen_every(self.linger))

    async def _list(self) -> None:
        """List the group in the registry as seen now."""
        await self._registry.put(self.group.id, encode_group(
            replace(self.group, seen_at=self._wall())))
        self._listed = True

    async def flush(self) -> None:
        """Write what is left (the relay stops), :data:`FLUSH_TIMEOUT` at most;
        nothing once forgotten. A group the registry never listed (the relay
        stops within a turn of its first client) is listed now: what its writers
        wrote is found by a warm start only through the registry."""
        if self._forgotten:
            return
        writes = [writer.write_pending() for writer in self.writers.values()]
        if not self._listed:
            writes.append(self._list_once_more())
        with contextlib.suppress(TimeoutError):
            await within(asyncio.gather(*writes), FLUSH_TIMEOUT)

    async def _list_once_more(self) -> bool:
        """List the group; whether that succeeded (as a writer's write says)."""
        try:
            await self._list()
        except StoreError as error:
            log.warning("node group %s not listed in %s: %s", self.group.id,
                        self._registry.description, error)
            return False
        return True

    async def forget(self) -> None:
        """The group closed for good here: its snapshot and registry entry go,
        unless another relay sharing them served it lately (see
        :func:`forget_group`)."""
        self._forgotten = True
        try:
            await forget_group(self._registry, self.group.id,
                               {name: part.store for name, part in self._origins.items()},
                               self.linger, self._wall(), "it closed, idle")
        except StoreError as error:
            log.warning("node group %s: snapshot not deleted: %s", self.group.id, error)

    async def close(self) -> None:
        """Release the stores (shared connections stay with the relay's)."""
        for part in self._origins.values():
            await part.store.close()
