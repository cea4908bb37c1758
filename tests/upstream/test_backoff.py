"""Backoff: jittered, doubling, capped, reset."""

from __future__ import annotations

import pytest

from relay.upstream.backoff import Backoff


def test_doubles_up_to_the_cap_with_jitter_in_upper_half() -> None:
    low = Backoff(0.5, 30.0, rand=lambda: 0.0)
    high = Backoff(0.5, 30.0, rand=lambda: 1.0)
    lows = [low.next_delay() for _ in range(9)]
    highs = [high.next_delay() for _ in range(9)]
    assert highs == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert lows == [h / 2 for h in highs]


def test_reset_starts_over() -> None:
    backoff = Backoff(0.5, 30.0, rand=lambda: 1.0)
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == 0.5


@pytest.mark.parametrize("initial,maximum", [(0, 1), (-1, 1), (2, 1)])
def test_rejects_nonsense(initial: float, maximum: float) -> None:
    with pytest.raises(ValueError):
        Backoff(initial, maximum)
