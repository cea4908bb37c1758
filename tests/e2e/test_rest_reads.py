"""How much the REST (and admin) server's connections read at a time.

asyncio reads 256 KiB at a time, allocating a buffer that large for each
read; at the relay's fixed mmap threshold glibc mapped and unmapped one per
read, 12-15 us of every REST poll (see :data:`relay.web.READ_SIZE`). Each
connection, plaintext or TLS, reads :data:`~relay.web.READ_SIZE` at most,
and a body longer than that still comes whole.
"""

from __future__ import annotations

import ssl
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from relay.http_limits import HttpLimits
from relay.memory import MMAP_THRESHOLD
from relay.web import READ_SIZE, FollowedTLS
from tests.certs import Authority
from tests.test_web import connect, listening, log, one_reply

LIMITS = HttpLimits()


def _reader_size(request: web.BaseRequest) -> Any:
    """The ``max_size`` the connection's reads are made with (over TLS, its TLS protocol's)."""
    transport = request.transport
    reader = getattr(transport, "_ssl_protocol", None) or transport
    return reader.max_size


async def sizes(request: web.BaseRequest) -> web.StreamResponse:
    body = await request.read()
    return web.Response(text=f"{_reader_size(request)} {len(body)}")


def post(length: int) -> bytes:
    return (f"POST / HTTP/1.1\r\nHost: relay\r\nContent-Length: {length}\r\n\r\n".encode() +
            b"x" * length)


def test_a_read_buffer_is_below_the_mmap_threshold() -> None:
    # the bytes object a read makes holds READ_SIZE and its header
    assert READ_SIZE + sys.getsizeof(b"") < MMAP_THRESHOLD


async def test_a_plaintext_connection_reads_at_most_read_size() -> None:
    async with listening(LIMITS, sizes) as listener:
        reader, writer = await connect(listener.port)
        writer.write(post(3 * READ_SIZE + 5))
        status, body = await one_reply(reader)
        writer.close()
    assert status == b"HTTP/1.1 200 OK"
    assert body == f"{READ_SIZE} {3 * READ_SIZE + 5}".encode()


async def test_a_tls_connection_reads_at_most_read_size(tmp_path: Path) -> None:
    authority = Authority(tmp_path)
    leaf = authority.relay_leaf()
    tls = FollowedTLS(leaf.cert_file, leaf.key_file, None, "test.tls", log)
    client = ssl.create_default_context(cafile=str(authority.cert_file))
    async with listening(LIMITS, sizes, tls) as listener:
        reader, writer = await connect(listener.port, client)
        writer.write(post(2 * READ_SIZE))
        status, body = await one_reply(reader)
        writer.close()
    assert status == b"HTTP/1.1 200 OK"
    assert body == f"{READ_SIZE} {2 * READ_SIZE}".encode()
