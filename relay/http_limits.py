"""What one client may hold of the relay's HTTP servers (admin, REST polling),
and the bookkeeping that enforces it, with no I/O (:mod:`relay.web` is the
aiohttp around it).

An HTTP/1.1 connection is, at any moment, in one :class:`Phase`: *idle*
(between requests, or before its first), reading a request's *headers*
(from its first byte), or *handling* a request (its body, the answer, the
writing of the answer). Idle and headers each have a deadline
(``idle_timeout``, ``header_timeout``), after which the connection is
closed; the body has its own (``body_timeout``), kept by the handler that
reads it. Without them, a client that opens connections and sends nothing,
or a header a byte at a time (slowloris), holds each one for ever.

Request bodies are held in memory whole until decoded: :class:`BodyBudget`
bounds the bytes held at once by all of a server's requests together, and
:class:`HostConnections` the connections open at once from one client host.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from relay.protocol.limits import DEFAULT_LIMITS

__all__ = ["DEFAULT_HTTP_LIMITS", "BodyBudget", "BodyRefusal", "ConnectionDeadline",
           "HeldBody", "HostConnections", "HttpLimits", "Phase"]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The limits of one HTTP server (``admin.*``, ``rest.*``); durations in
    seconds, sizes in bytes. The admin server reads no bodies: the body
    limits are REST's."""

    #: From a request's first byte to the end of its headers.
    header_timeout: float = 10.0
    #: From the end of a request's headers to the end of its body.
    body_timeout: float = 30.0
    #: How long a connection may wait for its next request (or its first).
    idle_timeout: float = 60.0
    #: Connections open at once from one client host (its address).
    connections_per_host: int = 100
    #: Body bytes held at once, all requests together: four of the largest.
    max_buffered_body: int = 4 * DEFAULT_LIMITS.request_size


#: The defaults the config models read.
DEFAULT_HTTP_LIMITS = HttpLimits()


class Phase(enum.Enum):
    """What an HTTP/1.1 connection is doing (see the module's docstring)."""

    IDLE = "idle"
    HEADERS = "headers"
    HANDLING = "handling"


class ConnectionDeadline:
    """When one connection is to be closed, by its :class:`Phase`.

    Idle from ``now`` (when it was accepted) with ``idle_timeout`` to wait;
    the first byte of a request starts its headers, with ``header_timeout``
    to finish them (later bytes move nothing: a header sent a byte at a time
    gains no time); a request handled has no deadline here (its body's is
    the handler's); when it ends, idle again. Bytes that arrive while a
    request is handled are its body, or a request pipelined behind it, whose
    headers the idle deadline then bounds.
    """

    def __init__(self, header_timeout: float, idle_timeout: float, now: float) -> None:
        self._header_timeout = header_timeout
        self._idle_timeout = idle_timeout
        self._phase = Phase.IDLE
        self._deadline: float | None = now + idle_timeout

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def deadline(self) -> float | None:
        """When the connection is to be closed (None: not while in this phase)."""
        return self._deadline

    def received(self, now: float) -> bool:
        """Bytes arrived; True when that moved the deadline (a request's first byte)."""
        if self._phase is not Phase.IDLE:
            return False
        self._phase = Phase.HEADERS
        self._deadline = now + self._header_timeout
        return True

    def request_started(self) -> None:
        """A request's headers are all in: it is handled, with no deadline here."""
        self._phase = Phase.HANDLING
        self._deadline = None

    def request_ended(self, now: float) -> None:
        """The request is answered: the connection waits for the next one."""
        self._phase = Phase.IDLE
        self._deadline = now + self._idle_timeout

    def overdue(self, now: float) -> Phase | None:
        """The phase whose time ran out at ``now``, or None."""
        if self._deadline is None or now < self._deadline:
            return None
        return self._phase


class BodyBudget:
    """Request body bytes held in memory at once, all requests of one server
    together, at most ``capacity``.

    A request takes its bytes as they arrive and gives them all back when its
    body is decoded, read no further, or lost; a request whose next bytes do
    not fit is refused (503) rather than waiting, so that the bytes held
    never pass ``capacity`` whatever clients send.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a body budget of {capacity} bytes holds nothing")
        self._capacity = capacity
        self._held = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def held(self) -> int:
        """Bytes taken and not given back."""
        return self._held

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes would fit now (takes nothing)."""
        return self._held + size <= self._capacity

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes if they fit; whether they did."""
        if not self.fits(size):
            return False
        self._held += size
        return True

    def give_back(self, size: int) -> None:
        """Bytes taken earlier are no longer held."""
        if not 0 <= size <= self._held:
            raise ValueError(f"giving back {size} bytes of the {self._held} held")
        self._held -= size


#: Why a body is read no further: over the request's own limit
#: (``limits.request_size``), or more than the server may hold now.
BodyRefusal = Literal["request_size", "max_buffered_body"]


class HeldBody:
    """One request's body as it arrives, at most ``limit`` bytes, its bytes
    taken from ``budget`` as they come.

    ``declared`` is its ``Content-Length`` (None when chunked): a body
    declared too large, or too large to fit now, is refused before a byte of
    it is read. :meth:`release` gives every byte back, whatever happened:
    the caller calls it once the body is decoded or abandoned.
    """

    def __init__(self, budget: BodyBudget, limit: int, declared: int | None) -> None:
        self._budget = budget
        self._limit = limit
        self._declared = declared
        self._chunks: list[bytes] = []
        self._size = 0  # taken from the budget

    @property
    def size(self) -> int:
        """Bytes held now."""
        return self._size

    def check(self) -> BodyRefusal | None:
        """Why the declared body is refused before it is read, or None."""
        if self._declared is None:
            return None
        if self._declared > self._limit:
            return "request_size"
        if not self._budget.fits(self._declared):
            return "max_buffered_body"
        return None

    def add(self, chunk: bytes) -> BodyRefusal | None:
        """Hold the next bytes; why the body is refused instead, or None."""
        if self._size + len(chunk) > self._limit:
            return "request_size"
        if not self._budget.take(len(chunk)):
            return "max_buffered_body"
        self._size += len(chunk)
        self._chunks.append(chunk)
        return None

    def body(self) -> bytes:
        """The bytes held, as one (held as one from then on, not twice)."""
        if len(self._chunks) != 1:
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0]

    def release(self) -> None:
        """Give back every byte held (once; again is a no-op)."""
        self._budget.give_back(self._size)
        self._size = 0
        self._chunks = []


class HostConnections:
    """Connections open at once per client host, at most ``limit`` from each."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._open: Counter[str] = Counter()

    @property
    def limit(self) -> int:
        return self._limit

    def admit(self, host: str) -> bool:
        """Count one more connection from ``host``, unless it has ``limit`` open already."""
        if self._open[host] >= self._limit:
            return False
        self._open[host] += 1
        return True

    def leave(self, host: str) -> None:
        """A connection :meth:`admit` counted has closed."""
        if self._open[host] <= 1:
            del self._open[host]  # no host is kept once all its connections are gone
        else:
            self._open[host] -= 1

    def open(self, host: str) -> int:
        """Connections counted from ``host`` now."""
        return self._open.get(host, 0)

    def hosts(self) -> int:
        """Hosts with a connection open."""
        return len(self._open)
