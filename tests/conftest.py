"""Make every check of an invariant selectable as ``pytest -k invariant_N``.

A test named ``test_invariant_14_15_...`` checks lines 14 and 15 of
``relay-invariants.md``; it gets the keywords ``invariant_14`` and
``invariant_15`` so that either selects it. ``-k`` matches substrings, so
``-k invariant_1`` also selects lines 10-19; ``-k invariant_1_`` selects only
tests named for line 1 first.
"""

from __future__ import annotations

import re

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
