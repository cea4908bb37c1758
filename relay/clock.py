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
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


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
            await within(event.wait(), timeout)
        except TimeoutError:
            return False
        return True


async def within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """``await awaitable``, or TimeoutError once ``timeout`` seconds passed (None:
    no limit). The relay waits with this, never ``asyncio.wait_for``: on Python
    3.11 that one loses a cancellation which comes as what it waits for is
    done (the task it runs in carries on to its next wait, and whoever
    cancelled it, stopping the relay or closing a group, waits for it forever);
    ``asyncio.timeout`` keeps it. A cancellation that what it waits for
    swallowed (redis-py 8's asyncio client does, now and then) is raised
    again here."""
    task = asyncio.current_task()
    assert task is not None, "within() runs in a task"
    cancels = task.cancelling()
    async with asyncio.timeout(timeout):
        result = await awaitable
    if task.cancelling() > cancels:  # cancelled meanwhile, and it never arrived
        raise asyncio.CancelledError
    return result


async def ended(task: asyncio.Future[Any] | None, *, errors_too: bool = False) -> None:
    """Wait for ``task`` (None: nothing) to end, cancelled or done: its own
    CancelledError (and, with ``errors_too``, any error it ends with) is
    swallowed, as a stop path wants of a task it has just cancelled. A
    cancellation of the task that waits is raised all the same: a stop path
    that swallowed every CancelledError also swallowed the one meant for
    whoever was stopping (a timeout around a stop never fired, and the
    canceller waited on). The count of the waiting task's cancel requests
    tells the two apart, as in :func:`within`."""
    if task is None:
        return
    current = asyncio.current_task()
    cancels = current.cancelling() if current is not None else 0
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > cancels:
            raise
    except Exception:
        if not errors_too:
            raise


async def wait_until(clock: Clock, event: asyncio.Event, deadline: float | None) -> bool:
    """Wait for ``event`` until ``deadline`` on ``clock`` (None: no limit);
    whether it was set (False: the deadline came first)."""
    timeout = None if deadline is None else max(0.0, deadline - clock.now())
    return await clock.wait(event, timeout)
