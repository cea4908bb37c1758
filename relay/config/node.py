"""The Envoy ``core.v3.Node`` the relay presents to its origin, built from the config."""

from __future__ import annotations

import importlib.metadata

from envoy.config.core.v3 import base_pb2

from relay.config.models import RelayConfig

__all__ = ["USER_AGENT_NAME", "node_proto"]

USER_AGENT_NAME = "xds-relay"


def _user_agent_version() -> str:
    # From the installed distribution: a source checkout that is not installed still works.
    try:
        return importlib.metadata.version("xds-relay")
    except importlib.metadata.PackageNotFoundError:
        return ""


def node_proto(cfg: RelayConfig) -> base_pb2.Node:
    """The Envoy ``core.v3.Node`` the relay sends to its origin."""
    node = base_pb2.Node(
        id=cfg.node.id,
        cluster=cfg.node.cluster,
        locality=base_pb2.Locality(
            region=cfg.node.locality.region,
            zone=cfg.node.locality.zone,
            sub_zone=cfg.node.locality.sub_zone,
        ),
        user_agent_name=USER_AGENT_NAME,
        user_agent_version=_user_agent_version(),
    )
    if cfg.node.metadata:
        node.metadata.update(cfg.node.metadata)
    return node
