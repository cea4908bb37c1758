"""What a piece of code leaves allocated, in Python objects (tracemalloc): for
tests of what a structure costs per entry, and that it gives memory back."""

from __future__ import annotations

import contextlib
import gc
import tracemalloc
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def traced() -> Iterator[Callable[[], int]]:
    """Inside, a function saying how many bytes of Python objects allocated
    since entering are still held. Build the inputs (names) before entering:
    they are not the structure's cost."""
    gc.collect()
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield lambda: tracemalloc.get_traced_memory()[0] - base
    finally:
        if started:
            tracemalloc.stop()
