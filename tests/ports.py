"""Free TCP ports on loopback, for servers that must be told theirs (redis-server,
a relay process whose config names it), and for origins that stop and come back
on the same port."""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A port nobody listens on now, for a process the test starts to bind
    (a relay process, redis-server). Bound and released: in an xdist worker,
    from its block (see :func:`origin_ports`), where no other process's bind
    to port 0 can be given it in between, as an ephemeral port was (a relay
    process's admin port answered another test's listener once). Elsewhere
    (one test process, the benchmarks, whose processes would all walk the
    same block) any port bind gives."""
    ports = origin_ports() if "PYTEST_XDIST_WORKER" in os.environ else iter(())
    for _, port in zip(range(_BLOCK), ports, strict=False):
        if port == 0:
            break  # (no room below the ephemeral range: any port)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken (another run's server)
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Origins a test stops and starts again on the same port (the relay's config
# names it) must get that port back. One bound to port 0 gets an ephemeral
# port, which another xdist worker's bind to port 0 may be given while the
# origin is away. So origins take their ports below the ephemeral range, from
# a block of their worker's own, where no bind to port 0 reaches.
# A block outlasts a run's origins (a port comes round again only after 3,000
# starts, when no relay of an earlier test still dials it).
_BLOCK = 3_000
_BLOCKS = 8


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _worker_block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = worker.removeprefix("gw")
    return int(digits) % _BLOCKS if digits.isdigit() else 0


def _origin_ports() -> Iterator[int]:
    floor = _ephemeral_floor()
    first = floor - _BLOCKS * _BLOCK
    if first < 1_024:  # no room below the ephemeral range: take what bind gives
        return itertools.repeat(0)
    start = first + _worker_block() * _BLOCK
    return (start + n % _BLOCK for n in itertools.count())


_ports = _origin_ports()


def origin_ports() -> Iterator[int]:
    """Ports to try, in turn, for an origin's first start (0: any)."""
    return _ports
