"""What the console's JSON says of readiness, origins, the cache and a client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ResourceCache, Update
from relay.console.data import (
    NAMES_SHOWN,
    cache_view,
    client_view,
    origins_view,
    readiness_view,
    snapshot_views,
)
from relay.persistence.restore import Restored
from relay.resource import CachedResource
from relay.xds_types import CLUSTER


def test_readiness_says_why() -> None:
    assert readiness_view(lambda: "draining", None) == {"ready": False, "why": "draining"}
    assert readiness_view(lambda: None, lambda: "serving files") == \
        {"ready": True, "why": "serving files"}


def test_origins_list_their_last_responses_in_push_order() -> None:
    origins = [{"origin": "default", "server": "cp:1", "last_response": {
        "Listener": 3.0, "ClusterLoadAssignment": 2.0, "Cluster": 1.0}, "extra": "kept"}]
    [shown] = origins_view(lambda: origins) or []
    assert shown["last_response"] == [{"type": "Cluster", "at": 1.0},
                                      {"type": "ClusterLoadAssignment", "at": 2.0},
                                      {"type": "Listener", "at": 3.0}]
    assert shown["extra"] == "kept"
    assert origins_view(None) is None


def test_the_cache_per_type() -> None:
    cache = ResourceCache()
    cache.apply(CLUSTER, Update([CachedResource(CLUSTER, name, "v1", discovery_pb2.Resource(
        name=name, version="v1")) for name in ("a", "b")], complete=True))
    assert cache_view(cache) == [{"type": "Cluster", "type_url": CLUSTER, "names": 2,
                                  "variants": 2, "synced": True, "complete": True,
                                  "errors": False}]


@dataclass
class Store:
    description: str


@dataclass
class Writer:
    store: Store
    waiting: int

    def pending(self) -> int:
        return self.waiting


def test_snapshot_stores_per_origin_and_what_they_restored() -> None:
    restored = Restored("redis x", written_at=5.0, types=2, resources=9)
    writers: dict[str, Any] = {"default": Writer(Store("redis x"), 3)}
    assert snapshot_views(writers, {"default": restored}.get) == [{
        "origin": "default", "store": "redis x", "pending": 3,
        "restored": {"where": "redis x", "written_at": 5.0, "types": 2, "resources": 9}}]
    assert snapshot_views({}, lambda origin: None) is None


def type_state(**state: Any) -> dict[str, Any]:
    return {"subscribed": [], "wildcard": False, "versions": {}, "acked": None,
            "in_flight": None, "last_nack": None, "sync": "synced", "unsynced": {}, **state}


def test_a_client_s_resources_against_the_cache_unsynced_first() -> None:
    record = {"node_id": "n", "peer": "p", "protocol": "sotw", "types": {CLUSTER: type_state(
        subscribed=["a", "b", "c"], versions={"a": "v1", "b": "v1"}, sync="stale",
        unsynced={"b": {"status": "acked", "version": "v1", "cached_version": "v2"},
                  "c": {"status": "requested", "cached_version": None}},
        nacked_at=7.0)}}
    [stream] = client_view([record])
    [cds] = stream["types"]
    assert cds["resources"] == [
        {"name": "b", "status": "acked", "held": "v1", "cached": "v2"},
        {"name": "c", "status": "requested", "held": "", "cached": None},
        {"name": "a", "status": "acked", "held": "v1", "cached": "v1"}]
    assert (cds["sync"], cds["nacked_at"], stream["node_id"]) == ("stale", 7.0, "n")


def test_a_huge_subscription_is_listed_in_part_and_counted_in_full() -> None:
    names = [f"r{i}" for i in range(NAMES_SHOWN + 5)]
    record = {"node_id": "n", "peer": "p", "types": {CLUSTER: type_state(
        subscribed=names, versions=dict.fromkeys(names, "v1"))}}
    [cds] = client_view([record])[0]["types"]
    assert (len(cds["resources"]), cds["resource_count"]) == (NAMES_SHOWN, NAMES_SHOWN + 5)
    assert (len(cds["subscribed"]), cds["subscribed_count"]) == (NAMES_SHOWN, NAMES_SHOWN + 5)
