"""What a connection storm costs the relay's own Python, per step, in process.

:mod:`benchmarks.fanout`'s storm (1,000 delta streams opening at once, each
subscribing to one cached name) is mostly gRPC and asyncio, and it swings
by 10-20 % from one invocation to the next on a shared machine: too much to
tell whether a change to the protocol or the interest index made it dearer.
This drives the same work with no gRPC, no streams and the collector off:
``--streams`` delta sessions each receive the subscribe (with a Node, as a
first request has), the interest index learns it (with a demand ledger, as
the relay limits it), the session plans its response, the plan is encoded
and the client's ACK received. Per run, the CPU time of the whole
(``time.process_time``) and the wall time of each step, summed over the
streams; min and median over ``--runs``.

Each tree runs in a process of its own (``--relay-src``, and
``--baseline-src`` for before and after in one invocation, the trees in
turn).

Usage: ``python -m benchmarks.storm_steps [--streams 1000] [--runs 10]
[--relay-src DIR] [--baseline-src DIR]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

NAME = "storm"
STEPS = ("receive", "index", "due", "encode", "ack")


def _runs(streams: int, runs: int) -> list[dict[str, float]]:
    from envoy.config.core.v3 import base_pb2
    from envoy.service.discovery.v3 import discovery_pb2
    from google.protobuf import any_pb2

    from relay.cache import ResourceCache, Update
    from relay.demand import DemandLedger
    from relay.encoding import length_delimited_field
    from relay.interest import InterestIndex
    from relay.protocol.session import Session
    from relay.protocol.view import CacheView
    from relay.resource import CachedResource
    from relay.server.plans import PlanEncoder
    from relay.xds_types import ENDPOINT

    resource = discovery_pb2.Resource(name=NAME, version="1", resource=any_pb2.Any(
        type_url=ENDPOINT, value=b"x" * 200))
    cache = ResourceCache()
    cache.apply(ENDPOINT, Update([CachedResource.from_encoded(
        ENDPOINT, NAME, "1", length_delimited_field(2, resource.SerializeToString()),
        received=1.0)], removed=[]))
    view = CacheView(cache)
    clock = time.perf_counter
    figures = []
    for _ in range(runs):
        index = InterestIndex()
        index.limit_demand(DemandLedger(10 * streams, 10 * streams, time.monotonic))
        encoder = PlanEncoder()
        sessions = [Session("delta") for _ in range(streams)]
        requests = [discovery_pb2.DeltaDiscoveryRequest(
            type_url=ENDPOINT, resource_names_subscribe=[NAME], node=base_pb2.Node(id=f"n{i}"))
            for i in range(streams)]
        spent = dict.fromkeys(STEPS, 0.0)
        gc.collect()
        gc.disable()
        cpu = time.process_time()
        for session, request in zip(sessions, requests, strict=True):
            start = clock()
            received = session.receive(request)
            told = clock()
            for type_url, change in received.interest:
                index.apply(session, type_url, change, "127.0.0.1")
            planning = clock()
            due = session.due(view)
            planned = clock()
            spent["receive"] += told - start
            spent["index"] += planning - told
            spent["due"] += planned - planning
            for plan in due.responses:
                encoder.encode(plan)
                encoded = clock()
                session.receive(discovery_pb2.DeltaDiscoveryRequest(
                    type_url=ENDPOINT, response_nonce=plan.nonce))
                spent["encode"] += encoded - planned
                spent["ack"] += clock() - encoded
        cpu = time.process_time() - cpu
        gc.enable()
        figures.append({"cpu": cpu * 1e3, **{step: s * 1e3 for step, s in spent.items()}})
    return figures


def measure(src: Path, streams: int, runs: int) -> list[dict[str, float]]:
    """``runs`` runs of the relay in ``src``, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(streams), str(runs)],
        env=env, cwd=src, check=True, capture_output=True, text=True)
    result: list[dict[str, float]] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_runs(int(sys.argv[2]), int(sys.argv[3]))))
        return
    from benchmarks.report import add_tree_options, table, tree_rows, trees

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=10)
    add_tree_options(parser)
    args = parser.parse_args()
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for _ in range(3):  # (the trees in turn, a third of the runs each time: the same load)
        ours += measure(args.relay_src, args.streams, max(1, args.runs // 3))
        if args.baseline_src is not None:
            theirs += measure(args.baseline_src, args.streams, max(1, args.runs // 3))
    rows = tree_rows(ours, theirs if args.baseline_src else None,
                     ((f"{step} (ms)", step) for step in ("cpu", *STEPS)))
    print(f"storm of {args.streams} one-name delta subscribes, {len(ours)} runs; "
          f"{trees(args.relay_src, args.baseline_src)}; load {os.getloadavg()[0]:.1f}")
    print(table(rows, "all streams, per run", baseline="before"))


if __name__ == "__main__":
    main()
