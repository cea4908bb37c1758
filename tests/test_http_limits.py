"""The bookkeeping behind the HTTP servers' limits, with no I/O: a connection's
deadline by phase, the body bytes held at once, connections per host."""

from __future__ import annotations

import pytest

from relay.http_limits import (
    DEFAULT_HTTP_LIMITS,
    BodyBudget,
    ConnectionDeadline,
    HeldBody,
    HostConnections,
    Phase,
)
from relay.protocol.limits import DEFAULT_LIMITS

# ------------------------------------------------------------------- ConnectionDeadline


def deadline() -> ConnectionDeadline:
    """Accepted at 100 with a 2 s header timeout and a 30 s idle one."""
    return ConnectionDeadline(header_timeout=2.0, idle_timeout=30.0, now=100.0)


def test_a_new_connection_is_idle_until_idle_timeout() -> None:
    connection = deadline()
    assert (connection.phase, connection.deadline) == (Phase.IDLE, 130.0)
    assert connection.overdue(129.9) is None
    assert connection.overdue(130.0) is Phase.IDLE


def test_the_first_byte_of_a_request_starts_its_header_timeout() -> None:
    connection = deadline()
    assert connection.received(110.0) is True
    assert (connection.phase, connection.deadline) == (Phase.HEADERS, 112.0)
    assert connection.overdue(112.0) is Phase.HEADERS


def test_later_bytes_of_the_headers_gain_no_time() -> None:
    connection = deadline()
    connection.received(110.0)
    assert connection.received(111.5) is False  # a slowloris byte
    assert connection.deadline == 112.0


def test_a_request_handled_has_no_deadline_here() -> None:
    connection = deadline()
    connection.received(110.0)
    connection.request_started()
    assert (connection.phase, connection.deadline) == (Phase.HANDLING, None)
    assert connection.received(500.0) is False  # its body, however late
    assert connection.overdue(10_000.0) is None


def test_an_answered_request_leaves_the_connection_idle_again() -> None:
    connection = deadline()
    connection.received(110.0)
    connection.request_started()
    connection.request_ended(111.0)
    assert (connection.phase, connection.deadline) == (Phase.IDLE, 141.0)
    assert connection.received(120.0) is True  # the next request: headers again
    assert connection.deadline == 122.0


# ------------------------------------------------------------------------- BodyBudget


def test_bytes_are_taken_while_they_fit_and_given_back() -> None:
    budget = BodyBudget(100)
    assert budget.take(60) and budget.take(40)
    assert budget.held == 100
    assert not budget.fits(1) and not budget.take(1)
    assert budget.held == 100  # a refused take holds nothing
    budget.give_back(60)
    assert budget.held == 40 and budget.take(60)


def test_giving_back_more_than_held_is_a_bug() -> None:
    budget = BodyBudget(100)
    budget.take(10)
    with pytest.raises(ValueError, match="giving back 11 bytes of the 10 held"):
        budget.give_back(11)


def test_an_empty_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="a body budget of 0 bytes holds nothing"):
        BodyBudget(0)


def test_the_default_budget_holds_four_of_the_largest_requests() -> None:
    assert DEFAULT_HTTP_LIMITS.max_buffered_body == 4 * DEFAULT_LIMITS.request_size


# --------------------------------------------------------------------------- HeldBody


def test_a_body_is_held_as_it_comes_and_released_whole() -> None:
    budget = BodyBudget(100)
    held = HeldBody(budget, limit=50, declared=None)
    assert held.check() is None
    assert held.add(b"abc") is None and held.add(b"de") is None
    assert (held.body(), held.size, budget.held) == (b"abcde", 5, 5)
    held.release()
    assert budget.held == 0
    held.release()  # again: nothing more to give back
    assert budget.held == 0


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    budget = BodyBudget(1_000)
    assert HeldBody(budget, limit=50, declared=51).check() == "request_size"
    assert HeldBody(budget, limit=50, declared=50).check() is None


def test_a_declared_length_that_does_not_fit_now_is_refused_before_reading() -> None:
    budget = BodyBudget(100)
    budget.take(60)
    assert HeldBody(budget, limit=50, declared=41).check() == "max_buffered_body"
    assert HeldBody(budget, limit=50, declared=40).check() is None
    assert budget.held == 60  # checking takes nothing


def test_bytes_past_the_limit_are_refused_and_not_held() -> None:
    budget = BodyBudget(1_000)
    held = HeldBody(budget, limit=5, declared=None)
    assert held.add(b"abc") is None
    assert held.add(b"def") == "request_size"
    assert (held.size, budget.held) == (3, 3)
    held.release()
    assert budget.held == 0


def test_bytes_the_budget_cannot_hold_are_refused_and_not_held() -> None:
    budget = BodyBudget(10)
    other = HeldBody(budget, limit=50, declared=None)
    assert other.add(b"x" * 8) is None
    held = HeldBody(budget, limit=50, declared=None)
    assert held.add(b"yy") is None
    assert held.add(b"z") == "max_buffered_body"
    assert budget.held == 10
    held.release()
    other.release()
    assert budget.held == 0


# -------------------------------------------------------------------- HostConnections


def test_a_host_may_open_up_to_its_limit() -> None:
    connections = HostConnections(2)
    assert connections.admit("10.0.0.1") and connections.admit("10.0.0.1")
    assert not connections.admit("10.0.0.1")
    assert connections.admit("10.0.0.2")  # another host has its own
    assert connections.open("10.0.0.1") == 2


def test_a_closed_connection_makes_room_and_a_host_with_none_is_forgotten() -> None:
    connections = HostConnections(1)
    connections.admit("10.0.0.1")
    connections.leave("10.0.0.1")
    assert (connections.open("10.0.0.1"), connections.hosts()) == (0, 0)
    assert connections.admit("10.0.0.1")
