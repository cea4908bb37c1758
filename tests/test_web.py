"""What the admin and REST servers share (:func:`relay.web.listen`), over real
sockets on loopback: a slow header (slowloris), an idle connection or a slow
TLS handshake is closed after its timeout; a request being handled is not;
a host past its connections is answered 429; none of it floods the log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from relay.config import AdminConfig
from relay.config.values import Address
from relay.http_limits import HttpLimits
from relay.logs import RateLimitedLog
from relay.web import FollowedTLS, Listener, listen
from tests.certs import Authority
from tests.test_admin_security import admin_server

# Time enough for any of these to happen on a loaded machine; never waited whole
# by a passing test.
BOUND = 10.0
log = logging.getLogger("relay.test.web")
http_log = logging.getLogger("relay.test.web.http")


async def hello(request: web.BaseRequest) -> web.StreamResponse:
    return web.Response(text="hello\n")


@contextlib.asynccontextmanager
async def listening(limits: HttpLimits, handle: Callable[[web.BaseRequest],
                                                        Awaitable[web.StreamResponse]] = hello,
                    tls: FollowedTLS | None = None) -> AsyncIterator[Listener]:
    """A listener on 127.0.0.1 (section ``test``), closed on leaving."""
    client_log = RateLimitedLog(log, 10.0, asyncio.get_running_loop().time)
    listener = await listen(handle, "test", Address("127.0.0.1", 0), tls, limits, client_log,
                            http_log, grace=0.1)
    try:
        yield listener
    finally:
        await listener.close()


async def connect(port: int, tls: ssl.SSLContext | None = None
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, ssl=tls)


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (within BOUND)."""
    return await asyncio.wait_for(reader.read(), BOUND)


async def one_reply(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The status line and body of one reply with a Content-Length, leaving the
    connection open."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
    status, *lines = head.decode().split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines
                  if line.lower().startswith("content-length:"))
    return status.encode(), await asyncio.wait_for(reader.readexactly(length), BOUND)


GET = b"GET / HTTP/1.1\r\nHost: relay\r\n\r\n"


def lines_at(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= level]


# ---------------------------------------------------------------------------- timeouts


async def test_a_slowloris_is_answered_408_and_closed_after_header_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with listening(HttpLimits(header_timeout=0.2, idle_timeout=BOUND)) as listener:
        reader, writer = await connect(listener.port)

        async def trickle() -> None:  # a byte of header every 50 ms, for ever
            for byte in b"GET / HTTP/1.1\r\nHost: relay\r\nX-Slow: " + b"a" * 10_000:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)

        trickling = asyncio.create_task(trickle())
        try:
            answer = await until_closed(reader)
        finally:
            trickling.cancel()
            writer.close()
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert answer.endswith(b"\r\n\r\nthe request's headers took more than 0.2s "
                           b"(test.header_timeout)\n")
    assert lines_at(caplog, logging.WARNING) == [
        "closing a connection from 127.0.0.1: the request's headers took more than 0.2s "
        "(test.header_timeout)"]


async def test_an_idle_keep_alive_connection_is_closed_after_idle_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with listening(HttpLimits(header_timeout=BOUND, idle_timeout=0.2)) as listener:
        reader, writer = await connect(listener.port)
        writer.write(GET)
        assert await one_reply(reader) == (b"HTTP/1.1 200 OK", b"hello\n")
        assert await until_closed(reader) == b""  # kept alive, then closed: nothing sent
        writer.close()
        assert lines_at(caplog, logging.WARNING) == []  # an idle client did nothing wrong
        assert "closing a connection from 127.0.0.1 idle for 0.2s (test.idle_timeout)" in \
            lines_at(caplog, logging.DEBUG)


async def test_a_connection_that_never_sends_a_byte_is_closed_after_idle_timeout() -> None:
    async with listening(HttpLimits(header_timeout=BOUND, idle_timeout=0.2)) as listener:
        reader, writer = await connect(listener.port)
        assert await until_closed(reader) == b""
        writer.close()


async def test_a_request_being_handled_outlives_both_timeouts() -> None:
    answer = asyncio.Event()

    async def slow(request: web.BaseRequest) -> web.StreamResponse:
        await answer.wait()
        return web.Response(text="late\n")

    async with listening(HttpLimits(header_timeout=0.05, idle_timeout=0.05), slow) as listener:
        reader, writer = await connect(listener.port)
        writer.write(GET)
        await asyncio.sleep(0.3)  # six times either timeout: what must not happen has had time
        answer.set()
        assert await one_reply(reader) == (b"HTTP/1.1 200 OK", b"late\n")
        writer.close()


async def test_a_tls_handshake_never_begun_is_closed_after_header_timeout(
        tmp_path: Path) -> None:
    leaf = Authority(tmp_path).relay_leaf()
    tls = FollowedTLS(leaf.cert_file, leaf.key_file, None, "test.tls", log)
    async with listening(HttpLimits(header_timeout=0.2, idle_timeout=BOUND),
                         tls=tls) as listener:
        reader, writer = await connect(listener.port)  # plain TCP: no ClientHello
        assert await until_closed(reader) == b""
        writer.close()


# ------------------------------------------------------------------ connections per host


async def test_a_host_past_connections_per_host_is_answered_429_and_closed(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    limits = HttpLimits(connections_per_host=2)
    async with listening(limits) as listener:
        first, second = await connect(listener.port), await connect(listener.port)
        for reader, writer in (first, second):  # both served
            writer.write(GET)
            assert await one_reply(reader) == (b"HTTP/1.1 200 OK", b"hello\n")
        reader, writer = await connect(listener.port)
        answer = await until_closed(reader)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
        assert b"\r\nRetry-After: 1\r\n" in answer
        assert answer.endswith(b"\r\n\r\ntoo many connections from 127.0.0.1: at most 2 at "
                               b"once from one host (test.connections_per_host)\n")
        assert listener.connections_from("127.0.0.1") == 2  # the refused one never counted
        # One closes: room for another.
        first[1].close()
        await asyncio.wait_for(first[1].wait_closed(), BOUND)
        deadline = asyncio.get_running_loop().time() + BOUND
        while listener.connections_from("127.0.0.1") != 1:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        reader, writer = await connect(listener.port)
        writer.write(GET)
        assert await one_reply(reader) == (b"HTTP/1.1 200 OK", b"hello\n")
        writer.close()
        second[1].close()
    assert lines_at(caplog, logging.WARNING) == [
        "refusing a connection from 127.0.0.1: too many connections from 127.0.0.1: at most 2 "
        "at once from one host (test.connections_per_host)"]


async def test_refusals_in_a_burst_are_logged_once_with_a_count_later(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with listening(HttpLimits(connections_per_host=1)) as listener:
        kept = await connect(listener.port)
        for _ in range(20):
            reader, writer = await connect(listener.port)
            assert (await until_closed(reader)).startswith(b"HTTP/1.1 429 ")
            writer.close()
        kept[1].close()
    assert len(lines_at(caplog, logging.WARNING)) == 1


async def test_every_connection_is_closed_and_uncounted_when_the_listener_closes() -> None:
    async with listening(HttpLimits()) as listener:
        connections = [await connect(listener.port) for _ in range(3)]
        connections[0][1].write(GET)
        await one_reply(connections[0][0])
    for reader, writer in connections:
        assert await until_closed(reader) == b""
        writer.close()
    assert listener.hosts() == 0


# ------------------------------------------------------------------------- the admin server


async def test_the_admin_server_applies_its_config(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    server = admin_server()
    port = await server.start(AdminConfig(address="127.0.0.1:0", header_timeout=0.2,
                                          connections_per_host=1))
    try:
        reader, writer = await connect(port)
        writer.write(b"GET /healthz HTTP/1.1\r\n")  # and nothing more
        refused_reader, refused_writer = await connect(port)
        assert (await until_closed(refused_reader)).endswith(
            b"at most 1 at once from one host (admin.connections_per_host)\n")
        refused_writer.close()
        assert (await until_closed(reader)).endswith(
            b"the request's headers took more than 0.2s (admin.header_timeout)\n")
        writer.close()
    finally:
        await server.stop()
