"""The console of ``xds-relay run --workers 2``: the hub's page shows every
worker's clients, one list, and their history added up."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_workers import Follower, RelayTree, relay_tree, spread_clients, until
from tests.harness import ScriptedOrigin, cluster

pytestmark = pytest.mark.timeout(120)


async def data(tree: RelayTree, query: str = "") -> dict[str, Any]:
    status, body = await tree.get("/console/data" + query)
    assert status == 200, body
    return dict(json.loads(body))


async def test_the_hub_s_console_merges_the_workers_clients_and_history(tmp_path: Path
                                                                         ) -> None:
    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"), cluster("b"), version="v1")
    followers: list[Follower] = []
    try:
        async with relay_tree(origin.port, tmp_path) as tree:
            followers = await spread_clients(tree, {"a": "v1", "b": "v1"})
            shown = (await data(tree))["clients"]
            assert shown["total"] == len(followers)
            assert shown["workers"] == [{"worker": 1, "answered": True},
                                        {"worker": 2, "answered": True}]
            assert {row["worker"] for row in shown["rows"]} == {1, 2}
            assert sorted(row["node_id"] for row in shown["rows"]) == \
                sorted(f.node_id for f in followers)
            # one list: paged and sorted across the workers
            page = (await data(tree, "?sort=node&order=desc&limit=2&offset=1"))["clients"]
            assert [row["node_id"] for row in page["rows"]] == \
                sorted((f.node_id for f in followers), reverse=True)[1:3]

            async def every_client_charted() -> bool:
                points = (await data(tree))["history"]["points"]
                return bool(points) and points[-1][1] == len(followers)

            await until(every_client_charted)

            row = shown["rows"][0]
            query = urllib.parse.urlencode({"node": row["node_id"], "peer": row["peer"],
                                            "worker": row["worker"]})
            status, body = await tree.get(f"/console/client?{query}")
            [stream] = json.loads(body)["streams"]
            assert (status, stream["node_id"], stream["worker"]) == \
                (200, row["node_id"], row["worker"])
    finally:
        for follower in followers:
            await follower.close()
        await origin.stop()
