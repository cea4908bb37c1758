"""Where the relay's time goes: py-spy flame graphs under the fan-out and big-client loads.

``make profile`` (``python -m benchmarks.profile``) runs a relay
(``xds-relay run``, from ``--relay-src``, default this checkout) under each
load and has py-spy (``pip install -e '.[profile]'``) sample it, attached
to the relay's process for each phase only:

* ``fanout-storm``, ``fanout-updates``: one run of :mod:`benchmarks.fanout`
  (``--streams`` delta streams connect at once, then ``--rounds`` updates
  are fanned out to all of them);
* ``big_client-cold``, ``big_client-warm``, ``big_client-leave``: one client
  subscribes to ``--resources`` ClusterLoadAssignments of ``--size`` bytes
  (default about 1 KB) in one
  request, fetched from the relay's origin (a bare server,
  :mod:`benchmarks.bare`); a second client subscribes to the same while the
  first holds them (from the relay's cache); then both leave. A phase ends
  once the relay is quiet again (as :mod:`benchmarks.big_client` has it).

With ``--bare``, the fan-out load's server is the bare ``grpc.aio`` server
of :mod:`benchmarks.bare` instead (``fanout-bare-storm``,
``fanout-bare-updates``): what any ``grpc.aio`` server spends the same load
on, to tell gRPC's share of the relay's graphs from the relay's own.

Each phase gives ``profile-<phase>.svg`` in ``--out-dir`` (default
``benchmarks/results/``): a flame graph (frames by function, root at the
top; open it in a browser to zoom and search), and ``profile.md`` there
lists, per phase, the functions with the largest share of the samples of
their own (self) and with their callees (total). py-spy samples the
threads that run Python: in a ``grpc.aio`` server that is the event loop's;
gRPC's own threads (its HTTP/2, I/O and TLS) are not in these graphs (their
CPU is the difference between :mod:`benchmarks.fanout`'s server CPU and its
main-thread CPU). With ``--native``, C frames (gRPC's Cython, protobuf's
upb) are unwound too, instead of being counted in the Python frame that
called them. Idle samples (the loop waiting) are left out.

py-spy attaches to a running process with ptrace: as root, or where
``/proc/sys/kernel/yama/ptrace_scope`` is 0 for one's own processes; in a
container it may need ``--cap-add SYS_PTRACE``.

Usage::

    .venv/bin/python -m benchmarks.profile [--loads fanout,big_client] [--streams 1000]
        [--rounds 20] [--resources 10000] [--rate 250] [--native] [--bare] [--relay-src DIR]
        [--out-dir benchmarks/results]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import html
import itertools
import os
import re
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.bare import bare_process
from benchmarks.big_client import client_main, quiet_after
from benchmarks.fanout import bare_server, measure, relay_server
from benchmarks.processes import relay_process, wait_for_worker, workers
from benchmarks.report import markdown, revision

LOADS = ("fanout", "big_client")
# functions listed per phase in profile.md
TOP = 15
# what every stack starts with (the interpreter, asyncio's loop, threads): left
# out of the totals, where it would head every list
_PLUMBING = re.compile(r"\((<frozen runpy>|asyncio/(runners|base_events|events)\.py|threading\.py"
                       r"|relay/__main__\.py|relay/cli\.py):\d+\)$")
# a frame of py-spy's (inferno's) SVG: its title, its depth (y) and its samples (fg:w)
_FRAME = re.compile(r'<g><title>(?P<title>[^<]*?) \((?P<samples>[\d,]+) samples?, [\d.]+%\)'
                    r'</title><rect [^>]*?y="(?P<y>[\d.]+)"[^>]*?fg:x="(?P<x>\d+)" '
                    r'fg:w="(?P<w>\d+)"')


def py_spy() -> str:
    """The py-spy beside this interpreter, or on ``PATH``."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[profile]' (make profile)")
    return found


# -- reading a flame graph -------------------------------------------------------------


@dataclass
class Frame:
    name: str
    depth: float
    x: int
    width: int


def frames(svg: str) -> list[Frame]:
    """The frames of a py-spy flame graph (``all`` and the process's included)."""
    return [Frame(html.unescape(m["title"]), float(m["y"]), int(m["x"]), int(m["w"]))
            for m in _FRAME.finditer(svg)]


def shares(svg: str) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """The graph's samples, and per function its samples of its own (self)
    and with its callees (total; an outermost call only, so that recursion
    counts once), largest first."""
    found = frames(svg)
    if not found:
        return 0, [], []
    # a frame's parent is the frame one level up that spans its x
    levels: dict[float, list[tuple[int, int]]] = {}
    for index, frame in enumerate(found):
        levels.setdefault(frame.depth, []).append((frame.x, index))
    for row in levels.values():
        row.sort()
    depths = sorted(levels)
    step = min((b - a for a, b in itertools.pairwise(depths)), default=1.0)
    parent: list[int | None] = []
    for frame in found:
        row = levels.get(frame.depth - step, [])
        at = bisect.bisect_right(row, (frame.x, len(found))) - 1
        parent.append(row[at][1] if at >= 0 else None)
    children = Counter[int]()
    for index, up in enumerate(parent):
        if up is not None:
            children[up] += found[index].width
    own, total = Counter[str](), Counter[str]()
    top = min(depths)
    for index, frame in enumerate(found):
        if frame.depth <= top + step:  # "all" and the process
            continue
        own[frame.name] += frame.width - children[index]
        ancestor, outermost = parent[index], True
        while ancestor is not None:
            if found[ancestor].name == frame.name:
                outermost = False
                break
            ancestor = parent[ancestor]
        if outermost:
            total[frame.name] += frame.width
    samples = max(f.width for f in found)
    return samples, own.most_common(), total.most_common()


def summary(phase: str, svg: Path, top: int = TOP) -> str:
    """``profile.md``'s section for one phase."""
    samples, own, total = shares(svg.read_text())
    if not samples:
        return f"### {phase}\n\nno samples (`{svg.name}`)\n"
    rows = [[f"`{name}`", f"{count / samples:.1%}", f"{dict(total).get(name, 0) / samples:.1%}"]
            for name, count in own[:top]]
    totals = [[f"`{name}`", f"{count / samples:.1%}"]
              for name, count in [t for t in total if not _PLUMBING.search(t[0])][:top]]
    return (f"### {phase}\n\n`{svg.name}`, {samples} samples.\n\n"
            f"{markdown(['function (self, most first)', 'self', 'total'], rows)}\n\n"
            f"{markdown(['function (total, most first; not the loop itself)', 'total'], totals)}\n")


# -- recording ----------------------------------------------------------------------------


class Spy:
    """py-spy, attached to a process for a phase at a time."""

    def __init__(self, out_dir: Path, rate: int, native: bool) -> None:
        self.out_dir = out_dir
        self.rate = rate
        self.native = native
        self.recorded: list[tuple[str, Path]] = []
        self._binary = py_spy()

    @contextlib.asynccontextmanager
    async def record(self, phase: str, pid: int) -> AsyncIterator[None]:
        """Samples ``pid`` while inside (from once py-spy says it samples), into
        ``profile-<phase>.svg``."""
        svg = self.out_dir / f"profile-{phase}.svg"
        log = self.out_dir / f"profile-{phase}.log"
        svg.unlink(missing_ok=True)
        with log.open("wb") as output:
            spy = await asyncio.create_subprocess_exec(
                self._binary, "record", "--pid", str(pid), "--rate", str(self.rate),
                "--format", "flamegraph", "--function", "--output", str(svg),
                *(["--native"] if self.native else []), stdout=output, stderr=output)
        try:
            deadline = time.monotonic() + 30
            while b"Sampling process" not in log.read_bytes():
                if spy.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"py-spy did not start: {log.read_text()!r}")
                await asyncio.sleep(0.05)
            yield
        finally:
            if spy.returncode is None:
                spy.send_signal(signal.SIGINT)  # it writes the graph, then exits
                try:
                    await asyncio.wait_for(spy.wait(), 60)
                except TimeoutError:
                    spy.kill()
                    await spy.wait()
        if not svg.exists():
            raise RuntimeError(f"py-spy wrote no {svg}: {log.read_text()!r}")
        log.unlink()
        self.recorded.append((phase, svg))
        print(f"{phase}: {svg}", file=sys.stderr, flush=True)

    def phases(self, prefix: str) -> Callable[[str, int], AbstractAsyncContextManager[None]]:
        """A hook for :func:`benchmarks.fanout.measure`: ``<prefix>-<phase>``."""
        return lambda phase, pid: self.record(f"{prefix}-{phase}", pid)


# -- the loads ------------------------------------------------------------------------------


async def fanout(spy: Spy, args: argparse.Namespace) -> dict[str, Any]:
    def start() -> AbstractAsyncContextManager[Any]:
        return bare_server() if args.bare else relay_server(src=args.relay_src)

    return await measure(start, args.streams, args.rounds, args.workers, 1,
                         phases=spy.phases("fanout-bare" if args.bare else "fanout"))


async def big_client(spy: Spy, args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    async with bare_process(args.resources, args.size) as origin, \
            relay_process("profile-big-client", origin.port, drain_period=0,
                          src=args.relay_src) as relay, \
            workers(client_main, 2, 2, relay.target, args.resources) as clients:
        pid = relay.process.pid
        await quiet_after(pid, args.timeout)
        for phase, index in (("cold", 0), ("warm", 1)):
            pipe, proc = clients.pipes[index], clients.processes[index]
            async with spy.record(f"big_client-{phase}", pid):
                pipe.send("join")
                reply = await asyncio.wait_for(wait_for_worker(pipe, proc), args.timeout)
                if "error" in reply:
                    raise RuntimeError(f"big client, {phase}: {reply['error']}")
                await quiet_after(pid, args.timeout)
            figures[f"{phase}_join_ms"] = round((reply["done"] - reply["sent"]) * 1000, 1)
        async with spy.record("big_client-leave", pid):
            for pipe, proc in zip(clients.pipes, clients.processes, strict=True):
                pipe.send("leave")
                await wait_for_worker(pipe, proc)
            await quiet_after(pid, args.timeout)
    return figures


async def run_all(spy: Spy, args: argparse.Namespace, loads: list[str]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    if "fanout" in loads:
        figures["fanout"] = await fanout(spy, args)
    if "big_client" in loads:
        figures["big_client"] = await big_client(spy, args)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loads", default=",".join(LOADS), help=f"a subset of {','.join(LOADS)}")
    parser.add_argument("--streams", type=int, default=1000, help="fan-out: streams")
    parser.add_argument("--rounds", type=int, default=20, help="fan-out: updates")
    parser.add_argument("--workers", type=int, default=2, help="fan-out: client processes")
    parser.add_argument("--resources", type=int, default=10000, help="big client: K")
    parser.add_argument("--size", type=int, default=1024,
                        help="big client: bytes per resource (about)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="big client: seconds a phase may take")
    parser.add_argument("--rate", type=int, default=250, help="py-spy's samples a second")
    parser.add_argument("--native", action="store_true", help="unwind C frames too")
    parser.add_argument("--bare", action="store_true",
                        help="fan-out: profile the bare grpc.aio server, not the relay")
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the tree the relay runs from (default: this checkout)")
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    loads = args.loads.split(",")
    if unknown := set(loads) - set(LOADS):
        parser.error(f"unknown loads: {', '.join(sorted(unknown))}")
    if args.bare and loads != ["fanout"]:
        parser.error("--bare profiles the fan-out load only: --loads fanout")
    args.relay_src = args.relay_src.resolve()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    spy = Spy(args.out_dir, args.rate, args.native)
    figures = asyncio.run(run_all(spy, args, loads))
    server = ("the bare server (benchmarks.bare)" if args.bare
              else f"the relay at {revision(args.relay_src)} ({args.relay_src})")
    heading = (f"# Profiles of {server}\n\n"
               f"`python -m benchmarks.profile {' '.join(sys.argv[1:])}`: py-spy at "
               f"{args.rate} Hz{', native frames' if args.native else ''}; "
               f"{os.cpu_count()} CPUs, 1-minute load {os.getloadavg()[0]:.1f} at the end; "
               f"the loads' own figures (under the profiler): {figures}.\n")
    text = "\n".join([heading, *(summary(phase, svg) for phase, svg in spy.recorded)])
    (args.out_dir / "profile.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
