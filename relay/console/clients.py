"""The console's client list: one row per stream, searched, sorted and paged
on the relay, with counts of every state, worst first.

A row is made from one ``/clients`` record (see
:func:`relay.server.status.client_summary`): its ``sync`` per type is the
one ``/clients`` and ``xds-relay status`` report, its latest NACK the one
``status`` shows (:func:`relay.status_command.latest_nack`). Nothing here
is computed twice: a :class:`ClientTable` is built once from every record,
then answers any number of queries (each order is sorted once per table).

With ``--workers``, each worker answers a query from its own table with
its first ``offset + limit`` rows; :func:`merge_pages` merges those lists
(each sorted the same way) into the page, and sums the counts.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from relay.errors import RelayError
from relay.server.status import NACKED, NOT_SENT, STALE, SYNCED
from relay.status_command import latest_nack, protocol_of
from relay.xds_types import push_rank, short_name

__all__ = ["SORTS", "STATES", "BadQuery", "ClientTable", "Page", "Query", "Row", "merge_pages"]

#: A stream's states, from the worst: its worst type's ``sync``.
STATES = (NACKED, STALE, NOT_SENT, SYNCED)
_RANK = {state: rank for rank, state in enumerate(STATES)}
#: What a page can be sorted by.
SORTS = ("worst", "node", "peer", "protocol", "worker")
#: Rows in a page: at most this many.
MAX_LIMIT = 500
DEFAULT_LIMIT = 50
# A NACK message is shown in full on the client's page; in the list, cut.
_LISTED_MESSAGE = 300


class BadQuery(RelayError, ValueError):
    """A query the console cannot answer (400); the message says what it takes."""


@dataclass(frozen=True, slots=True)
class Query:
    """What one page of the list asks for."""

    search: str = ""            # a substring of the node id, peer or NACK message (any case)
    state: str | None = None    # only streams in this state (one of STATES)
    sort: str = "worst"         # one of SORTS; "worst": worst first, then node id
    descending: bool = False
    offset: int = 0
    limit: int = DEFAULT_LIMIT

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Query:
        """The query in a request's parameters ``q``, ``state``, ``sort``,
        ``order`` (asc, desc), ``offset`` and ``limit``; :class:`BadQuery` says
        which is wrong."""
        state = params.get("state") or None
        if state is not None and state not in STATES:
            raise BadQuery(f"state {state!r}: expected one of {', '.join(STATES)}")
        sort = params.get("sort") or "worst"
        if sort not in SORTS:
            raise BadQuery(f"sort {sort!r}: expected one of {', '.join(SORTS)}")
        order = params.get("order") or "asc"
        if order not in ("asc", "desc"):
            raise BadQuery(f"order {order!r}: expected asc or desc")
        return cls(search=params.get("q", "").strip()[:200], state=state, sort=sort,
                   descending=order == "desc",
                   offset=_number(params, "offset", 0, 10**9),
                   limit=_number(params, "limit", DEFAULT_LIMIT, MAX_LIMIT, least=1))

    def to_json(self) -> dict[str, Any]:
        return {"q": self.search, "state": self.state or "", "sort": self.sort,
                "order": "desc" if self.descending else "asc", "offset": str(self.offset),
                "limit": str(self.limit)}


def _number(params: Mapping[str, str], key: str, default: int, most: int, least: int = 0) -> int:
    text = params.get(key)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadQuery(f"{key} {text!r}: expected a whole number") from None
    if not least <= value <= most:
        raise BadQuery(f"{key} {value}: expected {least} to {most}")
    return value


@dataclass(frozen=True, slots=True)
class Row:
    """One stream in the list."""

    node_id: str
    peer: str
    protocol: str                           # as status shows it: sotw, delta, sotw/CDS
    worker: int | None                      # --workers: the worker serving it
    types: tuple[tuple[str, str], ...]      # (type URL, sync), in push order
    worst: str                              # the worst sync of its types (synced: none)
    nack_type: str | None = None            # its latest NACK's type URL
    nack_message: str = ""
    since: float | None = None              # connected since (Unix time), when /clients says
    _search: str = field(default="", repr=False, compare=False)

    @classmethod
    def of(cls, record: Mapping[str, Any], worker: int | None = None) -> Row:
        """The row of one ``/clients`` record."""
        types = record.get("types")
        states = [] if not isinstance(types, dict) else sorted(
            ((str(t), _sync(s)) for t, s in types.items()),
            key=lambda item: (push_rank(item[0]), item[0]))
        worst = min((sync for _, sync in states), key=_RANK.__getitem__, default=SYNCED)
        latest = latest_nack(record)
        nack_type, message = (None, "") if latest is None else \
            (latest[0], str(latest[1].get("message", "")))
        node_id, peer = str(record.get("node_id", "")), str(record.get("peer", ""))
        since = record.get("connected_since")
        return cls(node_id, peer, protocol_of(record), worker, tuple(states), worst, nack_type,
                   message, float(since) if isinstance(since, int | float) else None,
                   f"{node_id}\n{peer}\n{message}".casefold())

    def matches(self, query: Query, needle: str) -> bool:
        return (query.state is None or self.worst == query.state) and \
            (not needle or needle in self._search)

    def key(self, sort: str) -> tuple[Any, ...]:
        """What ``sort`` orders by; ties go by node id, peer, worker."""
        tail = (self.node_id, self.peer, self.worker or 0)
        if sort == "worst":
            return (_RANK[self.worst], *tail)
        if sort == "peer":
            return (self.peer, self.node_id, self.worker or 0)
        if sort == "protocol":
            return (self.protocol, *tail)
        if sort == "worker":
            return (self.worker or 0, self.node_id, self.peer)
        return tail

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "node_id": self.node_id, "peer": self.peer, "protocol": self.protocol,
            "types": [[short_name(t), t, sync] for t, sync in self.types], "worst": self.worst}
        if self.worker is not None:
            row["worker"] = self.worker
        if self.nack_type is not None:
            message = self.nack_message
            row["nack"] = {"type": short_name(self.nack_type), "type_url": self.nack_type,
                           "message": message[:_LISTED_MESSAGE],
                           "cut": len(message) > _LISTED_MESSAGE}
        if self.since is not None:
            row["since"] = self.since
        return row

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Row:
        """A row a worker sent (for the hub's merge; its NACK message as listed)."""
        nack = data.get("nack")
        node_id, peer = str(data["node_id"]), str(data["peer"])
        message = str(nack["message"]) if isinstance(nack, dict) else ""
        worker = data.get("worker")
        since = data.get("since")
        return cls(node_id, peer, str(data["protocol"]),
                   int(worker) if isinstance(worker, int) else None,
                   tuple((str(t[1]), _sync(t[2])) for t in data["types"]), _sync(data["worst"]),
                   str(nack["type_url"]) if isinstance(nack, dict) else None, message,
                   float(since) if isinstance(since, int | float) else None,
                   f"{node_id}\n{peer}\n{message}".casefold())


def _sync(state: object) -> str:
    """A type's ``sync``; one this console does not know counts as stale
    (not synced, not known to be NACKed)."""
    sync = state.get("sync") if isinstance(state, dict) else state
    return sync if isinstance(sync, str) and sync in _RANK else STALE


@dataclass
class Page:
    """The answer to a :class:`Query`: the rows asked for and the counts."""

    total: int                              # streams listed
    matched: int                            # of those, the query's
    states: dict[str, int]                  # streams per worst state (all of them)
    types: dict[str, dict[str, int]]        # per type URL, streams per sync
    rows: list[Row]
    query: Query

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "matched": self.matched, "states": self.states,
                "types": [{"type_url": t, "type": short_name(t), "states": counts}
                          for t, counts in sorted(self.types.items(),
                                                  key=lambda i: (push_rank(i[0]), i[0]))],
                "offset": self.query.offset, "limit": self.query.limit,
                "rows": [row.to_json() for row in self.rows]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], query: Query) -> Page:
        return cls(int(data["total"]), int(data["matched"]),
                   {str(k): int(v) for k, v in data["states"].items()},
                   {str(t["type_url"]): {str(k): int(v) for k, v in t["states"].items()}
                    for t in data["types"]},
                   [Row.from_json(row) for row in data["rows"]], query)


class ClientTable:
    """Every stream's row, built once from the ``/clients`` records; answers queries."""

    def __init__(self, records: Iterable[Mapping[str, Any]], worker: int | None = None,
                 rows: list[Row] | None = None) -> None:
        self.records = list(records)
        # rows: already made, one per record (a build that let the loop run between chunks)
        self.rows = rows if rows is not None else \
            [Row.of(record, worker) for record in self.records]
        self.states = dict.fromkeys(STATES, 0)
        types: dict[str, Counter[str]] = {}
        for row in self.rows:
            self.states[row.worst] += 1
            for type_url, sync in row.types:
                types.setdefault(type_url, Counter())[sync] += 1
        self.types = {t: {state: counts[state] for state in STATES if counts[state]}
                      for t, counts in types.items()}
        self._sorted: dict[tuple[str, bool], list[Row]] = {}

    def page(self, query: Query, through: bool = False) -> Page:
        """The page ``query`` asks for; with ``through``, every row up to its
        end (``offset + limit`` rows: what a worker sends the hub)."""
        ordered = self._ordered(query.sort, query.descending)
        needle = query.search.casefold()
        if query.state is None and not needle:
            matched = ordered
        else:
            matched = [row for row in ordered if row.matches(query, needle)]
        end = query.offset + query.limit
        rows = matched[:end] if through else matched[query.offset:end]
        return Page(len(self.rows), len(matched), dict(self.states),
                    {t: dict(c) for t, c in self.types.items()}, rows, query)

    def records_of(self, node_id: str, peer: str) -> list[Mapping[str, Any]]:
        """The records of the streams of ``node_id`` from ``peer`` (a client's page)."""
        return [record for record, row in zip(self.records, self.rows, strict=True)
                if row.node_id == node_id and row.peer == peer]

    def _ordered(self, sort: str, descending: bool) -> list[Row]:
        ordered = self._sorted.get((sort, descending))
        if ordered is None:
            ordered = self._sorted[sort, descending] = sorted(
                self.rows, key=lambda row: row.key(sort), reverse=descending)
        return ordered


def merge_pages(pages: Sequence[Page], query: Query) -> Page:
    """One page from the pages of several tables (each listing its rows
    through the query's end, sorted by it): counts summed, rows merged."""
    states = dict.fromkeys(STATES, 0)
    types: dict[str, Counter[str]] = {}
    for page in pages:
        for state, count in page.states.items():
            states[state] = states.get(state, 0) + count
        for type_url, counts in page.types.items():
            types.setdefault(type_url, Counter()).update(counts)
    key: Callable[[Row], tuple[Any, ...]] = lambda row: row.key(query.sort)  # noqa: E731
    merged = list(heapq.merge(*(page.rows for page in pages), key=key,
                              reverse=query.descending))
    rows = merged[query.offset:query.offset + query.limit]
    return Page(sum(p.total for p in pages), sum(p.matched for p in pages), states,
                {t: {s: c[s] for s in STATES if c[s]} for t, c in types.items()}, rows, query)


def with_worker(page: Page, worker: int) -> Page:
    """``page`` with every row marked as served by ``worker``."""
    return replace(page, rows=[replace(row, worker=worker) for row in page.rows])
