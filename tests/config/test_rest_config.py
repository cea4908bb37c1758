"""The ``rest`` section: off by default, its keys listed, every bad value an
error naming its file, line and key; and the HTTP limits it shares with ``admin``."""

from __future__ import annotations

import pytest

from relay.config import Address, config_keys, parse_config
from relay.http_limits import HttpLimits
from tests.config.test_security_config import HEAD, document, error


def test_rest_is_off_by_default_with_a_lease_and_a_wait() -> None:
    rest = parse_config(HEAD).rest
    assert (rest.address, rest.lease, rest.wait) == (None, 60.0, 0.5)


def test_a_rest_section_is_read() -> None:
    rest = parse_config(document("""
        rest:
          address: 0.0.0.0:18080
          lease: 2m
          wait: 250ms
        """)).rest
    assert (rest.address, rest.lease, rest.wait) == (Address("0.0.0.0", 18080), 120.0, 0.25)


def test_the_rest_keys_are_listed_with_their_defaults() -> None:
    keys = {key.key: key.default for key in config_keys() if key.key.startswith("rest.")}
    assert keys == {"rest.address": "(none)", "rest.lease": "60s", "rest.wait": "500ms",
                    "rest.header_timeout": "10s", "rest.body_timeout": "30s",
                    "rest.idle_timeout": "60s", "rest.max_buffered_body": "64MiB",
                    "rest.connections_per_host": "100"}


def test_the_admin_http_keys_are_listed_with_their_defaults() -> None:
    keys = {key.key: key.default for key in config_keys()
            if key.key.startswith("admin.") and key.key.endswith(("_timeout", "_host"))}
    assert keys == {"admin.header_timeout": "10s", "admin.idle_timeout": "60s",
                    "admin.connections_per_host": "100"}


def test_the_http_limits_are_read() -> None:
    config = parse_config(document("""
        rest:
          header_timeout: 2s
          body_timeout: 500ms
          idle_timeout: 1m
          max_buffered_body: 32MiB
          connections_per_host: 4
        admin: {header_timeout: 3s, idle_timeout: 5s, connections_per_host: 2}
        """))
    assert config.rest.http_limits == HttpLimits(2.0, 0.5, 60.0, 4, 32 * 1024 * 1024)
    assert config.admin.http_limits == HttpLimits(
        header_timeout=3.0, idle_timeout=5.0, connections_per_host=2)


def test_a_buffer_smaller_than_one_request_is_refused_naming_both_keys() -> None:
    err = error("""
        limits: {request_size: 1MiB}
        rest:
          max_buffered_body: 512KiB
        """)
    assert str(err) == (
        "relay.yaml:5: rest.max_buffered_body: 512KiB is less than limits.request_size "
        "(1MiB): a poll the limits allow could never be read")


def test_a_buffer_of_exactly_one_request_is_accepted() -> None:
    config = parse_config(document("""
        limits: {request_size: 1MiB}
        rest: {max_buffered_body: 1MiB}
        """))
    assert config.rest.max_buffered_body == 1024 * 1024


@pytest.mark.parametrize(("body", "line", "field", "problem"), [
    ("rest:\n  adress: 0.0.0.0:1\n", 4, "rest.adress",
     "unknown key (allowed: address, lease, wait, header_timeout, body_timeout, "
     "idle_timeout, max_buffered_body, connections_per_host)"),
    ("rest:\n  address: nowhere\n", 4, "rest.address", None),
    ("rest:\n  lease: 0s\n", 4, "rest.lease", None),
    ("rest:\n  wait: -1s\n", 4, "rest.wait", None),
    ("rest:\n  header_timeout: 0s\n", 4, "rest.header_timeout", None),
    ("rest:\n  body_timeout: soon\n", 4, "rest.body_timeout", None),
    ("rest:\n  idle_timeout: -1s\n", 4, "rest.idle_timeout", None),
    ("rest:\n  max_buffered_body: 0\n", 4, "rest.max_buffered_body",
     "must be at least 1 byte, got 0"),
    ("rest:\n  max_buffered_body: lots\n", 4, "rest.max_buffered_body", None),
    ("rest:\n  connections_per_host: 0\n", 4, "rest.connections_per_host",
     "must be at least 1, got 0"),
    ("admin:\n  header_timeout: 0s\n", 4, "admin.header_timeout", None),
    ("admin:\n  idle_timeout: 0s\n", 4, "admin.idle_timeout", None),
    ("admin:\n  connections_per_host: yes\n", 4, "admin.connections_per_host", None),
    ("admin:\n  body_timeout: 1s\n", 4, "admin.body_timeout", None),
    ("rest:\n  lease: 1s\n  wait: 2s\n", 3, "rest",
     "lease (1s) must be longer than wait (2s): a subscription would lapse while a poll "
     "waits for it"),
])
def test_a_bad_rest_value_names_its_line_and_key(body: str, line: int, field: str,
                                                 problem: str | None) -> None:
    err = error(body)
    assert (err.line, err.field) == (line, field)
    if problem is not None:
        assert err.problem == problem


def test_rest_on_port_0_with_workers_is_accepted_the_hub_picks_the_port() -> None:
    config = parse_config(document("""
        server: {workers: 2}
        rest: {address: "127.0.0.1:0"}
        """))
    assert config.rest.address == Address("127.0.0.1", 0)


def test_rest_with_workers_on_a_port_number_is_accepted() -> None:
    config = parse_config(document("""
        server: {workers: 2}
        rest: {address: "127.0.0.1:18080"}
        """))
    assert config.rest.address == Address("127.0.0.1", 18080)


@pytest.mark.parametrize(("rest", "key", "other"), [
    ("127.0.0.1:18000", "server.address", "127.0.0.1:18000"),
    ("0.0.0.0:19000", "admin.address", "127.0.0.1:19000"),
])
def test_rest_on_the_port_of_another_listener_is_refused(rest: str, key: str,
                                                          other: str) -> None:
    err = error(f"""
        rest: {{address: "{rest}"}}
        """)
    assert str(err) == (
        f"relay.yaml:3: rest.address: the port of {key} ({other}): REST polling needs a port "
        f"of its own (with --workers both would bind it, and each would take the other's "
        f"connections)")


def test_rest_on_the_port_of_another_host_is_accepted() -> None:
    config = parse_config(document("""
        server: {address: "10.0.0.1:18080"}
        rest: {address: "10.0.0.2:18080"}
        """))
    assert config.rest.address == Address("10.0.0.2", 18080)
