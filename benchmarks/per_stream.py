"""What one update costs the relay's own Python per delta stream, in process.

No gRPC, no sockets: N :class:`~relay.protocol.session.Session` objects of
the delta protocol each subscribe to one ClusterLoadAssignment of a
:class:`~relay.cache.ResourceCache` (the fan-out benchmark's load), then per
round the resource changes, and each stream is told (``mark_changed``),
builds its response (``due``), has it encoded (a shared
:class:`~relay.server.plans.PlanEncoder`) and receives the client's ACK
(``receive``): the steps the relay's main thread runs per stream per update,
timed one phase at a time over all streams (CPU time of this process, min
and median of rounds, per stream).

``--relay-src DIR`` measures another tree's relay (an export of an earlier
commit) in a child process, the same code driving it: before and after in
one invocation.

Usage: ``python -m benchmarks.per_stream [--streams 2000] [--rounds 15]
[--processes 3] [--relay-src DIR]`` (with ``--relay-src``, the two trees'
child processes alternate, ``--processes`` each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
_NAME = "svc"


def _measure(streams: int, rounds: int) -> dict[str, list[float]]:
    """Per phase, the CPU microseconds per stream of each round."""
    from envoy.service.discovery.v3 import discovery_pb2

    from relay.cache import ResourceCache, Update
    from relay.protocol.session import Session
    from relay.protocol.view import CacheView
    from relay.resource import CachedResource
    from relay.server.plans import PlanEncoder

    cache = ResourceCache()
    view = CacheView(cache)

    def publish(version: str) -> None:
        body = discovery_pb2.Resource(name=_NAME, version=version)
        body.resource.type_url = _EDS
        body.resource.value = b"x" * 200
        cache.apply(_EDS, Update(upserts=[CachedResource(_EDS, _NAME, version, body)]))

    publish("v0")
    sessions = [Session("delta") for _ in range(streams)]
    nonces: list[str] = [""] * streams
    for i, session in enumerate(sessions):
        session.receive(discovery_pb2.DeltaDiscoveryRequest(
            type_url=_EDS, resource_names_subscribe=[_NAME]))
        [plan] = session.due(view).responses
        nonces[i] = plan.nonce
    acks = [discovery_pb2.DeltaDiscoveryRequest(type_url=_EDS, response_nonce=nonces[i])
            for i in range(streams)]
    for session, ack in zip(sessions, acks, strict=True):
        session.receive(ack)
    names = frozenset([_NAME])
    encoder = PlanEncoder()
    figures: dict[str, list[float]] = {"mark": [], "due": [], "encode": [], "ack": []}
    cpu = time.process_time
    for round_ in range(rounds):
        publish(f"v{round_ + 1}")
        t0 = cpu()
        for session in sessions:
            session.mark_changed(_EDS, names, False)
        t1 = cpu()
        plans = [session.due(view).responses[0] for session in sessions]
        t2 = cpu()
        for plan in plans:
            encoder.encode(plan)
        t3 = cpu()
        # (each client ACKs with a request of its own, as gRPC decodes one)
        acks = [discovery_pb2.DeltaDiscoveryRequest(type_url=_EDS, response_nonce=plan.nonce)
                for plan in plans]
        t4 = cpu()
        for session, ack in zip(sessions, acks, strict=True):
            session.receive(ack)
        t5 = cpu()
        for key, seconds in (("mark", t1 - t0), ("due", t2 - t1), ("encode", t3 - t2),
                             ("ack", t5 - t4)):
            figures[key].append(seconds * 1e6 / streams)
    return figures


def _child(streams: int, rounds: int) -> None:
    print(json.dumps(_measure(streams, rounds)))


def _report(label: str, figures: dict[str, list[float]]) -> None:
    total = [sum(parts) for parts in zip(*figures.values(), strict=True)]
    cells = [f"{key} {min(v):.2f}/{statistics.median(v):.2f}" for key, v in figures.items()]
    print(f"{label:>10}: all {min(total):.2f}/{statistics.median(total):.2f} us | "
          + " | ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--relay-src", default=None)
    parser.add_argument("--processes", type=int, default=3,
                        help="child processes per tree, alternating")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.streams, args.rounds)
        return
    print(f"per stream per update, CPU us, min/median of {args.processes} x {args.rounds} rounds, "
          f"{args.streams} streams; load {os.getloadavg()[0]:.1f}")
    trees = [("this", os.getcwd())] + ([("other", args.relay_src)] if args.relay_src else [])
    figures: dict[str, dict[str, list[float]]] = {label: {} for label, _ in trees}
    for _ in range(args.processes):  # (alternating: the same noise for both)
        for label, src in trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
            # (this file by its path, so that ``relay`` comes from PYTHONPATH)
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child",
                 "--streams", str(args.streams), "--rounds", str(args.rounds)],
                env=env, check=True, capture_output=True, text=True, cwd=src).stdout
            for key, values in json.loads(out).items():
                figures[label].setdefault(key, []).extend(values)
    for label, _ in trees:
        _report(label, figures[label])


if __name__ == "__main__":
    main()
