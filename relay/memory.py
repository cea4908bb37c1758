"""Giving memory back once a big client has left or a large request was refused.

A relay's RSS does not fall by itself when what took it goes:

* what a stream held can sit in reference cycles (a refused request's
  exception, its traceback and the frames holding the request), which only a
  full collection frees, and :mod:`relay.runtime` makes those rare;
* CPython returns an arena only once nothing in it is used, and glibc keeps
  what is freed in its heaps (one per thread that allocates: gRPC's own
  threads among them) until asked to give it back (``malloc_trim``).

CPython's arenas are the larger part: a big client's objects fill new 1 MiB
arenas, and once it has gone the few objects allocated meanwhile that live
on (the console's history, a metric's new labels, the origin's last
response) sit in the holes it left, one here and one there, and keep most of
those arenas resident for good: 10 of the 12 a client of 100,000 names took,
11-14 MiB. So ``xds-relay run`` allocates Python's objects with glibc's
malloc (:func:`exec_with_allocator`), whose trim gives back any free page.

So after something large was let go (a stream holding many names forgotten,
names the cache forgot, a large request refused), the relay collects and
asks glibc to trim, at most once per :data:`RETURN_INTERVAL`: a burst of
departures costs one return at its end, not one each. It trims once more a
moment later (:data:`TRIM_AGAIN`), for what gRPC frees after the relay let
go. Measured with ``python -m benchmarks.memory`` (see
docs/performance.md#memory).

The buffers of a big exchange (an origin response of megabytes, its
re-encoding, the bodies checked a slice at a time, a big client's pages)
come from glibc's heaps and go back to them when freed, to be used again by
the next (:func:`reuse_large_blocks`): a block mapped on its own for each,
or a heap's top given back as each is freed, is paid a page fault per 4 KiB
touched, each time (about 3 us on the development machine). What they
leave free goes back with the trims above; a large request is still mapped
on its own, and goes back as it is freed (:data:`MMAP_THRESHOLD`). One heap
serves every thread (:data:`ARENAS`), gRPC's included, so that those trims
reach all of it.

:class:`ReturnPolicy` decides when, without I/O, against an injected clock;
:class:`MemoryReturn` does it on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sized

__all__ = ["ALLOCATOR", "ALLOCATOR_ENVIRONMENT", "ARENAS", "LARGE", "MMAP_THRESHOLD", "PATIENCE",
           "RETURN_INTERVAL", "SETTLE", "STREAM", "TRIM_AGAIN", "TRIM_THRESHOLD", "MemoryReturn",
           "ReturnPolicy", "exec_with_allocator", "malloc_trim", "oversized",
           "reuse_large_blocks"]

log = logging.getLogger("relay.memory")

#: The least time between two returns, in seconds: a full collection walks
#: the whole heap (milliseconds per 100,000 objects), so a relay whose clients
#: come and go all the time collects a few times a minute at most.
RETURN_INTERVAL = 5.0
#: Blocks this large or larger are mapped on their own (see
#: :func:`reuse_large_blocks`): a large request (a 100,000-name subscription,
#: an 8 MiB Node) goes back as it is freed. Smaller ones, the buffers of an
#: ordinary big exchange (an origin response of 2,000 resources of 300 B is
#: 0.8 MB), come from the heaps and are used again. At 4 MiB a client of
#: 100,000 names cost 56-60 MiB at its peak, against 47-51 (1 MiB: 48-51).
MMAP_THRESHOLD = 1024 * 1024
#: Free memory at the top of a heap that glibc keeps rather than giving back
#: as a block is freed (see :func:`reuse_large_blocks`): checking each of a
#: cold join's origin responses frees 4-8 MiB there (the bodies decoded, a
#: slice of about 1 MB at a time: relay.upstream.bulk.SLICE_BYTES) that the
#: next one uses again, and so do a warm join's responses. At 1 MiB, 4 MiB or
#: less, the relay's main thread faulted 8,600-10,500 times a cold join of
#: 10,000 names of 300 B; at 8 MiB, 4,800-6,000. At 8 MiB a slice of 1 KB
#: bodies (7.9 MiB decoded) with what else lay free there went over, and the
#: next slice faulted it in again: 21,400-22,900 faults a cold join of 10,000
#: names of 1 KB, against 12,300-13,200 at 16 MiB. The relay's trims give it
#: back once clients have left (:class:`MemoryReturn`).
TRIM_THRESHOLD = 16 * 1024 * 1024
_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
#: How long nothing more must be let go before memory is given back, in
#: seconds: by then the stream that held it has ended and gRPC has let go of
#: its call.
SETTLE = 1.0
#: The longest memory waits for letting go to stop, from the first of it.
PATIENCE = 10.0
#: How long after a return the heaps are trimmed once more, in seconds: gRPC
#: frees a refused request's buffers a moment after the relay let it go (80
#: MiB for ten 8 MiB Nodes, within half a second), and up to
#: :data:`TRIM_THRESHOLD` of what it frees would otherwise stay at a heap's
#: top (8.2-16.3 MiB left after ten refused Nodes, against 0.2 with the trim
#: once more).
TRIM_AGAIN = 1.0
#: How much must have been let go since the last return for another: names
#: (each a few hundred bytes in the stream, the interest index, the upstream
#: and the cache), or one large request (worth this much by itself).
LARGE = 2_000
#: What a stream costs beyond its names, counted in names: its gRPC call and
#: buffers and its session, about 35 KB (``benchmarks.memory``'s idle streams).
STREAM = 50


class ReturnPolicy:
    """When to give memory back.

    Once :data:`LARGE` names (or a large request) were let go since the last
    return, memory is given back when nothing more has been let go for
    ``settle`` seconds (a client's 100,000 names go over many turns of the
    event loop, the origin's lingering subscriptions over seconds), but no
    later than ``patience`` after the first of it, and never sooner than
    ``interval`` after the last return.
    """

    def __init__(self, now: Callable[[], float], interval: float = RETURN_INTERVAL,
                 settle: float = SETTLE, patience: float = PATIENCE, large: int = LARGE) -> None:
        self._now = now
        self._interval = interval
        self._settle = settle
        self._patience = patience
        self._large = large
        self._let_go = 0
        self._first: float | None = None  # when the first of it was let go
        self._last: float | None = None  # when memory was last given back
        self._due: float | None = None

    def let_go(self, amount: int) -> float | None:
        """``amount`` names were let go (:data:`LARGE` for a large request).
        Returns in how many seconds to give memory back when a return was not
        due yet (one that was may have moved later: see :meth:`due_in`); None
        otherwise, or when too little was let go for one."""
        now = self._now()
        if self._first is None:
            self._first = now
        self._let_go += amount
        if self._let_go < self._large:
            return None
        due = min(now + self._settle, self._first + self._patience)
        if self._last is not None:
            due = max(due, self._last + self._interval)
        was_due, self._due = self._due, due
        return None if was_due is not None else due - now

    def due_in(self) -> float | None:
        """Seconds until memory is to be given back (0 or less: now); None if it is not."""
        return None if self._due is None else self._due - self._now()

    def give_back(self) -> None:
        """Memory is given back now: what is let go from now on is counted afresh."""
        self._due = self._first = None
        self._last = self._now()
        self._let_go = 0


#: Dicts whose table takes more than this many bytes per entry are worth
#: copying (see :func:`oversized`): a full one takes 20 to 45 (sets 27 to
#: 55), so a table is copied once about a third of what it was sized for is
#: left (a client of 100,000 names leaving 20,000 lingering: 3.8 MiB copied
#: down to 0.4).
_ROOMY_BYTES_PER_ENTRY = 128
_SMALL_TABLE = 64 * 1024


def oversized(table: Sized) -> bool:
    """Whether a dict (or set) takes far more room than its entries need.

    Neither shrinks as entries go: one that held 100,000 names keeps its
    megabytes when ten are left. A copy is as small as what it holds; where
    many entries may go at once, a copy is made when this says so (it costs
    what is left, and is rare)."""
    size = sys.getsizeof(table)
    return size > _SMALL_TABLE and size > _ROOMY_BYTES_PER_ENTRY * len(table)


def _glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)`` (every arena's free pages back to the system),
    or None where the C library is not glibc."""
    libc = _glibc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


def reuse_large_blocks(mmap_threshold: int = MMAP_THRESHOLD,
                       trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Have glibc serve blocks under ``mmap_threshold`` bytes from its heaps
    and keep up to ``trim_threshold`` free at a heap's top: a big exchange's
    buffers then reuse the pages the last one freed. Whether it took both
    settings.

    By default glibc maps a block of 128 KiB or more on its own and unmaps
    it when freed; it raises that threshold as such blocks are freed (up to
    32 MiB) and trims a heap's top once more than twice that is free there.
    The relay fixed it at 256 KiB instead, so that memory went back at once.
    Either way a block mapped afresh is paid a page fault for each 4 KiB
    written, each time: about 3 us here, so that re-encoding an 841 KB origin
    response took 1.3-1.7 ms, against 0.24 ms in pages already used, and a
    cold join of 10,000 names of 300 B faulted 5,200-7,200 times, 4,500 with
    these settings (``benchmarks.cold_path``, its upstream side alone; see
    :data:`TRIM_THRESHOLD` for the whole join). Settings fixed low enough
    that a large request still goes back as it is freed
    (:data:`MMAP_THRESHOLD`); what the heaps hold free goes back with the
    relay's own trims (:class:`MemoryReturn`).
    """
    libc = _glibc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    took_trim = mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    took_mmap = mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
    return bool(took_trim and took_mmap)


#: Python's object allocator in a relay process (``PYTHONMALLOC``) unless the
#: environment names one: glibc's malloc. Measured with ``python -m
#: benchmarks.memory`` (a client of 100,000 names, 5 s after the 30 s
#: linger): RSS +2-3 % of before, against +12-15 % with CPython's own
#: (``pymalloc``); held per name and server CPU per update
#: (``benchmarks.fanout``) the same within the noise, idle streams 3 % larger.
ALLOCATOR = "malloc"
#: glibc's heaps (arenas) in a relay process unless the environment says
#: (``MALLOC_ARENA_MAX``): one, shared by every thread. By default glibc gives
#: each thread that allocates a heap of its own (up to 8 a core), and its
#: trim never gives back a thread heap's free top, only what is freed above
#: :data:`TRIM_THRESHOLD` does: gRPC's threads would keep up to that much
#: each for good (ten refused 8 MiB Nodes left 21.7 MiB with a threshold of
#: 16 MiB, against 0.2 with one heap). One heap also lets the main thread use
#: what gRPC's threads freed (a cold join faulted about a tenth less).
ARENAS = 1
#: What :func:`exec_with_allocator` adds to a relay process's environment
#: where it says nothing of them: glibc reads ``MALLOC_ARENA_MAX`` as it
#: starts (``mallopt`` would be too late for a thread that has its heap).
ALLOCATOR_ENVIRONMENT = {"PYTHONMALLOC": ALLOCATOR, "MALLOC_ARENA_MAX": str(ARENAS)}


def exec_with_allocator(environ: Mapping[str, str] = os.environ,
                        execve: Callable[[str, list[str], dict[str, str]], object] = os.execve
                        ) -> None:
    """Start this command again, as the same process, with
    :data:`ALLOCATOR_ENVIRONMENT`: :data:`ALLOCATOR` as Python's object
    allocator, :data:`ARENAS` heaps. A variable set already is kept (whatever
    it says: the operator's choice, or this done once); return (doing
    nothing) where both are set, or the C library is not glibc (no trim to
    make it worth it).

    Both are read as the process starts, hence the new start: the process
    keeps its id, its descriptors and its command line (``sys.orig_argv``,
    interpreter options included).
    """
    missing = {name: value for name, value in ALLOCATOR_ENVIRONMENT.items()
               if name not in environ}
    if not missing or _glibc() is None or not sys.executable:
        return
    execve(sys.executable, list(sys.orig_argv), {**environ, **missing})


class MemoryReturn:
    """Gives memory back on the event loop when :class:`ReturnPolicy` says:
    a full collection, then ``malloc_trim`` where there is one, and the trim
    once more ``trim_again`` seconds later (:data:`TRIM_AGAIN`)."""

    def __init__(self, policy: ReturnPolicy, trim: Callable[[], object] | None = None,
                 collect: Callable[[], object] = gc.collect,
                 trim_again: float = TRIM_AGAIN) -> None:
        self._policy = policy
        self._trim = trim
        self._collect = collect
        self._trim_again = trim_again
        self.returns = 0  # how many times memory was given back

    @classmethod
    def for_this_process(cls) -> MemoryReturn:
        """Against the monotonic clock, with glibc's trim if the process has
        it; from now on blocks under :data:`MMAP_THRESHOLD` come from the
        heaps, larger ones are mapped on their own (see
        :func:`reuse_large_blocks`)."""
        reuse_large_blocks()
        return cls(ReturnPolicy(time.monotonic), malloc_trim())

    def let_go(self, amount: int = LARGE) -> None:
        """``amount`` names (by default: one large request) were let go."""
        if self._policy.let_go(amount) is not None:
            self._when_due()

    def _when_due(self) -> None:
        wait = self._policy.due_in()
        if wait is None:
            return
        if wait > 0:
            try:
                asyncio.get_running_loop().call_later(wait, self._when_due)
                return
            except RuntimeError:  # no event loop: at once
                pass
        self._policy.give_back()
        started = time.monotonic()
        self._collect()
        if self._trim is not None:
            self._trim()
            with contextlib.suppress(RuntimeError):  # (no event loop: once)
                asyncio.get_running_loop().call_later(self._trim_again, self._trim)
        self.returns += 1
        log.debug("gave memory back in %.3fs", time.monotonic() - started)
