"""Where the time of one fan-out update goes: a timeline, server side and client side.

The fan-out benchmark (:mod:`benchmarks.fanout`) gives the time from an
origin change until the last of N streams has it; this one shows what fills
that time. Each server runs with the tracer of
``benchmarks/timeline/sitecustomize.py`` (loaded by ``PYTHONPATH``; it wraps
a few of the server's methods and notes when each step happens, by the
machine's one monotonic clock), the same client workers as the fan-out
benchmark receive and ACK, and per round it prints, in ms from the change's
send:

* ``first``, ``median``, ``last``: when the first, median and last stream had it;
* relay only: ``read`` and ``parsed`` (the origin's response), ``notify``
  (the first stream told: the batch window starts), ``applied`` (every
  stream told), ``window_end`` and ``woken`` (the window's timer fired; all
  streams woken);
* ``pushes``: the first and the last stream's push (its response built and
  its write begun), one pass of the event loop over every stream;
* ``per_stream_us``: the median and 90th percentile gap between two streams'
  pushes (the relay's Python and gRPC's write, per stream);
* ``descheduled``: the sum of gaps over 1 ms in that pass (on a shared
  machine, the main thread waiting for a core), ``gc``: collections in the
  round and their ms, ``acks_before_last_push``: requests handled before the
  last push (none: the pass is one loop turn); ``minor_faults``: the
  server's minor page faults in the round, ACKs included.

Usage: ``python -m benchmarks.fanout_timeline [--streams 1000] [--rounds 5]
[--runs 1] [--servers relay,relay-no-window,bare-default]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from benchmarks import fanout
from benchmarks.processes import NAME, workers
from tests.builders import endpoints, version_of

_TRACER = Path(__file__).resolve().parent / "timeline"
_ROOT = Path(__file__).resolve().parents[1]
# how each server is started, given its environment (the tracer's)
_STARTS: dict[str, Callable[[dict[str, str]], AbstractAsyncContextManager[fanout.Server]]] = {
    "relay": lambda env: fanout.relay_server("relay", env=env),
    "relay-no-window": lambda env: fanout.relay_server("relay-no-window", "batch_window: 0s",
                                                      env=env),
    "relay-no-age": lambda env: fanout.relay_server("relay-no-age", "max_connection_age: 0s",
                                                   env=env),
    "relay-pymalloc": lambda env: fanout.relay_server(
        "relay-pymalloc", env={**env, "PYTHONMALLOC": "pymalloc"}),
    "bare": lambda env: fanout.bare_server("bare", env=env),
    "bare-no-age": lambda env: fanout.bare_server("bare-no-age", "relay-no-age", env=env),
    "bare-default": lambda env: fanout.bare_server("bare-default", "default", env=env),
    "bare-default-malloc": lambda env: fanout.bare_server(
        "bare-default-malloc", "default", env={**env, "PYTHONMALLOC": "malloc"}),
}
# events shown as one time each (the first of the round): bare (change) and relay
_STEPS = ("change", "read", "parsed", "first_notify", "applied", "window_end", "woken")


@contextlib.asynccontextmanager
async def traced(kind: str) -> AsyncIterator[tuple[fanout.Server, Path]]:
    """A fresh server of ``kind`` with the tracer, and the file of its events."""
    with tempfile.TemporaryDirectory() as folder:
        events = Path(folder) / "events.json"
        env = {"PYTHONPATH": f"{_TRACER}{os.pathsep}{_ROOT}", "FANOUT_TIMELINE": str(events)}
        async with _STARTS[kind](env) as server:
            yield server, events


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far (all its threads): pages the
    kernel gave it as it touched them, such as heap it grew again."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def round_timeline(sent: float, times: list[float], events: list[list[Any]]) -> dict[str, Any]:
    """One round's figures (see the module's docstring), from the send time,
    the clients' receipt times and the server's events."""
    times = sorted(times)
    last = times[-1]
    mine = [e for e in events if sent <= e[1] <= last + 0.2]
    line: dict[str, Any] = {"first": _ms(times[0] - sent),
                            "median": _ms(times[len(times) // 2] - sent),
                            "last": _ms(last - sent)}
    for step in _STEPS:
        at = [e[1] for e in mine if e[0] == step]
        if at:
            line[step] = _ms(at[0] - sent)
    pushes = [e[1] for e in mine if e[0] == "push"]
    if len(pushes) > 1:
        gaps = sorted(b - a for a, b in itertools.pairwise(pushes))
        line["pushes"] = [_ms(pushes[0] - sent), _ms(pushes[-1] - sent)]
        line["per_stream_us"] = [round(gaps[len(gaps) // 2] * 1e6),
                                 round(gaps[int(len(gaps) * 0.9)] * 1e6)]
        line["descheduled"] = _ms(sum(g for g in gaps if g > 0.001))
        line["acks_before_last_push"] = sum(
            1 for e in mine if e[0] == "request" and e[1] < pushes[-1])
    collections = [e for e in mine if e[0].startswith("gc")]
    line["gc"] = [len(collections), round(sum(e[2] for e in collections), 1)]
    return line


async def run(kind: str, streams: int, rounds: int, worker_count: int) -> list[dict[str, Any]]:
    """One run of ``rounds`` updates to ``streams`` streams of a fresh ``kind`` server."""
    sent_and_times: list[tuple[float, list[float], int]] = []
    async with traced(kind) as (server, events), fanout.keeper(server.target):
        await asyncio.sleep(0.5)
        async with workers(fanout.worker_main, streams, worker_count, server.target, 1,
                           each=[None] * worker_count) as clients:
            clients.send("storm")
            await clients.next_messages()
            await asyncio.sleep(0.5)
            for round_no in range(rounds):
                port = 1000 + round_no
                clients.send(version_of(endpoints(NAME, port)))
                await asyncio.sleep(0.2)  # let workers start reading
                faults = minor_faults(server.pid)
                sent = time.monotonic()
                await server.change(port)
                times = [t for ts in await clients.next_messages() for t in ts]
                await asyncio.sleep(0.3)  # the last ACKs
                sent_and_times.append((sent, times, minor_faults(server.pid) - faults))
            clients.send(None)
        await asyncio.sleep(1.0)  # the tracer's last write
        written = json.loads(events.read_text())
    recorded = sorted((name, at, detail) for name, times in written["times"].items()
                      for at, detail in zip(times, written["details"][name], strict=True))
    if not any(event[0] == "push" for event in recorded):
        print(f"{kind}: no pushes traced (the tracer wrapped its methods too late)", flush=True)
    return [{**round_timeline(sent, times, recorded), "minor_faults": faults}
            for sent, times, faults in sent_and_times]


async def run_all(args: argparse.Namespace) -> None:
    kinds = args.servers.split(",")
    summary: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for run_no in range(args.runs):
        shift = run_no % len(kinds)
        for kind in [*kinds[shift:], *kinds[:shift]]:
            for line in await run(kind, args.streams, args.rounds, args.workers):
                summary[kind].append(line)
                print(json.dumps({"server": kind, "streams": args.streams, **line}), flush=True)
    print(f"\nmedian over rounds, {args.streams} streams, load {os.getloadavg()[0]:.1f}:")
    for kind, lines in summary.items():
        keys = ["first", "median", "last", *_STEPS]
        cells = [f"{k} {statistics.median(line[k] for line in lines):.1f}"
                 for k in keys if all(k in line for line in lines)]
        if all("pushes" in line for line in lines):
            cells.append("pass {:.1f}".format(statistics.median(
                line["pushes"][1] - line["pushes"][0] for line in lines)))
            cells.append("per stream {:.0f} us".format(statistics.median(
                line["per_stream_us"][0] for line in lines)))
            cells.append("descheduled {:.1f}".format(statistics.median(
                line["descheduled"] for line in lines)))
        print(f"{kind:>16}: " + ", ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", default="relay,relay-no-window,bare-default",
                        help=f"a subset of {','.join(_STARTS)}")
    args = parser.parse_args()
    if unknown := set(args.servers.split(",")) - set(_STARTS):
        parser.error(f"unknown servers: {', '.join(sorted(unknown))}")
    asyncio.run(run_all(args))


if __name__ == "__main__":
    main()
