"""One stored name: the bytes of its variants as the origin sent them, no I/O.

A snapshot holds one *entry* per (type URL, name): every cached variant of
the name, each as the encoded ``Resource`` the relay received (its
constraints, version, TTL, aliases and body inside), plus what the
``Resource`` cannot say: whether the relay derived the version (istiod sends
none) and, for a TTL'd variant, the wall-clock time its TTL lapses.

Layout (format 1)::

    entry   := b"xr" FORMAT varint(len(name)) name variant*
    variant := flags(1 byte) [expiry: 8-byte big-endian double, if flags & 2]
               0x12 varint(len(resource)) resource

``0x12 varint resource`` is the variant's cached ``delta_entry``: writing an
entry copies bytes the relay already has, and encodes nothing again.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import message

from relay.constraints import InvalidConstraints, compile_constraints
from relay.encoding import varint
from relay.errors import RelayError
from relay.resource import CachedResource
from relay.upstream.responses import resource_name_of

#: Bumped when the layout changes; a snapshot of another format is not read.
FORMAT = 1
_MAGIC = b"xr" + bytes((FORMAT,))
_DERIVED = 1  # the relay derived the version from the content
_EXPIRES = 2  # an expiry (wall clock) follows
_RESOURCE_TAG = 0x12  # field 2, length-delimited: ``delta_entry``'s tag
_EXPIRY = struct.Struct(">d")


class CorruptEntry(RelayError, ValueError):
    """An entry that cannot be read; the message says why."""


@dataclass(frozen=True, slots=True)
class StoredVariant:
    """A variant read back: the resource, and when (wall clock) its TTL lapses."""

    resource: CachedResource
    expires_at: float | None


def encode_entry(name: str, variants: Iterable[tuple[CachedResource, float | None]]) -> bytes:
    """The entry of ``name``: each variant with its expiry (wall clock) or None."""
    encoded_name = name.encode()
    parts = [_MAGIC, varint(len(encoded_name)), encoded_name]
    for resource, expires_at in variants:
        flags = (_DERIVED if resource.derived_version else 0) | \
            (_EXPIRES if expires_at is not None else 0)
        parts.append(bytes((flags,)))
        if expires_at is not None:
            parts.append(_EXPIRY.pack(expires_at))
        parts.append(resource.delta_entry)
    return b"".join(parts)


def decode_entry(type_url: str, blob: bytes) -> tuple[str, list[StoredVariant]]:
    """The name and variants of an entry of ``type_url``; raises :class:`CorruptEntry`.

    A variant whose version the relay derived is rebuilt as if it had just
    arrived without one, so that its digest (and version) is what the
    origin's next copy of the same content gets: a resend is no news.
    """
    if not blob.startswith(_MAGIC):
        found = f"an entry of format {blob[2]}" if blob[:2] == b"xr" and len(blob) > 2 \
            else "not an entry"
        raise CorruptEntry(f"{found}, expected format {FORMAT}")
    view = memoryview(blob)
    size, at = _read_varint(view, len(_MAGIC))
    name = _take(view, at, size).decode("utf-8", errors="strict")
    at += size
    variants: list[StoredVariant] = []
    while at < len(view):
        flags = view[at]
        at += 1
        expires_at = None
        if flags & _EXPIRES:
            (expires_at,) = _EXPIRY.unpack(_take(view, at, _EXPIRY.size))
            at += _EXPIRY.size
        if at >= len(view) or view[at] != _RESOURCE_TAG:
            raise CorruptEntry(f"variant {len(variants) + 1}: no resource")
        size, at = _read_varint(view, at + 1)
        variants.append(StoredVariant(
            _resource(type_url, name, _take(view, at, size), bool(flags & _DERIVED)),
            expires_at))
        at += size
    if not variants:
        raise CorruptEntry("no variants")
    return name, variants


def _resource(type_url: str, name: str, data: bytes, derived: bool) -> CachedResource:
    try:
        resource = discovery_pb2.Resource.FromString(data)
    except message.DecodeError as error:
        raise CorruptEntry(f"a resource cannot be decoded: {error}") from None
    if resource_name_of(resource) != name:
        raise CorruptEntry(f"holds a resource named {resource_name_of(resource)!r}")
    if resource.resource.type_url != type_url:
        raise CorruptEntry(f"holds a resource of type {resource.resource.type_url!r}")
    try:
        constraints = compile_constraints(resource.resource_name.dynamic_parameter_constraints)
    except InvalidConstraints as error:
        raise CorruptEntry(f"invalid constraints: {error}") from None
    if derived:
        resource.version = ""  # derived again, from the same content
    return CachedResource.from_origin(type_url, name, resource, constraints)


def _take(view: memoryview, at: int, size: int) -> bytes:
    if at + size > len(view):
        raise CorruptEntry("truncated")
    return bytes(view[at:at + size])


def _read_varint(view: memoryview, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the position after it."""
    value = shift = 0
    while True:
        if at >= len(view) or shift > 63:
            raise CorruptEntry("truncated")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
