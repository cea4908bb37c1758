"""Cycle on its own: one type's request/response/ACK cycle as explicit phases."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from relay.protocol.cycle import Cycle, Phase
from relay.protocol.outcome import Nack
from relay.resource import CachedResource
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack


def in_phase(phase: Phase) -> Cycle:
    """A cycle brought to ``phase`` through its own events (nonce "1" sent if any)."""
    cycle = Cycle()
    if phase is Phase.NEW:
        return cycle
    cycle.start()
    if phase in (Phase.IN_FLIGHT, Phase.IN_FLIGHT_OWING):
        cycle.sent("1")
    if phase in (Phase.OWED, Phase.IN_FLIGHT_OWING):
        cycle.owe()
    assert cycle.phase is phase
    return cycle


EVENTS: dict[str, Callable[[Cycle], object]] = {
    "start": lambda cycle: cycle.start(),
    "owe": lambda cycle: cycle.owe(),
    "sent": lambda cycle: cycle.sent("2"),
    "acked": lambda cycle: cycle.acked(),
    "nacked": lambda cycle: cycle.nacked("bad cluster", 3),
}

# The module's table, whole: (phase, event) -> the phase after; None: it raises.
TRANSITIONS: dict[tuple[Phase, str], Phase | None] = {
    (Phase.NEW, "start"): Phase.IDLE,
    (Phase.NEW, "owe"): None,
    (Phase.NEW, "sent"): None,
    (Phase.NEW, "acked"): None,
    (Phase.NEW, "nacked"): None,
    (Phase.IDLE, "start"): Phase.IDLE,
    (Phase.IDLE, "owe"): Phase.OWED,
    (Phase.IDLE, "sent"): Phase.IN_FLIGHT,
    (Phase.IDLE, "acked"): None,
    (Phase.IDLE, "nacked"): None,
    (Phase.OWED, "start"): Phase.OWED,
    (Phase.OWED, "owe"): Phase.OWED,
    (Phase.OWED, "sent"): Phase.IN_FLIGHT,
    (Phase.OWED, "acked"): None,
    (Phase.OWED, "nacked"): None,
    (Phase.IN_FLIGHT, "start"): Phase.IN_FLIGHT,
    (Phase.IN_FLIGHT, "owe"): Phase.IN_FLIGHT_OWING,
    (Phase.IN_FLIGHT, "sent"): None,
    (Phase.IN_FLIGHT, "acked"): Phase.IDLE,
    (Phase.IN_FLIGHT, "nacked"): Phase.IDLE,
    (Phase.IN_FLIGHT_OWING, "start"): Phase.IN_FLIGHT_OWING,
    (Phase.IN_FLIGHT_OWING, "owe"): Phase.IN_FLIGHT_OWING,
    (Phase.IN_FLIGHT_OWING, "sent"): None,
    (Phase.IN_FLIGHT_OWING, "acked"): Phase.OWED,
    (Phase.IN_FLIGHT_OWING, "nacked"): Phase.OWED,
}


def test_the_table_covers_every_phase_and_event() -> None:
    assert set(TRANSITIONS) == {(phase, event) for phase in Phase for event in EVENTS}


@pytest.mark.parametrize(("phase", "event"), list(TRANSITIONS),
                         ids=[f"{p.name}-{e}" for p, e in TRANSITIONS])
def test_each_event_in_each_phase_moves_as_the_table_says(phase: Phase, event: str) -> None:
    cycle = in_phase(phase)
    after = TRANSITIONS[phase, event]
    if after is None:
        with pytest.raises(RuntimeError, match=f"{event!r} cannot happen in phase {phase.name}"):
            EVENTS[event](cycle)
        assert cycle.phase is phase  # a refused event changes nothing
    else:
        EVENTS[event](cycle)
        assert cycle.phase is after


def test_only_the_first_request_starts_the_cycle() -> None:
    cycle = Cycle()
    assert cycle.start()
    assert not cycle.start()
    cycle.sent("1")
    assert not cycle.start()


def test_a_response_sent_is_in_flight_until_acked_or_nacked() -> None:
    cycle = in_phase(Phase.IDLE)
    assert cycle.in_flight is None and cycle.last_nonce is None
    cycle.sent("7")
    assert cycle.in_flight == "7" and cycle.last_nonce == "7"
    cycle.acked()
    assert cycle.in_flight is None and cycle.last_nonce == "7"


def test_only_the_nonce_in_flight_is_awaited() -> None:
    cycle = in_phase(Phase.IDLE)
    assert not cycle.awaits("")  # nothing sent yet
    cycle.sent("1")
    cycle.acked()
    cycle.sent("2")
    assert not cycle.awaits("1")  # an older response
    assert not cycle.awaits("")
    assert cycle.awaits("2")
    cycle.acked()
    assert not cycle.awaits("2")  # ACKed already


def test_a_response_owed_while_one_is_in_flight_is_owed_once_that_one_is_acked() -> None:
    cycle = in_phase(Phase.IN_FLIGHT)
    cycle.owe()
    assert cycle.in_flight == "1"
    cycle.acked()
    assert cycle.phase is Phase.OWED
    cycle.sent("2")  # the owed response pays the debt
    cycle.acked()
    assert cycle.phase is Phase.IDLE


def test_a_nack_rejects_until_the_next_ack_and_stays_the_last_nack() -> None:
    cycle = in_phase(Phase.IN_FLIGHT)
    assert not cycle.rejected and cycle.last_nack is None
    nack = cycle.nacked("bad cluster", 3)
    assert nack == Nack("1", "bad cluster", 3)
    assert cycle.rejected and cycle.last_nack == nack
    cycle.sent("2")
    assert cycle.rejected  # not replied to yet
    cycle.acked()
    assert not cycle.rejected and cycle.last_nack == nack


def test_a_nack_names_what_the_rejected_response_carried() -> None:
    sotw = in_phase(Phase.IDLE)
    sotw.sent("1", version_info="v1")
    assert sotw.nacked("no", 3) == Nack("1", "no", 3, version_info="v1")
    delta = in_phase(Phase.IDLE)
    delta.sent("1", resources=[resource("a", "1"), resource("b", "2")])
    assert delta.nacked("no", 3) == Nack("1", "no", 3, resources=(("a", "1"), ("b", "2")))


def resource(name: str, version: str) -> CachedResource:
    return CachedResource.from_message(ENDPOINT, pack(endpoints(name, 80)), name, version)


def test_what_a_response_carries_is_named_while_it_is_in_flight() -> None:
    cycle = in_phase(Phase.IDLE)
    cycle.sent("1", resources=[resource("a", "1"), resource("b", "2")])
    assert cycle.resources == (("a", "1"), ("b", "2"))
    assert cycle.carries("b", "2") and not cycle.carries("b", "1")
    cycle.acked()
    assert cycle.resources == () and not cycle.carries("b", "2")


def test_an_ack_records_the_accepted_response_and_a_nack_does_not() -> None:
    cycle = in_phase(Phase.IDLE)
    assert cycle.acked_nonce is None and cycle.acked_version == ""
    cycle.sent("1", version_info="v1")
    cycle.acked()
    assert (cycle.acked_nonce, cycle.acked_version) == ("1", "v1")
    cycle.sent("2", version_info="v2")
    cycle.nacked("no", 3)
    assert (cycle.acked_nonce, cycle.acked_version) == ("1", "v1")
    assert cycle.version_info == "v2"  # the latest response sent, rejected


def test_the_expected_request_carries_the_latest_nonce_and_is_owed_a_response() -> None:
    cycle = in_phase(Phase.IN_FLIGHT)
    cycle.expect_request()
    cycle.acked()
    assert not cycle.take_expected("0")  # not the latest response's nonce
    assert cycle.phase is Phase.IDLE
    assert cycle.take_expected("1")
    assert cycle.phase is Phase.OWED
    assert not cycle.take_expected("1")  # taken once


def test_a_response_sent_first_satisfies_the_expected_request() -> None:
    cycle = in_phase(Phase.IDLE)
    cycle.expect_request()
    cycle.sent("1")
    cycle.acked()
    assert not cycle.take_expected("1")
    assert cycle.phase is Phase.IDLE
