"""``python -m relay`` under tracemalloc, taking snapshots when told on stdin.

Started by :mod:`benchmarks.memory` (``--breakdown``) as a script, so that
``relay`` comes from ``PYTHONPATH`` (another tree's, with ``--relay-src``).
Each line on stdin is ``<label> <path>``: the first label's snapshot is the
baseline; every later one writes to ``path`` (JSON, replaced whole) the
Python memory allocated since the baseline that is still held, by the line
that allocated it (the largest first) and by file, with the process's RSS at
that moment. A thread of its own reads stdin: snapshots are taken whatever
the event loop is doing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

#: lines of the report, the largest first
TOP_LINES = 60


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _short(filename: str) -> str:
    """``relay/interest.py`` rather than the whole path; the standard library
    and site-packages by their last two parts."""
    parts = Path(filename).parts
    if "relay" in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("relay"):])
    return "/".join(parts[-2:])


def report(snapshot: tracemalloc.Snapshot, base: tracemalloc.Snapshot) -> dict[str, Any]:
    """What ``snapshot`` holds that ``base`` did not, by line and by file."""
    stats = snapshot.compare_to(base, "lineno")
    by_file: dict[str, int] = defaultdict(int)
    for stat in stats:
        by_file[_short(stat.traceback[0].filename)] += stat.size_diff
    lines = [{"where": f"{_short(s.traceback[0].filename)}:{s.traceback[0].lineno}",
              "bytes": s.size_diff, "blocks": s.count_diff}
             for s in sorted(stats, key=lambda s: -s.size_diff)[:TOP_LINES]]
    return {
        "rss": rss_bytes(),
        "traced": sum(stat.size for stat in snapshot.statistics("filename")),
        "traced_diff": sum(stat.size_diff for stat in stats),
        "by_file": dict(sorted(by_file.items(), key=lambda item: -item[1])),
        "by_line": lines,
    }


def _commands() -> None:
    base: tracemalloc.Snapshot | None = None
    for line in sys.stdin:
        label, path = line.split(maxsplit=1)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        if base is None:
            base = snapshot
            body: dict[str, Any] = {"label": label, "rss": rss_bytes(),
                                    "traced": tracemalloc.get_traced_memory()[0]}
        else:
            body = {"label": label, **report(snapshot, base)}
        staged = Path(f"{path.strip()}.tmp")
        staged.write_text(json.dumps(body))
        os.replace(staged, path.strip())


if __name__ == "__main__":
    tracemalloc.start(1)
    threading.Thread(target=_commands, name="tracemalloc", daemon=True).start()
    from relay.cli import main

    sys.exit(main(sys.argv[1:]))
