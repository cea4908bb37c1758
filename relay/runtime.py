"""Process-wide settings for a relay process: the cyclic garbage collector.

A relay's heap is mostly long-lived: cached resources, their pre-encoded
bytes, one session per stream. CPython's default collector thresholds
(a young collection every 700 net allocations, and full collections that
walk every tracked object) make a fan-out to thousands of streams, or one
client subscribing to thousands of names, spend a large share of its time
walking that heap again and again. Almost nothing the relay allocates forms
reference cycles; reference counting frees it. So the process collects
young objects rarely and keeps what exists at start-up out of the walks.
Measured with ``python -m benchmarks.fanout`` (see docs/performance.md).

Rarely, not seldom: a young collection walks every object made since the
last, and holds the event loop while it does. At 50,000 a collection took
about 50 ms on a slow core, and one landed in istiod's resend of 50,000
changed endpoints, the longest hold of the reconnect
(``benchmarks.reconnect_steps``); at 10,000 it is a fifth of that, and the
fan-out spent no more CPU (``xds_relay_gc_pause_seconds`` shows each pause).
"""

from __future__ import annotations

import gc

# Net container allocations between young collections (CPython: 700), and
# how many collections of one generation trigger one of the next (CPython:
# 10, 10). Garbage in cycles still goes, only in larger batches.
YOUNG_THRESHOLD = 10_000
OLDER_THRESHOLDS = (20, 20)


def tune_gc() -> None:
    """Collect rarely, and never walk what exists now (imports, config,
    the servers): call once the relay has started."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
