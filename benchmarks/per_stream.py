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

``pass`` is the same update through the streams' own code, as the relay runs
it after the batch window: N :class:`~relay.server.streams.DownstreamStream`
tasks (``serve``, over a stand-in for gRPC's context whose write waits, as
gRPC's does, on a future completed later) are woken by the window's end,
and it is the CPU time from there until every stream's write has begun, per
stream: the event loop's one pass that decides when the last stream has the
update (see :mod:`benchmarks.fanout_timeline`). ``bare pass`` is that of
:mod:`benchmarks.bare`'s loop (a queue per stream, then the write) in the
same process: ``pass - bare pass`` is what the relay's Python adds per
stream to that pass; gRPC's write itself is in neither.

``--relay-src DIR`` measures another tree's relay (an export of an earlier
commit) in a child process, the same code driving it: before and after in
one invocation.

Usage: ``python -m benchmarks.per_stream [--streams 2000] [--rounds 15]
[--processes 3] [--relay-src DIR]`` (with ``--relay-src``, the two trees'
child processes alternate, ``--processes`` each).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
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


class _Writes:
    """The writes begun and not yet completed, and when the ``wanted``-th began."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[None]] = []
        self.wanted = 0
        self.all_begun = asyncio.Event()
        self.last_begun = 0.0

    def expect(self, count: int) -> None:
        self.wanted = count
        self.all_begun.clear()

    def begun(self, future: asyncio.Future[None]) -> None:
        self.futures.append(future)
        if len(self.futures) == self.wanted:
            self.last_begun = time.process_time()
            self.all_begun.set()


class _Context:
    """A stand-in for gRPC's servicer context: a write waits on a future
    that :func:`_complete` completes, as gRPC's waits for its batch."""

    def __init__(self, writes: _Writes) -> None:
        self.writes = writes
        self.last = b""

    async def write(self, response: bytes) -> None:
        self.last = response
        done = asyncio.get_running_loop().create_future()
        self.writes.begun(done)
        await done

    def set_code(self, code: object) -> None:
        pass

    def set_details(self, details: str) -> None:
        pass


class _Requests:
    """A stream's requests, as the test puts them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> object:
        return await self.queue.get()


async def _complete(writes: _Writes) -> None:
    """Complete every write begun, until none is left (the streams then sleep)."""
    while True:
        await asyncio.sleep(0.005)  # (what the completed writes lead to: the next writes)
        if not writes.futures:
            return
        done, writes.futures = writes.futures, []
        for future in done:
            future.set_result(None)


async def _pass(streams: int, rounds: int) -> list[float]:
    """The ``pass`` figure of each round (see the module's docstring)."""
    from envoy.service.discovery.v3 import discovery_pb2

    from relay.cache import Update
    from relay.core import Core
    from relay.resource import CachedResource
    from relay.server.serving import ServingSettings
    from relay.server.streams import DownstreamStream

    request, response = discovery_pb2.DeltaDiscoveryRequest, discovery_pb2.DeltaDiscoveryResponse
    core = Core.create(settings=ServingSettings(batch_window=0.001))
    writes = _Writes()
    clients = [(_Context(writes), _Requests()) for _ in range(streams)]
    tasks = [asyncio.ensure_future(DownstreamStream(
        core.serving, "delta", f"ipv4:127.0.0.1:{i}").serve(requests, context))  # type: ignore[arg-type]
        for i, (context, requests) in enumerate(clients)]

    def publish(version: str) -> None:
        body = discovery_pb2.Resource(name=_NAME, version=version)
        body.resource.type_url = _EDS
        body.resource.value = b"x" * 200
        core.cache.apply(_EDS, Update(upserts=[CachedResource(_EDS, _NAME, version, body)]))

    async def answer_all() -> None:  # each stream's response written and ACKed
        await _complete(writes)
        for context, requests in clients:
            requests.queue.put_nowait(request(
                type_url=_EDS, response_nonce=response.FromString(context.last).nonce))
        await _complete(writes)

    publish("v0")
    for _, requests in clients:
        requests.queue.put_nowait(request(type_url=_EDS, resource_names_subscribe=[_NAME]))
    await answer_all()
    figures: list[float] = []
    ended = [0.0]
    end_batch = core.serving._end_batch

    def timed_end_batch() -> None:
        ended[0] = time.process_time()
        end_batch()

    core.serving._end_batch = timed_end_batch  # type: ignore[method-assign]
    for round_ in range(rounds):
        writes.expect(streams)
        publish(f"v{round_ + 1}")
        await writes.all_begun.wait()
        figures.append((writes.last_begun - ended[0]) * 1e6 / streams)
        await answer_all()
    for task in tasks:
        task.cancel()
    return figures


async def _bare_pass(streams: int, rounds: int) -> list[float]:
    """The ``bare pass`` figure of each round: benchmarks.bare's loop per stream."""
    writes = _Writes()

    async def serve(outbox: asyncio.Queue[bytes], context: _Context) -> None:
        while True:
            await context.write(await outbox.get())

    outboxes: list[asyncio.Queue[bytes]] = [asyncio.Queue() for _ in range(streams)]
    tasks = [asyncio.ensure_future(serve(outbox, _Context(writes))) for outbox in outboxes]
    await asyncio.sleep(0.005)
    figures = []
    for round_ in range(rounds):
        writes.expect(streams)
        started, body = time.process_time(), b"x" * (200 + round_ % 2)
        for outbox in outboxes:
            outbox.put_nowait(body)
        await writes.all_begun.wait()
        figures.append((writes.last_begun - started) * 1e6 / streams)
        await _complete(writes)
    for task in tasks:
        task.cancel()
    return figures


def _child(streams: int, rounds: int) -> None:
    figures = _measure(streams, rounds)
    gc.collect()
    gc.disable()  # (a collection inside a pass is the relay's settings' business, not this)
    figures["pass"] = asyncio.run(_pass(streams, rounds))
    figures["bare pass"] = asyncio.run(_bare_pass(streams, rounds))
    print(json.dumps(figures))


def _report(label: str, figures: dict[str, list[float]]) -> None:
    phases = [v for key, v in figures.items() if "pass" not in key]
    total = [sum(parts) for parts in zip(*phases, strict=True)]
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
