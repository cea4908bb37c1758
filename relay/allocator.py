"""Process-wide setting for a relay process: the C heap keeps what it frees.

glibc's ``malloc`` hands the top of its heap back to the operating system
once more than ``M_TRIM_THRESHOLD`` of it is free (128 KiB at start, then
twice the largest block it ever mapped on its own), and maps a block over
``M_MMAP_THRESHOLD`` on its own, unmapped when freed. A relay checking an
origin response frees a few megabytes at a time: the decoded bodies of a
slice of 1,000 resources (protobuf arenas), the response's encoding, the
entries. Handed back after each slice, every page is faulted in and zeroed
again by the next one: in process, parsing five responses of 2,000 x 300 B
took 53-56 ms with glibc's defaults and 33-35 ms with a 64 MiB threshold
(``python -m benchmarks.cold_path --per-response 2000``, 9 runs, load 1.4;
a slice's decode 3.1-3.6 -> 2.1-2.2 ms); the peak resident size was the
same (108 MiB). Setting one threshold turns glibc's moving of both off, so
the mapping threshold is set too: with the trim threshold alone, encoding
a response of 2,000 (a block of 840 KiB) took 1.19-1.40 ms, against
0.81-1.17 with the defaults and 0.24-0.31 with both.

The price: up to :data:`TRIM_THRESHOLD` of freed heap stays with the process
(resident until reused) rather than going back at once, and blocks under
:data:`MMAP_THRESHOLD` come from the heap, where a long-lived one can keep
the free space under it from going back.
"""

from __future__ import annotations

import ctypes

# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Free heap top the process keeps: a few slices' worth of decoding, with room.
TRIM_THRESHOLD = 64 << 20
# Blocks from the heap up to this size (glibc's largest: 32 MiB on 64 bits).
MMAP_THRESHOLD = 32 << 20


def keep_freed_memory(trim: int = TRIM_THRESHOLD, mmap: int = MMAP_THRESHOLD) -> bool:
    """Have the C heap keep up to ``trim`` bytes freed at its top for reuse,
    and give blocks up to ``mmap`` bytes from it; whether it took both
    (False for a C library without glibc's ``mallopt``, such as musl's:
    nothing changes there). Call once, as the relay starts."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # (the process's own C library)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, trim)) & bool(mallopt(M_MMAP_THRESHOLD, mmap))
