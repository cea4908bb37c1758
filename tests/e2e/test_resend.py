"""End to end: istiod ends its stream and resends everything, unchanged.

The relay (real gRPC on loopback, :class:`tests.istiod.IstiodOrigin`: no
per-resource versions) decodes none of the resent bodies again, and its
clients hear nothing; a resend with one body that does not decode is NACKed
for the reason checking every body gives, and the cached copy stays.
"""

from __future__ import annotations

from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.interest import Interest
from relay.upstream import bulk
from relay.upstream import state as state_module
from relay.upstream.responses import Unusable, parse_response
from relay.xds_types import ENDPOINT
from tests.harness import QUIET, endpoints, eventually, node, running_stack
from tests.istiod import IstiodOrigin

NAMES = [f"ep-{i:02d}" for i in range(48)]  # (over bulk.BULK_FROM: checked in bulk)
BROKEN = "ep-07"
UNDECODABLE = b"\x0a\x05ab"  # (field 1, a string, cut short)


def counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many bodies each of the bulk check's decodes is given, in order."""
    decoded: list[int] = []
    shadows = bulk.shadows

    def counting_shadows(type_url: str) -> Any:
        found = shadows(type_url)

        class Checked:
            @staticmethod
            def FromString(value: bytes) -> Any:
                # (counted before: one that does not decode raises)
                decoded.append(len(found.entries.FromString(value).resources))
                return found.checked.FromString(value)
        return bulk.Shadows({"Entries": found.entries, "Checked": Checked,
                             "Listed": found.listed})

    monkeypatch.setattr(bulk, "shadows", counting_shadows)
    return decoded


def as_sent(origin: IstiodOrigin) -> discovery_pb2.DeltaDiscoveryResponse:
    """The response the origin sends a new stream subscribing to NAMES."""
    response = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce="n")
    for name in sorted(NAMES):
        response.resources.add(name=name, resource=origin.resources[ENDPOINT][name])
    return response


async def test_a_resend_decodes_nothing_again_and_a_broken_one_is_nacked_as_ever(
        monkeypatch: pytest.MonkeyPatch) -> None:
    decoded = counting_decodes(monkeypatch)
    origin = IstiodOrigin()
    origin.set(*(endpoints(name, 1000 + i) for i, name in enumerate(NAMES)))
    async with running_stack(origin) as stack:
        delta = stack.client()
        await delta.send(node=node("d"), type_url=ENDPOINT, resource_names_subscribe=NAMES)
        first = await delta.recv()
        await delta.ack(first)
        sotw = stack.client(delta=False)
        await sotw.send(node=node("s"), type_url=ENDPOINT, resource_names=NAMES)
        sotw_first = await sotw.recv()
        await sotw.ack(sotw_first, resource_names=NAMES)
        assert sorted(r.name for r in first.resources) == NAMES and len(sotw_first.resources) == 48
        assert sum(decoded) == 48  # (the first time: every body)
        held = {name: stack.relay.cache.served_one(ENDPOINT, name) for name in NAMES}
        assert all(held.values())

        # 1. The origin ends its stream; the next one resends everything, unchanged.
        decoded.clear()
        origin.end_streams()
        await eventually(lambda: len(origin.streams) == 2 and origin.stream.sent
                         and origin.stream.all_answered())
        assert origin.stream.resources_sent == 48 and origin.stream.nacks == []
        assert decoded == [0]  # (one bulk check, of no body)
        await delta.expect_nothing(QUIET)
        await sotw.expect_nothing(0)
        assert {n: stack.relay.cache.served_one(ENDPOINT, n) for n in NAMES} == held

        # 2. Again, with one body that does not decode: NACKed as checking all says.
        origin.resources[ENDPOINT][BROKEN] = any_pb2.Any(type_url=ENDPOINT, value=UNDECODABLE)
        expected = parse_response(as_sent(origin))
        assert isinstance(expected, Unusable)
        assert expected.reason.startswith(f"resource {BROKEN!r} cannot be decoded as {ENDPOINT}: ")
        decoded.clear()
        origin.end_streams()
        await eventually(lambda: len(origin.streams) == 3 and origin.stream.sent
                         and origin.stream.all_answered())
        assert origin.stream.nacks == [expected.reason]
        assert decoded == [1]  # (the bulk check: the broken body alone, which fails; the
        # general check then decodes all, one by one, to find it and say why)
        await delta.expect_nothing(QUIET)
        await sotw.expect_nothing(0)
        assert stack.relay.cache.served_one(ENDPOINT, BROKEN) is held[BROKEN]



class Latecomer:
    """A subscriber the index holds (what a downstream stream would be)."""

    def resources_changed(self, *args: Any) -> None:
        pass


async def test_invariant_27_a_subscription_made_in_turns_declares_all_and_what_comes_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # (a step of 16 names: the 48 are looked up, declared and cut in three)
    monkeypatch.setattr(state_module, "NAMES_PER_STEP", 16)
    origin = IstiodOrigin()
    origin.set(*(endpoints(name, 1000 + i) for i, name in enumerate([*NAMES, "late"])))
    # (no batch window: a change is acted on in the loop's next pass, a pause's)
    async with running_stack(origin, server="batch_window: 0s") as stack:
        delta = stack.client()
        await delta.send(node=node("d"), type_url=ENDPOINT, resource_names_subscribe=NAMES)
        await delta.ack(await delta.recv())
        client = stack.relay.origins.default
        assert client is not None
        state, seen = client.state, {"pauses": 0, "told": 0, "told while made": 0}
        connect_steps, on_interest_changed = state.connect_steps, state.on_interest_changed

        def counted(*args: Any, **kwargs: Any) -> Any:
            steps = connect_steps(*args, **kwargs)
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value
                seen["pauses"] += 1
                if seen["pauses"] == 1:  # a client asks for more while it is made
                    stack.relay.index.update(Latecomer(), ENDPOINT, Interest(frozenset({"late"})))
                yield

        def told(*args: Any, **kwargs: Any) -> Any:
            seen["told"] += 1
            seen["told while made"] += client._state_busy.locked()
            return on_interest_changed(*args, **kwargs)

        monkeypatch.setattr(state, "connect_steps", counted)
        monkeypatch.setattr(state, "on_interest_changed", told)
        origin.end_streams()
        await eventually(lambda: len(origin.streams) == 2 and len(origin.stream.sent) == 2
                         and origin.stream.all_answered())
        assert seen["pauses"] >= 6 and (seen["told"], seen["told while made"]) == (1, 0)
        # the subscription's requests first (all 48, their versions declared), then the latecomer's
        subscribing = [r for r in origin.stream.log if r.resource_names_subscribe]
        assert [list(r.resource_names_subscribe) for r in subscribing] == [sorted(NAMES), ["late"]]
        assert subscribing[0].HasField("node")
        assert sorted(subscribing[0].initial_resource_versions) == sorted(NAMES)
        await delta.expect_nothing(QUIET)


class LateIstiod(IstiodOrigin):
    """istiod that, while ``holding``, holds back a stream's answers after its
    first until released (an answer on its way, or a relay slow to read it)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self.held: list[tuple[Any, ...]] = []

    def _send(self, stream: Any, type_url: str, names: Any, removed: Any = ()) -> None:
        if self.holding and stream.sent:
            self.held.append((stream, type_url, list(names), list(removed)))
            return
        super()._send(stream, type_url, names, removed)

    def release(self) -> None:
        self.holding = False
        for held in self.held:
            super()._send(*held)
        self.held.clear()


# (with their versions, more than one request of 16 KiB: a subscription in several)
MANY = [f"ep-{i:04d}-" + "x" * 40 for i in range(600)]


async def test_invariant_27_a_resubscription_answered_late_removes_nothing() -> None:
    """istiod answers the first request of a reconnect's subscription (a few
    names, most of the versions declared) and the rest later: the names of
    the later requests are not taken as gone meanwhile, and clients are sent
    nothing (the reconcile used to come ``answer_grace`` after the first
    answer, and removed all but those)."""
    origin = LateIstiod()
    origin.set(*(endpoints(name, 1000 + i) for i, name in enumerate(MANY)))
    async with running_stack(origin, answer_grace="0.2s",
                             upstream="max_request_size: 16KiB") as stack:
        delta = stack.client()
        await delta.send(node=node("d"), type_url=ENDPOINT, resource_names_subscribe=MANY)
        got: set[str] = set()
        while len(got) < len(MANY):
            response = await delta.recv()
            got.update(r.name for r in response.resources)
            await delta.ack(response)
        origin.holding = True
        origin.end_streams()
        await eventually(lambda: len(origin.streams) == 2 and len(origin.stream.sent) == 1
                         and bool(origin.held) and origin.stream.all_answered())
        subscribed = [r.resource_names_subscribe for r in origin.stream.log
                      if r.resource_names_subscribe]
        assert len(subscribed) > 1 and sorted(n for names in subscribed for n in names) == MANY
        await delta.expect_nothing(3 * 0.2)  # (three graces after the first answer)
        origin.release()
        await eventually(lambda: origin.stream.resources_sent == len(MANY)
                         and origin.stream.all_answered())
        await delta.expect_nothing(0.2 + QUIET)  # (the reconcile's grace, and more)
        assert sorted(stack.relay.cache.names(ENDPOINT)) == MANY
