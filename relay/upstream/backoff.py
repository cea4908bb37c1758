"""Reconnect waits: jittered exponential backoff."""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Waits that double from ``initial`` up to ``maximum``, each jittered.

    Each wait is drawn uniformly from [d/2, d] where d is the un-jittered
    delay, so that relays that lost the same origin together do not return
    in lockstep. :meth:`reset` goes back to ``initial`` (call it once the
    origin has answered on a new stream, not merely accepted it).
    """

    def __init__(self, initial: float = 0.5, maximum: float = 30.0,
                 rand: Callable[[], float] = random.random) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError("backoff needs 0 < initial <= maximum")
        self.initial = initial
        self.maximum = maximum
        self._rand = rand
        self._attempt = 0

    def next_delay(self) -> float:
        """The wait before the next attempt."""
        ceiling = min(self.maximum, self.initial * 2.0 ** self._attempt)
        if ceiling < self.maximum:
            self._attempt += 1
        return ceiling / 2 + ceiling / 2 * self._rand()

    def reset(self) -> None:
        self._attempt = 0

    def fresh(self) -> Backoff:
        """A backoff with the same steps and jitter, starting over: a second
        schedule (the primary's probes, while a fallback is in use)."""
        return Backoff(self.initial, self.maximum, self._rand)
