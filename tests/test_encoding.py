"""Encode once: responses assembled from pre-encoded entries parse like built ones."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.encoding import encode_delta_response, encode_sotw_response
from relay.protocol.delta import DeltaResponsePlan
from relay.resource import CachedResource
from relay.server.streams import encode_plan
from relay.xds_types import CLUSTER


def cached(name: str, size: int = 10) -> CachedResource:
    body = any_pb2.Any()
    body.Pack(cluster_pb2.Cluster(name=name, alt_stat_name="x" * size))
    resource = discovery_pb2.Resource(name=name, version="v1", resource=body)
    resource.ttl.seconds = 5
    return CachedResource(CLUSTER, name, "v1", resource)


def test_delta_response_equals_one_built_field_by_field() -> None:
    items = [cached("a"), cached("b", 300)]  # 300: a multi-byte length prefix
    head = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER, nonce="7",
                                                removed_resources=["gone"])
    wire = encode_delta_response(head, [r.delta_entry for r in items])
    expected = discovery_pb2.DeltaDiscoveryResponse()
    expected.CopyFrom(head)
    expected.resources.extend(r.resource for r in items)
    assert discovery_pb2.DeltaDiscoveryResponse.FromString(wire) == expected


def test_sotw_response_equals_one_built_field_by_field() -> None:
    items = [cached("a"), cached("b", 200)]
    head = discovery_pb2.DiscoveryResponse(type_url=CLUSTER, nonce="1", version_info="abc")
    wire = encode_sotw_response(head, [r.sotw_entry for r in items])
    expected = discovery_pb2.DiscoveryResponse()
    expected.CopyFrom(head)
    expected.resources.extend(r.body for r in items)
    assert discovery_pb2.DiscoveryResponse.FromString(wire) == expected


class CountingResource:
    """A Resource stand-in that counts its serializations."""

    def __init__(self, inner: discovery_pb2.Resource) -> None:
        self.inner = inner
        self.calls = 0

    def SerializeToString(self, **kwargs: object) -> bytes:
        self.calls += 1
        return self.inner.SerializeToString()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)  # (what CachedResource reads as it is made)


def test_fan_out_serializes_each_resource_once() -> None:
    counting = CountingResource(cached("a").resource)
    resource = CachedResource(CLUSTER, "a", "v1", counting)  # type: ignore[arg-type]
    plans = [DeltaResponsePlan(CLUSTER, str(i), [resource], []) for i in range(100)]
    outputs = [encode_plan(plan) for plan in plans]
    assert counting.calls == 1
    parsed = [discovery_pb2.DeltaDiscoveryResponse.FromString(o) for o in outputs]
    assert {p.nonce for p in parsed} == {str(i) for i in range(100)}
    assert all(p.resources[0] == counting.inner for p in parsed)
