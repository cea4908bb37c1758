"""Log styles: JSON records carry time, level, logger, message and exception."""

from __future__ import annotations

import json
import logging
import sys

from relay.logs import JsonFormatter


def test_json_record_has_fields_and_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("relay.upstream", logging.WARNING, __file__, 1,
                                   "origin %s failed", ("o:1",), exc_info=sys.exc_info())
    record.created = 0.0
    entry = json.loads(JsonFormatter().format(record))
    assert entry["time"] == "1970-01-01T00:00:00.000Z"
    assert (entry["level"], entry["logger"], entry["msg"]) == (
        "warning", "relay.upstream", "origin o:1 failed")
    assert entry["exc"].startswith("Traceback") and entry["exc"].endswith("ValueError: boom")
