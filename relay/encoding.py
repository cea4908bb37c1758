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


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def length_delimited_field(number: int, payload: bytes) -> bytes:
    """Encode ``payload`` as field ``number`` with wire type 2 (length-delimited)."""
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def encode_delta_response(head: discovery_pb2.DeltaDiscoveryResponse,
                          entries: Iterable[bytes]) -> bytes:
    """``head`` (everything but ``resources``) plus pre-encoded resource entries."""
    fields: bytes = head.SerializeToString()
    return fields + b"".join(entries)


def encode_sotw_response(head: discovery_pb2.DiscoveryResponse,
                         entries: Iterable[bytes]) -> bytes:
    """``head`` (everything but ``resources``) plus pre-encoded resource entries."""
    fields: bytes = head.SerializeToString()
    return fields + b"".join(entries)
