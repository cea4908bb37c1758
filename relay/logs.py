"""Log output: ``key=value`` text for people, or one JSON object per line for
log pipelines (``logging.format: json``)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

_log = logging.getLogger("relay")

TEXT_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s"
#: Lines of one kind a :class:`RateLimitedLog` logs per interval, all client hosts together.
LINES_PER_KIND = 10


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, the process
    (only with ``--workers``: ``hub``, ``worker-1``, ...), logger, msg, and the
    exception text when there is one."""

    def __init__(self, process: str | None = None) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            **({"process": self.process} if self.process else {}),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)

    def formatTime(self, record: logging.LogRecord,
                   datefmt: str | None = None) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC)
        return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def configure_logging(level: str, style: Literal["text", "json"] = "text",
                      process: str | None = None) -> None:
    """Log to stderr at ``level`` in the given style (replacing earlier set-up).

    ``process`` names the process in every line, for the processes of a relay
    run with ``--workers``, which share one stderr. gRPC's core is quieted
    too (:func:`quiet_grpc_core`).
    """
    handler = logging.StreamHandler(sys.stderr)
    if style == "json":
        handler.setFormatter(JsonFormatter(process))
    else:
        shown = f"level=%(levelname)s process={process} " if process else "level=%(levelname)s "
        handler.setFormatter(logging.Formatter(TEXT_FORMAT.replace("level=%(levelname)s ",
                                                                   shown)))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    # gRPC's own logger is chatty about cancelled streams at INFO.
    logging.getLogger("grpc").setLevel(logging.WARNING)
    quiet_grpc_core()


def log_level() -> str:
    """The level the relay logs at now (``logging.level``, ``--log-level``, or
    what :func:`set_log_level` made it since)."""
    return logging.getLevelName(logging.getLogger().level).lower()


def set_log_level(level: str) -> str:
    """Log at ``level`` from now on (one of ``logging.level``'s values), as
    ``--log-level`` would have; returns the level before. The change is
    logged, at INFO while the more verbose of the two levels is in force (or
    WARNING, when neither shows INFO), so that it shows either way."""
    new = getattr(logging, level.upper())
    root = logging.getLogger()
    previous = logging.getLevelName(root.level).lower()
    old = root.level
    line = max(logging.INFO, min(old, new))
    if new > old:  # less verbose: say so while the old level still shows it
        _log.log(line, "log level %s (was %s)", level, previous)
        root.setLevel(new)
    else:
        root.setLevel(new)
        _log.log(line, "log level %s (was %s)", level, previous)
    return previous


def quiet_grpc_core() -> None:
    """gRPC's C core writes its own lines to stderr, not through :mod:`logging`,
    and at INFO (where it logs unless told otherwise) that is one line per
    failed TLS handshake, which anyone who can connect causes at will: it
    logs from ERROR up unless ``GRPC_VERBOSITY`` says otherwise.

    The core reads the variable once, when ``grpc`` is imported: this must
    come first (it does in ``xds-relay run``; the processes of ``--workers``
    inherit it). Nothing else tells of those handshakes: gRPC's Python API
    has no hook for a failed one.
    """
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


class RateLimitedLog:
    """Lines a client can cause at will (refusals, bad requests), bounded twice.

    A line has a kind (a refusal's reason, a limit's name) and the client
    host that caused it. Per kind and host, at most one line per
    ``interval``: the first is logged, the rest of the interval only counted,
    and the count is told with the next line logged. Per kind, all hosts
    together, at most ``per_kind`` lines per interval, counted and told the
    same way: a client with many addresses (or many clients) cannot flood
    the log either. A line with no host (``host=None``) is bounded per kind
    alone. At most ``max_keys`` kinds and hosts are tracked; past that,
    tracking starts afresh (a line more, never a memory leak).
    """

    def __init__(self, logger: logging.Logger, interval: float, now: Callable[[], float],
                 max_keys: int = 10_000, per_kind: int = LINES_PER_KIND) -> None:
        self.logger = logger
        self.interval = interval
        self.now = now
        self.max_keys = max_keys
        self.per_kind = per_kind
        # (kind, host) -> (last logged, not logged since)
        self._seen: dict[tuple[str, str | None], tuple[float, int]] = {}
        self._kinds: dict[str, _KindWindow] = {}

    def warning(self, kind: str, message: str, *args: object, host: str | None = None) -> None:
        """Log ``message % args`` at WARNING unless a bound says otherwise."""
        now = self.now()
        key = (kind, host)
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.interval:
            self._seen[key] = (seen[0], seen[1] + 1)
            return
        window = self._window(kind, now)
        if window.logged >= self.per_kind:
            # This host's own record is left as it is: it is told when the kind has room.
            window.left_out += 1
            return
        window.logged += 1
        if seen is None and len(self._seen) >= self.max_keys:
            self._seen.clear()
        self._seen[key] = (now, 0)
        counts: list[object] = []
        suffix = ""
        if seen is not None and seen[1]:
            suffix += " (%d more like it in the %.0fs since the last one logged)"
            counts += [seen[1], now - seen[0]]
        if window.left_out:
            suffix += (" (%d more of this kind, from any host, left out in the %.0fs since "
                       "the last one logged)")
            counts += [window.left_out, now - window.last_logged]
            window.left_out = 0
        window.last_logged = now
        if suffix:
            if not args:  # the message was not a format until now
                message = message.replace("%", "%%")
            message += suffix
            args = (*args, *counts)
        self.logger.warning(message, *args)

    def _window(self, kind: str, now: float) -> _KindWindow:
        """The kind's current interval, a fresh one when the last has passed."""
        window = self._kinds.get(kind)
        if window is None:
            if len(self._kinds) >= self.max_keys:
                self._kinds.clear()
            window = self._kinds[kind] = _KindWindow(now, now)
        elif now - window.start >= self.interval:
            window.start, window.logged = now, 0
        return window


@dataclass
class _KindWindow:
    """One kind's lines in the interval from ``start`` (see :class:`RateLimitedLog`)."""

    start: float
    last_logged: float
    logged: int = 0
    left_out: int = 0  # not logged for the kind's bound since the last line logged
