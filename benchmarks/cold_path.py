"""The cold big client's upstream side, in one process: no gRPC, no clients.

One client's subscription of K names (``big-0`` ...) goes through the
relay's interest index and upstream state (2,000 names a turn, as the
upstream client takes them); the origin's answer, one
DeltaDiscoveryResponse of K ClusterLoadAssignments of about ``--size``
bytes (as :mod:`benchmarks.bare` makes them, versions included), is parsed
(:func:`relay.upstream.responses.parse_response`), applied
(:meth:`UpstreamState.on_response`, which writes the cache) and each
resource's delta entry read, as a first response to a client reads it.
Timed in steps, min and median over ``--runs``, each in a fresh state.

Figures of one process on the CPU alone, so they hold up when other
processes load the machine, unlike :mod:`benchmarks.big_client`'s
end-to-end ones; ``--relay-src`` runs another tree's relay package.

Usage: ``python -m benchmarks.cold_path [--resources 10000] [--size 300]
[--runs 9] [--relay-src DIR]``; prints one table.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

#: Names the upstream client syncs a turn (relay.upstream.client.MAX_NAMES_PER_TURN).
PER_TURN = 2_000
STEPS = ("subscribe", "parse", "on_response", "entries", "total")
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def origin_response(resources: int, size: int) -> bytes:
    """The origin's answer to all of them, encoded."""
    from envoy.service.discovery.v3 import discovery_pb2
    from google.protobuf import any_pb2

    from benchmarks.bare import big_names, padded_endpoints

    response = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce="1")
    for name, body in padded_endpoints(big_names(resources), size):
        response.resources.add(name=name, version=hashlib.sha256(body).hexdigest()[:12],
                               resource=any_pb2.Any(type_url=ENDPOINT, value=body))
    return response.SerializeToString()


class _Subscriber:
    def resources_changed(self, *args: Any) -> None:
        pass


def one_run(encoded: bytes, resources: int) -> list[float]:
    """Milliseconds of each step (see STEPS) of one cold join."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.discovery.v3 import discovery_pb2

    from benchmarks.bare import big_names
    from relay.cache import ResourceCache
    from relay.interest import Interest, InterestIndex
    from relay.upstream.responses import ParsedResponse, parse_response
    from relay.upstream.state import UpstreamState

    cache, index = ResourceCache(), InterestIndex()
    state = UpstreamState(base_pb2.Node(id="relay"), cache, 0.0)
    state.on_connect(index, 0.0)
    names = big_names(resources)
    index.update(_Subscriber(), ENDPOINT, Interest(frozenset(names)))
    response = discovery_pb2.DeltaDiscoveryResponse.FromString(encoded)
    marks = [time.perf_counter()]
    # (as the upstream client takes them: the names the index tells of, a
    # turn's worth at a time)
    for start in range(0, len(names), PER_TURN):
        state.on_interest_changed(ENDPOINT, index, 0.0, names[start:start + PER_TURN])
    marks.append(time.perf_counter())
    parsed = parse_response(response)
    marks.append(time.perf_counter())
    assert isinstance(parsed, ParsedResponse)
    state.on_response(parsed, index, 0.01)  # (answered only after the grace: as served)
    marks.append(time.perf_counter())
    entries = [resource.delta_entry for resource in parsed.upserts]
    marks.append(time.perf_counter())
    assert len(entries) == len(cache.names(ENDPOINT)) == resources
    steps = [(after - before) * 1e3 for before, after in itertools.pairwise(marks)]
    return [*steps, sum(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resources", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=300, help="bytes of each resource's body")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the tree whose relay package runs (default: this checkout)")
    args = parser.parse_args()
    sys.path.insert(0, str(args.relay_src))
    from relay.runtime import tune_gc

    encoded = origin_response(args.resources, args.size)
    tune_gc()  # as a relay process does
    runs = [one_run(encoded, args.resources) for _ in range(args.runs)]
    print(f"relay from {args.relay_src}: {args.resources} x {args.size} B, {args.runs} runs, "
          f"ms (min / median)")
    print("| " + " | ".join(STEPS) + " |")
    print("|" + " ---: |" * len(STEPS))
    print("| " + " | ".join(f"{min(column):.1f} / {statistics.median(column):.1f}"
                            for column in zip(*runs, strict=True)) + " |")


if __name__ == "__main__":
    main()
