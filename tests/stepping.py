"""Running a piece of work made in steps (a generator that yields where it
may pause: see relay.turns) by hand, counting its pauses."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar

T = TypeVar("T")


def made_in_steps(steps: Generator[None, None, T],
                  between: Callable[[], object] | None = None) -> tuple[T, int]:
    """What ``steps`` returns, and how many times it paused on the way;
    ``between()`` runs at each pause."""
    pauses = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, pauses
        pauses += 1
        if between is not None:
            between()
