"""A scripted origin that builds its configuration per node, as go-control-plane's
``SnapshotCache`` does with a ``NodeHash`` (here: ``node.cluster``).

Each stream is answered from the resources of its node's cluster (the node of the
stream's first request), and a change made with :meth:`PerNodeOrigin.set_for`
reaches that cluster's streams only. The node groups interop test
(``test_node_groups_through_relay.py``) and ``benchmarks/node_groups.py`` use it.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, message

from tests.builders import pack, type_url_of, version_of
from tests.harness import OriginStream, ScriptedOrigin

#: type URL -> name -> (version, body): what one node cluster is sent.
Resources = dict[str, dict[str, tuple[str, any_pb2.Any]]]


def resource_name(msg: message.Message) -> str:
    """The name a resource is subscribed by (a ClusterLoadAssignment's is its cluster's)."""
    return str(getattr(msg, "name", "") or getattr(msg, "cluster_name", ""))


class PerNodeOrigin(ScriptedOrigin):
    """Answers each stream from the resources of its node's cluster."""

    def __init__(self) -> None:
        super().__init__()
        self.by_cluster: dict[str, Resources] = {}

    @staticmethod
    def cluster_of(stream: OriginStream) -> str:
        """The cluster of the node ``stream`` opened with."""
        return stream.log[0].node.cluster

    def asking(self) -> list[OriginStream]:
        """The streams that asked for something (one that asks for nothing serves no
        client, as a relay's own stream did when it still opened one with groups)."""
        return [s for s in self.streams if s.log]

    def asked(self) -> list[str]:
        """The cluster of each stream that asked for something, sorted."""
        return sorted(self.cluster_of(s) for s in self.asking())

    def streams_of(self, cluster_name: str) -> list[OriginStream]:
        """The streams whose node is of ``cluster_name``."""
        return [s for s in self.asking() if self.cluster_of(s) == cluster_name]

    def _answer(self, stream: OriginStream,
                request: discovery_pb2.DeltaDiscoveryRequest) -> None:
        self.resources = self.by_cluster.setdefault(self.cluster_of(stream), {})
        super()._answer(stream, request)

    def send(self, stream: OriginStream, type_url: str, names: Iterable[str],
             removed: Iterable[str] = ()) -> str:
        self.resources = self.by_cluster.setdefault(self.cluster_of(stream), {})
        return super().send(stream, type_url, names, removed)

    def set_for(self, cluster_name: str, *msgs: message.Message) -> list[str]:
        """Create or change resources as nodes of ``cluster_name`` get them and push
        them to that cluster's streams that subscribed them. Returns the nonces sent."""
        have = self.by_cluster.setdefault(cluster_name, {})
        by_type: dict[str, list[str]] = {}
        for msg in msgs:
            type_url, name = type_url_of(msg), resource_name(msg)
            have.setdefault(type_url, {})[name] = (version_of(msg), pack(msg))
            by_type.setdefault(type_url, []).append(name)
        nonces = []
        for stream in self.streams_of(cluster_name):
            for type_url, names in by_type.items():
                subscribed = stream.subscribed.get(type_url, set())
                wanted = [n for n in names if n in subscribed or "*" in subscribed]
                if wanted:
                    nonces.append(self.send(stream, type_url, wanted))
        return nonces
