"""``xds-relay status`` against running relays: what it prints and how it exits.

One scene serves most tests: a delta client in sync, a delta client holding
an update it has not ACKed while the origin has moved on again, and a SotW
client that NACKed. The command runs as ``relay.cli.main`` in a thread (the
relay answers on this event loop) and once as the installed entry point.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from google.rpc import status_pb2

from relay.app import Relay, build_relay
from relay.cli import main
from relay.config import parse_config
from relay.xds_types import CLUSTER, ENDPOINT
from tests.e2e.test_workers import TIMEOUT, relay_tree, spread_clients, until
from tests.harness import (
    ScriptedOrigin,
    Stack,
    cluster,
    endpoints,
    eventually,
    node,
    relay_config,
    running_stack,
)

CLUSTER_URL = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT_URL = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
NACK_MESSAGE = "cluster a: bad timeout\nfield connect_timeout: out of range"


@dataclass
class Scene:
    """A relay with three clients, and what the test needs to know of them."""

    stack: Stack
    admin: str            # the admin API's URL
    peer: str             # every client's (they share one channel)
    sotw_acked: str       # the version_info the SotW client ACKed
    sotw_rejected: str    # the version_info it NACKed
    nack_nonce: str
    stale_acked: str      # the nonce the stale client ACKed
    stale_in_flight: str  # the nonce of the response it holds unanswered


@contextlib.asynccontextmanager
async def scene() -> AsyncIterator[Scene]:
    """``synced-1`` (delta, through EDS: endpoints ``a`` ACKed at v1); ``stale-1`` (delta,
    endpoints ``b``: v2 sent and not ACKed, the cache at v3 since); ``nacker-1``
    (SotW, every cluster: a v2 NACKed, b v1)."""
    origin = ScriptedOrigin()
    origin.set(cluster("a"), cluster("b"), endpoints("a", 1), endpoints("b", 1), version="v1")
    async with running_stack(origin) as stack:
        # through the per-type service, not ADS
        synced = stack.client(
            delta=True, method="/envoy.service.endpoint.v3.EndpointDiscoveryService/DeltaEndpoints")
        await synced.send(node=node("synced-1"), type_url=ENDPOINT,
                          resource_names_subscribe=["a"])
        await synced.ack(await synced.recv())

        stale = stack.client(delta=True)
        await stale.send(node=node("stale-1"), type_url=ENDPOINT,
                         resource_names_subscribe=["b"])
        first = await stale.recv()
        await stale.ack(first)
        origin.set(endpoints("b", 2), version="v2")
        pushed = await stale.recv()  # held, not ACKed: v3 cannot follow it yet
        origin.set(endpoints("b", 3), version="v3")

        nacker = stack.client(delta=False)
        await nacker.send(node=node("nacker-1"), type_url=CLUSTER)
        accepted = await nacker.recv()
        await nacker.ack(accepted)
        origin.set(cluster("a", timeout_s=2), version="v2")
        rejected = await nacker.recv()
        await nacker.send(type_url=CLUSTER, response_nonce=rejected.nonce,
                          version_info=accepted.version_info,
                          error_detail=status_pb2.Status(code=3, message=NACK_MESSAGE))

        def settled() -> bool:
            clients = {c["node_id"]: c for c in stack.relay.serving.client_statuses()}
            return (len(clients) == 3 and
                    clients["nacker-1"]["types"][CLUSTER]["last_nack"] is not None and
                    clients["stale-1"]["types"][ENDPOINT]["unsynced"].get("b", {}).get(
                        "cached_version") == "v3" and
                    clients["synced-1"]["types"][ENDPOINT]["sync"] == "synced")

        await eventually(settled)
        [peer] = {c["peer"] for c in stack.relay.serving.client_statuses()}
        yield Scene(stack, f"http://127.0.0.1:{stack.relay.admin_port}", peer,
                    accepted.version_info, rejected.version_info, rejected.nonce,
                    first.nonce, pushed.nonce)


async def status(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``xds-relay status ARGS``: its exit code, stdout and stderr."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["status", *args])
    out, err = capsys.readouterr()
    return code, out, err


# When a stream connected and last ACKed (and NACKed), as --node shows it.
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\d+s ago\)"
CONNECTED_ACKED = f"  connected {STAMP}; last ACK {STAMP}"


def times_and_the_rest(out: str, times: str) -> list[str]:
    """The lines of ``--node``'s output, after checking that the second, when
    the stream connected and was answered, matches ``times``; without it."""
    lines = out.splitlines()
    assert re.fullmatch(times, lines[1]), lines[1]
    return [lines[0], *lines[2:]]


def columns(lines: list[str]) -> list[list[str]]:
    """The table's cells, after checking that every cell starts under its header."""
    starts = [m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", lines[0])]
    for line in lines[1:]:
        for start in starts[1:]:
            assert line[start - 2:start] == "  " and line[start] != " ", (line, starts)
    return [re.split(r"  +", line.strip()) for line in lines]


# -- the summary ------------------------------------------------------------------


async def test_status_prints_one_line_per_client_with_each_type_sync_and_last_nack(
        capsys: pytest.CaptureFixture[str]) -> None:
    async with scene() as s:
        code, out, err = await status(capsys, "--admin", s.admin)
    assert (code, err) == (0, "")
    # the origin's line, where the relay lists its origins, comes first (tested on its own)
    lines = out.splitlines()
    assert columns(lines[lines.index("") + 1:] if lines[0].startswith("ORIGIN") else lines) == [
        ["NODE", "PEER", "PROTOCOL", "Cluster", "ClusterLoadAssignment", "LAST NACK"],
        ["nacker-1", s.peer, "sotw", "NACKED (2 versions)", "-",
         "Cluster: cluster a: bad timeout field connect_timeout: out of range"],
        ["stale-1", s.peer, "delta", "-", "STALE (v2)", "-"],
        ["synced-1", s.peer, "delta/EDS", "-", "SYNCED (v1)", "-"],
    ]


async def test_status_check_exits_4_on_a_nack_5_when_a_push_is_under_way_else_0(
        capsys: pytest.CaptureFixture[str]) -> None:
    async with scene() as s:
        everyone = await status(capsys, "--admin", s.admin, "--check")
        stale = await status(capsys, "--admin", s.admin, "--check", "--node", "stale-1")
        synced = await status(capsys, "--admin", s.admin, "--check", "--node", "synced-1")
    assert [code for code, _, _ in (everyone, stale, synced)] == [4, 5, 0]


async def test_status_json_passes_on_the_relay_answer_for_the_node(
        capsys: pytest.CaptureFixture[str]) -> None:
    async with scene() as s:
        code, out, _ = await status(capsys, "--admin", s.admin, "-o", "json",
                                    "--node", "stale-1")
        expected = [c for c in s.stack.relay.serving.client_statuses()
                    if c["node_id"] == "stale-1"]
    assert code == 0
    assert json.loads(out) == {"clients": expected}
    assert expected[0]["types"][ENDPOINT]["unsynced"] == {
        "b": {"status": "sent", "version": "v2", "cached_version": "v3"}}


# -- one node in detail -------------------------------------------------------------


async def test_status_node_shows_the_whole_nack_message_and_each_resource(
        capsys: pytest.CaptureFixture[str]) -> None:
    async with scene() as s:
        code, out, err = await status(capsys, "--admin", s.admin, "--node", "nacker-1")
    assert (code, err) == (0, "")
    assert times_and_the_rest(out, f"{CONNECTED_ACKED}; last NACK {STAMP}") == [
        f"node nacker-1  peer {s.peer}  protocol sotw",
        f"  Cluster: NACKED  ({CLUSTER_URL})",
        "    subscribed: * (wildcard)",
        f"    acked: version {s.sotw_acked}",
        "    in flight: -",
        f"    last NACK: nonce {s.nack_nonce}, version {s.sotw_rejected}: cluster a: bad timeout",
        "      field connect_timeout: out of range",
        "    RESOURCE  STATUS  VERSION  CACHED",
        "    a         nacked  v2       v2",
        "    b         nacked  v1       v1",
    ]


async def test_status_node_shows_what_the_client_holds_against_the_cache(
        capsys: pytest.CaptureFixture[str]) -> None:
    async with scene() as s:
        code, out, _ = await status(capsys, "--admin", s.admin, "--node", "stale-1")
    assert code == 0
    assert times_and_the_rest(out, CONNECTED_ACKED) == [
        f"node stale-1  peer {s.peer}  protocol delta",
        f"  ClusterLoadAssignment: STALE  ({ENDPOINT_URL})",
        "    subscribed: 1 name: b",
        f"    acked: nonce {s.stale_acked}",
        f"    in flight: nonce {s.stale_in_flight}",
        "    last NACK: none",
        "    RESOURCE  STATUS  VERSION  CACHED",
        "    b         sent    v2       v3",
    ]


async def test_status_of_a_node_not_connected_is_exit_3(
        capsys: pytest.CaptureFixture[str]) -> None:
    async with scene() as s:
        code, out, err = await status(capsys, "--admin", s.admin, "--node", "nobody")
    assert (code, out) == (3, "")
    assert err == ("xds-relay status: no connected client has node id 'nobody' "
                   "(3 clients connected)\n")


async def test_status_runs_as_the_installed_command(tmp_path: Path) -> None:
    async with scene() as s:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "xds-relay"), "status", "--admin", s.admin,
            "--node", "synced-1", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert (process.returncode, err) == (0, b"")
    assert times_and_the_rest(out.decode(), CONNECTED_ACKED)[:3] == [
        f"node synced-1  peer {s.peer}  protocol delta/EDS",
        f"  ClusterLoadAssignment: SYNCED  ({ENDPOINT_URL})",
        "    subscribed: 1 name: a"]
    assert out.decode().splitlines()[-2:] == [
        "    RESOURCE  STATUS  VERSION  CACHED",
        "    a         acked   v1       v1"]


# -- when it cannot ask -------------------------------------------------------------


async def test_status_of_an_unreachable_relay_is_exit_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as bound:  # held, so that no one listens there meanwhile
        bound.bind(("127.0.0.1", 0))
        admin = f"http://127.0.0.1:{bound.getsockname()[1]}"
        code, out, err = await status(capsys, "--admin", admin)
    assert (code, out) == (1, "")
    assert err == (f"xds-relay status: cannot reach the relay's admin API at {admin}: "
                   "connection refused (is the relay running? --admin gives its "
                   "admin.address)\n")


@contextlib.asynccontextmanager
async def relay_with_admin(admin_keys: str) -> AsyncIterator[Relay]:
    """A relay (no client) whose admin section also has ``admin_keys`` (YAML flow)."""
    origin = await ScriptedOrigin().start()
    text = relay_config(origin.port)
    plain = 'admin: {address: "127.0.0.1:0"}'
    assert plain in text
    relay = build_relay(parse_config(text.replace(
        plain, f'admin: {{address: "127.0.0.1:0", {admin_keys}}}')))
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop(0)
        await origin.stop()


async def test_status_of_a_relay_with_a_token_and_tls_needs_token_file_and_ca_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key, ca_file = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    token, wrong = tmp_path / "token", tmp_path / "wrong"
    token.write_text("s3cret\n")
    wrong.write_text("guess\n")
    async with relay_with_admin(f"token_file: {token}, "
                                f"tls: {{cert_file: {cert}, key_file: {key}}}") as relay:
        admin = f"https://127.0.0.1:{relay.admin_port}"
        untrusted = await status(capsys, "--admin", admin, "--token-file", str(token))
        tokenless = await status(capsys, "--admin", admin, "--ca-file", str(ca_file))
        mistaken = await status(capsys, "--admin", admin, "--ca-file", str(ca_file),
                                "--token-file", str(wrong))
        served = await status(capsys, "--admin", admin, "--ca-file", str(ca_file),
                              "--token-file", str(token))
        plain = f"http://127.0.0.1:{relay.admin_port}"
        plaintext = await status(capsys, "--admin", plain)
    assert untrusted[0] == 1
    assert untrusted[2].startswith(f"xds-relay status: cannot reach the relay's admin API at "
                                   f"{admin}: TLS: ")
    assert "(--ca-file: the CA that signed admin.tls's certificate)" in untrusted[2]
    assert tokenless == (1, "", f"xds-relay status: {admin}/clients: 401, the relay's admin "
                                "API needs a token: pass --token-file (the file "
                                "admin.token_file names)\n")
    assert mistaken == (1, "", f"xds-relay status: {admin}/clients: 401, the token in "
                               "--token-file is not the relay's (admin.token_file)\n")
    # the relay's one origin first (its age ticks: matched, not compared), then the clients
    code, out, err = served
    assert (code, err) == (0, "")
    assert re.fullmatch(
        r"ORIGIN +SERVER +STATE +SYNCED +RECONNECTS\n"
        r"default +127\.0\.0\.1:\d+ +CONNECTED since \S+Z \(\d+s ago\) +(yes|no) +0\n"
        r"\nno clients are connected\n", out), out
    assert plaintext == (1, "", f"xds-relay status: {plain} closed the connection without "
                                "answering (with admin.tls, use an https:// --admin)\n")


# -- with --workers ---------------------------------------------------------------------


async def test_status_lists_the_clients_of_every_worker(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    origin = ScriptedOrigin()
    origin.set(cluster("a"), version="v1")
    await origin.start()
    followers = []
    try:
        async with relay_tree(origin.port, tmp_path) as tree:
            followers = await spread_clients(tree, {"a": "v1"}, minimum=2, reconnect=False)
            placement = await tree.placement()

            async def all_synced() -> bool:
                clients = (await tree.clients())["clients"]
                return all(c["types"][CLUSTER]["sync"] == "synced" for c in clients)

            await until(all_synced)
            code, out, err = await status(capsys, "--admin",
                                          f"http://127.0.0.1:{tree.admin_port}", "--check")
    finally:
        for follower in followers:
            await follower.close()
        await origin.stop()
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("ORIGIN") and lines[1].startswith("default ")  # the hub's origin
    rows = columns(lines[lines.index("") + 1:])
    assert rows[0] == ["NODE", "PEER", "PROTOCOL", "WORKER", "Cluster", "LAST NACK"]
    assert [(row[0], row[2], row[3], row[4], row[5]) for row in rows[1:]] == [
        (node_id, "delta", str(worker), "SYNCED (v1)", "-")
        for node_id, worker in sorted(placement.items())]
    assert set(placement.values()) == {1, 2}



async def test_status_of_a_relay_with_node_groups_shows_each_streams_group(
        capsys: pytest.CaptureFixture[str]) -> None:
    from envoy.config.core.v3 import base_pb2

    from relay.node_groups import group_id

    origin = ScriptedOrigin()
    origin.set(cluster("a"), version="v1")
    groups = "node_groups: {key: [cluster, metadata.NAMESPACE]}"
    async with running_stack(origin, upstream=groups) as stack:
        for node_id, service, namespace in (("c-1", "checkout", "shop"),
                                            ("c-2", "checkout", "shop"),
                                            ("p-1", "payments", "bank")):
            client_node = base_pb2.Node(id=node_id, cluster=service)
            client_node.metadata.update({"NAMESPACE": namespace})
            client = stack.client(delta=True)
            await client.send(node=client_node, type_url=CLUSTER,
                              resource_names_subscribe=["a"])
            await client.ack(await client.recv())
        admin = f"http://127.0.0.1:{stack.relay.admin_port}"
        await eventually(lambda: all(c["types"][CLUSTER]["sync"] == "synced"
                                     for c in stack.relay.serving.client_statuses()))
        code, out, err = await status(capsys, "--admin", admin)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    blank = lines.index("")
    origins, clients = columns(lines[:blank]), columns(lines[blank + 1:])
    checkout, payments = group_id(("checkout", "shop")), group_id(("payments", "bank"))
    assert [row[:3] for row in origins] == [
        ["ORIGIN", "GROUP", "SERVER"],
        [f"default/{checkout}", "checkout,shop (2 clients)", f"127.0.0.1:{origin.port}"],
        [f"default/{payments}", "payments,bank (1 client)", f"127.0.0.1:{origin.port}"]]
    assert [[row[3].split(" ")[0], *row[4:]] for row in origins[1:]] == [
        ["CONNECTED", "yes", "0"], ["CONNECTED", "yes", "0"]]
    assert [[row[0], row[3], row[4]] for row in clients] == [
        ["NODE", "GROUP", "Cluster"],
        ["c-1", "checkout,shop", "SYNCED (v1)"],
        ["c-2", "checkout,shop", "SYNCED (v1)"],
        ["p-1", "payments,bank", "SYNCED (v1)"]]
