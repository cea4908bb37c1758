"""Node groups without I/O: a client's group key from its Node, the node a
group's origin stream carries, and the groups open (see relay.node_groups)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from envoy.config.core.v3 import base_pb2
from google.protobuf import struct_pb2

from relay.interest import InterestIndex
from relay.node_groups import (
    MAX_GROUPS_LIMIT,
    MAX_KEY_VALUE,
    GroupKeyError,
    GroupSpec,
    NodeGroups,
    field_error,
    group_id,
    group_node,
)
from relay.protocol.limits import LimitExceeded
from tests.clock import ManualClock


def client_node(**metadata: object) -> base_pb2.Node:
    made = base_pb2.Node(id="sidecar~10.0.0.1~pod-1.ns~ns.svc.cluster.local",
                         cluster="checkout", user_agent_name="envoy",
                         locality=base_pb2.Locality(region="eu", zone="eu-1a"))
    made.metadata.update(metadata)
    return made


RELAY = base_pb2.Node(id="relay-1", cluster="xds-relay", user_agent_name="xds-relay",
                      locality=base_pb2.Locality(region="eu", zone="eu-1b"))


def test_key_takes_plain_fields_in_order() -> None:
    spec = GroupSpec(("locality.zone", "cluster", "user_agent_name"))
    assert spec.key_of(client_node()) == ("eu-1a", "checkout", "envoy")


def test_key_takes_nested_metadata() -> None:
    spec = GroupSpec(("metadata.ISTIO.NAMESPACE", "metadata.LABELS"))
    key = spec.key_of(client_node(ISTIO={"NAMESPACE": "shop"}, LABELS={"b": "2", "a": "1"}))
    # a structured value is its JSON, keys sorted
    assert key == ("shop", '{"a":"1","b":"2"}')


def test_missing_fields_are_empty_values_by_default() -> None:
    spec = GroupSpec(("cluster", "metadata.NAMESPACE", "metadata.ISTIO.NAMESPACE"))
    node = base_pb2.Node(id="x")
    node.metadata.update({"ISTIO": "not a struct"})
    assert spec.key_of(node) == ("", "", "")
    assert spec.key_of(None) == ("", "", "")


def test_missing_fields_refused_when_so_configured() -> None:
    spec = GroupSpec(("cluster", "metadata.NAMESPACE"), missing="refuse")
    with pytest.raises(GroupKeyError) as refused:
        spec.key_of(client_node())
    assert str(refused.value) == (
        "the client's node has no metadata.NAMESPACE, which upstream.node_groups.key needs "
        "(node_groups.missing is refuse)")


def test_key_values_are_bounded_and_shown_bounded() -> None:
    spec = GroupSpec(("cluster",))
    assert spec.key_of(base_pb2.Node(cluster="c" * MAX_KEY_VALUE)) == ("c" * MAX_KEY_VALUE,)
    with pytest.raises(GroupKeyError) as refused:
        spec.key_of(base_pb2.Node(cluster="c" * 10_000))
    assert str(refused.value) == (
        "the client's node cluster is 10000 characters, more than the 128 a node group key "
        f"value may be: {'c' * 32}... (9968 more characters)")


def test_group_ids_are_stable_short_and_distinct() -> None:
    assert group_id(("checkout",)) == group_id(("checkout",))
    assert group_id(("checkout",)) != group_id(("payments",))
    assert group_id(("a", "bc")) != group_id(("ab", "c"))
    assert len(group_id(("x" * 128,) * 8)) == 14


def test_field_names_checked() -> None:
    assert field_error("metadata.A.B") is None
    assert field_error("locality.zone") is None
    assert field_error("metadata.A..B") == (
        "'metadata.A..B' has an empty part: metadata fields are metadata.A or metadata.A.B")
    assert field_error("node.cluster") is not None


def test_group_node_is_the_relays_plus_the_fields() -> None:
    first = client_node(NAMESPACE="shop", LABELS={"app": "cart"}, OTHER="kept out")
    made = group_node(RELAY, first, ("cluster", "metadata.NAMESPACE", "metadata.LABELS"))
    assert made.id == "relay-1"  # not a key field: the relay's
    assert made.cluster == "checkout"
    assert made.locality.zone == "eu-1b"
    assert dict(made.metadata) == {"NAMESPACE": "shop", "LABELS": {"app": "cart"}}
    assert RELAY.cluster == "xds-relay"  # the relay's own is untouched


def test_group_node_takes_the_id_when_it_is_a_key_field() -> None:
    made = group_node(RELAY, client_node(), ("id", "locality.zone"))
    assert (made.id, made.locality.zone, made.locality.region) == (
        "sidecar~10.0.0.1~pod-1.ns~ns.svc.cluster.local", "eu-1a", "eu")


def test_group_node_nests_metadata_into_the_relays() -> None:
    relay = base_pb2.Node(id="relay-1")
    relay.metadata.update({"ISTIO": {"MESH": "m1"}, "FLAT": "x"})
    made = group_node(relay, client_node(ISTIO={"NAMESPACE": "shop"}), ("metadata.ISTIO.NAMESPACE",
                                                                         "metadata.MISSING"))
    assert made.metadata == struct_pb2.Struct(fields={
        "ISTIO": struct_pb2.Value(struct_value=struct_pb2.Struct(fields={
            "MESH": struct_pb2.Value(string_value="m1"),
            "NAMESPACE": struct_pb2.Value(string_value="shop")})),
        "FLAT": struct_pb2.Value(string_value="x")})


@dataclass
class FakeCore:
    node: base_pb2.Node
    index: InterestIndex = field(default_factory=InterestIndex)
    view: object = None
    ran: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    # what happened to it after it ran (or did not): "retired", "closed"
    ends: list[str] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event | None = None  # what retiring waits for (None: nothing)
    clients: Callable[[], int] | None = None  # what it runs with: its group's clients

    async def run(self, clients: Callable[[], int]) -> None:
        self.clients = clients
        self.ran.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.cancelled.set()

    async def retire(self) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.ends.append("retired")

    async def close(self) -> None:
        self.ends.append("closed")
        self.closed.set()


def groups_of(spec: GroupSpec, clock: ManualClock) -> tuple[NodeGroups, dict[str, FakeCore]]:
    made: dict[str, FakeCore] = {}

    def make(gid: str, key: tuple[str, ...], node: base_pb2.Node) -> FakeCore:
        assert gid == group_id(key)
        made[gid] = FakeCore(node)
        return made[gid]

    return NodeGroups(spec, RELAY, make, clock), made  # type: ignore[arg-type]


async def test_clients_of_one_key_share_a_group() -> None:
    groups, made = groups_of(GroupSpec(("cluster",)), ManualClock())
    first = groups.join(client_node())
    second = groups.join(client_node(NAMESPACE="other"))
    third = groups.join(base_pb2.Node(cluster="payments"))
    assert first is second and first is not third
    await made[first.id].ran.wait()
    counted = made[first.id].clients
    assert counted is not None and counted() == 2  # runs knowing its clients
    assert (len(groups), sorted(groups.sizes())) == (2, [1, 2])
    assert made[first.id].node.cluster == "checkout"
    await groups.close()


async def test_idle_group_closes_after_linger_on_the_clock() -> None:
    clock = ManualClock()
    groups, made = groups_of(GroupSpec(("cluster",), linger=60.0), clock)
    group = groups.join(client_node())
    await asyncio.sleep(0)
    groups.leave(group)
    await clock.advance(59.0)
    assert len(groups) == 1 and not made[group.id].cancelled.is_set()
    await clock.advance(1.0)
    await made[group.id].cancelled.wait()
    assert len(groups) == 0


async def test_a_client_back_within_linger_keeps_the_group() -> None:
    clock = ManualClock()
    groups, _ = groups_of(GroupSpec(("cluster",), linger=60.0), clock)
    group = groups.join(client_node())
    groups.leave(group)
    await clock.advance(30.0)
    assert groups.join(client_node()) is group
    await clock.advance(60.0)
    assert len(groups) == 1 and group.clients == 1
    await groups.close()


async def test_one_group_beyond_max_groups_is_refused() -> None:
    groups, _ = groups_of(GroupSpec(("cluster",), max_groups=2), ManualClock())
    groups.join(base_pb2.Node(cluster="a"))
    groups.join(base_pb2.Node(cluster="b"))
    with pytest.raises(LimitExceeded) as refused:
        groups.join(base_pb2.Node(cluster="c"))
    assert refused.value.limit == MAX_GROUPS_LIMIT
    assert str(refused.value) == ("the relay serves 2 node groups, its most "
                                  "(upstream.node_groups.max_groups); this client's would be "
                                  "a new one")
    groups.join(base_pb2.Node(cluster="a"))  # an open group still takes clients
    await groups.close()


async def test_a_lingering_group_makes_room_for_a_new_one() -> None:
    groups, made = groups_of(GroupSpec(("cluster",), max_groups=1), ManualClock())
    idle = groups.join(base_pb2.Node(cluster="a"))
    await made[idle.id].ran.wait()
    groups.leave(idle)
    fresh = groups.join(base_pb2.Node(cluster="b"))
    await made[idle.id].cancelled.wait()
    assert groups.groups() == [fresh]
    await groups.close()


async def test_an_idle_group_is_retired_but_a_stopping_relay_keeps_its_groups() -> None:
    clock = ManualClock()
    groups, made = groups_of(GroupSpec(("cluster",), linger=60.0), clock)
    idle = groups.join(base_pb2.Node(cluster="a"))
    busy = groups.join(base_pb2.Node(cluster="b"))
    groups.leave(idle)
    await clock.advance(60.0)
    await made[idle.id].closed.wait()
    # closed for good: its snapshot goes, then it lets go of what it holds
    assert made[idle.id].ends == ["retired", "closed"]
    await groups.close()
    # the relay stopping: kept for the next start
    assert made[busy.id].ends == ["closed"]


async def test_a_restored_group_runs_when_joined_and_goes_after_linger_if_not() -> None:
    clock = ManualClock()
    groups, made = groups_of(GroupSpec(("cluster",), linger=60.0), clock)
    # as another replica (or an older configuration) wrote it
    node_a = base_pb2.Node(id="relay-0", cluster="a", locality=base_pb2.Locality(zone="z9"))
    joined = groups.restore(group_id(("a",)), ("a",), node_a)
    unjoined = groups.restore(group_id(("b",)), ("b",), base_pb2.Node(cluster="b"))
    assert joined is not None and unjoined is not None
    # the key fields as the snapshot had them, the rest this relay's own
    asked = made[joined.id].node
    assert (asked.id, asked.cluster, asked.locality.zone) == ("relay-1", "a", "eu-1b")
    await asyncio.sleep(0)
    assert not made[joined.id].ran.is_set()  # no origin stream until a client joins
    assert groups.join(base_pb2.Node(cluster="a", locality=base_pb2.Locality(zone="z1"))) \
        is joined
    await made[joined.id].ran.wait()
    await clock.advance(60.0)
    await made[unjoined.id].closed.wait()
    assert made[unjoined.id].ends == ["retired", "closed"]
    assert not made[unjoined.id].ran.is_set()
    assert groups.groups() == [joined]
    await groups.close()


async def test_restoring_stops_at_max_groups() -> None:
    groups, _ = groups_of(GroupSpec(("cluster",), max_groups=1), ManualClock())
    assert groups.restore(group_id(("a",)), ("a",), base_pb2.Node()) is not None
    assert groups.restore(group_id(("b",)), ("b",), base_pb2.Node()) is None
    assert len(groups) == 1
    await groups.close()


async def test_a_group_reopened_while_its_old_self_retires_runs_after_it() -> None:
    clock = ManualClock()
    groups, made = groups_of(GroupSpec(("cluster",), linger=60.0), clock)
    old = groups.join(base_pb2.Node(cluster="a"))
    old_core = made[old.id]
    old_core.gate = asyncio.Event()
    groups.leave(old)
    await clock.advance(60.0)
    await old_core.cancelled.wait()
    new = groups.join(base_pb2.Node(cluster="a"))
    assert new is not old and made[new.id] is not old_core
    for _ in range(5):
        await asyncio.sleep(0)
    # its snapshot would go with the old one's deletion: it waits for it
    assert not made[new.id].ran.is_set() and old_core.ends == []
    old_core.gate.set()
    await made[new.id].ran.wait()
    assert old_core.ends == ["retired", "closed"]
    await groups.close()
