"""A fleet end to end (issue 23, item 5): three relay processes of one zone
sharing a Redis snapshot and one origin, and clients spread over them as a
Kubernetes Service spreads connections (each connect picks a random replica
among those ready).

One replica is SIGKILLed: its clients come back through the others within
their reconnect backoff plus 1 s, with nothing lost and nothing re-sent that
they declared. It is started again: the fleet's short
``server.max_connection_age`` retires every connection within an age (and
its grace), each retired client picks a replica afresh, so the load evens
out within two ages. Throughout, the origin sees one stream per live replica.

The clients (:class:`FleetClient`), the Service (:class:`Service`) and the
origin that counts its open streams (:class:`CountingOrigin`) are also what
``benchmarks/fleet.py`` runs, at a larger scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import CLUSTER
from tests.e2e.test_persistence_processes import relay_process, text_of
from tests.e2e.test_workers import DELTA_ADS, RelayTree
from tests.harness import DELTA, ScriptedOrigin, cluster, eventually, node, version_of
from tests.redis_server import redis_server

REPLICAS = 3
CLIENTS = 45
NAMES = ("a", "b", "c", "d", "e")
# The clients' wait before reconnecting after their stream ends.
BACKOFF = 0.2
# The fleet's connection age and grace: short, so that the rejoin evens out quickly.
AGE = 2.0
GRACE = 0.5
SEED = 23
# How long the fleet may take to serve its clients at the start, on a busy machine.
SETTLE = 20.0


class CountingOrigin(ScriptedOrigin):
    """A :class:`ScriptedOrigin` that knows which of its streams are still
    open, and so which replicas follow it right now."""

    def __init__(self) -> None:
        super().__init__()
        self.open: set[int] = set()  # indexes into ``streams``

    async def _serve(self, requests: AsyncIterator[DELTA],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        index = len(self.streams)  # the parent appends this stream before its first await
        self.open.add(index)
        try:
            async for response in super()._serve(requests, context):
                yield response
        finally:
            self.open.discard(index)

    def followers(self) -> list[str]:
        """The node id of each open stream (sorted; "?" for one that has not
        sent a request yet): one per live replica, when all is well."""
        return sorted(next((r.node.id for r in self.streams[i].log if r.node.id), "?")
                      for i in self.open)


@dataclass
class Service:
    """Where a client's new connection goes: as a Kubernetes Service, to a
    random replica among those ready (``live``, targets ``host:port``).
    Seeded, so that a run can be repeated."""

    live: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(SEED))

    def pick(self) -> str:
        return self.rng.choice(self.live)


class FleetClient:
    """A delta CDS client behind a :class:`Service`, as Envoy: subscribes to
    ``names``, ACKs every response, and when its stream ends (a replica
    killed, a connection retired, a stream refused) waits ``backoff`` (give
    or take ``jitter`` of it, drawn from the Service's generator) and opens a
    new one, on a connection of its own to a replica the Service picks,
    declaring what it holds (``initial_resource_versions``). With ``first``,
    its first connection goes there (a storm aimed at one replica).

    It records what it holds, every resource sent again with the version it
    declared on that stream (``resent``: none is the relay's promise), how
    each stream ended, and when it first held a state it was told to
    :meth:`expect`.
    """

    def __init__(self, node_id: str, names: Sequence[str], service: Service,
                 backoff: float = BACKOFF, jitter: float = 0.0, first: str | None = None
                 ) -> None:
        self.node_id = node_id
        self.names = list(names)
        self.service = service
        self.backoff = backoff
        self.jitter = jitter
        self._first = first
        self.held: dict[str, str] = {}
        self.target: str | None = None  # the replica of the open stream
        self.streams = 0
        self.resent: list[str] = []
        self.endings: list[tuple[grpc.StatusCode, str]] = []  # each stream's status
        self.reached_at: float | None = None  # time.monotonic()
        self._awaited: dict[str, str] | None = None
        self._task = asyncio.create_task(self._run())

    def expect(self, state: dict[str, str]) -> None:
        """Note the first time from now that the client holds ``state``."""
        self._awaited = dict(state)
        self.reached_at = None
        self._check()

    def _check(self) -> None:
        if self.reached_at is None and self.held == self._awaited:
            self.reached_at = time.monotonic()

    async def _run(self) -> None:
        while True:
            target = self._first or self.service.pick()
            self._first = None
            channel = grpc.aio.insecure_channel(
                target, options=[("grpc.use_local_subchannel_pool", 1)])
            self.target = target
            try:
                await self._stream(channel)
                self.endings.append((grpc.StatusCode.OK, ""))
            except grpc.aio.AioRpcError as error:
                self.endings.append((error.code(), error.details() or ""))
            finally:
                self.target = None
                await channel.close()
            spread = self.jitter * (2 * self.service.rng.random() - 1)
            await asyncio.sleep(self.backoff * (1 + spread))

    async def _stream(self, channel: grpc.aio.Channel) -> None:
        call = channel.stream_stream(
            DELTA_ADS, request_serializer=DELTA.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
        declared = dict(self.held)
        self.streams += 1
        await call.write(DELTA(node=node(self.node_id), type_url=CLUSTER,
                               resource_names_subscribe=self.names,
                               initial_resource_versions=declared))
        while (response := await call.read()) is not grpc.aio.EOF:
            for resource in response.resources:
                if declared.get(resource.name) == resource.version:
                    self.resent.append(f"{resource.name} {resource.version} on stream "
                                       f"{self.streams} to {self.target}")
                self.held[resource.name] = resource.version
            for name in response.removed_resources:
                self.held.pop(name, None)
            self._check()
            await call.write(DELTA(type_url=CLUSTER, response_nonce=response.nonce))

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def close_all(clients: Sequence[FleetClient]) -> None:
    for client in clients:
        await client.close()


def replica_config(index: int, origin_port: int, redis_url: str, server: str = "",
                   sections: str = "") -> str:
    """Replica ``index`` of zone-a: its own node id, the zone's snapshot
    (the default key prefix, from the node's cluster and zone), the fleet's
    connection age. ``server`` adds keys to the server section (YAML flow),
    ``sections`` more top-level lines."""
    extra = f", {server}" if server else ""
    return f"""
node: {{id: relay-{index}, cluster: xds-relay, locality: {{zone: zone-a}}}}
server: {{address: "127.0.0.1:0", max_connection_age: {AGE}s,
          max_connection_age_grace: {GRACE}s{extra}}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{address: "127.0.0.1:{origin_port}", backoff: {{initial: 0.05s, max: 0.3s}}}}
persistence: {{redis: {{url: "{redis_url}"}}}}
{sections}
"""


def target_of(replica: RelayTree) -> str:
    return f"127.0.0.1:{replica.xds_port}"


async def load(replicas: Sequence[RelayTree]) -> list[int]:
    """How many client streams each replica lists in its admin ``/clients``."""
    return [len(answer["clients"])
            for answer in await asyncio.gather(*(r.clients() for r in replicas))]


def even(counts: Sequence[int]) -> bool:
    """No replica above 1.5x or below 0.5x the mean."""
    mean = sum(counts) / len(counts)
    return sum(counts) > 0 and all(0.5 * mean <= c <= 1.5 * mean for c in counts)


def test_even_means_within_half_the_mean_either_way() -> None:
    assert even([10, 10, 10])
    assert even([5, 10, 15])
    assert not even([16, 10, 4])
    assert not even([15, 15, 0])
    assert not even([0, 0, 0])


async def test_a_killed_replicas_clients_come_back_through_the_others_and_a_rejoin_evens_out(
        tmp_path: Path) -> None:
    origin = await CountingOrigin().start()
    origin.set(*(cluster(name) for name in NAMES))
    current = {name: version_of(cluster(name)) for name in NAMES}
    service = Service()
    try:
        with redis_server() as redis:
            configs = []
            for index in range(REPLICAS):
                configs.append(tmp_path / f"relay-{index}.yaml")
                configs[-1].write_text(replica_config(index, origin.port, redis.url))
            async with contextlib.AsyncExitStack() as running:
                replicas = [await running.enter_async_context(
                    relay_process(config, tmp_path / f"{config.stem}.log")) for config in configs]
                service.live = [target_of(r) for r in replicas]
                clients = [FleetClient(f"client-{i}", NAMES, service) for i in range(CLIENTS)]
                running.push_async_callback(close_all, clients)  # before the replicas stop
                for client in clients:
                    client.expect(current)
                await eventually(lambda: all(c.reached_at for c in clients), SETTLE)
                await eventually(lambda: origin.followers() == ["relay-0", "relay-1",
                                                                "relay-2"], SETTLE)

                # SIGKILL one replica (the Service stops sending it clients), then
                # change one resource: its clients hold everything once they
                # are served by another replica, which sends them only the change.
                victim = replicas[0]
                service.live.remove(target_of(victim))
                of_victim = [c for c in clients if c.target == target_of(victim)]
                assert of_victim, "the Service sent the victim no client"
                killed = time.monotonic()
                victim.process.kill()
                await victim.process.wait()
                changed = cluster("c", timeout_s=9)
                current["c"] = version_of(changed)
                for client in clients:
                    client.expect(current)
                origin.set(changed)
                await eventually(lambda: all(c.reached_at for c in clients), SETTLE)
                slowest = max(c.reached_at or 0.0 for c in of_victim) - killed
                assert slowest <= BACKOFF + 1.0, (
                    f"the victim's {len(of_victim)} clients took {slowest:.2f}s")
                print(f"{len(of_victim)} clients of the killed replica served again in "
                      f"{slowest:.2f}s")
                assert [c.resent for c in clients if c.resent] == []
                await eventually(lambda: origin.followers() == ["relay-1", "relay-2"], SETTLE)

                # Started again, it serves the zone's snapshot before the origin
                # answers; once ready, the Service sends it new connections, and
                # the fleet's retirements spread the clients within two
                # retirements of each (counted, not timed: a busy machine
                # stretches an age; SETTLE bounds the wait itself).
                rejoined = await running.enter_async_context(
                    relay_process(configs[0], tmp_path / "relay-0-rejoined.log"))
                assert ("restored 5 resources of 1 types from the snapshot at redis "
                        in text_of(rejoined.log))
                await eventually(lambda: len(origin.open) == REPLICAS, SETTLE)
                fleet = [rejoined, *replicas[1:]]
                service.live.append(target_of(rejoined))
                joined = time.monotonic()
                before = [len(c.endings) for c in clients]
                counts = await load(fleet)
                while not even(counts):
                    retired = min(len(c.endings) - b for c, b in zip(clients, before, strict=True))
                    assert retired <= 2, (
                        f"clients per replica {counts} once each was retired twice after the "
                        f"rejoin ({time.monotonic() - joined:.2f}s)")
                    assert time.monotonic() - joined < SETTLE, f"clients per replica {counts}"
                    await asyncio.sleep(0.05)
                    counts = await load(fleet)

                print(f"even ({counts}) {time.monotonic() - joined:.2f}s after the rejoin")
                assert origin.followers() == ["relay-0", "relay-1", "relay-2"]
                assert len(origin.streams) == REPLICAS + 1
                assert all(c.held == current for c in clients)
                assert [c.resent for c in clients if c.resent] == []
                # Every stream that ended was killed or retired: UNAVAILABLE.
                assert {code for c in clients for code, _ in c.endings} == {
                    grpc.StatusCode.UNAVAILABLE}
    finally:
        await origin.stop()
