"""Where the console's clients and readings come from: this process
(:class:`LocalSource`), or the workers of ``--workers`` (:class:`WorkersSource`).

Building the client list means comparing every stream's state with the
cache (what ``/clients`` does): some 30 to 40 microseconds a stream, a
third of a second at 10,000 streams. A :class:`LocalSource` therefore
builds it on demand only (no console open, no cost), :data:`CHUNK` streams
at a time with the loop's other work in between (a client waits for one
chunk, a few milliseconds, not for the list), shares each build between
every console asking, and builds again no sooner than :data:`MIN_AGE`
and no more often than keeps that work within :data:`DUTY` of the loop's
time. So the list is at most about 1 s old up to some 2,000 streams (the
console polls once a second), and further behind beyond: 3 to 4 s at
10,000, rather than the clients paying for it (``benchmarks.console``).

With ``--workers``, each worker builds its own list, in its own process,
and answers the hub's questions (:func:`worker_answer`): a page through
the query's end, a client's records, a reading. The hub merges them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from relay.console.clients import (
    BadQuery,
    ClientTable,
    Page,
    Query,
    Row,
    merge_pages,
    with_worker,
)
from relay.console.history import Reading, process_rss, relay_reading, tally
from relay.server.serving import ServingContext
from relay.telemetry import Metrics

__all__ = ["CHUNK", "DUTY", "MIN_AGE", "QUESTIONS", "Clients", "ConsoleSource", "LocalSource",
           "WorkersSource", "hub_reading", "local_source", "worker_answer"]

#: Seconds a client list is reused at least (the console asks once a second).
MIN_AGE = 0.5
#: The share of the loop's time that building client lists may take.
DUTY = 0.1
#: Records built between two turns of the loop's other work.
CHUNK = 200
#: What the hub asks a worker for the console (see :func:`worker_answer`).
QUESTIONS = ("console_clients", "console_client", "console_reading")


@dataclass
class Clients:
    """A page of the client list, when it was built, and (``--workers``)
    which workers answered."""

    page: Page
    built_at: float                         # Unix time
    workers: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        data = self.page.to_json()
        data["built_at"] = self.built_at
        if self.workers is not None:
            data["workers"] = self.workers
        return data


class ConsoleSource(Protocol):
    """What the console reads beyond what the admin server has."""

    async def readings(self) -> Mapping[str, Reading]:
        """Each process's reading now, by a name of its own."""

    async def clients(self, query: Query) -> Clients:
        """The page of the client list ``query`` asks for."""

    async def client(self, node_id: str, peer: str,
                     worker: int | None) -> list[Mapping[str, Any]]:
        """The ``/clients`` records of one client's streams (a worker's: ``worker``)."""

    def snapshot(self) -> Sequence[Mapping[str, Any]] | None:
        """The snapshot store, if the relay keeps one (see
        :func:`relay.console.data.snapshot_views`)."""


class LocalSource:
    """This process's clients and reading.

    ``records`` gives every stream's ``/clients`` record, each built as it
    is taken (:meth:`relay.server.serving.ServingContext.iter_client_statuses`):
    the list is built :data:`CHUNK` records at a time, letting the loop run
    between, so that no client waits for more than one chunk. ``reading``
    gives this process's :class:`Reading`; ``snapshot`` what the console
    shows of the snapshot stores. ``clock`` (monotonic) and ``wall`` (Unix)
    are injectable.
    """

    def __init__(self, records: Callable[[], Iterable[dict[str, Any]]],
                 reading: Callable[[], Reading],
                 snapshot: Callable[[], Sequence[Mapping[str, Any]] | None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, chunk: int = CHUNK) -> None:
        self._records = records
        self._reading = reading
        self._snapshot = snapshot
        self._clock = clock
        self._wall = wall
        self._chunk = chunk
        self._table: ClientTable | None = None
        self._built = 0.0       # clock time the table's build started
        self._built_at = 0.0    # the same, Unix time
        self._cost = 0.0        # seconds of the loop the last build took (its chunks)
        self._building: asyncio.Future[None] | None = None

    @property
    def build_cost(self) -> float:
        """Seconds of the loop the last build of the list took."""
        return self._cost

    def age(self) -> float:
        """Seconds since the list was built."""
        return self._clock() - self._built

    async def table(self) -> tuple[ClientTable, float]:
        """The client list (built again if old enough: see the module) and
        the Unix time its build started. Callers at once share one build."""
        if self._table is None or self.age() >= max(MIN_AGE, self._cost / DUTY):
            if self._building is None:
                self._building = asyncio.ensure_future(self._build())
                self._building.add_done_callback(self._built_now)
            await asyncio.shield(self._building)
        assert self._table is not None
        return self._table, self._built_at

    def _built_now(self, building: asyncio.Future[None]) -> None:
        self._building = None

    async def _build(self) -> None:
        started, started_at = self._clock(), self._wall()
        records: list[dict[str, Any]] = []
        rows: list[Row] = []
        taken = iter(self._records())
        busy = self._clock() - started
        while True:
            begun = self._clock()
            chunk = list(itertools.islice(taken, self._chunk))
            records += chunk
            rows += [Row.of(record) for record in chunk]
            busy += self._clock() - begun
            if len(chunk) < self._chunk:
                break
            await asyncio.sleep(0)  # the clients' turn
        begun = self._clock()
        self._table = ClientTable(records, rows=rows)
        self._cost = busy + self._clock() - begun
        self._built, self._built_at = started, started_at

    def reading(self) -> Reading:
        """This process's reading now."""
        return self._reading()

    async def readings(self) -> Mapping[str, Reading]:
        return {"relay": self._reading()}

    async def clients(self, query: Query) -> Clients:
        table, built_at = await self.table()
        return Clients(table.page(query), built_at)

    async def client(self, node_id: str, peer: str,
                     worker: int | None) -> list[Mapping[str, Any]]:
        return (await self.table())[0].records_of(node_id, peer)

    def snapshot(self) -> Sequence[Mapping[str, Any]] | None:
        return self._snapshot()


def local_source(serving: ServingContext,
                 snapshot: Callable[[], Sequence[Mapping[str, Any]] | None] = lambda: None
                 ) -> LocalSource:
    """The :class:`LocalSource` of a relay: its streams' ``/clients`` records,
    their count and its instruments (``serving``'s); ``snapshot`` (see
    :func:`relay.console.data.snapshot_views`)."""
    metrics = serving.metrics
    return LocalSource(serving.iter_client_statuses, lambda: relay_reading(
        lambda: len(serving.streams), metrics.downstream_pushes, metrics.downstream_nacks,
        metrics.push_latency, metrics.loop_lag), snapshot)


async def worker_answer(source: LocalSource, question: str, details: Mapping[str, Any]
                        ) -> object:
    """A worker's answer to one of the hub's :data:`QUESTIONS` (JSON)."""
    if question == "console_reading":
        return source.reading().to_json()
    table, built_at = await source.table()
    if question == "console_clients":
        try:
            query = Query.from_params(details.get("query", {}))
        except BadQuery:  # the hub checked it: a hub of another version
            return None
        return {"page": table.page(query, through=True).to_json(), "built_at": built_at}
    return table.records_of(str(details.get("node_id", "")), str(details.get("peer", "")))


#: Asks every worker a question with details; (worker index, answer or None).
Ask = Callable[[str, Mapping[str, Any]], Awaitable[Sequence[tuple[int, Any]]]]


class WorkersSource:
    """The workers' clients and readings, for the hub's console.

    ``ask`` puts one question to every worker; ``hub_reading`` is the hub's
    own (its memory and loop; its streams are the workers', not clients).
    A worker that does not answer is left out, and said to be.
    """

    def __init__(self, ask: Ask, hub_reading: Callable[[], Reading],
                 snapshot: Callable[[], Sequence[Mapping[str, Any]] | None] = lambda: None) -> None:
        self._ask = ask
        self._hub_reading = hub_reading
        self._snapshot = snapshot

    async def readings(self) -> Mapping[str, Reading]:
        readings = {"hub": self._hub_reading()}
        for worker, answer in await self._ask("console_reading", {}):
            if isinstance(answer, dict):
                readings[str(worker)] = Reading.from_json(answer)
        return readings

    async def clients(self, query: Query) -> Clients:
        pages: list[Page] = []
        workers: list[dict[str, Any]] = []
        built = []
        for worker, answer in await self._ask("console_clients", {"query": query.to_json()}):
            workers.append({"worker": worker, "answered": isinstance(answer, dict)})
            if isinstance(answer, dict):
                pages.append(with_worker(Page.from_json(answer["page"], query), worker))
                built.append(float(answer["built_at"]))
        # the oldest list merged: how far behind the page may be
        return Clients(merge_pages(pages, query), min(built, default=time.time()), workers)

    async def client(self, node_id: str, peer: str,
                     worker: int | None) -> list[Mapping[str, Any]]:
        records: list[Mapping[str, Any]] = []
        for index, answer in await self._ask("console_client",
                                             {"node_id": node_id, "peer": peer}):
            if isinstance(answer, list) and (worker is None or worker == index):
                records += [{"worker": index, **record} for record in answer
                            if isinstance(record, dict)]
        return records

    def snapshot(self) -> Sequence[Mapping[str, Any]] | None:
        return self._snapshot()


def hub_reading(metrics: Metrics) -> Reading:
    """The hub's own reading: its memory and its loop's lag (no clients of its own)."""
    return Reading(clients=0, rss=process_rss(), lag=tally(metrics.loop_lag))
