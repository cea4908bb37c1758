"""Giving memory back (relay.memory): when the policy says to, against an
injected clock, and what the return does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import Update
from relay.core import Core
from relay.memory import (
    ALLOCATOR,
    ALLOCATOR_ENVIRONMENT,
    ARENAS,
    LARGE,
    MMAP_THRESHOLD,
    STREAM,
    TRIM_THRESHOLD,
    MemoryReturn,
    ReturnPolicy,
    exec_with_allocator,
    malloc_trim,
    oversized,
    reuse_large_blocks,
)
from relay.protocol.limits import DEFAULT_LIMITS
from relay.server.serving import ServingSettings
from relay.server.streams import DownstreamStream
from relay.xds_types import ENDPOINT
from tests.ports import free_port


class Clock:
    def __init__(self) -> None:
        self.time = 100.0

    def now(self) -> float:
        return self.time


def policy(clock: Clock) -> ReturnPolicy:
    return ReturnPolicy(clock.now, interval=5.0, settle=1.0, patience=10.0, large=100)


def test_nothing_is_given_back_until_enough_was_let_go() -> None:
    clock = Clock()
    rules = policy(clock)
    assert rules.let_go(60) is None and rules.due_in() is None
    assert rules.let_go(40) == 1.0  # 100 in all: once nothing more goes for a second
    assert rules.due_in() == 1.0


def test_letting_go_that_goes_on_puts_the_return_off_up_to_the_patience() -> None:
    clock = Clock()
    rules = policy(clock)
    assert rules.let_go(100) == 1.0
    for _ in range(6):
        clock.time += 0.9
        assert rules.let_go(100) is None  # already set: only moved
        assert rules.due_in() == pytest.approx(1.0)
    clock.time += 4.0  # 9.4 s after the first: the patience ends at 10
    rules.let_go(100)
    assert rules.due_in() == pytest.approx(0.6)


def test_returns_are_an_interval_apart_and_count_afresh() -> None:
    clock = Clock()
    rules = policy(clock)
    rules.let_go(100)
    clock.time += 1.0
    assert rules.due_in() == 0.0
    rules.give_back()
    assert rules.due_in() is None
    clock.time += 0.5
    assert rules.let_go(99) is None  # counted from zero again
    assert rules.let_go(1) == pytest.approx(4.5)  # 5 s after the last return


def test_without_an_event_loop_memory_is_given_back_at_once() -> None:
    clock = Clock()
    calls: list[str] = []
    returner = MemoryReturn(ReturnPolicy(clock.now, settle=0.0), trim=lambda: calls.append("trim"),
                            collect=lambda: calls.append("collect"))
    returner.let_go(LARGE - 1)
    assert calls == [] and returner.returns == 0
    returner.let_go(1)
    assert calls == ["collect", "trim"] and returner.returns == 1


async def test_on_the_event_loop_memory_is_given_back_once_letting_go_stops() -> None:
    calls: list[str] = []
    given_back = asyncio.Event()

    def collect() -> None:
        calls.append("collect")
        given_back.set()

    loop = asyncio.get_running_loop()
    returner = MemoryReturn(ReturnPolicy(loop.time, settle=0.5, patience=5.0, large=10),
                            trim=None, collect=collect)
    started = loop.time()
    for _ in range(5):
        returner.let_go(10)
        await asyncio.sleep(0.01)
    assert calls == []  # still letting go
    await asyncio.wait_for(given_back.wait(), 5.0)
    assert loop.time() - started >= 0.5  # half a second after the last of it
    await asyncio.sleep(0.1)
    assert calls == ["collect"] and returner.returns == 1  # once for all (no trim given)


def test_a_refused_request_alone_is_enough() -> None:
    calls: list[str] = []
    clock = Clock()
    returner = MemoryReturn(ReturnPolicy(clock.now, settle=0.0), collect=lambda: calls.append("c"))
    returner.let_go()
    assert calls == ["c"]


def test_a_table_far_larger_than_what_it_holds_is_oversized() -> None:
    table = dict.fromkeys(range(100_000))
    assert not oversized(table)
    for key in range(99_990):
        del table[key]
    assert oversized(table)  # dicts keep their size as entries go
    assert not oversized(dict(table))  # a copy is as small as what it holds
    assert not oversized({})


def test_a_table_a_fifth_of_what_it_was_is_oversized() -> None:
    # A client of 100,000 names leaving 20,000 lingering (upstream.linger_names):
    # the tables keyed by name are copied down to what is left.
    table = dict.fromkeys(f"made-up-{i}" for i in range(100_000))
    for key in list(table)[:60_000]:
        del table[key]
    assert not oversized(table)  # 40 %: kept
    for key in list(table)[:20_000]:
        del table[key]
    assert oversized(table)
    assert not oversized(dict(table))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_relay_command_starts_again_with_glibcs_malloc_and_one_heap_unless_they_are_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["python3", "-X", "dev", "-m", "relay", "run"]
    monkeypatch.setattr(sys, "orig_argv", argv)
    started: list[tuple[str, list[str], dict[str, str]]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        started.append((path, argv, env))

    exec_with_allocator({"HOME": "/home/relay"}, execve)
    assert started == [(sys.executable, argv, {"HOME": "/home/relay", "PYTHONMALLOC": ALLOCATOR,
                                               "MALLOC_ARENA_MAX": str(ARENAS)})]
    assert ARENAS == 1
    started.clear()
    # the operator's choice, kept: only what it leaves out is added
    exec_with_allocator({"PYTHONMALLOC": "pymalloc"}, execve)
    exec_with_allocator({"MALLOC_ARENA_MAX": "4"}, execve)
    assert started == [(sys.executable, argv, {"PYTHONMALLOC": "pymalloc",
                                               "MALLOC_ARENA_MAX": str(ARENAS)}),
                       (sys.executable, argv, {"MALLOC_ARENA_MAX": "4",
                                               "PYTHONMALLOC": ALLOCATOR})]
    started.clear()
    exec_with_allocator(dict(ALLOCATOR_ENVIRONMENT), execve)  # started again already
    exec_with_allocator({"PYTHONMALLOC": "pymalloc", "MALLOC_ARENA_MAX": "2"}, execve)
    assert started == []


REPO = Path(__file__).resolve().parent.parent


def proc_file(pid: int, name: str) -> list[bytes]:
    """``/proc/<pid>/<name>``'s NUL-separated fields."""
    return Path(f"/proc/{pid}/{name}").read_bytes().split(b"\0")


async def healthy(admin_port: int, timeout: float = 30.0) -> None:
    """Until the relay on ``admin_port`` answers /healthz (bounded)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", admin_port)
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)
            continue
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        try:
            status = await reader.readline()
        except OSError:  # reset: as good as closed without an answer
            status = b""
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        if not status and asyncio.get_running_loop().time() <= deadline:
            # closed without an answer: a listener not serving HTTP yet (or
            # another's, on a port free_port gave away meanwhile): ask again
            await asyncio.sleep(0.05)
            continue
        assert status.startswith(b"HTTP/1.1 200"), status
        return


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
@pytest.mark.parametrize(("environment", "allocator"),
                         [({}, "malloc"), ({"PYTHONMALLOC": "pymalloc"}, "pymalloc")])
async def test_xds_relay_run_allocates_with_glibcs_malloc_from_one_heap(
        tmp_path: Path, environment: dict[str, str], allocator: str) -> None:
    admin = free_port()
    config = tmp_path / "relay.yaml"
    config.write_text(f"""
node: {{id: allocator}}
server: {{address: "127.0.0.1:{free_port()}"}}
admin: {{address: "127.0.0.1:{admin}"}}
upstream: {{address: "127.0.0.1:{free_port()}"}}
""")
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENVIRONMENT} | environment
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay", "run", "--config", str(config), cwd=REPO, env=env,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        await healthy(admin)
        # the same process, started again: its environment and command line as execve left them
        environ = proc_file(process.pid, "environ")
        assert f"PYTHONMALLOC={allocator}".encode() in environ
        assert b"MALLOC_ARENA_MAX=1" in environ
        assert proc_file(process.pid, "cmdline")[:3] == [sys.executable.encode(), b"-m",
                                                         b"relay"]
    finally:
        process.terminate()
        assert await process.wait() == 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_glibc_trims_and_takes_the_relays_thresholds() -> None:
    trim = malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)  # 1: some memory went back
    assert reuse_large_blocks()


#: Page faults of 5 rounds of ``sys.argv[3]`` buffers of 512 KiB, written
#: whole, held at once and freed, after a first such round, with glibc's
#: thresholds set to ``sys.argv[1:3]`` (mmap, trim).
_FAULTS = """
import resource, sys
from relay.memory import reuse_large_blocks
mmap_threshold, trim_threshold, held = map(int, sys.argv[1:])
assert reuse_large_blocks(mmap_threshold, trim_threshold)
def one_round():
    blocks = [b"x" * (512 << 10) for _ in range(held)]
    del blocks
one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    one_round()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_HUGE_PAGES_ALWAYS = _THP.exists() and "[always]" in _THP.read_text()
_PAGES = 128  # (a buffer of 512 KiB)


def _printed_with_glibcs_malloc(script: str, *args: str, heap_per_thread: bool = False) -> str:
    """What ``script`` prints, run with ``args`` in a process of its own that
    allocates as the relay's does (:data:`ALLOCATOR_ENVIRONMENT`), or with
    glibc's heap per thread; it fails unless the script exits 0."""
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENVIRONMENT}
    env |= ALLOCATOR_ENVIRONMENT
    if heap_per_thread:
        del env["MALLOC_ARENA_MAX"]
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, check=True, timeout=60, env=env).stdout


def _faults(mmap_threshold: int, trim_threshold: int, held: int) -> int:
    return int(_printed_with_glibcs_malloc(_FAULTS, str(mmap_threshold), str(trim_threshold),
                                           str(held)))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_large_block_freed_is_used_again_without_page_faults() -> None:
    assert _faults(MMAP_THRESHOLD, TRIM_THRESHOLD, 1) < 50
    if _HUGE_PAGES_ALWAYS:
        return  # (a block mapped afresh faults a few huge pages: no contrast to show)
    # the relay's setting before the ninth round: each block mapped afresh faults every page
    assert _faults(256 << 10, 1 << 20, 1) >= 5 * _PAGES


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_megabytes_freed_at_once_are_used_again_without_page_faults() -> None:
    held = 12  # 6 MiB, as a cold join's origin response frees at once (4-8 MiB)
    assert held * (512 << 10) < TRIM_THRESHOLD
    assert _faults(MMAP_THRESHOLD, TRIM_THRESHOLD, held) < 50
    if _HUGE_PAGES_ALWAYS:
        return
    # a heap's top given back once 1 MiB is free there (the ninth round's
    # setting): each round faults again all but that MiB of it
    assert _faults(MMAP_THRESHOLD, 1 << 20, held) >= 5 * (held - 2) * _PAGES


#: What a thread freed, once the relay trims: the resident bytes left.
_THREAD_FREES = """
import threading
from relay.console.history import process_rss as resident_bytes
from relay.memory import TRIM_THRESHOLD, malloc_trim, reuse_large_blocks
def allocate_and_free():  # 6 MiB in blocks under both thresholds, as gRPC's threads allocate
    # (small blocks freed first, so that the loop's own come from them, not
    # from between the large ones: those then lie together at the heap's top)
    small = [str(n) for n in range(10_000)]
    del small
    blocks = [b"x" * (256 << 10) for _ in range(24)]
    assert 24 * (256 << 10) < TRIM_THRESHOLD
    del blocks
assert reuse_large_blocks()
before = resident_bytes()
thread = threading.Thread(target=allocate_and_free)
thread.start()
thread.join()
malloc_trim()()
print(resident_bytes() - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or sys.platform != "linux",
                    reason="glibc's malloc, Linux's /proc")
def test_what_another_thread_freed_goes_back_with_the_trim() -> None:
    assert int(_printed_with_glibcs_malloc(_THREAD_FREES)) < 1 << 20
    # with a heap of its own, a thread keeps its heap's free top: the trim cannot reach it
    assert int(_printed_with_glibcs_malloc(_THREAD_FREES, heap_per_thread=True)) >= 4 << 20


# -- where the relay lets go ----------------------------------------------------------


def counting_core(clock: Clock, calls: list[str], settle: float = 0.0) -> Core:
    """A core whose streams and cache ask for memory back (collections counted in ``calls``)."""
    returner = MemoryReturn(ReturnPolicy(clock.now, settle=settle),
                            collect=lambda: calls.append("collect"))
    return Core.create(settings=ServingSettings(memory=returner))


def test_a_stream_holding_many_names_gives_memory_back_once_forgotten() -> None:
    clock, calls = Clock(), []
    core = counting_core(clock, calls)
    small, big = (DownstreamStream(core.serving, "sotw", "ipv4:10.0.0.7:1000") for _ in "ab")
    names = [f"n{i}" for i in range(LARGE)]
    small.handle_request(discovery_pb2.DiscoveryRequest(type_url=ENDPOINT,
                                                        resource_names=names[:10]))
    big.handle_request(discovery_pb2.DiscoveryRequest(type_url=ENDPOINT, resource_names=names))
    core.serving.leave(small)
    assert calls == []  # ten names: not worth a collection
    core.serving.leave(big)  # no event loop: forgotten at once
    assert calls == ["collect"]


def test_streams_that_leave_count_for_more_than_their_names() -> None:
    clock, calls = Clock(), []
    core = counting_core(clock, calls)
    streams = [DownstreamStream(core.serving, "delta", f"ipv4:10.0.0.7:{port}")
               for port in range(LARGE // STREAM)]
    for stream in streams[:-1]:
        core.serving.leave(stream)
    assert calls == []
    core.serving.leave(streams[-1])  # each an idle stream's 35 KB, in all a collection's worth
    assert calls == ["collect"]


def test_names_the_cache_forgets_count_towards_giving_memory_back() -> None:
    clock, calls = Clock(), []
    core = counting_core(clock, calls)
    names = [f"n{i}" for i in range(LARGE)]
    core.cache.apply(ENDPOINT, Update(removed=names))
    core.cache.forget(ENDPOINT, names[:-1])
    assert calls == []
    core.cache.forget(ENDPOINT, names[-1:])
    assert calls == ["collect"]


#: A block over the mmap threshold (a large request) written and freed: the
#: resident memory it took, and what is left of it once freed.
_LARGE_BLOCK = """
from relay.console.history import process_rss as resident_bytes
from relay.memory import reuse_large_blocks
assert reuse_large_blocks()
before = resident_bytes()
block = b"x" * (16 << 20)
held = resident_bytes()
del block
print(held - before, resident_bytes() - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or sys.platform != "linux",
                    reason="glibc's malloc, Linux's /proc")
def test_a_block_over_the_mmap_threshold_goes_back_as_it_is_freed() -> None:
    held, left = map(int, _printed_with_glibcs_malloc(_LARGE_BLOCK).split())
    assert held >= 15 << 20 and left < 1 << 20


def test_a_return_without_an_event_loop_trims_once() -> None:
    calls: list[str] = []
    returner = MemoryReturn(ReturnPolicy(Clock().now, settle=0.0),
                            trim=lambda: calls.append("trim"),
                            collect=lambda: calls.append("collect"))
    returner.let_go()
    assert calls == ["collect", "trim"]


async def test_a_return_trims_once_more_a_moment_later() -> None:
    loop = asyncio.get_running_loop()
    calls: list[str] = []
    trimmed_again = asyncio.Event()

    def trim() -> None:
        calls.append("trim")
        if calls.count("trim") == 2:
            trimmed_again.set()

    returner = MemoryReturn(ReturnPolicy(loop.time, settle=0.0), trim=trim,
                            collect=lambda: calls.append("collect"), trim_again=0.01)
    returner.let_go()  # due at once: given back now
    assert calls == ["collect", "trim"]
    await asyncio.wait_for(trimmed_again.wait(), 5.0)
    assert calls == ["collect", "trim", "trim"]
    assert returner.returns == 1


#: Buffers freed just after a return (as gRPC frees a refused request's): the
#: resident bytes that went back as they were freed, and with the trim once more.
_FREED_AFTER_A_RETURN = """
import asyncio
from relay.console.history import process_rss as resident_bytes
from relay.memory import MemoryReturn, ReturnPolicy, TRIM_THRESHOLD, malloc_trim, reuse_large_blocks
async def main():
    loop = asyncio.get_running_loop()
    trim, trims, trimmed_again = malloc_trim(), [], asyncio.Event()
    def counted_trim():
        trim()
        trims.append(1)
        if len(trims) == 2:
            trimmed_again.set()
    returner = MemoryReturn(ReturnPolicy(loop.time, settle=0.0), counted_trim, trim_again=0.01)
    blocks = [b"x" * (256 << 10) for _ in range(24)]  # 6 MiB, under the trim threshold
    assert 24 * (256 << 10) < TRIM_THRESHOLD
    held = resident_bytes()
    returner.let_go()  # given back while the blocks are still held
    blocks.clear()
    freed = resident_bytes()
    await trimmed_again.wait()
    print(held - freed, freed - resident_bytes())
assert reuse_large_blocks()
asyncio.run(main())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or sys.platform != "linux",
                    reason="glibc's malloc, Linux's /proc")
def test_what_is_freed_just_after_a_return_goes_back_with_the_trim_once_more() -> None:
    as_freed, trimmed_again = map(int, _printed_with_glibcs_malloc(_FREED_AFTER_A_RETURN).split())
    assert as_freed < 1 << 20  # freed after the first trim: kept at the heap's top
    assert trimmed_again >= 5 << 20  # until the second


@dataclass
class Context:
    """What DownstreamStream.serve uses of a gRPC servicer context."""

    code: grpc.StatusCode | None = None
    details: str | None = None

    def add_done_callback(self, _callback: object) -> None:
        pass

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError("abort keeps the handler's frames (the request) with gRPC")

    async def write(self, _message: bytes) -> None:
        pass


async def test_a_refused_request_ends_its_stream_with_a_status_and_gives_memory_back() -> None:
    calls: list[str] = []
    given_back = asyncio.Event()
    loop = asyncio.get_running_loop()

    def collect() -> None:
        calls.append("collect")
        given_back.set()

    returner = MemoryReturn(ReturnPolicy(loop.time, settle=0.0), collect=collect)
    core = Core.create(settings=ServingSettings(memory=returner))
    request = discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT,
                                                  resource_names_subscribe=["a"])
    request.node.id = "n" * (DEFAULT_LIMITS.node_size + 1)

    async def requests() -> AsyncIterator[discovery_pb2.DeltaDiscoveryRequest]:
        yield request

    context = Context()
    stream = DownstreamStream(core.serving, "delta", "ipv4:10.0.0.7:1000")
    await stream.serve(requests(), context)  # type: ignore[arg-type]
    assert context.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert context.details == (
        f"the node is {request.node.ByteSize()} bytes; the relay takes nodes of at most "
        f"{DEFAULT_LIMITS.node_size} (limits.node_size)")
    await asyncio.wait_for(given_back.wait(), 5.0)
    assert calls == ["collect"]
