"""What the relay's HTTP servers (admin, REST polling) share: how they listen
(with the limits of :mod:`relay.http_limits`), a TLS context that follows its
files through rotation, and quiet logs for what clients can cause at will."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from relay.certificates import CertificateError, WatchedKeyPair
from relay.http_limits import ConnectionDeadline, HostConnections, HttpLimits, Phase
from relay.logs import RateLimitedLog

if TYPE_CHECKING:
    from relay.config.values import Address

__all__ = ["READ_SIZE", "RETRY_AFTER", "FollowedTLS", "Listener", "listen",
           "quiet_malformed_requests"]

#: What a 429 or 503 tells a client to wait, in seconds.
RETRY_AFTER = "1"


class Listener:
    """One HTTP server listening (see :func:`listen`): its bound ``port``."""

    def __init__(self, server: asyncio.Server, http: web.Server, grace: float,
                 connections: HostConnections) -> None:
        self._server = server
        self._http = http
        self._grace = grace
        self._connections = connections
        self.port = int(server.sockets[0].getsockname()[1])

    def connections_from(self, host: str) -> int:
        """Connections open now from ``host``, as ``connections_per_host`` counts them."""
        return self._connections.open(host)

    def hosts(self) -> int:
        """Client hosts with a connection open now."""
        return self._connections.hosts()

    async def close(self) -> None:
        """Stop listening; requests in progress get the grace to finish, and
        every connection is closed."""
        self._server.close()
        # As aiohttp's runners do: requests already in start to be handled,
        # idle connections close now, the others once their request is answered.
        await asyncio.sleep(0)
        self._http.pre_shutdown()
        await self._http.shutdown(self._grace)


async def listen(handle: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
                 section: str, address: Address, tls: FollowedTLS | None, limits: HttpLimits,
                 client_log: RateLimitedLog, http_log: logging.Logger, grace: float,
                 reuse_port: bool = False) -> Listener:
    """Serve every request (any method, any path) with ``handle`` on
    ``address``, the config key ``<section>.address``, within ``limits``
    (``<section>.*``, as the lines and replies name them); ``close`` on the
    listener stops it, letting requests in progress finish within ``grace``
    seconds. No access log; aiohttp's own lines go to ``http_log``, and lines
    a client causes (a connection refused, a timeout) to ``client_log``.
    ``OSError`` naming the key when it cannot listen.

    ``handle`` writes no more than its response: a body it does not read is
    not drained (the connection is closed after the response instead).
    """
    loop = asyncio.get_running_loop()
    http = web.Server(_written_here(handle))
    shared = _Shared(section, limits, HostConnections(limits.connections_per_host), client_log,
                     http_log)
    options: dict[str, Any] = {
        "access_log": None,  # no access log: probes ask every few seconds
        "logger": http_log,
        # aiohttp's own idle close, left as a backstop after the connection's own
        "keepalive_timeout": limits.idle_timeout + limits.header_timeout,
        "lingering_time": 0,  # an unread body closes the connection, rather than being read
        # a body is taken as sent: no client makes the relay inflate one (a
        # deflate bomb grows a thousandfold within a single read)
        "auto_decompress": False,
    }

    def connection() -> _Connection:
        return _Connection(http, shared, loop=loop, **options)

    try:
        server = await loop.create_server(
            connection, address.host, address.port, reuse_port=reuse_port or None, backlog=128,
            ssl=tls.context if tls is not None else None,
            # the TLS handshake comes before the first request's headers
            ssl_handshake_timeout=limits.header_timeout if tls is not None else None)
    except OSError as error:
        raise OSError(f"cannot listen on {address} ({section}.address): "
                      f"{error.strerror or error}") from None
    return Listener(server, http, grace, shared.connections)


def _written_here(handle: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
                  ) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    """``handle``, its response written before it returns, so that the
    connection is idle only once it is (aiohttp would write it after), and a
    large body a slice at a time (:data:`WRITE_SLICE`)."""
    async def handled(request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        assert isinstance(connection, _Connection)
        connection.request_started()
        try:
            response = await handle(request)
            with contextlib.suppress(ConnectionError):  # the client left: nothing to tell
                if request.method != "HEAD" and isinstance(response, web.Response) and \
                        isinstance(response.body, bytes) and len(response.body) > WRITE_SLICE:
                    return await _sliced(request, response, response.body)
                await response.prepare(request)
                await response.write_eof()
            return response
        finally:
            connection.request_ended()
    return handled


#: A body longer than this is written this many bytes at a time, each
#: waiting for the client to take the last (``/clients`` of 200 clients of
#: 5,000 resources is 35 MB: written at once, its copies held the loop
#: 60-150 ms).
WRITE_SLICE = 1024 * 1024


async def _sliced(request: web.BaseRequest, response: web.Response, body: bytes
                  ) -> web.StreamResponse:
    """``response`` written :data:`WRITE_SLICE` bytes at a time."""
    sliced = web.StreamResponse(status=response.status, reason=response.reason,
                                headers={key: value for key, value in response.headers.items()
                                         if key.lower() != "content-length"})
    sliced.content_length = len(body)
    if response.keep_alive is False:
        sliced.force_close()
    await sliced.prepare(request)
    view = memoryview(body)
    for start in range(0, len(body), WRITE_SLICE):
        await sliced.write(view[start:start + WRITE_SLICE])
    await sliced.write_eof()
    return sliced


#: The most bytes one read of a connection takes (asyncio reads 256 KiB).
#: Each read allocates a buffer that large and shrinks it to what came; at
#: the relay's fixed mmap threshold of then (256 KiB, see
#: :data:`relay.memory.MMAP_THRESHOLD`) glibc mapped and unmapped one for
#: every read: 12-15 us a read (a REST poll's ``304`` cost 1.5-1.8x the bare
#: aiohttp server's, whose threshold had risen past it). Below today's
#: threshold either size comes from the heap; 64 KiB keeps what an idle
#: connection's read takes small. A poll's body is a few KiB, a 50,000-name
#: one ten reads.
READ_SIZE = 64 * 1024


def _read_at_most(transport: asyncio.BaseTransport, size: int) -> None:
    """Have ``transport`` read at most ``size`` bytes at a time: its own
    reads, or over TLS its TLS protocol's (asyncio's ``max_size``, where
    it has one; a transport without one is left as it is)."""
    reader = getattr(transport, "_ssl_protocol", None) or transport
    if getattr(reader, "max_size", 0) > size:
        cast(Any, reader).max_size = size


class _Shared:
    """What every connection of one listener shares."""

    __slots__ = ("client_log", "connections", "http_log", "limits", "section")

    def __init__(self, section: str, limits: HttpLimits, connections: HostConnections,
                 client_log: RateLimitedLog, http_log: logging.Logger) -> None:
        self.section = section
        self.limits = limits
        self.connections = connections
        self.client_log = client_log
        self.http_log = http_log


class _Connection(web.RequestHandler):
    """aiohttp's HTTP/1.1 connection, with the listener's limits: a host over
    its connections is answered 429 and closed before anything is read, and a
    connection is closed when its :class:`ConnectionDeadline` passes (408 when
    its request's headers were too slow)."""

    __slots__ = ("_call_at", "_closed", "_deadline", "_host", "_shared", "_timer", "_when")

    def __init__(self, manager: web.Server, shared: _Shared, *,
                 loop: asyncio.AbstractEventLoop, **options: Any) -> None:
        super().__init__(manager, loop=loop, **options)
        self._shared = shared
        self._when = loop.time
        self._call_at = loop.call_at
        self._host: str | None = None  # set once counted
        self._deadline: ConnectionDeadline | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        shared = self._shared
        peername = transport.get_extra_info("peername")
        host = str(peername[0]) if isinstance(peername, tuple) and peername else "unknown"
        if not shared.connections.admit(host):
            self._closed = True
            self._refuse(transport, host)
            return
        self._host = host
        limits = shared.limits
        self._deadline = ConnectionDeadline(limits.header_timeout, limits.idle_timeout,
                                            self._when())
        _read_at_most(transport, READ_SIZE)
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        deadline = self._deadline
        if deadline is None:
            return  # refused: nothing is read
        if deadline.received(self._when()):
            self._arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._host is None:
            return  # refused: never counted, never started
        self._closed = True
        self._shared.connections.leave(self._host)
        self._host = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def request_started(self) -> None:
        """A request's headers are in: it is handled, with no deadline here."""
        if self._deadline is not None:
            self._deadline.request_started()
            self._arm()

    def request_ended(self) -> None:
        """The request is answered: wait for the next one."""
        if self._deadline is not None and not self._closed:
            now = self._when()
            self._deadline.request_ended(now)
            self._arm(now + self._shared.limits.header_timeout)

    def _arm(self, by: float | None = None) -> None:
        """Have the timer fire by the deadline (and by ``by``). A timer set
        for sooner is left: it finds nothing overdue then, and is set again.
        A request moves the deadline three times, and a timer cancelled and
        made anew each time cost more than the rest of what the connection
        does; an idle connection's timer is set no later than the next
        request's header deadline could be, so that a request keeps it."""
        assert self._deadline is not None
        when = self._deadline.deadline
        if when is None or self._closed:
            return  # (a timer set finds nothing overdue)
        if by is not None and by < when:
            when = by
        timer = self._timer
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timer = self._call_at(when, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        assert self._deadline is not None
        phase = self._deadline.overdue(self._when())
        if phase is None:  # woken early: the deadline moved on (or there is none now)
            self._arm(self._when() + self._shared.limits.header_timeout)
            return
        shared, host = self._shared, self._host or "unknown"
        if phase is Phase.HEADERS:
            key = f"{shared.section}.header_timeout"
            message = (f"the request's headers took more than "
                       f"{shared.limits.header_timeout:g}s ({key})")
            shared.client_log.warning(key, "closing a connection from %s: %s", host, message,
                                      host=host)
            if self.transport is not None:
                self.transport.write(_reply(408, "Request Timeout", message))
        else:
            shared.http_log.debug("closing a connection from %s idle for %gs (%s.idle_timeout)",
                                  host, shared.limits.idle_timeout, shared.section)
        self.force_close()

    def _refuse(self, transport: asyncio.BaseTransport, host: str) -> None:
        shared = self._shared
        key = f"{shared.section}.connections_per_host"
        message = (f"too many connections from {host}: at most "
                   f"{shared.connections.limit} at once from one host ({key})")
        shared.client_log.warning(key, "refusing a connection from %s: %s", host, message,
                                  host=host)
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_reply(429, "Too Many Requests", message,
                               {"Retry-After": RETRY_AFTER}))
        transport.close()


def _reply(status: int, reason: str, message: str,
           headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 reply that closes the connection, written before (or
    instead of) reading a request."""
    body = f"{message}\n".encode()
    lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: text/plain; charset=utf-8",
             f"Content-Length: {len(body)}", "Connection: close",
             *(f"{name}: {value}" for name, value in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class FollowedTLS:
    """A server's TLS context that follows its certificate files.

    ``context`` is the one the server listens with; at each handshake (its
    ``sni_callback``, asked with or without SNI) the files' ``stat`` is
    compared, and a changed, whole pair becomes a fresh context that this and
    later connections are handed. A half-rotated or broken pair is logged
    once per change (by :class:`WatchedKeyPair`) and the last good one kept.
    With ``client_ca_file``, every client must present a certificate that
    chains to it. ``key`` is the config key the files come from, as errors
    and warnings name it; ``log`` where the warnings go.

    Raises ``OSError`` naming ``key`` when the files cannot be used at start.
    """

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None,
                 key: str, log: logging.Logger) -> None:
        self._files = (cert_file, key_file)
        self._key = key
        self._log = log
        try:
            # A watcher of its own: each change is told once per watcher, and
            # each server asks on its own schedule.
            self._pair = WatchedKeyPair(cert_file, key_file, client_ca_file)
            self.context = self._new_context()
        except (CertificateError, ssl.SSLError, OSError) as error:
            raise OSError(f"{key}: {error}") from None
        self.mutual = client_ca_file is not None
        self.context.sni_callback = self._on_client_hello
        self._current = self.context

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*self._files)
        client_ca = self._pair.current.client_ca_pem
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=client_ca.decode("ascii"))
        return context

    def _on_client_hello(self, connection: ssl.SSLObject | ssl.SSLSocket,
                         server_name: str | None, context: ssl.SSLContext) -> None:
        try:
            changed = self._pair.refresh() is not None
        except Exception as error:  # escaping, it would fail every handshake
            # (refresh noted the change first: logged once per change, like its own warnings)
            self._log.warning("%s files changed but cannot be read (%s); still serving the "
                              "previous certificate", self._key, error)
            changed = False
        if changed:
            try:
                # From the files again: they may have moved on since the check
                # (OpenSSL checks the key against the certificate once more).
                self._current = self._new_context()
            except (ssl.SSLError, OSError) as error:
                self._log.warning("%s files changed again while being read (%s); still "
                                  "serving the previous certificate", self._key, error)
        if self._current is not self.context:
            connection.context = self._current


def quiet_malformed_requests(http_log: logging.Logger, log: logging.Logger) -> None:
    """aiohttp logs a malformed request, or a client that left mid-request,
    to ``http_log`` at ERROR with a traceback: anyone who can connect could
    fill the log. Those become one DEBUG line on ``log``; errors of ours pass."""

    def quiet(record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            log.debug("%s: %s %s", record.getMessage(), error.code, error.message)
            return False
        if isinstance(error, ConnectionError):
            log.debug("%s: %s", record.getMessage(), error)
            return False
        return True

    http_log.addFilter(quiet)
