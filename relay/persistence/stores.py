"""Where a snapshot lives: Redis (through aiocache) or a local directory.

Both stores hold the same things behind the same small interface
(:class:`SnapshotStore`): per type URL, whether the cache held every
resource of it (``complete``), and one entry per name (see
:mod:`relay.persistence.entries`); plus the format and when it was written.
They know nothing of what an entry means: :mod:`relay.persistence.restore`
reads them, :mod:`relay.persistence.writer` writes them.

A write changes only the names it carries, so its cost follows what changed,
not the size of the snapshot. Keys carry the format version, so that relays
of two formats sharing one Redis during a rollout never read each other's.

Redis layout under ``<prefix>:v<FORMAT>:``::

    meta              hash: format, written_at, "type:<type URL>" -> {"complete": ...}
    type:<type URL>   hash: resource name -> entry

Directory layout under ``<directory>/v<FORMAT>/``::

    meta.json                         {"format", "written_at", "types": {type URL: {...}}}
    <quoted type URL>/<hash>.entry    one file per name (the entry holds the name)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from relay.clock import within
from relay.errors import RelayError
from relay.persistence.entries import FORMAT

#: Entries a Redis store reads per round trip when it loads a snapshot.
ENTRIES_PER_READ = 2_000
#: Names a Redis store writes (or deletes) per round trip.
ENTRIES_PER_WRITE = 2_000


class StoreError(RelayError):
    """The store cannot be reached or refused the operation; the message says why."""


@dataclass(frozen=True)
class TypeState:
    """What a snapshot says of one type besides its entries."""

    # the cache held every resource of the type (a wildcard subscription)
    complete: bool = False
    # the cache held the type's wildcard set (see ResourceCache.holds_wildcard;
    # with several origins a type is never complete, but this may be so)
    wildcard: bool = False


@dataclass
class StoredSnapshot:
    """A snapshot as read from a store, entries still encoded."""

    format: int
    written_at: float | None
    types: dict[str, TypeState]
    # per type URL: where each entry was found (for log lines) -> the entry
    entries: dict[str, dict[str, bytes]] = field(default_factory=dict)


@dataclass
class SnapshotBatch:
    """One write: entries to set and names to drop, per type URL, and the
    state of the types they belong to."""

    upserts: dict[str, dict[str, bytes]] = field(default_factory=dict)
    deletes: dict[str, list[str]] = field(default_factory=dict)
    types: dict[str, TypeState] = field(default_factory=dict)
    written_at: float = 0.0

    def names(self) -> int:
        """How many names the batch writes or drops."""
        return sum(map(len, self.upserts.values())) + sum(map(len, self.deletes.values()))

    def then(self, later: SnapshotBatch) -> SnapshotBatch:
        """One batch that writes this one and then ``later`` (whose entries,
        drops and type states win)."""
        merged = SnapshotBatch(types={**self.types, **later.types},
                               written_at=later.written_at)
        for type_url in {*self.upserts, *self.deletes, *later.upserts, *later.deletes}:
            newer, dropped = later.upserts.get(type_url, {}), later.deletes.get(type_url, [])
            gone = set(dropped)
            upserts = {name: entry for name, entry in self.upserts.get(type_url, {}).items()
                       if name not in gone}
            upserts.update(newer)
            merged.upserts[type_url] = upserts
            merged.deletes[type_url] = [
                *(name for name in self.deletes.get(type_url, ())
                  if name not in newer and name not in gone), *dropped]
        return merged


class SnapshotStore(Protocol):
    """What the relay needs of a place to keep its snapshot."""

    #: Where the snapshot is, for log lines and ``/ready``.
    description: str

    async def load(self) -> StoredSnapshot | None:
        """The stored snapshot (None: nothing stored); raises :class:`StoreError`."""

    async def write(self, batch: SnapshotBatch) -> None:
        """Apply ``batch`` (all of it or, on error, possibly part); raises :class:`StoreError`."""

    async def close(self) -> None:
        """Release connections and threads."""


class ClearableStore(SnapshotStore, Protocol):
    """A store whose whole snapshot can be deleted: a node group's, once the
    group closed for good (see :mod:`relay.persistence.groups`)."""

    async def clear(self) -> None:
        """Delete everything the store holds; raises :class:`StoreError`."""


def _meta_fields(batch: SnapshotBatch) -> dict[str, str]:
    return {"format": str(FORMAT), "written_at": repr(batch.written_at),
            **{f"type:{type_url}": json.dumps(_type_fields(state))
               for type_url, state in batch.types.items()}}


def _type_fields(state: TypeState) -> dict[str, bool]:
    return {"complete": state.complete, "wildcard": state.wildcard}


def _type_state(data: object) -> TypeState:
    if not isinstance(data, dict):
        raise ValueError("not an object")
    # (a snapshot written before "wildcard" was kept: False, and a complete
    # type is held whole all the same)
    return TypeState(complete=data.get("complete") is True, wildcard=data.get("wildcard") is True)


class RedisStore:
    """A snapshot in Redis, through aiocache's Redis backend.

    aiocache gives the connection pool, the key namespace (the prefix) and a
    timeout on every operation. A write is one ``MULTI``/``EXEC`` pipeline of
    hash commands on aiocache's redis-py client (aiocache's key-value API has
    neither hashes nor transactions): one round trip, applied whole.
    """

    def __init__(self, url: str, prefix: str, timeout: float,
                 password: str | None = None, *, share: RedisStore | None = None) -> None:
        """``share``: another store (of the same relay) whose connection pool this
        one uses, under a key space of its own: a node group's store shares the
        relay's, so that a thousand groups hold no more connections than one."""
        from aiocache import RedisCache

        parts = urlsplit(url)
        db = int(parts.path.strip("/") or 0)
        host, port = parts.hostname or "127.0.0.1", parts.port or 6379
        self.description = f"redis {host}:{port}/{db} prefix {prefix!r}"
        self.timeout = timeout
        self.prefix = prefix
        self._namespace = f"{prefix}:v{FORMAT}"
        self._owns_client = share is None
        self._cache: Any
        if share is not None:
            self._cache = share._cache
        else:
            self._cache = RedisCache(
                endpoint=host, port=port, db=db, password=password or parts.password,
                namespace=self._namespace, timeout=timeout,
                ssl=parts.scheme == "rediss", create_connection_timeout=timeout,
                connection_pool_kwargs={"socket_timeout": timeout})
        self._client: Any = self._cache.client

    def _key(self, name: str) -> str:
        # what aiocache's build_key makes of the namespace, for a shared one too
        return f"{self._namespace}:{name}"

    async def load(self) -> StoredSnapshot | None:
        with self._errors("load"):
            meta: dict[bytes, bytes] = await self._cache.raw("hgetall", self._key("meta"))
            if not meta:
                return None
            types = {key[len(b"type:"):].decode(): _type_state(json.loads(value))
                     for key, value in meta.items() if key.startswith(b"type:")}
            snapshot = StoredSnapshot(int(meta.get(b"format", b"0")),
                                      float(meta[b"written_at"]) if b"written_at" in meta
                                      else None, types)
            if snapshot.format != FORMAT:
                return snapshot
            for type_url in types:
                snapshot.entries[type_url] = await self._read_hash(f"type:{type_url}")
            return snapshot

    async def _read_hash(self, name: str) -> dict[str, bytes]:
        """A whole hash, :data:`ENTRIES_PER_READ` fields per round trip: each
        read's time (and so ``timeout``) follows Redis's latency, not the
        snapshot's size (one HGETALL of 100,000 entries took over a second)."""
        key, cursor = self._key(name), 0
        found: dict[str, bytes] = {}
        while True:
            cursor, fields = await within(
                self._client.hscan(key, cursor, count=ENTRIES_PER_READ), self.timeout)
            for field_name, entry in fields.items():
                found[field_name.decode(errors="replace")] = entry
            if cursor == 0:
                return found

    async def write(self, batch: SnapshotBatch) -> None:
        """One ``MULTI``/``EXEC`` round trip per :data:`ENTRIES_PER_WRITE` names
        (a usual response is one), the meta last: each round trip's time, and
        so ``timeout``, stays that of Redis, whatever the batch's size."""
        commands: list[tuple[str, str, Any]] = []
        for type_url, entries in batch.upserts.items():
            items = list(entries.items())
            for start in range(0, len(items), ENTRIES_PER_WRITE):
                chunk = dict(items[start:start + ENTRIES_PER_WRITE])
                commands.append(("hset", f"type:{type_url}", chunk))
        for type_url, names in batch.deletes.items():
            for start in range(0, len(names), ENTRIES_PER_WRITE):
                commands.append(("hdel", f"type:{type_url}",
                                 names[start:start + ENTRIES_PER_WRITE]))
        commands.append(("hset", "meta", _meta_fields(batch)))
        with self._errors("write"):
            pipe = self._client.pipeline(transaction=True)
            size = 0
            for number, (command, name, argument) in enumerate(commands, 1):
                if command == "hset":
                    pipe.hset(self._key(name), mapping=argument)
                else:
                    pipe.hdel(self._key(name), *argument)
                size += len(argument)
                if size >= ENTRIES_PER_WRITE or number == len(commands):
                    await within(pipe.execute(), self.timeout)
                    size = 0

    async def clear(self) -> None:
        """Delete the snapshot: its meta and the hash of every type it names."""
        with self._errors("clear"):
            meta: dict[bytes, bytes] = await within(
                self._client.hgetall(self._key("meta")), self.timeout)
            names = [self._key("meta"), *(self._key(f"type:{key[len(b'type:'):].decode()}")
                                          for key in meta if key.startswith(b"type:"))]
            await within(self._client.delete(*names), self.timeout)

    async def close(self) -> None:
        if not self._owns_client:
            return  # the store it shares with closes it
        # The client's own aclose: aiocache 0.12's close() calls the
        # deprecated redis-py close().
        with contextlib.suppress(Exception):
            await self._client.aclose()

    @contextlib.contextmanager
    def _errors(self, what: str) -> Any:
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeout

        try:
            yield
        except (TimeoutError, RedisTimeout):
            raise StoreError(f"{what}: no answer from {self.description} within "
                             f"{self.timeout:g}s") from None
        except (RedisError, OSError) as error:
            raise StoreError(f"{what}: {self.description}: {error}") from None
        except (ValueError, UnicodeDecodeError) as error:  # meta written by someone else
            raise StoreError(f"{what}: {self.description}: unreadable meta: {error}") from None


def entry_file_name(name: str) -> str:
    """A file name for the entry of ``name`` (names may hold any character)."""
    return hashlib.blake2b(name.encode(), digest_size=16).hexdigest() + ".entry"


class DirectoryStore:
    """A snapshot in a local directory, for a single relay (or a shared volume).

    Every file is written whole under a temporary name and renamed into
    place, so that a reader (or a relay killed mid-write) sees the old file
    or the new one, never half of one. File work runs on one thread of its
    own, in order.
    """

    def __init__(self, directory: Path, *, share: DirectoryStore | None = None) -> None:
        """``share``: another store whose thread this one's file work runs on (a
        node group's store shares the relay's: one thread for all groups)."""
        self.directory = directory
        self.root = directory / f"v{FORMAT}"
        self.description = f"directory {directory}"
        self._owns_thread = share is None
        self._thread: concurrent.futures.ThreadPoolExecutor = \
            share._thread if share is not None else \
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="snapshot-files")

    async def load(self) -> StoredSnapshot | None:
        snapshot: StoredSnapshot | None = await self._run("load", self._load)
        return snapshot

    async def write(self, batch: SnapshotBatch) -> None:
        await self._run("write", self._write, batch)

    async def clear(self) -> None:
        """Delete the snapshot: the directory's files of this format."""
        await self._run("clear", shutil.rmtree, self.root, True)

    async def close(self) -> None:
        if self._owns_thread:
            self._thread.shutdown(wait=True)

    async def _run(self, what: str, work: Any, *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, work, *args)
        except OSError as error:
            raise StoreError(f"{what}: {self.description}: {error}") from None
        except (ValueError, KeyError, TypeError) as error:
            raise StoreError(f"{what}: {self.description}: unreadable meta.json: "
                             f"{error}") from None

    def _load(self) -> StoredSnapshot | None:
        try:
            meta = json.loads((self.root / "meta.json").read_bytes())
        except FileNotFoundError:
            return None
        snapshot = StoredSnapshot(int(meta["format"]), meta.get("written_at"),
                                  {type_url: _type_state(state)
                                   for type_url, state in meta["types"].items()})
        if snapshot.format != FORMAT:
            return snapshot
        for type_url in snapshot.types:
            folder = self.root / quote(type_url, safe="")
            entries = snapshot.entries[type_url] = {}
            with contextlib.suppress(FileNotFoundError):
                for path in folder.iterdir():
                    if path.suffix == ".entry":
                        entries[str(path)] = path.read_bytes()
        return snapshot

    def _write(self, batch: SnapshotBatch) -> None:
        for type_url, entries in batch.upserts.items():
            folder = self.root / quote(type_url, safe="")
            folder.mkdir(parents=True, exist_ok=True)
            for name, entry in entries.items():
                _replace(folder / entry_file_name(name), entry)
        for type_url, names in batch.deletes.items():
            folder = self.root / quote(type_url, safe="")
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    (folder / entry_file_name(name)).unlink()
        meta_path = self.root / "meta.json"
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            known = json.loads(meta_path.read_bytes()).get("types", {})
        except (FileNotFoundError, ValueError):
            known = {}
        known.update({type_url: _type_fields(state) for type_url, state in batch.types.items()})
        _replace(meta_path, json.dumps({"format": FORMAT, "written_at": batch.written_at,
                                        "types": known}).encode())


def _replace(path: Path, data: bytes) -> None:
    """Write ``path`` whole: a temporary file beside it, renamed over it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)



# -- node groups ---------------------------------------------------------------------


class GroupRegistry(Protocol):
    """Which node groups have a snapshot: one encoded entry per group id (see
    :mod:`relay.persistence.groups`), so that a warm start knows which
    groups to restore and with which node."""

    description: str

    async def load(self) -> dict[str, bytes]:
        """Every group's entry, by group id; raises :class:`StoreError`."""

    async def get(self, group: str) -> bytes | None:
        """``group``'s entry (None: not listed); raises :class:`StoreError`."""

    async def put(self, group: str, entry: bytes) -> None:
        """Write ``group``'s entry; raises :class:`StoreError`."""

    async def drop(self, group: str) -> None:
        """Forget ``group`` (its snapshot is cleared separately); raises :class:`StoreError`."""


class RedisGroupRegistry:
    """The groups as one Redis hash beside the relay's snapshot
    (``<prefix>:v<FORMAT>:groups``: group id -> entry), on its connections."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._hash = store._key("groups")
        self.description = f"{store.description} (node groups)"

    async def load(self) -> dict[str, bytes]:
        with self._store._errors("load node groups"):
            found: dict[bytes, bytes] = await within(
                self._store._client.hgetall(self._hash), self._store.timeout)
        return {key.decode(errors="replace"): value for key, value in found.items()}

    async def get(self, group: str) -> bytes | None:
        with self._store._errors("read node group"):
            found: bytes | None = await within(
                self._store._client.hget(self._hash, group), self._store.timeout)
        return found

    async def put(self, group: str, entry: bytes) -> None:
        with self._store._errors("write node group"):
            await within(self._store._client.hset(self._hash, group, entry),
                                   self._store.timeout)

    async def drop(self, group: str) -> None:
        with self._store._errors("drop node group"):
            await within(self._store._client.hdel(self._hash, group),
                                   self._store.timeout)


class DirectoryGroupRegistry:
    """The groups as ``<directory>/groups/<group id>/group.json``, beside each
    group's snapshot (``<directory>/groups/<group id>/``): dropping a group
    removes its folder whole."""

    def __init__(self, store: DirectoryStore) -> None:
        self._store = store
        self.folder = store.directory / "groups"
        self.description = f"directory {self.folder}"

    async def load(self) -> dict[str, bytes]:
        found: dict[str, bytes] = await self._store._run("load node groups", self._load)
        return found

    def _load(self) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        with contextlib.suppress(FileNotFoundError):
            for folder in self.folder.iterdir():
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    found[folder.name] = (folder / "group.json").read_bytes()
        return found

    async def get(self, group: str) -> bytes | None:
        found: bytes | None = await self._store._run("read node group", self._get, group)
        return found

    def _get(self, group: str) -> bytes | None:
        try:
            return (self.folder / group / "group.json").read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    async def put(self, group: str, entry: bytes) -> None:
        await self._store._run("write node group", self._put, group, entry)

    def _put(self, group: str, entry: bytes) -> None:
        folder = self.folder / group
        folder.mkdir(parents=True, exist_ok=True)
        _replace(folder / "group.json", entry)

    async def drop(self, group: str) -> None:
        await self._store._run("drop node group", shutil.rmtree, self.folder / group, True)
