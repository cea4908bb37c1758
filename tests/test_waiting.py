"""Waiting with a limit keeps a cancellation (relay/clock.py's ``within``).

On Python 3.11, ``asyncio.wait_for`` returns the result when the task running
it is cancelled as what it waits for completes: the cancellation is lost, the
task carries on to its next wait, and whoever cancelled it (the relay
stopping, a node group closing) waits for it forever. Tests hung so in CI.
"""

from __future__ import annotations

import ast
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import relay
from relay.clock import MonotonicClock, within

# cancel the waiting task this many loop passes after its event is set: one
# of them falls between the wait's end and the waiting task's resumption
PASSES = range(6)


async def cancelled_after(passes: int, wait: Callable[[asyncio.Event], Awaitable[object]]
                          ) -> tuple[bool, str]:
    """Cancel a task waiting on an event ``passes`` loop passes after the event
    is set: whether the cancel was taken, and how the task ended."""
    event = asyncio.Event()
    task = asyncio.create_task(wait(event))
    for _ in range(3):
        await asyncio.sleep(0)
    event.set()
    for _ in range(passes):
        await asyncio.sleep(0)
    taken = task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return taken, "cancelled"
    return taken, "returned"


WAITS: dict[str, Callable[[asyncio.Event], Awaitable[object]]] = {
    "MonotonicClock.wait": lambda event: MonotonicClock().wait(event, 10.0),
    "within": lambda event: within(event.wait(), 10.0),
    "within, no limit": lambda event: within(event.wait(), None),
    "within a gather": lambda event: within(asyncio.gather(event.wait()), 10.0),
}


@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("wait", WAITS.values(), ids=WAITS.keys())
async def test_a_cancel_that_comes_as_the_wait_ends_is_kept(
        passes: int, wait: Callable[[asyncio.Event], Awaitable[object]]) -> None:
    taken, ended = await cancelled_after(passes, wait)
    assert ended == ("cancelled" if taken else "returned")


async def test_a_cancel_that_what_it_waits_for_swallowed_is_raised_again() -> None:
    async def swallowing(event: asyncio.Event) -> str:
        try:
            await event.wait()
        except asyncio.CancelledError:
            return "swallowed"  # as redis-py 8's asyncio client does, now and then
        return "set"

    event = asyncio.Event()
    task = asyncio.create_task(within(swallowing(event), 10.0))
    for _ in range(3):
        await asyncio.sleep(0)
    assert task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # one that was cancelling already (cleaning up on its way out) is let through
    async def cleaning_up() -> str:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            return await within(asyncio.sleep(0, "done"), 1.0)
        raise AssertionError("not cancelled")

    assert await asyncio.create_task(cleaning_up()) == "done"


async def test_the_measure_sees_asyncio_wait_for_lose_a_cancel() -> None:
    """The check above catches what it is for (3.11's wait_for fails it)."""
    outcomes = {await cancelled_after(passes, lambda e: asyncio.wait_for(e.wait(), 10.0))
                for passes in PASSES}
    if sys.version_info < (3, 12):
        assert (True, "returned") in outcomes
    assert outcomes <= {(True, "cancelled"), (True, "returned"), (False, "returned")}


async def test_within_still_times_out() -> None:
    with pytest.raises(TimeoutError):
        await within(asyncio.Event().wait(), 0.01)
    assert await within(asyncio.sleep(0, "done"), 1.0) == "done"


def test_the_relay_never_waits_with_asyncio_wait_for() -> None:
    package = Path(relay.__file__).resolve().parent
    calls = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "wait_for" and \
                    isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                calls.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    assert calls == [], "use relay.clock.within (see its docstring)"
