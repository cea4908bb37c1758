"""Config values: addresses, durations, sizes, paths, PEM files, headers, metadata, counts.

The ``parse_*`` functions read one value from config text and raise
``ValueError`` with a message naming the value and the problem. The
``...Field`` types are those parsers as pydantic field types, for the models.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import PlainValidator

from relay.authorization import (
    IdentityPattern,
    parse_pattern,
    parse_secret_identity,
    parse_secret_name,
)
from relay.encoding import MAX_MESSAGE_SIZE

__all__ = [
    "MAX_MESSAGE_SIZE",
    "MAX_WORKERS",
    "Address",
    "AddressField",
    "BufferSizeField",
    "CertificateFileField",
    "CountField",
    "DirectoryField",
    "DurationField",
    "FileField",
    "HeadersField",
    "IdentityPatternField",
    "KeyFileField",
    "MetadataField",
    "NodeSizeField",
    "PositiveDurationField",
    "RedisUrlField",
    "RequestSizeField",
    "ResponseSizeField",
    "SecretIdentityPatternField",
    "SecretNamePatternField",
    "Shown",
    "SnapshotDirectoryField",
    "WorkerCountField",
    "format_duration",
    "format_size",
    "is_dns_name",
    "parse_address",
    "parse_duration",
    "parse_size",
    "yaml_kind",
]


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


def is_dns_name(host: str) -> bool:
    """Whether ``host`` is a DNS name (RFC 1123 labels, underscores allowed)."""
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
        elif not is_dns_name(host):
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
        raise ValueError(f"expected a duration, got {yaml_kind(value)}; {_DURATION_HELP}")
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {shown}: must be finite")
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {shown}")
    return seconds


def yaml_kind(value: object) -> str:
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
        raise ValueError(f"expected a string 'host:port', got {yaml_kind(value)}")
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
    raise ValueError(f"expected a {what} path, got {yaml_kind(value)}")


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


def _validate_snapshot_directory(value: object) -> Path:
    """A directory the relay may create: it, or its parent, must exist."""
    raw = _path_of(value, "directory")
    path = (Path.cwd() / raw).resolve()
    if path.exists() and not path.is_dir():
        raise ValueError(f"not a directory: {path}")
    if not path.exists() and not path.parent.is_dir():
        raise ValueError(f"neither the directory nor its parent exists: {path}")
    return path


def _validate_redis_url(value: object) -> str:
    """``redis://[:password@]host[:port][/db]`` (``rediss://`` for TLS)."""
    if not isinstance(value, str):
        raise ValueError(f"expected a redis:// URL, got {yaml_kind(value)}")
    url = urlsplit(value)
    if url.scheme not in ("redis", "rediss"):
        raise ValueError(f"expected a redis:// or rediss:// URL, got {value!r}")
    try:
        port = url.port
    except ValueError:
        raise ValueError(f"bad port in {value!r}") from None
    if not url.hostname:
        raise ValueError(f"no host in {value!r}")
    db = url.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"the path of {value!r} must be a database number, like /0")
    if port == 0:
        raise ValueError(f"port 0 in {value!r}")
    return value


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


def parse_size(value: object) -> int:
    """Bytes from a size: a number of bytes, or a string such as ``64KiB``,
    ``4MiB``, ``2GiB`` (binary) or ``1MB`` (decimal)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(
            f"expected a size such as 4MiB or a number of bytes, got {yaml_kind(value)}")
    match = _SIZE.match(str(value).strip())
    if match is None:
        raise ValueError(f"invalid size {value!r}: expected e.g. 65536, 64KiB, 4MiB or 2GiB")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def _message_size_validator(minimum: int) -> Any:
    def validate(value: object) -> int:
        size = parse_size(value)
        if size < minimum:
            raise ValueError(f"must be at least {minimum} bytes, got {value!r}")
        if size > MAX_MESSAGE_SIZE + 1:
            raise ValueError(f"must be at most 2GiB (gRPC's limit), got {value!r}")
        return min(size, MAX_MESSAGE_SIZE)  # 2GiB itself: as large as gRPC allows
    return validate


# gRPC metadata keys: lowercase, and not gRPC's own or HTTP/2 pseudo-headers.
_METADATA_KEY = re.compile(r"^[a-z0-9_.-]+$")


def _validate_initial_metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of header names to strings, got {yaml_kind(value)}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _METADATA_KEY.match(key):
            raise ValueError(f"{key!r}: header names are lowercase letters, digits, '-', '_' "
                             "and '.'")
        if key.startswith("grpc-") or key.endswith("-bin"):
            raise ValueError(f"{key!r}: grpc- headers are gRPC's own, and binary (-bin) "
                             "headers are not supported")
        if not isinstance(item, str | int | float) or isinstance(item, bool):
            raise ValueError(f"{key}: expected a string, got {yaml_kind(item)}")
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
                    f"{where or 'key'}: keys must be strings, got {yaml_kind(key)} {key!r}{hint}")
            _check_json_like(item, f"{where}.{key}" if where else key)
        return
    raise ValueError(
        f"{where or 'value'}: {yaml_kind(value)} is not allowed (strings, numbers, booleans, "
        "null, lists and mappings only; quote dates)")


def _validate_metadata(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping, got {yaml_kind(value)}")
    _check_json_like(value, "")
    return value


def _validate_buffer_size(value: object) -> int:
    size = parse_size(value)
    if size < 1:
        raise ValueError(f"must be at least 1 byte, got {value!r}")
    return size


def _validate_count(value: object) -> int:
    # As for workers: `yes` is not 1, and a count is a whole number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {yaml_kind(value)}")
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


#: The most processes ``server.workers`` may ask for: far more than any host has
#: cores, but a typo (``10000``) must not start thousands of processes.
MAX_WORKERS = 1024


def _validate_worker_count(value: object) -> int:
    # bool is an int subclass: `workers: yes` must not mean 1. Neither 2.0 nor "2":
    # a count is written as a whole number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number of processes, got {yaml_kind(value)}")
    if not 1 <= value <= MAX_WORKERS:
        raise ValueError(f"must be from 1 to {MAX_WORKERS}, got {value}")
    return value


# --------------------------------------------------------------------------- display


@dataclass(frozen=True, slots=True)
class Shown:
    """Field metadata: how a value of the field is written in the YAML.

    For listings of defaults (``xds-relay keys``); pydantic ignores it.
    """

    format: Callable[[Any], str]


def format_duration(seconds: float) -> str:
    """A duration as the config writes it: ``0s``, ``5ms``, ``500ms``, ``1.5s``, ``30s``."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def format_size(size: int) -> str:
    """A size as the config writes it: ``2GiB``, ``1MiB``, ``64KiB`` or a number of bytes."""
    if size == MAX_MESSAGE_SIZE:
        return "2GiB"  # what the config's 2GiB is capped to
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


# --------------------------------------------------------------------------- field types


def _validate_authority(value: Any) -> str:
    """An xDS federation authority: what ``xdstp://`` names carry before their
    first ``/`` (a host name, or any text without ``/``, ``?``, ``#`` or spaces)."""
    if not isinstance(value, str):
        raise ValueError(f"expected an authority (text), got {type(value).__name__}")
    if not value:
        raise ValueError("an empty authority: name the one that xdstp://AUTHORITY/... "
                         "names carry")
    bad = next((c for c in value if c in "/?#%" or c.isspace() or not c.isprintable()), None)
    if bad is not None:
        raise ValueError(f"{value[:100]!r} holds {bad!r}: an authority is what an xdstp:// "
                         f"name carries before its first '/', without '?', '#', '%' or spaces")
    if len(value) > 253:
        raise ValueError(f"{value[:100]!r}... is {len(value)} characters; 253 at most")
    if value == "default":
        raise ValueError("'default' names the origin of upstream (in metrics, /ready and "
                         "status); an authority may not take it")
    return value


AuthorityField = Annotated[str, PlainValidator(_validate_authority)]
AddressField = Annotated[Address, PlainValidator(_validate_address)]
DurationField = Annotated[float, PlainValidator(_validate_duration), Shown(format_duration)]
PositiveDurationField = Annotated[float, PlainValidator(_validate_positive_duration),
                                  Shown(format_duration)]
DirectoryField = Annotated[Path, PlainValidator(_validate_directory)]
SnapshotDirectoryField = Annotated[Path, PlainValidator(_validate_snapshot_directory)]
RedisUrlField = Annotated[str, PlainValidator(_validate_redis_url)]
FileField = Annotated[Path, PlainValidator(_validate_file)]
CertificateFileField = Annotated[Path, PlainValidator(_pem_validator("CERTIFICATE",
                                                                     "certificate"))]
KeyFileField = Annotated[Path, PlainValidator(_pem_validator("PRIVATE KEY", "private key"))]
RequestSizeField = Annotated[int, PlainValidator(_message_size_validator(16 * 1024)),
                             Shown(format_size)]
ResponseSizeField = Annotated[int, PlainValidator(_message_size_validator(64 * 1024)),
                              Shown(format_size)]
HeadersField = Annotated[dict[str, str], PlainValidator(_validate_initial_metadata)]
MetadataField = Annotated[dict[str, Any], PlainValidator(_validate_metadata)]
WorkerCountField = Annotated[int, PlainValidator(_validate_worker_count)]
IdentityPatternField = Annotated[IdentityPattern, PlainValidator(parse_pattern)]
# the patterns of server.authorization.secrets rules: they may hold {namespace}
SecretIdentityPatternField = Annotated[IdentityPattern, PlainValidator(parse_secret_identity)]
SecretNamePatternField = Annotated[IdentityPattern, PlainValidator(parse_secret_name)]
CountField = Annotated[int, PlainValidator(_validate_count)]
NodeSizeField = Annotated[int, PlainValidator(_message_size_validator(1024)), Shown(format_size)]
#: bytes held in memory at once (at least one)
BufferSizeField = Annotated[int, PlainValidator(_validate_buffer_size), Shown(format_size)]
