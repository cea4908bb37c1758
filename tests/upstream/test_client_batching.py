"""UpstreamClient batches what clients ask of the origin over the batch window.

No network: the client is wired as the relay wires it (:meth:`Core.follow`)
but never run; a state that records what it was asked to send stands in for
the stream, and a :class:`ManualClock` decides when the window closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Generator

from envoy.config.core.v3 import base_pb2

from relay.cache import ResourceCache
from relay.core import Core
from relay.interest import Interest, InterestIndex
from relay.server.serving import ServingSettings
from relay.upstream.backoff import Backoff
from relay.upstream.client import MAX_NAMES_PER_TURN, UpstreamClient
from relay.upstream.dial import Dialer
from relay.upstream.requests import Request
from relay.upstream.state import Demand, UpstreamState
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster
from tests.clock import ManualClock
from tests.upstream.test_upstream_state import Sub, receive, response

# A power of two: halves of it add up exactly on the clock.
WINDOW = 0.25


class RecordingState(UpstreamState):
    """An UpstreamState that keeps every request it gives the client to send
    for interest changes and refetches."""

    def __init__(self, cache: ResourceCache) -> None:
        super().__init__(base_pb2.Node(id="relay"), cache)
        self.sent: list[Request] = []

    def on_interest_changed(self, type_url: str, demand: Demand, now: float,
                            names: Collection[str] | None = None) -> list[Request]:
        requests = super().on_interest_changed(type_url, demand, now, names)
        self.sent += requests
        return requests

    def on_refetch(self, type_url: str, names: frozenset[str]) -> list[Request]:
        requests = super().on_refetch(type_url, names)
        self.sent += requests
        return requests


def make(window: float = WINDOW
         ) -> tuple[UpstreamClient, RecordingState, InterestIndex, ManualClock]:
    """A client following an origin it never dials, on a stream taken as open."""
    clock = ManualClock()
    core = Core.create(settings=ServingSettings(batch_window=window), clock=clock)
    state = RecordingState(core.cache)
    client = core.follow(Dialer("127.0.0.1:1"), state, Backoff())
    state.on_connect(core.index, clock.now())
    return client, state, core.index, clock


def subscribed(request: Request) -> list[str]:
    return sorted(request.resource_names_subscribe)


def unsubscribed(request: Request) -> list[str]:
    return sorted(request.resource_names_unsubscribe)


async def test_the_window_is_the_servers_batch_window() -> None:
    client, _, _, _ = make(0.005)
    assert client.batch_window == 0.005


async def test_changes_within_a_window_are_one_request_when_it_closes() -> None:
    _, state, index, clock = make()
    subs = [Sub() for _ in range(10)]
    for i, sub in enumerate(subs):
        index.update(sub, ENDPOINT, Interest(frozenset({f"e{i}", "shared"})))
    await clock.advance(WINDOW / 2)
    for sub in subs[5:]:
        index.remove(sub)  # later changes join the open window
    await clock.advance(WINDOW / 2 - 0.001)
    assert state.sent == []  # still open
    await clock.advance(0.001)
    [request] = state.sent
    assert subscribed(request) == ["e0", "e1", "e2", "e3", "e4", "shared"]
    assert unsubscribed(request) == []


async def test_a_name_subscribed_and_unsubscribed_within_a_window_costs_nothing() -> None:
    _, state, index, clock = make()
    sub = Sub()
    index.update(sub, ENDPOINT, Interest(frozenset({"a"})))
    index.update(sub, ENDPOINT, Interest())
    await clock.advance(WINDOW)
    assert state.sent == []
    assert not state.subscription_counts()


async def test_changes_to_two_types_are_one_request_each() -> None:
    _, state, index, clock = make()
    for i in range(3):
        index.update(Sub(), ENDPOINT, Interest(frozenset({f"e{i}"})))
        index.update(Sub(), CLUSTER, Interest(frozenset({f"c{i}"})))
    await clock.advance(WINDOW)
    assert sorted((r.type_url, subscribed(r)) for r in state.sent) == [
        (CLUSTER, ["c0", "c1", "c2"]), (ENDPOINT, ["e0", "e1", "e2"])]


async def test_a_change_after_the_window_closed_opens_a_new_one() -> None:
    _, state, index, clock = make()
    sub = Sub()
    index.update(sub, ENDPOINT, Interest(frozenset({"a"})))
    await clock.advance(WINDOW)
    assert [subscribed(r) for r in state.sent] == [["a"]]
    await clock.advance(10.0)  # a quiet spell
    index.update(sub, ENDPOINT, Interest(frozenset({"b"})))
    await clock.advance(WINDOW - 0.125)
    assert len(state.sent) == 1  # not at once: a new window opened
    await clock.advance(0.125)
    [_, request] = state.sent
    assert subscribed(request) == ["b"] and unsubscribed(request) == ["a"]


async def test_the_origin_gets_at_most_one_change_per_type_per_window() -> None:
    _, state, index, clock = make()
    sub = Sub()
    for step in range(40):  # churn: a new name every eighth of a window
        index.update(sub, ENDPOINT, Interest(frozenset({f"e{step}"})))
        await clock.advance(WINDOW / 8)
    await clock.advance(WINDOW)
    assert len(state.sent) == 40 // 8
    assert [subscribed(r) for r in state.sent][-1] == ["e39"]


async def test_refetches_join_the_window() -> None:
    _, state, index, clock = make()
    index.update(Sub(), CLUSTER, Interest(frozenset({"a", "b"})))
    await clock.advance(WINDOW)
    receive(state, response(CLUSTER, "1", ("a", "1", cluster("a")),
                            ("b", "1", cluster("b"))), index, clock.now())
    state.sent.clear()
    index.request_refetch(CLUSTER, frozenset({"a"}))
    index.request_refetch(CLUSTER, frozenset({"b"}))
    await clock.advance(WINDOW / 2)
    assert state.sent == []
    await clock.advance(WINDOW / 2)
    [request] = state.sent
    assert subscribed(request) == ["a", "b"]


async def test_a_batch_too_large_for_one_turn_goes_on_at_once_not_after_another_window(
) -> None:
    _, state, index, clock = make()
    names = frozenset(f"e{i:05d}" for i in range(MAX_NAMES_PER_TURN * 2 + 10))
    index.update(Sub(), ENDPOINT, Interest(names))
    await clock.advance(WINDOW)  # closes the window; lets a few turns run
    assert {n for r in state.sent for n in r.resource_names_subscribe} == names
    assert len(state.sent) == 3  # one per turn of the event loop
    assert clock.sleepers() == []  # no window waits


async def test_without_a_window_changes_go_in_the_next_turn_of_the_event_loop() -> None:
    _, state, index, clock = make(0.0)
    sub = Sub()
    index.update(sub, ENDPOINT, Interest(frozenset({"a"})))
    index.update(sub, ENDPOINT, Interest(frozenset({"a", "b"})))  # the same turn: coalesced
    assert state.sent == []
    await clock.advance(0)  # lets the loop turn, moves no time
    [request] = state.sent
    assert subscribed(request) == ["a", "b"]
    index.update(sub, ENDPOINT, Interest(frozenset({"a"})))
    await clock.advance(0)
    assert unsubscribed(state.sent[-1]) == ["b"]


async def test_pieces_of_work_in_steps_are_made_one_at_a_time_interest_changes_after() -> None:
    """The timer's settle and the reader's response may both be made in steps
    at once: the second waits for the first, and a client's change that
    comes meanwhile reaches the state only once the state is free."""
    client, state, index, clock = make(0.0)
    log: list[tuple[str, object, int]] = []

    def work(label: str, pauses: int) -> Generator[None, None, str]:
        for step in range(pauses):
            log.append((label, step, len(state.sent)))
            if (label, step) == ("tick", 0):
                index.update(Sub(), ENDPOINT, Interest(frozenset({"late"})))
            yield
        log.append((label, "done", len(state.sent)))
        return label

    made = await asyncio.gather(client._in_steps(work("tick", 3)),
                                client._in_steps(work("response", 2)))
    await clock.advance(0)
    assert made == ["tick", "response"]
    assert log == [("tick", 0, 0), ("tick", 1, 0), ("tick", 2, 0), ("tick", "done", 0),
                   ("response", 0, 1), ("response", 1, 1), ("response", "done", 1)]
    assert subscribed(state.sent[0]) == ["late"]
