"""The config schema: one frozen pydantic model per section, :class:`RelayConfig` the root.

Every leaf field has a one-line ``description``: ``xds-relay keys`` lists the
keys, their defaults and those descriptions from these models.
"""

from __future__ import annotations

import types
import typing
import warnings
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from relay.authorization import NodeBinding, SecretRule
from relay.certificates import CertificateError, load_key_pair
from relay.config.values import (
    MAX_MESSAGE_SIZE,
    Address,
    AddressField,
    AuthorityField,
    BufferSizeField,
    CertificateFileField,
    CountField,
    DirectoryField,
    DurationField,
    FileField,
    HeadersField,
    IdentityPatternField,
    KeyFileField,
    MetadataField,
    NodeSizeField,
    PositiveDurationField,
    RedisUrlField,
    RequestSizeField,
    ResponseSizeField,
    SecretIdentityPatternField,
    SecretNamePatternField,
    SnapshotDirectoryField,
    WorkerCountField,
    format_size,
    is_dns_name,
)
from relay.http_limits import DEFAULT_HTTP_LIMITS, HttpLimits
from relay.node_groups import (
    DEFAULT_GROUP_LINGER,
    DEFAULT_MAX_GROUPS,
    GroupSpec,
    field_error,
)
from relay.protocol.limits import DEFAULT_LIMITS
from relay.protocol.sizing import DEFAULT_MAX_RESPONSE_SIZE
from relay.server.fetch import DEFAULT_LEASE, DEFAULT_WAIT
from relay.sources.files import DEFAULT_POLL_INTERVAL
from relay.telemetry import DEFAULT_OTLP_INTERVAL
from relay.upstream.dial import DEFAULT_CONNECT_TIMEOUT
from relay.upstream.state import DEFAULT_LINGER_NAMES, DEFAULT_MAX_REQUEST_SIZE, SETTLE_GRACE

#: server.max_connection_age and its grace, when not configured (istiod's age).
DEFAULT_MAX_CONNECTION_AGE = 30 * 60.0
DEFAULT_MAX_CONNECTION_AGE_GRACE = 10.0
#: upstream.linger when not configured: well past a reconnect.
DEFAULT_LINGER = 30.0

__all__ = [
    "LOG_LEVELS",
    "AdminConfig",
    "AdminTLSConfig",
    "AuthorizationConfig",
    "BackoffConfig",
    "ClientKeepaliveConfig",
    "FallbackServerConfig",
    "KeepaliveConfig",
    "LimitsConfig",
    "Locality",
    "LoggingConfig",
    "MetricsConfig",
    "NodeConfig",
    "OtlpConfig",
    "PersistenceConfig",
    "RedisConfig",
    "RelayConfig",
    "RestConfig",
    "SecretRuleConfig",
    "ServerConfig",
    "ServerTLSConfig",
    "UpstreamConfig",
    "UpstreamTLSConfig",
    "section_model",
]

LOG_LEVELS = ("debug", "info", "warning", "error")


def section_model(annotation: object) -> type[BaseModel] | None:
    """The model in a field's type (``X`` or ``X | None``): the field is a section."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = section_model(arg)
            if found is not None:
                return found
    return None


class _Section(BaseModel):
    """Base of every config section: unknown keys rejected, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_is_defaults(cls, data: object) -> object:
        # `admin:` with every key commented out is null in YAML; treat it as
        # an empty section rather than a type error.
        return {} if data is None else data


class Locality(_Section):
    """Where the relay runs (Envoy ``core.v3.Locality``)."""

    region: str = Field(default="", description="the region of the relay's locality")
    zone: str = Field(default="", description="the zone of the relay's locality")
    sub_zone: str = Field(default="", description="the sub-zone of the relay's locality")


class NodeConfig(_Section):
    """The identity the relay presents to its origin (Envoy ``core.v3.Node``)."""

    id: str = Field(
        min_length=1,
        description="the node id presented to the origin (run --node-id overrides it)")
    cluster: str = Field(
        default="xds-relay", description="the node cluster presented to the origin")
    locality: Locality = Locality()
    metadata: MetadataField = Field(
        default_factory=dict,
        description="free-form node metadata, sent to the origin as a protobuf Struct")


def _check_key_pair(cert_file: Path, key_file: Path, client_ca_file: Path | None = None
                    ) -> None:
    """A validation error unless the key is the certificate's (and the CA a CA file)."""
    try:
        load_key_pair(cert_file, key_file, client_ca_file)
    except CertificateError as error:
        raise ValueError(str(error)) from None


class ServerTLSConfig(_Section):
    """TLS on the xDS port; with ``client_ca_file``, mutual TLS. The files are
    re-read when they change: new connections get the new certificate."""

    cert_file: CertificateFileField = Field(
        description="the relay's PEM certificate chain (cert-manager: tls.crt)")
    key_file: KeyFileField = Field(
        description="the PEM private key of cert_file (cert-manager: tls.key)")
    client_ca_file: CertificateFileField | None = Field(
        default=None,
        description="PEM roots that client certificates must chain to (cert-manager: "
                    "ca.crt); set: mutual TLS, and every client must present a certificate "
                    "(gRPC's Python server cannot ask for an optional one)")

    @model_validator(mode="after")
    def _usable(self) -> ServerTLSConfig:
        _check_key_pair(self.cert_file, self.key_file, self.client_ca_file)
        return self


class SecretRuleConfig(_Section):
    """One ``server.authorization.secrets`` rule (see :class:`~relay.authorization.SecretRule`)."""

    identities: list[SecretIdentityPatternField] = Field(
        description="identities that may read the Secrets of names (patterns as in allow); "
                    "{namespace} matches a namespace and captures it")
    names: list[SecretNamePatternField] = Field(
        description="Secret names they may read: exact, a glob or {prefix: ...} "
                    '({prefix: ""}: every Secret); {namespace}: the one the identity captured')

    @model_validator(mode="after")
    def _coherent(self) -> SecretRuleConfig:
        self.rule()
        return self

    def rule(self) -> SecretRule:
        """The rule, as :class:`~relay.authorization.Authorizer` applies it."""
        return SecretRule(self.identities, self.names)


class AuthorizationConfig(_Section):
    """Which client identities (from their certificates) may connect, debug and
    receive which Secrets."""

    allow: list[IdentityPatternField] = Field(
        default_factory=list,
        description="identities (SPIFFE ID or DNS SAN) that may open xDS streams: exact, "
                    "a glob (* is any run of characters but /) or {prefix: ...}; empty: any "
                    "certificate client_ca_file signed")
    node_binding: NodeBinding = Field(
        default="none",
        description="namespace: a Node's namespace (and service account) must be those of "
                    "its SPIFFE ID, as istiod checks; id: the Node id must be an identity of "
                    "its certificate; none: not checked")
    debug: list[IdentityPatternField] = Field(
        default_factory=list,
        description="identities that may use CSDS and server reflection on the xDS port "
                    "(patterns as in allow)")
    debug_loopback: bool = Field(
        default=True,
        description="processes on the relay's own host (127.0.0.1, ::1, a unix socket) may "
                    "use CSDS and reflection too; behind a sidecar every client connects "
                    "from 127.0.0.6, which is not one of them")
    secrets: list[SecretRuleConfig] | None = Field(
        default=None,
        description="who may receive which Secrets: rules {identities: [...], names: [...]}, "
                    "e.g. identities [spiffe://cluster.local/ns/{namespace}/sa/*], names "
                    "[kubernetes://{namespace}/*]; a Secret a client may not have does not "
                    "exist for it. Unset: every client whose certificate names it (mutual "
                    "TLS) may have every Secret, a client without one none; []: no client")

    def secret_rules(self) -> list[SecretRule] | None:
        """The ``secrets`` rules (None: unset, the default of :class:`Authorizer`)."""
        return None if self.secrets is None else [rule.rule() for rule in self.secrets]


class ClientKeepaliveConfig(_Section):
    """HTTP/2 keepalive pings to every client connection: how a client that
    froze or vanished (no FIN ever comes) is found and its streams freed."""

    time: PositiveDurationField = Field(
        default=30.0, description="how long a connection may be silent before it is pinged")
    timeout: PositiveDurationField = Field(
        default=10.0,
        description="how long a ping may go unanswered before the connection and its streams "
                    "are closed: a dead client is freed within time + timeout")


class LimitsConfig(_Section):
    """What one client may ask of the relay. A client beyond a limit gets
    RESOURCE_EXHAUSTED naming it; xds_relay_downstream_limited_streams_total
    counts them."""

    streams: CountField = Field(
        default=DEFAULT_LIMITS.streams,
        description="downstream streams open at once, all clients together")
    streams_per_connection: CountField = Field(
        default=DEFAULT_LIMITS.streams_per_connection,
        description="streams open at once on one client connection; also what the relay "
                    "advertises in HTTP/2 SETTINGS (MAX_CONCURRENT_STREAMS), so that a "
                    "client resetting streams in a loop (rapid reset) holds no more")
    streams_per_host: CountField = Field(
        default=DEFAULT_LIMITS.streams_per_host,
        description="streams open at once from one client host (its address), all its "
                    "connections together")
    connections_per_host: CountField = Field(
        default=DEFAULT_LIMITS.connections_per_host,
        description="connections with a stream open, from one client host")
    new_streams_per_second: CountField = Field(
        default=DEFAULT_LIMITS.new_streams_per_second,
        description="new streams taken a second (per process), after a burst of "
                    "new_streams_burst: one over it waits its turn up to 1s, then gets "
                    "UNAVAILABLE and backs off, perhaps to another replica; open streams are "
                    "never touched")
    new_streams_burst: CountField = Field(
        default=DEFAULT_LIMITS.new_streams_burst,
        description="new streams taken at once before new_streams_per_second applies")
    leases_per_host: CountField = Field(
        default=DEFAULT_LIMITS.leases_per_host,
        description="resource sets one client host's REST polls and gRPC fetches keep "
                    "subscribed at once (each for rest.lease after its last poll)")
    names_per_request: CountField = Field(
        default=DEFAULT_LIMITS.names_per_request,
        description="resource names (and locators) one request subscribes or unsubscribes")
    names_per_stream: CountField = Field(
        default=DEFAULT_LIMITS.names_per_stream,
        description="resource names one stream subscribes to, all types")
    name_length: CountField = Field(
        default=DEFAULT_LIMITS.name_length, description="characters in one resource name")
    node_size: NodeSizeField = Field(
        default=DEFAULT_LIMITS.node_size, description="the encoded size of a client's Node")
    dynamic_parameters: CountField = Field(
        default=DEFAULT_LIMITS.dynamic_parameters,
        description="dynamic parameters of one locator (or of the Node, per type)")
    upstream_names: CountField = Field(
        default=DEFAULT_LIMITS.upstream_names,
        description="resource names clients make the relay subscribe on its origin stream, "
                    "all types and clients together (with server.workers, each process "
                    "serving clients takes an equal share); a request that would pass it is "
                    "refused, and the origin never sees it")
    upstream_names_per_host: CountField = Field(
        default=DEFAULT_LIMITS.upstream_names_per_host,
        description="of upstream_names, the distinct names the streams and REST polls of "
                    "one client host may hold at once")
    load_report_streams: CountField = Field(
        default=DEFAULT_LIMITS.load_report_streams,
        description="load report (LRS) streams the relay forwards at once, all clients "
                    "together, per process; each holds a stream to every origin (one more is "
                    "refused with RESOURCE_EXHAUSTED)")
    request_size: RequestSizeField = Field(
        default=DEFAULT_LIMITS.request_size,
        description="the encoded size of one request; gRPC itself refuses twice as much "
                    "before the relay sees it")


class ServerConfig(_Section):
    """The downstream xDS gRPC server."""

    address: AddressField = Field(
        default=Address("127.0.0.1", 18000),
        description="where clients connect for xDS (gRPC); loopback unless told otherwise: "
                    '0.0.0.0:18000 (or "[::]:18000") serves other hosts')
    batch_window: DurationField = Field(
        default=0.005,
        description="how long a push caused by an origin change waits for the rest of its "
                    "burst (clients get it in make-before-break order; a client's first "
                    "answers go as soon as the last of them is in), and how long clients' "
                    "subscription changes gather before going to the origin (at most one "
                    "per type per window); 0 disables")
    drain_period: DurationField = Field(
        default=10.0,
        description="on SIGTERM, refuse new streams and close the open ones spread over "
                    "this long, so that clients reconnect elsewhere a few at a time")
    max_connection_age: DurationField = Field(
        default=DEFAULT_MAX_CONNECTION_AGE,
        description="retire each client connection after this long, give or take 10 % "
                    "(HTTP/2 GOAWAY): its client reconnects, through the Service, to any "
                    "replica, so that a fleet rebalances after a restart or a scale-up "
                    "(istiod's default too); 0: connections live for ever")
    max_connection_age_grace: DurationField = Field(
        default=DEFAULT_MAX_CONNECTION_AGE_GRACE,
        description="how long a retired connection's streams may go on; then they end "
                    "with UNAVAILABLE and their clients reconnect at once")
    max_response_size: ResponseSizeField = Field(
        default=DEFAULT_MAX_RESPONSE_SIZE,
        description="the largest response sent to a client (gRPC's default receive limit): "
                    "more goes over several, each ACKed before the next; one resource "
                    "larger goes alone; listeners and clusters over SotW (full-state) are "
                    "one response whatever their size")
    workers: WorkerCountField = Field(
        default=1,
        description="processes serving clients on address (SO_REUSEPORT), fed over a local "
                    "socket by one more that holds the origin stream and serves admin; "
                    "1: one process does everything (run --workers overrides it)")
    keepalive: ClientKeepaliveConfig = ClientKeepaliveConfig()
    extra_type_urls: list[str] = Field(
        default_factory=list,
        description="type URLs served besides the xDS types the relay knows (Cluster, "
                    "Listener, ...); requests for any other type are refused")
    tls: ServerTLSConfig | None = None
    authorization: AuthorizationConfig = AuthorizationConfig()

    @model_validator(mode="after")
    def _identities_need_client_certificates(self) -> ServerConfig:
        rules = self.authorization
        if self.tls is not None and self.tls.client_ca_file is not None:
            return self
        if rules.allow or rules.debug or rules.node_binding != "none" or rules.secrets:
            used = [key for key, used in (("allow", rules.allow), ("debug", rules.debug),
                                          ("node_binding", rules.node_binding != "none"),
                                          ("secrets", bool(rules.secrets)))
                    if used]
            raise ValueError(f"authorization.{used[0]} matches client certificates: set "
                             f"tls.client_ca_file (mutual TLS) so that clients present one")
        return self


class BackoffConfig(_Section):
    """Reconnect backoff towards the origin, in seconds."""

    initial: PositiveDurationField = Field(
        default=0.5, description="the first reconnect delay")
    max: PositiveDurationField = Field(
        default=30.0, description="the longest reconnect delay; not less than initial")

    @model_validator(mode="after")
    def _max_not_below_initial(self) -> BackoffConfig:
        # A model check rather than a field one: `max` may be the default.
        if self.max < self.initial:
            raise ValueError(
                f"max ({self.max:g}s) must not be less than initial ({self.initial:g}s)")
        return self


class UpstreamTLSConfig(_Section):
    """TLS to the origin: its CA, the name on its certificate, a client certificate."""

    ca_file: CertificateFileField | None = Field(
        default=None,
        description="PEM roots to trust (istiod: the istio-ca-root-cert ConfigMap); "
                    "unset: the system's")
    server_name: str | None = Field(
        default=None,
        description="the name the origin's certificate is checked against, if not the "
                    "address's host")
    cert_file: CertificateFileField | None = Field(
        default=None, description="a PEM client certificate (mTLS); set with key_file")
    key_file: KeyFileField | None = Field(
        default=None, description="the PEM private key of cert_file; set with cert_file")

    @field_validator("server_name")
    @classmethod
    def _dns_name(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_name(value):
            raise ValueError(f"{value!r} is not a DNS name")
        return value

    @model_validator(mode="after")
    def _cert_with_key(self) -> UpstreamTLSConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("set both cert_file and key_file, or neither")
        return self


class KeepaliveConfig(_Section):
    """HTTP/2 keepalive pings on the origin connection."""

    time: PositiveDurationField = Field(
        default=30.0,
        description="how often to ping; istiod closes connections that ping more often than "
                    "every 15 s")
    timeout: PositiveDurationField = Field(
        default=10.0,
        description="how long a ping may go unanswered before the connection is dropped")


def _one_authorization_header(token_file: Path | None, metadata: dict[str, str]) -> None:
    if token_file is not None and "authorization" in metadata:
        raise ValueError("initial_metadata.authorization and token_file both set the "
                         "authorization header; keep one")


class FallbackServerConfig(_Section):
    """One more server of an origin, in ``fallback``: how to reach it. Nothing
    is taken from the primary's keys: each server has its own credentials."""

    address: AddressField = Field(
        description="the server, followed over Delta ADS while it is the one in use")
    tls: UpstreamTLSConfig | None = None
    token_file: FileField | None = Field(
        default=None,
        description="a token file for this server, re-read at every connect, sent as "
                    "`authorization: Bearer <token>`")
    initial_metadata: HeadersField = Field(
        default_factory=dict, description="extra gRPC request metadata for this server")
    keepalive: KeepaliveConfig = KeepaliveConfig()
    connect_timeout: PositiveDurationField = Field(
        default=DEFAULT_CONNECT_TIMEOUT,
        description="TCP + TLS + HTTP/2 handshake time before an attempt counts as failed")
    max_response_size: ResponseSizeField = Field(
        default=MAX_MESSAGE_SIZE, description="the largest response accepted from this server")

    @model_validator(mode="after")
    def _one_authorization(self) -> FallbackServerConfig:
        _one_authorization_header(self.token_file, self.initial_metadata)
        return self


# The key is `copy`, which shadows BaseModel.copy (deprecated, never used
# on a config): pydantic warns once, at import, about nothing that matters here.
warnings.filterwarnings("ignore", message='Field name "copy" in "NodeGroupsConfig"',
                        category=UserWarning)


class NodeGroupsConfig(_Section):
    """Clients grouped by fields of their nodes, a stream to the origin per group
    (see relay.node_groups)."""

    key: list[str] = Field(
        min_length=1,
        description="the node fields whose values make a client's group: id, cluster, "
                    "user_agent_name, locality.region, locality.zone, locality.sub_zone, "
                    "metadata.<field> (nested with dots)")
    copy: list[str] = Field(  # type: ignore[assignment]  # see the filter above
        default_factory=list,
        description="more fields of the group's first client's node sent to the origin on "
                    "the group's stream (same names as key)")
    max_groups: CountField = Field(
        default=DEFAULT_MAX_GROUPS,
        description="the most groups open at once: a client that would open one more is "
                    "refused with RESOURCE_EXHAUSTED")
    linger: DurationField = Field(
        default=DEFAULT_GROUP_LINGER,
        description="keep a group's origin stream this long after its last client left; "
                    "then the group closes and its persisted snapshot is deleted (a "
                    "restored group that no client joins within it goes the same way)")
    missing: Literal["empty", "refuse"] = Field(
        default="empty",
        description="a client whose node lacks a key field: in the group of empty values "
                    "for it (empty), or refused with INVALID_ARGUMENT (refuse)")

    @field_validator("key", "copy")
    @classmethod
    def _node_fields(cls, value: list[str]) -> list[str]:
        problems = [problem for name in value if (problem := field_error(name)) is not None]
        if problems:
            raise ValueError("; ".join(problems))
        if len(set(value)) != len(value):
            raise ValueError("a field is listed twice")
        return value

    def spec(self) -> GroupSpec:
        """The groups as :mod:`relay.node_groups` takes them."""
        return GroupSpec(tuple(self.key), tuple(self.copy), self.max_groups, self.linger,
                         self.missing)


class UpstreamConfig(_Section):
    """Where resources come from: an origin control plane or a directory."""

    address: AddressField | None = Field(
        default=None,
        description="the origin control plane, followed over Delta ADS; set exactly one of "
                    "address or files")
    files: DirectoryField | None = Field(
        default=None,
        description="a directory of YAML/JSON resource files to serve instead of an origin's")
    poll_interval: PositiveDurationField = Field(
        default=DEFAULT_POLL_INTERVAL, description="how often the files directory is rescanned")
    backoff: BackoffConfig = BackoffConfig()
    linger: DurationField = Field(
        default=DEFAULT_LINGER,
        description="keep an upstream subscription this long after its last client left: a "
                    "client that reconnects within it (its connection retired for its age, "
                    "its replica gone) costs the origin nothing")
    linger_names: CountField = Field(
        default=DEFAULT_LINGER_NAMES,
        description="the most subscriptions (a name and its parameters) lingering at once "
                    "on one origin stream, all types together; past it the oldest stop "
                    "lingering at once. Each keeps its name and cache record (and heap its "
                    "client shared) while it lingers; a client of more names that comes back "
                    "costs the origin the rest")
    answer_grace: DurationField = Field(
        default=SETTLE_GRACE,
        description="a response this soon after a subscription may have crossed it on the "
                    "wire and is not taken as its answer; clients matching no variant are "
                    "told after this long; a `*` the origin leaves unanswered this long "
                    "counts as answered with what the cache holds")
    tls: UpstreamTLSConfig | None = None
    token_file: FileField | None = Field(
        default=None,
        description="a token file, re-read at every connect, sent as "
                    "`authorization: Bearer <token>`")
    initial_metadata: HeadersField = Field(
        default_factory=dict,
        description="extra gRPC request metadata, e.g. {clusterid: Kubernetes} for istiod")
    keepalive: KeepaliveConfig = KeepaliveConfig()
    connect_timeout: PositiveDurationField = Field(
        default=DEFAULT_CONNECT_TIMEOUT,
        description="TCP + TLS + HTTP/2 handshake time before a connection attempt counts "
                    "as failed")
    max_response_size: ResponseSizeField = Field(
        default=MAX_MESSAGE_SIZE,
        description="the largest origin response accepted (istiod's CDS can be many MB); "
                    "2GiB is gRPC's limit")
    max_request_size: RequestSizeField = Field(
        default=DEFAULT_MAX_REQUEST_SIZE,
        description="requests to the origin are split to stay under this (a gRPC server "
                    "refuses messages over 4 MiB unless configured otherwise)")
    initial_versions: Literal["auto", "honoured", "ignored"] = Field(
        default="auto",
        description="whether the origin honours initial_resource_versions after a reconnect "
                    "(sends removals, omits the unchanged) or ignores them and resends "
                    "everything (istiod); auto tells from what it does")
    fallback: list[FallbackServerConfig] = Field(
        default_factory=list,
        description="further servers of this origin, in order, each with its own address, "
                    "tls, token_file, initial_metadata, keepalive, connect_timeout and "
                    "max_response_size: the relay moves to the next when the one in use is "
                    "unreachable and a client wants a resource not cached, and back to "
                    "address as soon as it answers (gRFC A71)")
    node_groups: NodeGroupsConfig | None = Field(
        default=None,
        description="group clients by fields of their nodes, each group served over "
                    "origin streams of its own that carry the group's node (for origins "
                    "that build configuration per node); on upstream: only, for every origin")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> UpstreamConfig:
        if (self.address is None) == (self.files is None):
            raise ValueError("set exactly one of 'address' or 'files'")
        if self.files is not None and self.node_groups is not None:
            raise ValueError("node_groups is for an origin at 'address', not for 'files'")
        if self.files is not None and (self.tls or self.token_file or self.initial_metadata):
            raise ValueError("tls, token_file and initial_metadata are for an origin at "
                             "'address', not for 'files'")
        return self

    @model_validator(mode="after")
    def _one_authorization(self) -> UpstreamConfig:
        _one_authorization_header(self.token_file, self.initial_metadata)
        return self

    @model_validator(mode="after")
    def _fallback_servers_of_an_origin(self) -> UpstreamConfig:
        if self.fallback and self.files is not None:
            raise _error_at(("fallback",), "fallback servers are for an origin at 'address', "
                            "not for 'files'", None)
        seen = {self.address: "address"}
        for index, server in enumerate(self.fallback):
            first = seen.setdefault(server.address, f"fallback[{index}].address")
            if first != f"fallback[{index}].address":
                raise _error_at(("fallback", index, "address"),
                                f"repeats {first} ({server.address}): list each server once",
                                str(server.address))
        return self


def _error_at(loc: tuple[str | int, ...], message: str, value: object) -> ValidationError:
    """A validation error about the key at ``loc`` (within the model raising it)."""
    return ValidationError.from_exception_data("UpstreamConfig", [
        InitErrorDetails(type=PydanticCustomError("value_error", "{message}",
                                                  {"message": message}),
                         loc=loc, input=value)])


class AdminTLSConfig(_Section):
    """HTTPS for the admin server; the files are re-read when they change."""

    cert_file: CertificateFileField = Field(description="the admin server's PEM certificate")
    key_file: KeyFileField = Field(description="the PEM private key of cert_file")

    @model_validator(mode="after")
    def _usable(self) -> AdminTLSConfig:
        _check_key_pair(self.cert_file, self.key_file)
        return self


class AdminConfig(_Section):
    """The admin HTTP server (/ready, /healthz, /config_dump, /clients, /metrics)."""

    address: AddressField = Field(
        default=Address("127.0.0.1", 19000),
        description="where the admin HTTP server listens: /ready, /healthz, /config_dump, "
                    "/clients, /metrics; off loopback, set token_file (and tls)")
    tls: AdminTLSConfig | None = None
    token_file: FileField | None = Field(
        default=None,
        description="a file holding a bearer token, re-read when it changes: every path but "
                    "/healthz and /ready then needs `Authorization: Bearer <token>`")
    header_timeout: PositiveDurationField = Field(
        default=DEFAULT_HTTP_LIMITS.header_timeout,
        description="how long a request's headers may take from their first byte; then 408 "
                    "and the connection is closed")
    idle_timeout: PositiveDurationField = Field(
        default=DEFAULT_HTTP_LIMITS.idle_timeout,
        description="how long a connection may wait for its next request (or its first) "
                    "before it is closed")
    connections_per_host: CountField = Field(
        default=DEFAULT_HTTP_LIMITS.connections_per_host,
        description="connections open at once from one client host (its address); one more "
                    "is answered 429 and closed")

    @property
    def http_limits(self) -> HttpLimits:
        """The limits of the admin server (it reads no request bodies)."""
        return HttpLimits(header_timeout=self.header_timeout, idle_timeout=self.idle_timeout,
                          connections_per_host=self.connections_per_host)


class RestConfig(_Section):
    """Envoy's REST-JSON polling (api_type: REST): POST /v3/discovery:clusters and
    the other types, answered from the cache with the TLS and authorization of
    the xDS port. The lease and wait hold for the gRPC Fetch* methods too."""

    address: AddressField | None = Field(
        default=None,
        description="where REST pollers POST a JSON DiscoveryRequest (HTTP/1.1; HTTPS with "
                    "server.tls); unset: no REST listener")
    lease: PositiveDurationField = Field(
        default=DEFAULT_LEASE,
        description="keep a poll's resources subscribed on the origin this long after the "
                    "last poll of the same set; longer than the pollers' refresh_delay")
    wait: DurationField = Field(
        default=DEFAULT_WAIT,
        description="how long a poll of resources not yet cached waits for the origin before "
                    "503; below Envoy's request_timeout (1s by default)")
    header_timeout: PositiveDurationField = Field(
        default=DEFAULT_HTTP_LIMITS.header_timeout,
        description="how long a poll's headers may take from their first byte; then 408 and "
                    "the connection is closed")
    body_timeout: PositiveDurationField = Field(
        default=DEFAULT_HTTP_LIMITS.body_timeout,
        description="how long a poll's body may take once its headers are in; then 408 and "
                    "the connection is closed")
    idle_timeout: PositiveDurationField = Field(
        default=DEFAULT_HTTP_LIMITS.idle_timeout,
        description="how long a connection may wait for its next poll (or its first) before "
                    "it is closed")
    max_buffered_body: BufferSizeField = Field(
        default=DEFAULT_HTTP_LIMITS.max_buffered_body,
        description="request body bytes held in memory at once, all polls together (per "
                    "process with server.workers); a poll whose body does not fit gets 503 "
                    "with Retry-After; at least limits.request_size")
    connections_per_host: CountField = Field(
        default=DEFAULT_HTTP_LIMITS.connections_per_host,
        description="connections open at once from one client host (its address; per "
                    "process with server.workers); one more is answered 429 and closed")

    @property
    def http_limits(self) -> HttpLimits:
        """The limits of the REST listener."""
        return HttpLimits(self.header_timeout, self.body_timeout, self.idle_timeout,
                          self.connections_per_host, self.max_buffered_body)

    @model_validator(mode="after")
    def _lease_outlasts_wait(self) -> RestConfig:
        if self.lease <= self.wait:
            raise ValueError(f"lease ({self.lease:g}s) must be longer than wait "
                             f"({self.wait:g}s): a subscription would lapse while a poll "
                             f"waits for it")
        return self


def _hosts_overlap(first: str, second: str) -> bool:
    """Whether listeners on these hosts may share an address (a wildcard
    address covers every other)."""
    wildcard = {"0.0.0.0", "::", "[::]", ""}
    return first == second or first in wildcard or second in wildcard


class LoggingConfig(_Section):
    """Logging; ``level`` is normalized to lowercase."""

    level: str = Field(default="info", description="debug, info, warning or error (any case)")
    format: Literal["text", "json"] = Field(
        default="text",
        description="text: one key=value line per record; json: one JSON object per line")

    @field_validator("level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.strip().lower()
        if level not in LOG_LEVELS:
            raise ValueError(
                f"unknown level {value!r} (expected one of: {', '.join(LOG_LEVELS)})")
        return level


class OtlpConfig(_Section):
    """Push metrics to an OpenTelemetry collector over OTLP/HTTP (JSON encoding)."""

    endpoint: str = Field(
        description="the collector's metrics URL, e.g. http://otel-collector:4318/v1/metrics "
                    "(a URL without a path gets /v1/metrics); required to push over OTLP")
    interval: PositiveDurationField = Field(
        default=DEFAULT_OTLP_INTERVAL, description="how often metrics are pushed")

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, value: str) -> str:
        url = urlsplit(value)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        if url.path in ("", "/"):
            # A collector's base address: its metrics path is the OTLP default.
            return value.rstrip("/") + "/v1/metrics"
        return value


class MetricsConfig(_Section):
    """Metrics are always scraped at the admin address's /metrics; OTLP is optional."""

    otlp: OtlpConfig | None = None


class RedisConfig(_Section):
    """A Redis through which the relays of one zone share their snapshot."""

    url: RedisUrlField = Field(
        description="redis://host:port/db, or rediss:// for TLS; a password may be given in "
                    "the URL (redis://:secret@host) or in password_file")
    key_prefix: str | None = Field(
        default=None, min_length=1,
        description="every key starts with this; replicas of one zone share it, other zones "
                    "use their own; unset: xds-relay:<node.cluster>, plus :<zone> when "
                    "node.locality.zone is set")
    password_file: FileField | None = Field(
        default=None, description="a file holding the Redis password (AUTH)")
    timeout: PositiveDurationField = Field(
        default=1.0,
        description="each Redis operation gives up after this long; clients never wait for "
                    "Redis")


class PersistenceConfig(_Section):
    """The last-known-good snapshot: loaded at start, kept up to date as the origin
    changes, so that a restarted relay serves while the origin is away."""

    redis: RedisConfig | None = None
    directory: SnapshotDirectoryField | None = Field(
        default=None,
        description="keep the snapshot in this local directory instead (one relay, or a "
                    "volume it alone writes); created if missing")
    load_timeout: PositiveDurationField = Field(
        default=1.0,
        description="how long a starting relay waits for its snapshot; after that it serves "
                    "without one")

    @model_validator(mode="after")
    def _exactly_one_store(self) -> PersistenceConfig:
        if (self.redis is None) == (self.directory is None):
            raise ValueError("set exactly one of 'redis' or 'directory'")
        return self


class RelayConfig(_Section):
    """The whole relay configuration (the root of the YAML document)."""

    node: NodeConfig
    server: ServerConfig = ServerConfig()
    upstream: UpstreamConfig | None = Field(
        default=None,
        description="the default origin: classic names, and xdstp:// names of authorities "
                    "not under authorities; may be left out when authorities are set (names "
                    "no origin serves are then refused)")
    authorities: dict[AuthorityField, UpstreamConfig] = Field(
        default_factory=dict,
        description="xDS federation: per authority, the origin that serves "
                    "xdstp://AUTHORITY/... names, with every key of upstream (address, tls, "
                    "token_file, backoff, fallback, ...); each gets a Delta-ADS stream of "
                    "its own")
    admin: AdminConfig = AdminConfig()
    logging: LoggingConfig = LoggingConfig()
    metrics: MetricsConfig = MetricsConfig()
    persistence: PersistenceConfig | None = None
    limits: LimitsConfig = LimitsConfig()
    rest: RestConfig = RestConfig()

    @model_validator(mode="after")
    def _some_source(self) -> RelayConfig:
        if self.upstream is None and not self.authorities:
            message = ("field required: the origin's address (or files); or authorities, an "
                       "origin per xdstp:// authority")
            raise ValidationError.from_exception_data(type(self).__name__, [
                InitErrorDetails(type=PydanticCustomError("value_error", "{message}",
                                                          {"message": message}),
                                 loc=("upstream",), input=None)])
        if self.authorities and self.upstream is not None and self.upstream.files is not None:
            raise ValueError("authorities need an origin as upstream (upstream.address), not "
                             "upstream.files")
        for authority, origin in self.authorities.items():
            if origin.files is not None:
                message = ("an authority's origin is reached at an address; files are for "
                           "upstream alone")
                raise ValidationError.from_exception_data(type(self).__name__, [
                    InitErrorDetails(type=PydanticCustomError("value_error", "{message}",
                                                              {"message": message}),
                                     loc=("authorities", authority, "files"),
                                     input=str(origin.files))])
        return self

    @model_validator(mode="after")
    def _node_groups_on_upstream_alone(self) -> RelayConfig:
        for authority, origin in self.authorities.items():
            if origin.node_groups is not None:
                message = ("node groups are set once, on upstream:, and group the clients "
                           "for every origin; remove this one")
                raise ValidationError.from_exception_data(type(self).__name__, [
                    InitErrorDetails(type=PydanticCustomError("value_error", "{message}",
                                                              {"message": message}),
                                     loc=("authorities", authority, "node_groups"),
                                     input="...")])
        if self.upstream is not None and self.upstream.node_groups is not None and \
                self.server.workers > 1:
            message = ("node groups need one process (a --workers hub would ask the origin "
                       "as one node for every group): set server.workers to 1")
            raise ValidationError.from_exception_data(type(self).__name__, [
                InitErrorDetails(type=PydanticCustomError("value_error", "{message}",
                                                          {"message": message}),
                                 loc=("upstream", "node_groups"), input="...")])
        return self

    def hub_link(self) -> UpstreamConfig:
        """The origin settings a --workers process follows its hub with: the
        default origin's, or the first authority's when there is none."""
        if self.upstream is not None:
            return self.upstream
        return next(iter(self.authorities.values()))

    def origins(self) -> dict[str, UpstreamConfig]:
        """Every origin the relay follows, by name: ``default`` for ``upstream``
        (when it is an origin, not files), and each authority by its own."""
        default = {} if self.upstream is None or self.upstream.address is None else \
            {"default": self.upstream}
        return {**default, **self.authorities}

    @model_validator(mode="after")
    def _persistence_needs_an_origin(self) -> RelayConfig:
        if self.persistence is not None and self.upstream is not None and \
                self.upstream.files is not None:
            raise ValueError("persistence keeps what an origin sent; with upstream.files the "
                             "files are the snapshot: remove 'persistence'")
        return self

    @model_validator(mode="after")
    def _rest_has_a_port_of_its_own(self) -> RelayConfig:
        rest = self.rest.address
        if rest is None or rest.port == 0:
            return self
        for key, other in (("server.address", self.server.address),
                           ("admin.address", self.admin.address)):
            if other.port == rest.port and _hosts_overlap(rest.host, other.host):
                # Raised at rest.address itself, so that the error names its line.
                message = (f"the port of {key} ({other}): REST polling needs a port of its "
                           f"own (with --workers both would bind it, and each would take "
                           f"the other's connections)")
                raise ValidationError.from_exception_data(type(self).__name__, [
                    InitErrorDetails(type=PydanticCustomError("value_error", "{message}",
                                                              {"message": message}),
                                     loc=("rest", "address"), input=str(rest))])
        return self

    @model_validator(mode="after")
    def _rest_buffers_a_whole_request(self) -> RelayConfig:
        buffered, request_size = self.rest.max_buffered_body, self.limits.request_size
        if buffered < request_size:
            message = (f"{format_size(buffered)} is less than limits.request_size "
                       f"({format_size(request_size)}): a poll the limits allow could never "
                       f"be read")
            raise ValidationError.from_exception_data(type(self).__name__, [
                InitErrorDetails(type=PydanticCustomError("value_error", "{message}",
                                                          {"message": message}),
                                 loc=("rest", "max_buffered_body"), input=buffered)])
        return self

    def snapshot_prefix(self) -> str:
        """The Redis key prefix of this relay's snapshot (see ``RedisConfig.key_prefix``)."""
        redis = self.persistence.redis if self.persistence is not None else None
        if redis is not None and redis.key_prefix is not None:
            return redis.key_prefix
        zone = self.node.locality.zone
        return f"xds-relay:{self.node.cluster}" + (f":{zone}" if zone else "")
