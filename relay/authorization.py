"""Who may connect, and who may debug: decisions on client identities, no I/O.

A client's identity is what its TLS certificate says: its SPIFFE ID (the URI
SAN ``spiffe://trust-domain/path``) and its DNS SANs. The gRPC adapter
(:mod:`relay.server.access`) reads them from the connection and asks
:class:`Authorizer`; every refusal comes back as a sentence the client's
operator can act on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from envoy.config.core.v3 import base_pb2

__all__ = ["Authorizer", "IdentityPattern", "NodeBinding", "PeerIdentity", "is_loopback",
           "node_namespace", "parse_pattern"]

PatternKind = Literal["exact", "prefix", "glob"]
NodeBinding = Literal["none", "namespace", "id"]
PATTERN_KINDS: tuple[PatternKind, ...] = ("exact", "prefix", "glob")


@dataclass(frozen=True)
class IdentityPattern:
    """An identity or a family of them.

    ``glob``: ``*`` stands for any run of characters other than ``/`` (one
    SPIFFE path segment, or any part of a DNS name); nothing else is special.
    """

    kind: PatternKind
    value: str
    _regex: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind == "glob":
            parts = (re.escape(part) for part in self.value.split("*"))
            object.__setattr__(self, "_regex", re.compile("[^/]*".join(parts)))

    def matches(self, identity: str) -> bool:
        if self.kind == "exact":
            return identity == self.value
        if self.kind == "prefix":
            return identity.startswith(self.value)
        assert self._regex is not None
        return self._regex.fullmatch(identity) is not None


def parse_pattern(raw: object) -> IdentityPattern:
    """A pattern as the config writes it: a string (exact, or a glob if it has a
    ``*``), or a mapping of one of ``exact``, ``prefix``, ``glob`` to a string."""
    if isinstance(raw, str):
        if not raw:
            raise ValueError("an empty identity matches no client")
        return IdentityPattern("glob" if "*" in raw else "exact", raw)
    if isinstance(raw, Mapping):
        if len(raw) != 1:
            raise ValueError(f"expected one of {', '.join(PATTERN_KINDS)}, got "
                             f"{', '.join(map(str, raw)) or 'an empty mapping'}")
        ((kind, value),) = raw.items()
        if kind not in PATTERN_KINDS:
            raise ValueError(f"unknown form {kind!r} (expected a string, or one of "
                             f"{', '.join(PATTERN_KINDS)})")
        if not isinstance(value, str) or not value:
            raise ValueError(f"{kind}: expected a non-empty string")
        return IdentityPattern(kind, value)
    raise ValueError("expected an identity (a string) or a mapping such as "
                     "{prefix: spiffe://cluster.local/ns/prod/}")


@dataclass(frozen=True)
class PeerIdentity:
    """What a client's certificate says it is (both empty: no certificate)."""

    spiffe_id: str | None = None
    dns_names: tuple[str, ...] = ()

    @classmethod
    def from_auth_context(cls, auth: Mapping[str, Iterable[bytes]]) -> PeerIdentity:
        """From gRPC's auth context (``peer_spiffe_id`` is set only for a
        certificate with exactly one URI SAN that is a valid SPIFFE ID)."""
        spiffe = list(auth.get("peer_spiffe_id", ()))
        return cls(spiffe[0].decode() if spiffe else None,
                   tuple(name.decode() for name in auth.get("peer_dns", ())))

    @property
    def names(self) -> tuple[str, ...]:
        """Every identity the certificate carries, SPIFFE ID first."""
        return ((self.spiffe_id,) if self.spiffe_id else ()) + self.dns_names

    def __str__(self) -> str:
        if not self.names:
            return "a client without a certificate identity (no SPIFFE ID or DNS SAN)"
        return " / ".join(self.names)


def is_loopback(peer: str) -> bool:
    """Whether a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:%5B::1%5D:5000``,
    ``unix:``) is a process on this host."""
    peer = peer.replace("%5B", "[").replace("%5D", "]")
    return peer.startswith(("ipv4:127.", "ipv6:[::1]:", "ipv6:[::ffff:127.", "unix:",
                            "unix-abstract:"))


def node_namespace(node: base_pb2.Node) -> str | None:
    """The Kubernetes namespace a Node declares: its ``NAMESPACE`` metadata, or
    the one in an Istio-style id (``sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local``)."""
    declared = node.metadata.fields.get("NAMESPACE")
    if declared is not None and declared.WhichOneof("kind") == "string_value":
        value: str = declared.string_value
        if value:
            return value
    parts = node.id.split("~")
    # istiod reads it from the DNS domain (a pod name may hold dots)
    if len(parts) == 4 and "." in parts[3]:
        namespace: str = parts[3].split(".", 1)[0]
        return namespace or None
    return None


def _spiffe_namespace(spiffe_id: str) -> tuple[str | None, str | None]:
    """The namespace and service account of a Kubernetes SPIFFE ID
    (``spiffe://td/ns/NS/sa/SA``), or (None, None)."""
    path = spiffe_id.removeprefix("spiffe://").split("/")[1:]
    if len(path) == 4 and path[0] == "ns" and path[2] == "sa":
        return path[1], path[3]
    return None, None


class Authorizer:
    """The ``server.authorization`` rules.

    ``allow``: identities that may open xDS streams (empty: any client the TLS
    layer let in). ``node_binding``: ``namespace`` — the Node's namespace (and
    service account, when its metadata names one) must be those of its SPIFFE
    ID, as istiod checks; ``id`` — the Node id must be one of the
    certificate's identities. ``debug``: identities that may use CSDS and
    reflection, besides processes on this host when ``debug_loopback``.
    """

    def __init__(self, allow: Sequence[IdentityPattern] = (), node_binding: NodeBinding = "none",
                 debug: Sequence[IdentityPattern] = (), debug_loopback: bool = True) -> None:
        self.allow = tuple(allow)
        self.node_binding: NodeBinding = node_binding
        self.debug = tuple(debug)
        self.debug_loopback = debug_loopback

    def connect_error(self, identity: PeerIdentity) -> str | None:
        """Why ``identity`` may not open xDS streams, or None."""
        if not self.allow or _any_match(self.allow, identity):
            return None
        return (f"client identity {identity} is not allowed to connect "
                f"(server.authorization.allow)")

    def node_error(self, identity: PeerIdentity, node: base_pb2.Node | None) -> str | None:
        """Why a stream of ``identity`` may not present ``node``, or None."""
        if self.node_binding == "none":
            return None
        if node is None or not node.id:
            return ("the first request carries no node id; server.authorization.node_binding "
                    "needs one")
        if self.node_binding == "id":
            if node.id in identity.names:
                return None
            return (f"node id {node.id!r} is not the identity of its certificate ({identity}) "
                    f"(server.authorization.node_binding: id)")
        namespace = node_namespace(node)
        if namespace is None:
            return (f"node {node.id!r} declares no namespace (NAMESPACE metadata or an "
                    f"Istio-style id); server.authorization.node_binding: namespace needs one")
        cert_namespace, cert_account = _spiffe_namespace(identity.spiffe_id or "")
        if cert_namespace is None:
            return (f"the certificate ({identity}) has no Kubernetes SPIFFE ID "
                    f"(spiffe://<trust domain>/ns/<namespace>/sa/<service account>) to bind "
                    f"node {node.id!r} to (server.authorization.node_binding: namespace)")
        if namespace != cert_namespace:
            return (f"node {node.id!r} is in namespace {namespace!r} but its certificate "
                    f"{identity.spiffe_id} is for namespace {cert_namespace!r} "
                    f"(server.authorization.node_binding: namespace)")
        account_field = node.metadata.fields.get("SERVICE_ACCOUNT")
        account = account_field.string_value if account_field is not None else ""
        if account and account != cert_account:
            return (f"node {node.id!r} runs as service account {account!r} but its certificate "
                    f"{identity.spiffe_id} is for {cert_account!r} "
                    f"(server.authorization.node_binding: namespace)")
        return None

    def debug_error(self, identity: PeerIdentity, peer: str) -> str | None:
        """Why ``identity`` connecting from ``peer`` may not use CSDS or reflection, or None."""
        if self.debug_loopback and is_loopback(peer):
            return None
        if _any_match(self.debug, identity):
            return None
        loopback = "processes on the relay's host and " if self.debug_loopback else ""
        return (f"CSDS and reflection answer only {loopback}the identities in "
                f"server.authorization.debug; {identity} is not one of them (the admin "
                f"listener's /clients shows every client)")


def _any_match(patterns: Sequence[IdentityPattern], identity: PeerIdentity) -> bool:
    return any(pattern.matches(name) for pattern in patterns for name in identity.names)
