"""Bookkeeping benchmark: what a big client joining and leaving costs the
interest index, the demand ledger and the upstream's targets, in process.

No gRPC, no streams: the work the relay does for the names themselves, in
the steps the relay takes them (a leave 2,000 names a turn of the event loop,
the upstream 2,000 names a turn, a linger ending on the upstream's ticks).
Two clients of K plain names on one host: the first joins (cold: its names
are subscribed upstream, the origin's answer cached), the second joins the
same names (warm), the second leaves (its names stay wanted), the first
leaves (its names linger, ``upstream.linger_names`` of them at most: the
default 20,000), and the linger ends. The first client's names settling
(``upstream.answer_grace`` after they were subscribed: in the relay, during
the warm join) is a phase of its own, ``settle``. Per phase, the CPU time
(``time.process_time``, the figure the load of other processes moves least)
of the index and of the upstream, and the largest single step: a step is
what holds the event loop.

Each tree runs in a process of its own (``--relay-src``, and ``--baseline-src``
for before/after in one invocation: the same load for both), with the
garbage collector off, so that a step is its own work and not a collection
that fell into it.

Usage: ``python -m benchmarks.bookkeeping [--names 10000] [--runs 5]
[--linger 30] [--relay-src DIR] [--baseline-src DIR]``
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: Names per step, as the relay takes them (relay.server.serving.NAMES_PER_TURN,
#: relay.upstream.client.MAX_NAMES_PER_TURN).
PER_TURN = 2_000
PHASES = ("cold_join", "settle", "warm_join", "warm_leave", "last_leave", "linger_end")


# -- the child: one tree, in process ------------------------------------------------


class _Sub:
    """A subscriber that hears nothing (the index's fan-out is not measured)."""

    def __hash__(self) -> int:
        return id(self)

    def resources_changed(self, *args: object) -> None:
        pass

    def heartbeats_received(self, *args: object) -> None:
        pass

    def subscription_refused(self, *args: object) -> None:
        pass


class _Upward:
    """The index's way up, as the upstream client keeps it: names per type."""

    def __init__(self) -> None:
        self.changed: dict[str, set[str]] = {}

    def interest_changed(self, type_url: str, names: Any) -> None:
        self.changed.setdefault(type_url, set()).update(names)

    def refetch(self, type_url: str, names: Any) -> None:
        pass


def _one_run(count: int, linger: float) -> dict[str, dict[str, float]]:
    from envoy.config.core.v3 import base_pb2
    from envoy.config.endpoint.v3 import endpoint_pb2
    from envoy.service.discovery.v3 import discovery_pb2
    from google.protobuf import any_pb2

    from relay.cache import ResourceCache
    from relay.constraints import EMPTY_PARAMS
    from relay.demand import DemandLedger
    from relay.interest import InterestChange, InterestIndex
    from relay.upstream.responses import Unusable, parse_response
    from relay.upstream.state import UpstreamState
    from relay.xds_types import ENDPOINT

    names = [f"big-{i}" for i in range(count)]
    cache, index, upward = ResourceCache(), InterestIndex(), _Upward()
    index.limit_demand(DemandLedger(10 * count, 10 * count, time.monotonic,
                                    routes=lambda name: None))
    index.link(upward)
    cache.add_listener(index.on_cache_change)  # (as relay.core wires them)
    state = UpstreamState(base_pb2.Node(id="relay"), cache, linger)
    state.on_connect(index, 0.0)
    figures: dict[str, dict[str, float]] = {}

    def timed(step: Any, *args: Any) -> float:
        started = time.process_time()
        step(*args)
        return time.process_time() - started

    def ticks(now: float) -> list[float]:
        steps = []
        while (due := state.next_deadline()) is not None and due <= now:
            steps.append(timed(state.on_tick, index, now))
        return steps

    def upstream(now: float) -> list[float]:
        """The upstream's turns, each followed by the ticks due (its timer
        wakes after each turn): what linger_names cuts is synced as it goes."""
        steps = []
        while upward.changed.get(ENDPOINT):
            pending = upward.changed[ENDPOINT]
            taken = {pending.pop() for _ in range(min(PER_TURN, len(pending)))}
            steps.append(timed(state.on_interest_changed, ENDPOINT, index, now, taken))
            steps += ticks(now)
        return steps

    def record(phase: str, index_steps: list[float], upstream_steps: list[float]) -> None:
        figures[phase] = {"index_ms": sum(index_steps) * 1e3,
                          "upstream_ms": sum(upstream_steps) * 1e3,
                          "largest_step_ms": max([*index_steps, *upstream_steps]) * 1e3}

    cold, warm = _Sub(), _Sub()
    joined = InterestChange(added=dict.fromkeys(names, EMPTY_PARAMS))
    record("cold_join", [timed(index.apply, cold, ENDPOINT, joined, "10.0.0.1")], upstream(1.0))
    body = any_pb2.Any()
    body.Pack(endpoint_pb2.ClusterLoadAssignment(cluster_name="big"))
    response = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce="1")
    for name in names:
        response.resources.add(name=name, version="1", resource=body)
    parsed = parse_response(response)
    assert not isinstance(parsed, Unusable), parsed
    state.on_response(parsed, index, 1.0)
    # the cold client's names settle (upstream.answer_grace after they were
    # subscribed): in the relay this tick falls into the warm join that follows
    record("settle", [], ticks(10.0))
    record("warm_join", [timed(index.apply, warm, ENDPOINT, joined, "10.0.0.1")], upstream(10.0))
    for phase, sub in (("warm_leave", warm), ("last_leave", cold)):
        slices = []
        while True:
            started = time.process_time()
            done = index.remove(sub, PER_TURN)
            slices.append(time.process_time() - started)
            if done:
                break
        record(phase, slices, upstream(20.0))
    record("linger_end", [], ticks(21.0 + linger))
    return figures


def child(count: int, linger: float, runs: int) -> None:
    gc.disable()
    print(json.dumps([_one_run(count, linger) for _ in range(runs)]))


# -- the parent: each tree in its own process ---------------------------------------


def measure(src: Path, count: int, linger: float, runs: int) -> list[dict[str, Any]]:
    """``runs`` runs of the relay in ``src`` (its own process, gc off)."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(count), str(linger),
         str(runs)],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, cwd=src, check=True,
        capture_output=True, text=True)
    result: list[dict[str, Any]] = json.loads(done.stdout)
    return result


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
        return
    from benchmarks.report import add_tree_options, table, tree_rows, trees

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", type=int, default=10_000, help="names of each client")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--linger", type=float, default=30.0, help="upstream.linger, seconds")
    add_tree_options(parser)
    args = parser.parse_args()
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] | None = None if args.baseline_src is None else []
    for _ in range(args.runs):  # (the trees in turn: the same load for both)
        for src, runs in ((args.relay_src, ours), (args.baseline_src, theirs)):
            if src is not None and runs is not None:
                [run] = measure(src, args.names, args.linger, 1)
                runs.append({f"{p}_{k}": v for p, figures in run.items()
                             for k, v in figures.items()})
    rows = tree_rows(ours, theirs, (
        (f"{phase}: {what} (ms)", f"{phase}_{key}")
        for phase in PHASES
        for what, key in (("index CPU", "index_ms"), ("upstream CPU", "upstream_ms"),
                          ("largest step", "largest_step_ms"))
        if (phase, key) not in (("linger_end", "index_ms"), ("settle", "index_ms"))))
    print(f"{args.names} names, {args.runs} runs; {trees(args.relay_src, args.baseline_src)}")
    print(table(rows, "figure", baseline="before"))


if __name__ == "__main__":
    main()
