"""The ``rest`` section: off by default, its keys listed, every bad value an
error naming its file, line and key."""

from __future__ import annotations

import pytest

from relay.config import Address, config_keys, parse_config
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
    assert keys == {"rest.address": "(none)", "rest.lease": "60s", "rest.wait": "500ms"}


@pytest.mark.parametrize(("body", "line", "field", "problem"), [
    ("rest:\n  adress: 0.0.0.0:1\n", 4, "rest.adress",
     "unknown key (allowed: address, lease, wait)"),
    ("rest:\n  address: nowhere\n", 4, "rest.address", None),
    ("rest:\n  lease: 0s\n", 4, "rest.lease", None),
    ("rest:\n  wait: -1s\n", 4, "rest.wait", None),
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
    ("127.0.0.1:18000", "server.address", "0.0.0.0:18000"),
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
