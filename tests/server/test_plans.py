"""Planned responses as bytes: shared bodies decode to exactly what a plan says."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from relay.protocol.delta import DeltaResponsePlan
from relay.protocol.sotw import SotwResponsePlan
from relay.resource import CachedResource
from relay.server.plans import PlanEncoder, encode_plan
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints, pack


def endpoint_resource(name: str, version: str) -> CachedResource:
    return CachedResource.from_message(ENDPOINT, pack(endpoints(name, 80)), name, version)


def cluster_resource(name: str, version: str) -> CachedResource:
    return CachedResource.from_message(CLUSTER, pack(cluster(name)), name, version)


def test_streams_given_the_same_resources_share_a_body_and_keep_their_nonce() -> None:
    encoder = PlanEncoder()
    resource = endpoint_resource("a", "1")
    first = encoder.encode(DeltaResponsePlan(ENDPOINT, "7", [resource], []))
    second = encoder.encode(DeltaResponsePlan(ENDPOINT, "12", [resource], []))
    for raw, nonce in ((first, "7"), (second, "12")):
        expected = encode_plan(DeltaResponsePlan(ENDPOINT, nonce, [resource], []))
        assert discovery_pb2.DeltaDiscoveryResponse.FromString(raw) == \
            discovery_pb2.DeltaDiscoveryResponse.FromString(expected)
    assert first[:-3] == second[:-4]  # one body, then each nonce field


def test_a_plan_with_other_content_gets_its_own_body() -> None:
    encoder = PlanEncoder()
    one, two = endpoint_resource("a", "1"), endpoint_resource("a", "2")
    encoder.encode(DeltaResponsePlan(ENDPOINT, "1", [one], []))
    raw = encoder.encode(DeltaResponsePlan(ENDPOINT, "2", [two], ["gone"]))
    decoded = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
    assert [r.version for r in decoded.resources] == ["2"]
    assert list(decoded.removed_resources) == ["gone"] and decoded.nonce == "2"
    sotw = encoder.encode(SotwResponsePlan(CLUSTER, "3", "v9", [cluster_resource("c", "1")]))
    response = discovery_pb2.DiscoveryResponse.FromString(sotw)
    assert (response.version_info, response.nonce, len(response.resources)) == ("v9", "3", 1)


def test_a_sotw_plan_of_plain_entries_is_the_bytes_of_the_general_choice() -> None:
    """Without heartbeats or wrapped names each resource is its ``sotw_entry``,
    taken in one pass (no choice made per resource): the bytes the
    per-resource choice gives, which a wrapped name the plan does not carry
    forces."""
    resources = [cluster_resource(f"c{i}", "1") for i in range(5)]
    plain = SotwResponsePlan(CLUSTER, "3", "v9", resources)
    general = SotwResponsePlan(CLUSTER, "3", "v9", resources, wrapped=frozenset(["none"]))
    assert encode_plan(plain) == encode_plan(general)
    asked: list[str] = []

    class Counting:
        """A resource that notes which of its entries is read."""

        def __init__(self, resource: CachedResource) -> None:
            self._resource = resource

        def __getattr__(self, name: str) -> object:
            asked.append(name)
            return getattr(self._resource, name)

    counted = SotwResponsePlan(CLUSTER, "3", "v9", [Counting(r) for r in resources])
    assert encode_plan(counted) == encode_plan(plain)
    assert asked == ["sotw_entry"] * 5  # (not its name, twice, per resource)
