"""One cached resource variant and the bytes every stream shares.

A resource is serialized once, when it enters the cache. Responses to any
number of streams are then assembled by concatenating these pre-encoded
fields (see :mod:`relay.encoding`), so fanning one update out to N streams
never serializes a resource N times.

Content, not the version string, says whether a resource changed: each
variant has a :attr:`~CachedResource.digest` of everything the origin sent
for it. An origin that sends no per-resource version (istiod) gets one
derived from that digest (:meth:`CachedResource.from_origin`), the same on
every replica that receives the same bytes.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from relay.constraints import UNCONSTRAINED, Constraints
from relay.encoding import field_size, length_delimited_field, varint

# Field numbers of ``resources`` in DeltaDiscoveryResponse and DiscoveryResponse.
_RESOURCES_FIELD = 2

_arrivals = itertools.count(1)
_last_arrival = 0


def _next_arrival() -> int:
    global _last_arrival
    _last_arrival = next(_arrivals)
    return _last_arrival


def _next_arrivals(count: int) -> list[int]:
    """``count`` arrival stamps in a row, drawn in one C call (no other
    thread's stamp between them): a response's resources made in bulk
    (:meth:`CachedResource.from_encoded_many`) stamped as one by one."""
    global _last_arrival
    stamps = list(itertools.islice(_arrivals, count))
    if stamps:
        _last_arrival = stamps[-1]
    return stamps


def arrival_clock() -> int:
    """The arrival stamp of the newest resource so far (0 before any).

    A subscriber records it when it subscribes: a do-not-cache resource
    stamped earlier arrived before it asked and is not served to it.
    """
    return _last_arrival


_do_not_cache_seen = False


def note_do_not_cache() -> None:
    """A resource marked do-not-cache has arrived: from now on subscribers
    stamp the names they subscribe (see :func:`do_not_cache_seen`).

    Called where such a resource is made from an origin message and where
    one enters a cache, so before anyone could subscribe after it arrived.
    """
    global _do_not_cache_seen
    _do_not_cache_seen = True


def do_not_cache_seen() -> bool:
    """Whether any resource marked do-not-cache has arrived in this process.

    Until one has, no copy that arrived before a client subscribed can be one
    it must not be served: a subscriber need not remember when it subscribed
    each name (a stamp a name, 3.7 MiB for a client of 100,000), and a name
    it subscribed with no stamp was subscribed before any such copy arrived.
    """
    return _do_not_cache_seen


def content_digest(resource: discovery_pb2.Resource) -> bytes:
    """A digest of a ``Resource`` as sent: its body, version and every other field.

    Deterministic serialization orders map entries, so equal messages give
    equal digests; the body is the origin's own bytes (istiod and
    go-control-plane marshal deterministically).
    """
    return hashlib.blake2b(resource.SerializeToString(deterministic=True),
                           digest_size=_DIGEST_BYTES).digest()


_DIGEST_BYTES = 8
# How long a derived version is as Resource.version (tag, length, hex digest).
_DERIVED_FIELD = 2 + 2 * _DIGEST_BYTES


class CachedResource:
    """A resource variant as the origin sent it.

    ``constraints`` are its ``DynamicParameterConstraints`` in canonical form
    (unconstrained when the origin sent a plain ``name``); their key is the
    variant's key in the cache. ``derived_version`` is set when the origin
    sent no version and ``version`` is the relay's, derived from the content.

    A cold client of 10,000 names makes 10,000 of these at once, so it is a
    plain class with slots, not a frozen dataclass (whose ``__init__`` sets
    each field through ``object.__setattr__``), and what only some readers
    need is computed when first read (:data:`_LAZY`), then kept in its slot:

    * ``resource``: the origin's ``Resource`` message; one made from its
      encoded bytes (:meth:`from_encoded`) is parsed only when read;
    * ``digest``: what tells this variant's content (and origin version)
      from another's: two copies with the same digest are the same update;
    * ``delta_entry``, ``sotw_entry``, ``sotw_wrapped_entry``,
      ``heartbeat_entry``, ``sotw_heartbeat_entry``: its encoded
      ``resources`` entries (see :mod:`relay.encoding`);
    * ``do_not_cache``, ``resource_name``: read from ``resource``.

    ``aliases`` and ``ttl_seconds`` are read from ``resource`` each time (a
    message changed after the copy is made, as tests do, is seen).
    """

    __slots__ = ("__weakref__", "_heartbeat", "arrival", "constraints", "delta_entry",
                 "derived_version", "digest", "do_not_cache", "heartbeat_entry", "name",
                 "received", "resource", "resource_name", "sotw_entry", "sotw_heartbeat_entry",
                 "sotw_wrapped_entry", "type_url", "variant_key", "version")

    #: Whether it is a plain resource made from its encoding, one the cache
    #: takes in bulk (see from_encoded); never one made from a message.
    plain: bool = False

    type_url: str
    name: str
    version: str
    constraints: Constraints
    variant_key: str
    # an order of arrival (see arrival_clock)
    arrival: int
    # when the relay received it (time.monotonic), for the push latency metric
    received: float
    derived_version: bool
    # computed on first read (see _LAZY)
    resource: discovery_pb2.Resource
    digest: bytes
    do_not_cache: bool
    resource_name: discovery_pb2.ResourceName | None
    _heartbeat: discovery_pb2.Resource
    heartbeat_entry: bytes
    sotw_heartbeat_entry: bytes
    delta_entry: bytes
    sotw_entry: bytes
    sotw_wrapped_entry: bytes

    def __init__(self, type_url: str, name: str, version: str, resource: discovery_pb2.Resource,
                 constraints: Constraints = UNCONSTRAINED, arrival: int | None = None,
                 received: float | None = None, derived_version: bool = False) -> None:
        self.type_url = type_url
        self.name = name
        self.version = version
        self.resource = resource
        self.constraints = constraints
        self.variant_key = constraints.key
        self.arrival = _next_arrival() if arrival is None else arrival
        self.received = time.monotonic() if received is None else received
        self.derived_version = derived_version

    def __repr__(self) -> str:
        return (f"CachedResource(type_url={self.type_url!r}, name={self.name!r}, "
                f"version={self.version!r}, constraints={self.constraints!r}, "
                f"derived_version={self.derived_version!r})")

    if not TYPE_CHECKING:
        def __getattr__(self, attribute: str) -> Any:
            # Only for a slot not set yet: computed now, kept from now on.
            compute = _LAZY.get(attribute)
            if compute is None:
                raise AttributeError(
                    f"{type(self).__name__!r} object has no attribute {attribute!r}")
            value = compute(self)
            setattr(self, attribute, value)
            return value

    @property
    def aliases(self) -> Sequence[str]:
        """Other names this resource goes by (``Resource.aliases``)."""
        aliases: Sequence[str] = self.resource.aliases
        return aliases

    @property
    def ttl_seconds(self) -> float | None:
        """The TTL the origin gave this resource, if any."""
        if not self.resource.HasField("ttl"):
            return None
        seconds: float = self.resource.ttl.ToTimedelta().total_seconds()
        return seconds

    @property
    def origin_version(self) -> str:
        """The version as the origin sent it (empty when the relay derived one)."""
        return "" if self.derived_version else self.version

    @classmethod
    def from_origin(cls, type_url: str, name: str, resource: discovery_pb2.Resource,
                    constraints: Constraints = UNCONSTRAINED) -> CachedResource:
        """From a ``Resource`` of an origin response (which it takes over).

        With no version from the origin, the relay gives it one derived from
        the content (and writes it into ``resource``, so that delta clients
        see it): a new content is a new version.
        """
        if resource.HasField("cache_control") and resource.cache_control.do_not_cache:
            # Noted as it is made, not only as it enters the cache: a response
            # is checked a few resources per turn of the event loop, and a
            # client subscribing in between is later than this copy.
            note_do_not_cache()
        if resource.version:
            return cls(type_url, name, resource.version, resource, constraints)
        digest = content_digest(resource)
        resource.version = digest.hex()
        made = cls(type_url, name, resource.version, resource, constraints,
                   derived_version=True)
        # The content's digest, taken before the version was written in: a
        # later copy of the same content gets the same one.
        made.digest = digest
        return made

    @classmethod
    def from_encoded(cls, type_url: str, name: str, version: str, entry: bytes,
                     received: float) -> CachedResource:
        """From a plain origin ``Resource`` as a delta ``resources`` entry
        (``entry``: tag, length, encoding): a name, a version (maybe empty)
        and a body, nothing else of ``Resource``'s (no constraints, aliases,
        TTL, cache control or metadata).

        Made as :meth:`from_origin` makes it from the parsed message, with the
        same version, digest and entries, without parsing it: the encoding is
        the deterministic one (none of its fields is a map), so its digest is
        :func:`content_digest`'s; a derived version, field 1, goes first,
        where encoding the message with it writes it.
        """
        made = _Plain(type_url, name, version, received)
        if version:
            made.delta_entry = entry
        else:
            _derive(made, entry)
        return made

    @classmethod
    def from_encoded_many(cls, type_url: str, names: Sequence[str], versions: Sequence[str],
                          entries: Sequence[bytes], received: float) -> list[CachedResource]:
        """:meth:`from_encoded` of each (name, version, entry), in order;
        ``versions`` empty: none has one.

        When every one has a version from the origin (the common case), made
        here in one loop with no call per resource: a cold client's 10,000
        cost a call to :meth:`from_encoded` and one to its ``__init__`` each
        (2,000 plain resources 0.74-0.79 ms, against 0.39-0.61 ms here).
        Versions the relay derives (istiod) are made by :meth:`from_encoded`,
        one by one: hashing each entry dwarfs the calls.
        """
        if not versions or "" in versions:
            from_encoded = cls.from_encoded
            return [from_encoded(type_url, name, version, entry, received)
                    for name, version, entry in zip(
                        names, versions or [""] * len(names), entries, strict=True)]
        new = object.__new__
        made: list[CachedResource] = []
        append = made.append
        for name, version, entry, arrival in zip(names, versions, entries,
                                                 _next_arrivals(len(names)), strict=True):
            plain = new(_Plain)
            plain.type_url = type_url
            plain.name = name
            plain.version = version
            plain.arrival = arrival
            plain.received = received
            plain.derived_version = False
            plain.delta_entry = entry
            append(plain)
        return made

    @classmethod
    def from_resent_many(cls, type_url: str, names: Sequence[str], versions: Sequence[str],
                         payloads: Sequence[bytes], received: float,
                         cached: Mapping[str, CachedResource], prefix: Callable[[int], bytes]
                         ) -> tuple[list[CachedResource], list[bytes]]:
        """:meth:`from_encoded_many` of a resend, and the entries to decode:
        those not byte for byte the one the copy of their name in ``cached``
        was made from. ``payloads``: each entry's message (the entry is
        ``prefix(len(payload)) + payload``: framed only if it is decoded).

        A copy made from an entry is a plain one (:meth:`from_encoded`),
        made once its body decoded: the same bytes decode again, to the same
        version and digest. So a resent entry gives that very copy (not
        decoded, not hashed, nothing made: the cache keeps the copy it holds
        of a content resent, and tells it apart by identity, see
        :meth:`~relay.cache.ResourceCache.apply`). That entry is the origin's
        message framed, where the origin sent a version; with the derived
        version first, where the relay derived one: the same message if the
        entry ends with it and is as long as such an entry of it. The others
        are made by :meth:`from_encoded`, as :meth:`from_encoded_many` makes
        them.
        """
        derived = not versions
        extra = _DERIVED_FIELD if derived else 0
        get = cached.get
        from_encoded = cls.from_encoded
        made: list[CachedResource] = []
        append = made.append
        fresh: list[bytes] = []
        for name, version, payload in zip(names, versions or [""] * len(names), payloads,
                                          strict=True):
            old = get(name)
            if old is not None and old.plain and old.derived_version is derived:
                held = old.delta_entry
                if len(held) == _entry_size(len(payload) + extra) and held.endswith(payload):
                    append(old)
                    continue
            entry = prefix(len(payload)) + payload
            fresh.append(entry)
            append(from_encoded(type_url, name, version, entry, received))
        return made, fresh

    def is_current(self, resource: CachedResource) -> bool:
        """Whether a client holding this copy holds ``resource``: the same
        variant with the same content (and origin version)."""
        return self is resource or (self.digest == resource.digest and
                                    self.variant_key == resource.variant_key)

    @classmethod
    def from_message(cls, type_url: str, body: any_pb2.Any | None, name: str, version: str,
                     constraints: Constraints = UNCONSTRAINED,
                     template: discovery_pb2.Resource | None = None) -> CachedResource:
        """Build from an origin ``Resource`` (``template``) or a bare body."""
        resource = discovery_pb2.Resource()
        if template is not None:
            resource.CopyFrom(template)
        else:
            resource.name = name
        resource.version = version
        if body is not None:
            resource.resource.CopyFrom(body)
        return cls(type_url, name, version, resource, constraints)

    @property
    def body(self) -> any_pb2.Any:
        body: any_pb2.Any = self.resource.resource
        return body


class _Plain(CachedResource):
    """A plain resource made from its encoding (see :meth:`CachedResource.from_encoded`):
    what all plain ones share is the class's, not set on each."""

    __slots__ = ()

    constraints = UNCONSTRAINED
    variant_key = UNCONSTRAINED.key
    aliases: tuple[str, ...] = ()
    ttl_seconds = None
    do_not_cache = False
    resource_name = None
    plain = True

    def __init__(self, type_url: str, name: str, version: str, received: float) -> None:
        # (no super().__init__: one call less for each of 10,000)
        self.type_url = type_url
        self.name = name
        self.version = version
        self.arrival = _next_arrival()
        self.received = received
        self.derived_version = False

    def __repr__(self) -> str:
        return "plain " + super().__repr__()


@functools.lru_cache(maxsize=1_024)
def _entry_size(payload: int) -> int:
    """How long a ``resources`` entry of a message of ``payload`` bytes is
    (one lookup a resource: bodies are often of a few lengths)."""
    return field_size(payload)


def _derive(made: CachedResource, entry: bytes) -> None:
    """Give ``made``, a plain resource with no version from the origin, the
    version derived from its entry (see :meth:`CachedResource.from_encoded`)."""
    encoded = _payload(entry)
    digest = made.digest = _digest(encoded)
    made.version = version = digest.hex()
    made.derived_version = True
    encoded = _VERSION_TAG + varint(len(version)) + version.encode() + encoded
    made.delta_entry = _ENTRY_TAG + varint(len(encoded)) + encoded



# -- what a CachedResource computes on first read ------------------------------

# The tags of field 1 (Resource.version) and field 2 (``resources``), length-delimited.
_VERSION_TAG = b"\x0a"
_ENTRY_TAG = b"\x12"
_WRAPPED_TYPE = "type.googleapis.com/envoy.service.discovery.v3.Resource"


def _digest(encoded: bytes) -> bytes:
    return hashlib.blake2b(encoded, digest_size=_DIGEST_BYTES).digest()


def _payload(entry: bytes) -> bytes:
    """The encoded message of a length-delimited field (its tag is one byte)."""
    start = 1
    while entry[start] & 0x80:
        start += 1
    return entry[start + 1:]


def _resource(made: CachedResource) -> discovery_pb2.Resource:
    # Only one made from its encoding has no message yet: its delta entry is set.
    return discovery_pb2.Resource.FromString(_payload(made.delta_entry))


def _content_digest(made: CachedResource) -> bytes:
    try:
        resource = object.__getattribute__(made, "resource")
    except AttributeError:
        # Made from its encoding (from_encoded), not parsed since: the
        # entry's message is the deterministic encoding content_digest takes.
        return _digest(_payload(made.delta_entry))
    return content_digest(resource)


def _resource_name(made: CachedResource) -> discovery_pb2.ResourceName | None:
    """Name and constraints, for variants sent with constraints (else None)."""
    if made.constraints is UNCONSTRAINED:
        return None
    name: discovery_pb2.ResourceName = made.resource.resource_name
    return name


def _heartbeat(made: CachedResource) -> discovery_pb2.Resource:
    beat = discovery_pb2.Resource()
    beat.CopyFrom(made.resource)
    beat.ClearField("resource")
    return beat


def _wrapped(value: bytes) -> bytes:
    """A ``Resource``'s encoding wrapped in ``Any``, as one SotW ``resources`` entry."""
    wrapped = any_pb2.Any(type_url=_WRAPPED_TYPE, value=value)
    return length_delimited_field(_RESOURCES_FIELD, wrapped.SerializeToString())


def _encoded(message: Message) -> bytes:
    """``message``'s deterministic encoding: a map inside it (a resource's
    metadata, a body's) is written in key order, so the same content always
    gives the same entry bytes, however its map was filled or parsed."""
    data: bytes = message.SerializeToString(deterministic=True)
    return data


_LAZY: dict[str, Callable[[CachedResource], object]] = {
    "resource": _resource,
    "digest": _content_digest,
    "do_not_cache": lambda made: bool(made.resource.cache_control.do_not_cache),
    "resource_name": _resource_name,
    "_heartbeat": _heartbeat,
    # this resource without its body (a heartbeat) as a delta ``resources`` entry
    "heartbeat_entry": lambda made: length_delimited_field(
        _RESOURCES_FIELD, _encoded(made._heartbeat)),
    # a heartbeat wrapped in ``Any``, for SotW clients that accept ``Resource``
    "sotw_heartbeat_entry": lambda made: _wrapped(_encoded(made._heartbeat)),
    # one encoded ``resources`` entry of a DeltaDiscoveryResponse
    "delta_entry": lambda made: length_delimited_field(
        _RESOURCES_FIELD, _encoded(made.resource)),
    # the body as one encoded ``resources`` entry of a DiscoveryResponse
    "sotw_entry": lambda made: length_delimited_field(
        _RESOURCES_FIELD, _encoded(made.body)),
    # the whole ``Resource`` wrapped in ``Any``, for SotW clients that accept it
    "sotw_wrapped_entry": lambda made: _wrapped(_encoded(made.resource)),
}
