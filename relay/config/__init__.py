"""The relay's YAML configuration: loading, validation and error reporting.

The YAML is composed once into a node tree; the plain Python data built from
that tree is validated by pydantic, and the tree itself is kept so that every
validation error can be traced back to the line it came from. Errors name the
file, the line and the dotted field path, e.g.::

    relay.yaml:9: upstream.adress: unknown key (allowed: address, files, ...)

Use :func:`load_config` for a file and :func:`parse_config` for text; both
return a frozen :class:`RelayConfig` or raise :class:`ConfigError`.

The modules, one concern each: :mod:`~relay.config.errors` (ConfigError),
:mod:`~relay.config.values` (addresses, durations, sizes, files, headers,
metadata), :mod:`~relay.config.models` (the sections), :mod:`~relay.config.loading`
(YAML to a validated config), :mod:`~relay.config.node` (the Node sent to the
origin), :mod:`~relay.config.keys` (every key, its default and description) and
:mod:`~relay.config.example` (a commented example).
"""

from relay.config.errors import ConfigError
from relay.config.example import EXAMPLE_CONFIG
from relay.config.keys import ConfigKey, config_keys
from relay.config.loading import load_config, parse_config
from relay.config.models import (
    AdminConfig,
    AdminTLSConfig,
    AuthorizationConfig,
    BackoffConfig,
    ClientKeepaliveConfig,
    KeepaliveConfig,
    LimitsConfig,
    Locality,
    LoggingConfig,
    MetricsConfig,
    NodeConfig,
    OtlpConfig,
    PersistenceConfig,
    RedisConfig,
    RelayConfig,
    ServerConfig,
    ServerTLSConfig,
    UpstreamConfig,
    UpstreamTLSConfig,
)
from relay.config.node import node_proto
from relay.config.values import Address, parse_address, parse_duration, parse_size

__all__ = [
    "EXAMPLE_CONFIG",
    "Address",
    "AdminConfig",
    "AdminTLSConfig",
    "AuthorizationConfig",
    "BackoffConfig",
    "ClientKeepaliveConfig",
    "ConfigError",
    "ConfigKey",
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
    "ServerConfig",
    "ServerTLSConfig",
    "UpstreamConfig",
    "UpstreamTLSConfig",
    "config_keys",
    "load_config",
    "node_proto",
    "parse_address",
    "parse_config",
    "parse_duration",
    "parse_size",
]
