"""Work of many names is made in slices, the event loop serving others
between two, and the sliced result is the one made at once: a turn
(relay.turns), a fetch (its look-ups and its pages), a poll's JSON.
Counted, not timed."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
from collections.abc import Generator, Iterable
from typing import Any, TypeVar

import aiohttp
import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from google.rpc import status_pb2

from relay.cache import Update
from relay.config.values import Address
from relay.core import Core
from relay.demand import DemandLedger
from relay.interest import InterestChange
from relay.protocol.limits import DEFAULT_LIMITS
from relay.protocol.sotw import SotwResponsePlan
from relay.resource import CachedResource
from relay.server.fetch import Fetcher, Limited, Served, sorted_slices
from relay.server.plans import encode_plan
from relay.server.rest import RestServer, Unrenderable, render_json, render_json_slices
from relay.server.serving import ServingSettings
from relay.turns import Turn, give_turn, made, made_in_turns
from relay.xds_types import ENDPOINT, LISTENER
from tests.builders import endpoints, pack
from tests.clock import ManualClock
from tests.test_fetch_linear import request, setup

NAMES = 5_000
T = TypeVar("T")


class Turns:
    """A turn that counts, and gives the loop its turn (``give_turn``);
    ``ticks`` at each turn: what a task that runs whenever it can had done."""

    def __init__(self) -> None:
        self.ticks = 0
        self.seen: list[int] = []
        self._ticker: asyncio.Task[None] | None = None

    async def __call__(self) -> None:
        self.seen.append(self.ticks)
        await give_turn()

    async def _tick(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0)

    def __enter__(self) -> Turns:
        self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._ticker is not None
        self._ticker.cancel()

    def others_ran_between(self) -> bool:
        return all(later > earlier for earlier, later in itertools.pairwise(self.seen))


# ------------------------------------------------------------------------------ a turn


async def test_a_turn_lets_a_task_woken_by_a_timer_run_before_the_next_slice() -> None:
    # A timer due during a slice sets an event; its waiter is two steps from
    # it (the timer's callback, then the task): one sleep(0) lets both slices
    # run first, a turn does not.
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    order: list[str] = []

    async def waiter() -> None:
        await event.wait()
        order.append("waiter")

    def slices() -> Generator[None, None, str]:
        order.append("slice 1")
        loop.call_later(0, event.set)
        yield
        order.append("slice 2")
        return "made"

    task = loop.create_task(waiter())
    await asyncio.sleep(0)  # the waiter waits
    assert await made_in_turns(slices()) == "made"
    await task
    assert order == ["slice 1", "waiter", "slice 2"]


def test_made_makes_every_slice_at_once() -> None:
    def slices() -> Generator[None, None, int]:
        yield
        yield
        return 3

    assert made(slices()) == 3


# ------------------------------------------------------------------------------ a fetch


def names(count: int) -> list[str]:
    return [f"e{i:05d}" for i in range(count)]


async def fetched(per_slice: int, count: int = NAMES) -> tuple[Served, Turns]:
    core, _ = setup(names(count))
    fetcher = Fetcher(core.serving, ManualClock(), 60.0, 0.0, per_slice, turn := Turns())
    with turn:
        outcome = await fetcher.fetch(request(names(count)[::-1]), ENDPOINT,
                                      "ipv4:127.0.0.1:1")
    assert isinstance(outcome, Served)
    return outcome, turn


def encoded(served: Served) -> bytes:
    return encode_plan(dataclasses.replace(served.plan, nonce=""))


async def test_a_fetch_of_5000_names_is_made_in_slices_with_the_loop_run_between() -> None:
    outcome, turns = await fetched(per_slice=1_000)
    # before the request's checks, before each of the 5 slices it is
    # received in, before its lease is looked up, before it is registered,
    # 2 between its 3 pieces (2,000 names each at most), before the cache's
    # look-ups; 4 pauses in their 5,000 names; then one before each of 5 pages
    assert len(turns.seen) == 3 + 5 + 2 + 1 + 4 + 5
    assert turns.others_ran_between()
    assert len(outcome.plan.resources) == NAMES


async def test_a_fetch_made_in_small_slices_is_the_fetch_made_in_pages_to_the_byte() -> None:
    small, _ = await fetched(per_slice=700)
    paged, turns = await fetched(per_slice=2_500)
    assert len(turns.seen) == 3 + 2 + 2 + 1 + 1 + 5  # pages of NAMES_PER_PAGE
    assert encoded(small) == encoded(paged)
    assert small.plan.version_info == paged.plan.version_info


async def fetched_by(fetcher: Fetcher, asked: list[str]) -> Any:
    with Turns():
        return await fetcher.fetch(request(asked), ENDPOINT, "ipv4:127.0.0.1:1")


async def test_a_big_requests_slices_received_one_by_one_add_up_to_it_received_whole() -> None:
    asked = [*names(NAMES)[::-1], "e00007", "missing"]  # a name twice, one not cached
    core, _ = setup(names(NAMES))
    sliced = Fetcher(core.serving, ManualClock(), 60.0, 0.0, 1_000)
    whole = Fetcher(core.serving, ManualClock(), 60.0, 0.0, 10_000)
    in_slices, at_once = await fetched_by(sliced, asked), await fetched_by(whole, asked)
    assert (sliced.pieces_received, whole.pieces_received) == (6, 0)
    assert isinstance(in_slices, Served) and isinstance(at_once, Served)
    assert [lease.key for lease in sliced.leases()] == [lease.key for lease in whole.leases()]
    assert encoded(in_slices) == encoded(at_once)


@pytest.mark.parametrize(("limit", "value", "asked"), [
    ("names_per_request", NAMES - 1, names(NAMES)),
    ("names_per_stream", NAMES - 1, names(NAMES)),
    ("name_length", 10, [*names(NAMES), "e" * 11]),  # in the last slice
])
async def test_a_big_request_received_in_slices_is_refused_as_it_is_received_whole(
        limit: str, value: int, asked: list[str]) -> None:
    core = Core.create(settings=ServingSettings(limits=dataclasses.replace(
        DEFAULT_LIMITS, **{limit: value})), clock=ManualClock())
    sliced = Fetcher(core.serving, ManualClock(), 60.0, 0.0, 1_000)
    whole = Fetcher(core.serving, ManualClock(), 60.0, 0.0, 10_000)
    refused = await fetched_by(sliced, asked)
    assert isinstance(refused, Limited)
    assert refused == await fetched_by(whole, asked)
    assert refused.limit == limit
    assert sliced.leases() == []


async def test_a_fetch_of_one_slice_of_names_is_made_without_a_pause() -> None:
    outcome, turns = await fetched(per_slice=1_000, count=1_000)
    assert turns.seen == []
    assert len(outcome.plan.resources) == 1_000


@pytest.mark.parametrize("order", ["near sorted", "shuffled"])
def test_a_fetchs_names_are_sorted_in_slices_as_sorted_sorts_them_at_once(order: str) -> None:
    asked = [f"big-{i}" for i in range(25_000)] + ["big-7", "big-24999", "a", "a"]
    if order == "shuffled":
        random.Random(7).shuffle(asked)
    count, made_ = pauses(sorted_slices(asked, per_slice=10_000))
    # between the 3 slices of the 25,004 names deduplicated, before each of 3
    # slices of the 25,001 unique names sorted, and the merge
    assert count == 2 + 3 + 1
    assert made_ == sorted(set(asked))
    assert pauses(sorted_slices(asked[:10_000], per_slice=10_000)) == \
        (0, sorted(set(asked[:10_000])))


# ------------------------------------------------------------------------------ a poll's JSON


def plan_of(count: int, wrapped: int = 0, errors: int = 0) -> SotwResponsePlan:
    resources = [CachedResource.from_message(ENDPOINT, pack(endpoints(name, 1 + i % 3)),
                                             name, f"v{i}")
                 for i, name in enumerate(names(count))]
    return SotwResponsePlan(
        ENDPOINT, "9", "00000000000000aa", resources,
        frozenset(names(count)[:wrapped]),
        [discovery_pb2.ResourceError(resource_name={"name": f"bad-{i}"},
                                     error_detail=status_pb2.Status(code=5, message="gone"))
         for i in range(errors)])


def pauses(slices: Generator[None, None, T]) -> tuple[int, T]:
    count = 0
    while True:
        try:
            next(slices)
        except StopIteration as done:
            return count, done.value
        count += 1


@pytest.mark.parametrize(("wrapped", "errors"), [(0, 0), (40, 3)])
def test_a_big_answers_json_is_written_in_slices_and_is_the_json_written_at_once(
        wrapped: int, errors: int) -> None:
    plan = plan_of(1_000, wrapped, errors)
    count, body = pauses(render_json_slices(plan, per_slice=300))
    assert count == 3  # 1,000 resources, 300 a slice
    assert body == render_json(plan)


def test_a_small_answers_json_is_written_at_once() -> None:
    plan = plan_of(300)
    assert pauses(render_json_slices(plan, per_slice=300)) == (0, render_json(plan))


def test_a_sliced_answer_imports_the_types_its_nested_anys_hold_as_the_whole_does() -> None:
    manager = hcm_pb2.HttpConnectionManager(stat_prefix="ingress")
    resources = []
    for i in range(5):
        lst = listener_pb2.Listener(name=f"l{i}")
        lst.filter_chains.add().filters.add(name="hcm").typed_config.Pack(manager)
        resources.append(CachedResource.from_message(LISTENER, pack(lst), f"l{i}", "1"))
    plan = SotwResponsePlan(LISTENER, "1", "v", resources)
    assert pauses(render_json_slices(plan, per_slice=2)) == (2, render_json(plan))


def test_a_sliced_answer_of_a_type_no_module_describes_is_unrenderable() -> None:
    unknown = any_pb2.Any(type_url="type.googleapis.com/example.Unknown", value=b"\x08\x01")
    plan = SotwResponsePlan(ENDPOINT, "1", "v", [
        CachedResource.from_message(ENDPOINT, unknown, f"x{i}", "1") for i in range(3)])
    with pytest.raises(Unrenderable):
        made(render_json_slices(plan, per_slice=1))


async def test_a_first_poll_of_many_names_is_written_in_slices_and_renders_once() -> None:
    count = 1_200
    core, fetcher = setup(names(count))
    turns = Turns()
    rest = RestServer(core.serving, fetcher, Address("127.0.0.1", 0), render_slice=100,
                      turn=turns)
    port = await rest.start()
    body = json.dumps({"node": {"id": "n"}, "resourceNames": names(count)}).encode()
    url = f"http://127.0.0.1:{port}/v3/discovery:endpoints"
    try:
        with turns:
            async with aiohttp.ClientSession() as http:
                async with http.post(url, data=body) as reply:
                    assert reply.status == 200
                    first = await reply.read()
                rendered = len(turns.seen)
                other = body.replace(b'"id": "n"', b'"id": "m"')
                async with http.post(url, data=other) as reply:  # the same lease
                    assert (reply.status, await reply.read()) == (200, first)
    finally:
        await rest.stop()
    assert rendered == count // 100 - 1
    assert len(turns.seen) == rendered  # the second poll's JSON was the lease's
    assert turns.others_ran_between()
    outcome = await fetcher.fetch(discovery_pb2.DiscoveryRequest(
        node={"id": "n"}, resource_names=names(count)), ENDPOINT, "ipv4:127.0.0.1:2")
    assert isinstance(outcome, Served)
    assert first == render_json(outcome.plan)


# ------------------------------------------------------------------------------ a lease's key


async def test_polls_share_a_lease_only_when_names_and_their_parameters_are_the_same() -> None:
    # A lease is keyed by its names alone when all have the same parameters
    # (a set of strings, not of pairs: 50,000 names cost a third as much).
    _, fetcher = setup(names(4))
    plain = names(3)

    async def poll(params: dict[str, str] | None = None, node: str = "n",
                   locators: tuple[str, ...] = ()) -> None:
        request = discovery_pb2.DiscoveryRequest(node={"id": node}, resource_names=plain)
        if params is not None:
            request.node.dynamic_parameters[ENDPOINT].params.update(params)
        for name in locators:
            request.resource_locators.add(name=name).dynamic_parameters["v"] = "1"
        assert isinstance(await fetcher.fetch(request, ENDPOINT, "ipv4:127.0.0.1:1"), Served)

    await poll()
    await poll(node="another")  # the same names, the same (no) parameters
    assert len(fetcher.leases()) == 1
    await poll({"zone": "a"})
    await poll({"zone": "a"}, node="another")
    assert len(fetcher.leases()) == 2
    await poll({"zone": "b"})
    assert len(fetcher.leases()) == 3
    # one name with parameters of its own: each name with its own, another lease
    await poll(locators=("e00003",))
    await poll(locators=("e00003",), node="another")
    assert len(fetcher.leases()) == 4


# ------------------------------------------------------------------ a lease's registration


class Told:
    """The interest index's upward side: every name it said changed."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def interest_changed(self, type_url: str, names: Iterable[str]) -> None:
        self.names.update(names)

    def refetch(self, type_url: str, names: object) -> None:
        pass


def registering(count: int, upstream_names: int = 10**6, leases_per_host: int = 10,
                per_piece: int = 700, turn: Turn = give_turn
                ) -> tuple[Core, Fetcher, DemandLedger, Told, list[int]]:
    """A relay of ``count`` cached names whose index counts the names each
    call adds, the interest it reports and the demand it takes."""
    core = Core.create(settings=ServingSettings(limits=dataclasses.replace(
        DEFAULT_LIMITS, leases_per_host=leases_per_host)), clock=(clock := ManualClock()))
    core.cache.apply(ENDPOINT, Update([  # (the wildcard's answer too: a wildcard poll is served)
        CachedResource.from_message(ENDPOINT, pack(endpoints(name, 1)), name, "1")
        for name in names(count)], wildcard_answered=True))
    core.index.link(told := Told())
    core.index.limit_demand(ledger := DemandLedger(upstream_names, 10**6, clock.now))
    applied: list[int] = []
    apply = core.index.apply

    def counted(subscriber: Any, type_url: str, change: InterestChange, host: Any = None
                ) -> None:
        if change.added:  # (not what remove() takes back)
            applied.append(len(change.added))
        apply(subscriber, type_url, change, host)

    core.index.apply = counted  # type: ignore[method-assign]
    return core, Fetcher(core.serving, clock, 60.0, 0.0, 1_000, turn, per_piece), ledger, \
        told, applied


HOST = "ipv4:127.0.0.1"


def held(core: Core, ledger: DemandLedger, fetcher: Fetcher) -> tuple[object, ...]:
    index = core.index
    return (index.wanted_locators(ENDPOINT), index.upstream_names,
            [index.names_held(lease) for lease in fetcher.leases()],
            dict(ledger.held_by(HOST, ENDPOINT)), ledger.host_total(HOST))


async def poll(fetcher: Fetcher, asked: list[str], node: str = "n") -> object:
    return await fetcher.fetch(discovery_pb2.DiscoveryRequest(
        node={"id": node}, resource_names=asked), ENDPOINT, "ipv4:127.0.0.1:1")


@pytest.mark.parametrize("wildcard", [False, True])
async def test_a_big_lease_is_registered_in_pieces_and_the_index_ends_as_one_call_leaves_it(
        wildcard: bool) -> None:
    # a lease before it holds 1,500 of the names (held by two afterwards)
    made = []
    for per_piece in (700, 10**6):
        turns = Turns()
        core, fetcher, ledger, told, applied = registering(6_000, per_piece=per_piece,
                                                          turn=turns)
        with turns:
            assert isinstance(await poll(fetcher, names(1_500)[::-1], "a"), Served)
            asked = [*names(5_000)[::-1], *(["*"] if wildcard else [])]
            assert isinstance(await poll(fetcher, asked, "b"), Served)
        made.append((held(core, ledger, fetcher), told.names, applied, turns))
    (pieces, told, applied, turns), (whole, told_whole, applied_whole, _) = made
    assert pieces == whole
    assert told == told_whole == set(names(5_000))
    assert core.index.wants_wildcard(ENDPOINT) is wildcard
    assert applied_whole == [1_500, 5_000]
    assert applied == [700, 700, 100, *[700] * 7, 100]
    assert turns.others_ran_between()


async def test_polls_of_the_same_names_while_its_lease_is_registered_share_it() -> None:
    turns = Turns()
    core, fetcher, ledger, _, applied = registering(5_000, leases_per_host=1, turn=turns)
    with turns:
        outcomes = await asyncio.gather(*(poll(fetcher, names(5_000), node)
                                          for node in ("a", "b", "c")))
    [lease] = fetcher.leases()
    assert all(isinstance(o, Served) and o.lease is lease for o in outcomes)
    assert applied == [700] * 7 + [100]  # registered once
    assert held(core, ledger, fetcher)[1:] == (5_000, [5_000], dict.fromkeys(names(5_000), 1),
                                               5_000)
    fetcher.close()
    assert core.index.upstream_names == 0  # nothing else held them
    assert core.index.wanted_types() == []


async def test_a_big_lease_beyond_the_upstream_demand_is_refused_whole_holding_nothing() -> None:
    core, fetcher, ledger, _, applied = registering(5_000, upstream_names=3_000,
                                                    leases_per_host=1, per_piece=1_000)
    outcome = await poll(fetcher, names(5_000))
    assert outcome == Limited("upstream_names", (
        "subscribing 5000 more names would have the relay ask its origin for 5000, more "
        "than it may (limits.upstream_names: 3000)"))
    # three pieces taken, the fourth refused, the whole checked again (and refused)
    assert applied == [1_000] * 4 + [5_000]
    assert held(core, ledger, fetcher) == ({}, 0, [], {}, 0)
    # the host's one lease was given back: another may be taken
    assert isinstance(await poll(fetcher, names(3_000)), Served)
    assert held(core, ledger, fetcher)[1:] == (3_000, [3_000], dict.fromkeys(names(3_000), 1),
                                               3_000)


async def test_a_poll_cancelled_while_its_lease_is_registered_leaves_nothing_held() -> None:
    task: asyncio.Task[object] | None = None
    turns = 0

    async def turn() -> None:
        nonlocal turns
        turns += 1
        if turns == 10:  # (5 before the request's 5 slices) between the 2nd piece and the 3rd
            assert task is not None
            task.cancel()
        await give_turn()

    core, fetcher, ledger, _, applied = registering(5_000, leases_per_host=1, turn=turn)
    task = asyncio.get_running_loop().create_task(poll(fetcher, names(5_000)))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert applied == [700, 700]
    assert held(core, ledger, fetcher) == ({}, 0, [], {}, 0)
    assert isinstance(await poll(fetcher, names(5_000)), Served)  # the host may again
