"""Assemble discovery responses from pre-encoded resource entries.

Protobuf allows a message's fields in any order and a repeated field's
elements as separate occurrences, so a response is the serialized small
fields (version, nonce, type URL, removals) followed by the resources'
already-encoded ``resources`` entries. Parsing the result gives the same
message as building it field by field.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy.service.discovery.v3 import discovery_pb2


def varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


_SMALL_VARINTS = [bytes((value,)) for value in range(0x80)]


def length_delimited_field(number: int, payload: bytes) -> bytes:
    """Encode ``payload`` as field ``number`` with wire type 2 (length-delimited)."""
    return varint((number << 3) | 2) + varint(len(payload)) + payload


def encode_delta_response(head: discovery_pb2.DeltaDiscoveryResponse,
                          entries: Iterable[bytes]) -> bytes:
    """``head`` (everything but ``resources``) plus pre-encoded resource entries
    (joined with the head in one copy: a response may be megabytes)."""
    return b"".join([head.SerializeToString(), *entries])


def encode_sotw_response(head: discovery_pb2.DiscoveryResponse,
                         entries: Iterable[bytes]) -> bytes:
    """``head`` (everything but ``resources``) plus pre-encoded resource entries."""
    return b"".join([head.SerializeToString(), *entries])


# -- sizes, for keeping requests under a peer's message limit ------------------

# gRPC's largest message (a signed 32-bit length); istio-agent accepts as much.
MAX_MESSAGE_SIZE = 2**31 - 1


def varint_size(value: int) -> int:
    """Bytes of ``value`` as a protobuf varint."""
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def field_size(payload: int) -> int:
    """Bytes of one length-delimited field of ``payload`` bytes (field number < 16)."""
    return 1 + varint_size(payload) + payload


def text_size(text: str) -> int:
    """Bytes of ``text`` as a repeated string entry (``resource_names_*``)."""
    return field_size(len(text.encode()))


def pair_size(key: str, value: str) -> int:
    """Bytes of one ``map<string, string>`` entry (both fields counted, even if empty)."""
    return field_size(text_size(key) + text_size(value))


def locator_size(name: str, params: Iterable[tuple[str, str]]) -> int:
    """Bytes of a resource locator in a request: a plain name without parameters,
    a ``ResourceLocator`` (name and ``dynamic_parameters``) with them."""
    pairs = list(params)
    if not pairs:
        return text_size(name)
    return field_size(text_size(name) + sum(pair_size(k, v) for k, v in pairs))
