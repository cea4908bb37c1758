"""The test origins' ports, and those of the processes tests start: out of
reach of binds to port 0, and never shared."""

from __future__ import annotations

import itertools
import socket

import pytest

from tests.harness import ScriptedOrigin
from tests.ports import _ephemeral_floor, free_port, origin_ports


def test_origins_take_ports_below_the_ephemeral_range() -> None:
    floor = _ephemeral_floor()
    if floor - 24_000 < 1_024:
        pytest.skip(f"no room below this machine's ephemeral range (from {floor})")
    assert all(0 < port < floor for port in itertools.islice(origin_ports(), 5))


def test_free_ports_are_below_the_ephemeral_range_and_skip_taken_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    floor = _ephemeral_floor()
    if floor - 24_000 < 1_024:
        pytest.skip(f"no room below this machine's ephemeral range (from {floor})")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")  # (as make test runs it)
    first = free_port()
    assert 0 < first < floor
    with socket.socket() as held:  # (the next port of the block, taken meanwhile)
        held.bind(("127.0.0.1", first + 1))
        second = free_port()
    assert second != first + 1 and 0 < second < floor
    with socket.socket() as sock:  # free indeed: a process may bind it
        sock.bind(("127.0.0.1", second))


async def test_an_origins_port_is_its_own_while_it_listens() -> None:
    origin = await ScriptedOrigin().start()
    try:
        with pytest.raises(RuntimeError, match="Failed to bind"):
            await ScriptedOrigin().start(origin.port)
    finally:
        await origin.stop()
    again = await ScriptedOrigin().start(origin.port)  # back on it after a stop
    await again.stop()
    assert again.port == origin.port


def test_outside_xdist_free_ports_are_any_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark's processes would all walk the same block, and collide."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    port = free_port()
    assert port >= _ephemeral_floor() or _ephemeral_floor() == 0
