"""gRPC's own xDS clients in two node groups through one relay (issue 26, "How it is
checked"): gRPC's C-core client (grpcio's ``xds:`` resolver) and grpc-js-xds.

The origin builds its configuration per ``node.cluster``, as go-control-plane's
``SnapshotCache`` with a ``NodeHash`` by cluster does (:class:`PerNodeOrigin`): every
cluster gets the same names (``xds:///svc``: listener ``svc``, ``interop-route``,
``interop-cluster``) but its own endpoints, a backend of its own. The relay groups its
clients by cluster (``upstream.node_groups: {key: [cluster]}``), so each client reaches
its own cluster's backend, and the origin sees one stream per group (the relay's node,
with the group's cluster and the ``copy`` field), never one per client.

What was observed (grpcio 1.85.3, C-core; @grpc/grpc-js-xds 1.14.1)
-------------------------------------------------------------------
* Both clients send the bootstrap's ``node.cluster`` in the first request of their
  ADS stream, which is where the relay reads a stream's group; nothing else is needed.
* ``user_agent_name`` (copied to the group's node here): grpc-js-xds says
  ``gRPC Node Pure JS``; C-core, from grpcio, ``gRPC C-core <platform> Python``
  (``gRPC C-core linux Python`` here).

Without ``node`` or ``tests/interop/node/node_modules`` the grpc-js test skips, as
``test_node_xds_through_relay.py`` does; the C-core tests always run.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from prometheus_client import generate_latest

from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE
from tests.harness import Stack, running_stack
from tests.interop import grpc_xds
from tests.interop.grpc_xds import (
    DEFAULT_CLUSTER,
    DEFAULT_ROUTE,
    ClientProcess,
    XdsClientProcess,
    bootstrap_json,
    start_backend,
)
from tests.interop.per_node import PerNodeOrigin
from tests.interop.test_node_xds_through_relay import NodeXdsClient, node_or_skip

GROUPS = "node_groups: {key: [cluster], copy: [user_agent_name]}"
#: What each group's stream asks the origin for, once: xds:///svc's chain.
CHAIN = [(CLUSTER, DEFAULT_CLUSTER), (ENDPOINT, DEFAULT_CLUSTER), (LISTENER, "svc"),
         (ROUTE, DEFAULT_ROUTE)]


@dataclass
class Groups:
    """The origin, a relay grouping by cluster, and a backend per label."""

    origin: PerNodeOrigin
    stack: Stack
    ports: dict[str, int] = field(default_factory=dict)

    def bootstrap(self, node_id: str, group: str) -> str:
        """A bootstrap naming the relay, for a client of ``group``'s cluster."""
        return bootstrap_json(f"127.0.0.1:{self.stack.relay.xds_port}", node_id,
                              node_cluster=group)

    def core(self, node_id: str, group: str) -> XdsClientProcess:
        """A C-core client of ``xds:///svc`` in ``group``."""
        return XdsClientProcess("xds:///svc", self.bootstrap(node_id, group))

    def asked(self, group: str) -> list[tuple[str, str]]:
        """Every (type URL, name) the origin was asked for on ``group``'s streams."""
        return sorted((r.type_url, n) for s in self.origin.streams_of(group) for r in s.log
                      for n in r.resource_names_subscribe)

    def assert_one_stream_per_group(self, *groups: str) -> None:
        """The origin saw one stream per group, asking for ``svc``'s chain once, as the
        relay's node (its id) with the group's cluster; no other stream (the relay opens
        none as its own node when its clients are grouped)."""
        assert self.origin.asked() == sorted(groups)
        assert len(self.origin.streams) == len(groups)
        for group in groups:
            assert self.asked(group) == CHAIN, group
            [stream] = self.origin.streams_of(group)
            assert (stream.log[0].node.id, stream.log[0].node.cluster) == ("relay-test", group)

    def assert_no_nacks(self, *clients: ClientProcess) -> None:
        scraped = generate_latest(self.stack.relay.registry).decode()
        assert "xds_relay_downstream_acks_total{" in scraped
        assert "xds_relay_downstream_nacks_total" not in scraped, \
            "".join(client.stderr[-2000:] for client in clients)


@contextlib.asynccontextmanager
async def two_groups(*groups: str) -> AsyncIterator[Groups]:
    """A backend per group (answering with the group's name) and "moved"; the origin
    sends each group's cluster ``svc`` on its own backend; the relay groups by cluster."""
    origin = PerNodeOrigin()
    async with contextlib.AsyncExitStack() as exits:
        ports = {}
        for label in (*groups, "moved"):
            server, ports[label] = await start_backend(label)
            exits.push_async_callback(server.stop, 0)
        for group in groups:
            origin.set_for(group, *grpc_xds.xds_messages("svc", ports[group]))
        stack = await exits.enter_async_context(running_stack(origin, upstream=GROUPS))
        yield Groups(origin, stack, ports)


async def reaches(client: ClientProcess, label: str) -> None:
    result = await client.call()
    assert (result.ok, result.backend) == (True, label), f"{result}\n{client.stderr[-3000:]}"


async def each_reaches_its_own_backend_and_follows_its_groups_change(
        groups: Groups, first: ClientProcess, second: ClientProcess,
        first_group: str, second_group: str) -> None:
    await reaches(first, first_group)
    await reaches(second, second_group)
    groups.assert_one_stream_per_group(first_group, second_group)
    # the second group's endpoints move: its client follows, the first's does not
    groups.origin.set_for(second_group,
                          grpc_xds.cluster_load_assignment(DEFAULT_CLUSTER, groups.ports["moved"]))
    assert (await second.wait_for_backend("moved", timeout=10)).ok
    await reaches(first, first_group)
    groups.assert_one_stream_per_group(first_group, second_group)
    groups.assert_no_nacks(first, second)


async def test_grpc_core_clients_in_two_groups_each_reach_their_own_backend() -> None:
    async with two_groups("checkout", "payments") as groups, \
            groups.core("c-1", "checkout") as checkout, \
            groups.core("p-1", "payments") as payments:
        await each_reaches_its_own_backend_and_follows_its_groups_change(
            groups, checkout, payments, "checkout", "payments")
        # a second client of a group is served from the group's cache: no new
        # origin stream, nothing more asked
        asked = len(groups.origin.subscription_requests())
        async with groups.core("c-2", "checkout") as another:
            await reaches(another, "checkout")
        groups.assert_one_stream_per_group("checkout", "payments")
        assert len(groups.origin.subscription_requests()) == asked
        [sent] = [s.log[0].node for s in groups.origin.streams_of("checkout")]
        assert sent.user_agent_name.startswith("gRPC C-core "), sent


async def test_grpc_core_and_grpc_js_in_two_groups_each_reach_their_own_backend() -> None:
    node = node_or_skip()
    async with two_groups("grpc-core", "grpc-js") as groups:
        async with groups.core("core-1", "grpc-core") as core, \
                NodeXdsClient(node, "xds:///svc", groups.bootstrap("js-1", "grpc-js")) as js:
            await each_reaches_its_own_backend_and_follows_its_groups_change(
                groups, core, js, "grpc-core", "grpc-js")
        # each group's stream carries its first client's user agent (copy)
        [core_node] = [s.log[0].node for s in groups.origin.streams_of("grpc-core")]
        [js_node] = [s.log[0].node for s in groups.origin.streams_of("grpc-js")]
        assert core_node.user_agent_name.startswith("gRPC C-core "), core_node
        assert js_node.user_agent_name == "gRPC Node Pure JS", js_node
