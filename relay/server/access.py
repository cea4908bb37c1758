"""Who may use the xDS port: TLS credentials, and :class:`Access`, the gRPC
side of :class:`~relay.authorization.Authorizer`.

A client refused gets ``PERMISSION_DENIED`` with the rule's reason; a client
admitted sees the cache through :meth:`Access.client_view`, without the Secrets
it may not have (``server.authorization.secrets``). Each
refusal is counted (``xds_relay_downstream_refused_streams{reason}``) and
logged, at most once per reason per interval with a count of the rest, so
that a misconfigured fleet retrying in a loop cannot flood the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
from envoy.config.core.v3 import base_pb2

from relay.authorization import EVERY_SECRET, Authorizer, PeerIdentity
from relay.certificates import KeyPair, WatchedKeyPair
from relay.errors import RelayError
from relay.logs import RateLimitedLog
from relay.protocol.view import CacheView, ClientView, ScopedView
from relay.telemetry import Metrics
from relay.xds_types import SECRET

log = logging.getLogger("relay.access")

__all__ = ["ANONYMOUS", "Access", "Refused", "server_credentials"]

# How often one kind of refusal is logged at most.
REFUSAL_LOG_INTERVAL = 10.0
#: The ``reason`` of a refusal: not an allowed identity, a Node its
#: certificate does not bind, a debug call from a peer not allowed to debug.
REFUSAL_REASONS = ("identity", "node_binding", "debug")
#: The identity of every client without a certificate: one object, not one a stream.
ANONYMOUS = PeerIdentity()


class Refused(RelayError):
    """A stream's Node broke ``server.authorization.node_binding``; the message says how."""


def server_credentials(watched: WatchedKeyPair) -> grpc.ServerCredentials:
    """Credentials serving ``watched``, re-read when its files change; with a
    client CA, mutual TLS.

    gRPC asks before every TLS handshake whether the certificate changed: new
    connections get the new one, open ones keep theirs (and their streams).
    """

    def configuration(pair: KeyPair) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(pair.key_pem, pair.cert_pem)], root_certificates=pair.client_ca_pem)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC on its own thread; an exception here would fail the
        # handshake, so anything unexpected keeps the current certificate.
        try:
            pair = watched.refresh()
        except Exception:
            log.exception("re-reading the TLS files failed; keeping the current certificate")
            return None
        return configuration(pair) if pair is not None else None

    return grpc.dynamic_ssl_server_credentials(
        configuration(watched.current), fetch,
        require_client_authentication=watched.current.client_ca_pem is not None)


class Access:
    """The authorization rules applied to gRPC calls (see :class:`Authorizer`)."""

    def __init__(self, authorizer: Authorizer, metrics: Metrics,
                 now: Callable[[], float]) -> None:
        self.authorizer = authorizer
        self.metrics = metrics
        self._log = RateLimitedLog(log, REFUSAL_LOG_INTERVAL, now)
        # whether calls need their client's identity: always, as the Secrets
        # a client may have depend on it (on a plaintext port, it has none)
        self.checks_identity = True

    async def admit(self, context: grpc.aio.ServicerContext) -> PeerIdentity:
        """The identity of a client opening an xDS call, or abort the call."""
        identity = PeerIdentity.from_auth_context(context.auth_context())
        if identity == ANONYMOUS:
            identity = ANONYMOUS
        error = self.authorizer.connect_error(identity)
        if error is not None:
            await self.refuse(context, "identity", error)
        return identity

    def client_view(self, view: CacheView, identity: PeerIdentity | None) -> ClientView:
        """What a client with ``identity`` sees of the cache: ``view`` without
        the Secrets it may not have (None: a client without a certificate)."""
        scope = self.authorizer.secret_scope(identity or PeerIdentity())
        if scope == EVERY_SECRET:
            return view
        return ScopedView(view, SECRET, scope)

    def node_error(self, identity: PeerIdentity | None, node: base_pb2.Node | None) -> str | None:
        """Why a stream's first Node is refused, or None (see :meth:`Authorizer.node_error`)."""
        if identity is None:
            return None
        return self.authorizer.node_error(identity, node)

    async def admit_debug(self, context: grpc.aio.ServicerContext) -> None:
        """Abort a CSDS or reflection call from a peer not allowed to debug."""
        peer = context.peer()
        identity = PeerIdentity.from_auth_context(context.auth_context())
        error = self.authorizer.debug_error(identity, peer)
        if error is not None:
            await self.refuse(context, "debug", error)

    def refused(self, reason: str, peer: str, error: str) -> None:
        """Count and (rate-limited) log one refusal."""
        self.metrics.downstream_refused.add(1, {"reason": reason})
        self._log.warning(reason, "refused %s (%s): %s", peer, reason, error)

    async def refuse(self, context: grpc.aio.ServicerContext, reason: str, error: str) -> None:
        """Count, log and end the call with PERMISSION_DENIED and ``error``."""
        self.refused(reason, context.peer(), error)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, error)
