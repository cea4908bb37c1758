"""What a client holds of one resource, as far as a stream's state knows."""

from __future__ import annotations

from dataclasses import dataclass

from envoy.service.discovery.v3 import discovery_pb2

from relay.constraints import UNCONSTRAINED
from relay.resource import CachedResource


@dataclass(frozen=True, slots=True)
class Held:
    """The version (and variant) of a resource last sent to, or declared by, a client.

    ``variant_key`` is None when only the version is known (from a delta
    client's ``initial_resource_versions``). ``resource_name`` is set when the
    variant went out with constraints: its removal must then name them.
    """

    version: str
    variant_key: str | None = None
    resource_name: discovery_pb2.ResourceName | None = None
    # the resource's own name, when the client subscribed to it by an alias
    canonical: str = ""
    # the content digest of what was sent (None when the client declared a version)
    digest: bytes | None = None

    @classmethod
    def of(cls, resource: CachedResource, subscribed_as: str = "") -> Held:
        canonical = resource.name if subscribed_as and subscribed_as != resource.name else ""
        return cls(resource.version, resource.variant_key, resource.resource_name, canonical,
                   resource.digest)

    def is_current(self, resource: CachedResource) -> bool:
        """Whether the client already has exactly this variant, content and version.

        New content is an update even under the same version string. A
        version the client declared (no variant or content known) vouches
        only for a resource without variants: variants of one name may share
        a version, and the client may hold another one than its parameters
        now select.
        """
        if self.version != resource.version:
            return False
        if self.digest is not None and self.digest != resource.digest:
            return False
        if self.variant_key is None:
            return resource.constraints is UNCONSTRAINED
        return self.variant_key == resource.variant_key
