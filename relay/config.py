"""The relay's YAML configuration: loading, validation and error reporting.

The YAML is composed once into a node tree; the plain Python data built from
that tree is validated by pydantic, and the tree itself is kept so that every
validation error can be traced back to the line it came from. Errors name the
file, the line and the dotted field path, e.g.::

    relay.yaml:9: upstream.adress: unknown key (allowed: address, files, ...)

Use :func:`load_config` for a file and :func:`parse_config` for text; both
return a frozen :class:`RelayConfig` or raise :class:`ConfigError`.
"""

from __future__ import annotations

import importlib.metadata
import ipaddress
import math
import os
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from envoy.config.core.v3 import base_pb2
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "EXAMPLE_CONFIG",
    "Address",
    "AdminConfig",
    "BackoffConfig",
    "ConfigError",
    "KeepaliveConfig",
    "Locality",
    "LoggingConfig",
    "NodeConfig",
    "RelayConfig",
    "ServerConfig",
    "UpstreamConfig",
    "UpstreamTLSConfig",
    "load_config",
    "node_proto",
    "parse_address",
    "parse_config",
    "parse_duration",
    "parse_size",
]

USER_AGENT_NAME = "xds-relay"
LOG_LEVELS = ("debug", "info", "warning", "error")


def _user_agent_version() -> str:
    # From the installed distribution: a source checkout that is not installed still works.
    try:
        return importlib.metadata.version("xds-relay")
    except importlib.metadata.PackageNotFoundError:
        return ""


# --------------------------------------------------------------------------- errors


def _format_error(file: str, line: int | None, field: str, problem: str) -> str:
    """``file:line: field: problem``, leaving out the parts that are absent."""
    where = f"{file}:{line}" if line is not None else file
    parts = [part for part in (where, field, problem) if part]
    return ": ".join(parts)


class ConfigError(Exception):
    """An invalid or unreadable config.

    ``file``, ``line`` (1-based, ``None`` when unknown), ``field`` (dotted path
    such as ``upstream.address``, ``""`` for whole-document problems) and
    ``problem`` describe the first error; ``errors`` holds every error found
    (``[self]`` when there is only one). ``str()`` shows all of them, one per
    line, as ``file:line: field: problem``.
    """

    file: str
    line: int | None
    field: str
    problem: str
    errors: list[ConfigError]

    def __init__(
        self,
        file: str,
        line: int | None,
        field: str,
        problem: str,
        *,
        errors: Sequence[ConfigError] | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.problem = problem
        self.errors = list(errors) if errors else [self]
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.errors == [self]:
            return _format_error(self.file, self.line, self.field, self.problem)
        return "\n".join(str(error) for error in self.errors)

    @classmethod
    def collect(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error standing for ``errors`` (sorted by line): the first one's
        attributes, with all of them in ``errors`` and ``str()``."""
        ordered = sorted(errors, key=lambda e: (e.line is None, e.line or 0, e.field))
        if len(ordered) == 1:
            return ordered[0]
        first = ordered[0]
        return cls(first.file, first.line, first.field, first.problem, errors=ordered)


# --------------------------------------------------------------------------- value types


@dataclass(frozen=True, slots=True)
class Address:
    """A ``host:port`` network address; ``host`` is bare (no brackets for IPv6).

    ``str()`` gives the gRPC target / bind string, bracketing IPv6 hosts.
    """

    host: str
    port: int

    def __str__(self) -> str:
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


# RFC 1123 labels; underscores tolerated because container and service
# discovery names use them and resolvers accept them.
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
_PORT = re.compile(r"^[0-9]{1,5}$")


def _is_dns_name(host: str) -> bool:
    name = host[:-1] if host.endswith(".") else host  # a fully qualified name may end in "."
    if not name or len(name) > 253:
        return False
    return all(_HOST_LABEL.match(label) for label in name.split("."))


def parse_address(text: str) -> Address:
    """Parse ``host:port`` (IPv4, ``[IPv6]`` or DNS host; port 0..65535).

    Raises ``ValueError`` with a message naming the text and the problem.
    """
    expected = f"invalid address {text!r}: expected host:port"
    if "://" in text:
        raise ValueError(f"{expected} (no scheme)")
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise ValueError(f"{expected} (IPv6 as [addr]:port)")
        host, port_text = text[1:close], text[close + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"invalid address {text!r}: {host!r} is not an IPv6 address") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host or not port_text:
            raise ValueError(expected)
        if ":" in host:
            raise ValueError(f"invalid address {text!r}: bracket IPv6 hosts, e.g. [::1]:18000")
        if re.fullmatch(r"[0-9.]+", host):
            # All digits and dots: only a dotted-quad IPv4 address makes sense.
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(
                    f"invalid address {text!r}: {host!r} is not an IPv4 address") from None
        elif not _is_dns_name(host):
            raise ValueError(
                f"invalid address {text!r}: {host!r} is not an IPv4 address, "
                "[IPv6] address or DNS name")
    if not port_text:
        raise ValueError(expected)
    if not _PORT.match(port_text):
        raise ValueError(f"invalid address {text!r}: port {port_text!r} is not a number")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"invalid address {text!r}: port {port} is out of range 0..65535")
    return Address(host, port)


_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_HELP = "expected e.g. 500ms, 1.5s, 2m, 1h, 1m30s or a number of seconds"


def parse_duration(value: object) -> float:
    """Seconds from a duration: a number of seconds, or a string such as
    ``500ms``, ``1.5s``, ``2m``, ``1h``, ``1m30s`` or ``"2.5"``.

    Raises ``ValueError`` for negative, non-finite or malformed values.
    """
    if isinstance(value, bool):  # bool is an int subclass; `yes` must not mean 1s
        raise ValueError(f"expected a duration, got boolean; {_DURATION_HELP}")
    if isinstance(value, int | float):
        seconds = float(value)
        shown = repr(value)
    elif isinstance(value, str):
        text = value.strip()
        shown = repr(value)
        if text.startswith("-"):
            raise ValueError(f"duration must not be negative, got {shown}")
        try:
            seconds = float(text)  # a bare number as a string: seconds
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _DURATION_PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
                pos = match.end()
            if pos == 0 or pos != len(text):
                raise ValueError(f"invalid duration {shown}: {_DURATION_HELP}") from None
    else:
        raise ValueError(f"expected a duration, got {_kind(value)}; {_DURATION_HELP}")
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {shown}: must be finite")
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {shown}")
    return seconds


def _kind(value: object) -> str:
    """The YAML-ish name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def _validate_address(value: object) -> Address:
    if isinstance(value, Address):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a string 'host:port', got {_kind(value)}")
    return parse_address(value)


def _validate_duration(value: object) -> float:
    return parse_duration(value)


def _validate_positive_duration(value: object) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be greater than 0, got {value!r}")
    return seconds


def _path_of(value: object, what: str) -> Path:
    """A path from config text (``what``: "file" or "directory", for the message)."""
    if isinstance(value, Path):
        return value
    if isinstance(value, str):
        if not value:
            raise ValueError("must not be empty")
        return Path(value)
    raise ValueError(f"expected a {what} path, got {_kind(value)}")


def _validate_directory(value: object) -> Path:
    raw = _path_of(value, "directory")
    # Relative paths are relative to the working directory, as in Envoy,
    # not to the config file.
    path = (Path.cwd() / raw).resolve()
    if not path.exists():
        raise ValueError(f"directory not found: {path}")
    if not path.is_dir():
        raise ValueError(f"not a directory: {path}")
    return path


def _validate_file(value: object) -> Path:
    """A readable, non-empty file (relative paths from the working directory)."""
    raw = _path_of(value, "file")
    # Absolute, but symlinks kept: Kubernetes mounts secrets, tokens and
    # ConfigMaps through a symlink that it repoints when it rotates them.
    path = Path(os.path.abspath(raw))
    try:
        content = path.read_bytes()
    except IsADirectoryError:
        raise ValueError(f"not a file: {path}") from None
    except OSError as error:
        problem = "file not found" if isinstance(error, FileNotFoundError) else \
            f"cannot read file ({error.strerror or error})"
        raise ValueError(f"{problem}: {path}") from None
    if not content.strip():
        raise ValueError(f"file is empty: {path}")
    return path


def _pem_validator(marker: str, what: str) -> Any:
    """A validator of a readable file holding at least one PEM block of ``marker``."""
    def validate(value: object) -> Path:
        path = _validate_file(value)
        text = path.read_bytes()
        if not re.search(rb"-----BEGIN [A-Z ]*" + marker.encode() + rb"-----", text):
            raise ValueError(f"not a PEM {what}: {path} (expected a '-----BEGIN "
                             f"...{marker}-----' block)")
        return path
    return validate


_SIZE = re.compile(r"^([0-9]+)\s*(B|KB|MB|GB|KiB|MiB|GiB)?$")
_SIZE_UNITS = {None: 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3,
               "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
# gRPC message sizes are signed 32-bit: 2GiB means as large as gRPC allows.
_MAX_MESSAGE_SIZE = 2**31 - 1


def parse_size(value: object) -> int:
    """Bytes from a size: a number of bytes, or a string such as ``64KiB``,
    ``4MiB``, ``2GiB`` (binary) or ``1MB`` (decimal)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a size such as 4MiB or a number of bytes, got {_kind(value)}")
    match = _SIZE.match(str(value).strip())
    if match is None:
        raise ValueError(f"invalid size {value!r}: expected e.g. 65536, 64KiB, 4MiB or 2GiB")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def _message_size_validator(minimum: int) -> Any:
    def validate(value: object) -> int:
        size = parse_size(value)
        if size < minimum:
            raise ValueError(f"must be at least {minimum} bytes, got {value!r}")
        if size > _MAX_MESSAGE_SIZE + 1:
            raise ValueError(f"must be at most 2GiB (gRPC's limit), got {value!r}")
        return min(size, _MAX_MESSAGE_SIZE)
    return validate


# gRPC metadata keys: lowercase, and not gRPC's own or HTTP/2 pseudo-headers.
_METADATA_KEY = re.compile(r"^[a-z0-9_.-]+$")


def _validate_initial_metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of header names to strings, got {_kind(value)}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _METADATA_KEY.match(key):
            raise ValueError(f"{key!r}: header names are lowercase letters, digits, '-', '_' "
                             "and '.'")
        if key.startswith("grpc-") or key.endswith("-bin"):
            raise ValueError(f"{key!r}: grpc- headers are gRPC's own, and binary (-bin) "
                             "headers are not supported")
        if not isinstance(item, str | int | float) or isinstance(item, bool):
            raise ValueError(f"{key}: expected a string, got {_kind(item)}")
        text = str(item)
        if not all(" " <= ch <= "~" for ch in text):
            raise ValueError(f"{key}: header values are printable ASCII")
        out[key] = text
    return out


def _check_json_like(value: object, where: str) -> None:
    """Reject what a protobuf Struct cannot hold (YAML dates, binary, ...)."""
    if value is None or isinstance(value, str | bool | int | float):
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json_like(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                # YAML 1.1 reads unquoted on/off/yes/no keys as booleans.
                hint = "; quote it" if isinstance(key, bool) else ""
                raise ValueError(
                    f"{where or 'key'}: keys must be strings, got {_kind(key)} {key!r}{hint}")
            _check_json_like(item, f"{where}.{key}" if where else key)
        return
    raise ValueError(
        f"{where or 'value'}: {_kind(value)} is not allowed (strings, numbers, booleans, "
        "null, lists and mappings only; quote dates)")


def _validate_metadata(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping, got {_kind(value)}")
    _check_json_like(value, "")
    return value


AddressField = Annotated[Address, PlainValidator(_validate_address)]
DurationField = Annotated[float, PlainValidator(_validate_duration)]
PositiveDurationField = Annotated[float, PlainValidator(_validate_positive_duration)]
DirectoryField = Annotated[Path, PlainValidator(_validate_directory)]
FileField = Annotated[Path, PlainValidator(_validate_file)]
CertificateFileField = Annotated[Path, PlainValidator(_pem_validator("CERTIFICATE",
                                                                     "certificate"))]
KeyFileField = Annotated[Path, PlainValidator(_pem_validator("PRIVATE KEY", "private key"))]
RequestSizeField = Annotated[int, PlainValidator(_message_size_validator(16 * 1024))]
ResponseSizeField = Annotated[int, PlainValidator(_message_size_validator(64 * 1024))]
HeadersField = Annotated[dict[str, str], PlainValidator(_validate_initial_metadata)]
MetadataField = Annotated[dict[str, Any], PlainValidator(_validate_metadata)]


# --------------------------------------------------------------------------- models


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

    region: str = ""
    zone: str = ""
    sub_zone: str = ""


class NodeConfig(_Section):
    """The identity the relay presents to its origin (Envoy ``core.v3.Node``)."""

    id: str = Field(min_length=1)
    cluster: str = "xds-relay"
    locality: Locality = Locality()
    metadata: MetadataField = Field(default_factory=dict)


class ServerConfig(_Section):
    """The downstream xDS gRPC server."""

    address: AddressField = Address("0.0.0.0", 18000)
    # How long a push caused by an origin change waits for the rest of the
    # burst, so that one change spread over several per-type responses goes
    # out to each client in make-before-break order (0 disables).
    batch_window: DurationField = 0.005
    # On SIGTERM: stop taking new streams and close the open ones spread over
    # this long, so that clients reconnect elsewhere a few at a time.
    drain_period: DurationField = 10.0


class BackoffConfig(_Section):
    """Reconnect backoff towards the origin, in seconds."""

    initial: PositiveDurationField = 0.5
    max: PositiveDurationField = 30.0

    @model_validator(mode="after")
    def _max_not_below_initial(self) -> BackoffConfig:
        # A model check rather than a field one: `max` may be the default.
        if self.max < self.initial:
            raise ValueError(
                f"max ({self.max:g}s) must not be less than initial ({self.initial:g}s)")
        return self


class UpstreamTLSConfig(_Section):
    """TLS to the origin: its CA, the name on its certificate, a client certificate."""

    # PEM roots to trust (istiod: the istio-ca-root-cert ConfigMap); default: the system's
    ca_file: CertificateFileField | None = None
    # the name the origin's certificate is checked against, if not the address's host
    server_name: str | None = None
    # a client certificate and its key (mTLS), both or neither
    cert_file: CertificateFileField | None = None
    key_file: KeyFileField | None = None

    @field_validator("server_name")
    @classmethod
    def _dns_name(cls, value: str | None) -> str | None:
        if value is not None and not _is_dns_name(value):
            raise ValueError(f"{value!r} is not a DNS name")
        return value

    @model_validator(mode="after")
    def _cert_with_key(self) -> UpstreamTLSConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("set both cert_file and key_file, or neither")
        return self


class KeepaliveConfig(_Section):
    """HTTP/2 keepalive pings on the origin connection."""

    # istiod closes connections that ping more often than every 15 s
    time: PositiveDurationField = 30.0
    timeout: PositiveDurationField = 10.0


class UpstreamConfig(_Section):
    """Where resources come from: an origin control plane or a directory."""

    address: AddressField | None = None
    files: DirectoryField | None = None
    poll_interval: PositiveDurationField = 1.0
    backoff: BackoffConfig = BackoffConfig()
    linger: DurationField = 0.0
    # How soon after subscribing a response may come and still not count as
    # the origin's answer (it may have crossed the subscription on the wire).
    # Clients whose parameters match no variant are told after this long.
    answer_grace: DurationField = 0.5
    tls: UpstreamTLSConfig | None = None
    # a token file (re-read at every connect) sent as `authorization: Bearer <token>`
    token_file: FileField | None = None
    # extra gRPC request metadata, e.g. istiod's clusterid
    initial_metadata: HeadersField = Field(default_factory=dict)
    keepalive: KeepaliveConfig = KeepaliveConfig()
    connect_timeout: PositiveDurationField = 5.0
    # the largest origin response accepted (istiod's CDS can be many MB)
    max_response_size: ResponseSizeField = _MAX_MESSAGE_SIZE
    # requests to the origin are split to stay under this (a gRPC server
    # refuses messages over 4 MiB unless configured otherwise)
    max_request_size: RequestSizeField = 1024 * 1024
    # whether the origin honours initial_resource_versions after a reconnect
    # (sends removals, omits what is unchanged) or ignores them and resends
    # everything (istiod); auto tells from what it does
    initial_versions: Literal["auto", "honoured", "ignored"] = "auto"

    @model_validator(mode="after")
    def _exactly_one_source(self) -> UpstreamConfig:
        if (self.address is None) == (self.files is None):
            raise ValueError("set exactly one of 'address' or 'files'")
        if self.files is not None and (self.tls or self.token_file or self.initial_metadata):
            raise ValueError("tls, token_file and initial_metadata are for an origin at "
                             "'address', not for 'files'")
        return self

    @model_validator(mode="after")
    def _one_authorization(self) -> UpstreamConfig:
        if self.token_file is not None and "authorization" in self.initial_metadata:
            raise ValueError("initial_metadata.authorization and token_file both set the "
                             "authorization header; keep one")
        return self


class AdminConfig(_Section):
    """The admin HTTP server (/ready, /healthz, /config_dump, /metrics)."""

    address: AddressField = Address("127.0.0.1", 19000)


class LoggingConfig(_Section):
    """Logging; ``level`` is normalized to lowercase."""

    level: str = "info"
    # text: one key=value line per record; json: one JSON object per line
    format: Literal["text", "json"] = "text"

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

    # the collector's metrics URL, e.g. http://otel-collector:4318/v1/metrics
    endpoint: str
    interval: PositiveDurationField = 15.0

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


class RelayConfig(_Section):
    """The whole relay configuration (the root of the YAML document)."""

    node: NodeConfig
    server: ServerConfig = ServerConfig()
    upstream: UpstreamConfig
    admin: AdminConfig = AdminConfig()
    logging: LoggingConfig = LoggingConfig()
    metrics: MetricsConfig = MetricsConfig()


# --------------------------------------------------------------------------- loading


def load_config(path: str | os.PathLike[str]) -> RelayConfig:
    """Read and validate the config file at ``path``.

    Raises :class:`ConfigError` (naming the file) when it cannot be read, is
    not valid YAML, or does not match the schema.
    """
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as exc:
        raise ConfigError(source, None, "", f"cannot read file: not UTF-8 ({exc.reason})") from exc
    except OSError as exc:
        raise ConfigError(source, None, "", f"cannot read file: {exc.strerror or exc}") from exc
    return parse_config(text, source)


def parse_config(text: str, source: str = "<string>") -> RelayConfig:
    """Validate config ``text``; ``source`` names it in errors (a file name)."""
    root, data = _parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(source, root.start_mark.line + 1, "",
                          f"expected a mapping at the top level, got {_kind(data)}")
    # Reported along with schema errors so one run shows everything to fix.
    errors = _duplicate_keys(root, source)
    try:
        config = RelayConfig.model_validate(data)
    except ValidationError as exc:
        errors += [_convert_error(error, root, source) for error in exc.errors()]
    if errors:
        raise ConfigError.collect(errors)
    return config


def _parse_yaml(text: str, source: str) -> tuple[yaml.Node, object]:
    """Compose ``text`` into a node tree and construct its data from it.

    Composing once and constructing from the same tree keeps the marks used
    for line numbers in step with the data pydantic sees.
    """
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        # Duplicate checks must see the tree before construction flattens `<<` merges.
        tree = _copy_tree(root) if root is not None else None
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(source, line, "", f"invalid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(source, None, "", f"invalid YAML: {exc}") from exc
    finally:
        loader.dispose()
    if tree is None or data is None:  # no document, or an explicit `---` with nothing in it
        raise ConfigError(source, None, "",
                          "empty document: expected a mapping with at least 'node' and 'upstream'")
    return tree, data


def _copy_tree(node: yaml.Node) -> yaml.Node:
    """A shallow structural copy of a node tree (aliases stay shared)."""
    memo: dict[int, yaml.Node] = {}

    def copy(n: yaml.Node) -> yaml.Node:
        if id(n) in memo:
            return memo[id(n)]
        if isinstance(n, yaml.MappingNode):
            clone: yaml.Node = yaml.MappingNode(n.tag, [], n.start_mark, n.end_mark)
            memo[id(n)] = clone
            clone.value = [(copy(k), copy(v)) for k, v in n.value]
        elif isinstance(n, yaml.SequenceNode):
            clone = yaml.SequenceNode(n.tag, [], n.start_mark, n.end_mark)
            memo[id(n)] = clone
            clone.value = [copy(item) for item in n.value]
        else:
            clone = n
            memo[id(n)] = clone
        return clone

    return copy(node)


def _duplicate_keys(root: yaml.Node, source: str) -> list[ConfigError]:
    """Keys repeated within one mapping (PyYAML would silently keep the last)."""
    errors: list[ConfigError] = []
    seen_nodes: set[int] = set()

    def walk(node: yaml.Node, path: str) -> None:
        if id(node) in seen_nodes:  # aliases can make the tree a graph
            return
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int] = {}
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.value == "<<":
                    walk(value, path)
                    continue
                line = key.start_mark.line + 1
                field = f"{path}.{key.value}" if path else key.value
                if key.value in first_line:
                    errors.append(ConfigError(
                        source, line, field,
                        f"duplicate key (first set on line {first_line[key.value]})"))
                else:
                    first_line[key.value] = line
                walk(value, field)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{path}[{i}]")

    walk(root, "")
    return errors


def _field_path(loc: Sequence[int | str]) -> str:
    # The schema has no list fields, so every element is a mapping key.
    return ".".join(str(part) for part in loc)


def _line_of(root: yaml.Node, loc: Sequence[int | str]) -> int:
    """The line of the deepest element of ``loc`` present in the YAML tree.

    For a mapping key that is the key's line (so errors about a whole section
    point at ``upstream:``); for the document itself, where it starts.
    """
    node = root
    line = root.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = None
            for key, value in reversed(node.value):  # the last duplicate wins in PyYAML
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    match = key, value
                    break
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _section_model(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``loc``, if any."""
    model: type[BaseModel] = RelayConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        inner = _model_in(field.annotation)
        if inner is None:
            return None
        model = inner
    return model


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


_TYPE_ERRORS: dict[str, str] = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
}

def _convert_error(error: Any, root: yaml.Node, source: str) -> ConfigError:
    """Turn one pydantic error into a ConfigError with a human problem text."""
    loc: list[int | str] = list(error["loc"])
    kind = error["type"]
    value = error.get("input")
    if loc and loc[-1] == "[key]":  # pydantic's marker for a bad mapping key
        loc.pop()
        kind = "invalid_key"
    if kind == "missing":
        return ConfigError(source, _line_of(root, loc[:-1]), _field_path(loc), "field required")
    if kind == "extra_forbidden":
        model = _section_model(loc[:-1])
        allowed = ", ".join(model.model_fields) if model is not None else ""
        problem = f"unknown key (allowed: {allowed})" if allowed else "unknown key"
        return ConfigError(source, _line_of(root, loc), _field_path(loc), problem)
    if kind == "invalid_key":
        problem = f"keys must be strings, got {_kind(value)} {value!r}"
    elif kind in _TYPE_ERRORS:
        problem = f"expected {_TYPE_ERRORS[kind]}, got {_kind(value)}"
    elif kind == "string_too_short":
        problem = "must not be empty"
    elif kind in ("value_error", "assertion_error") and "error" in error.get("ctx", {}):
        problem = str(error["ctx"]["error"])
    else:
        problem = error["msg"]
    return ConfigError(source, _line_of(root, loc), _field_path(loc), problem)


# --------------------------------------------------------------------------- protobuf


def node_proto(cfg: RelayConfig) -> base_pb2.Node:
    """The Envoy ``core.v3.Node`` the relay sends to its origin."""
    node = base_pb2.Node(
        id=cfg.node.id,
        cluster=cfg.node.cluster,
        locality=base_pb2.Locality(
            region=cfg.node.locality.region,
            zone=cfg.node.locality.zone,
            sub_zone=cfg.node.locality.sub_zone,
        ),
        user_agent_name=USER_AGENT_NAME,
        user_agent_version=_user_agent_version(),
    )
    if cfg.node.metadata:
        node.metadata.update(cfg.node.metadata)
    return node


# --------------------------------------------------------------------------- example


EXAMPLE_CONFIG = """\
# xds-relay configuration. Check a file with: xds-relay validate --config FILE
node:                           # required: the identity presented to the origin
  id: relay-zone-a              # required
  cluster: xds-relay            # default: xds-relay
  locality: {region: eu-west1, zone: eu-west1-a, sub_zone: ""}
  metadata:                     # free-form; sent as a protobuf Struct
    team: platform
server:
  address: 0.0.0.0:18000        # downstream xDS (gRPC); IPv6 as "[::]:18000"
  batch_window: 5ms             # let an origin burst gather before pushing; 0 disables
  drain_period: 10s             # on SIGTERM, close client streams spread over this long
upstream:                       # required: exactly one of address or files
  address: 127.0.0.1:18001      # origin control plane, followed over Delta ADS
  # files: config/resources     # or: serve a directory of YAML/JSON resource files
  poll_interval: 1s             # rescan period of `files`; > 0
  backoff: {initial: 0.5s, max: 30s}   # reconnect backoff; durations: 500ms 1.5s 2m 1h
  linger: 0s                    # keep an upstream subscription this long after its last client
  answer_grace: 500ms           # a response sooner than this after a subscription may not answer it
  # tls:                        # TLS to the origin (istiod's secured port 15012)
  #   ca_file: /var/run/secrets/istio/root-cert.pem   # PEM roots; default: the system's
  #   server_name: istiod.istio-system.svc            # checked against the origin's certificate
  #   cert_file: /etc/xds-relay/tls/cert.pem          # optional client certificate (mTLS) ...
  #   key_file: /etc/xds-relay/tls/key.pem            # ... and its key
  # token_file: /var/run/secrets/tokens/istio-token # re-read at every connect; sent as Bearer
  initial_metadata: {}          # extra gRPC headers, e.g. {clusterid: Kubernetes} for istiod
  keepalive: {time: 30s, timeout: 10s}   # istiod refuses pings more often than every 15 s
  connect_timeout: 5s           # TCP + TLS + HTTP/2 handshake, before an attempt counts as failed
  max_response_size: 2GiB       # largest origin response accepted (gRPC's limit)
  max_request_size: 1MiB        # larger subscriptions are split into several requests
  initial_versions: auto        # does the origin honour initial_resource_versions? auto,
                                # honoured or ignored (istiod ignores them)
admin:
  address: 127.0.0.1:19000      # /ready /healthz /config_dump /metrics
logging:
  level: info                   # debug, info, warning or error
  format: text                  # text (key=value) or json (one object per line)
metrics:                        # always scraped at http://ADMIN/metrics (Prometheus)
  # otlp:                       # and optionally pushed to an OpenTelemetry collector
  #   endpoint: http://otel-collector:4318/v1/metrics   # OTLP/HTTP, JSON encoding
  #   interval: 15s
"""
