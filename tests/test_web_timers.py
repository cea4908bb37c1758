"""A keep-alive connection's requests keep its deadline timer rather than
making one each (:meth:`relay.web._Connection._arm`): counted, not timed.
The deadlines themselves are tests/test_web.py's."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from relay.http_limits import HttpLimits
from tests.test_web import BOUND, GET, connect, lines_at, listening, one_reply, until_closed


async def test_requests_on_a_keep_alive_connection_make_no_timer_each() -> None:
    loop = asyncio.get_running_loop()
    made: list[float] = []
    call_at = loop.call_at

    def counted(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if getattr(callback, "__name__", "") == "_on_deadline":
            made.append(when)
        return call_at(when, callback, *args, **kwargs)

    loop.call_at = counted  # type: ignore[method-assign]
    try:
        async with listening(HttpLimits(header_timeout=BOUND, idle_timeout=2 * BOUND)
                             ) as listener:
            reader, writer = await connect(listener.port)
            for _ in range(20):
                writer.write(GET)
                assert await one_reply(reader) == (b"HTTP/1.1 200 OK", b"hello\n")
            writer.close()
    finally:
        del loop.call_at
    # accepted (idle), then the first request's headers (sooner): three a request before
    assert len(made) == 2


async def test_an_idle_connection_is_closed_for_idleness_after_its_timer_woke_early(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with listening(HttpLimits(header_timeout=0.05, idle_timeout=0.3)) as listener:
        reader, writer = await connect(listener.port)
        writer.write(GET)
        assert await one_reply(reader) == (b"HTTP/1.1 200 OK", b"hello\n")
        # the timer wakes at the header timeout, finds nothing overdue, and waits on
        assert await until_closed(reader) == b""
        writer.close()
    assert lines_at(caplog, logging.WARNING) == []
    assert "closing a connection from 127.0.0.1 idle for 0.3s (test.idle_timeout)" in \
        lines_at(caplog, logging.DEBUG)


async def test_a_big_body_is_written_a_slice_at_a_time_and_arrives_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import aiohttp
    from aiohttp import web

    from relay.web import WRITE_SLICE

    body = bytes(range(256)) * (WRITE_SLICE * 3 // 256 + 7)  # 3 slices and a bit
    written: list[int] = []
    write = web.StreamResponse.write

    async def counted(self: web.StreamResponse, data: Any) -> None:
        written.append(len(data))
        await write(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", counted)

    async def big(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/octet-stream")

    async with listening(HttpLimits(), big) as listener, aiohttp.ClientSession() as session:
        for _ in range(2):  # and the connection is kept for the next
            async with session.get(f"http://127.0.0.1:{listener.port}/") as reply:
                assert (reply.status, reply.content_type) == (200, "application/octet-stream")
                assert reply.headers["Content-Length"] == str(len(body))
                assert await reply.read() == body
    assert written == [WRITE_SLICE, WRITE_SLICE, WRITE_SLICE, len(body) - 3 * WRITE_SLICE] * 2
