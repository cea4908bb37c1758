"""``xds-relay run --workers 2`` as real processes behind a scripted origin.

The hub follows the origin; two workers serve clients on one port. Clients
here reconnect when their stream breaks, as Envoy does, each over a
connection of its own so that the kernel can spread them over the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from prometheus_client.parser import text_string_to_metric_families

from relay.server.services import DRAINING
from relay.xds_types import CLUSTER
from tests.certs import Authority, tls_channel
from tests.harness import DELTA, ScriptedOrigin, XdsClient, cluster, eventually, names_of, node

REPO = Path(__file__).resolve().parents[2]
DELTA_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
STARTED = re.compile(r"serving xDS on 127\.0\.0\.1:(\d+) with (\d+) workers, "
                     r"admin on 127\.0\.0\.1:(\d+)")
TIMEOUT = 20.0  # process start-ups on a busy 2-core machine


async def until(check: Callable[[], Awaitable[bool]], timeout: float = TIMEOUT) -> None:
    """Wait until ``await check()`` is true (polling, for what other processes do)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@dataclass
class RelayTree:
    """A relay process (with --workers, the hub), its ports, its log."""

    process: asyncio.subprocess.Process
    log: Path
    xds_port: int = 0
    admin_port: int = 0

    async def get(self, path: str) -> tuple[int, bytes]:
        def fetch() -> tuple[int, bytes]:
            url = f"http://127.0.0.1:{self.admin_port}{path}"
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    return reply.status, reply.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()

        return await asyncio.to_thread(fetch)

    async def clients(self) -> dict[str, Any]:
        status, body = await self.get("/clients")
        assert status == 200
        return dict(json.loads(body))

    async def placement(self) -> dict[str, int]:
        """Which worker serves each client, by node id."""
        return {c["node_id"]: c["worker"] for c in (await self.clients())["clients"]}

    async def ready(self) -> bool:
        return (await self.get("/ready"))[0] == 200


@contextlib.asynccontextmanager
async def relay_tree(origin_port: int, tmp_path: Path, drain_period: str = "10s",
                     server: str = "") -> AsyncIterator[RelayTree]:
    """``xds-relay run --workers 2`` following the origin, once ready; ports
    chosen by the relay (0), read from its log. Stopped at the end (SIGINT).
    ``server`` adds keys to the server section (YAML flow)."""
    config = tmp_path / "relay.yaml"
    server_keys = f", {server}" if server else ""
    config.write_text(f"""
node: {{id: relay-test, cluster: xds-relay}}
server: {{address: "127.0.0.1:0", drain_period: {drain_period}{server_keys}}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{address: "127.0.0.1:{origin_port}", backoff: {{initial: 0.05s, max: 0.5s}}}}
""")
    log = tmp_path / "relay.log"
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "relay", "run", "--config", str(config), "--workers", "2",
            cwd=REPO, stderr=stderr)
    tree = RelayTree(process, log)
    try:
        async def started() -> bool:
            match = STARTED.search(log.read_text())
            if match is not None:
                tree.xds_port, tree.admin_port = int(match[1]), int(match[3])
            assert process.returncode is None, log.read_text()
            return match is not None

        await until(started)
        await until(tree.ready)
        yield tree
    finally:
        await interrupted(process)
        print(log.read_text())  # shown when the test fails


async def interrupted(process: asyncio.subprocess.Process) -> None:
    """Stop ``process`` with SIGINT (SIGKILL if it takes over 15 s), unless it has ended."""
    if process.returncode is None:
        process.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()


@dataclass
class Follower:
    """A delta client of CDS (wildcard) that, with ``reconnect``, opens a new
    stream whenever its stream ends, on a connection of its own."""

    target: str
    node_id: str
    reconnect: bool = True
    versions: dict[str, str] = field(default_factory=dict)
    answered_streams: int = 0  # streams on which it got a response
    errors: list[grpc.aio.AioRpcError] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.channel = grpc.aio.insecure_channel(self.target, options=[
            ("grpc.use_local_subchannel_pool", 1),  # a connection of its own
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)])
        self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            call = self.channel.stream_stream(
                DELTA_ADS, request_serializer=DELTA.SerializeToString,
                response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)(
                    wait_for_ready=True)
            try:
                await call.write(DELTA(node=node(self.node_id), type_url=CLUSTER))
                answered = False
                while (response := await call.read()) is not grpc.aio.EOF:
                    self.versions.update((r.name, r.version) for r in response.resources)
                    for name in response.removed_resources:
                        self.versions.pop(name, None)
                    if not answered:
                        answered = True
                        self.answered_streams += 1
                    await call.write(DELTA(type_url=CLUSTER, response_nonce=response.nonce))
            except grpc.aio.AioRpcError as error:
                self.errors.append(error)
            if not self.reconnect:
                return
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        self._task.cancel()
        await self.channel.close()


async def spread_clients(tree: RelayTree, versions: dict[str, str], minimum: int = 4,
                         reconnect: bool = True) -> list[Follower]:
    """At least ``minimum`` clients holding ``versions``, both workers serving some.

    The kernel picks a worker for each connection from a hash of its
    addresses, so each new client has even odds: clients are added until
    both have one (40 all on one worker would be a 1 in 2^39 chance).
    """
    followers: list[Follower] = []
    while len(followers) < minimum or len(set((await tree.placement()).values())) < 2:
        assert len(followers) < 40, "every client landed on the same worker"
        follower = Follower(f"127.0.0.1:{tree.xds_port}", f"client-{len(followers)}",
                            reconnect)
        followers.append(follower)
        await eventually(lambda f=follower: f.versions == versions, TIMEOUT)
        await until(functools.partial(_listed, tree, len(followers)))
    return followers


async def _listed(tree: RelayTree, count: int) -> bool:
    return len((await tree.clients())["clients"]) == count


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_workers_serve_clients_from_one_origin_stream_and_a_killed_one_comes_back(
        tmp_path: Path) -> None:
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"), cluster("b"), version="v1")
    followers: list[Follower] = []
    try:
        async with relay_tree(origin.port, tmp_path) as tree:
            followers = await spread_clients(tree, {"a": "v1", "b": "v1"})
            assert len(origin.streams) == 1
            assert origin.streams[0].log[0].node.id == "relay-test"  # the configured node
            # /metrics: the hub's origin stream, and the clients counted by each worker.
            status, text = await tree.get("/metrics")
            assert status == 200
            series = [s for family in text_string_to_metric_families(text.decode())
                      for s in family.samples]
            assert [s.value for s in series if s.name == "xds_relay_upstream_connected"] == [1]
            streams = {s.labels["worker"]: s.value for s in series
                       if s.name == "xds_relay_downstream_streams"}
            assert sorted(streams) == ["1", "2"] and sum(streams.values()) == len(followers)
            # Each process's own series, the hub's too; readiness is the hub's alone.
            pids = {s.labels["worker"]: s.value for s in series
                    if s.name == "process_start_time_seconds"}
            assert sorted(pids) == ["1", "2", "hub"]
            assert [("worker" in s.labels, s.value) for s in series
                    if s.name == "xds_relay_ready"] == [(False, 1)]

            placement = await tree.placement()
            [victim, survivor] = (await tree.clients())["workers"]
            on_victim = [f for f in followers if placement[f.node_id] == victim["worker"]]
            os.kill(victim["pid"], signal.SIGKILL)

            # Its clients see their stream fail, reconnect (to either worker) and
            # are served again; the others notice nothing.
            await eventually(lambda: all(f.answered_streams == 2 for f in on_victim), TIMEOUT)
            assert all(f.errors for f in on_victim)
            assert not any(f.errors for f in followers if f not in on_victim)

            async def restarted() -> bool:
                workers = (await tree.clients())["workers"]
                return bool(workers[0]["pid"] != victim["pid"] and workers[0]["ready"]
                            and workers[0]["restarts"] == 1)

            await until(restarted)
            assert (await tree.clients())["workers"][1] == survivor
            assert await tree.ready()
            assert re.search(rf"worker {victim['worker']} \(pid {victim['pid']}\) was killed "
                             r"by SIGKILL; restarting it in \d\.\ds", tree.log.read_text())

            origin.set(cluster("a", timeout_s=7), version="v2")
            await eventually(lambda: all(f.versions == {"a": "v2", "b": "v1"}
                                         for f in followers), TIMEOUT)
            origin.remove(CLUSTER, "b")
            await eventually(lambda: all(f.versions == {"a": "v2"} for f in followers),
                             TIMEOUT)
            assert len(origin.streams) == 1
    finally:
        for follower in followers:
            await follower.close()
        await origin.stop()


async def test_sigterm_drains_every_worker_and_the_whole_tree_exits_0(tmp_path: Path) -> None:
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"), version="v1")
    followers: list[Follower] = []
    try:
        async with relay_tree(origin.port, tmp_path, drain_period="1s") as tree:
            followers = await spread_clients(tree, {"a": "v1"}, reconnect=False)
            pids = [worker["pid"] for worker in (await tree.clients())["workers"]]
            sent = time.monotonic()
            tree.process.send_signal(signal.SIGTERM)
            await eventually(lambda: all(f.errors for f in followers), TIMEOUT)
            assert {(f.errors[0].code(), f.errors[0].details()) for f in followers} == {
                (grpc.StatusCode.UNAVAILABLE, DRAINING)}
            assert await asyncio.wait_for(tree.process.wait(), TIMEOUT) == 0
            # The drain period, and what it takes the processes to exit.
            assert time.monotonic() - sent < 1.0 + 3.0
            assert all(_gone(pid) for pid in pids)
            assert "SIGTERM: draining 2 workers over 1.0s" in tree.log.read_text()
    finally:
        for follower in followers:
            await follower.close()
        await origin.stop()


async def test_workers_serve_mutual_tls_and_authorize_each_client(tmp_path: Path) -> None:
    """Every worker serves the TLS port with the configured rules; the hub's
    private socket between them stays plaintext."""
    ca = Authority(tmp_path)
    relay_leaf = ca.relay_leaf()
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"), version="v1")
    tls = (f"tls: {{cert_file: '{relay_leaf.cert_file}', key_file: '{relay_leaf.key_file}', "
           f"client_ca_file: '{ca.cert_file}'}}, "
           "authorization: {allow: ['spiffe://mesh.test/ns/app/sa/*']}")
    try:
        async with relay_tree(origin.port, tmp_path, server=tls) as tree:
            allowed = ca.issue("frontend", spiffe_id="spiffe://mesh.test/ns/app/sa/frontend")
            stranger = ca.issue("stranger", spiffe_id="spiffe://mesh.test/ns/db/sa/x")
            # A connection each: the kernel spreads them over both workers.
            for number in range(6):
                channel = tls_channel(tree.xds_port, ca, allowed if number % 2 else stranger)
                client = XdsClient(channel, DELTA_ADS, delta=True)
                try:
                    if number % 2:
                        await client.send(node=node(f"client-{number}"), type_url=CLUSTER,
                                          resource_names_subscribe=["a"])
                        assert names_of(await client.recv(TIMEOUT)) == ["a"]
                    else:
                        # Refused as the call opens, before any request: none is
                        # written (a write racing the refusal can turn the status
                        # the client reads into gRPC's INTERNAL, grpc/grpc#36066).
                        code = await asyncio.wait_for(client.call.code(), TIMEOUT)
                        assert code == grpc.StatusCode.PERMISSION_DENIED
                finally:
                    client.close()
                    await channel.close()
            assert len(origin.streams) == 1
    finally:
        await origin.stop()
