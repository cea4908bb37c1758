"""Log output: ``key=value`` text for people, or one JSON object per line for
log pipelines (``logging.format: json``)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

TEXT_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s"


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
    run with ``--workers``, which share one stderr.
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


class RateLimitedLog:
    """Warnings of one kind (``key``) logged at most once per ``interval``.

    For lines that clients can cause at will (refusals, bad requests): the
    first is logged, the rest of the interval only counted, and the count is
    told with the next line logged. At most ``max_keys`` kinds are tracked;
    past that, tracking starts afresh (a line more, never a memory leak).
    """

    def __init__(self, logger: logging.Logger, interval: float, now: Callable[[], float],
                 max_keys: int = 10_000) -> None:
        self.logger = logger
        self.interval = interval
        self.now = now
        self.max_keys = max_keys
        self._seen: dict[str, tuple[float, int]] = {}  # key -> (last logged, not logged since)

    def warning(self, key: str, message: str, *args: object) -> None:
        now = self.now()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.interval:
            self._seen[key] = (seen[0], seen[1] + 1)
            return
        if seen is None and len(self._seen) >= self.max_keys:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if seen is not None and seen[1]:
            if not args:  # the message was not a format until now
                message = message.replace("%", "%%")
            message += " (%d more like it in the %.0fs since the last one logged)"
            args = (*args, seen[1], now - seen[0])
        self.logger.warning(message, *args)
