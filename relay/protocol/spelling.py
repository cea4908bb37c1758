"""A delta response with every name as the client spelled it.

The relay compares ``xdstp://`` names in canonical form (see
:mod:`relay.protocol.xdstp`), and the cache holds each resource under the
origin's name, which is canonical; but a response must carry the exact name
the client asked for, or the client does not know it as the one it asked
for. A client that spells a name otherwise (its context parameters in
another order, say) gets its resources, removals and errors renamed.

Rare, so paid only by those clients: the renamed copy of a resource is made
once per spelling and kept while the cached resource lives (a push of it to
many such clients encodes it once), not once per response.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from envoy.service.discovery.v3 import discovery_pb2

from relay.resource import CachedResource

if TYPE_CHECKING:
    from relay.protocol.delta import DeltaResponsePlan

__all__ = ["renamed", "respelled"]

# cached resource -> spelling -> its copy under that name
_COPIES: WeakKeyDictionary[CachedResource, dict[str, CachedResource]] = WeakKeyDictionary()


def respelled(plan: DeltaResponsePlan, spelled: Mapping[str, str]) -> DeltaResponsePlan:
    """``plan`` with each name ``spelled`` maps (canonical -> as the client
    spelled it) written the client's way; the plan itself if none is in it."""
    def spell(name: str) -> str:
        return spelled.get(name, name)

    resources = [renamed(r, spelled[r.name]) if r.name in spelled else r
                 for r in plan.resources]
    heartbeats = [renamed(r, spelled[r.name]) if r.name in spelled else r
                  for r in plan.heartbeats]
    removed = [spell(name) for name in plan.removed]
    removed_names = [_resource_name(n, spelled[n.name]) if n.name in spelled else n
                     for n in plan.removed_names]
    errors = [_error(e, spelled[e.resource_name.name]) if e.resource_name.name in spelled
              else e for e in plan.errors]
    if resources == plan.resources and heartbeats == plan.heartbeats and \
            removed == plan.removed and removed_names == plan.removed_names and \
            errors == plan.errors:
        return plan
    # (renamed resources are other entries: the encoder reads them)
    return dataclasses.replace(plan, resources=resources, removed=removed,
                               removed_names=removed_names, errors=errors,
                               heartbeats=heartbeats, entries=None)


def renamed(resource: CachedResource, name: str) -> CachedResource:
    """``resource`` under ``name``: the same variant, content and version."""
    copies = _COPIES.get(resource)
    if copies is None:
        copies = _COPIES[resource] = {}
    copy = copies.get(name)
    if copy is None:
        body = discovery_pb2.Resource()
        body.CopyFrom(resource.resource)
        if body.HasField("resource_name"):  # a variant sent with its constraints
            body.resource_name.name = name
        if body.name or not body.HasField("resource_name"):
            body.name = name
        copy = copies[name] = CachedResource(
            resource.type_url, name, resource.version, body, resource.constraints,
            resource.arrival, resource.received, resource.derived_version)
    return copy


def _resource_name(name: discovery_pb2.ResourceName, spelled: str
                   ) -> discovery_pb2.ResourceName:
    copy = discovery_pb2.ResourceName()
    copy.CopyFrom(name)
    copy.name = spelled
    return copy


def _error(error: discovery_pb2.ResourceError, spelled: str) -> discovery_pb2.ResourceError:
    copy = discovery_pb2.ResourceError()
    copy.CopyFrom(error)
    copy.resource_name.name = spelled
    return copy
