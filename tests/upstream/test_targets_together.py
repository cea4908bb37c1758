"""Targets: a leaving client's names let go, linger and end together, as the
loop does them one by one; and a linger ending a slice at a time.

A client of many plain names leaving reaches the targets a slice at a time,
each slice's names alike (nobody wants them, each subscribed plain), and
later their linger ends together. ``relay.upstream.targets``'s whole-set
paths (``_let_go_together``, ``_wanted_only``, ``_all_ended``,
``_replace_together``; ``_subscribe_together`` and ``_joining_together``
for a big client joining) do such a slice with a few operations on the whole
set. Each scenario here runs with them and with the loops alone, and must
give the same changes for the origin, the same subscriptions, the same
lingering names and the same cache after every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from relay.cache import ResourceCache, Update
from relay.constraints import EMPTY_PARAMS, Params, params_of
from relay.interest import InterestChange, InterestIndex
from relay.upstream import targets as targets_module
from relay.upstream.deadlines import Deadlines
from relay.upstream.requests import SubscriptionChange
from relay.upstream.targets import ENDING_PER_TICK, Lingering, Targets
from relay.xds_types import CLUSTER, ENDPOINT
from tests.test_interest import Sub

N = 3_000
NAMES = [f"e{i:05d}" for i in range(N)]
CANARY = params_of({"env": "canary"})


class Relay:
    """The index and the targets, driven as the relay drives them: the index
    tells which names changed, the targets sync them; a leave a slice of
    1,000 names at a time; ticks until nothing more is due."""

    def __init__(self, linger: float = 30.0, linger_names: int | None = None) -> None:
        self.cache, self.index, self.deadlines = ResourceCache(), InterestIndex(), Deadlines()
        self.targets = Targets(self.cache, linger, self.deadlines, linger_names)
        self.touched: set[str] = set()
        self.index.link(self)
        self.subs = [Sub() for _ in range(3)]
        self.changes: list[Any] = []
        self.states: list[Any] = []

    def interest_changed(self, type_url: str, names: Iterable[str]) -> None:
        self.touched.update(names)

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        pass

    def _sync(self, now: float) -> None:
        touched, self.touched = self.touched, set()
        names = self.targets.interest_changed(ENDPOINT, self.index, now, touched)
        self._record(self.targets.sync(ENDPOINT, self.index, now, names))

    def _record(self, change: SubscriptionChange) -> None:
        self.changes.append((list(change.subscribe.items()), list(change.unsubscribe.items())))
        # what the origin was told it has: the cache knows it absent
        self.cache.apply(ENDPOINT, Update(removed=sorted(change.subscribe)))
        self.states.append(self.state())

    def join(self, who: int, names: list[str], now: float, params: Params = EMPTY_PARAMS) -> None:
        self.index.apply(self.subs[who], ENDPOINT,
                         InterestChange(added=dict.fromkeys(names, params)))
        self._sync(now)

    def leave(self, who: int, now: float) -> None:
        while not self.index.remove(self.subs[who], 1_000):
            self._sync(now)
        self._sync(now)

    def tick(self, now: float) -> None:
        while (due := self.deadlines.next(self.targets.lingering.stands)) is not None \
                and due <= now:
            self.deadlines.drop_due(now)
            for type_url, names in self.targets.lingering.due(now):
                self._record(self.targets.sync(type_url, self.index, now, names))

    def state(self) -> Any:
        sub = self.targets.subscription(ENDPOINT)
        return (None if sub is None else dict(sub.locators),
                sorted(self.targets.lingering.entries(ENDPOINT)),
                self.targets.lingering.count(), sorted(self.cache.names(ENDPOINT)))


Scenario = Callable[[Relay], None]


def last_leaves(relay: Relay) -> None:
    relay.join(0, NAMES, 0.0)
    relay.leave(0, 1.0)
    relay.tick(31.0)


def one_of_two_leaves(relay: Relay) -> None:
    relay.join(0, NAMES, 0.0)
    relay.join(1, NAMES, 0.0)
    relay.leave(1, 1.0)
    relay.leave(0, 2.0)
    relay.tick(40.0)


def some_still_wanted(relay: Relay) -> None:
    relay.join(0, NAMES, 0.0)
    relay.join(1, NAMES[:100] + NAMES[2_500:2_510], 0.0)
    relay.leave(0, 1.0)
    relay.tick(40.0)


def with_parameters(relay: Relay) -> None:
    relay.join(0, NAMES, 0.0)
    relay.join(1, NAMES[:1_500], 0.0, CANARY)
    relay.leave(1, 1.0)
    relay.leave(0, 10.0)
    relay.tick(31.0)
    relay.tick(50.0)


def wanted_again(relay: Relay) -> None:
    relay.join(0, NAMES, 0.0)
    relay.leave(0, 1.0)
    relay.join(1, NAMES[:10] + NAMES[1_990:2_010], 5.0)
    relay.tick(31.0)
    relay.leave(1, 32.0)
    relay.tick(70.0)


def let_go_again(relay: Relay) -> None:
    relay.join(0, NAMES, 0.0)
    relay.leave(0, 1.0)
    relay.join(1, NAMES[500:700], 5.0)
    relay.leave(1, 10.0)  # these linger from 10 s on
    relay.tick(31.0)
    relay.tick(40.0)


def cut_by_the_bound(relay: Relay) -> None:
    relay.join(0, NAMES, 0.0)
    relay.join(1, [f"other-{i}" for i in range(500)], 0.0)
    relay.leave(1, 1.0)
    relay.leave(0, 10.0)
    relay.tick(10.0)
    relay.tick(40.0)


def no_linger(relay: Relay) -> None:
    relay.join(0, NAMES, 0.0)
    relay.join(1, NAMES[:10], 0.0)
    relay.leave(0, 1.0)
    relay.leave(1, 2.0)


SCENARIOS: dict[str, tuple[Scenario, dict[str, Any]]] = {
    "the last client leaves": (last_leaves, {}),
    "one of two leaves, then the other": (one_of_two_leaves, {}),
    "some still wanted by another": (some_still_wanted, {}),
    "names with parameters": (with_parameters, {}),
    "some wanted again within the linger": (wanted_again, {}),
    "some let go again later": (let_go_again, {}),
    "the bound cuts the oldest": (cut_by_the_bound, {"linger_names": 1_200}),
    "no linger": (no_linger, {"linger": 0.0}),
}


def loops_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(targets_module, "_let_go_together", lambda *args: None)
    monkeypatch.setattr(targets_module, "_wanted_only", lambda *args: None)
    monkeypatch.setattr(targets_module, "_all_ended", lambda *args: False)
    monkeypatch.setattr(targets_module, "_replace_together", lambda *args: None)
    monkeypatch.setattr(targets_module, "_subscribe_together", lambda *args: None)
    monkeypatch.setattr(targets_module, "_joining_together", lambda *args: None)
    monkeypatch.setattr(InterestIndex, "wanted_among", one_by_one)


def one_by_one(self: InterestIndex, type_url: str, names: Iterable[str]) -> list[Any]:
    """InterestIndex.wanted_among as wanted_params name by name."""
    return [self.wanted_params(type_url, name) for name in names]


def played(name: str) -> Relay:
    scenario, options = SCENARIOS[name]
    relay = Relay(**options)
    scenario(relay)
    return relay


@pytest.mark.parametrize("name", SCENARIOS)
def test_whole_sets_leave_what_the_loops_leave(name: str, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    together = played(name)
    loops_only(monkeypatch)
    alone = played(name)
    assert together.changes == alone.changes
    assert together.states == alone.states
    assert together.targets.subscription(ENDPOINT) is None or name == "some still wanted by another"


def counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """What each call of the module's ``name`` returned."""
    results: list[Any] = []
    original = getattr(targets_module, name)

    def counting(*args: Any) -> Any:
        results.append(original(*args))
        return results[-1]

    monkeypatch.setattr(targets_module, name, counting)
    return results


def asked_of(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names the targets ask the demand about, one by one or together."""
    asked: list[str] = []
    one, among = InterestIndex.wanted_params, InterestIndex.wanted_among

    def wanted_params(self: InterestIndex, type_url: str, name: str) -> frozenset[Params]:
        asked.append(name)
        return one(self, type_url, name)

    def wanted_among(self: InterestIndex, type_url: str, names: Any) -> list[frozenset[Params]]:
        asked.extend(names)
        return among(self, type_url, names)

    monkeypatch.setattr(InterestIndex, "wanted_params", wanted_params)
    monkeypatch.setattr(InterestIndex, "wanted_among", wanted_among)
    return asked


def test_a_big_client_joining_takes_the_whole_set_paths(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    joined = counted(monkeypatch, "_subscribe_together")
    targeted, wanted_only = (counted(monkeypatch, name) for name in
                             ("_joining_together", "_wanted_only"))
    params_of_calls: list[str] = []
    original = InterestIndex._params_of

    def params_of_counted(self: InterestIndex, type_url: str, name: str, found: Any) -> Any:
        params_of_calls.append(name)
        return original(self, type_url, name, found)

    monkeypatch.setattr(InterestIndex, "_params_of", params_of_counted)
    relay = Relay()
    relay.join(0, NAMES, 0.0)  # one slice: every name new and plain
    relay.join(1, NAMES, 0.0)  # held already: nothing for the origin
    assert [names and len(names) for names in joined] == [N, None]
    # targeted together, then (held already) by the loops
    assert [names and len(names) for names in targeted] == [N, None] and len(wanted_only) == 1
    assert relay.changes[:2] == [([(name, frozenset({EMPTY_PARAMS})) for name in NAMES], []),
                                 ([], [])]
    assert params_of_calls == []  # looked up together, no call per name
    joined.clear()
    relay.join(2, NAMES[:10], 0.0, CANARY)  # these 10: one group of three holders
    assert joined == [None] and params_of_calls == []  # (not plain: the loop subscribes)
    assert relay.changes[-1] == ([(name, frozenset({CANARY})) for name in NAMES[:10]], [])


def test_a_big_client_leaving_takes_the_whole_set_paths(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    let_go, ended, replaced = (counted(monkeypatch, name) for name in
                               ("_let_go_together", "_all_ended", "_replace_together"))
    asked = asked_of(monkeypatch)
    relay = Relay()
    relay.join(0, NAMES, 0.0)
    joined = len(asked)
    let_go.clear()  # (of the join: nothing was subscribed yet)
    relay.leave(0, 1.0)
    # each slice: let go together, the names looked up once to let go and
    # once to sync, all left out of the sync (they linger): nothing for the origin
    assert [names is not None and len(names) for names in let_go] == [1_000] * 3
    assert len(asked) - joined == 2 * N
    assert relay.changes[-3:] == [([], [])] * 3
    relay.tick(31.0)
    assert ended == [True, True]  # the linger ends in 2 ticks of at most 2,000
    assert [len(names) for names in replaced if names is not None] == [
        ENDING_PER_TICK, N - ENDING_PER_TICK]
    assert [len(unsubscribed) for _, unsubscribed in relay.changes[-2:]] == [2_000, 1_000]
    assert not relay.cache.names(ENDPOINT) and relay.targets.subscription(ENDPOINT) is None


# -- a linger ending a slice at a time ----------------------------------------------


def test_a_linger_ends_at_most_per_tick_names_a_tick() -> None:
    deadlines = Deadlines()
    lingering = Lingering(deadlines, per_tick=2)
    lingering.start(ENDPOINT, 0.0, 30.0, ["a", "b", "c"], [("d", CANARY)])
    lingering.start(CLUSTER, 0.0, 31.0, ["x"])
    lingering.start(ENDPOINT, 1.0, 32.0, ["e"])


    def tick() -> list[tuple[str, list[str]]]:
        deadlines.drop_due(40.0)  # (as UpstreamState.on_tick: then what is due)
        return lingering.due(40.0)

    # (type by type: all types together end at most 2 a tick)
    assert tick() == [(CLUSTER, ["x"]), (ENDPOINT, ["a"])]
    assert lingering.count() == 4
    # what is due and not taken keeps a deadline that is due already: the next tick goes on
    assert deadlines.next(lingering.stands) == 30.0
    assert tick() == [(ENDPOINT, ["b", "c"])]
    assert deadlines.next(lingering.stands) == 30.0
    assert tick() == [(ENDPOINT, ["d", "e"])]
    assert deadlines.next(lingering.stands) is None and lingering.count() == 0
    ending = lingering.take_ending(ENDPOINT, 40.0, None)
    assert ending.names == {"a", "b", "c", "e"} and ending.variants == {"d": {CANARY}}


def test_a_name_let_go_again_lingers_on_when_its_first_batch_ends_in_slices() -> None:
    lingering = Lingering(Deadlines(), per_tick=2)
    lingering.start(ENDPOINT, 0.0, 30.0, ["a", "b", "c", "d"])
    lingering.start(ENDPOINT, 5.0, 35.0, ["b", "d"])  # wanted again, then let go again
    assert lingering.due(30.0) == [(ENDPOINT, ["a"])]
    assert lingering.due(30.0) == [(ENDPOINT, ["c"])]
    assert lingering.due(30.0) == []
    assert lingering.due(35.0) == [(ENDPOINT, ["b", "d"])]


def test_without_a_bound_per_tick_a_linger_ends_whole() -> None:
    lingering = Lingering(Deadlines(), per_tick=None)
    lingering.start(ENDPOINT, 0.0, 30.0, NAMES)
    assert lingering.due(30.0) == [(ENDPOINT, NAMES)]


def test_what_the_bound_cut_goes_whole_and_what_lingers_ends_in_slices() -> None:
    lingering = Lingering(Deadlines(), limit=2, per_tick=1)
    lingering.start(ENDPOINT, 0.0, 30.0, ["a", "b", "c", "d"])  # two of them cut at once
    [(_, cut)] = lingering.due(0.0)
    assert len(cut) == 2 and lingering.count() == 2  # whole, past per_tick
    [(_, first)] = lingering.due(30.0)
    [(_, second)] = lingering.due(30.0)
    assert len(first) == len(second) == 1 and {*cut, *first, *second} == {"a", "b", "c", "d"}
    assert lingering.due(30.0) == [] and lingering.count() == 0
