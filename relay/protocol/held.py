"""What a client holds of one resource, as far as a stream's state knows.

Mostly it is the very :class:`~relay.resource.CachedResource` last sent to it:
the state keeps a reference, so holding costs nothing per name and stream,
and a client holding exactly what the cache holds is recognised by
identity. A delta client's ``initial_resource_versions`` declare versions
only; those are a :class:`Declared`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from envoy.service.discovery.v3 import discovery_pb2

from relay.constraints import UNCONSTRAINED
from relay.resource import CachedResource


@dataclass(frozen=True, slots=True)
class Declared:
    """A version a delta client declared it holds (no variant or content known)."""

    version: str
    # what a sent resource has and a declaration does not
    name = ""
    variant_key = None
    resource_name: discovery_pb2.ResourceName | None = None
    digest = None

    def is_current(self, resource: CachedResource) -> bool:
        """Whether the declared version vouches for ``resource``.

        Only for a resource without variants: variants of one name may share
        a version, and the client may hold another one than its parameters
        now select.
        """
        return self.version == resource.version and resource.constraints is UNCONSTRAINED


# What a client holds of one name: what was sent to it (whose ``name`` is the
# resource's own, when it subscribed by an alias), or what it declared.
Held: TypeAlias = CachedResource | Declared
