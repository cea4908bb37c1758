"""What the relay's HTTP servers (admin, REST polling) share: a TLS context
that follows its files through rotation, and quiet logs for malformed requests."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from relay.certificates import CertificateError, WatchedKeyPair
from relay.config.values import Address

__all__ = ["FollowedTLS", "listen", "quiet_malformed_requests"]


async def listen(handle: Callable[[web.Request], Awaitable[web.StreamResponse]],
                 address: Address, key: str, tls: FollowedTLS | None,
                 http_log: logging.Logger, grace: float, reuse_port: bool = False
                 ) -> tuple[web.AppRunner, int]:
    """Serve every request (any method, any path) with ``handle`` on
    ``address``: the runner (its ``cleanup`` stops it, letting requests in
    progress finish within ``grace`` seconds) and the bound port. No access
    log; aiohttp's own lines go to ``http_log``. ``OSError`` naming the
    config ``key`` of the address when it cannot listen."""
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", handle)
    runner = web.AppRunner(app, access_log=None, logger=http_log, shutdown_timeout=grace)
    await runner.setup()
    site = web.TCPSite(runner, address.host, address.port,
                       ssl_context=tls.context if tls is not None else None,
                       reuse_port=reuse_port or None)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        raise OSError(f"cannot listen on {address} ({key}): "
                      f"{error.strerror or error}") from None
    return runner, int(runner.addresses[0][1])


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
    """aiohttp logs a malformed request to ``http_log`` at ERROR with a
    traceback: anyone who can connect could fill the log. Those become one
    DEBUG line on ``log``; errors of ours pass."""

    def quiet(record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            log.debug("%s: %s %s", record.getMessage(), error.code, error.message)
            return False
        return True

    http_log.addFilter(quiet)
