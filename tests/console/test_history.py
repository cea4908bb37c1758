"""The console's history: readings in, one point a second out, a bounded ring."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from relay.console.history import History, Reading, Sampler, Tally, process_rss, tally
from relay.telemetry import LOOP_LAG_BUCKETS, PUSH_LATENCY_BUCKETS, HotHistogram
from tests.clock import ManualClock
from tests.harness import eventually


def latency(*seconds: float) -> Tally:
    histogram = HotHistogram("h", "", ("type",), PUSH_LATENCY_BUCKETS)
    for value in seconds:
        histogram.record(value, "Cluster")
    return tally(histogram)


def test_the_first_reading_is_a_baseline_not_a_point() -> None:
    history = History()
    assert history.add(100.0, {"relay": Reading(clients=3, rss=10)}) is None
    assert len(history) == 0


def test_rates_are_per_second_from_the_running_totals() -> None:
    history = History()
    history.add(100.0, {"relay": Reading(clients=3, rss=10, pushes=100, nacks=1)})
    point = history.add(102.0, {"relay": Reading(clients=4, rss=20, pushes=160, nacks=5)})
    assert point is not None
    assert (point.at, point.clients, point.pushes_per_s, point.nacks_per_s, point.rss) == \
        (102.0, 4, 30.0, 2.0, 20)


def test_latency_is_the_interval_s_alone() -> None:
    history = History()
    history.add(1.0, {"relay": Reading(0, 0, latency=latency(2.0, 2.0))})
    point = history.add(2.0, {"relay": Reading(0, 0, latency=latency(2.0, 2.0, 0.004))})
    assert point is not None
    assert point.latency_mean == pytest.approx(0.004)
    assert point.latency_p99 == 0.005  # the bucket's upper bound


def test_an_interval_with_nothing_observed_has_no_latency() -> None:
    history = History()
    history.add(1.0, {"relay": Reading(0, 0, latency=latency(0.1))})
    point = history.add(2.0, {"relay": Reading(0, 0, latency=latency(0.1))})
    assert point is not None and point.latency_mean is None and point.latency_p99 is None


def test_the_loop_lag_max_is_the_highest_bucket_reached() -> None:
    lag = HotHistogram("lag", "", (), LOOP_LAG_BUCKETS)
    history = History()
    history.add(1.0, {"relay": Reading(0, 0, lag=tally(lag))})
    for value in (0.0005, 0.0005, 0.3):
        lag.record(value)
    point = history.add(2.0, {"relay": Reading(0, 0, lag=tally(lag))})
    assert point is not None
    assert point.lag_max == 0.5 and point.lag_mean == pytest.approx(0.301 / 3)


def test_processes_add_up_and_a_restarted_one_counts_from_zero() -> None:
    history = History()
    history.add(1.0, {"1": Reading(2, 100, pushes=50), "2": Reading(3, 200, pushes=70)})
    # worker 2 restarted: its total fell to 5 (5 pushes since it started)
    point = history.add(2.0, {"1": Reading(2, 100, pushes=60), "2": Reading(1, 50, pushes=5)})
    assert point is not None
    assert (point.clients, point.rss, point.pushes_per_s) == (3, 150, 15.0)


def test_a_process_seen_first_sets_its_baseline() -> None:
    history = History()
    history.add(1.0, {"1": Reading(1, 0, pushes=10)})
    point = history.add(2.0, {"1": Reading(1, 0, pushes=12), "2": Reading(1, 0, pushes=999)})
    assert point is not None and point.pushes_per_s == 2.0 and point.clients == 2


def test_the_ring_keeps_the_last_capacity_points() -> None:
    history = History(capacity=3)
    for second in range(10):
        history.add(float(second), {"relay": Reading(second, 0)})
    assert [p.at for p in history] == [7.0, 8.0, 9.0]


def test_since_gives_the_points_after_a_time() -> None:
    history = History()
    for second in range(5):
        history.add(float(second), {"relay": Reading(0, 0)})
    assert [p.at for p in history.since(2.0)] == [3.0, 4.0]
    assert [p.at for p in history.since(None)] == [1.0, 2.0, 3.0, 4.0]
    assert history.since(4.0) == []


def test_a_reading_survives_its_json() -> None:
    reading = Reading(3, 4096, 10, 2, latency(0.001, 0.2), tally(HotHistogram(
        "lag", "", (), LOOP_LAG_BUCKETS)))
    assert Reading.from_json(reading.to_json()) == reading


def test_this_process_rss_is_known() -> None:
    assert process_rss() > 1024 * 1024


async def test_the_sampler_adds_a_point_every_interval() -> None:
    clock = ManualClock()
    pushes = iter(range(0, 1000, 10))

    async def read() -> Mapping[str, Reading]:
        return {"relay": Reading(1, 0, pushes=next(pushes))}

    wall = iter(float(second) for second in range(100))
    history = History()
    sampler = Sampler(read, history, interval=1.0, clock=clock, wall=lambda: next(wall))
    sampler.start()
    try:
        await eventually(lambda: clock.sleepers())  # the baseline taken, asleep
        for count in range(1, 4):
            await clock.advance(1.0)
            await eventually(lambda count=count: len(history) == count)
        assert [(p.at, p.pushes_per_s) for p in history] == [(1.0, 10.0), (2.0, 10.0),
                                                             (3.0, 10.0)]
    finally:
        await sampler.stop()


async def test_a_failing_read_is_logged_once_and_skipped(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    calls = 0

    async def read() -> Mapping[str, Reading]:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise ValueError("odd answer")
        return {"relay": Reading(1, 0)}

    sampler = Sampler(read, History())
    for _ in range(4):
        await sampler.sample()
    assert [r.getMessage() for r in caplog.records] == [
        "console history: reading failed (ValueError: odd answer); retrying every 1s"]
