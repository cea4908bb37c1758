"""Free TCP ports on loopback, for servers that must be told theirs (redis-server,
a relay process whose config names it)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nobody listens on now (bound and released: another process may
    take it in the meantime, which tests on one machine accept)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Ports of origins stopped during the current test, each held by a bound
# socket until a server starts on it again: the origin "comes back" on the
# port its relay dials, and another test's server, taking a free port
# meanwhile, could be given that one (the restart then failed to bind).
_held: dict[int, socket.socket] = {}


def hold_port(port: int) -> None:
    """Keep ``port`` from being given to anyone else (a connection to it is
    still refused: nothing listens), until :func:`release_port`."""
    if port in _held:
        return
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:  # (taken already: as before, the restart may fail)
        sock.close()
        return
    _held[port] = sock


def release_port(port: int) -> None:
    """Let go of ``port`` (held or not), to bind it at once."""
    sock = _held.pop(port, None)
    if sock is not None:
        sock.close()


def release_held_ports() -> None:
    """Let go of every port held (at the end of each test)."""
    for port in list(_held):
        release_port(port)
