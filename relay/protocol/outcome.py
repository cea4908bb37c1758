"""What a request meant, shared by the SotW and delta state objects."""

from __future__ import annotations

from dataclasses import dataclass

from relay.errors import RelayError


class ProtocolError(RelayError):
    """A request that breaks the protocol; the stream is ended with this message."""


@dataclass(frozen=True)
class Nack:
    """A client's rejection of one response."""

    nonce: str
    message: str
    code: int
    # what was rejected: SotW's version_info, or delta's (name, version) pairs
    version_info: str = ""
    resources: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class RequestOutcome:
    """What a request meant, for the stream adapter's bookkeeping."""

    ack_nonce: str | None = None        # the in-flight response it answered, if any
    nack: Nack | None = None
    interest_changed: bool = False
