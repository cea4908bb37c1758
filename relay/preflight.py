"""Before listening: which of a config's ports another process already holds.

``xds-relay run`` refuses to start with one line per port in use, naming its
config key, rather than binding the ports one after the other and failing
half-started (gRPC logs its own line first); ``xds-relay validate`` warns of
them. A port can be taken between the check and the bind: then the bind's own
error names the key as well.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from relay.config import RelayConfig
from relay.config.values import Address

__all__ = ["PortInUse", "listeners", "ports_in_use"]


@dataclass(frozen=True, slots=True)
class PortInUse:
    """A configured address whose port another socket listens on."""

    key: str
    address: Address

    def __str__(self) -> str:
        return f"cannot listen on {self.address} ({self.key}): the port is in use"


def listeners(config: RelayConfig) -> list[tuple[str, Address]]:
    """Every address ``config`` listens on, by its config key."""
    found = [("server.address", config.server.address), ("admin.address", config.admin.address)]
    if config.rest.address is not None:
        found.append(("rest.address", config.rest.address))
    return found


def ports_in_use(config: RelayConfig) -> list[PortInUse]:
    """The addresses of ``config`` (port 0 aside: any free port) that cannot be
    bound because their port is in use. An address that fails for another
    reason (a name that does not resolve here, an address of another host)
    is not listed: from here it cannot be told whether the relay's own host
    would take it."""
    return [PortInUse(key, address) for key, address in listeners(config)
            if address.port != 0 and _in_use(address)]


def _in_use(address: Address) -> bool:
    """Whether binding ``address`` fails with EADDRINUSE, as the relay's servers
    bind it (SO_REUSEADDR: a port left in TIME_WAIT is free)."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            address.host or None, address.port, type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE)[0]
    except (OSError, UnicodeError):
        return False
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False
