"""istiod's reconnect at a big client's size, in one process, step by step: no gRPC,
no clients (:mod:`benchmarks.reconnect` runs it end to end).

istiod ends every stream after about 30 minutes, ignores
``initial_resource_versions`` and resends all it has on the new stream. A
relay whose client holds K names (``big-0`` ...) then goes through four
steps, each run by the upstream client in one go on the event loop (or, for
the parse, in steps): the new stream's subscription
(:meth:`UpstreamState.on_connect`: what is wanted, the versions declared,
the requests cut), the resend's check (:func:`relay.upstream.responses.parse_steps`,
its longest step), the resend applied (:meth:`UpstreamState.on_response`:
the resync's bookkeeping, the cache's write), and the reconcile once its
grace is over (:meth:`UpstreamState.on_tick`). A tree whose subscription,
response applied, or reconcile is made in steps (``connect_steps``,
``response_steps``, ``tick_steps``) is timed so: ``connect hold``,
``response hold`` and ``reconcile hold`` are their longest steps (else the
whole call); ``longest`` is the longest the event loop is held in one go,
of all four.

The cache tells the interest index of each change, as in a relay, and
the index tells the client's subscriber and ``--streams`` delta streams'
sessions that hold every name (as :class:`relay.server.streams.DownstreamStream`
does; nothing is sent): each notes the names changed in the step that writes
them.

The resend is one DeltaDiscoveryResponse of K ClusterLoadAssignments of
about ``--size`` bytes without versions, as istiod sends them: each
resource as cached (``--changed 0``), or each with new content
(``--changed 1``, a push that changed every endpoint while the stream was
down); ``--changed F`` changes that share of them. Timed per step, min and
median over ``--runs``, each run from a fresh state that took the cold
response first. Issue 27's item 5 allows 50 ms for any one step.

Like :mod:`benchmarks.cold_path`, the figures are of one process on the CPU
alone, allocating as a relay process does (its allocator, malloc settings
and collector thresholds); ``--relay-src`` runs another tree's relay
package, so two trees compare in one session.

Usage: ``python -m benchmarks.reconnect_steps [--resources 50000] [--size 1260]
[--changed 0] [--runs 5] [--streams 0] [--relay-src DIR]``; prints one table.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cold_path import (
    ENDPOINT,
    PER_TURN,
    _parsed,
    _Subscriber,
    like_a_relay_process,
    timed_steps,
)

STEPS = ("on_connect", "connect hold", "parse", "parse hold", "on_response",
         "response hold", "reconcile", "reconcile hold", "longest")


def responses(resources: int, size: int, changed: float) -> tuple[bytes, bytes]:
    """The cold response and the resend (``changed`` of its bodies new),
    without versions, encoded."""
    from envoy.service.discovery.v3 import discovery_pb2
    from google.protobuf import any_pb2

    from benchmarks.bare import big_names, padded_endpoints

    made = list(padded_endpoints(big_names(resources), size))
    every = round(1 / changed) if changed else 0
    encoded = []
    for nonce, change in (("1", False), ("2", True)):
        response = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce=nonce)
        for i, (name, body) in enumerate(made):
            if change and every and i % every == 0:
                body += b"\x10\x01"  # (the load assignment's policy: a field more)
            response.resources.add(name=name,
                                   resource=any_pb2.Any(type_url=ENDPOINT, value=body))
        encoded.append(response.SerializeToString())
    return encoded[0], encoded[1]


class _Stream:
    """A delta stream's session of every name, told of changes by the
    interest index as :class:`relay.server.streams.DownstreamStream` is (no
    gRPC: what it sends is not part of the reconnect's steps)."""

    def __init__(self, names: list[str], view: Any) -> None:
        from envoy.service.discovery.v3 import discovery_pb2

        from relay.protocol.session import Session

        self.view = view
        self.session = Session("delta")
        self.session.receive(discovery_pb2.DeltaDiscoveryRequest(
            type_url=ENDPOINT, resource_names_subscribe=names))

    def __hash__(self) -> int:
        return id(self)

    def drain(self) -> None:
        """Every response due built and ACKed (the cold names sent)."""
        from envoy.service.discovery.v3 import discovery_pb2

        while plans := self.session.due(self.view).responses:
            for plan in plans:
                self.session.receive(discovery_pb2.DeltaDiscoveryRequest(
                    type_url=ENDPOINT, response_nonce=plan.nonce))

    def resources_changed(self, type_url: str, names: frozenset[str], everything: bool) -> None:
        if self.session.mark_changed(type_url, names, everything) is not None:
            self.session.first_answers_ready(type_url, self.view)

    def heartbeats_received(self, type_url: str, names: frozenset[str]) -> None:
        self.session.heartbeats_received(type_url, names)


def one_run(cold: bytes, resend: bytes, resources: int, streams: int = 0) -> list[float]:
    """Milliseconds of each step (see STEPS) of one reconnect, ``streams``
    delta streams holding every name (each told of what changes)."""
    from envoy.config.core.v3 import base_pb2

    from benchmarks.bare import big_names
    from relay.cache import ResourceCache
    from relay.interest import Interest, InterestIndex
    from relay.protocol.view import CacheView
    from relay.upstream.responses import ParsedResponse, parse_response
    from relay.upstream.state import UpstreamState

    cache, index = ResourceCache(), InterestIndex()
    cache.add_listener(index.on_cache_change)
    view = CacheView(cache)
    state = UpstreamState(base_pb2.Node(id="relay"), cache, 0.0)
    state.on_connect(index, 0.0)
    names = big_names(resources)
    held = [_Stream(names, view) for _ in range(streams)]
    for subscriber in [_Subscriber(), *held]:
        index.update(subscriber, ENDPOINT, Interest(frozenset(names)))
    for start in range(0, len(names), PER_TURN):
        state.on_interest_changed(ENDPOINT, index, 0.0, names[start:start + PER_TURN])
    first = parse_response(cold, known=cache.served_to_all)
    assert isinstance(first, ParsedResponse)
    state.on_response(first, index, 0.01)
    grace = state.answer_grace
    state.on_tick(index, 1.0 + grace)  # (the cold names answered)
    for stream in held:
        stream.drain()
    del first
    state.on_disconnect()
    gc.collect()
    now = 10.0 + grace
    connect, connect_hold = _in_steps(state, "connect_steps", "on_connect", index, now)
    started = time.perf_counter()
    parsed, longest = _parsed(resend, {"known": cache.served_to_all})
    parse = (time.perf_counter() - started) * 1e3
    assert isinstance(parsed, ParsedResponse) and len(parsed.upserts) == resources
    applied, applied_hold = _in_steps(state, "response_steps", "on_response",
                                      parsed, index, now + 0.01)
    reconcile, reconcile_hold = _in_steps(state, "tick_steps", "on_tick",
                                          index, now + 1.0 + grace)
    assert len(cache.names(ENDPOINT)) == resources
    steps = [connect, connect_hold, parse, longest * 1e3, applied, applied_hold,
             reconcile, reconcile_hold]
    return [*steps, max(connect_hold, longest * 1e3, applied_hold, reconcile_hold)]


def _in_steps(state: Any, stepped: str, whole: str, *args: Any) -> tuple[float, float]:
    """A call of the tree's upstream state as its upstream client makes it:
    in steps where the state has them (``stepped``), else in one go
    (``whole``); its time in all, and its longest step, in milliseconds."""
    if not hasattr(state, stepped):
        took = _timed(lambda: getattr(state, whole)(*args))
        return took, took
    _, total, longest = timed_steps(getattr(state, stepped)(*args))
    return total * 1e3, longest * 1e3


def _timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resources", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=1260, help="bytes of each resource's body")
    parser.add_argument("--changed", type=float, default=0.0,
                        help="the share of the resent resources with new content (0 to 1)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--streams", type=int, default=0,
                        help="delta streams holding every name, told of each change")
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the tree whose relay package runs (default: this checkout)")
    args = parser.parse_args()
    trim = like_a_relay_process(args.relay_src)
    from relay.runtime import tune_gc

    cold, resend = responses(args.resources, args.size, args.changed)
    tune_gc()  # as a relay process does
    runs = []
    for _ in range(args.runs):
        gc.collect()
        if trim is not None:
            trim()
        runs.append(one_run(cold, resend, args.resources, args.streams))
    print(f"relay from {args.relay_src}: a reconnect at {args.resources} x {args.size} B, "
          f"{args.changed:.0%} resent changed, {args.streams} streams holding them, "
          f"{args.runs} runs, ms (min / median)")
    print("| " + " | ".join(STEPS) + " |")
    print("|" + " ---: |" * len(STEPS))
    print("| " + " | ".join(f"{min(column):.1f} / {statistics.median(column):.1f}"
                            for column in zip(*runs, strict=True)) + " |")


if __name__ == "__main__":
    main()
