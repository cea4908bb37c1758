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

import gc
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
CONSTANT = 6  # at 10 N, for work that should not grow with N at all

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

    def client_holding(self, names: list[str]) -> DownstreamStream:
        """A delta client that subscribed to ``names`` (cached) and ACKed them all."""
        self.warm(names)
        client = self.client()
        client.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names))
        delta_responses(client)
        return client


def responses(stream: DownstreamStream) -> list[bytes]:
    return list(stream.ready_responses())


def delta_responses(stream: DownstreamStream) -> list[discovery_pb2.DeltaDiscoveryResponse]:
    """Every response due, each ACKed (a big subscription comes in several)."""
    out = []
    while due := responses(stream):
        for raw in due:
            out.append(discovery_pb2.DeltaDiscoveryResponse.FromString(raw))
            stream.handle_request(Delta(type_url=out[-1].type_url, response_nonce=out[-1].nonce))
    return out


def cpu_time(setup: Callable[[int], Callable[[], object]], n: int, tries: int = 2) -> float:
    """The least CPU time ``setup(n)``'s operation took, over ``tries`` fresh
    setups (or the time it says it took, for one that times its own parts)."""
    best = float("inf")
    for _ in range(tries):
        operation = setup(n)
        gc.collect()
        gc.disable()  # the collector's pauses depend on the whole heap, not the operation
        try:
            start = time.process_time()
            took = operation()
            best = min(best, took if isinstance(took, float) else time.process_time() - start)
        finally:
            gc.enable()
    return best


def growth(setup: Callable[[int], Callable[[], object]]) -> float:
    """How much more work the operation is at 10 N names than at N."""
    ratio = cpu_time(setup, 10 * N) / max(cpu_time(setup, N), 1e-6)
    print(f"growth at 10 N: {ratio:.1f}x")
    return ratio


def names(n: int) -> list[str]:
    return [f"cla-{i}" for i in range(n)]


def test_a_client_subscribing_to_n_names_costs_linear_work() -> None:
    def setup(n: int) -> Callable[[], object]:
        relay = Relay()
        relay.warm(names(n))
        client = relay.client()

        def subscribe() -> None:
            client.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names(n)))
            assert sum(len(r.resources) for r in delta_responses(client)) == n
        return subscribe

    assert growth(setup) < LINEAR


def test_a_client_holding_n_names_leaves_in_linear_work() -> None:
    def setup(n: int) -> Callable[[], object]:
        relay = Relay()
        others = [f"other-{i}" for i in range(n)]
        client = relay.client_holding(names(n))
        relay.client_holding(others)  # staying

        def leave() -> None:
            relay.core.serving.leave(client)
            # The origin is told, and the cache forgets what nobody wants.
            assert sorted(relay.core.cache.names(ENDPOINT)) == sorted(others)
        return leave

    assert growth(setup) < LINEAR


def test_unsubscribing_n_names_in_one_request_costs_linear_work() -> None:
    def setup(n: int) -> Callable[[], object]:
        relay = Relay()
        client = relay.client_holding(names(n))

        def unsubscribe() -> None:
            client.handle_request(Delta(type_url=ENDPOINT, resource_names_unsubscribe=names(n)))
            assert responses(client) == []
        return unsubscribe

    assert growth(setup) < LINEAR


def test_removing_n_names_a_client_holds_costs_linear_work() -> None:
    def setup(n: int) -> Callable[[], object]:
        relay = Relay()
        client = relay.client_holding(names(n))

        def origin_removes() -> None:
            relay.core.cache.apply(ENDPOINT, Update(removed=names(n)))
            assert sum(len(r.removed_resources) for r in delta_responses(client)) == n
        return origin_removes

    assert growth(setup) < LINEAR


def test_one_more_name_costs_the_same_however_many_a_client_holds() -> None:
    def setup(n: int) -> Callable[[], object]:
        relay = Relay()
        relay.warm([f"extra-{i}" for i in range(200)])
        client = relay.client_holding(names(n))
        nonce = ""  # every response so far is ACKed

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
    answers = {"delta": discovery_pb2.DeltaDiscoveryResponse,
               "sotw": discovery_pb2.DiscoveryResponse}
    for protocol in ("delta", "sotw"):
        def setup(n: int, protocol: str = protocol) -> Callable[[], object]:
            relay = Relay()
            relay.warm(names(n))
            client = relay.client(protocol)

            def ack(nonce: str) -> Delta | Sotw:
                # A SotW ACK names the whole subscription: reading it is linear
                # (and not timed here); the update it then gets must not be.
                if protocol == "delta":
                    return Delta(type_url=ENDPOINT, response_nonce=nonce)
                return Sotw(type_url=ENDPOINT, response_nonce=nonce, resource_names=names(n))

            client.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names(n))
                                  if protocol == "delta" else ack(""))
            while due := responses(client):  # 10 N names come in several responses
                client.handle_request(ack(answers[protocol].FromString(due[-1]).nonce))

            def updates() -> float:
                """The relay's work for each update, not the client's ACK."""
                took = 0.0
                for version in range(2, 52):
                    start = time.process_time()
                    relay.warm(["cla-0"], str(version))
                    [response] = responses(client)
                    took += time.process_time() - start
                    client.handle_request(ack(answers[protocol].FromString(response).nonce))
                return took
            return updates

        assert growth(setup) < CONSTANT, protocol
