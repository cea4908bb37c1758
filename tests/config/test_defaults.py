"""A key's default is the default of the code that uses it.

The config models read their defaults from the constants beside the code
(``SETTLE_GRACE``, ``DEFAULT_LEASE``, ...), so a relay built without a config
(tests, benchmarks, the workers) behaves as one built from an empty config.
These tests fail when the two drift apart: a literal typed in one place, or a
constant changed without the key.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from relay.config import RelayConfig, parse_config
from relay.config.models import LimitsConfig
from relay.http_limits import DEFAULT_HTTP_LIMITS
from relay.protocol.limits import DEFAULT_LIMITS
from relay.server.fetch import Fetcher
from relay.sources.files import FileSource
from relay.telemetry import prometheus_provider
from relay.upstream.backoff import Backoff
from relay.upstream.dial import Dialer
from relay.upstream.state import UpstreamState

# Every optional section present, so that its keys take their defaults.
CONFIG = """\
node: {id: relay-1}
upstream: {address: "origin:18000"}
rest: {address: "127.0.0.1:18080"}
metrics: {otlp: {endpoint: "http://collector:4318"}}
"""


def config_value(config: RelayConfig, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def parameter_default(function: Callable[..., Any], name: str) -> Any:
    default = inspect.signature(function).parameters[name].default
    assert default is not inspect.Parameter.empty, f"{function.__qualname__}({name}) has none"
    return default


def field_default(cls: type, name: str) -> Any:
    (field,) = [field for field in dataclasses.fields(cls) if field.name == name]
    return field.default


# (config key, the default where the relay uses it)
RUNTIME_DEFAULTS: list[tuple[str, Any]] = [
    ("upstream.answer_grace", parameter_default(UpstreamState, "answer_grace")),
    ("upstream.linger_names", parameter_default(UpstreamState, "linger_names")),
    ("upstream.max_request_size", parameter_default(UpstreamState, "max_request_size")),
    ("upstream.initial_versions", parameter_default(UpstreamState, "initial_versions")),
    ("upstream.poll_interval", parameter_default(FileSource, "poll_interval")),
    ("upstream.backoff.initial", parameter_default(Backoff, "initial")),
    ("upstream.backoff.max", parameter_default(Backoff, "maximum")),
    ("upstream.keepalive.time", field_default(Dialer, "keepalive_time")),
    ("upstream.keepalive.timeout", field_default(Dialer, "keepalive_timeout")),
    ("upstream.connect_timeout", field_default(Dialer, "connect_timeout")),
    ("upstream.max_response_size", field_default(Dialer, "max_response_size")),
    ("rest.lease", parameter_default(Fetcher, "lease")),
    ("rest.wait", parameter_default(Fetcher, "wait")),
    ("rest.http_limits", DEFAULT_HTTP_LIMITS),
    ("admin.http_limits", DEFAULT_HTTP_LIMITS),
    ("metrics.otlp.interval", parameter_default(prometheus_provider, "otlp_interval")),
]


@pytest.mark.parametrize(("key", "runtime_default"), RUNTIME_DEFAULTS,
                         ids=[key for key, _ in RUNTIME_DEFAULTS])
def test_config_default_is_the_runtime_default(key: str, runtime_default: Any) -> None:
    assert config_value(parse_config(CONFIG), key) == runtime_default


@pytest.mark.parametrize("key", sorted(LimitsConfig.model_fields))
def test_limits_defaults_are_the_protocols(key: str) -> None:
    config = parse_config(CONFIG)
    assert getattr(config.limits, key) == getattr(DEFAULT_LIMITS, key)
