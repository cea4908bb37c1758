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
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from google.protobuf import message

from relay.cache import ResourceCache
from relay.clock import Clock
from relay.persistence.entries import CorruptEntry
from relay.persistence.restore import Restored, restore
from relay.persistence.stores import ClearableStore, GroupRegistry, StoreError
from relay.persistence.writer import SnapshotWriter
from relay.telemetry import Metrics
from relay.upstream.scoped import OriginCache

log = logging.getLogger("relay.persistence")

#: How long a stopping relay waits for a group's last writes.
FLUSH_TIMEOUT = 2.0


@dataclass(frozen=True)
class StoredGroup:
    """A group as the registry keeps it."""

    id: str
    fields: tuple[str, ...]  # upstream.node_groups.key when it was written
    key: tuple[str, ...]
    node: base_pb2.Node  # what its origin streams ask as


def encode_group(group: StoredGroup) -> bytes:
    """The registry entry of ``group`` (JSON; the node as base64 protobuf)."""
    return json.dumps({"id": group.id, "fields": list(group.fields), "key": list(group.key),
                       "node": base64.b64encode(group.node.SerializeToString()).decode()},
                      sort_keys=True).encode()


def decode_group(entry: bytes) -> StoredGroup:
    """A registry entry read back; raises :class:`CorruptEntry`."""
    try:
        data = json.loads(entry)
        node = base_pb2.Node.FromString(base64.b64decode(data["node"], validate=True))
        fields, key = data["fields"], data["key"]
        if not isinstance(data["id"], str) or not all(
                isinstance(value, str) for value in [*fields, *key]):
            raise ValueError("id, fields and key are strings")
        return StoredGroup(data["id"], tuple(fields), tuple(key), node)
    except (ValueError, KeyError, TypeError, message.DecodeError) as error:
        raise CorruptEntry(f"not a node group entry: {error}") from None


@dataclass(frozen=True)
class GroupOrigin:
    """One origin of a group: where its snapshot lives, the cache as the origin
    writes it, and which names are its (None: all)."""

    store: ClearableStore
    cache: OriginCache
    owns: Callable[[str], bool] | None = None


class GroupSnapshot:
    """One group's snapshot: restored into its cache, written back while the
    group runs, deleted once it closed for good."""

    def __init__(self, group: StoredGroup, registry: GroupRegistry, cache: ResourceCache,
                 origins: Mapping[str, GroupOrigin], metrics: Metrics, clock: Clock) -> None:
        self.group = group
        self._registry = registry
        self._cache = cache
        self._origins = dict(origins)
        self._metrics = metrics
        self._clock = clock
        self.writers = {origin: SnapshotWriter(cache, part.store, metrics, clock, owns=part.owns)
                        for origin, part in self._origins.items()}
        self.restored: dict[str, Restored] = {}
        self._forgotten = False

    async def restore(self, timeout: float, wall_now: float) -> None:
        """Load each origin's snapshot into the cache (``timeout`` each at most)."""
        for origin, part in self._origins.items():
            where = part.store.description
            try:
                stored = await asyncio.wait_for(part.store.load(), timeout)
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

    async def run(self) -> None:
        """Keep the snapshot in step with the cache (the group has clients):
        the registry says the group exists, the writers write what changes."""
        for writer in self.writers.values():
            self._cache.add_listener(writer.on_cache_change)
        try:
            await self._registry.put(self.group.id, encode_group(self.group))
        except StoreError as error:
            # its resources are still written: a later write of the entry
            # (the group's next run) makes them restorable
            log.warning("node group %s not listed in %s: %s", self.group.id,
                        self._registry.description, error)
        async with asyncio.TaskGroup() as tasks:
            for origin, writer in self.writers.items():
                tasks.create_task(writer.run(), name=f"snapshot-{self.group.id}-{origin}")

    async def flush(self) -> None:
        """Write what is left (the relay stops), :data:`FLUSH_TIMEOUT` at most;
        nothing once forgotten."""
        if self._forgotten:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(
                *(writer.write_pending() for writer in self.writers.values())), FLUSH_TIMEOUT)

    async def forget(self) -> None:
        """Delete the group's snapshot and its registry entry (it closed for good)."""
        self._forgotten = True
        try:
            for part in self._origins.values():
                await part.store.clear()
            await self._registry.drop(self.group.id)
        except StoreError as error:
            log.warning("node group %s: snapshot not deleted: %s", self.group.id, error)

    async def close(self) -> None:
        """Release the stores (shared connections stay with the relay's)."""
        for part in self._origins.values():
            await part.store.close()
