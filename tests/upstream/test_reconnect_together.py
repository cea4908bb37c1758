"""istiod's reconnect at a big client's size: the new stream's subscription,
the resend applied and the reconcile take as many Python-level steps of the
relay's own code for 4,000 names as for 40 (counted, not timed: each name
is looked up, declared, compared and confirmed in C). protobuf fills the
request's ``initial_resource_versions`` map an entry at a time in Python
(``MutableMapping.update``, ~0.4 us an entry): those steps are not the
relay's, and not counted. What each step gives is checked too: the
requests, the cache, and what subscribers are told."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2

import relay
from relay.cache import CacheChange
from relay.constraints import Locator
from relay.interest import Interest
from relay.upstream import resync
from relay.upstream.bulk import BULK_FROM
from relay.upstream.responses import ParsedResponse, parse_response
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack
from tests.counting import calls_of
from tests.stepping import made_in_steps
from tests.upstream.test_upstream_state import Sub, make

SMALL, BIG = 40, 4_000
RELAY = str(Path(relay.__file__).parent)
assert SMALL >= BULK_FROM  # (both checked in bulk, as istiod's responses are)


def steps_of(call: Callable[[], object]) -> int:
    """How many Python-level steps (calls, lines, returns) of the relay's
    own code ``call`` takes (see tests.test_cache_served.steps_of: the
    collector is kept off meanwhile)."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if frame.f_code.co_filename.startswith(RELAY):
            count += 1
            return tracer
        return None

    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
        if collecting:
            gc.enable()
    return count


def push(nonce: str, names: list[str], changed: frozenset[str] = frozenset()
         ) -> discovery_pb2.DeltaDiscoveryResponse:
    """istiod's: every name, no versions; those ``changed`` with a new body."""
    out = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce=nonce)
    for name in names:
        out.resources.add(name=name, resource=pack(endpoints(name, 81 if name in changed else 80)))
    return out


class Reconnect:
    """A relay state whose client holds ``count`` names, all cached and
    answered, and whose stream to the origin just ended."""

    def __init__(self, count: int) -> None:
        self.names = [f"big-{i}" for i in range(count)]
        self.state, self.index, self.cache = make()
        self.changes: list[CacheChange] = []
        self.cache.add_listener(self.changes.append)
        self.index.update(Sub(), ENDPOINT, Interest(frozenset(self.names)))
        self.state.on_connect(self.index, 0.0)
        self.apply(push("1", self.names), 0.1)
        self.grace = self.state.answer_grace
        self.state.on_tick(self.index, 1.0 + self.grace)  # (answered)
        self.state.on_disconnect()
        self.changes.clear()

    def apply(self, message: discovery_pb2.DeltaDiscoveryResponse, now: float) -> None:
        parsed = parse_response(message.SerializeToString(), known=self.cache.served_to_all)
        assert isinstance(parsed, ParsedResponse) and parsed.plain
        self.state.on_response(parsed, self.index, now)

    def steps(self, resent: list[str], changed: frozenset[str]) -> list[int]:
        """Python-level steps of: the new stream's subscription, the resend
        applied (checked beforehand, not counted), the reconcile."""
        now = 10.0 + self.grace
        connect = steps_of(lambda: self.state.on_connect(self.index, now))
        parsed = parse_response(push("2", resent, changed).SerializeToString(),
                                known=self.cache.served_to_all)
        assert isinstance(parsed, ParsedResponse)
        applied = steps_of(lambda: self.state.on_response(parsed, self.index, now + 0.1))
        reconcile = steps_of(lambda: self.state.on_tick(self.index, now + 1.0 + self.grace))
        return [connect, applied, reconcile]


def test_a_reconnect_takes_the_same_steps_for_4000_names_as_for_40() -> None:
    small, big = Reconnect(SMALL), Reconnect(BIG)
    assert small.steps(small.names, frozenset()) == big.steps(big.names, frozenset())
    # every name resent as cached: nobody is told of anything
    assert big.changes == [] and sorted(big.cache.names(ENDPOINT)) == sorted(big.names)


def test_a_resend_with_changes_takes_the_same_steps_and_tells_only_those() -> None:
    small, big = Reconnect(SMALL), Reconnect(BIG)
    # a tenth changed, while the stream was down
    assert small.steps(small.names, frozenset(small.names[::10])) == \
        big.steps(big.names, frozenset(big.names[::10]))
    assert [change.names for change in big.changes] == [frozenset(big.names[::10])]
    held = big.cache.served_to_all(ENDPOINT, big.names)
    assert [held[name].resource.resource.value for name in big.names[:11]] == \
        [pack(endpoints(name, 81 if i % 10 == 0 else 80)).value
         for i, name in enumerate(big.names[:11])]


def test_a_name_not_resent_is_reconciled_away() -> None:
    big = Reconnect(BIG)
    gone = big.names[7]
    big.steps([name for name in big.names if name != gone], frozenset())
    assert [change.names for change in big.changes] == [frozenset({gone})]
    assert gone not in big.cache.names(ENDPOINT)
    assert len(big.cache.names(ENDPOINT)) == BIG - 1


def test_the_new_streams_subscription_declares_every_cached_version() -> None:
    big = Reconnect(BIG)
    requests = big.state.on_connect(big.index, 20.0)
    held = big.cache.served_to_all(ENDPOINT, big.names)
    first = requests[0]
    assert dict(first.initial_resource_versions) == \
        {name: held[name].version for name in big.names}
    assert [n for r in requests for n in r.resource_names_subscribe] == sorted(big.names)



def test_the_subscription_made_in_steps_is_the_one_made_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stepped, whole = Reconnect(BIG), Reconnect(BIG)
    # (names whose subscription was checked one by one)
    looked_at = calls_of(monkeypatch, resync, "subscribes")
    requests, pauses = made_in_steps(stepped.state.connect_steps(stepped.index, 20.0,
                                                                 step=BIG // 8))
    # (the versions looked up, the cached ones found subscribed, the names
    # cut, and declared, an eighth at a time each)
    assert pauses >= 4 * 7
    assert looked_at == []
    assert [r.SerializeToString() for r in requests] == \
        [r.SerializeToString() for r in whole.state.on_connect(whole.index, 20.0)]
    # what the resend confirms and the reconcile removes is the same too
    for reconnect in (stepped, whole):
        reconnect.apply(push("2", reconnect.names[1:]), 20.1)
        reconnect.state.on_tick(reconnect.index, 21.0 + reconnect.grace)
    assert [c.names for c in stepped.changes] == [c.names for c in whole.changes] == \
        [frozenset({stepped.names[0]})]


def test_the_resend_applied_in_steps_is_the_one_applied_at_once() -> None:
    stepped, whole = Reconnect(BIG), Reconnect(BIG)
    changed = frozenset(stepped.names[::10])
    outcomes = []
    for reconnect, step in ((stepped, BIG // 8), (whole, 0)):
        reconnect.state.on_connect(reconnect.index, 20.0)
        parsed = parse_response(push("2", reconnect.names, changed).SerializeToString(),
                                known=reconnect.cache.served_to_all)
        assert isinstance(parsed, ParsedResponse)
        outcome, pauses = made_in_steps(
            reconnect.state.response_steps(parsed, reconnect.index, 20.1, step))
        outcomes.append(outcome)
        assert (pauses > 8) is (step > 0)  # (looked at an eighth at a time, then let go)
    assert [r.SerializeToString() for r in outcomes[0].requests] == \
        [r.SerializeToString() for r in outcomes[1].requests]
    assert [c.names for c in stepped.changes] == [c.names for c in whole.changes] == [changed]
    assert stepped.cache.served_to_all(ENDPOINT, stepped.names).keys() == \
        whole.cache.served_to_all(ENDPOINT, whole.names).keys()


def test_the_settle_made_in_steps_is_the_one_made_at_once() -> None:
    """After the resend, the reconnect's names settle a slice at a time, each
    slice answered by a write of its own; names the origin never sent (a
    newcomer's) are told absent all the same, and nothing else differs."""
    stepped, whole = Reconnect(BIG), Reconnect(BIG)
    absent = [f"gone-{i}" for i in range(BIG // 2)]
    told: list[frozenset[str]] = []
    for reconnect in (stepped, whole):
        reconnect.state.on_connect(reconnect.index, 20.0)
        reconnect.index.update(Sub(), ENDPOINT, Interest(frozenset(absent)))
        reconnect.state.on_interest_changed(ENDPOINT, reconnect.index, 20.0, absent)
        reconnect.apply(push("2", reconnect.names[1:]), 20.1)
        reconnect.changes.clear()
    requests, pauses = made_in_steps(stepped.state.tick_steps(stepped.index, 21.0 + stepped.grace,
                                                              step=BIG // 8))
    # (the 4,000 names and the 2,000 absent ones settled an eighth of 4,000 at a time)
    assert pauses == 12 - 1
    assert requests == whole.state.on_tick(whole.index, 21.0 + whole.grace) == []
    for reconnect in (stepped, whole):
        told.append(frozenset().union(*(c.names for c in reconnect.changes)))
        assert not reconnect.state.next_deadline()
    # the absent names told, and the one not resent reconciled away
    assert told[0] == told[1] == {*absent, stepped.names[0]}
    assert len(stepped.changes) > len(whole.changes) == 2
    held = [{name: resource.version for name, resource in reconnect.cache.served_to_all(
        ENDPOINT, [*reconnect.names, *absent]).items()} for reconnect in (stepped, whole)]
    assert held[0] == held[1] and len(held[0]) == BIG - 1
    assert all(stepped.cache.is_answered(ENDPOINT, Locator(name)) for name in absent)


def test_a_stream_that_ends_while_the_settle_is_made_in_steps_loses_nothing() -> None:
    """The stream's end is told to the state between two of the settle's
    steps (the upstream client's timer outlives streams): the settle
    finishes, every name it took is answered, and the next stream
    subscribes everything, declaring what is cached."""
    reconnect = Reconnect(BIG)
    absent = [f"gone-{i}" for i in range(BIG // 2)]
    reconnect.state.on_connect(reconnect.index, 20.0)
    reconnect.index.update(Sub(), ENDPOINT, Interest(frozenset(absent)))
    reconnect.state.on_interest_changed(ENDPOINT, reconnect.index, 20.0, absent)
    reconnect.apply(push("2", reconnect.names), 20.1)
    ticking = reconnect.state.tick_steps(reconnect.index, 21.0 + reconnect.grace, step=BIG // 8)
    next(ticking)  # (a slice settled)
    reconnect.state.on_disconnect()
    requests, _ = made_in_steps(ticking)
    assert requests == []
    assert all(reconnect.cache.is_answered(ENDPOINT, Locator(name))
               for name in [*reconnect.names, *absent])
    subscription = reconnect.state.on_connect(reconnect.index, 30.0)
    assert sorted(n for r in subscription for n in r.resource_names_subscribe) == \
        sorted([*reconnect.names, *absent])
    assert {n for r in subscription for n in r.initial_resource_versions} == set(reconnect.names)
