"""tests/ports.py: a stopped origin's port is held for its return within a
test: nobody else may bind it, and a client dialling it is refused, as by a
port nobody holds."""

from __future__ import annotations

import socket

import pytest

from tests.ports import free_port, hold_port, release_held_ports, release_port


def test_a_held_port_is_refused_to_others_and_to_dialers_until_released() -> None:
    port = free_port()
    hold_port(port)
    try:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        release_port(port)
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))  # (free again)


def test_every_held_port_is_released_at_the_end_of_a_test() -> None:
    ports = [free_port() for _ in range(3)]
    for port in ports:
        hold_port(port)
    release_held_ports()
    for port in ports:
        with socket.socket() as other:
            other.bind(("127.0.0.1", port))
