"""How the relay reaches its origin: address, TLS, bearer token, metadata, options.

Credentials are read from their files at every connect, not once at start:
the projected service-account token istiod wants is rewritten by the
kubelet before it expires, and certificates are rotated in place, so a
reconnect always presents the current ones and no restart is needed.

Each connect gets a fresh channel. A gRPC channel kept across attempts adds
its own reconnect backoff (1 s rising to 120 s) to the relay's, and clients
would wait for whichever is longer once the origin is back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from relay.encoding import MAX_MESSAGE_SIZE
from relay.errors import RelayError

#: upstream.connect_timeout (and each fallback server's) when not configured.
DEFAULT_CONNECT_TIMEOUT = 5.0


class DialError(RelayError):
    """A file the connection needs could not be read; the message says which and why."""


@dataclass(frozen=True)
class OriginTLS:
    """TLS towards the origin. Without ``ca_file`` the system's roots are trusted."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    # the name the origin's certificate must carry, when it is not the address's host
    server_name: str | None = None


@dataclass(frozen=True)
class Dialer:
    """Everything needed to open a channel and a stream to one server of an origin."""

    target: str
    tls: OriginTLS | None = None
    # a file holding a token sent as ``authorization: Bearer <token>``
    token_file: Path | None = None
    # extra request metadata, e.g. istiod's ``clusterid``
    initial_metadata: tuple[tuple[str, str], ...] = ()
    keepalive_time: float = 30.0
    keepalive_timeout: float = 10.0
    max_response_size: int = MAX_MESSAGE_SIZE
    # how long a connect (TCP, TLS, HTTP/2) may take before the attempt counts as failed
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    # where the server is configured (``upstream``, ``upstream.fallback[0]``, ...):
    # errors about its files name the key to fix
    key: str = "upstream"

    def options(self) -> list[tuple[str, Any]]:
        """Channel arguments."""
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", self.max_response_size),
            # istiod closes connections that ping more often than every 15 s;
            # the default 30 s is well clear of that.
            ("grpc.keepalive_time_ms", int(self.keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout * 1000)),
            # What ends a connection whose ping goes unanswered: without it gRPC
            # waits a minute, whatever keepalive_timeout says.
            ("grpc.http2.ping_timeout_ms", int(self.keepalive_timeout * 1000)),
            # Keep pinging on an idle stream (gRPC stops after two pings
            # without data otherwise): a quiet origin is the normal case.
            ("grpc.http2.max_pings_without_data", 0),
            # A channel of its own, not one shared through gRPC's global pool
            # (which would bring along the old attempt's backoff).
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self.tls is not None and self.tls.server_name:
            options.append(("grpc.ssl_target_name_override", self.tls.server_name))
        return options

    def channel(self) -> grpc.aio.Channel:
        """A new channel to the origin, with the current certificates."""
        if self.tls is None:
            return grpc.aio.insecure_channel(self.target, options=self.options())
        tls = self.tls
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(tls.ca_file, f"{self.key}.tls.ca_file"),
            private_key=_read(tls.key_file, f"{self.key}.tls.key_file"),
            certificate_chain=_read(tls.cert_file, f"{self.key}.tls.cert_file"))
        return grpc.aio.secure_channel(self.target, credentials, options=self.options())

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Request metadata for a new stream, with the token as it is now."""
        if self.token_file is None:
            return self.initial_metadata
        raw = _read(self.token_file, f"{self.key}.token_file")
        assert raw is not None
        token = raw.decode("utf-8", errors="replace").strip()
        if not token:
            raise DialError(f"{self.key}.token_file {self.token_file} is empty")
        return (("authorization", f"Bearer {token}"), *self.initial_metadata)


def _read(path: Path | None, key: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as error:
        raise DialError(f"cannot read {key} {path}: {error.strerror or error}") from None
