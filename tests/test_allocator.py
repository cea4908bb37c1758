"""relay.allocator: with the setting, memory freed and allocated again is
not faulted in again (counted in page faults, in a process of its own)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from relay import allocator

# In a fresh process: allocate 100 blocks of 64 KiB (under malloc's own
# mapping threshold: from the heap), or one of 4 MiB (over it), free them
# all, twice; print the minor page faults of the second round.
ROUNDS = """
import resource, sys
from relay.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def round_trip():
    blocks = [b"x" * int(sys.argv[2]) for _ in range(int(sys.argv[3]))]
    del blocks
round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
round_trip()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def second_round_faults(mode: str, size: int, count: int) -> int:
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode, str(size), str(count)],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
@pytest.mark.parametrize("size,count", [(65_536, 100), (4 << 20, 1)], ids=["heap", "mapped"])
def test_freed_memory_is_reused_without_page_faults(size: int, count: int) -> None:
    # 6.4 MiB: 1,600 pages, faulted in again with glibc's defaults
    if count > 1:
        assert second_round_faults("default", size, count) >= 1_000
    assert second_round_faults("keep", size, count) < 100


def test_without_mallopt_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoMallopt:
        def __init__(self, name: object) -> None:
            pass
    monkeypatch.setattr(allocator.ctypes, "CDLL", NoMallopt)
    assert allocator.keep_freed_memory() is False


def test_the_threshold_is_given_to_mallopt(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    class Libc:
        def __init__(self, name: object) -> None:
            def mallopt(parameter: int, value: int) -> int:
                calls.append((parameter, value))
                return 1
            self.mallopt = mallopt  # (argtypes and restype land on the function)
    monkeypatch.setattr(allocator.ctypes, "CDLL", Libc)
    assert allocator.keep_freed_memory(1 << 20, 1 << 19) is True
    assert calls == [(-1, 1 << 20), (-3, 1 << 19)]
