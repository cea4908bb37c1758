"""Load reports (LRS) forwarded to the origins (issue 25 item 5; relay.server.load_reports).

The rule on its own (:class:`ReportFanOut`, no network), then end to end: a real
client report stream to a relay on loopback, forwarded to scripted origins that
serve LRS beside Delta ADS (:class:`tests.load_reports.LrsOrigin`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.service.load_stats.v3 import lrs_pb2
from google.protobuf import duration_pb2

from relay.app import Relay, build_relay
from relay.config import parse_config
from relay.server import load_reports
from relay.server.load_reports import NO_ORIGIN, OriginEnded, ReportFanOut
from relay.upstream.dial import Dialer
from relay.upstream.origins import Routes
from tests.certs import Authority, tls_channel
from tests.harness import TIMEOUT, ScriptedOrigin, Stack, node, running_stack
from tests.load_reports import LrsOrigin, ReportClient, ReportStream, asking, stats

EAST = "east.example.com"
EAST_CLUSTER = f"xdstp://{EAST}/envoy.config.cluster.v3.Cluster/backend-east"
WEST_CLUSTER = "xdstp://west.example.com/envoy.config.cluster.v3.Cluster/backend-west"


def hello(node_id: str = "client-1") -> lrs_pb2.LoadStatsRequest:
    """A stream's first request: the Node, nothing to report yet."""
    return lrs_pb2.LoadStatsRequest(node=node(node_id))


async def over(stream: ReportStream) -> None:
    """Wait for an origin's report stream to end."""
    await asyncio.wait_for(stream.ended.wait(), TIMEOUT)


def report(*cluster_stats: object) -> lrs_pb2.LoadStatsRequest:
    return lrs_pb2.LoadStatsRequest(cluster_stats=cluster_stats)


# -- the rule, without I/O -----------------------------------------------------


def two_origins() -> ReportFanOut:
    routes = Routes([EAST], default=True)
    return ReportFanOut(routes.origins(), routes.origin_of)


def test_one_origin_is_sent_each_request_as_it_is() -> None:
    routes = Routes([], default=True)
    fan = ReportFanOut(routes.origins(), routes.origin_of)
    request = report(stats("a", dropped=2), stats(WEST_CLUSTER, successful=3))
    request.node.CopyFrom(node())
    assert fan.request(request) == {"default": request}
    response = asking("a", seconds=7)
    assert fan.response("default", response) is response


def test_each_cluster_goes_to_its_origin_and_the_node_to_every_origin() -> None:
    fan = two_origins()
    assert fan.request(hello()) == {"default": hello(), EAST: hello()}
    split = fan.request(report(stats("a", 1), stats(EAST_CLUSTER, 2), stats(WEST_CLUSTER, 3)))
    assert split == {"default": report(stats("a", 1), stats(WEST_CLUSTER, 3)),
                     EAST: report(stats(EAST_CLUSTER, 2))}
    # nothing to report: every origin hears it; nothing for one origin: it hears nothing
    assert fan.request(report()) == {"default": report(), EAST: report()}
    assert fan.request(report(stats("a", 4))) == {"default": report(stats("a", 4))}


def test_stats_of_a_cluster_no_origin_serves_go_nowhere() -> None:
    routes = Routes([EAST], default=False)
    fan = ReportFanOut(routes.origins(), routes.origin_of)
    assert fan.request(report(stats("classic", 1), stats(EAST_CLUSTER, 2))) == {
        EAST: report(stats(EAST_CLUSTER, 2))}


def test_responses_of_several_origins_are_merged() -> None:
    fan = two_origins()
    first = asking("a", "b", seconds=10)
    assert fan.response("default", first) is first  # the only one so far: as it is
    merged = fan.response(EAST, asking(EAST_CLUSTER, "a", seconds=2))
    assert merged == asking("a", "b", EAST_CLUSTER, seconds=2)
    # a later response replaces its origin's part only
    shorter = lrs_pb2.LoadStatsResponse(
        clusters=["c"], report_endpoint_granularity=True,
        load_reporting_interval=duration_pb2.Duration(nanos=500_000_000))
    assert fan.response("default", shorter) == lrs_pb2.LoadStatsResponse(
        clusters=["c", EAST_CLUSTER, "a"], report_endpoint_granularity=True,
        load_reporting_interval=duration_pb2.Duration(nanos=500_000_000))
    assert fan.response(EAST, asking(send_all=True, seconds=3)).send_all_clusters


def test_an_origin_without_lrs_among_several_is_left_out() -> None:
    fan = two_origins()
    fan.response("default", asking("a", seconds=5))
    fan.response(EAST, asking(EAST_CLUSTER, seconds=1))
    assert fan.ended(EAST, grpc.StatusCode.UNIMPLEMENTED) == asking("a", seconds=5)
    assert fan.live == ["default"]
    assert fan.request(report(stats(EAST_CLUSTER, 1), stats("a", 2))) == {
        "default": report(stats("a", 2))}
    # the last origin's end is the stream's, UNIMPLEMENTED too
    assert fan.ended("default", grpc.StatusCode.UNIMPLEMENTED) == OriginEnded(
        "default", grpc.StatusCode.UNIMPLEMENTED)


def test_any_other_end_of_an_origin_ends_the_stream() -> None:
    fan = two_origins()
    assert fan.ended(EAST, grpc.StatusCode.UNAVAILABLE) == OriginEnded(
        EAST, grpc.StatusCode.UNAVAILABLE)
    assert two_origins().ended("default", grpc.StatusCode.OK) == OriginEnded(
        "default", grpc.StatusCode.OK)
    # one that had not answered leaves nothing new to tell the client
    fan = two_origins()
    assert fan.ended(EAST, grpc.StatusCode.UNIMPLEMENTED) is None


async def test_report_streams_share_channels_to_an_origin_a_few_dozen_each() -> None:
    dialed: list[str] = []

    def dialer_of(origin: str) -> Dialer:
        dialed.append(origin)
        return Dialer("127.0.0.1:1")  # channels connect lazily: never, here

    channels = load_reports._Channels(dialer_of)
    per = load_reports.STREAMS_PER_CHANNEL
    taken = [channels.take("default") for _ in range(per + 1)]
    assert len({id(c) for c in taken}) == 2 and channels.counts() == {"default": 2}
    east = channels.take(EAST)
    assert channels.counts() == {"default": 2, EAST: 1}
    # a stream that failed UNAVAILABLE: its channel takes no new streams
    await channels.give_back("default", taken[0], failed=True)
    assert channels.take("default") is not taken[0]
    assert channels.counts() == {"default": 2, EAST: 1}
    assert dialed == ["default", "default", EAST]
    # each channel closes with its last stream
    await channels.give_back(EAST, east, failed=False)
    assert channels.counts() == {"default": 2}
    for shared in taken[1:per]:
        await channels.give_back("default", shared, failed=False)
    assert channels.counts() == {"default": 1}


# -- end to end: one origin ----------------------------------------------------


@contextlib.asynccontextmanager
async def reporting(stack: Stack) -> AsyncIterator[ReportClient]:
    client = ReportClient(stack.channel)
    try:
        yield client
    finally:
        client.close()


def where(stack: Stack) -> str:
    return f"the origin at 127.0.0.1:{stack.origin.port}"


async def test_reports_reach_the_origin_and_its_answer_the_client(tmp_path: Path) -> None:
    origin = LrsOrigin()
    token = tmp_path / "token"
    token.write_text("lrs-token\n")
    upstream = f"token_file: {token}\ninitial_metadata: {{clusterid: Kubernetes}}"
    async with running_stack(origin, upstream=upstream) as stack, reporting(stack) as client:
        await client.send(hello())
        stream = await origin.report_stream()
        assert await stream.next_request() == hello()
        # the origin sees the relay's credentials, as on its xDS stream
        assert stream.metadata["authorization"] == "Bearer lrs-token"
        assert stream.metadata["clusterid"] == "Kubernetes"
        answer = asking("backend", seconds=2)
        stream.respond(answer)
        assert await client.recv() == answer
        sent = report(stats("backend", dropped=3, successful=40))
        await client.send(sent)
        assert await stream.next_request() == sent
        # the client is done: so is the origin's stream, and the client's ends OK
        await client.call.done_writing()
        assert await client.ended() == (grpc.StatusCode.OK, "")
        await over(stream)
        assert len(origin.report_streams) == 1


async def test_the_origin_down_is_unavailable_naming_it() -> None:
    origin = LrsOrigin(asking("backend"))
    async with running_stack(origin) as stack:
        await origin.stop()
        async with reporting(stack) as client:
            await client.send(hello())
            code, details = await client.ended()
    assert code == grpc.StatusCode.UNAVAILABLE
    prefix = (f"the relay forwards load reports to {where(stack)}, whose stream ended "
              f"with UNAVAILABLE: ")
    assert details.startswith(prefix), details
    assert len(details) > len(prefix)  # gRPC's own reason follows


async def test_the_origins_status_ends_the_clients_stream() -> None:
    origin = LrsOrigin(asking("backend"))
    async with running_stack(origin) as stack, reporting(stack) as client:
        await client.send(hello())
        assert await client.recv() == asking("backend")
        stream = await origin.report_stream()
        stream.end(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many reporters")
        assert await client.ended() == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the relay forwards load reports to {where(stack)}, whose stream ended with "
            f"RESOURCE_EXHAUSTED: too many reporters")


async def test_an_origin_without_lrs_is_unimplemented_naming_it() -> None:
    async with running_stack(ScriptedOrigin()) as stack, reporting(stack) as client:
        await client.send(hello())
        code, details = await client.ended()
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert details.startswith(f"the relay forwards load reports to {where(stack)}, whose "
                              f"stream ended with UNIMPLEMENTED: "), details


async def test_an_origin_stream_whose_status_was_lost_is_opened_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # gRPC Python may report an origin's end as its own INTERNAL when a write raced it
    # (grpc/grpc#36066): the relay asks again, once, before the origin answered.
    monkeypatch.setattr(load_reports, "_status_lost",
                        lambda error: error.code() is grpc.StatusCode.INTERNAL)
    origin = LrsOrigin(asking("backend"))
    origin.refusals = [(grpc.StatusCode.INTERNAL, "lost")]
    async with running_stack(origin) as stack, reporting(stack) as client:
        await client.send(hello())
        assert await client.recv() == asking("backend")
        assert len(origin.report_streams) == 2
        assert await origin.report_streams[1].next_request() == hello()
    # once is all: the next such end is the stream's
    origin = LrsOrigin(asking("backend"))
    origin.refusals = [(grpc.StatusCode.INTERNAL, "lost")] * 2
    async with running_stack(origin) as stack, reporting(stack) as client:
        await client.send(hello())
        assert await client.ended() == (
            grpc.StatusCode.INTERNAL,
            f"the relay forwards load reports to {where(stack)}, whose stream ended with "
            f"INTERNAL: lost")
        assert len(origin.report_streams) == 2


async def test_a_client_leaving_ends_its_origin_stream() -> None:
    origin = LrsOrigin(asking("backend"))
    async with running_stack(origin) as stack, reporting(stack) as client:
        await client.send(hello())
        await client.recv()
        stream = await origin.report_stream()
        client.close()
        await over(stream)


async def test_load_report_streams_are_limited() -> None:
    origin = LrsOrigin(asking("backend"))
    async with running_stack(origin, limits="load_report_streams: 1") as stack:
        async with reporting(stack) as first:
            await first.send(hello())
            await first.recv()
            async with reporting(stack) as second:
                await second.send(hello("client-2"))
                assert await second.ended() == (
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "the relay forwards 1 load report streams, its most "
                    "(limits.load_report_streams); report to another replica")
            assert stack.relay.registry.get_sample_value(
                "xds_relay_downstream_limited_streams_total",
                {"limit": "load_report_streams"}) == 1
            # the refused stream never reached the origin
            assert len(origin.report_streams) == 1
        await over(origin.report_streams[0])
        # once the first left, another is taken
        async with reporting(stack) as third:
            await third.send(hello("client-3"))
            assert await third.recv() == asking("backend")
        assert len(origin.report_streams) == 2


async def test_a_relay_serving_files_refuses_with_unimplemented(tmp_path: Path) -> None:
    relay = build_relay(parse_config(f"""
node: {{id: relay-test}}
server: {{address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{files: "{tmp_path}"}}
"""))
    await relay.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}")
    client = ReportClient(channel)
    try:
        await client.send(hello())
        assert await client.ended() == (grpc.StatusCode.UNIMPLEMENTED, NO_ORIGIN)
    finally:
        client.close()
        await channel.close()
        await relay.stop(0)


async def test_a_client_not_allowed_to_connect_cannot_report(tmp_path: Path) -> None:
    # The relay reports with its own credentials: it admits reports as it admits xDS.
    ca = Authority(tmp_path)
    leaf = ca.relay_leaf()
    server = (f"tls: {{cert_file: '{leaf.cert_file}', key_file: '{leaf.key_file}', "
              f"client_ca_file: '{ca.cert_file}'}}, "
              f"authorization: {{node_binding: id}}")
    origin = LrsOrigin(asking("backend"))
    async with running_stack(origin, server=server) as stack:
        client_leaf = ca.issue("edge", dns=("edge-7.mesh.test",))
        channel = tls_channel(stack.relay.xds_port, ca, client_leaf)
        client = ReportClient(channel)
        try:
            await client.send(hello("edge-8.mesh.test"))
            assert await client.ended() == (
                grpc.StatusCode.PERMISSION_DENIED,
                "node id 'edge-8.mesh.test' is not the identity of its certificate "
                "(edge-7.mesh.test) (server.authorization.node_binding: id)")
            assert stack.relay.registry.get_sample_value(
                "xds_relay_downstream_refused_streams_total", {"reason": "node_binding"}) == 1
            # what the origin heard of it: no report
            assert all(not s.log for s in origin.report_streams)
            # its own identity reports
            allowed = ReportClient(channel)
            await allowed.send(hello("edge-7.mesh.test"))
            assert await allowed.recv() == asking("backend")
            allowed.close()
        finally:
            client.close()
            await channel.close()


# -- end to end: several origins -----------------------------------------------


def two_origin_config(default_port: int, east_port: int) -> str:
    return f"""
node: {{id: relay-test, cluster: xds-relay}}
server: {{address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{address: "127.0.0.1:{default_port}", answer_grace: 0.3s}}
authorities:
  {EAST}: {{address: "127.0.0.1:{east_port}", answer_grace: 0.3s}}
"""


@contextlib.asynccontextmanager
async def two_origin_relay(default: ScriptedOrigin, east: ScriptedOrigin
                           ) -> AsyncIterator[tuple[Relay, ReportClient]]:
    await default.start()
    await east.start()
    relay = build_relay(parse_config(two_origin_config(default.port, east.port)))
    await relay.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}")
    client = ReportClient(channel)
    try:
        yield relay, client
    finally:
        client.close()
        await channel.close()
        await relay.stop(0)
        await default.stop()
        await east.stop()


async def test_each_clusters_reports_reach_the_origin_that_serves_it() -> None:
    default, east = LrsOrigin(), LrsOrigin()
    async with two_origin_relay(default, east) as (_, client):
        await client.send(hello())
        to_default, to_east = await default.report_stream(), await east.report_stream()
        assert await to_default.next_request() == hello()
        assert await to_east.next_request() == hello()
        # each origin's answer reaches the client, merged with the other's
        to_default.respond(asking("backend", WEST_CLUSTER, seconds=10))
        assert await client.recv() == asking("backend", WEST_CLUSTER, seconds=10)
        to_east.respond(asking(EAST_CLUSTER, seconds=2))
        assert await client.recv() == asking("backend", WEST_CLUSTER, EAST_CLUSTER, seconds=2)
        # one report of the three clusters: each origin gets its own
        await client.send(report(stats("backend", 1), stats(EAST_CLUSTER, 2),
                                 stats(WEST_CLUSTER, 3)))
        assert await to_default.next_request() == report(stats("backend", 1),
                                                         stats(WEST_CLUSTER, 3))
        assert await to_east.next_request() == report(stats(EAST_CLUSTER, 2))
        # one origin ending ends the stream, naming it
        to_east.end(grpc.StatusCode.UNAVAILABLE, "east restarts")
        assert await client.ended() == (
            grpc.StatusCode.UNAVAILABLE,
            f"the relay forwards load reports to origin {EAST} at 127.0.0.1:{east.port}, "
            f"whose stream ended with UNAVAILABLE: east restarts")
        await over(to_default)


async def test_an_origin_without_lrs_among_several_is_left_out_end_to_end() -> None:
    default, east = LrsOrigin(asking("backend", seconds=3)), ScriptedOrigin()
    async with two_origin_relay(default, east) as (_, client):
        await client.send(hello())
        assert await client.recv() == asking("backend", seconds=3)
        to_default = await default.report_stream()
        await client.send(report(stats(EAST_CLUSTER, 1), stats("backend", 2)))
        await to_default.next_request()  # the hello
        assert await to_default.next_request() == report(stats("backend", 2))
        # the stream goes on: the default origin's next answer reaches the client
        to_default.respond(asking("backend", "other", seconds=3))
        assert await client.recv() == asking("backend", "other", seconds=3)
        assert not to_default.ended.is_set()


@pytest.mark.parametrize("several", [False, True])
async def test_the_relay_stopping_ends_the_origin_streams(several: bool) -> None:
    default = LrsOrigin(asking("backend"))
    east = LrsOrigin(asking(EAST_CLUSTER))
    if several:
        async with two_origin_relay(default, east) as (relay, client):
            await client.send(hello())
            await client.recv()
            streams = [await default.report_stream(), await east.report_stream()]
            await relay.stop(0)
    else:
        async with running_stack(default) as stack, reporting(stack) as client:
            await client.send(hello())
            await client.recv()
            streams = [await default.report_stream()]
            await stack.relay.stop(0)
    for stream in streams:
        await over(stream)


def test_a_lost_status_is_told_by_grpcs_own_error() -> None:
    empty = grpc.aio.Metadata()
    raced = grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, empty, empty, "Internal error from Core",
        'Failed "execute_batch": (<grpc._cython.cygrpc.SendMessageOperation object>,)')
    origins_own = grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, empty, empty, "broken",
                                       "INTERNAL:broken")
    assert load_reports._status_lost(raced)
    assert not load_reports._status_lost(origins_own)
