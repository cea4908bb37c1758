"""The env variants most variant tests publish, and how to tell them apart.

Three variants of one resource: one for ``env=canary`` clients, one for
``env=prod``, and a default for clients with no ``env``. Each says which it
is: a cluster in its ``alt_stat_name``, endpoints by their port (:data:`PORTS`).
"""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.xds_types import CLUSTER

DPC = discovery_pb2.DynamicParameterConstraints
CANARY = DPC(constraint={"key": "env", "value": "canary"})
PROD = DPC(constraint={"key": "env", "value": "prod"})
NO_ENV = DPC(not_constraints=DPC(constraint={"key": "env", "exists": {}}))
# label -> its constraints
ENV_VARIANTS = {"canary": CANARY, "prod": PROD, "default": NO_ENV}
# label -> the port of its endpoints
PORTS = {"canary": 1001, "prod": 1002, "default": 1003}

# The type URL of a Resource wrapped in Any (SotW clients that accept it).
RESOURCE_TYPE = "type.googleapis.com/envoy.service.discovery.v3.Resource"


def unwrapped(entry: any_pb2.Any) -> discovery_pb2.Resource:
    """The ``Resource`` a SotW entry wraps (it must wrap one)."""
    assert entry.type_url == RESOURCE_TYPE, entry.type_url
    return discovery_pb2.Resource.FromString(entry.value)


def label_of(entry: Any) -> str:
    """Which variant a delta ``Resource`` or a SotW ``Any`` (bare or wrapped) is."""
    if isinstance(entry, any_pb2.Any) and entry.type_url == RESOURCE_TYPE:
        entry = unwrapped(entry)
    if isinstance(entry, discovery_pb2.Resource):
        entry = entry.resource
    if entry.type_url == CLUSTER:
        return str(cluster_pb2.Cluster.FromString(entry.value).alt_stat_name)
    port = endpoint_pb2.ClusterLoadAssignment.FromString(
        entry.value).endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value
    return {p: label for label, p in PORTS.items()}[port]
