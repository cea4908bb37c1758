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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

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


def _meta_fields(batch: SnapshotBatch) -> dict[str, str]:
    return {"format": str(FORMAT), "written_at": repr(batch.written_at),
            **{f"type:{type_url}": json.dumps({"complete": state.complete})
               for type_url, state in batch.types.items()}}


def _type_state(data: object) -> TypeState:
    if not isinstance(data, dict):
        raise ValueError("not an object")
    return TypeState(complete=data.get("complete") is True)


class RedisStore:
    """A snapshot in Redis, through aiocache's Redis backend.

    aiocache gives the connection pool, the key namespace (the prefix) and a
    timeout on every operation. A write is one ``MULTI``/``EXEC`` pipeline of
    hash commands on aiocache's redis-py client (aiocache's key-value API has
    neither hashes nor transactions): one round trip, applied whole.
    """

    def __init__(self, url: str, prefix: str, timeout: float,
                 password: str | None = None) -> None:
        from aiocache import RedisCache

        parts = urlsplit(url)
        db = int(parts.path.strip("/") or 0)
        host, port = parts.hostname or "127.0.0.1", parts.port or 6379
        self.description = f"redis {host}:{port}/{db} prefix {prefix!r}"
        self.timeout = timeout
        self._cache = RedisCache(
            endpoint=host, port=port, db=db, password=password or parts.password,
            namespace=f"{prefix}:v{FORMAT}", timeout=timeout,
            ssl=parts.scheme == "rediss", create_connection_timeout=timeout,
            connection_pool_kwargs={"socket_timeout": timeout})
        self._client: Any = self._cache.client

    def _key(self, name: str) -> str:
        key: str = self._cache.build_key(name)
        return key

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
            cursor, fields = await asyncio.wait_for(
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
                    await asyncio.wait_for(pipe.execute(), self.timeout)
                    size = 0

    async def close(self) -> None:
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

    def __init__(self, directory: Path) -> None:
        self.root = directory / f"v{FORMAT}"
        self.description = f"directory {directory}"
        self._thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="snapshot-files")

    async def load(self) -> StoredSnapshot | None:
        snapshot: StoredSnapshot | None = await self._run("load", self._load)
        return snapshot

    async def write(self, batch: SnapshotBatch) -> None:
        await self._run("write", self._write, batch)

    async def close(self) -> None:
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
        known.update({type_url: {"complete": state.complete}
                      for type_url, state in batch.types.items()})
        _replace(meta_path, json.dumps({"format": FORMAT, "written_at": batch.written_at,
                                        "types": known}).encode())


def _replace(path: Path, data: bytes) -> None:
    """Write ``path`` whole: a temporary file beside it, renamed over it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)

