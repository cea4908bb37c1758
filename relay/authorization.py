"""Who may connect, who may debug, who may have which Secret: decisions on
client identities, no I/O.

A client's identity is what its TLS certificate says: its SPIFFE ID (the URI
SAN ``spiffe://trust-domain/path``) and its DNS SANs. The gRPC adapter
(:mod:`relay.server.access`) reads them from the connection and asks
:class:`Authorizer`; every refusal comes back as a sentence the client's
operator can act on. The Secrets a client may have are a :class:`SecretScope`:
a Secret outside it is, for that client, one that does not exist.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from envoy.config.core.v3 import base_pb2

__all__ = ["EVERY_SECRET", "NAMESPACE", "NO_SECRET", "Authorizer", "IdentityPattern",
           "NodeBinding", "PeerIdentity", "SecretRule", "SecretScope", "is_loopback",
           "node_namespace", "parse_pattern", "parse_secret_identity", "parse_secret_name"]

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
    return _parse(raw, "an empty identity matches no client",
                  "an identity (a string) or a mapping such as "
                  "{prefix: spiffe://cluster.local/ns/prod/}")


def _parse(raw: object, empty: str, expected: str) -> IdentityPattern:
    if isinstance(raw, str):
        if not raw:
            raise ValueError(empty)
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
    raise ValueError(f"expected {expected}")


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


#: The addresses of this host's loopback interface that count as this host:
#: only the canonical ones. Behind an Istio sidecar every inbound connection
#: comes from 127.0.0.6 (the proxy's), whoever the client is.
LOOPBACK_ADDRESSES = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def is_loopback(peer: str) -> bool:
    """Whether a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:%5B::1%5D:5000``,
    ``unix:``) is a process on this host: 127.0.0.1, ::1 (also as
    ``::ffff:127.0.0.1``) or a unix socket; not the rest of 127.0.0.0/8, where
    a sidecar proxy's connections come from."""
    if peer.startswith(("unix:", "unix-abstract:")):
        return True
    scheme, _, rest = peer.replace("%5B", "[").replace("%5D", "]").partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return False
    host = rest.rsplit(":", 1)[0].removeprefix("[").removesuffix("]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address in LOOPBACK_ADDRESSES


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


#: The one placeholder of ``server.authorization.secrets`` rules.
NAMESPACE = "{namespace}"
# What it stands for in an identity: one Kubernetes namespace (a DNS label),
# so that what it captures is never a pattern of its own in a name.
_NAMESPACE_REGEX = "[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def parse_secret_identity(raw: object) -> IdentityPattern:
    """An identity pattern of a ``secrets`` rule: as in ``allow``, and it may
    hold ``{namespace}`` (see :class:`SecretRule`)."""
    return _check_placeholders(parse_pattern(raw))


def parse_secret_name(raw: object) -> IdentityPattern:
    """A Secret name pattern of a ``secrets`` rule: exact, a glob or
    ``{prefix: ...}`` (``{prefix: ""}``: every Secret); it may use ``{namespace}``."""
    if isinstance(raw, Mapping) and dict(raw) == {"prefix": ""}:
        return IdentityPattern("prefix", "")
    return _check_placeholders(_parse(raw, "an empty name matches no Secret",
                                      'a Secret name (a string) or a mapping such as '
                                      '{prefix: "kubernetes://"}'))


def _check_placeholders(pattern: IdentityPattern) -> IdentityPattern:
    for placeholder in _PLACEHOLDER.findall(pattern.value):
        if placeholder != NAMESPACE:
            raise ValueError(f"unknown placeholder {placeholder} in {pattern.value!r} (the "
                             f"one placeholder is {NAMESPACE})")
    return pattern


def _uses_namespace(pattern: IdentityPattern) -> bool:
    return NAMESPACE in pattern.value


def _capturing_regex(pattern: IdentityPattern) -> re.Pattern[str]:
    """``pattern`` as a regular expression in which ``{namespace}`` captures a
    namespace (the same one, where it appears more than once)."""
    if pattern.kind == "glob":
        body = "[^/]*".join(re.escape(part) for part in pattern.value.split("*"))
    else:
        body = re.escape(pattern.value) + ("(?s:.*)" if pattern.kind == "prefix" else "")
    first, *others = body.split(re.escape(NAMESPACE))
    if others:
        first += f"(?P<namespace>{_NAMESPACE_REGEX})"
    return re.compile(first + "(?P=namespace)".join(others))


@dataclass(frozen=True)
class SecretScope:
    """The Secrets one client may receive: those whose name a pattern of
    ``names`` matches. Hashable: clients with equal scopes see the same Secrets."""

    names: frozenset[IdentityPattern] = frozenset()

    def may_read(self, name: str) -> bool:
        """Whether the Secret ``name`` exists for this client."""
        # A loop: any() over a generator costs more, on every lookup.
        for pattern in self.names:  # noqa: SIM110
            if pattern.matches(name):
                return True
        return False

    @property
    def is_empty(self) -> bool:
        """No Secret at all: for this client, the type is empty."""
        return not self.names


#: Every Secret (``{prefix: ""}``), and none.
EVERY_SECRET = SecretScope(frozenset({IdentityPattern("prefix", "")}))
NO_SECRET = SecretScope()


class SecretRule:
    """One ``server.authorization.secrets`` rule: clients with an identity that
    one of ``identities`` matches may receive the Secrets that one of ``names``
    matches.

    ``{namespace}`` in an identity pattern matches one Kubernetes namespace (a
    DNS label) and captures it; in a name pattern it stands for the namespace
    the client's identity captured, as istiod lets a proxy read only the
    Secrets of its own namespace: ``spiffe://cluster.local/ns/{namespace}/sa/*``
    may read ``kubernetes://{namespace}/*``. A rule whose names use
    ``{namespace}`` must capture it in every identity pattern (raises
    ``ValueError`` otherwise, naming the pattern).
    """

    def __init__(self, identities: Sequence[IdentityPattern],
                 names: Sequence[IdentityPattern]) -> None:
        if not identities:
            raise ValueError("a rule without identities grants nothing: list the identities "
                             "that may read these Secrets")
        if not names:
            raise ValueError("a rule without names grants nothing: list the Secret names "
                             "(or {prefix: ...}) these identities may read")
        for pattern in (*identities, *names):
            _check_placeholders(pattern)
        if any(map(_uses_namespace, names)):
            for pattern in identities:
                if not _uses_namespace(pattern):
                    raise ValueError(
                        f"names use {NAMESPACE}, which identity {pattern.value!r} does not "
                        f"capture (write {NAMESPACE} where its namespace is, as in "
                        f"spiffe://cluster.local/ns/{NAMESPACE}/sa/*)")
        self.identities = tuple(identities)
        self.names = tuple(names)
        self._regexes = tuple(map(_capturing_regex, identities))

    def __repr__(self) -> str:
        return f"SecretRule(identities={self.identities!r}, names={self.names!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretRule) and \
            (self.identities, self.names) == (other.identities, other.names)

    def __hash__(self) -> int:
        return hash((self.identities, self.names))

    def granted(self, identity: PeerIdentity) -> Iterator[IdentityPattern]:
        """The name patterns this rule grants ``identity`` (none if it does not
        match), each ``{namespace}`` replaced by the namespace it captured."""
        for regex in self._regexes:
            for name in identity.names:
                match = regex.fullmatch(name)
                if match is None:
                    continue
                namespace = match.groupdict().get("namespace")
                for pattern in self.names:
                    if namespace is not None and _uses_namespace(pattern):
                        yield IdentityPattern(pattern.kind,
                                              pattern.value.replace(NAMESPACE, namespace))
                    else:
                        yield pattern


class Authorizer:
    """The ``server.authorization`` rules.

    ``allow``: identities that may open xDS streams (empty: any client the TLS
    layer let in). ``node_binding``: ``namespace`` — the Node's namespace (and
    service account, when its metadata names one) must be those of its SPIFFE
    ID, as istiod checks; ``id`` — the Node id must be one of the
    certificate's identities. ``debug``: identities that may use CSDS and
    reflection, besides processes on this host when ``debug_loopback``.
    ``secrets``: who may receive which Secrets (None: every client whose
    certificate names it may receive every Secret, a client without one none).
    """

    def __init__(self, allow: Sequence[IdentityPattern] = (), node_binding: NodeBinding = "none",
                 debug: Sequence[IdentityPattern] = (), debug_loopback: bool = True,
                 secrets: Sequence[SecretRule] | None = None) -> None:
        self.allow = tuple(allow)
        self.node_binding: NodeBinding = node_binding
        self.debug = tuple(debug)
        self.debug_loopback = debug_loopback
        self.secrets = None if secrets is None else tuple(secrets)

    def secret_scope(self, identity: PeerIdentity) -> SecretScope:
        """The Secrets a client with ``identity`` may receive.

        Without rules, every Secret for a client whose certificate names it (a
        SPIFFE ID or a DNS SAN), none for a client without one (a plaintext
        port, TLS without client certificates); with rules, what they grant.
        """
        if self.secrets is None:
            return EVERY_SECRET if identity.names else NO_SECRET
        granted = frozenset(pattern for rule in self.secrets
                            for pattern in rule.granted(identity))
        # (one "every Secret" scope for all who may read everything)
        return EVERY_SECRET if EVERY_SECRET.names <= granted else SecretScope(granted)

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
        loopback = ("processes on the relay's host (127.0.0.1, ::1, a unix socket) and "
                    if self.debug_loopback else "")
        return (f"CSDS and reflection answer only {loopback}the identities in "
                f"server.authorization.debug; {identity} is not one of them (the admin "
                f"listener's /clients shows every client)")


def _any_match(patterns: Sequence[IdentityPattern], identity: PeerIdentity) -> bool:
    return any(pattern.matches(name) for pattern in patterns for name in identity.names)
