"""Make every check of an invariant selectable as ``pytest -k invariant_N``.

A test named ``test_invariant_14_15_...`` checks lines 14 and 15 of
``relay-invariants.md``; it gets the keywords ``invariant_14`` and
``invariant_15`` so that either selects it. ``-k`` matches substrings, so
``-k invariant_1`` also selects lines 10-19; ``-k invariant_1_`` selects only
tests named for line 1 first.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from collections.abc import Iterator

import pytest
from hypothesis import settings

# Hypothesis fails an example that takes over 200 ms by default: a race with
# the clock, which a busy 2-core machine loses now and then. The examples
# here are fast; a slow one is the machine, not the code.
settings.register_profile("relay", deadline=None)
settings.load_profile("relay")

_NUMBERS = re.compile(r"^test_invariant_((?:\d+_)+)")


def invariant_numbers(test_name: str) -> list[int]:
    """The invariant numbers a test's name says it checks."""
    match = _NUMBERS.match(test_name)
    if match is None:
        return []
    return [int(n) for n in match.group(1).strip("_").split("_")]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = getattr(item, "originalname", None) or item.name
        for number in invariant_numbers(name):
            item.extra_keyword_matches.add(f"invariant_{number}")


# -- a test that hangs says where --------------------------------------------------------
#
# pytest-timeout prints the threads' stacks, which for an asyncio test show only
# the event loop waiting in epoll. A few seconds before it fires, the stacks of
# every task still pending are printed too (to the test's captured stderr).

HANG_NOTICE = 5.0  # seconds before pytest-timeout's deadline


def _print_pending_tasks() -> None:
    try:
        tasks = list(asyncio.tasks._all_tasks)  # every loop's (3.11)
    except (AttributeError, RuntimeError):  # another Python; or the set changed meanwhile
        return
    print(f"+++ {len(tasks)} asyncio tasks at the hang notice +++", file=sys.stderr)
    for task in tasks:
        if not task.done():
            print(f"--- {task!r}", file=sys.stderr)
            for frame in task.get_stack(limit=12):  # innermost last
                code = frame.f_code
                print(f"    {code.co_filename}:{frame.f_lineno} in {code.co_name}",
                      file=sys.stderr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    timeout = float(item.config.getini("timeout") or 0)
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        timeout = float(marker.args[0])
    if timeout <= HANG_NOTICE:
        return (yield)
    notice = threading.Timer(timeout - HANG_NOTICE, _print_pending_tasks)
    notice.daemon = True
    notice.start()
    try:
        return (yield)
    finally:
        notice.cancel()
