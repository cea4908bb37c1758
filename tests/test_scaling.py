"""Work grows with what a request touches, never with the square of it.

Each test does the same operation at N and at 10 N names and compares the
CPU time the two took (the least of a few tries, so that a busy machine
inflates neither much). Linear work is about 10 times more at 10 N;
quadratic work, 100 times. The bound leaves room for noise and for
sorting. Where the work should not depend on N at all (one name added to a
big subscription, one update to a client holding N names), the bound is
tighter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import Update
from relay.core import Core
from relay.resource import CachedResource
from relay.server.streams import DownstreamStream
from relay.upstream.state import UpstreamState
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack

N = 500
LINEAR = 35  # at 10 N: linear work ~10x, quadratic ~100x
CONSTANT = 5  # at 10 N, for work that should not grow with N at all

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest


@dataclass
class Relay:
    """A relay's layers without gRPC; the upstream acts at once on interest changes."""

    core: Core = field(default_factory=Core.create)
    upstream: UpstreamState = field(init=False)
    origin_requests: list[Delta] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.upstream = UpstreamState(base_pb2.Node(id="relay"), self.core.cache)
        self.upstream.on_connect(self.core.index, 0.0)
        self.core.index.link(self)

    def interest_changed(self, type_url: str, names: Iterable[str]) -> None:
        self.origin_requests += self.upstream.on_interest_changed(
            type_url, self.core.index, 0.0, set(names))

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        pass

    def warm(self, names: list[str], version: str = "1") -> None:
        self.core.cache.apply(ENDPOINT, Update([
            CachedResource.from_message(ENDPOINT, pack(endpoints(n, 80)), n, version)
            for n in names]))

    def client(self, protocol: str = "delta") -> DownstreamStream:
        return DownstreamStream(self.core.serving, protocol, "peer")  # type: ignore[arg-type]


def responses(stream: DownstreamStream) -> list[bytes]:
    return list(stream.ready_responses())


def cpu_time(setup: Callable[[int], Callable[[], object]], n: int, tries: int = 2) -> float:
    """The least CPU time ``setup(n)``'s operation took, over ``tries`` fresh
    setups (or the time it says it took, for one that times its own parts)."""
    best = float("inf")
    for _ in range(tries):
        operation = setup(n)
        start = time.process_time()
        took = operation()
        best = min(best, took if isinstance(took, float) else time.process_time() - start)
    return best


def growth(setup: Callable[[int], Callable[[], object]]) -> float:
    """How much more work the operation is at 10 N names than at N."""
    return cpu_time(setup, 10 * N) / max(cpu_time(setup, N), 1e-6)


def names(n: int) -> list[str]:
    return [f"cla-{i}" for i in range(n)]


def test_a_client_subscribing_to_n_names_costs_linear_work() -> None:
    def setup(n: int) -> Callable[[], object]:
        relay = Relay()
        relay.warm(names(n))
        client = relay.client()

        def subscribe() -> None:
            client.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names(n)))
            [response] = responses(client)
            assert len(discovery_pb2.DeltaDiscoveryResponse.FromString(response).resources) == n
        return subscribe

    assert growth(setup) < LINEAR


def test_a_client_holding_n_names_leaves_in_linear_work() -> None:
    def setup(n: int) -> Callable[[], object]:
        relay = Relay()
        others = [f"other-{i}" for i in range(n)]
        relay.warm([*names(n), *others])
        client, staying = relay.client(), relay.client()
        client.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names(n)))
        staying.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=others))
        responses(client)

        def leave() -> None:
            relay.core.serving.leave(client)
            # The origin is told, and the cache forgets what nobody wants.
            assert sorted(relay.core.cache.names(ENDPOINT)) == sorted(others)
        return leave

    assert growth(setup) < LINEAR


def test_unsubscribing_n_names_in_one_request_costs_linear_work() -> None:
    def setup(n: int) -> Callable[[], object]:
        relay = Relay()
        relay.warm(names(n))
        client = relay.client()
        client.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names(n)))
        [response] = responses(client)
        nonce = discovery_pb2.DeltaDiscoveryResponse.FromString(response).nonce

        def unsubscribe() -> None:
            client.handle_request(Delta(type_url=ENDPOINT, response_nonce=nonce,
                                        resource_names_unsubscribe=names(n)))
            assert responses(client) == []
        return unsubscribe

    assert growth(setup) < LINEAR


def test_removing_n_names_a_client_holds_costs_linear_work() -> None:
    def setup(n: int) -> Callable[[], object]:
        relay = Relay()
        relay.warm(names(n))
        client = relay.client()
        client.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names(n)))
        [response] = responses(client)
        client.handle_request(Delta(
            type_url=ENDPOINT,
            response_nonce=discovery_pb2.DeltaDiscoveryResponse.FromString(response).nonce))

        def origin_removes() -> None:
            relay.core.cache.apply(ENDPOINT, Update(removed=names(n)))
            [response] = responses(client)
            removed = discovery_pb2.DeltaDiscoveryResponse.FromString(response).removed_resources
            assert len(removed) == n
        return origin_removes

    assert growth(setup) < LINEAR


def test_one_more_name_costs_the_same_however_many_a_client_holds() -> None:
    def setup(n: int) -> Callable[[], object]:
        relay = Relay()
        relay.warm([*names(n), *(f"extra-{i}" for i in range(200))])
        client = relay.client()
        client.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names(n)))
        [response] = responses(client)
        nonce = discovery_pb2.DeltaDiscoveryResponse.FromString(response).nonce

        def add_one_at_a_time() -> None:
            nonlocal nonce
            for i in range(200):
                client.handle_request(Delta(type_url=ENDPOINT, response_nonce=nonce,
                                            resource_names_subscribe=[f"extra-{i}"]))
                [response] = responses(client)
                nonce = discovery_pb2.DeltaDiscoveryResponse.FromString(response).nonce
        return add_one_at_a_time

    assert growth(setup) < CONSTANT


def test_one_update_costs_the_same_however_many_names_a_client_holds() -> None:
    for protocol in ("delta", "sotw"):
        def setup(n: int, protocol: str = protocol) -> Callable[[], object]:
            relay = Relay()
            relay.warm(names(n))
            client = relay.client(protocol)
            if protocol == "delta":
                client.handle_request(Delta(type_url=ENDPOINT,
                                            resource_names_subscribe=names(n)))
            else:
                client.handle_request(Sotw(type_url=ENDPOINT, resource_names=names(n)))
            answers = {"delta": discovery_pb2.DeltaDiscoveryResponse,
                       "sotw": discovery_pb2.DiscoveryResponse}
            [response] = responses(client)
            nonces = [answers[protocol].FromString(response).nonce]
            # A SotW ACK names the whole subscription: reading it is linear
            # (and not timed here); the update it then gets must not be.
            acks = [Delta(type_url=ENDPOINT, response_nonce=str(i)) if protocol == "delta"
                    else Sotw(type_url=ENDPOINT, response_nonce=str(i), resource_names=names(n))
                    for i in range(1, 52)]

            def updates() -> float:
                """The relay's work for each update, after the client's ACK."""
                took = 0.0
                for version in range(2, 52):
                    client.handle_request(acks[int(nonces[-1]) - 1])
                    start = time.process_time()
                    relay.warm(["cla-0"], str(version))
                    [response] = responses(client)
                    took += time.process_time() - start
                    nonces.append(answers[protocol].FromString(response).nonce)
                return took
            return updates

        assert growth(setup) < CONSTANT, protocol
