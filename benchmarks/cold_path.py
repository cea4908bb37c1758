"""The cold big client's upstream side, in one process: no gRPC, no clients.

One client's subscription of K names (``big-0`` ...) goes through the
relay's interest index and upstream state (2,000 names a turn, as the
upstream client takes them); the origin's answer, one
DeltaDiscoveryResponse of K ClusterLoadAssignments of about ``--size``
bytes (as :mod:`benchmarks.bare` makes them, versions included), or one
of ``--per-response`` names for each of the relay's requests (as the
end-to-end origin answers them: five of 2,000 for 10,000), is parsed
(:func:`relay.upstream.responses.parse_response`, handed the cache as the
upstream client hands it, where the tree's takes it), applied
(:meth:`UpstreamState.on_response`, which writes the cache) and each
resource's delta entry read, as a first response to a client reads it.
Timed in steps (the sum over responses), min and median over ``--runs``,
each in a fresh state. ``parse`` starts from the response's bytes, as gRPC
hands them over: a tree whose parse takes bytes is given them; for one that
takes a message, the message's parse (gRPC's, in the event loop's thread)
is counted in. ``hold`` is the longest the event loop is held in one go:
the parse's longest step (it pauses every ``RESOURCES_PER_STEP`` resources
and between its stages, as the upstream client runs it; gRPC's parse is a
step of its own), or ``on_response``, one call. ``--no-versions`` sends
resources without versions, as istiod does (the relay derives them).

Figures of one process on the CPU alone, so they hold up when other
processes load the machine, unlike :mod:`benchmarks.big_client`'s
end-to-end ones; ``--relay-src`` runs another tree's relay package. The
process allocates as that tree's relay process does (its allocator and
malloc settings: :mod:`relay.memory`), and before each run gives memory
back as a relay does once a client has left (a collection, a trim):
``faults`` counts the page faults of a run, each paid in the kernel.

Usage: ``python -m benchmarks.cold_path [--resources 10000] [--size 300]
[--runs 9] [--per-response N] [--no-versions] [--relay-src DIR]``; prints one table.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import inspect
import resource
import statistics
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

#: Names the upstream client syncs a turn (relay.upstream.client.MAX_NAMES_PER_TURN).
PER_TURN = 2_000
STEPS = ("subscribe", "parse", "on_response", "entries", "total", "hold", "faults")
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def origin_response(resources: int, size: int) -> bytes:
    """The origin's answer to all of them, encoded."""
    return origin_responses(resources, size, resources)[0]


def origin_responses(resources: int, size: int, per_response: int,
                     versions: bool = True) -> list[bytes]:
    """The origin's answers to all of them, ``per_response`` names each, encoded
    (each resource with a version, or, as istiod's, with none)."""
    from envoy.service.discovery.v3 import discovery_pb2
    from google.protobuf import any_pb2

    from benchmarks.bare import big_names, padded_endpoints

    made = list(padded_endpoints(big_names(resources), size))
    responses = []
    for start in range(0, resources, per_response):
        response = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT,
                                                        nonce=str(len(responses) + 1))
        for name, body in made[start:start + per_response]:
            response.resources.add(
                name=name, version=hashlib.sha256(body).hexdigest()[:12] if versions else "",
                resource=any_pb2.Any(type_url=ENDPOINT, value=body))
        responses.append(response.SerializeToString())
    return responses


class _Subscriber:
    def resources_changed(self, *args: Any) -> None:
        pass


def one_run(encoded: list[bytes], resources: int) -> list[float]:
    """Milliseconds of each step (see STEPS) of one cold join."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.discovery.v3 import discovery_pb2

    from benchmarks.bare import big_names
    from relay.cache import ResourceCache
    from relay.interest import Interest, InterestIndex
    from relay.upstream import responses as responses_module
    from relay.upstream.responses import ParsedResponse, parse_response
    from relay.upstream.state import UpstreamState

    cache, index = ResourceCache(), InterestIndex()
    state = UpstreamState(base_pb2.Node(id="relay"), cache, 0.0)
    state.on_connect(index, 0.0)
    names = big_names(resources)
    index.update(_Subscriber(), ENDPOINT, Interest(frozenset(names)))
    # (handed the cache, as the upstream client hands it, where the tree's parse takes it)
    known = ({"known": cache.served_to_all}
             if "known" in inspect.signature(parse_response).parameters else {})
    # (the bytes, where the tree's parse takes them; else the message, parsed in the loop)
    takes_bytes = hasattr(responses_module, "UndecodableResponse")
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    marks = [time.perf_counter()]
    # (as the upstream client takes them: the names the index tells of, a
    # turn's worth at a time)
    for start in range(0, len(names), PER_TURN):
        state.on_interest_changed(ENDPOINT, index, 0.0, names[start:start + PER_TURN])
    marks.append(time.perf_counter())
    parse = on_response = hold = 0.0
    upserts = []
    for response in encoded:
        started = time.perf_counter()
        if not takes_bytes:
            response = discovery_pb2.DeltaDiscoveryResponse.FromString(response)
        grpc_parse = time.perf_counter() - started
        parsed, longest = _parsed(response, known)
        parsed_at = time.perf_counter()
        longest = max(longest, grpc_parse)
        assert isinstance(parsed, ParsedResponse)
        state.on_response(parsed, index, 0.01)  # (answered only after the grace: as served)
        parse += parsed_at - started
        on_response += time.perf_counter() - parsed_at
        hold = max(hold, longest, time.perf_counter() - parsed_at)
        upserts += parsed.upserts
    before = time.perf_counter()
    entries = [resource.delta_entry for resource in upserts]
    after = time.perf_counter()
    assert len(entries) == len(cache.names(ENDPOINT)) == resources
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    steps = [(marks[1] - marks[0]) * 1e3, parse * 1e3, on_response * 1e3, (after - before) * 1e3]
    return [*steps, sum(steps), hold * 1e3, faults]


def _parsed(response: Any, known: dict[str, Any]) -> tuple[Any, float]:
    """The tree's parse of ``response``, run in steps as the upstream client
    runs it; and its longest step, in seconds."""
    from relay.upstream.responses import parse_steps

    value, _, longest = timed_steps(parse_steps(response, **known))
    return value, longest


def timed_steps(steps: Generator[None, None, Any]) -> tuple[Any, float, float]:
    """What a piece of work made in steps returns, run as the upstream
    client runs it (each step timed alone, nothing between); its time in
    all and its longest step, in seconds."""
    total = longest = 0.0
    while True:
        started = time.perf_counter()
        try:
            next(steps)
        except StopIteration as done:
            took = time.perf_counter() - started
            return done.value, total + took, max(longest, took)
        took = time.perf_counter() - started
        total, longest = total + took, max(longest, took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resources", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=300, help="bytes of each resource's body")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--per-response", type=int, default=None,
                        help="names the origin answers in one response (default: all)")
    parser.add_argument("--no-versions", action="store_true",
                        help="resources without versions, as istiod sends them")
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the tree whose relay package runs (default: this checkout)")
    args = parser.parse_args()
    trim = like_a_relay_process(args.relay_src)
    from relay.runtime import tune_gc

    encoded = origin_responses(args.resources, args.size, args.per_response or args.resources,
                               not args.no_versions)
    tune_gc()  # as a relay process does
    runs = []
    for _ in range(args.runs):
        gc.collect()  # (the last run's memory given back, as once a client has left)
        if trim is not None:
            trim()
        runs.append(one_run(encoded, args.resources))
    print(f"relay from {args.relay_src}: {args.resources} x {args.size} B in {len(encoded)} "
          f"response(s), {args.runs} runs, ms (min / median)")
    print("| " + " | ".join(STEPS) + " |")
    print("|" + " ---: |" * len(STEPS))
    print("| " + " | ".join(_cell(step, column)
                            for step, column in zip(STEPS, zip(*runs, strict=True),
                                                    strict=True)) + " |")


def like_a_relay_process(relay_src: Path) -> Callable[[], object] | None:
    """Run ``relay_src``'s relay package from now on, allocating as its
    relay process does (this command again, with its allocator; its malloc
    settings); the trim it calls once a client has left (None without
    glibc). The collector is the caller's to tune, once its input is made."""
    sys.path.insert(0, str(relay_src))
    from relay.memory import MemoryReturn, exec_with_allocator, malloc_trim

    exec_with_allocator()
    MemoryReturn.for_this_process()
    return malloc_trim()


def _cell(step: str, column: tuple[float, ...]) -> str:
    """A step's min / median: milliseconds to a tenth, faults whole."""
    digits = 0 if step == "faults" else 1
    return f"{min(column):.{digits}f} / {statistics.median(column):.{digits}f}"


if __name__ == "__main__":
    main()
