"""One cached resource variant and the bytes every stream shares.

A resource is serialized once, when it enters the cache. Responses to any
number of streams are then assembled by concatenating these pre-encoded
fields (see :mod:`relay.encoding`), so fanning one update out to N streams
never serializes a resource N times.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from functools import cached_property

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.constraints import UNCONSTRAINED, Constraints
from relay.encoding import length_delimited_field

# Field numbers of ``resources`` in DeltaDiscoveryResponse and DiscoveryResponse.
_RESOURCES_FIELD = 2

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


@dataclass(frozen=True, eq=False)
class CachedResource:
    """A resource variant as the origin sent it.

    ``constraints`` are its ``DynamicParameterConstraints`` in canonical form
    (unconstrained when the origin sent a plain ``name``); their key is the
    variant's key in the cache.
    """

    type_url: str
    name: str
    version: str
    resource: discovery_pb2.Resource = field(repr=False)
    constraints: Constraints = UNCONSTRAINED
    arrival: int = field(default_factory=_next_arrival, repr=False)
    # when the relay received it (time.monotonic), for the push latency metric
    received: float = field(default_factory=time.monotonic, repr=False)

    @property
    def variant_key(self) -> str:
        return self.constraints.key

    @property
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

    @property
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
