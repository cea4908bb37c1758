"""The issue's scenario with real processes: a relay synced with its origin,
the origin gone, the relay SIGKILLed, then it and a second replica started
against the same Redis: both serve the zone's config from the snapshot, and
when the origin returns with one change and one deletion, their clients get
exactly those two."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from relay.persistence.stores import RedisStore
from relay.xds_types import CLUSTER
from tests.e2e.test_persistence import received, subscribed
from tests.e2e.test_workers import REPO, RelayTree, interrupted, until
from tests.harness import ScriptedOrigin, cluster, version_of
from tests.redis_server import redis_server

STARTED = re.compile(r"serving xDS on 127\.0\.0\.1:(\d+), admin on 127\.0\.0\.1:(\d+)")


def text_of(log: Path) -> str:
    return log.read_text()  # small, local: not worth a thread


@contextlib.asynccontextmanager
async def relay_process(config: Path, log: Path) -> AsyncIterator[RelayTree]:
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "relay", "run", "--config", str(config), cwd=REPO,
            stderr=stderr)
    relay = RelayTree(process, log)
    try:
        async def started() -> bool:
            match = STARTED.search(text_of(log))
            assert process.returncode is None, text_of(log)
            if match is not None:
                relay.xds_port, relay.admin_port = int(match[1]), int(match[2])
            return match is not None

        await until(started)
        yield relay
    finally:
        await interrupted(process)
        print(log.name, text_of(log))  # shown when the test fails


async def test_sigkilled_relay_and_a_new_replica_serve_the_snapshot_then_only_the_changes(
        tmp_path: Path) -> None:
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"), cluster("b"), cluster("c"))
    port = origin.port
    with redis_server() as redis:
        config = tmp_path / "relay.yaml"
        config.write_text(f"""
node: {{id: relay-zone-a, cluster: xds-relay, locality: {{zone: zone-a}}}}
server: {{address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{address: "127.0.0.1:{port}", backoff: {{initial: 0.05s, max: 0.3s}}}}
persistence: {{redis: {{url: "{redis.url}"}}}}
""")
        store = RedisStore(redis.url, "xds-relay:xds-relay:zone-a", 1.0)
        first = {name: version_of(cluster(name)) for name in "abc"}

        async def saved() -> bool:
            loaded = await store.load()
            return loaded is not None and sorted(loaded.entries.get(CLUSTER, {})) == ["a", "b",
                                                                                      "c"]

        async with relay_process(config, tmp_path / "first.log") as relay:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}") as channel:
                client = await subscribed(channel, "before")
                assert await received(client) == first
                await until(saved)
                client.close()
            await origin.stop()
            relay.process.kill()  # SIGKILL: nothing is flushed on the way out
            await relay.process.wait()

        async with relay_process(config, tmp_path / "restarted.log") as restarted, \
                relay_process(config, tmp_path / "replica.log") as replica:
            clients = []
            channels = []
            for process in (restarted, replica):
                status, answer = await process.get("/ready")
                body = answer.decode()
                assert status == 200, body
                assert body.startswith("ready: serving a snapshot (3 resources of 1 types "
                                       "from redis 127.0.0.1:"), body
                channel = grpc.aio.insecure_channel(f"127.0.0.1:{process.xds_port}")
                channels.append(channel)
                client = await subscribed(channel, f"after-{process.log.stem}")
                assert await received(client) == first
                clients.append(client)

            revived = ScriptedOrigin()
            revived.set(cluster("a"), cluster("b", timeout_s=9))
            await revived.start(port)
            try:
                for client in clients:
                    changes: dict[str, str] = {}
                    while len(changes) < 2:
                        changes.update(await received(client))
                    assert changes == {"b": version_of(cluster("b", timeout_s=9)),
                                       "c": "removed"}
                for client in clients:
                    await client.expect_nothing()
                    client.close()

                async def converged() -> bool:
                    loaded = await store.load()
                    return loaded is not None and sorted(loaded.entries[CLUSTER]) == ["a", "b"]

                await until(converged)
            finally:
                for channel in channels:
                    await channel.close()
                await revived.stop()
        await store.close()
