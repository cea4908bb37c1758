"""Fuzzing a running relay: Hypothesis-generated clients (both protocols, ADS
and the per-type services, streams and fetches, valid requests and not)
against one relay, while well-behaved watchers follow the origin.

For every example: the stream (or fetch) ends as :mod:`tests.fuzz.rules`
says (OK only for valid requests the client half-closed; INVALID_ARGUMENT
for what the relay cannot decode or what breaks the protocol;
RESOURCE_EXHAUSTED or INVALID_ARGUMENT naming ``limits.*`` for a breach of a
limit; never an empty message), and every watcher (delta and SotW, ADS and
per-type) receives the origin update pushed meanwhile, exactly once. After
each test: the relay serves a new client, and what it keeps per client
(streams, the interest index, live stream objects, the subscription to the
origin) is back to the watchers' alone.

Bounded and reproducible: a fixed number of examples, derandomized, no
example database; ``benchmarks/fuzz.py`` runs the same with many more.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from relay.app import Relay, build_relay
from relay.config import parse_config
from relay.server.streams import DownstreamStream
from relay.xds_types import ENDPOINT
from tests.fuzz.driver import FuzzRig, LoopThread, fuzz_origin
from tests.fuzz.rules import LIMIT_KINDS, TEST_LIMITS, Limits, limit_keys
from tests.fuzz.strategies import FETCH_METHODS, WATCHED, Case, Mix, cases, methods
from tests.harness import ScriptedOrigin, eventually, names_of, relay_config

# Examples per test: together about 15 s on two cores.
EXAMPLES = {"valid": 60, "invalid": 90, "undecodable": 40, "any": 70, "fetch": 30}
# How many ended streams may stay in memory (held by gRPC's recent calls).
LINGERING_STREAMS = 32


@dataclass
class Running:
    loop: LoopThread
    origin: ScriptedOrigin
    relay: Relay
    rig: FuzzRig
    limits: Limits
    baseline: dict[str, Any]

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        return self.loop.run(coro, timeout)


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    """One origin and one relay (with small limits, where the config has
    them) for the module, and the watchers."""
    loop = LoopThread()
    limits, section = TEST_LIMITS.configured()

    async def start() -> tuple[ScriptedOrigin, Relay, FuzzRig]:
        origin = await fuzz_origin().start()
        # Fetches keep what they asked subscribed for rest.lease: a short one,
        # so that it has lapsed when the settle check looks.
        relay = build_relay(parse_config(relay_config(origin.port, limits=section,
                                                      rest="lease: 1s")))
        await relay.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{relay.xds_port}")
        rig = FuzzRig(origin, channel, limits)
        await rig.start_watchers()
        return origin, relay, rig

    origin, relay, rig = loop.run(start())
    state = Running(loop, origin, relay, rig, limits, {})

    async def baseline() -> dict[str, Any]:
        return structure(state)

    state.baseline = state.run(baseline())

    yield state

    async def stop() -> None:
        rig.close()
        await rig.channel.close()
        await relay.stop(0)
        await origin.stop()

    loop.run(stop())
    loop.close()


def structure(running: Running) -> dict[str, Any]:
    """What the relay keeps per client and per subscription (call it in the
    relay's event loop)."""
    relay, index = running.relay, running.relay.index
    return {
        "streams": sorted(s.node_id for s in relay.serving.streams),
        "index subscribers": len(index._per_subscriber),
        "wanted names": {t: sorted(index.wanted_locators(t)) for t in index.wanted_types()},
        "wildcard types": sorted(t for t in index.wanted_types() if index.wants_wildcard(t)),
        "upstream subscription": {t: sorted(names) for t, names in
                                  running.origin.stream.subscribed.items() if names},
        "cached names": {t: len(entry.records) for t, entry in relay.cache._types.items()
                         if entry.records},
    }


def fuzz(running: Running, mix: Mix, examples: int, fetch_only: bool = False) -> None:
    """Run ``examples`` cases of ``mix``; fail on the first that breaks a rule."""
    method = st.sampled_from(FETCH_METHODS) if fetch_only else methods()

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck),
              print_blob=False)
    @given(case=cases(running.limits, mix, method))
    def example(case: Case) -> None:
        outcome, broken = running.run(running.rig.example(case))
        assert not broken, (
            f"{case!r}\nended {outcome.code.name if outcome.code else 'never'} "
            f"{outcome.details[:300]!r} after {outcome.sent} requests\n"
            f"replay: {case.to_json()[:2000]}\n  " + "\n  ".join(broken))

    example()
    assert_settled(running)


def assert_settled(running: Running) -> None:
    """The relay serves a new client, and keeps nothing of the fuzz clients."""

    async def new_client() -> list[str]:
        call = running.rig.channel.stream_stream(
            "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
            request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)()
        try:
            await call.write(discovery_pb2.DeltaDiscoveryRequest(
                node={"id": "after-fuzz"}, type_url=ENDPOINT,
                resource_names_subscribe=[WATCHED]))
            response = await asyncio.wait_for(call.read(), 5)
            return [f"{n}@{r.version}" for n, r in zip(names_of(response), response.resources,
                                                      strict=True)]
        finally:
            call.cancel()

    assert running.run(new_client()) == [f"{WATCHED}@w{running.rig.version}"]

    async def settled() -> dict[str, Any]:
        """The structure, once back to the baseline (or after 5 s)."""
        with contextlib.suppress(AssertionError):
            await eventually(lambda: structure(running) == running.baseline, 5)
        return structure(running)

    assert running.run(settled()) == running.baseline
    # Streams that ended are gone, but for the few whose gRPC call objects
    # gRPC itself still holds (a handful, however many streams ended).
    # Collected first: garbage in cycles the collector has not reached yet is
    # not held by anything.
    gc.collect()
    live = [o for o in gc.get_objects() if isinstance(o, DownstreamStream)]
    ended = [o for o in live if o not in running.relay.serving.streams]
    assert len(ended) <= LINGERING_STREAMS, f"{len(ended)} ended streams still in memory"


# -- the tests ----------------------------------------------------------------------------


def test_fuzz_valid_requests_keep_their_streams_and_end_ok(running: Running) -> None:
    fuzz(running, "valid", EXAMPLES["valid"])


def test_fuzz_invalid_requests_end_the_stream_with_a_status_and_message(
        running: Running) -> None:
    fuzz(running, "invalid", EXAMPLES["invalid"])


def test_fuzz_undecodable_requests_end_with_invalid_argument(running: Running) -> None:
    fuzz(running, "undecodable", EXAMPLES["undecodable"])


def test_fuzz_any_requests(running: Running) -> None:
    fuzz(running, "any", EXAMPLES["any"])


def test_fuzz_fetches(running: Running) -> None:
    fuzz(running, "any", EXAMPLES["fetch"], fetch_only=True)


def test_fuzz_limits_are_config_keys() -> None:
    """Every limit the fuzzer breaches has a ``limits.*`` key (else the fuzz
    tests cannot set it, and generate no breach of it)."""
    keys = limit_keys()
    missing = [kind for kind in LIMIT_KINDS if kind not in keys]
    assert not missing, f"no limits.* config key for {missing}"
