"""Waiting keeps a cancellation (relay/clock.py's ``within`` and ``ended``).

On Python 3.11, ``asyncio.wait_for`` returns the result when the task running
it is cancelled as what it waits for completes: the cancellation is lost, the
task carries on to its next wait, and whoever cancelled it (the relay
stopping, a node group closing) waits for it forever. Tests hung so in CI.

A stop path that cancels a task and then waits for it must swallow that
task's CancelledError, and only that one: ``ended`` raises a cancellation
of the waiting task itself (``contextlib.suppress`` swallowed both).
"""

from __future__ import annotations

import ast
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import relay
from relay.clock import MonotonicClock, ended, within

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
    assert await on_the_way_out(lambda: within(asyncio.sleep(0, "done"), 1.0)) == "done"


async def on_the_way_out(cleanup: Callable[[], Awaitable[str]]) -> str:
    """What ``cleanup`` gives, run by a task that was cancelled (in its
    ``except CancelledError``, as a stop's cleanup runs)."""
    async def cancelled_then_cleaning_up() -> str:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            return await cleanup()
        raise AssertionError("not cancelled")

    return await asyncio.create_task(cancelled_then_cleaning_up())


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


async def stubborn(release: asyncio.Event) -> None:
    """A task that takes a while to end once cancelled (it cleans up until released)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await release.wait()
        raise


async def test_ended_swallows_the_cancel_of_the_task_it_waits_for() -> None:
    task = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)
    task.cancel()
    assert await ended(task) is None
    assert task.cancelled()
    await ended(None)  # (nothing to wait for)
    done = asyncio.create_task(asyncio.sleep(0, "done"))
    await ended(done)
    assert done.result() == "done"


async def test_ended_raises_a_cancel_of_the_task_that_waits() -> None:
    """A stop cancelled midway (a timeout around it) ends with CancelledError,
    where contextlib.suppress went on as if nothing had happened."""
    release = asyncio.Event()
    task = asyncio.create_task(stubborn(release))
    await asyncio.sleep(0)
    task.cancel()
    steps: list[str] = []

    async def stopping() -> None:
        await ended(task)
        steps.append("went on")

    stop = asyncio.create_task(stopping())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not stop.done()  # (waiting: the task cleans up)
    stop.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await stop
    assert steps == []
    assert task.cancelled()


async def test_a_timeout_around_a_wait_with_ended_fires() -> None:
    release = asyncio.Event()
    task = asyncio.create_task(stubborn(release))
    await asyncio.sleep(0)
    task.cancel()

    async def stopping() -> str:
        try:
            async with asyncio.timeout(0.01):
                await ended(task)
        except TimeoutError:
            return "timed out"
        return "went on"

    stop = asyncio.create_task(stopping())
    await asyncio.sleep(0.05)
    release.set()
    assert await stop == "timed out"


async def test_ended_lets_a_task_cleaning_up_on_its_way_out_wait() -> None:
    """A waiter cancelled before it waits (a finally of a cancelled task)
    still waits the task out, and swallows that task's own cancel."""
    task = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)

    async def cleanup() -> str:
        task.cancel()
        await ended(task)
        return "cleaned up"

    assert await on_the_way_out(cleanup) == "cleaned up"
    assert task.cancelled()


async def test_ended_raises_errors_unless_told_to_swallow_them() -> None:
    async def failing() -> None:
        raise ValueError("broken")

    task = asyncio.create_task(failing())
    with pytest.raises(ValueError, match="broken"):
        await ended(task)
    again = asyncio.create_task(failing())
    await ended(again, errors_too=True)
    assert isinstance(again.exception(), ValueError)


def test_the_relay_never_swallows_cancellations_with_suppress() -> None:
    package = Path(relay.__file__).resolve().parent
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "suppress" and any(
                        isinstance(arg, ast.Attribute) and arg.attr == "CancelledError"
                        for arg in node.args):
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    assert found == [], "wait with relay.clock.ended (see its docstring)"
