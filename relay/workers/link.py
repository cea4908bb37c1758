"""The control channel between the hub and one worker: JSON lines over a socket pair.

It carries no xDS (that goes over the hub's unix socket, as Delta ADS). The
worker says once it is ready; the hub asks it for what the admin endpoints
show of it. Either end reading end-of-file knows the other process is gone:
the worker then stops, and the hub has its exit to handle anyway.

Messages, one JSON object per line:

* worker to hub: ``{"ready": PID}`` once it serves clients and is synced
  with the hub; ``{"reply": ID, "data": ...}`` answering a question;
* hub to worker: ``{"ask": QUESTION, "id": ID, "details": {...}}``, the
  question being ``"clients"``, ``"metrics"`` or one of the console's
  (:data:`relay.console.source.QUESTIONS`, whose details say what to answer).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["Link"]

# A reply is one line: /clients of a worker with many thousand clients runs to MBs.
_LINE_LIMIT = 256 * 1024 * 1024


class Link:
    """One end of the channel, on the running event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, end: Connection) -> Link:
        """Take over ``end`` (one end of a ``multiprocessing`` pipe, which is a
        socket pair); ``end`` itself is closed."""
        sock = socket.socket(fileno=os.dup(end.fileno()))
        end.close()
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=_LINE_LIMIT)
        return cls(reader, writer)

    def send(self, message: dict[str, Any]) -> None:
        """Queue one message (written as the loop gets to it; a gone peer is not an error)."""
        if not self._writer.is_closing():
            self._writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def receive(self) -> dict[str, Any] | None:
        """The next message, or None once the other end is gone."""
        try:
            line = await self._reader.readline()
        except (ConnectionError, ValueError):  # reset, or a line over the limit
            return None
        if not line.endswith(b"\n"):
            return None
        message = json.loads(line)
        assert isinstance(message, dict)
        return message

    def close(self) -> None:
        self._writer.close()
