"""The test origins' ports: out of reach of binds to port 0, and never shared."""

from __future__ import annotations

import itertools

import pytest

from tests.harness import ScriptedOrigin
from tests.ports import _ephemeral_floor, origin_ports


def test_origins_take_ports_below_the_ephemeral_range() -> None:
    floor = _ephemeral_floor()
    if floor - 24_000 < 1_024:
        pytest.skip(f"no room below this machine's ephemeral range (from {floor})")
    assert all(0 < port < floor for port in itertools.islice(origin_ports(), 5))


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
