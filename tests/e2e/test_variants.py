"""End to end: resource variants selected by dynamic parameters (issue 3's scenario)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import endpoints
from tests.harness import ScriptedOrigin, Stack, XdsClient, node, running_stack
from tests.variants import CANARY, ENV_VARIANTS, PORTS, PROD, label_of


def cluster_variant(label: str, generation: int = 1) -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(name="svc", alt_stat_name=f"{label}-{generation}")


def publish(origin: ScriptedOrigin) -> None:
    for label, constraints in ENV_VARIANTS.items():
        origin.set_variant(cluster_variant(label), constraints, f"{label}-1")
        origin.set_variant(endpoints("svc", PORTS[label]), constraints, f"{label}-1")


def response_label(response: Any) -> str | None:
    """Which variant a response carries ("canary-1", "prod", ...), None if empty."""
    return label_of(response.resources[0]) if response.resources else None


@dataclass
class Client:
    stream: XdsClient
    params: dict[str, str]
    locator: bool
    last: dict[str, Any] = field(default_factory=dict)

    @property
    def delta(self) -> bool:
        return self.stream.delta

    def node(self, params: dict[str, str] | None = None) -> Any:
        n = node(f"client-{id(self)}")
        if not self.locator:
            for type_url in (CLUSTER, ENDPOINT):
                n.dynamic_parameters[type_url].params.update(
                    self.params if params is None else params)
        return n

    async def subscribe(self) -> None:
        for type_url in (CLUSTER, ENDPOINT):
            locator = {"name": "svc", "dynamic_parameters": self.params}
            if self.delta and self.locator:
                await self.stream.send(node=self.node(), type_url=type_url,
                                       resource_locators_subscribe=[locator])
            elif self.delta:
                await self.stream.send(node=self.node(), type_url=type_url,
                                       resource_names_subscribe=["svc"])
            elif self.locator:
                await self.stream.send(node=self.node(), type_url=type_url,
                                       resource_locators=[locator])
            else:
                await self.stream.send(node=self.node(), type_url=type_url,
                                       resource_names=["svc"])

    async def receive(self) -> Any:
        response = await self.stream.recv()
        self.last[response.type_url] = response
        ack: dict[str, Any] = {}
        if not self.delta:
            if self.locator:
                ack["resource_locators"] = [{"name": "svc", "dynamic_parameters": self.params}]
            else:
                ack["resource_names"] = ["svc"]
        await self.stream.ack(response, **ack)
        return response


async def quiet(clients: list[Client]) -> None:
    """Nobody receives anything for a while (checked for all at once)."""
    await asyncio.gather(*(c.stream.expect_nothing() for c in clients))


async def connect(stack: Stack, count: int, params: dict[str, str]) -> list[Client]:
    clients = []
    for i in range(count):
        client = Client(stack.client(delta=i % 2 == 0), params, locator=i % 4 < 2)
        await client.subscribe()
        clients.append(client)
    return clients


async def test_variants_reach_exactly_their_groups_through_changes_moves_and_removals() -> None:
    origin = ScriptedOrigin()
    publish(origin)
    async with running_stack(origin) as stack:
        groups: dict[str, list[Client]] = {}
        expected = {"canary": "canary", "prod": "prod", "eu": "default", "none": "default"}
        for group, count, params in (("canary", 10, {"env": "canary"}),
                                     ("prod", 10, {"env": "prod"}),
                                     ("eu", 10, {"region": "eu"}),
                                     ("none", 4, {}),
                                     ("dev", 4, {"env": "dev"})):
            groups[group] = await connect(stack, count, params)
            for client in groups[group]:
                if group == "dev":
                    # Matches no variant: delta says it does not exist; SotW lists
                    # no cluster and sends no endpoints.
                    first = await client.receive()
                    if client.delta:
                        second = await client.receive()
                        assert {r.type_url for r in (first, second)} == {CLUSTER, ENDPOINT}
                        for r in (first, second):
                            assert list(r.removed_resources) == ["svc"] and not r.resources
                    else:
                        assert first.type_url == CLUSTER and not first.resources
                    continue
                labels = {}
                for _ in range(2):
                    response = await client.receive()
                    labels[response.type_url] = response_label(response)
                want = expected[group]
                assert labels == {CLUSTER: f"{want}-1", ENDPOINT: want}, (group, client)
        everyone = [c for clients in groups.values() for c in clients]
        await quiet(everyone)

        # One upstream stream; one subscription per locator the cache could not
        # answer. "none" (no parameters) was served from cache by the default
        # variant that "eu" brought.
        assert len(origin.streams) == 1
        subscribed = sorted((r.type_url, loc.name, tuple(sorted(loc.dynamic_parameters.items())))
                            for r in origin.subscription_requests()
                            for loc in r.resource_locators_subscribe)
        plain = [n for r in origin.subscription_requests() for n in r.resource_names_subscribe]
        want_locators = [(t, "svc", p) for t in (CLUSTER, ENDPOINT)
                         for p in ((("env", "canary"),), (("env", "dev"),), (("env", "prod"),),
                                   (("region", "eu"),))]
        assert subscribed == sorted(want_locators)
        assert plain == []

        # The origin changes the canary cluster: only the canary group hears of it.
        origin.set_variant(cluster_variant("canary", 2), CANARY, "canary-2")
        for client in groups["canary"]:
            update = await client.receive()
            assert update.type_url == CLUSTER and response_label(update) == "canary-2"
        await quiet(everyone)

        # A canary client with node parameters moves to prod without resubscribing.
        mover = next(c for c in groups["canary"] if c.delta and not c.locator)
        mover.params = {"env": "prod"}
        await mover.stream.send(type_url=CLUSTER, node=mover.node())
        moved = {}
        for _ in range(2):
            response = await mover.receive()
            assert not response.removed_resources and not response.removed_resource_names
            moved[response.type_url] = response_label(response)
        assert moved == {CLUSTER: "prod-1", ENDPOINT: "prod"}
        groups["canary"].remove(mover)
        groups["prod"].append(mover)

        # The origin removes the prod cluster variant: only prod holders see it go.
        origin.remove_variant(CLUSTER, "svc", PROD)
        for client in groups["prod"]:
            gone = await client.receive()
            assert gone.type_url == CLUSTER
            if client.delta:
                assert not gone.resources and not gone.removed_resources
                [removed] = gone.removed_resource_names
                assert removed.name == "svc" and removed.dynamic_parameter_constraints == PROD
            else:
                assert not gone.resources  # full-state CDS: absence means deletion
        await quiet(everyone)


async def test_a_resource_error_for_one_variant_reaches_only_that_variants_clients() -> None:
    origin = ScriptedOrigin()
    publish(origin)
    async with running_stack(origin) as stack:
        canary = Client(stack.client(delta=True), {"env": "canary"}, locator=False)
        prod = Client(stack.client(delta=False), {"env": "prod"}, locator=False)
        for client in (canary, prod):
            await client.stream.send(node=client.node(), type_url=CLUSTER,
                                     **({"resource_names_subscribe": ["svc"]} if client.delta
                                        else {"resource_names": ["svc"]}))
            assert response_label(await client.receive()) in ("canary-1", "prod-1")

        failing = discovery_pb2.DeltaDiscoveryResponse(type_url=CLUSTER)
        error = failing.resource_errors.add()
        error.resource_name.name = "svc"
        error.resource_name.dynamic_parameter_constraints.CopyFrom(CANARY)
        error.error_detail.code = 5
        error.error_detail.message = "canary build failed"
        origin.send_raw(failing)

        got = await canary.stream.recv()
        assert list(got.resources) == [] and list(got.resource_errors) == [error]
        await prod.stream.expect_nothing()
