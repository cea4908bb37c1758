"""End to end: at most ``upstream.linger_names`` subscriptions linger.

A client leaving lets its names go; those within the bound stay subscribed on
the origin for ``upstream.linger`` (a client that comes back costs the origin
nothing for them), the oldest past it are unsubscribed at once.
"""

from __future__ import annotations

from relay.xds_types import CLUSTER
from tests.harness import ScriptedOrigin, cluster, eventually, names_of, node, running_stack

NAMES = ["a", "b", "c", "d", "e"]


async def test_past_linger_names_the_origin_is_told_at_once_and_the_rest_return_free() -> None:
    origin = ScriptedOrigin()
    origin.set(*(cluster(name) for name in NAMES))
    async with running_stack(origin, linger="30s", upstream="linger_names: 2") as stack:
        client = stack.client()
        await client.send(node=node("big"), type_url=CLUSTER, resource_names_subscribe=NAMES)
        first = await client.recv()
        assert sorted(names_of(first)) == NAMES
        await client.ack(first)
        client.close()  # it leaves: its five names are let go, three past the bound

        def unsubscribed() -> set[str]:
            return {name for request in origin.all_requests()
                    for name in request.resource_names_unsubscribe}

        await eventually(lambda: len(unsubscribed()) == 3)
        cut = unsubscribed()
        asked = len(origin.subscription_requests())
        # It comes back well within the 30 s linger: only the three cut are asked again.
        again = stack.client()
        await again.send(node=node("big"), type_url=CLUSTER, resource_names_subscribe=NAMES,
                         initial_resource_versions={r.name: r.version for r in first.resources})
        await eventually(lambda: len(origin.subscription_requests()) > asked)
        [request] = origin.subscription_requests()[asked:]
        assert set(request.resource_names_subscribe) == cut
        assert list(request.resource_names_unsubscribe) == []
        await again.expect_nothing()  # it holds them all, as they are
        assert len(unsubscribed()) == 3
