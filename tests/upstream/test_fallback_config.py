"""``upstream.fallback``: further servers of an origin, each with keys of its own."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from relay.config import Address, ConfigError, parse_config
from relay.config.models import FallbackServerConfig, KeepaliveConfig
from relay.encoding import MAX_MESSAGE_SIZE
from relay.upstream.dial import DEFAULT_CONNECT_TIMEOUT, Dialer


def parse(upstream: str) -> list[FallbackServerConfig]:
    text = "node: {id: relay-1}\nupstream:\n" + textwrap.indent(textwrap.dedent(upstream), "  ")
    config = parse_config(text)
    assert config.upstream is not None
    return config.upstream.fallback


def error(upstream: str) -> str:
    text = "node: {id: relay-1}\nupstream:\n" + textwrap.indent(textwrap.dedent(upstream), "  ")
    with pytest.raises(ConfigError) as info:
        parse_config(text, "relay.yaml")
    return str(info.value)


def test_no_fallback_by_default() -> None:
    assert parse("address: origin:18000\n") == []


def test_each_server_has_its_own_keys_and_the_defaults_of_a_dialer(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    [first, second] = parse(f"""\
        address: origin:18000
        token_file: {token}
        connect_timeout: 9s
        keepalive: {{time: 60s}}
        fallback:
          - address: backup:18000
            connect_timeout: 2s
            initial_metadata: {{clusterid: backup}}
          - address: "[::1]:18001"
            token_file: {token}
            max_response_size: 16MiB
        """)
    assert first.address == Address("backup", 18000)
    assert first.connect_timeout == 2.0
    assert first.initial_metadata == {"clusterid": "backup"}
    # Nothing comes from the primary's keys (gRFC A71: each server's own).
    assert first.token_file is None and first.tls is None
    assert first.keepalive == KeepaliveConfig()
    assert first.max_response_size == MAX_MESSAGE_SIZE == Dialer("x").max_response_size
    assert second.address == Address("::1", 18001)
    assert second.token_file == token
    assert second.max_response_size == 16 * 1024 * 1024
    assert second.connect_timeout == DEFAULT_CONNECT_TIMEOUT == Dialer("x").connect_timeout


def test_a_misspelt_key_of_a_server_names_the_server_and_its_line() -> None:
    assert error("""\
        address: origin:18000
        fallback:
          - address: backup:18000
            conect_timeout: 2s
        """) == ("relay.yaml:6: upstream.fallback[0].conect_timeout: unknown key (allowed: "
                 "address, tls, token_file, initial_metadata, keepalive, connect_timeout, "
                 "max_response_size)")


def test_a_server_needs_an_address() -> None:
    assert error("""\
        address: origin:18000
        fallback:
          - address: backup:18000
          - connect_timeout: 2s
        """) == "relay.yaml:6: upstream.fallback[1].address: field required"


def test_a_server_listed_twice_is_refused_where_it_repeats() -> None:
    assert error("""\
        address: origin:18000
        fallback:
          - address: backup:18000
          - address: origin:18000
        """) == ("relay.yaml:6: upstream.fallback[1].address: repeats address "
                 "(origin:18000): list each server once")
    assert error("""\
        address: origin:18000
        fallback:
          - address: backup:18000
          - address: other:18000
          - address: backup:18000
        """) == ("relay.yaml:7: upstream.fallback[2].address: repeats fallback[0].address "
                 "(backup:18000): list each server once")


def test_fallback_is_for_an_origin_not_for_files(tmp_path: Path) -> None:
    assert error(f"""\
        files: {tmp_path}
        fallback: [{{address: backup:18000}}]
        """) == ("relay.yaml:4: upstream.fallback: fallback servers are for an origin at "
                 "'address', not for 'files'")


def test_a_server_sets_its_token_once(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    assert error(f"""\
        address: origin:18000
        fallback:
          - address: backup:18000
            token_file: {token}
            initial_metadata: {{authorization: Bearer x}}
        """) == ("relay.yaml:5: upstream.fallback[0]: initial_metadata.authorization and "
                 "token_file both set the authorization header; keep one")


def test_a_servers_tls_is_checked_as_the_primarys() -> None:
    assert error("""\
        address: origin:18000
        fallback:
          - address: backup:18000
            tls: {cert_file: /nonexistent/cert.pem}
        """).startswith("relay.yaml:6: upstream.fallback[0].tls.cert_file: ")


def test_fallback_must_be_a_list() -> None:
    assert error("""\
        address: origin:18000
        fallback: {address: backup:18000}
        """) == "relay.yaml:4: upstream.fallback: expected a list, got mapping"


def test_an_authoritys_origin_has_fallback_servers_too() -> None:
    config = parse_config(textwrap.dedent("""\
        node: {id: relay-1}
        authorities:
          east.example.com:
            address: cp-east:18000
            fallback: [{address: cp-east-backup:18000}]
        """))
    assert [s.address for s in config.authorities["east.example.com"].fallback] == [
        Address("cp-east-backup", 18000)]
