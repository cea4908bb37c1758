"""Time as the relay's timers see it: the monotonic clock in production,
a clock the test drives in tests (no test waits on the wall clock to see a
TTL lapse, a linger end or a drain spread out).

Everything in the relay that waits for a moment in time (TTL expiry, the
upstream's linger, settle and reconcile deadlines, reconnect backoff, the
drain schedule) does it through a :class:`Clock`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """What the relay's timers need of time."""

    def now(self) -> float:
        """Seconds on a clock that never goes back."""

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` on this clock."""

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        """Wait for ``event`` at most ``timeout`` seconds (None: no limit);
        whether it was set."""


class MonotonicClock:
    """The real clock: ``time.monotonic`` and asyncio's own timers."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True


async def wait_until(clock: Clock, event: asyncio.Event, deadline: float | None) -> bool:
    """Wait for ``event`` until ``deadline`` on ``clock`` (None: no limit);
    whether it was set (False: the deadline came first)."""
    timeout = None if deadline is None else max(0.0, deadline - clock.now())
    return await clock.wait(event, timeout)
