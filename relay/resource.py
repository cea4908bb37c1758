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

import hashlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.constraints import UNCONSTRAINED, Constraints
from relay.encoding import length_delimited_field

# Field numbers of ``resources`` in DeltaDiscoveryResponse and DiscoveryResponse.
_RESOURCES_FIELD = 2

T = TypeVar("T")


class cached_property(Generic[T]):  # named as the functools one it replaces
    """Computed on first read, then an ordinary attribute.

    functools.cached_property takes a lock on every first read before Python
    3.12; a relay reads several per resource as it enters the cache (10,000
    resources: 0.12 s of 0.49 s in cProfile). The cache has one writer, the
    event loop, so two threads never compute the same one.
    """

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self._compute = compute
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type) -> cached_property[T]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> T: ...
    def __get__(self, instance: object | None, owner: type) -> T | cached_property[T]:
        if instance is None:
            return self
        value = self._compute(instance)
        instance.__dict__[self._name] = value
        return value


_arrivals = itertools.count(1)
_last_arrival = 0


def _next_arrival() -> int:
    global _last_arrival
    _last_arrival = next(_arrivals)
    return _last_arrival


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


@dataclass(frozen=True, eq=False)
class CachedResource:
    """A resource variant as the origin sent it.

    ``constraints`` are its ``DynamicParameterConstraints`` in canonical form
    (unconstrained when the origin sent a plain ``name``); their key is the
    variant's key in the cache. ``derived_version`` is set when the origin
    sent no version and ``version`` is the relay's, derived from the content.
    """

    type_url: str
    name: str
    version: str
    resource: discovery_pb2.Resource = field(repr=False)
    constraints: Constraints = UNCONSTRAINED
    arrival: int = field(default_factory=_next_arrival, repr=False)
    # when the relay received it (time.monotonic), for the push latency metric
    received: float = field(default_factory=time.monotonic, repr=False)
    derived_version: bool = False

    @cached_property
    def digest(self) -> bytes:
        """What tells this variant's content (and origin version) from another's.

        Two copies with the same digest are the same update: a resend of one
        is not news, and a client holding one holds the other.
        """
        return content_digest(self.resource)

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
        made.__dict__["digest"] = digest
        return made

    @cached_property
    def variant_key(self) -> str:
        return self.constraints.key

    def is_current(self, resource: CachedResource) -> bool:
        """Whether a client holding this copy holds ``resource``: the same
        variant with the same content (and origin version)."""
        return self is resource or (self.digest == resource.digest and
                                    self.variant_key == resource.variant_key)

    @cached_property
    def resource_name(self) -> discovery_pb2.ResourceName | None:
        """Name and constraints, for variants sent with constraints (else None)."""
        if self.constraints is UNCONSTRAINED:
            return None
        name: discovery_pb2.ResourceName = self.resource.resource_name
        return name

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
    def ttl_seconds(self) -> float | None:
        """The TTL the origin gave this resource, if any."""
        if not self.resource.HasField("ttl"):
            return None
        seconds: float = self.resource.ttl.ToTimedelta().total_seconds()
        return seconds

    @cached_property
    def do_not_cache(self) -> bool:
        return bool(self.resource.cache_control.do_not_cache)

    @cached_property
    def _heartbeat(self) -> discovery_pb2.Resource:
        beat = discovery_pb2.Resource()
        beat.CopyFrom(self.resource)
        beat.ClearField("resource")
        return beat

    @cached_property
    def heartbeat_entry(self) -> bytes:
        """This resource without its body (a heartbeat) as a delta ``resources`` entry."""
        return length_delimited_field(_RESOURCES_FIELD, self._heartbeat.SerializeToString())

    @cached_property
    def sotw_heartbeat_entry(self) -> bytes:
        """A heartbeat wrapped in ``Any``, for SotW clients that accept ``Resource``."""
        wrapped = any_pb2.Any(type_url="type.googleapis.com/envoy.service.discovery.v3.Resource",
                              value=self._heartbeat.SerializeToString())
        return length_delimited_field(_RESOURCES_FIELD, wrapped.SerializeToString())

    @property
    def body(self) -> any_pb2.Any:
        body: any_pb2.Any = self.resource.resource
        return body

    @cached_property
    def delta_entry(self) -> bytes:
        """This resource as one encoded ``resources`` entry of a DeltaDiscoveryResponse."""
        return length_delimited_field(_RESOURCES_FIELD, self.resource.SerializeToString())

    @cached_property
    def sotw_entry(self) -> bytes:
        """This resource's body as one encoded ``resources`` entry of a DiscoveryResponse."""
        return length_delimited_field(_RESOURCES_FIELD, self.body.SerializeToString())

    @cached_property
    def sotw_wrapped_entry(self) -> bytes:
        """The whole ``Resource`` wrapped in ``Any``, for SotW clients that accept it."""
        wrapped = any_pb2.Any(type_url="type.googleapis.com/envoy.service.discovery.v3.Resource",
                              value=self.resource.SerializeToString())
        return length_delimited_field(_RESOURCES_FIELD, wrapped.SerializeToString())
