"""Letting the event loop serve others in the middle of a long piece of work.

Work made in slices (a ``/clients`` record, a fetch of many names, the JSON
of a big poll answer) is written as a generator that yields ``None`` where
it may pause: :func:`made` runs one at once (tests, callers with no loop),
:func:`made_in_turns` runs one giving the loop a turn at each pause.

A turn is three passes of the loop, not one. ``await asyncio.sleep(0)``
puts the task back at the head of the next pass, ahead of what became
ready during the slice just made; and what became ready is often one step
from the task that waits for it: a timer's callback sets the future its
task sleeps on, which wakes the task in the pass after (so does a socket's
data, for the handler it feeds or starts). With one ``sleep(0)`` a timer
due during a slice woke its task after two more slices (measured: 29 ms
held for slices of 10 ms); with three, after none (9 ms).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import TypeVar

__all__ = ["Turn", "give_turn", "made", "made_in_turns", "slice_starts"]

T = TypeVar("T")
#: What a sliced piece of work awaits at each pause (tests inject one that counts).
Turn = Callable[[], Awaitable[None]]


async def give_turn() -> None:
    """Let every callback that is ready now (sockets, timers) run before going on."""
    await asyncio.sleep(0)  # behind us: what became ready while we ran (a timer's callback)
    await asyncio.sleep(0)  # the task it wakes
    await asyncio.sleep(0)  # which runs now, before our next slice


def made(slices: Generator[None, None, T]) -> T:
    """What a generator of slices returns, all its slices made at once."""
    while True:
        try:
            next(slices)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def made_in_turns(slices: Generator[None, None, T], turn: Turn = give_turn) -> T:
    """What a generator of slices returns, awaiting ``turn`` at each of its pauses."""
    while True:
        try:
            next(slices)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await turn()


def slice_starts(count: int, step: int) -> range:
    """Where each slice of ``count`` items starts, ``step`` items a slice
    (all of them in one with 0, as a piece of work that never pauses)."""
    return range(0, count, step or max(count, 1))
