"""The relay's own recent history, for the console's charts: a bounded ring
of one point per second, and the task that samples it.

A :class:`Reading` is what one process measures of itself at one moment:
its connected streams and resident memory, and the running totals of its
pushes, NACKs, push latency and event-loop lag (the same tallies
``/metrics`` serves). A :class:`History` turns consecutive readings into
:class:`Point` s (per-second rates, the interval's latency and lag) and
keeps the last ``capacity`` of them; it does no I/O and takes the time it
is given, so it is tested with made-up readings. Readings come keyed by
process (one key for a relay, one per worker for ``--workers``): each
process's totals are differenced on their own, so a worker that restarts
(its totals back at zero) costs one interval of its own rates, not a
negative rate for all.

:class:`Sampler` is the thin loop around it: every ``interval`` it awaits
its ``read`` and adds what it got. :func:`relay_reading` is the reading of
a relay process, cheap enough for once a second at 10,000 streams: plain
sums over the hot tallies' bounded labels, ``len()`` of the streams, one
read of ``/proc/self/statm``; it never collects the whole registry (whose
per-stream gauges cost tens of milliseconds there).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from relay.clock import Clock, MonotonicClock, ended
from relay.telemetry import LOOP_LAG_BUCKETS, PUSH_LATENCY_BUCKETS, HotCounter, HotHistogram

__all__ = ["CAPACITY", "INTERVAL", "History", "Point", "Reading", "Sampler", "Tally",
           "process_rss", "relay_reading"]

log = logging.getLogger("relay.console")

#: Seconds between two points.
INTERVAL = 1.0
#: Points kept: ten minutes at one a second (about 100 bytes each).
CAPACITY = 600


@dataclass(frozen=True, slots=True)
class Tally:
    """A histogram's running totals: observations per bucket (the last is
    +Inf, not cumulative) and their sum. ``bounds`` are the upper bounds."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float = 0.0

    @classmethod
    def empty(cls, bounds: tuple[float, ...]) -> Tally:
        return cls(bounds, (0,) * (len(bounds) + 1))

    @property
    def count(self) -> int:
        return sum(self.counts)

    def since(self, before: Tally) -> Tally:
        """What was observed after ``before`` (this tally itself when the
        process started over, or its buckets changed, in between)."""
        if before.bounds != self.bounds or any(
                now < then for now, then in zip(self.counts, before.counts, strict=True)):
            return self
        return Tally(self.bounds, tuple(now - then for now, then in
                                        zip(self.counts, before.counts, strict=True)),
                     max(0.0, self.total - before.total))

    def plus(self, other: Tally) -> Tally:
        """Both tallies in one (same bounds)."""
        return Tally(self.bounds, tuple(a + b for a, b in
                                        zip(self.counts, other.counts, strict=True)),
                     self.total + other.total)

    def mean(self) -> float | None:
        count = self.count
        return self.total / count if count else None

    def quantile_bound(self, quantile: float) -> float | None:
        """The upper bound of the bucket holding the ``quantile``-th observation
        (None: no observation; ``inf``: beyond the last bound)."""
        count = self.count
        if not count:
            return None
        wanted, seen = quantile * count, 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            seen += n
            if seen >= wanted:
                return bound
        return float("inf")

    def to_json(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "total": self.total}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], bounds: tuple[float, ...]) -> Tally:
        counts = tuple(int(n) for n in data["counts"])
        if len(counts) != len(bounds) + 1:
            return cls.empty(bounds)
        return cls(bounds, counts, float(data["total"]))


_NO_LATENCY = Tally.empty(PUSH_LATENCY_BUCKETS)
_NO_LAG = Tally.empty(LOOP_LAG_BUCKETS)


@dataclass(frozen=True, slots=True)
class Reading:
    """One process at one moment: gauges as they are, counters as running totals."""

    clients: int            # downstream streams connected now
    rss: int                # resident memory, bytes (0: unknown)
    pushes: int = 0         # responses sent to clients so far
    nacks: int = 0          # NACKs received from clients so far
    latency: Tally = _NO_LATENCY    # per pushed response, seconds
    lag: Tally = _NO_LAG            # how late the loop ran, seconds

    def to_json(self) -> dict[str, Any]:
        """What a worker sends the hub (see :mod:`relay.console.workers`)."""
        return {"clients": self.clients, "rss": self.rss, "pushes": self.pushes,
                "nacks": self.nacks, "latency": self.latency.to_json(),
                "lag": self.lag.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reading:
        return cls(int(data["clients"]), int(data["rss"]), int(data["pushes"]),
                   int(data["nacks"]), Tally.from_json(data["latency"], PUSH_LATENCY_BUCKETS),
                   Tally.from_json(data["lag"], LOOP_LAG_BUCKETS))


@dataclass(frozen=True, slots=True)
class Point:
    """One second of the relay: what the charts draw.

    Latencies and lags are seconds; None where nothing was observed in the
    interval. ``*_p99`` is the upper bound of the bucket that holds the 99th
    percentile (the tallies keep buckets, not values); ``lag_max`` that of
    the highest bucket that was reached.
    """

    at: float                   # Unix time
    clients: int
    pushes_per_s: float
    nacks_per_s: float
    latency_mean: float | None
    latency_p99: float | None
    lag_mean: float | None
    lag_max: float | None
    rss: int

    def to_json(self) -> list[Any]:
        """A compact row (the order of :data:`POINT_FIELDS`)."""
        return [round(self.at, 3), self.clients, round(self.pushes_per_s, 2),
                round(self.nacks_per_s, 2), _finite(self.latency_mean),
                _finite(self.latency_p99), _finite(self.lag_mean), _finite(self.lag_max),
                self.rss]


#: The fields of a point as :meth:`Point.to_json` lists them.
POINT_FIELDS = ("at", "clients", "pushes_per_s", "nacks_per_s", "latency_mean",
                "latency_p99", "lag_mean", "lag_max", "rss")


def _finite(value: float | None) -> float | str | None:
    if value is None:
        return None
    return "inf" if value == float("inf") else round(value, 6)


class History:
    """The last ``capacity`` points, from readings added once per interval (no I/O)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._points: deque[Point] = deque(maxlen=capacity)
        self._last: dict[str, tuple[float, Reading]] = {}

    @property
    def capacity(self) -> int:
        maxlen = self._points.maxlen
        assert maxlen is not None
        return maxlen

    def add(self, at: float, readings: Mapping[str, Reading]) -> Point | None:
        """Take the readings of every process at Unix time ``at``; the point
        they make with the previous ones (None for the first, which only
        sets the baseline, and when time did not move on)."""
        previous, self._last = self._last, {key: (at, r) for key, r in readings.items()}
        clients = sum(r.clients for r in readings.values())
        rss = sum(r.rss for r in readings.values())
        pushes = nacks = 0.0
        latency = Tally.empty(PUSH_LATENCY_BUCKETS)
        lag = Tally.empty(LOOP_LAG_BUCKETS)
        compared = False
        for key, reading in readings.items():
            before = previous.get(key)
            if before is None:
                continue  # a process seen for the first time: its baseline
            then, old = before
            seconds = at - then
            if seconds <= 0:
                continue
            compared = True
            # a total below the last one: the process started over from zero
            pushes += _increase(reading.pushes, old.pushes) / seconds
            nacks += _increase(reading.nacks, old.nacks) / seconds
            latency = latency.plus(reading.latency.since(old.latency))
            lag = lag.plus(reading.lag.since(old.lag))
        if not compared:
            return None
        point = Point(at, clients, pushes, nacks, latency.mean(), latency.quantile_bound(0.99),
                      lag.mean(), lag.quantile_bound(1.0), rss)
        self._points.append(point)
        return point

    def since(self, after: float | None = None) -> list[Point]:
        """The points taken after Unix time ``after`` (every point for None), oldest first."""
        if after is None:
            return list(self._points)
        # points are in time order: skip from the end
        newer: list[Point] = []
        for point in reversed(self._points):
            if point.at <= after:
                break
            newer.append(point)
        newer.reverse()
        return newer

    def __iter__(self) -> Iterator[Point]:
        return iter(self._points)

    def __len__(self) -> int:
        return len(self._points)


def _increase(now: int, before: int) -> int:
    return now - before if now >= before else now


class Sampler:
    """Adds ``read()``'s readings to ``history`` every ``interval`` seconds
    while started; a read that fails is logged (once per kind of failure
    in a row) and skipped."""

    def __init__(self, read: Callable[[], Awaitable[Mapping[str, Reading]]], history: History,
                 interval: float = INTERVAL, clock: Clock | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.history = history
        self._read = read
        self._interval = interval
        self._clock = clock or MonotonicClock()
        self._wall = wall
        self._task: asyncio.Task[None] | None = None
        self._failing: str | None = None

    def start(self) -> None:
        """Start sampling (on the running loop). Idempotent."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="console history")

    async def stop(self) -> None:
        """Stop sampling. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await ended(task)

    async def sample(self) -> Point | None:
        """Take one reading now and add it (what each interval does)."""
        try:
            readings = await self._read()
        except Exception as error:  # a worker's odd answer must not end the sampling
            what = type(error).__name__
            if self._failing != what:
                log.warning("console history: reading failed (%s: %s); retrying every %gs",
                            what, error, self._interval)
            self._failing = what
            return None
        self._failing = None
        return self.history.add(self._wall(), readings)

    async def _run(self) -> None:
        next_at = self._clock.now()
        while True:
            await self.sample()
            # on a fixed schedule: a slow read does not stretch the interval
            next_at = max(next_at + self._interval, self._clock.now())
            await self._clock.sleep(next_at - self._clock.now())


def process_rss() -> int:
    """This process's resident memory in bytes (0 where ``/proc`` is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def tally(histogram: HotHistogram) -> Tally:
    """The running totals of a :class:`HotHistogram`, all its labels together."""
    bounds = histogram.bounds
    counts = [0] * (len(bounds) + 1)
    total = 0.0
    for family in histogram.collect():
        # cumulative buckets per label set: back to counts per bucket
        cumulative: dict[tuple[tuple[str, str], ...], list[float]] = {}
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            if sample.name.endswith("_bucket"):
                cumulative.setdefault(labels, []).append(sample.value)
            elif sample.name.endswith("_sum"):
                total += sample.value
        for values in cumulative.values():
            for i, (now, before) in enumerate(zip(values, [0.0, *values[:-1]], strict=True)):
                counts[i] += int(now - before)
    return Tally(bounds, tuple(counts), total)


def relay_reading(streams: Callable[[], int], pushes: HotCounter, nacks: HotCounter,
                  latency: HotHistogram, lag: HotHistogram) -> Reading:
    """The reading of this relay process, from its instruments and its count of streams."""
    return Reading(clients=streams(), rss=process_rss(), pushes=sum(pushes.counts.values()),
                   nacks=sum(nacks.counts.values()), latency=tally(latency), lag=tally(lag))
