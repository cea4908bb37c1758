"""What the console's JSON says: pure functions from the relay's state to
plain dictionaries (no I/O; the browser renders them, every string as text).

* :func:`readiness_view`: ``/ready``'s verdict and why;
* :func:`origins_view`: each origin, from the admin server's ``origins``
  (server in use, connected since, last response per type, reconnects);
* :func:`cache_view`: per type, names, variants, synced, complete, errors;
* :func:`snapshot_views`: each snapshot store and what was restored from it;
* :func:`history_view`: the chart points after a time;
* :func:`client_view`: one client's page: per type what it subscribes,
  holds against the cache, and its last NACK in full.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from relay.cache import ResourceCache
from relay.console.history import POINT_FIELDS, History
from relay.persistence.restore import Restored
from relay.persistence.writer import SnapshotWriter
from relay.xds_types import PUSH_ORDER, push_rank, short_name

__all__ = ["NAMES_SHOWN", "cache_view", "client_view", "history_view", "origins_view",
           "readiness_view", "snapshot_views"]

#: A client's page lists this many resources of a type at most (the unsynced first).
NAMES_SHOWN = 1000


def _by_push_order(type_urls: Sequence[str]) -> list[str]:
    return sorted(type_urls, key=lambda t: (push_rank(t), t))


def readiness_view(not_ready_reason: Callable[[], str | None],
                   ready_detail: Callable[[], str] | None) -> dict[str, Any]:
    """What ``/ready`` says: ready or not, and why."""
    reason = not_ready_reason()
    if reason is not None:
        return {"ready": False, "why": reason}
    return {"ready": True, "why": ready_detail() if ready_detail is not None else ""}


def origins_view(origins: Callable[[], list[dict[str, Any]]] | None) -> list[dict[str, Any]] | None:
    """Each origin as ``/origins`` reports it (None: the admin server reports none).

    Its records' keys (see :class:`relay.upstream.client.OriginStatus`):
    ``origin`` (its name), ``server`` (the address in use), ``servers``,
    ``fallback`` (the index of the server in use: 0 is the primary),
    ``connected``, ``since`` (Unix time: connected since, or disconnected
    since), ``reconnects`` and ``last_response`` (type: Unix time), listed
    here in push order. Keys the console does not know are passed on.
    """
    if origins is None:
        return None
    shown = []
    for record in origins():
        entry = dict(record)
        last = record.get("last_response")
        if isinstance(last, dict):
            entry["last_response"] = [{"type": short_name(t), "at": last[t]}
                                      for t in sorted(last, key=_type_order)]
        shown.append(entry)
    return shown


# a type by its short name or its URL, in push order
_SHORT_RANKS = {short_name(type_url): push_rank(type_url) for type_url in PUSH_ORDER}


def _type_order(name: str) -> tuple[int, str]:
    return (_SHORT_RANKS.get(name, push_rank(name)), name)


def cache_view(cache: ResourceCache) -> list[dict[str, Any]]:
    """Per cached type: names, variants, synced (the origin has answered),
    complete (the cache holds every resource of the type) and whether the
    origin reported errors for some of its names."""
    counts = cache.counts()
    return [{"type": short_name(t), "type_url": t, "names": counts.get(t, (0, 0))[0],
             "variants": counts.get(t, (0, 0))[1], "synced": cache.is_synced(t),
             "complete": cache.is_complete(t), "errors": cache.has_errors(t)}
            for t in _by_push_order(cache.type_urls())]


def snapshot_views(writers: Mapping[str, SnapshotWriter],
                   restored_of: Callable[[str], Restored | None]) -> list[dict[str, Any]] | None:
    """Per origin with a snapshot store: the store, the names waiting to be
    written, and what the relay restored from it at start (where, when it
    was written, how many types and resource variants). None: no store."""
    if not writers:
        return None
    views = []
    for origin, writer in writers.items():
        view: dict[str, Any] = {"origin": origin, "store": writer.store.description,
                                "pending": writer.pending()}
        restored = restored_of(origin)
        if restored is not None:
            view["restored"] = {"where": restored.where, "written_at": restored.written_at,
                                "types": restored.types, "resources": restored.resources}
        views.append(view)
    return views


def history_view(history: History, since: float | None) -> dict[str, Any]:
    """The points after Unix time ``since`` (all for None), as rows of
    ``fields``; the browser keeps the ones it has."""
    return {"capacity": history.capacity, "fields": list(POINT_FIELDS),
            "points": [point.to_json() for point in history.since(since)]}


def client_view(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One client's page: each of its streams (``/clients`` records), each
    type with what it subscribes, its last NACK in full, and its resources
    against the cache: ``status`` (acked when held ACKED at the cache's
    version), the version ``held`` and the ``cached`` one."""
    return [{key: value for key, value in record.items() if key != "types"}
            | {"types": [_type_view(t, state) for t, state in _types(record)]}
            for record in records]


def _types(record: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    types = record.get("types")
    if not isinstance(types, dict):
        return []
    return [(t, types[t]) for t in _by_push_order(list(types)) if isinstance(types[t], dict)]


def _type_view(type_url: str, state: Mapping[str, Any]) -> dict[str, Any]:
    subscribed = [str(n) for n in state.get("subscribed", [])]
    versions: Mapping[str, Any] = state.get("versions") or {}
    unsynced: Mapping[str, Any] = state.get("unsynced") or {}
    names = [*unsynced, *(n for n in versions if n not in unsynced)]
    if not state.get("wildcard"):
        names += [n for n in subscribed if n not in versions and n not in unsynced]
    resources = []
    for name in names[:NAMES_SHOWN]:
        entry = unsynced.get(name)
        if entry is None:
            held = str(versions.get(name, ""))
            resources.append({"name": name, "status": "acked", "held": held, "cached": held})
            continue
        held = str(entry.get("version", ""))
        resource = {"name": name, "status": str(entry.get("status", "")), "held": held,
                    "cached": entry.get("cached_version", held)}
        if "name" in entry:
            resource["alias_of"] = entry["name"]
        if "error" in entry:
            resource["error"] = entry["error"]
        resources.append(resource)
    return {"type": short_name(type_url), "type_url": type_url,
            "sync": state.get("sync"), "wildcard": bool(state.get("wildcard")),
            "subscribed": subscribed[:NAMES_SHOWN], "subscribed_count": len(subscribed),
            "acked": state.get("acked"), "in_flight": state.get("in_flight"),
            "last_nack": state.get("last_nack"),
            "resources": resources, "resource_count": len(names),
            # timestamps /clients may carry (connected since, last ACK, last NACK)
            **{key: value for key, value in state.items() if key.endswith("_at")}}
