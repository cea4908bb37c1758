"""Where the console's clients come from: built in chunks, shared, not too often;
merged from the workers of --workers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from relay.console.clients import Query
from relay.console.history import Reading
from relay.console.source import DUTY, MIN_AGE, LocalSource, WorkersSource, worker_answer
from tests.console.test_clients import record


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def source_of(records: list[dict[str, Any]], clock: Clock | None = None,
              chunk: int = 200) -> tuple[LocalSource, list[int]]:
    """A source over ``records``, and the list of each build's start (how many builds)."""
    builds: list[int] = []

    def taken() -> Iterator[dict[str, Any]]:
        builds.append(len(builds))
        yield from records

    return LocalSource(taken, lambda: Reading(len(records), 0), clock=clock or Clock(),
                       chunk=chunk), builds


async def test_the_list_is_built_in_chunks_letting_the_loop_run() -> None:
    turns = 0
    building = True

    async def other_work() -> None:
        nonlocal turns
        while building:
            turns += 1
            await asyncio.sleep(0)

    records = [record(f"n{i}", cds="synced") for i in range(1000)]
    source, _ = source_of(records, chunk=100)
    worker = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    turns = 0
    clients = await source.clients(Query(limit=5))
    building = False
    await worker
    assert clients.page.total == 1000
    assert turns >= 10  # one turn after each of the ten chunks


async def test_consoles_asking_at_once_share_one_build() -> None:
    source, builds = source_of([record("a", cds="synced")])
    pages = await asyncio.gather(*(source.clients(Query()) for _ in range(5)))
    assert len(builds) == 1 and {p.page.total for p in pages} == {1}


async def test_the_list_is_reused_until_old_enough() -> None:
    clock = Clock()
    source, builds = source_of([record("a", cds="synced")], clock)
    await source.clients(Query())
    clock.now += MIN_AGE / 2
    await source.clients(Query())
    assert len(builds) == 1
    clock.now += MIN_AGE
    await source.clients(Query())
    assert len(builds) == 2


async def test_a_costly_list_is_built_again_only_within_the_duty() -> None:
    clock = Clock()
    costly = 2.0  # seconds of the loop per build

    def taken() -> Iterator[dict[str, Any]]:
        clock.now += costly
        yield record("a", cds="synced")

    source = LocalSource(taken, lambda: Reading(1, 0), clock=clock)
    started = clock.now
    await source.clients(Query())
    assert source.build_cost == costly
    # builds start costly / DUTY apart: the loop spends DUTY of its time on them
    clock.now = started + costly / DUTY - 1
    await source.clients(Query())
    assert source.age() == costly / DUTY - 1  # the same list
    clock.now = started + costly / DUTY
    await source.clients(Query())
    assert source.age() == costly  # a new one, its age counted from its start


async def test_a_worker_answers_the_hub_s_questions() -> None:
    source, _ = source_of([record("b", cds="synced"), record("a", cds="nacked", nack_cds="x")])
    query = Query(limit=1, offset=1)
    answer = await worker_answer(source, "console_clients", {"query": query.to_json()})
    assert isinstance(answer, dict)
    assert [row["node_id"] for row in answer["page"]["rows"]] == ["a", "b"]  # through the end
    assert await worker_answer(source, "console_client",
                               {"node_id": "a", "peer": "ipv4:10.0.0.1:1"}) == [
        record("a", cds="nacked", nack_cds="x")]
    assert await worker_answer(source, "console_reading", {}) == Reading(2, 0).to_json()
    assert await worker_answer(source, "console_clients", {"query": {"sort": "age"}}) is None


async def test_the_hub_merges_the_workers_and_says_who_did_not_answer() -> None:
    one, _ = source_of([record("a", cds="synced"), record("c", cds="nacked", nack_cds="no")])
    two, _ = source_of([record("b", cds="stale")])

    async def ask(question: str, details: Mapping[str, Any]) -> Sequence[tuple[int, Any]]:
        return [(1, await worker_answer(one, question, details)),
                (2, await worker_answer(two, question, details)), (3, None)]

    hub = WorkersSource(ask, lambda: Reading(0, 7))
    clients = await hub.clients(Query())
    assert [(row.node_id, row.worker) for row in clients.page.rows] == [
        ("c", 1), ("b", 2), ("a", 1)]
    assert clients.workers == [{"worker": 1, "answered": True},
                               {"worker": 2, "answered": True},
                               {"worker": 3, "answered": False}]
    readings = await hub.readings()
    assert readings == {"hub": Reading(0, 7), "1": Reading(2, 0), "2": Reading(1, 0)}
    assert await hub.client("b", "ipv4:10.0.0.1:1", 2) == [{"worker": 2,
                                                           **record("b", cds="stale")}]
    assert await hub.client("b", "ipv4:10.0.0.1:1", 1) == []
