"""Requests from bytes: size checked first, decode errors made statuses.

gRPC hands the relay each request's bytes to decode (its
``request_deserializer``). Here a request over ``limits.request_size`` is
refused before it is parsed, and bytes that are not a request raise
:class:`UndecodableRequest`; the stream adapter ends the stream with
``RESOURCE_EXHAUSTED`` or ``INVALID_ARGUMENT`` saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from relay.errors import RelayError

__all__ = ["RequestTooLarge", "UndecodableRequest", "request_decoder"]


class UndecodableRequest(RelayError):
    """Bytes that are not the request message the method takes."""


class RequestTooLarge(RelayError):
    """A request over ``limits.request_size``."""

    limit = "request_size"


def request_decoder(message_class: Any, max_size: int) -> Callable[[bytes], Any]:
    """A ``request_deserializer`` for ``message_class`` refusing requests over ``max_size``."""
    name = message_class.DESCRIPTOR.name
    parse = message_class.FromString

    def decode(data: bytes) -> Any:
        if len(data) > max_size:
            raise RequestTooLarge(f"a request of {len(data)} bytes; the relay takes requests "
                                  f"of at most {max_size} (limits.request_size)")
        try:
            return parse(data)
        except DecodeError as error:
            raise UndecodableRequest(f"the request is not a {name}: {error}") from None

    return decode
