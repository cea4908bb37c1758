"""Where a warm big client's join goes, in the relay's own process: main-thread CPU by step.

:mod:`benchmarks.big_client` times a client subscribing to K names the
relay holds (``warm``) from outside; this runs the relay in this process
(``build_relay``, the collector tuned and memory allocated as ``xds-relay
run`` does: :mod:`relay.memory`) and times, in the event loop's thread
(``time.thread_time``: another process's load moves it least), the steps
the join goes through:

* ``check``: the request checked whole before it is applied in pieces
  (``Session.check``);
* ``receive``: the pieces applied to the session (``Session.receive``);
* ``index``: the interest index told (``InterestIndex.apply``), of which
  ``served_to_all`` is not part;
* ``due``: the responses planned (``Session.due``), of which
  ``served_to_all`` (the cache's look-up of the page's names),
  ``take_candidates`` (the names to look at, sorted) and ``all_new`` (the
  page sent whole, sized, recorded as held);
* ``encode``: the planned responses joined into bytes (``PlanEncoder.encode``);
* ``write``: the main thread's part of gRPC's writes (``context.write``).

The origin (:mod:`benchmarks.bare`) and the clients
(:func:`benchmarks.big_client.client_main`) are processes of their own. A
first client subscribes to K names of ``--size`` bytes (cold); then, per
run, a new client subscribes to the same (warm) and leaves. Each tree runs
in its own process (``--relay-src``, and ``--baseline-src`` for before and
after in one invocation, the trees in turn); figures are per run, min and
median. A step a tree lacks is left out of its figures. Beside the steps,
``received`` (from the client's request to its last response, as the
client saw it), ``main_thread`` (the thread's CPU over that time) and its
``page faults`` (each paid in the kernel: memory the join touched afresh).

With ``--cold`` each run's client is the only one, and the relay lets
names go as soon as nobody holds them (``linger: 0s``): every join is
*cold*, fetched from the origin, and the upstream's steps are timed too:

* ``up_interest``: the upstream told the names wanted, a turn at a time
  (``UpstreamState.on_interest_changed``);
* ``parse``: the origin's responses checked, summed over the steps of
  each (``parse_steps``, as :class:`~relay.upstream.client.UpstreamClient`
  runs it);
* ``on_response``: each checked response applied
  (``UpstreamState.on_response``), of which ``cache_apply``
  (``ResourceCache.apply``).

``write`` is left out there: the thread's time across an awaited write
counts whatever else the loop ran meanwhile, and a cold join's writes
overlap the next responses' parsing.

Usage: ``python -m benchmarks.warm_sections [--resources 10000] [--size 300]
[--variant delta|sotw] [--runs 8] [--cold] [--relay-src DIR] [--baseline-src DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# step -> (module, class, method)
STEPS = {
    "check": ("relay.protocol.session", "Session", "check"),
    "receive": ("relay.protocol.session", "Session", "receive"),
    "index": ("relay.interest", "InterestIndex", "apply"),
    "due": ("relay.protocol.session", "Session", "due"),
    "served_to_all": ("relay.cache", "ResourceCache", "served_to_all"),
    "take_candidates": ("relay.protocol.subscription", "SubscriptionState", "_take_candidates"),
    "all_new": ("relay.protocol.subscription", "SubscriptionState", "_all_new"),
    "encode": ("relay.server.plans", "PlanEncoder", "encode"),
}
#: the upstream's steps, timed with --cold
COLD_STEPS = {
    "up_interest": ("relay.upstream.state", "UpstreamState", "on_interest_changed"),
    "on_response": ("relay.upstream.state", "UpstreamState", "on_response"),
    "cache_apply": ("relay.cache", "ResourceCache", "apply"),
}
SPENT: collections.Counter[str] = collections.Counter()


def _timed(step: str, module: str, owner: str, name: str) -> None:
    cls = getattr(__import__(module, fromlist=[owner]), owner)
    method = getattr(cls, name, None)
    if method is None:
        return

    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            SPENT[step] += time.thread_time() - start

    setattr(cls, name, timed)


class _TimedContext:
    """A servicer context whose writes are timed (``write``)."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def write(self, message: Any) -> None:
        start = time.thread_time()
        try:
            await self._context.write(message)
        finally:
            SPENT["write"] += time.thread_time() - start


def _timed_parse() -> None:
    """The upstream client's parse_steps, each step timed (``parse``)."""
    import relay.upstream.client as client

    steps = client.parse_steps

    def timed(*args: Any, **kwargs: Any) -> Any:
        checking = steps(*args, **kwargs)
        while True:
            start = time.thread_time()
            try:
                next(checking)
            except StopIteration as done:
                return done.value
            finally:
                SPENT["parse"] += time.thread_time() - start
            yield

    client.parse_steps = timed


def _time_steps(cold: bool) -> None:
    from relay.server.streams import DownstreamStream

    for step, (module, owner, name) in {**STEPS, **(COLD_STEPS if cold else {})}.items():
        _timed(step, module, owner, name)
    if cold:
        _timed_parse()
    serve = DownstreamStream.serve

    async def serve_timed(self: Any, requests: Any, context: Any) -> None:
        await serve(self, requests, _TimedContext(context))

    DownstreamStream.serve = serve_timed  # type: ignore[method-assign]


async def _join(target: str, resources: int, variant: str) -> dict[str, float]:
    """One client's join, timed by step; then it leaves."""
    from benchmarks.big_client import client_main
    from benchmarks.processes import wait_for_worker, workers

    async with workers(client_main, 1, 1, target, resources, variant) as client:
        await asyncio.sleep(0.3)
        SPENT.clear()
        cpu, faults = time.thread_time(), _thread_faults()
        client.pipes[0].send("join")
        reply = await wait_for_worker(client.pipes[0], client.processes[0])
        run = {step: spent * 1e3 for step, spent in SPENT.items()}
        run["main_thread"] = (time.thread_time() - cpu) * 1e3
        run["faults"] = _thread_faults() - faults
        run["received"] = (reply["done"] - reply["sent"]) * 1e3
        _RETURNED.clear()
        client.pipes[0].send("leave")
        await wait_for_worker(client.pipes[0], client.processes[0])
        # The memory the leave let go is given back (a full collection, then
        # a trim, and the trim once more a moment later) a second or more
        # after it: waited for here, where it would otherwise fall inside the
        # next run's join.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_RETURNED.wait(), 10.0)
        await asyncio.sleep(_TRIM_AGAIN + 0.2)
    return run


def _thread_faults() -> int:
    """The page faults this thread has taken (each paid in the kernel)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


#: set when the relay gives memory back (see _tell_memory_returns)
_RETURNED = asyncio.Event()
#: how long after that the relay trims once more (a tree's relay.memory.TRIM_AGAIN; none before it)
_TRIM_AGAIN = 0.0


def _tell_memory_returns() -> None:
    """Each MemoryReturn made from now on sets :data:`_RETURNED` as it gives memory back."""
    global _TRIM_AGAIN
    import relay.memory
    from relay.memory import MemoryReturn

    _TRIM_AGAIN = getattr(relay.memory, "TRIM_AGAIN", 0.0)

    made = MemoryReturn.__init__

    @functools.wraps(made)
    def telling(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        collect = self._collect

        def collect_and_tell() -> None:
            collect()
            _RETURNED.set()

        self._collect = collect_and_tell

    MemoryReturn.__init__ = telling  # type: ignore[method-assign]


async def _runs(resources: int, size: int, variant: str, runs: int,
                cold: bool) -> list[dict[str, float]]:
    from benchmarks.bare import bare_process
    from benchmarks.big_client import client_main
    from benchmarks.processes import wait_for_worker, workers
    from relay.app import build_relay
    from relay.config.loading import parse_config
    from relay.runtime import tune_gc
    from tests.harness import relay_config

    figures = []
    async with bare_process(big=resources, size=size) as origin:
        # (cold: what nobody holds is let go at once, so each join fetches anew)
        relay = build_relay(parse_config(relay_config(origin.port,
                                                      linger="0s" if cold else "30s")))
        await relay.start()
        tune_gc()
        target = f"127.0.0.1:{relay.xds_port}"
        try:
            if cold:
                for _ in range(runs):
                    figures.append(await _join(target, resources, variant))
                return figures
            async with workers(client_main, 1, 1, target, resources, variant) as holder:
                holder.pipes[0].send("join")
                await wait_for_worker(holder.pipes[0], holder.processes[0])
                await asyncio.sleep(1.0)  # (the cold names settle)
                for _ in range(runs):
                    figures.append(await _join(target, resources, variant))
                holder.pipes[0].send("leave")
        finally:
            await relay.stop(0)
    return figures


def child(resources: int, size: int, variant: str, runs: int, cold: bool) -> None:
    from relay.memory import exec_with_allocator

    exec_with_allocator()  # (started again as the tree's relay process is: its allocator, heaps)
    _time_steps(cold)
    _tell_memory_returns()
    print(json.dumps(asyncio.run(_runs(resources, size, variant, runs, cold))))


def measure(src: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    """One run of the relay in ``src``, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(args.resources),
         str(args.size), args.variant, "1", "cold" if args.cold else "warm"],
        env=env, cwd=src, check=True, capture_output=True, text=True)
    result: list[dict[str, float]] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]),
              sys.argv[6] == "cold")
        return
    from benchmarks.report import add_tree_options, table, tree_rows, trees

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resources", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=300, help="bytes of each resource (about)")
    parser.add_argument("--variant", choices=("delta", "sotw"), default="delta")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--cold", action="store_true",
                        help="every join fetched from the origin; the upstream's steps timed too")
    add_tree_options(parser)
    args = parser.parse_args()
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for _ in range(args.runs):  # (the trees in turn: the same load for both)
        ours += measure(args.relay_src, args)
        if args.baseline_src is not None:
            theirs += measure(args.baseline_src, args)
    steps = ["received", "main_thread", "faults", *STEPS,
             *(["parse", *COLD_STEPS] if args.cold else ["write"])]
    rows = tree_rows(ours, theirs if args.baseline_src else None,
                     ((f"{step} (ms)" if step != "faults" else "page faults", step)
                      for step in steps if any(step in run for run in ours)))
    kind = "cold" if args.cold else "warm"
    print(f"{kind} {args.variant} join of {args.resources} x {args.size} B, {args.runs} runs; "
          f"{trees(args.relay_src, args.baseline_src)}; load {os.getloadavg()[0]:.1f}")
    print(table(rows, "main-thread CPU of", baseline="before"))


if __name__ == "__main__":
    main()
