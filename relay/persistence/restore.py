"""A stored snapshot back into the cache, before the relay serves anyone.

Each type the snapshot holds becomes synced in the cache, complete if it
was, with every variant whose TTL has not lapsed (its deadline restored to
the same wall-clock moment). What cannot be used is skipped and said: an
unreadable entry (one log line naming where it was), a whole snapshot of
another format (one line).

The restored resources are a *provisional* cache: served to clients while
the origin is away, declared to the origin (``initial_resource_versions``)
when it answers, and confirmed or removed by it as after any reconnect (see
:mod:`relay.upstream.state`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from relay.cache import Update
from relay.persistence.entries import FORMAT, CorruptEntry, decode_entry
from relay.persistence.stores import StoredSnapshot
from relay.resource import CachedResource
from relay.upstream.scoped import OriginCache
from relay.xds_types import short_name

log = logging.getLogger("relay.persistence")


@dataclass
class Restored:
    """What a restore put into the cache."""

    where: str
    written_at: float | None = None
    types: int = 0
    resources: int = 0  # variants
    expired: int = 0
    corrupt: int = 0


def restore(cache: OriginCache, snapshot: StoredSnapshot, where: str,
            clock_now: float, wall_now: float,
            count_skipped: Callable[[str, int], None] | None = None) -> Restored:
    """Write ``snapshot`` (read from ``where``) into ``cache``; what it restored.

    ``clock_now`` and ``wall_now`` are the same moment on the cache's clock
    and on the wall clock. ``count_skipped(reason, n)`` counts what was not
    used ("expired", "corrupt", "format").
    """
    done = Restored(where, snapshot.written_at)
    if snapshot.format != FORMAT:
        log.warning("snapshot at %s has format %d, this relay reads format %d: ignored "
                    "(it is rewritten as the origin answers)", where, snapshot.format, FORMAT)
        if count_skipped is not None:
            count_skipped("format", 1)
        return done
    offset = clock_now - wall_now  # wall time -> clock time
    for type_url, state in sorted(snapshot.types.items()):
        upserts: list[CachedResource] = []
        deadlines: dict[tuple[str, str], float] = {}
        for key, blob in snapshot.entries.get(type_url, {}).items():
            try:
                name, variants = decode_entry(type_url, blob)
            except (CorruptEntry, UnicodeDecodeError) as error:
                log.warning("snapshot entry %s of %s at %s skipped: %s", key,
                            short_name(type_url), where, error)
                done.corrupt += 1
                continue
            for variant in variants:
                resource = variant.resource
                if variant.expires_at is not None:
                    if variant.expires_at <= wall_now:
                        done.expired += 1
                        continue
                    deadlines[(name, resource.variant_key)] = variant.expires_at + offset
                upserts.append(resource)
        cache.apply(type_url, Update(upserts, complete=state.complete, deadlines=deadlines,
                                     wildcard_answered=state.wildcard))
        done.types += 1
        done.resources += len(upserts)
    if count_skipped is not None:
        for reason, count in (("expired", done.expired), ("corrupt", done.corrupt)):
            if count:
                count_skipped(reason, count)
    return done
