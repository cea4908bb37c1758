"""End to end against origins as they really behave (issue 9): istiod's shape.

The origin is :class:`tests.istiod.IstiodOrigin` (no per-resource versions,
``initial_resource_versions`` ignored, everything resent on a new stream,
TLS and a bearer token when asked) or, for contrast, the protocol's ideal
:class:`tests.harness.ScriptedOrigin`. Everything is real gRPC on loopback.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf import json_format, struct_pb2

from relay.app import build_relay
from relay.config import parse_config
from relay.protocol.delta import MAX_NAMES_PER_PIECE
from relay.xds_types import CLUSTER, ENDPOINT
from tests.clock import ManualClock
from tests.harness import (
    QUIET,
    RecordingBackoff,
    ScriptedOrigin,
    Stack,
    XdsClient,
    cluster,
    endpoints,
    eventually,
    names_of,
    node,
    relay_config,
    running_stack,
)
from tests.istiod import IstiodOrigin, OriginTLS
from tests.variants import CANARY, PROD

# Short enough for tests; the reconcile after a reconnect waits this long.
GRACE = "0.2s"
AFTER_GRACE = 0.6
BIG_MESSAGES = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


def first_port(response: Any) -> int:
    """The first endpoint's port of the first ClusterLoadAssignment in a response."""
    body = response.resources[0]
    value = body.resource.value if hasattr(body, "resource") else body.value
    cla = endpoint_pb2.ClusterLoadAssignment.FromString(value)
    return int(cla.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value)


async def subscribed(stack: Stack, node_id: str, delta: bool, type_url: str,
                     names: list[str] | None = None) -> tuple[XdsClient, Any]:
    """A client subscribed (wildcard without ``names``), its first response ACKed."""
    client = stack.client(delta=delta)
    if delta:
        await client.send(node=node(node_id), type_url=type_url,
                          resource_names_subscribe=names or [])
    else:
        await client.send(node=node(node_id), type_url=type_url, resource_names=names or [])
    first = await client.recv()
    await client.ack(first, **({} if delta or names is None else {"resource_names": names}))
    return client, first


async def reconnected(origin: Any, streams_before: int) -> None:
    """Until the origin has a new stream on which it answered and was ACKed."""
    await eventually(lambda: len(origin.streams) > streams_before and origin.stream.sent
                     and origin.stream.all_answered())


# -- 1. content is the truth -----------------------------------------------------


async def test_invariant_7_without_origin_versions_content_changes_reach_delta_and_sotw(
) -> None:
    origin = IstiodOrigin()
    origin.set(cluster("a"), endpoints("e", 1))
    async with running_stack(origin) as stack:
        delta, first = await subscribed(stack, "d", True, ENDPOINT, ["e"])
        sotw, first_sotw = await subscribed(stack, "s", False, CLUSTER)
        [resource] = first.resources
        assert len(resource.version) == 16 and int(resource.version, 16) >= 0
        origin.set(endpoints("e", 2), cluster("a", timeout_s=5))
        update = await delta.recv()
        assert names_of(update) == ["e"] and first_port(update) == 2
        assert update.resources[0].version != resource.version
        changed = await sotw.recv()
        assert changed.version_info != first_sotw.version_info
        assert cluster_pb2.Cluster.FromString(changed.resources[0].value).connect_timeout.seconds \
            == 5


async def test_invariant_7_derived_versions_are_the_same_on_every_replica() -> None:
    origin = await IstiodOrigin().start()
    origin.set(endpoints("e", 1), endpoints("f", 2))
    relays = [build_relay(parse_config(relay_config(origin.port))) for _ in range(2)]
    try:
        versions = []
        for relay in relays:
            await relay.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}") as channel:
                client = XdsClient(channel, "/envoy.service.discovery.v3."
                                   "AggregatedDiscoveryService/DeltaAggregatedResources", True)
                await client.send(node=node(), type_url=ENDPOINT,
                                  resource_names_subscribe=["e", "f"])
                versions.append({r.name: r.version for r in (await client.recv()).resources})
                client.close()
        assert versions[0] == versions[1]
        assert versions[0]["e"] != versions[0]["f"]
    finally:
        for relay in relays:
            await relay.stop(0)
        await origin.stop()


# -- 2. and 4. quiet resends, prompt reconnects ------------------------------------


async def test_a_graceful_end_reconnects_at_once_and_the_resend_pushes_nothing() -> None:
    origin = IstiodOrigin()
    origin.set(cluster("a"), cluster("b"), endpoints("a", 1), endpoints("b", 2))
    clock = ManualClock()
    async with running_stack(origin, answer_grace=GRACE, clock=clock) as stack:
        backoff = recording_backoff(stack)
        clients = [(await subscribed(stack, f"n{i}", delta, type_url, names))[0]
                   for i, (delta, type_url, names) in enumerate([
                       (True, CLUSTER, None), (True, ENDPOINT, ["a", "b"]),
                       (False, CLUSTER, None), (False, ENDPOINT, ["a", "b"])])]
        await clock.advance(1.0)  # a stream shorter than the first backoff step waits it
        origin.end_streams()
        await reconnected(origin, 1)
        assert "wait" not in backoff.events  # at once, not after a backoff step
        await clock.advance(1.0)  # the reconcile is due: it finds nothing gone
        for client in clients:
            await client.expect_nothing()


async def test_a_goaway_at_max_connection_age_reconnects_at_once_and_pushes_nothing() -> None:
    origin = IstiodOrigin(max_age=0.5)
    origin.set(cluster("a"), endpoints("a", 1))
    clock = ManualClock()
    async with running_stack(origin, answer_grace=GRACE, clock=clock) as stack:
        backoff = recording_backoff(stack)
        delta, _ = await subscribed(stack, "d", True, ENDPOINT, ["a"])
        sotw, _ = await subscribed(stack, "s", False, CLUSTER)
        await clock.advance(1.0)  # the stream has lived longer than a backoff step
        await reconnected(origin, 1)  # gRPC's server sent a GOAWAY at its max age
        assert "wait" not in backoff.events
        await clock.advance(1.0)
        await delta.expect_nothing()
        await sotw.expect_nothing(0)


async def test_a_resend_of_unchanged_variants_pushes_nothing() -> None:
    origin = ScriptedOrigin()
    origin.set_variant(cluster("c", timeout_s=7), CANARY, version="v1")
    origin.set_variant(cluster("c", timeout_s=8), PROD, version="v1")
    async with running_stack(origin, answer_grace=GRACE) as stack:
        delta = stack.client()
        await delta.send(node=with_env("canary"), type_url=CLUSTER,
                         resource_names_subscribe=["c"])
        assert len((await delta.recv()).resources) == 1
        await delta.ack(delta.responses[-1])
        sotw = stack.client(delta=False)
        await sotw.send(node=with_env("prod"), type_url=CLUSTER, resource_names=["c"])
        assert names_of(await sotw.recv()) == ["c"]
        await sotw.ack(sotw.responses[-1], resource_names=["c"])
        origin.stream.outbox.put_nowait(None)  # the origin ends the stream
        await eventually(lambda: len(origin.streams) == 2 and
                         any(r.response_nonce for r in origin.stream.log))
        await delta.expect_nothing(AFTER_GRACE)
        await sotw.expect_nothing(0)


async def test_after_an_outage_the_relays_own_backoff_is_the_only_wait() -> None:
    origin = IstiodOrigin()
    origin.set(endpoints("e", 1))
    clock = ManualClock()
    async with running_stack(origin, clock=clock) as stack:
        backoff = recording_backoff(stack)
        client, _ = await subscribed(stack, "d", True, ENDPOINT, ["e"])
        port = origin.port
        await origin.stop()
        # Fail a few attempts in a row: a channel kept across them would have
        # grown its own reconnect backoff to seconds by now.
        for attempts in range(1, 7):
            await eventually(lambda n=attempts: backoff.events.count("wait") == n)
            await clock.advance(60.0)  # the backoff step is over: attempt again
        await eventually(lambda: backoff.events.count("wait") == 7)
        origin.set(endpoints("e", 2))
        await origin.start(port)
        streams = len(origin.streams)
        await clock.advance(60.0)  # the step is over: the next attempt must get through
        update = await client.recv()
        assert first_port(update) == 2
        assert len(origin.streams) == streams + 1
        assert backoff.events.count("wait") == 7  # no failed attempt after the return


async def test_an_origin_that_never_completes_a_connect_is_given_up_after_connect_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accepts TCP, never speaks HTTP/2

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    relay = build_relay(parse_config(relay_config(port, upstream="connect_timeout: 0.2s")))
    try:
        with caplog.at_level(logging.WARNING, "relay.upstream"):
            await relay.start()
            await eventually(lambda: caplog.text.count("not connected after 0.2s") >= 2)
        assert "upstream.connect_timeout" in caplog.text
        assert relay.not_ready_reason() == "not yet synced with the origin"
    finally:
        await relay.stop(0)
        silent.close()




def with_env(env: str) -> Any:
    made = node(f"{env}-client")
    made.dynamic_parameters[CLUSTER].params["env"] = env
    return made


def recording_backoff(stack: Stack) -> RecordingBackoff:
    """The relay's backoff, replaced by one that records its steps and resets."""
    assert stack.relay.upstream is not None
    backoff = RecordingBackoff()
    stack.relay.upstream.backoff = backoff
    return backoff


# -- 3. reconcile after a reconnect ------------------------------------------------


async def test_invariant_28_after_an_outage_istiod_deletions_are_removed_and_nothing_else(
) -> None:
    origin = IstiodOrigin()
    origin.set(cluster("a"), cluster("b"), endpoints("a", 1), endpoints("b", 2))
    async with running_stack(origin, answer_grace=GRACE) as stack:
        cds, _ = await subscribed(stack, "d1", True, CLUSTER)
        eds, _ = await subscribed(stack, "d2", True, ENDPOINT, ["a", "b"])
        sotw_cds, _ = await subscribed(stack, "s1", False, CLUSTER)
        port = origin.port
        await origin.stop()
        # Deleted while the relay was away; istiod will not say so.
        origin.remove(CLUSTER, "b")
        origin.remove(ENDPOINT, "b")
        await origin.start(port)
        removal = await cds.recv(timeout=5)
        assert list(removal.removed_resources) == ["b"] and not removal.resources
        gone = await eds.recv(timeout=5)
        assert list(gone.removed_resources) == ["b"] and not gone.resources
        full = await sotw_cds.recv(timeout=5)
        assert names_of(full) == ["a"]
        for client in (cds, eds, sotw_cds):
            await client.ack(client.responses[-1])
            await client.expect_nothing(AFTER_GRACE)


async def test_invariant_5_28_after_an_outage_an_honouring_origins_removals_and_nothing_else(
) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), cluster("b"))
    async with running_stack(origin, answer_grace=GRACE) as stack:
        delta, _ = await subscribed(stack, "d", True, CLUSTER)
        sotw, _ = await subscribed(stack, "s", False, CLUSTER)
        port = origin.port
        await origin.stop()
        origin.resources[CLUSTER].pop("b")
        await origin.start(port)
        removal = await delta.recv()
        assert list(removal.removed_resources) == ["b"] and not removal.resources
        assert names_of(await sotw.recv()) == ["a"]
        for client in (delta, sotw):
            await client.ack(client.responses[-1])
            await client.expect_nothing(AFTER_GRACE)
        assert stack.relay.upstream is not None
        assert stack.relay.upstream.state.trusts_declarations(CLUSTER)


# -- 5. sizes ---------------------------------------------------------------------


def fat_cluster(name: str, size: int) -> cluster_pb2.Cluster:
    metadata = struct_pb2.Struct()
    metadata.update({"padding": "x" * size})
    made = cluster_pb2.Cluster(name=name)
    made.metadata.filter_metadata["istio"].CopyFrom(metadata)
    return made


async def test_a_5_mb_origin_response_is_accepted_and_served() -> None:
    origin = IstiodOrigin()
    origin.set(*(fat_cluster(f"c{i:02d}", 100_000) for i in range(50)))
    # A client that raised its receive limit, and a relay told it may send that much.
    async with running_stack(origin, channel_options=BIG_MESSAGES,
                             server="max_response_size: 8MiB") as stack:
        _, first = await subscribed(stack, "d", True, CLUSTER)
        assert len(first.resources) == 50 and first.ByteSize() > 5_000_000
        assert len(origin.streams) == 1 and origin.stream.acks and not origin.stream.nacks


async def test_a_subscription_too_large_for_one_message_is_split() -> None:
    # The origin keeps gRPC's 4 MiB receive limit; 5,000 names of 1,000 bytes are 5 MB.
    names = [f"{i:04d}-" + "n" * 995 for i in range(5000)]
    origin = IstiodOrigin()
    origin.set(*(endpoints(name, 1) for name in names))
    async with running_stack(origin, channel_options=BIG_MESSAGES) as stack:
        client = stack.client()
        await client.send(node=node(), type_url=ENDPOINT, resource_names_subscribe=names)
        got: set[str] = set()
        while len(got) < len(names):
            response = await client.recv(timeout=20)
            got.update(names_of(response))
            await client.ack(response)
        subscribing = [r for r in origin.stream.log if r.resource_names_subscribe]
        assert len(subscribing) >= 5 and all(r.ByteSize() <= 1024 * 1024 for r in subscribing)
        assert sorted(n for r in subscribing for n in r.resource_names_subscribe) == names
        # And again on a new stream, whose first requests carry the node and versions.
        origin.end_streams()
        await eventually(lambda: len(origin.streams) == 2 and origin.stream.all_answered()
                         and origin.stream.resources_sent == len(names), timeout=20)
        assert len(origin.streams) == 2
        await client.expect_nothing(QUIET)


async def test_a_name_too_large_to_forward_ends_only_that_clients_stream() -> None:
    origin = IstiodOrigin()
    origin.set(endpoints("e", 1))
    async with running_stack(origin, upstream="max_request_size: 16KiB") as stack:
        good, _ = await subscribed(stack, "good", True, ENDPOINT, ["e"])
        bad = stack.client()
        await bad.send(node=node("bad"), type_url=ENDPOINT,
                       resource_names_subscribe=["x" * 20_000])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await bad.recv()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "upstream.max_request_size" in (refused.value.details() or "")
        # A short name with the node's huge dynamic parameters is as large upstream.
        heavy = stack.client()
        heavy_node = node("heavy")
        heavy_node.dynamic_parameters[ENDPOINT].params["blob"] = "p" * 20_000
        await heavy.send(node=heavy_node, type_url=ENDPOINT, resource_names_subscribe=["e"])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await heavy.recv()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "with the node's dynamic parameters" in (refused.value.details() or "")
        # A request the relay applies in pieces is refused whole: none of it
        # reaches the origin, however early in the request the names were.
        many = stack.client()
        await many.send(node=node("many"), type_url=ENDPOINT, resource_names_subscribe=[
            *(f"many-{i}" for i in range(MAX_NAMES_PER_PIECE)), "x" * 20_000])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await many.recv()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        origin.set(endpoints("e", 2))
        assert first_port(await good.recv()) == 2
        assert len(origin.streams) == 1 and not origin.stream.nacks
        assert not [name for request in origin.stream.log
                    for name in request.resource_names_subscribe if name.startswith("many-")]


# -- 6. upstream security ----------------------------------------------------------


def secured(tls: OriginTLS, token_file: Path, *extra: str) -> str:
    return "\n".join([
        f"tls: {{ca_file: {tls.ca_file}, server_name: {tls.server_name}}}",
        f"token_file: {token_file}", *extra])


def projected_token(directory: Path, token: str) -> Path:
    """``directory/istio-token`` as the kubelet lays out a projected volume: a
    symlink through ``..data``, which it repoints at a new directory to rotate."""
    directory.mkdir(exist_ok=True)
    generation = directory / f"..{token}"
    generation.mkdir()
    (generation / "istio-token").write_text(token)
    (directory / "..data_tmp").symlink_to(generation.name)
    (directory / "..data_tmp").replace(directory / "..data")
    link = directory / "istio-token"
    if not link.is_symlink():
        link.symlink_to("..data/istio-token")
    return link


async def test_tls_bearer_token_and_metadata_reach_the_origin(tmp_path: Path) -> None:
    tls = OriginTLS.create(tmp_path)
    token = tmp_path / "istio-token"
    token.write_text("token-1\n")
    origin = IstiodOrigin(tls=tls, token="token-1")
    origin.set(cluster("a"))
    upstream = secured(tls, token, "initial_metadata: {clusterid: Kubernetes}")
    async with running_stack(origin, upstream=upstream) as stack:
        _, first = await subscribed(stack, "d", True, CLUSTER)
        assert names_of(first) == ["a"]
        assert origin.stream.metadata["authorization"] == "Bearer token-1"
        assert origin.stream.metadata["clusterid"] == "Kubernetes"
        assert origin.refused == []


async def test_a_refused_token_is_reported_and_a_rotated_one_used_without_restart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tls = OriginTLS.create(tmp_path)
    token = projected_token(tmp_path / "tokens", "expired")
    origin = IstiodOrigin(tls=tls, token="fresh")
    origin.set(cluster("a"))
    with caplog.at_level(logging.ERROR, "relay.upstream"):
        async with running_stack(origin, upstream=secured(tls, token)) as stack:
            client = stack.client()
            await client.send(node=node(), type_url=CLUSTER)
            await eventually(lambda: len(origin.refused) >= 2)
            assert origin.refused[0] == "Bearer expired"
            assert "UNAUTHENTICATED" in caplog.text and "upstream.token_file" in caplog.text
            await client.expect_nothing()
            # Connected, but refused: not ready (a load balancer sends no client).
            assert stack.relay.not_ready_reason() == "not yet synced with the origin"
            projected_token(tmp_path / "tokens", "fresh")  # the kubelet rotates it
            assert names_of(await client.recv()) == ["a"]
            assert stack.relay.not_ready_reason() is None
            assert origin.stream.metadata["authorization"] == "Bearer fresh"


async def test_mtls_presents_the_client_certificate(tmp_path: Path) -> None:
    tls = OriginTLS.create(tmp_path)
    token = tmp_path / "istio-token"
    token.write_text("t")
    origin = IstiodOrigin(tls=tls, token="t", require_client_cert=True)
    origin.set(cluster("a"))
    upstream = "\n".join([
        f"tls: {{ca_file: {tls.ca_file}, server_name: {tls.server_name}, "
        f"cert_file: {tls.client_cert_file}, key_file: {tls.client_key_file}}}",
        f"token_file: {token}"])
    async with running_stack(origin, upstream=upstream) as stack:
        _, first = await subscribed(stack, "d", True, CLUSTER)
        assert names_of(first) == ["a"]
        assert origin.stream.peer_identities == ["xds-relay.xds-relay.svc"]


async def test_without_the_origins_ca_the_handshake_fails_with_a_clear_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tls = OriginTLS.create(tmp_path)
    (tmp_path / "other").mkdir()
    other = OriginTLS.create(tmp_path / "other")
    origin = IstiodOrigin(tls=tls)
    upstream = f"tls: {{ca_file: {other.ca_file}, server_name: {tls.server_name}}}"
    with caplog.at_level(logging.WARNING, "relay.upstream"):
        async with running_stack(origin, upstream=upstream) as stack:
            await eventually(lambda: "origin stream to" in caplog.text)
            assert "UNAVAILABLE" in caplog.text
            assert stack.relay.not_ready_reason() == "not yet synced with the origin"
    assert origin.streams == []


async def test_keepalive_pings_are_sent_as_configured(tmp_path: Path) -> None:
    # An origin enforcing a minimum ping interval closes a connection that
    # pings more often (istiod: 15 s). Configured to ping every 0.2 s, the
    # relay is closed and reconnects; at the default (30 s) it stays.
    origin = IstiodOrigin(min_ping_interval=5.0)
    origin.set(cluster("a"))
    async with running_stack(origin, upstream="keepalive: {time: 0.2s, timeout: 1s}") as stack:
        await subscribed(stack, "d", True, CLUSTER)
        await eventually(lambda: len(origin.streams) >= 2, timeout=10)
    origin = IstiodOrigin(min_ping_interval=5.0)
    origin.set(cluster("a"))
    async with running_stack(origin) as stack:
        await subscribed(stack, "d", True, CLUSTER)
        await asyncio.sleep(1.5)
        assert len(origin.streams) == 1


# -- 7. node identity ----------------------------------------------------------------


async def test_the_node_istiod_needs_reaches_the_origin() -> None:
    origin = IstiodOrigin()
    origin.set(cluster("a"))
    node_keys = ('metadata: {GENERATOR: grpc, NAMESPACE: xds-relay, ISTIO_VERSION: "1.24.0", '
                 'CLUSTER_ID: Kubernetes, LABELS: {app: xds-relay}}')
    async with running_stack(origin, node=node_keys) as stack:
        await subscribed(stack, "d", True, CLUSTER)
        first = origin.stream.log[0]
        assert first.node.id == "relay-test"
        assert json_format.MessageToDict(first.node.metadata) == {
            "GENERATOR": "grpc", "NAMESPACE": "xds-relay", "ISTIO_VERSION": "1.24.0",
            "CLUSTER_ID": "Kubernetes", "LABELS": {"app": "xds-relay"}}
        assert [r.HasField("node") for r in origin.stream.log].count(True) == 1
