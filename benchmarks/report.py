"""How benchmarks report a figure: min and median over runs, for the relay
and for the bare server (:mod:`benchmarks.bare`), and relay / bare.

Ratios are of like with like: the relay's min over the bare server's min,
the relay's median over the bare server's median. A figure the bare server
has no counterpart for has no ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

Spread = dict[str, float | None]
Comparison = dict[str, Spread]


def spread(values: Sequence[float]) -> Spread:
    """Min and median of ``values`` (None for both when there are none)."""
    if not values:
        return {"min": None, "median": None}
    return {"min": min(values), "median": statistics.median(values)}


def _ratio(relay: float | None, bare: float | None) -> float | None:
    if relay is None or bare is None or bare <= 0:
        return None
    return relay / bare


def compare(relay: Sequence[float], bare: Sequence[float] | None) -> Comparison:
    """The relay's and the bare server's spreads over runs, and their ratio."""
    ours = spread(relay)
    if bare is None:
        return {"relay": ours, "bare": spread([]), "ratio": spread([])}
    theirs = spread(bare)
    return {"relay": ours, "bare": theirs,
            "ratio": {key: _ratio(ours[key], theirs[key]) for key in ("min", "median")}}


def revision(src: Path) -> str:
    """The commit ``src`` is at, ``+changes`` if its tree differs from it."""
    try:
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain",
                                "--untracked-files=no", "--", "relay"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}+changes" if dirty else commit


def publish(text: str, markdown: Path | None) -> None:
    """Print a benchmark's tables, and write them to ``markdown`` if given."""
    print(text)
    if markdown is not None:
        markdown.write_text(text)


def write_results(path: Path, module: str, **fields: Any) -> None:
    """Write a benchmark's results to ``path`` as JSON, with the command that
    ran it (``python -m <module>`` and this process's arguments) and the
    machine's CPU count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": " ".join([f"python -m {module}", *sys.argv[1:]]),
                                "cpus": os.cpu_count(), **fields}, indent=2))


def values(runs: Sequence[dict[str, Any]], key: str) -> list[float]:
    """The figure ``key`` of every run that has it."""
    return [run[key] for run in runs if run.get(key) is not None]


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(rows: Sequence[tuple[str, Comparison]], first_column: str = "",
          baseline: str = "bare") -> str:
    """A Markdown table: one row per figure, relay / bare / ratio columns (the
    bare server's headed ``baseline``: e.g. ``forwarder``, for a comparison
    whose ``"bare"`` is :mod:`benchmarks.forwarder`)."""
    width = max([len(first_column), *(len(label) for label, _ in rows)])
    head = (f"| {first_column:<{width}} | relay min | relay median | {baseline} min "
            f"| {baseline} median | ratio min | ratio median |")
    lines = [head, f"| {'-' * width} |" + " ---: |" * 6]
    for label, c in rows:
        lines.append(
            f"| {label:<{width}} | {_number(c['relay']['min']):>9} "
            f"| {_number(c['relay']['median']):>12} "
            f"| {_number(c['bare']['min']):>{len(baseline) + 4}} "
            f"| {_number(c['bare']['median']):>{len(baseline) + 7}} "
            f"| {_times(c['ratio']['min']):>9} "
            f"| {_times(c['ratio']['median']):>12} |")
    return "\n".join(lines)


# -- several servers in one table --------------------------------------------------
#
# A benchmark with more than one baseline (the bare server with the relay's
# gRPC options and with gRPC's defaults, a bare TLS server, ...) reports each
# server's min and median, then the ratios it names, (a, b) for a / b.


def summarize_servers(runs: dict[str, list[dict[str, Any]]], keys: Sequence[str],
                      ratios: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Per figure in ``keys``: each server's spread and ``"a/b"`` for each
    ``(a, b)`` in ``ratios`` of servers that ran (like with like)."""
    summary = {}
    for key in keys:
        summary[key] = {
            "servers": {server: spread(values(server_runs, key))
                        for server, server_runs in runs.items()},
            "ratios": {f"{a}/{b}": compare(values(runs[a], key), values(runs[b], key))["ratio"]
                       for a, b in ratios if a in runs and b in runs}}
    return summary


def markdown(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, the first column left-aligned and the rest right."""
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = ["| " + " | ".join(f"{cell:<{w}}" if i == 0 else f"{cell:>{w}}"
                               for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
             + " |" for line in [head, *rows]]
    lines.insert(1, "| " + " | ".join("-" * widths[0] if i == 0 else "-" * (w - 1) + ":"
                                      for i, w in enumerate(widths)) + " |")
    return "\n".join(lines)


def _both(ratio: Spread) -> str:
    if ratio["min"] is None or ratio["median"] is None:
        return "-"
    return f"{ratio['min']:.2f}x / {ratio['median']:.2f}x"


def server_tables(summary: dict[str, Any], figures: dict[str, str], servers: Sequence[str],
                  labels: dict[str, str] | None = None) -> str:
    """Two Markdown tables from :func:`summarize_servers`: each server's min
    and median per figure (``figures``: key -> label), then the ratios
    (min / median), each headed ``a / b`` (``labels``: a server's name in them)."""
    name = (labels or {}).get
    head = ["figure", *(f"{name(s, s)} {m}" for s in servers for m in ("min", "median"))]
    rows = [[label, *(_number(summary[key]["servers"][s][m]) for s in servers
                      for m in ("min", "median"))] for key, label in figures.items()]
    ratio_keys = list(summary[next(iter(figures))]["ratios"])
    ratio_head = ["figure (ratio min / median)",
                  *(" / ".join(name(s, s) for s in key.split("/")) for key in ratio_keys)]
    ratio_rows = [[label, *(_both(summary[key]["ratios"][r]) for r in ratio_keys)]
                  for key, label in figures.items()]
    return f"{markdown(head, rows)}\n\n{markdown(ratio_head, ratio_rows)}"


def tree_rows(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]] | None,
              figures: Iterable[tuple[str, str]]) -> list[tuple[str, Comparison]]:
    """One row per ``(label, key)`` of ``figures``: this tree's runs against
    the other tree's (``theirs``; None: no other tree was measured), for
    :func:`table` with ``baseline="before"``."""
    return [(label, compare(values(ours, key), None if theirs is None else values(theirs, key)))
            for label, key in figures]


def trees(relay_src: Path, baseline_src: Path | None) -> str:
    """Which trees a before/after in one invocation measured (see :func:`add_tree_options`)."""
    return f"relay at {relay_src}" + ("" if baseline_src is None else f", before at {baseline_src}")


def add_tree_options(parser: argparse.ArgumentParser) -> None:
    """``--relay-src`` (the tree measured: this one by default) and
    ``--baseline-src`` (a tree to compare with, measured in the same
    invocation), for the benchmarks that run a tree's relay in process."""
    here = Path(__file__).resolve().parents[1]
    parser.add_argument("--relay-src", type=Path, default=here, metavar="DIR")
    parser.add_argument("--baseline-src", type=Path, default=None, metavar="DIR",
                        help="a tree to compare with (before), measured in the same invocation")
