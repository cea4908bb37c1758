"""Tests for relay.config: parsing, defaults, and errors naming file, line and field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pydantic
import pytest
from google.protobuf import json_format

from relay.config import (
    EXAMPLE_CONFIG,
    Address,
    ConfigError,
    RelayConfig,
    load_config,
    node_proto,
    parse_address,
    parse_config,
    parse_duration,
)

MINIMAL = """\
node: {id: relay-1}
upstream: {address: "origin:18000"}
"""


def doc(text: str) -> str:
    """Dedent a test document; line numbers below count from its first line."""
    return textwrap.dedent(text).lstrip("\n")


def config_error(text: str, source: str = "relay.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(doc(text), source)
    return info.value


# --------------------------------------------------------------------------- valid configs


def test_full_config_round_trips_every_field(tmp_path: Path) -> None:
    resources = tmp_path / "resources"
    resources.mkdir()
    cfg = parse_config(doc(f"""
        node:
          id: relay-zone-a
          cluster: edge
          locality: {{region: eu-west1, zone: eu-west1-a, sub_zone: rack-7}}
          metadata:
            team: platform
            weights: [1, 2.5, true, null]
            nested: {{a: {{b: c}}}}
        server:
          address: "[::]:18010"
        upstream:
          files: {resources}
          poll_interval: 250ms
          backoff: {{initial: 0.2s, max: 1m}}
          linger: 1m30s
        admin:
          address: localhost:0
        logging:
          level: WARNING
        """))
    assert cfg.node.id == "relay-zone-a"
    assert cfg.node.cluster == "edge"
    assert cfg.node.locality.region == "eu-west1"
    assert cfg.node.locality.zone == "eu-west1-a"
    assert cfg.node.locality.sub_zone == "rack-7"
    assert cfg.node.metadata == {
        "team": "platform", "weights": [1, 2.5, True, None], "nested": {"a": {"b": "c"}}}
    assert cfg.server.address == Address("::", 18010)
    assert str(cfg.server.address) == "[::]:18010"
    assert cfg.upstream.address is None
    assert cfg.upstream.files == resources.resolve()
    assert cfg.upstream.poll_interval == pytest.approx(0.25)
    assert cfg.upstream.backoff.initial == pytest.approx(0.2)
    assert cfg.upstream.backoff.max == 60.0
    assert cfg.upstream.linger == 90.0
    assert cfg.admin.address == Address("localhost", 0)
    assert cfg.logging.level == "warning"


def test_upstream_address_form() -> None:
    cfg = parse_config(doc("""
        node: {id: relay-1}
        upstream:
          address: origin.internal:18000
          backoff: {initial: 500ms, max: 30s}
        """))
    assert cfg.upstream.address == Address("origin.internal", 18000)
    assert str(cfg.upstream.address) == "origin.internal:18000"
    assert cfg.upstream.files is None
    assert (cfg.upstream.backoff.initial, cfg.upstream.backoff.max) == (0.5, 30.0)


def test_defaults_for_minimal_config() -> None:
    cfg = parse_config(MINIMAL)
    assert isinstance(cfg, RelayConfig)
    assert cfg.node.cluster == "xds-relay"
    assert (cfg.node.locality.region, cfg.node.locality.zone, cfg.node.locality.sub_zone) == (
        "", "", "")
    assert cfg.node.metadata == {}
    # loopback unless told otherwise: plaintext xDS is not offered to the network by default
    assert cfg.server.address == Address("127.0.0.1", 18000)
    assert str(cfg.server.address) == "127.0.0.1:18000"
    assert cfg.upstream.poll_interval == 1.0
    assert (cfg.upstream.backoff.initial, cfg.upstream.backoff.max) == (0.5, 30.0)
    assert cfg.upstream.linger == 30.0
    assert cfg.admin.address == Address("127.0.0.1", 19000)
    assert cfg.logging.level == "info"


def test_empty_sections_mean_defaults() -> None:
    cfg = parse_config(MINIMAL + "admin:\nlogging:\nserver:\n")
    assert cfg.admin.address == Address("127.0.0.1", 19000)
    assert cfg.logging.level == "info"


def test_config_is_frozen() -> None:
    cfg = parse_config(MINIMAL)
    with pytest.raises(pydantic.ValidationError):
        cfg.node.id = "other"  # type: ignore[misc]


def test_example_config_parses() -> None:
    cfg = parse_config(EXAMPLE_CONFIG)
    assert cfg.upstream.address == Address("127.0.0.1", 18001)
    assert cfg.node.id == "relay-zone-a"
    assert "files: config/resources" in EXAMPLE_CONFIG


def test_relative_files_path_resolves_against_cwd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "config" / "resources").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    cfg = parse_config("node: {id: o}\nupstream: {files: config/resources}\n")
    assert cfg.upstream.files == (tmp_path / "config" / "resources").resolve()
    assert cfg.upstream.files is not None and cfg.upstream.files.is_absolute()


@pytest.mark.parametrize("level", ["debug", "INFO", "Warning", "error"])
def test_logging_level_case_insensitive(level: str) -> None:
    cfg = parse_config(MINIMAL + f"logging: {{level: {level}}}\n")
    assert cfg.logging.level == level.lower()


def test_load_config_reads_file(tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text(MINIMAL)
    assert load_config(path).node.id == "relay-1"
    assert load_config(str(path)).upstream.address == Address("origin", 18000)


# --------------------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(("text", "line", "field", "allowed"), [
    ("""
     node: {id: a}
     upstream: {address: "a:1"}
     extra: 1
     """, 3, "extra",
     "node, server, upstream, authorities, admin, logging, metrics, persistence, limits, rest"),
    ("""
     node:
       id: a
       name: b
     upstream: {address: "a:1"}
     """, 3, "node.name", "id, cluster, locality, metadata"),
    ("""
     node:
       id: a
       locality:
         region: r
         city: c
     upstream: {address: "a:1"}
     """, 5, "node.locality.city", "region, zone, sub_zone"),
    ("""
     node: {id: a}
     server:
       addr: "0.0.0.0:1"
     upstream: {address: "a:1"}
     """, 3, "server.addr",
     "address, batch_window, drain_period, max_connection_age, max_connection_age_grace, "
     "max_response_size, workers, keepalive, extra_type_urls, tls, authorization"),
    ("""
     node: {id: a}
     upstream:
       address: "a:1"
       backoff:
         initial: 1s
         maximum: 2s
     """, 6, "upstream.backoff.maximum", "initial, max"),
    ("""
     node: {id: a}
     upstream: {address: "a:1"}
     admin: {address: "127.0.0.1:0", port: 9}
     """, 3, "admin.port",
     "address, tls, token_file, header_timeout, idle_timeout, connections_per_host"),
    ("""
     node: {id: a}
     upstream: {address: "a:1"}
     logging:
       colour: true
     """, 4, "logging.colour", "level, format"),
])
def test_unknown_keys_at_every_level(text: str, line: int, field: str, allowed: str) -> None:
    err = config_error(text)
    assert err.line == line and err.field == field
    assert err.problem == f"unknown key (allowed: {allowed})"
    assert str(err) == f"relay.yaml:{line}: {field}: unknown key (allowed: {allowed})"


def test_misspelt_upstream_key_message() -> None:
    err = config_error("""
        # zone relay
        node:
          id: relay-zone-a
        server:
          address: 0.0.0.0:18000
        upstream:
          address: origin:18000
          backoff: {initial: 0.5s, max: 30s}
          adress: origin:18001
        """)
    assert err.line == 9 and err.field == "upstream.adress"
    assert str(err) == ("relay.yaml:9: upstream.adress: unknown key "
                        "(allowed: address, files, poll_interval, backoff, linger, linger_names, "
                        "answer_grace, tls, token_file, initial_metadata, keepalive, "
                        "connect_timeout, max_response_size, max_request_size, initial_versions, "
                        "fallback, node_groups)")


# --------------------------------------------------------------------------- required fields


def test_missing_node_id_points_at_node() -> None:
    err = config_error("""
        server:
          address: 0.0.0.0:18000
        node:
          cluster: c
        upstream: {address: "a:1"}
        """)
    assert err.line == 3 and err.field == "node.id"
    assert str(err) == "relay.yaml:3: node.id: field required"


def test_empty_node_id_rejected() -> None:
    err = config_error("""
        node:
          id: ""
        upstream: {address: "a:1"}
        """)
    assert err.line == 2 and err.field == "node.id"
    assert "empty" in err.problem


@pytest.mark.parametrize(("text", "field"), [
    ("# no node\nupstream: {address: 'a:1'}\n", "node"),
    ("# no upstream\nnode: {id: a}\n", "upstream"),
])
def test_missing_top_level_section(text: str, field: str) -> None:
    err = config_error(text)
    assert err.field == field and err.line == 2
    assert err.problem == ("field required" if field == "node" else
                           "field required: the origin's address (or files); or authorities, "
                           "an origin per xdstp:// authority")


# --------------------------------------------------------------------------- upstream source


def test_both_address_and_files(tmp_path: Path) -> None:
    err = config_error(f"""
        node: {{id: a}}
        server: {{address: "0.0.0.0:0"}}
        upstream:
          address: origin:18000
          files: {tmp_path}
        """)
    assert err.line == 3 and err.field == "upstream"
    assert str(err) == "relay.yaml:3: upstream: set exactly one of 'address' or 'files'"


def test_neither_address_nor_files() -> None:
    err = config_error("""
        node: {id: a}
        upstream:
          linger: 5s
        """)
    assert err.line == 2 and err.field == "upstream"
    assert err.problem == "set exactly one of 'address' or 'files'"


def test_missing_files_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    err = config_error(f"""
        node: {{id: a}}
        upstream:
          poll_interval: 1s
          files: {missing}
        """)
    assert err.line == 4 and err.field == "upstream.files"
    assert str(err) == f"relay.yaml:4: upstream.files: directory not found: {missing}"


def test_files_path_is_a_file(tmp_path: Path) -> None:
    regular = tmp_path / "resources.yaml"
    regular.write_text("{}")
    err = config_error(f"node: {{id: a}}\nupstream: {{files: {regular}}}\n")
    assert err.line == 2 and err.field == "upstream.files"
    assert err.problem == f"not a directory: {regular}"


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(("text", "seconds"), [
    ("500ms", 0.5), ("1.5s", 1.5), ("2m", 120.0), ("1h", 3600.0), ("1m30s", 90.0),
    ("0s", 0.0), ("3", 3.0), ("0.25", 0.25), (".5s", 0.5),
])
def test_durations(text: str, seconds: float) -> None:
    cfg = parse_config(f"node: {{id: a}}\nupstream: {{address: 'a:1', linger: {text}}}\n")
    assert cfg.upstream.linger == pytest.approx(seconds)
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("setting", "field", "problem"), [
    ("linger: -1s", "upstream.linger", "must not be negative"),
    ("linger: -2", "upstream.linger", "must not be negative"),
    ("linger: 5x", "upstream.linger", "invalid duration '5x'"),
    ("linger: 1s2", "upstream.linger", "invalid duration '1s2'"),
    ("linger: ''", "upstream.linger", "invalid duration ''"),
    ("linger: true", "upstream.linger", "expected a duration, got boolean"),
    ("linger: [1]", "upstream.linger", "expected a duration, got list"),
    ("linger: .inf", "upstream.linger", "must be finite"),
    ("poll_interval: 0s", "upstream.poll_interval", "must be greater than 0"),
    ("poll_interval: ms", "upstream.poll_interval", "invalid duration 'ms'"),
    ("backoff: {initial: 0}", "upstream.backoff.initial", "must be greater than 0"),
    ("backoff: {max: -1s}", "upstream.backoff.max", "must not be negative"),
    ("backoff: {initial: 10s, max: 1s}", "upstream.backoff",
     "max (1s) must not be less than initial (10s)"),
    ("backoff: {initial: 1m}", "upstream.backoff",
     "max (30s) must not be less than initial (60s)"),
])
def test_bad_durations(setting: str, field: str, problem: str) -> None:
    err = config_error(f"""
        node: {{id: a}}
        upstream:
          address: origin:18000
          {setting}
        """)
    assert err.line == 4 and err.field == field
    assert problem in err.problem
    assert str(err).startswith(f"relay.yaml:4: {field}: ")


# --------------------------------------------------------------------------- linger_names


def test_linger_names_default_and_setting() -> None:
    assert parse_config(MINIMAL).upstream.linger_names == 20_000
    cfg = parse_config("node: {id: a}\nupstream: {address: 'a:1', linger_names: 500}\n")
    assert cfg.upstream.linger_names == 500


@pytest.mark.parametrize(("value", "problem"), [
    ("0", "must be at least 1, got 0"),
    ("-5", "must be at least 1, got -5"),
    ("1.5", "expected a whole number, got number"),
    ("'20000'", "expected a whole number, got string"),
    ("true", "expected a whole number, got boolean"),
])
def test_bad_linger_names(value: str, problem: str) -> None:
    err = config_error(f"""
        node: {{id: a}}
        upstream:
          address: origin:18000
          linger_names: {value}
        """)
    assert err.line == 4 and err.field == "upstream.linger_names"
    assert err.problem == problem


# --------------------------------------------------------------------------- workers


def test_workers_default_to_one_process() -> None:
    assert parse_config(MINIMAL).server.workers == 1
    assert parse_config(MINIMAL + "server: {workers: 16}\n").server.workers == 16


@pytest.mark.parametrize(("value", "problem"), [
    ("0", "must be from 1 to 1024, got 0"),
    ("-2", "must be from 1 to 1024, got -2"),
    ("1025", "must be from 1 to 1024, got 1025"),
    ("2.0", "expected a whole number of processes, got number"),
    ("'2'", "expected a whole number of processes, got string"),
    ("auto", "expected a whole number of processes, got string"),
    ("true", "expected a whole number of processes, got boolean"),
])
def test_bad_workers(value: str, problem: str) -> None:
    err = config_error(f"""
        node: {{id: a}}
        upstream: {{address: "a:1"}}
        server:
          workers: {value}
        """)
    assert str(err) == f"relay.yaml:4: server.workers: {problem}"


# --------------------------------------------------------------------------- response size


def test_responses_are_sized_for_grpc_default_receive_limit() -> None:
    assert parse_config(MINIMAL).server.max_response_size == 4 * 1024 * 1024
    assert parse_config(MINIMAL + "server: {max_response_size: 16MiB}\n"
                        ).server.max_response_size == 16 * 1024 * 1024


@pytest.mark.parametrize(("value", "problem"), [
    ("1KiB", "must be at least 65536 bytes, got '1KiB'"),
    ("3GiB", "must be at most 2GiB (gRPC's limit), got '3GiB'"),
    ("big", "invalid size 'big': expected e.g. 65536, 64KiB, 4MiB or 2GiB"),
])
def test_bad_max_response_size(value: str, problem: str) -> None:
    err = config_error(f"""
        node: {{id: a}}
        upstream: {{address: "a:1"}}
        server:
          max_response_size: {value}
        """)
    assert str(err) == f"relay.yaml:4: server.max_response_size: {problem}"


# --------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(("text", "host", "port", "canonical"), [
    ("0.0.0.0:18000", "0.0.0.0", 18000, "0.0.0.0:18000"),
    ("127.0.0.1:0", "127.0.0.1", 0, "127.0.0.1:0"),
    ("[::1]:18000", "::1", 18000, "[::1]:18000"),
    ("[::]:65535", "::", 65535, "[::]:65535"),
    ("origin.internal:18000", "origin.internal", 18000, "origin.internal:18000"),
    ("localhost:1", "localhost", 1, "localhost:1"),
    ("xds-origin_1.svc.cluster.local.:443", "xds-origin_1.svc.cluster.local.", 443,
     "xds-origin_1.svc.cluster.local.:443"),
])
def test_good_addresses(text: str, host: str, port: int, canonical: str) -> None:
    cfg = parse_config(MINIMAL + f'server: {{address: "{text}"}}\n')
    assert cfg.server.address == Address(host, port)
    assert str(cfg.server.address) == canonical
    assert parse_address(text) == Address(host, port)


@pytest.mark.parametrize(("text", "problem"), [
    ("foo", "invalid address 'foo': expected host:port"),
    ("foo:", "invalid address 'foo:': expected host:port"),
    (":80", "invalid address ':80': expected host:port"),
    ("host:99999", "invalid address 'host:99999': port 99999 is out of range 0..65535"),
    ("host:abc", "invalid address 'host:abc': port 'abc' is not a number"),
    ("host:-1", "invalid address 'host:-1': port '-1' is not a number"),
    ("http://x:1", "invalid address 'http://x:1': expected host:port"),
    ("::1:80", "invalid address '::1:80': bracket IPv6 hosts"),
    ("[::1]", "invalid address '[::1]': expected host:port"),
    ("[::1]:", "invalid address '[::1]:': expected host:port"),
    ("[zz::1]:80", "invalid address '[zz::1]:80': 'zz::1' is not an IPv6 address"),
    ("999.1.1.1:80", "invalid address '999.1.1.1:80': '999.1.1.1' is not an IPv4 address"),
    ("bad host:80", "invalid address 'bad host:80': 'bad host' is not an IPv4 address, "
                    "[IPv6] address or DNS name"),
    ("-bad.example:80", "is not an IPv4 address, [IPv6] address or DNS name"),
])
@pytest.mark.parametrize("section", ["server", "admin", "upstream"])
def test_bad_addresses(section: str, text: str, problem: str) -> None:
    if section == "upstream":
        body = f'node: {{id: a}}\n\nupstream: {{address: "{text}"}}\n'
    else:
        body = f'node: {{id: a}}\nupstream: {{address: "a:1"}}\n{section}: {{address: "{text}"}}\n'
    err = config_error(body)
    assert err.line == 3 and err.field == f"{section}.address"
    assert problem in err.problem
    assert str(err) == f"relay.yaml:3: {section}.address: {err.problem}"


# --------------------------------------------------------------------------- wrong types


@pytest.mark.parametrize(("text", "line", "field", "problem"), [
    ("node: {id: a}\nupstream: {address: 'a:1'}\nserver: {address: 18000}\n",
     3, "server.address", "expected a string 'host:port', got integer"),
    ("node: {id: 7}\nupstream: {address: 'a:1'}\n", 1, "node.id",
     "expected a string, got integer"),
    ("node: relay\nupstream: {address: 'a:1'}\n", 1, "node", "expected a mapping, got string"),
    ("node: {id: a, locality: [eu]}\nupstream: {address: 'a:1'}\n", 1, "node.locality",
     "expected a mapping, got list"),
    ("node: {id: a, metadata: 3}\nupstream: {address: 'a:1'}\n", 1, "node.metadata",
     "expected a mapping, got integer"),
    ("node: {id: a, metadata: {since: 2024-01-01}}\nupstream: {address: 'a:1'}\n", 1,
     "node.metadata", "since: date is not allowed"),
    ("node: {id: a, metadata: {x: {on: 1}}}\nupstream: {address: 'a:1'}\n", 1,
     "node.metadata", "x: keys must be strings, got boolean True; quote it"),
    ("node: {id: a}\nupstream: {address: 'a:1'}\nlogging: {level: verbose}\n", 3,
     "logging.level", "unknown level 'verbose' (expected one of: debug, info, warning, error)"),
    ("node: {id: a}\nupstream: {address: 'a:1'}\nlogging: {level: 3}\n", 3,
     "logging.level", "expected a string, got integer"),
    ("node: {id: a}\nupstream: {files: 3}\n", 2, "upstream.files",
     "expected a directory path, got integer"),
    ("node: {id: a}\nupstream: {files: ''}\n", 2, "upstream.files", "must not be empty"),
])
def test_wrong_types(text: str, line: int, field: str, problem: str) -> None:
    err = config_error(text)
    assert err.line == line and err.field == field
    assert problem in err.problem


def test_all_errors_reported_one_per_line(tmp_path: Path) -> None:
    err = config_error(f"""
        node:
          cluster: c
        server: {{address: foo}}
        upstream:
          files: {tmp_path / "missing"}
          linger: -1s
        logging: {{level: loud}}
        """)
    lines = str(err).splitlines()
    assert lines == [
        "relay.yaml:1: node.id: field required",
        "relay.yaml:3: server.address: invalid address 'foo': expected host:port",
        f"relay.yaml:5: upstream.files: directory not found: {tmp_path / 'missing'}",
        "relay.yaml:6: upstream.linger: duration must not be negative, got '-1s'",
        "relay.yaml:7: logging.level: unknown level 'loud' "
        "(expected one of: debug, info, warning, error)",
    ]
    assert (err.line, err.field) == (1, "node.id")
    assert [(e.line, e.field) for e in err.errors] == [
        (1, "node.id"), (3, "server.address"), (5, "upstream.files"), (6, "upstream.linger"),
        (7, "logging.level")]


def test_duplicate_keys_rejected() -> None:
    err = config_error("""
        node: {id: a}
        upstream: {address: "a:1"}
        node: {id: b}
        """)
    assert err.line == 3 and err.field == "node"
    assert err.problem == "duplicate key (first set on line 1)"


def test_yaml_merge_keys_are_not_duplicates() -> None:
    cfg = parse_config(doc("""
        server: &local {address: "127.0.0.1:0"}
        admin:
          <<: *local
        """) + MINIMAL)
    assert cfg.admin.address == Address("127.0.0.1", 0)


# --------------------------------------------------------------------------- documents and files


def test_yaml_syntax_error_line() -> None:
    err = config_error("""
        node:
          id: a
        upstream:
          address: "a:1
        admin: {}
        """)
    assert err.file == "relay.yaml" and err.field == ""
    assert err.line == 6
    assert str(err).startswith("relay.yaml:6: invalid YAML: ")


def test_yaml_bad_indentation_line() -> None:
    err = config_error("""
        node:
          id: a
         cluster: b
        upstream: {address: "a:1"}
        """)
    assert err.line == 3 and err.field == ""
    assert "invalid YAML" in err.problem


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    assert err.file == str(path) and err.line is None and err.field == ""
    assert str(err).startswith(f"{path}: cannot read file: ")


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert info.value.file == str(tmp_path)
    assert "cannot read file" in info.value.problem


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    path.write_bytes(b"node: {id: \xff}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.file == str(path) and "UTF-8" in info.value.problem


def test_load_config_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text("node: {id: a}\nupstream: {address: 'a:1', adress: x}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:2: upstream.adress: unknown key")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n...\n"])
def test_empty_document(text: str) -> None:
    err = config_error(text)
    assert err.field == "" and err.line is None
    assert str(err).startswith("relay.yaml: empty document")


@pytest.mark.parametrize(("text", "kind", "line"), [
    ("- node\n- upstream\n", "list", 1),
    ("\n\njust a string\n", "string", 3),
    ("42\n", "integer", 1),
])
def test_non_mapping_document(text: str, kind: str, line: int) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "relay.yaml")
    err = info.value
    assert err.field == "" and err.line == line
    assert str(err) == f"relay.yaml:{line}: expected a mapping at the top level, got {kind}"


def test_multiple_documents_rejected() -> None:
    err = config_error(MINIMAL + "---\n" + MINIMAL)
    assert err.line == 3 and "invalid YAML" in err.problem


def test_default_source_name() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("node: {id: a}\n")
    assert str(info.value) == ("<string>:1: upstream: field required: the origin's address "
                               "(or files); or authorities, an origin per xdstp:// authority")


def test_config_error_format_without_parts() -> None:
    assert str(ConfigError("f.yaml", None, "", "boom")) == "f.yaml: boom"
    assert str(ConfigError("f.yaml", None, "a.b", "boom")) == "f.yaml: a.b: boom"
    assert str(ConfigError("f.yaml", 4, "", "boom")) == "f.yaml:4: boom"
    err = ConfigError("f.yaml", 4, "a.b", "boom")
    assert str(err) == "f.yaml:4: a.b: boom" and err.errors == [err]


# --------------------------------------------------------------------------- node proto


def test_node_proto() -> None:
    cfg = parse_config(doc("""
        node:
          id: relay-zone-a
          cluster: edge
          locality: {region: eu-west1, zone: eu-west1-a, sub_zone: r7}
          metadata:
            team: platform
            replicas: 3
            tags: [a, b]
            nested: {"on": true}
        upstream: {address: "origin:18000"}
        """))
    node = node_proto(cfg)
    assert node.id == "relay-zone-a"
    assert node.cluster == "edge"
    assert (node.locality.region, node.locality.zone, node.locality.sub_zone) == (
        "eu-west1", "eu-west1-a", "r7")
    assert node.user_agent_name == "xds-relay"
    assert json_format.MessageToDict(node.metadata) == {
        "team": "platform", "replicas": 3.0, "tags": ["a", "b"], "nested": {"on": True}}


def test_node_proto_minimal() -> None:
    node = node_proto(parse_config(MINIMAL))
    assert node.id == "relay-1" and node.cluster == "xds-relay"
    assert node.user_agent_name == "xds-relay"
    assert not node.HasField("metadata")
    assert node.locality.region == ""


def test_batch_window_is_a_duration_defaulting_to_5ms() -> None:
    assert parse_config('node: {id: a}\nupstream: {address: "a:1"}\n').server.batch_window \
        == 0.005
    cfg = parse_config('node: {id: a}\nserver: {batch_window: 0s}\nupstream: {address: "a:1"}\n')
    assert cfg.server.batch_window == 0.0
    err = config_error('node: {id: a}\nserver: {batch_window: -1s}\nupstream: {address: "a:1"}\n')
    assert err.field == "server.batch_window" and err.line == 2


# --------------------------------------------------------------------------- the origin's security


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """PEM files as istiod deployments have them, and a token."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("xds-relay.xds-relay.svc")
    files = {"ca": tmp_path / "root-cert.pem", "cert": tmp_path / "cert.pem",
             "key": tmp_path / "key.pem", "token": tmp_path / "istio-token",
             "text": tmp_path / "notes.txt"}
    files["ca"].write_bytes(ca.cert_pem.bytes())
    files["cert"].write_bytes(cert.cert_chain_pems[0].bytes())
    files["key"].write_bytes(cert.private_key_pem.bytes())
    files["token"].write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2ln\n")
    files["text"].write_text("not a certificate\n")
    return files


def upstream_doc(lines: str) -> str:
    body = textwrap.indent(textwrap.dedent(lines).strip(), "  ")
    return f"node: {{id: relay-1}}\nupstream:\n  address: istiod.istio-system.svc:15012\n{body}\n"


def upstream_error(lines: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(upstream_doc(lines), "relay.yaml")
    return info.value


def test_istiod_upstream_settings_parse(pki: dict[str, Path]) -> None:
    cfg = parse_config(upstream_doc(f"""
        tls:
          ca_file: {pki['ca']}
          server_name: istiod.istio-system.svc
          cert_file: {pki['cert']}
          key_file: {pki['key']}
        token_file: {pki['token']}
        initial_metadata: {{clusterid: Kubernetes, x-zone: 7}}
        keepalive: {{time: 45s, timeout: 5s}}
        connect_timeout: 2s
        max_response_size: 256MiB
        max_request_size: 512KiB
        initial_versions: ignored
        """))
    upstream = cfg.upstream
    assert upstream.tls is not None
    assert upstream.tls.ca_file == pki["ca"] and upstream.tls.key_file == pki["key"]
    assert upstream.tls.server_name == "istiod.istio-system.svc"
    assert upstream.token_file == pki["token"]
    assert upstream.initial_metadata == {"clusterid": "Kubernetes", "x-zone": "7"}
    assert (upstream.keepalive.time, upstream.keepalive.timeout) == (45.0, 5.0)
    assert upstream.connect_timeout == 2.0
    assert upstream.max_response_size == 256 * 1024 * 1024
    assert upstream.max_request_size == 512 * 1024
    assert upstream.initial_versions == "ignored"


def test_upstream_defaults_suit_istiod() -> None:
    upstream = parse_config(MINIMAL).upstream
    assert upstream.tls is None and upstream.token_file is None
    assert upstream.keepalive.time == 30.0  # istiod refuses pings more often than every 15 s
    assert upstream.max_response_size == 2**31 - 1  # as istio-agent: gRPC's largest
    assert upstream.max_request_size == 1024 * 1024  # well under gRPC's default 4 MiB
    assert upstream.initial_versions == "auto"
    assert upstream.connect_timeout == 5.0


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("tls.ca_file", "{missing}", "file not found: {missing}"),
    ("tls.ca_file", "{text}", "not a PEM certificate: {text} (expected a "
                              "'-----BEGIN ...CERTIFICATE-----' block)"),
    ("tls.cert_file", "{key}", "not a PEM certificate: {key} (expected a "
                               "'-----BEGIN ...CERTIFICATE-----' block)"),
    ("tls.key_file", "{cert}", "not a PEM private key: {cert} (expected a "
                               "'-----BEGIN ...PRIVATE KEY-----' block)"),
    ("tls.ca_file", "{dir}", "not a file: {dir}"),
    ("token_file", "{missing}", "file not found: {missing}"),
    ("token_file", "{empty}", "file is empty: {empty}"),
])
def test_a_missing_unreadable_or_non_pem_file_names_its_key(
        pki: dict[str, Path], tmp_path: Path, key: str, value: str, problem: str) -> None:
    (tmp_path / "empty").write_text("\n")
    paths = {name: str(path) for name, path in pki.items()} | {
        "missing": str(tmp_path / "nope.pem"), "dir": str(tmp_path),
        "empty": str(tmp_path / "empty")}
    value, problem = value.format(**paths), problem.format(**paths)
    if key.startswith("tls."):
        pair = {"cert_file": pki["cert"], "key_file": pki["key"]}
        field = key.split(".", 1)[1]
        pair[field] = Path(value)
        body = "tls:\n" + "".join(f"  {k}: {v}\n" for k, v in pair.items())
        if field == "ca_file":
            body = f"tls:\n  ca_file: {value}\n"
    else:
        body = f"{key}: {value}\n"
    err = upstream_error(body)
    assert err.field == f"upstream.{key}"
    assert err.problem == problem
    assert err.line is not None and err.line >= 4


def test_a_client_certificate_needs_its_key(pki: dict[str, Path]) -> None:
    err = upstream_error(f"tls: {{cert_file: {pki['cert']}}}")
    assert (err.field, err.problem) == ("upstream.tls", "set both cert_file and key_file, "
                                                        "or neither")


@pytest.mark.parametrize(("metadata", "problem"), [
    ("{Clusterid: x}", "'Clusterid': header names are lowercase letters, digits, '-', '_' "
                       "and '.'"),
    ("{grpc-timeout: 1S}", "'grpc-timeout': grpc- headers are gRPC's own, and binary (-bin) "
                           "headers are not supported"),
    ("{token-bin: abc}", "'token-bin': grpc- headers are gRPC's own, and binary (-bin) "
                         "headers are not supported"),
    ("{clusterid: [a]}", "clusterid: expected a string, got list"),
    ("[clusterid]", "expected a mapping of header names to strings, got list"),
])
def test_bad_initial_metadata_is_refused(metadata: str, problem: str) -> None:
    err = upstream_error(f"initial_metadata: {metadata}")
    assert (err.field, err.problem) == ("upstream.initial_metadata", problem)


def test_a_token_file_and_an_authorization_header_conflict(pki: dict[str, Path]) -> None:
    err = upstream_error(f"token_file: {pki['token']}\n"
                         "initial_metadata: {authorization: Bearer x}")
    assert err.problem == ("initial_metadata.authorization and token_file both set the "
                           "authorization header; keep one")


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("max_response_size", "3GiB", "must be at most 2GiB (gRPC's limit), got '3GiB'"),
    ("max_response_size", "1KiB", "must be at least 65536 bytes, got '1KiB'"),
    ("max_request_size", "lots", "invalid size 'lots': expected e.g. 65536, 64KiB, 4MiB or "
                                 "2GiB"),
    ("max_request_size", "true", "expected a size such as 4MiB or a number of bytes, got "
                                 "boolean"),
    ("initial_versions", "sometimes", "Input should be 'auto', 'honoured' or 'ignored'"),
    ("connect_timeout", "0s", "must be greater than 0, got '0s'"),
])
def test_bad_upstream_sizes_and_modes_are_refused(key: str, value: str, problem: str) -> None:
    err = upstream_error(f"{key}: {value}")
    assert (err.field, err.problem) == (f"upstream.{key}", problem)


def test_sizes_in_bytes_and_units() -> None:
    from relay.config import parse_size

    assert parse_size(65536) == parse_size("64KiB") == 65536
    assert parse_size("4MiB") == 4 * 1024 * 1024
    assert parse_size("1MB") == 1_000_000
    assert parse_size("2GiB") == 2**31


def test_origin_security_settings_need_an_origin_address(tmp_path: Path,
                                                         pki: dict[str, Path]) -> None:
    err = config_error(f"""
        node: {{id: relay-1}}
        upstream:
          files: {tmp_path}
          token_file: {pki['token']}
        """)
    assert err.field == "upstream"
    assert err.problem == ("tls, token_file and initial_metadata are for an origin at "
                           "'address', not for 'files'")


def test_files_are_kept_at_the_path_given_not_where_a_symlink_points(tmp_path: Path) -> None:
    # Kubernetes swaps a ..data symlink when it rotates a projected token.
    data = tmp_path / "..2026_11_23"
    data.mkdir()
    (data / "istio-token").write_text("t1")
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "istio-token").symlink_to("..data/istio-token")
    cfg = parse_config(upstream_doc(f"token_file: {tmp_path / 'istio-token'}"))
    assert cfg.upstream.token_file == tmp_path / "istio-token"
