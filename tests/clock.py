"""A clock for tests: time moves only when the test moves it.

Give it to a :class:`relay.app.Relay` (or :class:`relay.core.Core`): TTLs,
the upstream's deadlines, backoff steps and the drain schedule then wait for
:meth:`ManualClock.advance`, never for the wall clock, so a test asserts what
happens at each moment without racing a busy machine.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class ManualClock:
    """A :class:`relay.clock.Clock` the test advances."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._order = itertools.count()
        # (deadline, order, future): sleepers, soonest first
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), woken))
        await woken

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is None:
            await event.wait()
            return True
        waiter = asyncio.ensure_future(event.wait())
        sleeper = asyncio.ensure_future(self.sleep(timeout))
        try:
            done, _ = await asyncio.wait({waiter, sleeper},
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()
        return waiter in done

    def sleepers(self) -> list[float]:
        """When each pending sleep ends, soonest first."""
        return sorted(deadline for deadline, _, woken in self._sleepers if not woken.done())

    async def advance(self, seconds: float) -> None:
        """Move time on and wake every sleep that has ended; let them run."""
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, woken = heapq.heappop(self._sleepers)
            if not woken.done():
                woken.set_result(None)
        for _ in range(5):  # let woken tasks, and what they wake, take their turn
            await asyncio.sleep(0)
