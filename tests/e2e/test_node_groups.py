"""End to end: node groups (issue 26). A scripted origin that builds its
configuration per ``node.cluster``, as go-control-plane's ``SnapshotCache``
with a ``NodeHash`` by cluster does; clients of two service clusters behind
one relay with ``upstream.node_groups: {key: [cluster]}``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from aiohttp import ClientSession
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.app import GroupCore, Relay, build_relay
from relay.clock import Clock
from relay.config import parse_config
from relay.node_groups import group_id
from relay.persistence.stores import (
    DirectoryGroupRegistry,
    DirectoryStore,
    RedisGroupRegistry,
    RedisStore,
)
from relay.xds_types import CLUSTER
from tests.builders import cluster
from tests.clock import ManualClock
from tests.e2e.test_metrics import labels, scrape, series
from tests.harness import (
    ADS,
    TIMEOUT,
    Stack,
    XdsClient,
    eventually,
    relay_config,
    running_stack,
    serving_relay,
)
from tests.interop.per_node import PerNodeOrigin
from tests.redis_server import RedisServer, redis_server


class PerClusterOrigin(PerNodeOrigin):
    """An origin that builds its config per ``node.cluster``, each cluster's
    one resource ``backend``, its connect timeout telling them apart."""

    def set_backend(self, cluster_name: str, timeout_s: int) -> None:
        """``backend`` as ``cluster_name``'s nodes get it, pushed to that
        cluster's streams."""
        self.set_for(cluster_name, cluster("backend", timeout_s))


DELTA_ADS = ADS + "DeltaAggregatedResources"
GROUPS = "node_groups: {key: [cluster], copy: [metadata.NAMESPACE], linger: 60s}"


async def subscribe(stack: Stack, cluster_name: str, node_id: str) -> XdsClient:
    client = stack.client()
    client_node = base_pb2.Node(id=node_id, cluster=cluster_name)
    client_node.metadata.update({"NAMESPACE": f"ns-{cluster_name}"})
    await client.send(node=client_node, type_url=CLUSTER, resource_names_subscribe=["backend"])
    return client


def timeout_of(response: discovery_pb2.DeltaDiscoveryResponse) -> int:
    [resource] = response.resources
    got = cluster_pb2.Cluster()
    resource.resource.Unpack(got)
    return got.connect_timeout.seconds


async def started(**config: str) -> tuple[PerClusterOrigin, dict[str, str]]:
    origin = PerClusterOrigin()
    origin.set_backend("checkout", 1)
    origin.set_backend("payments", 2)
    return origin, config


async def test_each_group_gets_its_clusters_configuration_over_its_own_stream() -> None:
    origin, _ = await started()
    async with running_stack(origin, upstream=GROUPS) as stack:
        checkout = await subscribe(stack, "checkout", "c-1")
        payments = await subscribe(stack, "payments", "p-1")
        first = await checkout.recv()
        assert timeout_of(first) == 1
        await checkout.ack(first)
        first = await payments.recv()
        assert timeout_of(first) == 2
        await payments.ack(first)
        # one origin stream per group, carrying the group's node
        assert origin.asked() == ["checkout", "payments"]
        [sent] = [s.log[0].node for s in origin.streams_of("checkout")]
        assert (sent.id, sent.cluster, dict(sent.metadata)) == (
            "relay-test", "checkout", {"NAMESPACE": "ns-checkout"})
        # a change to one cluster's configuration reaches that group only
        origin.set_backend("payments", 3)
        assert timeout_of(await payments.recv()) == 3
        await checkout.expect_nothing()


async def test_a_third_client_of_a_group_is_answered_from_cache() -> None:
    origin, _ = await started()
    async with running_stack(origin, upstream=GROUPS) as stack:
        first = await subscribe(stack, "checkout", "c-1")
        assert timeout_of(await first.recv()) == 1
        second = await subscribe(stack, "payments", "p-1")
        assert timeout_of(await second.recv()) == 2
        asked = len(origin.subscription_requests())
        third = await subscribe(stack, "checkout", "c-2")
        assert timeout_of(await third.recv()) == 1
        assert origin.asked() == ["checkout", "payments"]
        assert len(origin.subscription_requests()) == asked
        # /clients names each stream's group
        async with ClientSession() as http, \
                http.get(f"http://127.0.0.1:{stack.relay.admin_port}/clients") as reply:
            clients = (await reply.json())["clients"]
        groups = {c["node_id"]: c["group"]["key"] for c in clients}
        assert groups == {"c-1": ["checkout"], "c-2": ["checkout"], "p-1": ["payments"]}
        # the cache and upstream gauges count every group's (the relay's own holds nothing)
        samples = await scrape(stack.relay.admin_port)
        assert series(samples, "xds_relay_cache_resources") == {labels(type="Cluster"): 2}
        assert series(samples, "xds_relay_upstream_subscriptions") == {
            labels(origin=f"default/{group_id((name,))}", type="Cluster"): 1
            for name in ("checkout", "payments")}


async def test_the_last_client_leaving_closes_its_groups_stream_after_linger() -> None:
    origin, _ = await started()
    clock = ManualClock()
    async with running_stack(origin, upstream=GROUPS, clock=clock) as stack:
        checkout = await subscribe(stack, "checkout", "c-1")
        payments = await subscribe(stack, "payments", "p-1")
        await checkout.recv()
        await payments.ack(await payments.recv())
        groups = stack.relay.serving.settings.groups
        assert groups is not None
        checkout.close()
        await eventually(lambda: sorted(groups.sizes()) == [0, 1])
        await clock.advance(59.0)
        assert len(groups) == 2
        [stream] = origin.streams_of("checkout")
        await clock.advance(1.0)
        await eventually(lambda: len(groups) == 1)
        # the origin sees the group's stream end
        await asyncio.wait_for(stream.ended.wait(), TIMEOUT)
        # the other group is still served
        origin.set_backend("payments", 4)
        assert timeout_of(await payments.recv()) == 4


async def test_a_client_opening_one_group_too_many_is_refused() -> None:
    origin, _ = await started()
    async with running_stack(origin, upstream=GROUPS.replace("linger", "max_groups: 1, linger")
                             ) as stack:
        checkout = await subscribe(stack, "checkout", "c-1")
        await checkout.recv()
        payments = await subscribe(stack, "payments", "p-1")
        try:
            await payments.recv()
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error.details() == ("the relay serves 1 node groups, its most "
                                       "(upstream.node_groups.max_groups); this client's "
                                       "would be a new one")
        else:
            raise AssertionError("not refused")
        samples = await scrape(stack.relay.admin_port)
        limited = series(samples, "xds_relay_downstream_limited_streams_total")
        assert limited[labels(limit="node_groups.max_groups")] == 1
        assert series(samples, "xds_relay_node_groups") == {labels(): 1}
        assert series(samples, "xds_relay_node_group_clients_count") == {labels(): 1}
        assert origin.asked() == ["checkout"]


async def test_a_key_value_too_long_is_refused() -> None:
    origin, _ = await started()
    async with running_stack(origin, upstream=GROUPS) as stack:
        client = await subscribe(stack, "x" * 200, "c-1")
        try:
            await client.recv()
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.details() == (
                "the client's node cluster is 200 characters, more than the 128 a node group "
                f"key value may be: {'x' * 32}... (168 more characters)")
        else:
            raise AssertionError("not refused")
        assert origin.asked() == []


async def test_one_groups_nack_of_its_origin_touches_only_it() -> None:
    origin, _ = await started()
    async with running_stack(origin, upstream=GROUPS) as stack:
        checkout = await subscribe(stack, "checkout", "c-1")
        payments = await subscribe(stack, "payments", "p-1")
        await checkout.ack(await checkout.recv())
        await payments.ack(await payments.recv())
        [bad_stream] = origin.streams_of("checkout")
        # a body of another type than the response's: the relay NACKs it
        body = any_pb2.Any()
        body.Pack(base_pb2.Node(id="not a cluster"))
        bad = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER, nonce="bad")
        bad.resources.add(name="backend", version="broken", resource=body)
        bad_stream.outbox.put_nowait(bad)
        await eventually(lambda: any(r.response_nonce == "bad" and r.error_detail.message
                                     for r in bad_stream.log))
        await checkout.expect_nothing()  # keeps what it has
        [good_stream] = origin.streams_of("payments")
        assert not any(r.error_detail.message for r in good_stream.log)
        origin.set_backend("payments", 5)
        assert timeout_of(await payments.recv()) == 5
        # the NACKed group still takes its origin's next good update
        origin.set_backend("checkout", 6)
        assert timeout_of(await checkout.recv()) == 6
        assert origin.asked() == ["checkout", "payments"]


async def test_the_origin_sees_one_stream_per_group_in_use_fetches_included() -> None:
    origin, _ = await started()
    origin.set_backend("search", 3)
    origin.set_backend("xds-relay", 9)  # the relay's own node's: nobody may get it
    async with running_stack(origin, upstream=GROUPS, rest="lease: 60s, wait: 2s") as stack:
        checkout = await subscribe(stack, "checkout", "c-1")
        payments = await subscribe(stack, "payments", "p-1")
        assert timeout_of(await checkout.recv()) == 1
        assert timeout_of(await payments.recv()) == 2
        # a one-shot fetch (as a REST poll) is answered from its node's group
        fetch = stack.channel.unary_unary(
            "/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters",
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
        fetched = await fetch(discovery_pb2.DiscoveryRequest(
            node=base_pb2.Node(id="poller", cluster="search"), resource_names=["backend"]))
        [body] = fetched.resources
        got = cluster_pb2.Cluster()
        body.Unpack(got)
        assert got.connect_timeout.seconds == 3
        # one of the group's nodes, polling again: its own group, no new stream
        again = await fetch(discovery_pb2.DiscoveryRequest(
            node=base_pb2.Node(id="c-poller", cluster="checkout"), resource_names=["backend"]))
        assert len(again.resources) == 1
        groups = stack.relay.groups
        assert groups is not None and len(groups) == 3
        # exactly one origin stream per group in use, none as the relay's own node
        # (every stream the origin saw, asking or not; the first two groups
        # dial at once, so in either order)
        assert sorted(str(s.log[0].node.cluster) if s.log else "" for s in origin.streams) == [
            "checkout", "payments", "search"]
        assert [status["group"]["key"] for status in stack.relay.origin_statuses()] == [
            ["checkout"], ["payments"], ["search"]]


async def test_rest_pollers_get_their_own_groups_configuration() -> None:
    import json

    origin, _ = await started()
    origin.set_backend("xds-relay", 9)  # the relay's own node's: nobody may get it
    rest = 'address: "127.0.0.1:0", lease: 60s, wait: 2s'
    async with running_stack(origin, upstream=GROUPS, rest=rest) as stack, \
            ClientSession() as http:

        async def poll(cluster_name: str, version: str = "") -> tuple[int, int | None, str]:
            body = {"node": {"id": f"poller-{cluster_name}", "cluster": cluster_name},
                    "resourceNames": ["backend"], "versionInfo": version}
            async with http.post(f"http://127.0.0.1:{stack.relay.rest_port}"
                                 "/v3/discovery:clusters", data=json.dumps(body),
                                 headers={"Content-Type": "application/json"}) as reply:
                if reply.status != 200:
                    return reply.status, None, version
                answer = await reply.json()
            [resource] = answer["resources"]
            return 200, int(resource["connectTimeout"].rstrip("s")), answer["versionInfo"]

        status, timeout, checkout_version = await poll("checkout")
        assert (status, timeout) == (200, 1)
        assert (await poll("payments"))[:2] == (200, 2)
        # polled again with the version it holds: nothing new (its group's lease held)
        assert (await poll("checkout", checkout_version))[:2] == (304, None)
        assert origin.asked() == ["checkout", "payments"]
        assert len(origin.streams) == 2  # none as the relay's own node


async def test_a_group_only_polled_answered_again_stays_open_while_polled() -> None:
    """A REST poll answered again (its lease unchanged: no decode, no fetch)
    restarts its group's linger as a poll the whole way does, so a group only
    polled does not close (and reopen its origin stream) under its pollers."""
    import json

    origin, _ = await started()
    clock = ManualClock()
    rest = 'address: "127.0.0.1:0", lease: 600s, wait: 2s'
    async with running_stack(origin, upstream=GROUPS, rest=rest, clock=clock) as stack, \
            ClientSession() as http:
        server = stack.relay.rest
        groups = stack.relay.serving.settings.groups
        assert server is not None and groups is not None
        body = json.dumps({"node": {"id": "poller", "cluster": "checkout"},
                           "resourceNames": ["backend"]})

        async def poll() -> tuple[int, bytes]:
            async with http.post(f"http://127.0.0.1:{stack.relay.rest_port}"
                                 "/v3/discovery:clusters", data=body,
                                 headers={"Content-Type": "application/json"}) as reply:
                return reply.status, await reply.read()

        first = await poll()
        assert first[0] == 200
        # (the names settling on the group's stream count as a change once)
        await clock.advance(50.0)
        assert await poll() == first
        before = server.answered_again
        for count in (1, 2, 3):
            await clock.advance(50.0)  # within the group's linger (60 s) of the last poll
            assert await poll() == first
            assert server.answered_again == before + count
        # 150 s after the last poll the whole way: the group never closed
        assert len(groups) == 1 and origin.asked() == ["checkout"]
        assert len(origin.streams) == 1
        await clock.advance(60.0)  # no poll for a linger: it goes
        await eventually(lambda: len(groups) == 0)


async def test_csds_shows_each_clients_group_and_what_its_group_sent() -> None:
    from envoy.admin.v3 import config_dump_shared_pb2
    from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
    from envoy.type.matcher.v3 import node_pb2, string_pb2

    origin, _ = await started()
    async with running_stack(origin, upstream=GROUPS) as stack:
        checkout = await subscribe(stack, "checkout", "c-1")
        payments = await subscribe(stack, "payments", "p-1")
        await checkout.ack(await checkout.recv())
        await payments.ack(await payments.recv())
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(stack.channel)

        def bodies(response: csds_pb2.ClientStatusResponse) -> dict[str, tuple[str, int]]:
            found = {}
            for config in response.config:
                [entry] = config.generic_xds_configs
                got = cluster_pb2.Cluster()
                entry.xds_config.Unpack(got)
                found[config.node.id] = (config.client_scope, got.connect_timeout.seconds)
            return found

        deadline = asyncio.get_running_loop().time() + 5
        while True:
            response = await stub.FetchClientStatus(csds_pb2.ClientStatusRequest())
            if len(response.config) == 2 and all(
                    config.generic_xds_configs and config.generic_xds_configs[0].client_status
                    == config_dump_shared_pb2.ClientResourceStatus.ACKED
                    for config in response.config):
                break
            assert asyncio.get_running_loop().time() < deadline, response
            await asyncio.sleep(0.01)
        # each client's own group's resource, scoped by its group; its node as it sent it
        assert bodies(response) == {"c-1": (group_id(("checkout",)), 1),
                                    "p-1": (group_id(("payments",)), 2)}
        assert {config.node.cluster for config in response.config} == {"checkout", "payments"}
        # node matchers select as without groups
        only = csds_pb2.ClientStatusRequest(node_matchers=[node_pb2.NodeMatcher(
            node_id=string_pb2.StringMatcher(exact="p-1"))])
        assert bodies(await stub.FetchClientStatus(only)) == {
            "p-1": (group_id(("payments",)), 2)}


async def test_a_group_syncing_leaves_the_relay_ready_and_origins_list_it() -> None:
    origin, _ = await started()
    origin.auto = False  # the origin takes streams and answers nothing
    async with running_stack(origin, upstream=GROUPS) as stack:
        admin = f"http://127.0.0.1:{stack.relay.admin_port}"
        async with ClientSession() as http:
            async with http.get(f"{admin}/ready") as reply:
                assert (reply.status, await reply.text()) == (
                    200, "ready: serving node groups: 0 open (0 without clients); 0 synced "
                         "with their origins, 0 serving a snapshot, 0 not yet synced "
                         "(see /origins)\n")
            await subscribe(stack, "checkout", "c-1")
            await eventually(lambda: origin.asked() == ["checkout"])
            async with http.get(f"{admin}/ready") as reply:
                assert (reply.status, await reply.text()) == (
                    200, "ready: serving node groups: 1 open (0 without clients); 0 synced "
                         "with their origins, 0 serving a snapshot, 1 not yet synced "
                         "(see /origins)\n")
            async with http.get(f"{admin}/origins") as reply:
                [listed] = (await reply.json())["origins"]
        gid = group_id(("checkout",))
        assert (listed["origin"], listed["group"], listed["synced"], listed["snapshot"]) == (
            f"default/{gid}", {"id": gid, "key": ["checkout"], "clients": 1}, False, False)


async def test_without_groups_every_client_gets_the_relays_configuration() -> None:
    origin, _ = await started()
    origin.set_backend("xds-relay", 9)
    async with running_stack(origin) as stack:
        checkout = await subscribe(stack, "checkout", "c-1")
        payments = await subscribe(stack, "payments", "p-1")
        assert timeout_of(await checkout.recv()) == 9
        assert timeout_of(await payments.recv()) == 9
        assert origin.asked() == ["xds-relay"]
        assert stack.relay.serving.settings.groups is None
        await asyncio.sleep(0)


# -- the snapshot per group --------------------------------------------------------------

_prefixes = itertools.count(1)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture
def persistence(redis: RedisServer) -> str:
    return (f'persistence: {{redis: {{url: "{redis.url}", '
            f'key_prefix: "groups-{next(_prefixes)}", timeout: 1s}}}}')


@pytest.fixture(params=["redis", "directory"])
def either_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "redis":
        return str(request.getfixturevalue("persistence"))
    return f'persistence: {{directory: "{tmp_path / "snapshot"}"}}'


@contextlib.asynccontextmanager
async def grouped_relay(origin_port: int, persistence: str, clock: Clock | None = None
                        ) -> AsyncIterator[tuple[Relay, grpc.aio.Channel]]:
    """A relay with GROUPS and ``persistence`` following ``origin_port``."""
    text = relay_config(origin_port, upstream=GROUPS,
                        server="batch_window: 0s" if clock is not None else "") + persistence
    relay = build_relay(parse_config(text, "relay.yaml"), clock)
    async with serving_relay(relay) as channel:
        yield relay, channel


async def subscribed(channel: grpc.aio.Channel, cluster_name: str, node_id: str) -> XdsClient:
    client = XdsClient(channel, DELTA_ADS, delta=True)
    client_node = base_pb2.Node(id=node_id, cluster=cluster_name)
    client_node.metadata.update({"NAMESPACE": f"ns-{cluster_name}"})
    await client.send(node=client_node, type_url=CLUSTER, resource_names_subscribe=["backend"])
    return client


def cores(relay: Relay) -> dict[str, GroupCore]:
    """Each open group's core, by the cluster of its key."""
    groups = relay.groups
    assert groups is not None
    found = {}
    for group in groups.groups():
        assert isinstance(group.core, GroupCore)
        found[group.key[0]] = group.core
    return found


async def written(relay: Relay) -> None:
    """Until every group's snapshot holds what its cache changed."""
    for core in cores(relay).values():
        assert core.snapshot is not None
        for writer in core.snapshot.writers.values():
            while writer.pending():
                writer.written.clear()
                await asyncio.wait_for(writer.written.wait(), 5)


async def listed(redis: RedisServer, persistence: str) -> list[str]:
    """The group ids the snapshot lists."""
    if "directory:" in persistence:
        directory = DirectoryStore(Path(persistence.split('directory: "')[1].split('"')[0]))
        try:
            return sorted(await DirectoryGroupRegistry(directory).load())
        finally:
            await directory.close()
    prefix = persistence.split('key_prefix: "')[1].split('"')[0]
    store = RedisStore(redis.url, prefix, 1.0)
    try:
        return sorted(await RedisGroupRegistry(store).load())
    finally:
        await store.close()


async def test_a_warm_restart_serves_each_group_its_own_snapshot(
        redis: RedisServer, either_store: str) -> None:
    persistence = either_store
    origin = PerClusterOrigin()
    origin.set_backend("checkout", 1)
    origin.set_backend("payments", 2)
    origin.set_backend("xds-relay", 9)  # the relay's own node's: nobody may get it
    await origin.start()
    async with grouped_relay(origin.port, persistence) as (relay, channel):
        checkout = await subscribed(channel, "checkout", "c-1")
        payments = await subscribed(channel, "payments", "p-1")
        await checkout.ack(await checkout.recv())
        await payments.ack(await payments.recv())
        await written(relay)
    # only the groups that exist are listed, each under its id (no node's values)
    assert await listed(redis, persistence) == sorted([group_id(("checkout",)),
                                                       group_id(("payments",))])
    port = origin.port
    await origin.stop()  # the origin goes away; the relay restarts meanwhile

    async with grouped_relay(port, persistence) as (relay, channel):
        assert relay.not_ready_reason() is None
        assert relay.ready_detail() == (
            "serving node groups: 2 open (2 without clients); 0 synced with their origins, "
            "2 serving a snapshot, 0 not yet synced (see /origins)")
        checkout = await subscribed(channel, "checkout", "c-2")
        payments = await subscribed(channel, "payments", "p-2")
        assert timeout_of(await checkout.recv()) == 1
        assert timeout_of(await payments.recv()) == 2
        statuses = {status["group"]["key"][0]: status for status in relay.origin_statuses()}
        assert sorted(statuses) == ["checkout", "payments"]
        assert {key: (status["origin"], status["synced"], status["snapshot"],
                      status["group"]["clients"]) for key, status in statuses.items()} == {
            "checkout": (f"default/{group_id(('checkout',))}", False, True, 1),
            "payments": (f"default/{group_id(('payments',))}", False, True, 1)}


async def test_a_restored_group_nobody_joins_goes_after_linger(
        redis: RedisServer, persistence: str) -> None:
    origin = PerClusterOrigin()
    origin.set_backend("checkout", 1)
    origin.set_backend("payments", 2)
    await origin.start()
    async with grouped_relay(origin.port, persistence) as (relay, channel):
        for cluster_name in ("checkout", "payments"):
            client = await subscribed(channel, cluster_name, f"{cluster_name}-1")
            await client.ack(await client.recv())
        await written(relay)
    clock = ManualClock()
    async with grouped_relay(origin.port, persistence, clock) as (relay, channel):
        assert sorted(cores(relay)) == ["checkout", "payments"]
        checkout = await subscribed(channel, "checkout", "c-2")
        assert timeout_of(await checkout.recv()) == 1
        await clock.advance(60.0)
        await eventually(lambda: sorted(cores(relay)) == ["checkout"])
        # its snapshot goes with it; the joined group's stays
        await eventually_listed(redis, persistence, [group_id(("checkout",))])
        # one origin stream per group in use: the relay opened none of its own,
        # and the unjoined group none
        assert origin.asked() == ["checkout", "checkout", "payments"]
    await origin.stop()


async def eventually_listed(redis: RedisServer, persistence: str, expected: list[str]) -> None:
    deadline = asyncio.get_running_loop().time() + 5
    while (found := await listed(redis, persistence)) != expected:
        assert asyncio.get_running_loop().time() < deadline, found
        await asyncio.sleep(0.02)


async def test_replicas_sharing_a_snapshot_keep_a_group_another_one_serves(
        redis: RedisServer, persistence: str) -> None:
    from relay.persistence.groups import decode_group

    origin = PerClusterOrigin()
    origin.set_backend("payments", 2)
    await origin.start()
    gid = group_id(("payments",))
    prefix = persistence.split('key_prefix: "')[1].split('"')[0]

    async def seen_at() -> float | None:
        store = RedisStore(redis.url, prefix, 1.0)
        try:
            entry = await RedisGroupRegistry(store).get(gid)
        finally:
            await store.close()
        return None if entry is None else decode_group(entry).seen_at

    async def seen_since(moment: float) -> None:
        deadline = asyncio.get_running_loop().time() + 5
        while ((found := await seen_at()) or 0.0) < moment:
            assert asyncio.get_running_loop().time() < deadline, found
            await asyncio.sleep(0.02)

    clock = ManualClock()  # one clock: both replicas' time moves together
    async with grouped_relay(origin.port, persistence, clock) as (one, one_channel), \
            grouped_relay(origin.port, persistence, clock) as (other, other_channel):
        leaving = await subscribed(one_channel, "payments", "p-1")
        staying = await subscribed(other_channel, "payments", "p-2")
        await leaving.ack(await leaving.recv())
        await staying.ack(await staying.recv())
        await written(one)
        await written(other)
        wall = other._parts.wall
        leaving.close()
        await eventually(lambda: cores(one)["payments"] and one.groups is not None and
                         one.groups.sizes() == [0])
        for _ in range(3):  # linger (60s) in steps of the period groups are seen in (20s)
            moment = wall()
            await clock.advance(20.0)
            if cores(one):
                await seen_since(moment + 20.0)  # the other replica's group said so
        await eventually(lambda: cores(one) == {})
        # the replica whose group closed left the snapshot to the one serving it
        assert await listed(redis, persistence) == [gid]
        assert sorted(cores(other)) == ["payments"]
        store = RedisStore(redis.url, f"{prefix}:group:{gid}", 1.0)
        try:
            kept = await store.load()
        finally:
            await store.close()
        assert kept is not None and list(kept.entries[CLUSTER]) == ["backend"]
    await origin.stop()
