"""One type's request/response/ACK cycle on one stream, as one explicit state.

A server keeps at most one response of a type in flight: the client replies
to each with a request carrying its nonce (an ACK, or a NACK with the
reason), and the next response waits for that reply. Delta and SotW follow
the same cycle and differ in how a request is read and a response built, so
both state objects (:mod:`relay.protocol.delta`, :mod:`relay.protocol.sotw`)
keep one :class:`Cycle` per type and ask it whether they may send.

The phases, and the events that move between them::

    NEW              --start-->         IDLE
    IDLE, OWED       --sent-->          IN_FLIGHT
    IDLE             --owe-->           OWED
    IN_FLIGHT        --owe-->           IN_FLIGHT_OWING
    IN_FLIGHT        --acked, nacked--> IDLE
    IN_FLIGHT_OWING  --acked, nacked--> OWED

``start`` after the first request, and ``owe`` where a response is owed
already, change nothing; any other event not in the table is a bug in the
state object, and raises.

A response is *owed* when the client waits for one even if it says nothing:
the first response to a wildcard, a full-state type's new subscription, and
the request Envoy sends to warm its clusters (:meth:`Cycle.expect_request`).

It also keeps what the client replied: which response it last ACKed, and
its latest NACK, with what the rejected response carried (SotW's
``version_info``, delta's names and versions). Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Sequence

from relay.protocol.outcome import Nack
from relay.resource import CachedResource

__all__ = ["IDLE", "IN_FLIGHT", "IN_FLIGHT_OWING", "NEW", "OWED", "Cycle", "Phase"]


class Phase(enum.Enum):
    """Where one type's request/response cycle stands on one stream."""

    NEW = "new"                          # no request of the type yet: nothing goes out
    IDLE = "idle"                        # every response replied to: the next goes with news
    OWED = "owed"                        # every response replied to, and one is owed
    IN_FLIGHT = "in_flight"              # a response awaits its ACK or NACK: nothing else goes
    IN_FLIGHT_OWING = "in_flight_owing"  # as IN_FLIGHT; once replied to, one is owed


# The phases by module-level name: the hot paths (every push to every stream)
# compare by identity, and ``Phase.IDLE`` costs a lookup through the enum's
# metaclass each time.
NEW = Phase.NEW
IDLE = Phase.IDLE
OWED = Phase.OWED
IN_FLIGHT = Phase.IN_FLIGHT
IN_FLIGHT_OWING = Phase.IN_FLIGHT_OWING

_NAME_AND_VERSION = operator.attrgetter("name", "version")


class Cycle:
    """The request/response/ACK cycle of one type on one stream.

    ``phase`` is the state (see the module's table); ``last_nonce``,
    ``version_info`` and :attr:`resources` say what the latest response sent
    was (its nonce, None before the first), the one in flight while the
    phase is ``IN_FLIGHT`` or ``IN_FLIGHT_OWING``.
    """

    __slots__ = ("_carried", "_pairs", "_request_expected", "acked_nonce", "acked_version",
                 "last_nack", "last_nonce", "phase", "rejected", "version_info")

    def __init__(self) -> None:
        self.phase = NEW
        self.last_nonce: str | None = None
        # what the latest response carried: SotW's version_info, delta's
        # resources (what a NACK of it rejects), while it is in flight; their
        # (name, version) pairs made only when asked (see ``resources``)
        self.version_info = ""
        self._carried: Sequence[CachedResource] = ()
        self._pairs: frozenset[tuple[str, str]] | None = None
        # the latest response the client ACKed: its nonce, its version_info
        self.acked_nonce: str | None = None
        self.acked_version = ""
        # the latest NACK, kept after later ACKs (the snapshot shows it)
        self.last_nack: Nack | None = None
        # the latest response the client replied to was NACKed (no ACK since)
        self.rejected = False
        # the client's next request carrying ``last_nonce`` owes a response
        # (see :meth:`expect_request`); dropped when a response goes first
        self._request_expected = False

    @property
    def in_flight(self) -> str | None:
        """The nonce of the response the client has not ACKed or NACKed yet, if any."""
        phase = self.phase
        return self.last_nonce if phase is IN_FLIGHT or phase is IN_FLIGHT_OWING else None

    # -- events -------------------------------------------------------------------

    def start(self) -> bool:
        """A request of the type arrived; whether it is the first (NEW -> IDLE)."""
        if self.phase is not NEW:
            return False
        self.phase = IDLE
        return True

    def owe(self) -> None:
        """The client waits for a response even if it would say nothing."""
        phase = self.phase
        if phase is IDLE:
            self.phase = OWED
        elif phase is IN_FLIGHT:
            self.phase = IN_FLIGHT_OWING
        elif phase is NEW:
            raise _violation("owe", phase)

    def sent(self, nonce: str, version_info: str = "",
             resources: Sequence[CachedResource] = ()) -> None:
        """A response went out (``nonce``, and what it carried: a SotW
        ``version_info``, delta's resources): nothing else goes until the
        client ACKs or NACKs it. ``resources`` is kept as it is (not copied,
        nor changed after), and read only if it is NACKed or shown: a big
        client's response of 10,000 resources made 10,000 (name, version)
        pairs that nearly always went unread."""
        phase = self.phase
        if phase is not IDLE and phase is not OWED:
            raise _violation("sent", phase)
        self.phase = IN_FLIGHT
        self.last_nonce = nonce
        self.version_info = version_info
        self._carried = resources
        self._pairs = None
        self._request_expected = False  # the expected request waited for this response

    @property
    def resources(self) -> tuple[tuple[str, str], ...]:
        """The (name, version) pairs of what the response in flight carries
        (delta; none once replied to), in order."""
        return tuple(map(_NAME_AND_VERSION, self._carried))

    def carries(self, name: str, version: str) -> bool:
        """Whether the response in flight carries ``name`` at ``version``
        (a set of them made at the first question, for a snapshot's every
        name: not a pass over the response each)."""
        if self._pairs is None:
            self._pairs = frozenset(map(_NAME_AND_VERSION, self._carried))
        return (name, version) in self._pairs

    def awaits(self, nonce: str) -> bool:
        """Whether ``nonce`` is that of the response in flight: a request
        carrying it is that response's ACK or NACK."""
        phase = self.phase
        return (phase is IN_FLIGHT or phase is IN_FLIGHT_OWING) and nonce == self.last_nonce

    def acked(self) -> None:
        """The client accepted the response in flight."""
        phase = self.phase  # (as ``_replied``, inline: every push to every stream is ACKed)
        if phase is IN_FLIGHT:
            self.phase = IDLE
        elif phase is IN_FLIGHT_OWING:
            self.phase = OWED
        else:
            raise _violation("acked", phase)
        self.acked_nonce = self.last_nonce
        self.acked_version = self.version_info
        self.rejected = False
        self._carried, self._pairs = (), None  # (the client holds them: its state has them)

    def nacked(self, message: str, code: int) -> Nack:
        """The client rejected the response in flight, saying why: the NACK,
        with what the response carried."""
        self._replied("nacked")
        assert self.last_nonce is not None  # (a response was in flight)
        nack = Nack(self.last_nonce, message, code, self.version_info, self.resources)
        self.last_nack = nack
        self.rejected = True
        self._carried, self._pairs = (), None
        return nack

    def _replied(self, event: str) -> None:
        phase = self.phase
        if phase is IN_FLIGHT:
            self.phase = IDLE
        elif phase is IN_FLIGHT_OWING:
            self.phase = OWED
        else:
            raise _violation(event, phase)

    def expect_request(self) -> None:
        """Owe a response to the client's next request that carries the latest
        nonce, even one that looks like a plain ACK, unless a response goes out
        first (Envoy asks for endpoints again after a cluster push, and waits
        for the response to warm its clusters)."""
        self._request_expected = True

    def take_expected(self, nonce: str) -> bool:
        """Whether a request carrying ``nonce`` is the one :meth:`expect_request`
        awaited; if so a response is now owed for it."""
        if not self._request_expected or nonce != self.last_nonce:
            return False
        self._request_expected = False
        self.owe()
        return True


def _violation(event: str, phase: Phase) -> RuntimeError:
    return RuntimeError(f"response cycle: {event!r} cannot happen in phase {phase.name}")
