"""Counting the calls a piece of code makes of a function it looks up at run
time (a module's), without changing what the function does: how tests hold
a fast path to doing no step per name."""

from __future__ import annotations

from typing import Any

import pytest


def calls_of(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[tuple[Any, ...]]:
    """The arguments of each call of ``owner.name`` from now on (the test's
    end undoes it); the function still runs."""
    calls: list[tuple[Any, ...]] = []
    original = getattr(owner, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls
