"""TokenBucket: the rate new streams are taken at (limits.new_streams_per_second)."""

from __future__ import annotations

import pytest

from relay.admission import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.time = 50.0

    def now(self) -> float:
        return self.time


def test_a_burst_goes_at_once_then_each_waits_its_turn_then_the_rest_are_refused() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10.0, burst=3, now=clock.now, max_wait=0.25)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)
    # A third wait would be 0.3 s, past max_wait: refused, and it takes nothing.
    assert bucket.reserve() is None
    assert bucket.reserve() is None
    clock.time += 0.2  # the two reserved tokens came, and went to those who waited
    assert bucket.reserve() == pytest.approx(0.1)


def test_tokens_come_back_at_the_rate_up_to_the_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2.0, burst=2, now=clock.now, max_wait=0.0)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, None]
    clock.time += 0.5
    assert [bucket.reserve(), bucket.reserve()] == [0.0, None]
    clock.time += 60.0  # an hour of quiet still gives only the burst
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, None]


def test_a_bucket_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError, match="rate above 0"):
        TokenBucket(rate=0.0, burst=1, now=Clock().now)
    with pytest.raises(ValueError, match="burst of at least 1"):
        TokenBucket(rate=1.0, burst=0, now=Clock().now)
