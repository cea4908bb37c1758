"""One-shot fetches (gRPC Fetch* and REST polls) against a real cache and
interest index, with no network: what they subscribe, how long they wait,
when their lease lapses. Time is a :class:`ManualClock`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import Update
from relay.constraints import EMPTY_PARAMS
from relay.core import Core
from relay.protocol.limits import DEFAULT_LIMITS, Limits
from relay.protocol.sotw import state_version
from relay.protocol.subscription import MAX_NAMES_PER_RESPONSE
from relay.resource import CachedResource
from relay.server.fetch import Fetcher, Limited, Served, Unanswered, Unavailable, unanswered
from relay.server.serving import ServingSettings
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints, pack
from tests.clock import ManualClock
from tests.protocol.fakes import FakeView

SOTW = discovery_pb2.DiscoveryRequest


class Up:
    """The upstream, as the index sees it: records what it is told."""

    def __init__(self) -> None:
        self.changed: list[tuple[str, list[str]]] = []
        self.refetched: list[tuple[str, frozenset[str]]] = []

    def interest_changed(self, type_url: str, names: Iterable[str]) -> None:
        self.changed.append((type_url, sorted(names)))

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        self.refetched.append((type_url, names))


def setup(lease: float = 60.0, wait: float = 0.5, limits: Limits = DEFAULT_LIMITS
          ) -> tuple[Core, Fetcher, Up, ManualClock]:
    clock = ManualClock()
    core = Core.create(settings=ServingSettings(limits=limits), clock=clock)
    up = Up()
    core.index.link(up)
    return core, Fetcher(core.serving, clock, lease, wait), up, clock


def load(name: str, port: int = 1, do_not_cache: bool = False) -> CachedResource:
    resource = CachedResource.from_message(ENDPOINT, pack(endpoints(name, port)), name, f"v{port}")
    if do_not_cache:
        resource.resource.cache_control.do_not_cache = True
    return resource


def fetch(fetcher: Fetcher, *names: str, type_url: str = ENDPOINT,
          peer: str = "ipv4:127.0.0.1:1") -> asyncio.Task[object]:
    request = SOTW(node={"id": "n"}, resource_names=list(names))
    return asyncio.ensure_future(fetcher.fetch(request, type_url, peer))


async def until_waiting(clock: ManualClock) -> None:
    """Until a fetch waits on ``clock`` (its sleep starts a turn or two later)."""
    for _ in range(100):
        if clock.sleepers():
            return
        await asyncio.sleep(0)
    raise AssertionError("nothing waits on the clock")


def served_names(outcome: object) -> list[str]:
    assert isinstance(outcome, Served), outcome
    return [r.name for r in outcome.plan.resources]


async def test_a_fetch_subscribes_what_it_asks_and_answers_once_the_cache_has_it() -> None:
    core, fetcher, up, _ = setup()
    task = fetch(fetcher, "e1", "e2")
    await asyncio.sleep(0)
    assert core.index.wanted_locators(ENDPOINT) == {"e1": {EMPTY_PARAMS},
                                                    "e2": {EMPTY_PARAMS}}
    assert up.changed == [(ENDPOINT, ["e1", "e2"])]
    core.cache.apply(ENDPOINT, Update(upserts=[load("e1")]))
    await asyncio.sleep(0)
    assert not task.done()  # e2 not answered yet
    core.cache.apply(ENDPOINT, Update(upserts=[load("e2")]))
    assert served_names(await task) == ["e1", "e2"]


async def test_names_said_not_to_exist_are_left_out_and_none_left_is_an_empty_answer(
        ) -> None:
    core, fetcher, _, _ = setup()
    task = fetch(fetcher, "e1", "gone")
    await asyncio.sleep(0)
    core.cache.apply(ENDPOINT, Update(upserts=[load("e1")], removed=["gone"]))
    assert served_names(await task) == ["e1"]
    outcome = await fetch(fetcher, "gone")
    assert isinstance(outcome, Served)
    assert (outcome.plan.resources, outcome.plan.version_info) == ([], "0000000000000000")


async def test_polls_of_the_same_resources_share_one_lease_renewed_by_each() -> None:
    core, fetcher, up, clock = setup()
    core.cache.apply(ENDPOINT, Update(upserts=[load("e1")]))
    await fetch(fetcher, "e1")
    await clock.advance(30)
    await fetch(fetcher, "e1")
    [lease] = fetcher.leases()
    assert lease.expires == clock.now() + 60
    assert up.changed == [(ENDPOINT, ["e1"])]  # the second poll changed nothing upstream


async def test_a_lease_lapses_its_lease_after_the_last_poll_on_the_relays_clock() -> None:
    core, fetcher, up, clock = setup()
    core.cache.apply(ENDPOINT, Update(upserts=[load("e1"), load("e2")]))
    await fetch(fetcher, "e1")
    await clock.advance(40)
    await fetch(fetcher, "e1")   # renewed: now + 60
    await fetch(fetcher, "e2")   # another set: a lease of its own
    await clock.advance(59)
    assert core.index.wanted_locators(ENDPOINT).keys() == {"e1", "e2"}
    await clock.advance(1)
    assert core.index.wanted_locators(ENDPOINT) == {}
    assert fetcher.leases() == []
    assert up.changed[-2:] == [(ENDPOINT, ["e1"]), (ENDPOINT, ["e2"])]


async def test_nothing_in_time_is_unavailable_and_the_next_poll_does_not_wait_again() -> None:
    core, fetcher, _, clock = setup(wait=0.5)
    core.cache.apply(ENDPOINT, Update(upserts=[load("other")]))  # synced, e1 unknown
    task = fetch(fetcher, "e1")
    await until_waiting(clock)
    await clock.advance(0.25)
    assert not task.done()
    await clock.advance(0.25)
    outcome = await task
    assert outcome == Unavailable(
        "the relay has not yet received 1 of these ClusterLoadAssignment resources from its "
        "origin (the first: 'e1'); it has subscribed to them: ask again shortly")
    # The origin had its chance: a poll of the same lease answers at once.
    assert isinstance(await fetch(fetcher, "e1"), Unavailable)


async def test_after_the_wait_what_the_origin_sent_is_answered() -> None:
    core, fetcher, _, clock = setup(wait=0.5)
    task = fetch(fetcher, "e1", "e2")
    await until_waiting(clock)
    core.cache.apply(ENDPOINT, Update(upserts=[load("e1")]))
    await until_waiting(clock)
    await clock.advance(0.5)
    assert served_names(await task) == ["e1"]


async def test_a_full_state_type_is_not_answered_while_a_name_is_unknown() -> None:
    core, fetcher, _, clock = setup()
    body = CachedResource.from_message(CLUSTER, pack(cluster("a")), "a", "1")
    core.cache.apply(CLUSTER, Update(upserts=[body]))
    task = fetch(fetcher, "a", "b", type_url=CLUSTER)
    await until_waiting(clock)
    await clock.advance(0.5)
    assert isinstance(await task, Unavailable)  # absence would mean deletion


async def test_a_wildcard_fetch_waits_for_the_complete_set() -> None:
    core, fetcher, _, _ = setup()
    a = CachedResource.from_message(CLUSTER, pack(cluster("a")), "a", "1")
    core.cache.apply(CLUSTER, Update(upserts=[a]))  # synced through a name, not complete
    task = fetch(fetcher, type_url=CLUSTER)
    await asyncio.sleep(0)
    assert core.index.wants_wildcard(CLUSTER)
    assert not task.done()
    b = CachedResource.from_message(CLUSTER, pack(cluster("b")), "b", "1")
    core.cache.apply(CLUSTER, Update(upserts=[b], complete=True))
    assert served_names(await task) == ["a", "b"]


async def test_a_do_not_cache_copy_cached_before_the_fetch_is_fetched_afresh() -> None:
    core, fetcher, up, _ = setup()
    core.cache.apply(ENDPOINT, Update(upserts=[load("e1", 1, do_not_cache=True)]))
    task = fetch(fetcher, "e1")
    await asyncio.sleep(0)
    assert up.refetched == [(ENDPOINT, frozenset({"e1"}))]
    core.cache.apply(ENDPOINT, Update(upserts=[load("e1", 2, do_not_cache=True)]))
    outcome = await task
    assert isinstance(outcome, Served)
    assert [r.version for r in outcome.plan.resources] == ["v2"]


async def test_more_names_than_one_stream_response_takes_are_answered_in_one() -> None:
    core, fetcher, _, _ = setup()
    names = [f"e{i:04}" for i in range(MAX_NAMES_PER_RESPONSE + 500)]
    core.cache.apply(ENDPOINT, Update(upserts=[load(name) for name in names]))
    outcome = await fetch(fetcher, *names)
    assert isinstance(outcome, Served)
    assert served_names(outcome) == names
    assert outcome.plan.version_info == state_version({r.name: r for r in
                                                        outcome.plan.resources})


async def test_leases_beyond_limits_streams_are_refused() -> None:
    core, fetcher, _, _ = setup(limits=Limits(streams=1))
    core.cache.apply(ENDPOINT, Update(upserts=[load("e1"), load("e2")]))
    await fetch(fetcher, "e1")
    assert await fetch(fetcher, "e2") == Limited(
        "streams", "the relay holds 1 polling subscriptions, its most (limits.streams); "
                   "poll another replica")
    assert isinstance(await fetch(fetcher, "e1"), Served)  # its lease is held already


async def test_leases_beyond_limits_leases_per_host_are_refused_that_host_only() -> None:
    core, fetcher, _, clock = setup(limits=Limits(leases_per_host=2))
    core.cache.apply(ENDPOINT, Update(upserts=[load("e1"), load("e2"), load("e3")]))
    await fetch(fetcher, "e1")
    await fetch(fetcher, "e2", peer="ipv4:127.0.0.1:2")  # another port, the same host
    assert await fetch(fetcher, "e3") == Limited(
        "leases_per_host", "ipv4:127.0.0.1 keeps 2 polled resource sets subscribed, the most "
        "one client host may (limits.leases_per_host); each lapses rest.lease after its last "
        "poll")
    assert isinstance(await fetch(fetcher, "e1"), Served)  # its lease is held already
    assert isinstance(await fetch(fetcher, "e3", peer="ipv4:10.0.0.9:1"), Served)
    # Once a lease of the host lapses, it has room again.
    await clock.advance(fetcher.lease + 1)
    assert fetcher.leases() == []
    assert isinstance(await fetch(fetcher, "e3"), Served)


async def test_close_drops_every_lease() -> None:
    core, fetcher, _, _ = setup()
    core.cache.apply(ENDPOINT, Update(upserts=[load("e1")]))
    await fetch(fetcher, "e1")
    await fetcher.aclose()
    assert core.index.wanted_locators(ENDPOINT) == {}


# -- what the cache cannot answer yet: no I/O ---------------------------------------------


def test_unanswered_names_are_the_unknown_ones_without_an_error() -> None:
    view = FakeView(ENDPOINT, {"a": "1"})
    view.delete("gone")
    view.errors["bad"] = discovery_pb2.ResourceError()
    wanted = dict.fromkeys(["a", "gone", "bad", "new"], EMPTY_PARAMS)
    assert unanswered(view, ENDPOINT, wanted, False, False, 0) == \
        Unanswered(frozenset({"new"}), frozenset())


def test_before_the_type_is_synced_everything_is_unanswered() -> None:
    view = FakeView(ENDPOINT, {"a": "1"})
    view.synced = False
    assert unanswered(view, ENDPOINT, {"a": EMPTY_PARAMS}, True, True, 0).missing == \
        {"a", "*"}


def test_a_wildcard_is_unanswered_until_the_cache_holds_its_set() -> None:
    view = FakeView(CLUSTER, {"a": "1"})
    assert unanswered(view, CLUSTER, {}, True, False, 0).missing == {"*"}
    assert not unanswered(view, CLUSTER, {}, True, True, 0)
