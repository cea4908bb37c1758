"""Checking an origin response's resources in bulk, in C, not one by one.

A cold client of 10,000 names makes the origin send one response of 10,000
resources, each to be checked (its body decoded, so that a bad one is
NACKed) and cached. Done resource by resource, that is a Python object, a
decode call and a re-encoding per resource. Most responses hold only
*plain* resources: a name, a version (or none) and a body of the
response's type, nothing else of ``Resource``'s. For those,
:func:`plain_resources` takes the response apart, as received, with
protobuf messages made for it at run time (*shadow* types): bytes and an
embedded message share the wire format, so a field can be read as either.

* ``Undecoded`` (:func:`undecoded`) is the response with each
  ``resources`` entry read as bytes: the rest of it is parsed at once, its
  resources a slice at a time. A slice is encoded again, the one
  encoding that digests and resends are compared on (the general check's):
  where the origin's is the same (most often), its bytes are reused as
  they are; where not (its own field order, a field twice), ``Entries``
  reads the new encoding's entries. No call but that first parse (a copy of
  the entries) takes the whole response: gRPC's parse of 64 MiB held the
  event loop 39-60 ms, encoding it again 190-260 ms. The general check
  takes a response's resources a slice at a time too
  (:func:`sliced_resources`).
* ``Listed`` reads a slice's entries as one message: occurrences
  of a message field merge, and its repeated fields concatenate, so one
  parse lists every name, every version, every body's type URL, and any
  field beyond them (which a plain resource has not) in a list of its own.
* ``Checked`` reads ``Any.value`` as the response's message type: parsing
  it decodes every body in one C call, a slice of entries at a time.

A resend is not decoded again: istiod ends each stream at its maximum
connection age and sends every resource again, unchanged, on the next one.
An entry byte for byte the one the cached copy of its name was made from
(see :meth:`~relay.resource.CachedResource.from_resent_many`) decoded then; only the others are
decoded, and the copy's version, digest and entry are reused (no hashing
where the relay derives the version). What is NACKed, cached and served is
what checking all of them gives.

Anything else (an extra field, a resource without a body or of another
type, a missing or repeated name, a body that does not decode) sends the
whole response to the general check in :mod:`relay.upstream.responses`,
which finds the resource at fault and says why: the reasons, and what is
cached, are the general check's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from functools import cache, lru_cache
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory
from google.protobuf.descriptor import Descriptor

from relay.encoding import varint
from relay.resource import CachedResource
from relay.xds_types import message_class

# How many resources one bulk decode takes at most (one pause of the parser's
# per slice: see responses.RESOURCES_PER_STEP).
SLICE = 1_000
# About how many bytes of resources one bulk decode takes (at least one
# resource). Decoded, a slice takes several times its encoded size in
# protobuf's arena, freed once it is checked: 1,000 ClusterLoadAssignments of
# 1.3 KB took 7.9 MiB and 9 ms, which the heap keeps for the next slice
# (relay.memory.TRIM_THRESHOLD); 1,000 of 13 KB took 141 MiB, and held the
# event loop 120 ms in one call.
SLICE_BYTES = 1024 * 1024
# Fewer resources than this are checked one by one: the shadow types' fixed
# cost (encoding the response, three parses) is not worth it.
BULK_FROM = 32

# Resource's fields a plain resource has not (all but version, resource, name):
# (name, number)
_EXTRAS = tuple((field.name, field.number) for field in discovery_pb2.Resource.DESCRIPTOR.fields
                if field.number not in {1, 2, 3})
# The tag of DeltaDiscoveryResponse.resources (field 2, length-delimited).
_ENTRY_TAG = b"\x12"
_PACKAGE = "xds_relay.shadow"

_F = descriptor_pb2.FieldDescriptorProto
# a field of a shadow type: name, number, type, label, message type (if one)
_Field = tuple[str, int, Any, Any, str | None]


class Shadows:
    """The shadow types of one response type (see the module's docstring)."""

    def __init__(self, classes: dict[str, Any]) -> None:
        # (made at run time: to mypy, messages of no known fields)
        self.entries = classes["Entries"]
        self.checked = classes["Checked"]
        self.listed = classes["Listed"]


def shadows(type_url: str) -> Shadows:
    """The shadow types for responses of ``type_url``: those of its message
    (any type URL naming it), or, for a type this process does not know,
    the ones that read bodies as bytes."""
    body = message_class(type_url)
    return _shadows(body.DESCRIPTOR if body is not None else None)


def prepare(type_urls: Iterable[str]) -> None:
    """Make the shadow types of ``type_urls`` now, as the upstream starts:
    the first call imports every known type's generated modules (14-30 ms
    for Envoy's) and adds a file to the descriptor pool, which would
    otherwise be paid inside the first big response's check, on a cold
    client's path (17 % of a cold 10,000-name join's main-thread samples)."""
    for type_url in type_urls:
        with contextlib.suppress(TypeError):  # (refused: checked one by one later)
            shadows(type_url)


def undecoded(raw: bytes) -> Any:
    """An origin response as received, parsed but for its resources: their
    entries are left as the origin encoded them (bytes), for
    :func:`plain_resources` to check a slice at a time. A
    ``DeltaDiscoveryResponse`` in all its other fields. Raises
    :class:`~google.protobuf.message.DecodeError` where ``raw`` is not one.

    gRPC's own parse of a 64 MiB response (50,000 resources) held the event
    loop 39-60 ms, and encoding it again, once, 190-260 ms: this one copies
    the entries, 9-33 ms (``benchmarks/results/AFTER-issue27-r12/micro.log``)."""
    return _undecoded_type().FromString(raw)


@cache
def _undecoded_type() -> Any:
    """``DeltaDiscoveryResponse``, its ``resources`` read as bytes (made once)."""
    response = discovery_pb2.DeltaDiscoveryResponse.DESCRIPTOR
    file = descriptor_pb2.FileDescriptorProto(
        name=f"{_PACKAGE.replace('.', '/')}/undecoded.proto", package=_PACKAGE,
        syntax="proto3")  # (as the response's: its strings are checked as UTF-8)
    file.dependency.extend([response.file.name, *(d.name for d in response.file.dependencies)])
    made = file.message_type.add()
    response.CopyToProto(made)
    made.name = "Undecoded"
    for field in made.field:
        if field.name == "resources":
            field.type = _F.TYPE_BYTES
            field.ClearField("type_name")
    pool = descriptor_pool.Default()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.Undecoded"))


@cache
def _shadows(body: Descriptor | None) -> Shadows:
    """Made once per message type (a file of the default descriptor pool can
    be added once), under a package named after it."""
    full_name = body.full_name if body is not None else None
    package = f"{_PACKAGE}.{'unknown' if full_name is None else 'of.' + full_name}"
    file = descriptor_pb2.FileDescriptorProto(
        name=f"{package.replace('.', '/')}.proto", package=package, syntax="proto2")
    if body is not None:
        file.dependency.append(body.file.name)
    _message(file, "Entries", [("resources", 2, _F.TYPE_BYTES, _F.LABEL_REPEATED, None)])
    _message(file, "BodiesListed", [("type_url", 1, _F.TYPE_BYTES, _F.LABEL_REPEATED, None),
                                    ("value", 2, _F.TYPE_BYTES, _F.LABEL_REPEATED, None)])
    _message(file, "AllListed", [
        ("version", 1, _F.TYPE_STRING, _F.LABEL_REPEATED, None),
        ("resource", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, f".{package}.BodiesListed"),
        ("name", 3, _F.TYPE_STRING, _F.LABEL_REPEATED, None),
        *((name, number, _F.TYPE_BYTES, _F.LABEL_REPEATED, None) for name, number in _EXTRAS)])
    _message(file, "Listed", [("resources", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL,
                               f".{package}.AllListed")])
    value = (("value", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, f".{full_name}")
             if full_name is not None else ("value", 2, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None))
    _message(file, "Body", [value])
    _message(file, "CheckedResource", [
        ("version", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("resource", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, f".{package}.Body"),
        ("name", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None)])
    _message(file, "Checked", [("resources", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED,
                                f".{package}.CheckedResource")])
    pool = descriptor_pool.Default()
    pool.Add(file)
    return Shadows({name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in ("Entries", "Checked", "Listed")})


def _message(file: descriptor_pb2.FileDescriptorProto, name: str,
             fields: Sequence[_Field]) -> None:
    made = file.message_type.add(name=name)
    for field_name, number, kind, label, type_name in fields:
        field = made.field.add(name=field_name, number=number, type=kind, label=label)
        if type_name is not None:
            field.type_name = type_name


Bulk = Generator[None, None, list[CachedResource] | None]
#: The copies the relay holds of some names of a type, by name (those it
#: holds, unconstrained: :meth:`relay.cache.ResourceCache.served_to_all`).
Known = Callable[[str, list[str]], Mapping[str, CachedResource]]


def plain_resources(payloads: Sequence[bytes], size: int, type_url: str, received: float,
                    step: bool = True, known: Known | None = None) -> Bulk:
    """The response's resources, checked and made in bulk, when every one is
    plain and decodes; None when any is not (or there are too few to be
    worth it): the general check then finds which and why. ``payloads``:
    the ``resources`` entries as the origin encoded them (:func:`undecoded`),
    ``size`` bytes in all. A generator that pauses (yields) when ``step``,
    after each slice (:data:`SLICE` resources, or fewer: about
    :data:`SLICE_BYTES`).

    With ``known``, an entry that the cached copy of its name was made from
    is not decoded again (see the module's docstring); a cold response pays
    a lookup a name, in C (no call each), and no more."""
    count = len(payloads)
    if count < BULK_FROM:
        return None
    try:
        found = shadows(type_url)
    except TypeError:  # (the pool refused the types: checked one by one, as before)
        return None
    per_slice = _per_slice(count, size)
    seen: set[str] = set()
    made: list[CachedResource] = []
    for start in range(0, count, per_slice):
        if step and start:
            yield
        some = _plain_slice(found, payloads[start:start + per_slice], type_url, received, known)
        if some is None:
            return None
        names, resources = some
        seen.update(names)
        if len(seen) != start + len(names):  # (a name twice)
            return None
        made += resources
    return made


def _plain_slice(found: Shadows, payloads: Sequence[bytes], type_url: str, received: float,
                 known: Known | None) -> tuple[list[str], list[CachedResource]] | None:
    """One slice of :func:`plain_resources`: its names and resources, or None."""
    entries = _framed(payloads)
    joined = b"".join(entries)
    encoded = _canonical(joined)
    if encoded is None:
        return None
    if encoded != joined:
        # (the origin's own encoding: the canonical one is what the general
        # check makes, and what digests and resends are compared on)
        payloads = found.entries.FromString(encoded).resources[:]
        entries = _framed(payloads)
    del joined
    listed = _plain_listed(found, encoded, type_url, len(payloads))
    if listed is None:
        return None
    names, versions = listed
    # (only where all or none have a version: some with one read theirs from
    # Checked, which then decodes all)
    cached = known(type_url, names) if known is not None and versions is not None else None
    resent = None
    if cached and versions is not None:
        # (a resend: the copies made, and the entries to decode, framed)
        resent, fresh = CachedResource.from_resent_many(
            type_url, names, versions, payloads, received, cached, _entry_prefix)
        encoded = b"".join(fresh)
    try:
        # (decoded to be checked: the names, and most often the versions, are listed)
        checked = found.checked.FromString(encoded)
    except message.DecodeError:
        return None
    return names, resent if resent is not None else CachedResource.from_encoded_many(
        type_url, names, (versions if versions is not None
                          else [resource.version for resource in checked.resources]),
        entries, received)


def _canonical(entries: bytes) -> bytes | None:
    """The encoding protobuf makes of ``entries`` (a response of ``resources``
    entries only), or None if they do not decode: an origin's encoder may
    order a resource's fields as declared (name first), or repeat one, where
    the relay's (and the general check's) writes each once, by number."""
    try:
        parsed = discovery_pb2.DeltaDiscoveryResponse.FromString(entries)
        encoded: bytes = parsed.SerializeToString()
    except message.DecodeError:
        return None
    return encoded


def sliced_resources(payloads: Sequence[bytes], size: int) -> Iterator[discovery_pb2.Resource]:
    """The resources of a response's ``payloads`` (:func:`undecoded`, ``size``
    bytes in all), parsed a slice at a time as they are taken (:data:`SLICE`,
    or fewer: about :data:`SLICE_BYTES`), for the general check: a response
    that is not plain is never parsed whole in one call either. Raises
    :class:`~google.protobuf.message.DecodeError` at a slice that does not
    decode."""
    per_slice = _per_slice(len(payloads), size)
    for start in range(0, len(payloads), per_slice):
        yield from _parsed_entries(b"".join(_framed(payloads[start:start + per_slice]))).resources


def _parsed_entries(entries: bytes) -> discovery_pb2.DeltaDiscoveryResponse:
    """A response of ``resources`` entries only, parsed."""
    return discovery_pb2.DeltaDiscoveryResponse.FromString(entries)


def _per_slice(count: int, size: int) -> int:
    """How many of ``count`` resources, ``size`` bytes in all, make a slice
    (:data:`SLICE`, :data:`SLICE_BYTES`): by their average size, where their
    own sizes would be read by copying each out of the message once more."""
    return max(1, min(SLICE, SLICE_BYTES * count // max(1, size)))


def _framed(payloads: Iterable[bytes]) -> list[bytes]:
    """Each resource's encoding framed as a ``resources`` entry (tag, length)."""
    return [_entry_prefix(len(payload)) + payload for payload in payloads]


@lru_cache(maxsize=1_024)
def _entry_prefix(length: int) -> bytes:
    """An entry's tag and length: the bodies of a response are often of a
    few lengths, and a cached prefix costs a third of making it (10,000
    entries 2 ms, against 5 ms with a varint call each)."""
    return _ENTRY_TAG + varint(length)


def _plain_listed(found: Shadows, encoded: bytes, type_url: str, count: int
                  ) -> tuple[list[str], list[str] | None] | None:
    """Every resource's name and version (an empty list if no resource has
    one; None if only some have), in order, if every resource of the
    encoded response has a name, a body of ``type_url`` and no field but
    name, version and body; None if not.

    ``encoded`` is a message's own encoding, with at most one occurrence of
    each field a resource, and none of an empty string: a list of ``count``
    names then holds one a resource (and so do the versions, the bodies).
    Read in one parse and no call per resource (2,000 resources 0.5-0.8 ms,
    against 1.1-1.5 ms for ``Extras``, the plain check it replaces, and
    reading name and version from each decoded resource).
    """
    listed = found.listed.FromString(encoded).resources
    names: list[str] = list(listed.name)
    if len(names) != count or any(getattr(listed, name) for name, _ in _EXTRAS):
        return None
    bodies = listed.resource
    bodies.ClearField("value")
    bodies.DiscardUnknownFields()  # (an Any's fields beyond its two: dropped, as before)
    # every body's type URL, once a resource (an empty one, written out: none)
    if bodies.SerializeToString() != _field(1, type_url.encode()) * count:
        return None
    versions: list[str] = list(listed.version)
    # (only some with a version: not one a resource, read each from Checked)
    return names, versions if len(versions) in (0, count) else None


def _field(number: int, payload: bytes) -> bytes:
    return bytes(((number << 3) | 2,)) + varint(len(payload)) + payload
