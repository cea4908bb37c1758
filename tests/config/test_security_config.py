"""The config's security keys (server.tls, server.authorization, admin.tls,
admin.token_file): a good config validates, every bad one is an error naming
its file, line and key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from relay.authorization import IdentityPattern, SecretRule
from relay.config import ConfigError, load_config, parse_config
from tests.certs import Authority, Leaf

HEAD = 'node: {id: relay-1}\nupstream: {address: "origin:18000"}\n'  # lines 1 and 2


class Files:
    """A CA, the relay's certificate, a stranger's key, a token and a text file."""

    def __init__(self, directory: Path) -> None:
        self.authority = Authority(directory)
        self.relay: Leaf = self.authority.relay_leaf()
        self.other: Leaf = self.authority.relay_leaf("other")
        self.token = directory / "admin-token"
        self.token.write_text("s3cr3t-admin-token\n")
        self.text = directory / "notes.txt"
        self.text.write_text("not a certificate\n")
        self.missing = directory / "missing.pem"


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


def document(body: str) -> str:
    """``HEAD`` and then ``body`` (dedented): the body starts on line 3."""
    return HEAD + textwrap.dedent(body).lstrip("\n")


def error(body: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(document(body), "relay.yaml")
    return info.value


def where(err: ConfigError) -> tuple[int | None, str, str]:
    return err.line, err.field, err.problem


def server_tls(files: Files, *, cert: Path | None = None, key: Path | None = None,
               client_ca: Path | None = None) -> str:
    """A ``server:`` section with tls: lines 3-6, and client_ca_file on line 7."""
    lines = ["server:", "  tls:", f"    cert_file: {cert or files.relay.cert_file}",
             f"    key_file: {key or files.relay.key_file}"]
    if client_ca is not None:
        lines.append(f"    client_ca_file: {client_ca}")
    return "\n".join(lines) + "\n"


def mutual_tls(files: Files) -> str:
    """``server_tls`` with a client CA: lines 3-7."""
    return server_tls(files, client_ca=files.authority.cert_file)


def under_server(text: str) -> str:
    """``text`` (dedented) as keys of the ``server:`` section before it."""
    return textwrap.indent(textwrap.dedent(text).lstrip("\n"), "  ")


# --------------------------------------------------------------------------- a good config


def test_a_full_security_config_validates(files: Files) -> None:
    config = parse_config(document(f"""
        server:
          tls:
            cert_file: {files.relay.cert_file}
            key_file: {files.relay.key_file}
            client_ca_file: {files.authority.cert_file}
          authorization:
            allow:
              - spiffe://cluster.local/ns/prod/sa/frontend
              - "spiffe://cluster.local/ns/*/sa/envoy"
              - {{prefix: "spiffe://cluster.local/ns/edge/"}}
              - {{exact: "relay.test"}}
              - {{glob: "*.prod.svc"}}
            node_binding: namespace
            debug: [{{prefix: "spiffe://cluster.local/ns/ops/"}}, csds.ops.svc]
            debug_loopback: false
        admin:
          address: 0.0.0.0:19000
          tls:
            cert_file: {files.other.cert_file}
            key_file: {files.other.key_file}
          token_file: {files.token}
        """), "relay.yaml")
    tls = config.server.tls
    assert tls is not None
    assert (tls.cert_file, tls.key_file, tls.client_ca_file) == (
        files.relay.cert_file, files.relay.key_file, files.authority.cert_file)
    rules = config.server.authorization
    assert rules.allow == [
        IdentityPattern("exact", "spiffe://cluster.local/ns/prod/sa/frontend"),
        IdentityPattern("glob", "spiffe://cluster.local/ns/*/sa/envoy"),
        IdentityPattern("prefix", "spiffe://cluster.local/ns/edge/"),
        IdentityPattern("exact", "relay.test"),
        IdentityPattern("glob", "*.prod.svc"),
    ]
    assert all(isinstance(pattern, IdentityPattern) for pattern in rules.allow + rules.debug)
    assert rules.allow[1].matches("spiffe://cluster.local/ns/prod/sa/envoy")
    assert rules.node_binding == "namespace"
    assert rules.debug == [IdentityPattern("prefix", "spiffe://cluster.local/ns/ops/"),
                           IdentityPattern("exact", "csds.ops.svc")]
    assert rules.debug_loopback is False
    admin = config.admin
    assert admin.tls is not None
    assert (admin.tls.cert_file, admin.tls.key_file) == (files.other.cert_file,
                                                         files.other.key_file)
    assert admin.token_file == files.token


def test_security_is_off_by_default() -> None:
    config = parse_config(HEAD)
    assert config.server.tls is None
    rules = config.server.authorization
    assert (rules.allow, rules.node_binding, rules.debug, rules.debug_loopback) == (
        [], "none", [], True)
    assert rules.secrets is None and rules.secret_rules() is None
    assert config.admin.tls is None and config.admin.token_file is None


def test_tls_without_a_client_ca_needs_no_authorization(files: Files) -> None:
    config = parse_config(document(server_tls(files)))
    assert config.server.tls is not None and config.server.tls.client_ca_file is None
    assert config.server.authorization.allow == []


def test_debug_loopback_alone_needs_no_client_certificates() -> None:
    config = parse_config(document("""
        server:
          authorization: {debug_loopback: false}
        """))
    assert config.server.authorization.debug_loopback is False


def test_the_security_keys_are_errors_through_load_config(files: Files,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "relay.yaml"
    path.write_text(document(f"""
        admin:
          token_file: {files.missing}
        """))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (f"{path}:4: admin.token_file: file not found: "
                               f"{files.missing}")


# --------------------------------------------------------------------------- server.tls


def test_a_missing_server_certificate_is_named(files: Files) -> None:
    err = error(server_tls(files, cert=files.missing))
    assert where(err) == (5, "server.tls.cert_file", f"file not found: {files.missing}")
    assert str(err) == f"relay.yaml:5: server.tls.cert_file: file not found: {files.missing}"


def test_a_server_key_that_is_not_pem_is_named(files: Files) -> None:
    err = error(server_tls(files, key=files.text))
    assert where(err) == (6, "server.tls.key_file", (
        f"not a PEM private key: {files.text} (expected a '-----BEGIN ...PRIVATE "
        "KEY-----' block)"))


def test_a_server_key_of_another_certificate_is_refused(files: Files) -> None:
    err = error(server_tls(files, key=files.other.key_file))
    assert where(err) == (4, "server.tls", (
        f"key {files.other.key_file} is not the key of certificate "
        f"{files.relay.cert_file}"))


def test_a_client_ca_that_is_not_a_certificate_is_named(files: Files) -> None:
    err = error(server_tls(files, client_ca=files.text))
    assert where(err) == (7, "server.tls.client_ca_file", (
        f"not a PEM certificate: {files.text} (expected a '-----BEGIN ...CERTIFICATE-----' "
        "block)"))


def test_a_missing_client_ca_is_named(files: Files) -> None:
    err = error(server_tls(files, client_ca=files.missing))
    assert where(err) == (7, "server.tls.client_ca_file", f"file not found: {files.missing}")


def test_server_tls_needs_a_key(files: Files) -> None:
    err = error(f"""
        server:
          tls: {{cert_file: {files.relay.cert_file}}}
        """)
    assert where(err) == (4, "server.tls.key_file", "field required")


# --------------------------------------------------------------------------- authorization


def test_an_unknown_allow_form_names_its_list_index(files: Files) -> None:
    err = error(mutual_tls(files) + under_server("""
        authorization:
          allow:
            - spiffe://cluster.local/ns/prod/sa/frontend
            - {regex: "spiffe://.*"}
        """))
    assert where(err) == (11, "server.authorization.allow[1]", (
        "unknown form 'regex' (expected a string, or one of exact, prefix, glob)"))
    assert str(err) == ("relay.yaml:11: server.authorization.allow[1]: unknown form 'regex' "
                        "(expected a string, or one of exact, prefix, glob)")


@pytest.mark.parametrize(("entry", "problem"), [
    ('""', "an empty identity matches no client"),
    ("{exact: a, prefix: b}", "expected one of exact, prefix, glob, got exact, prefix"),
    ("{prefix: 7}", "prefix: expected a non-empty string"),
    ("[a, b]", "expected an identity (a string) or a mapping such as "
               "{prefix: spiffe://cluster.local/ns/prod/}"),
])
def test_a_bad_debug_entry_is_named(files: Files, entry: str, problem: str) -> None:
    err = error(mutual_tls(files) + under_server(f"""
        authorization:
          debug: [{entry}]
        """))
    assert where(err) == (9, "server.authorization.debug[0]", problem)


def test_allow_must_be_a_list(files: Files) -> None:
    err = error(mutual_tls(files) + under_server("""
        authorization:
          allow: spiffe://cluster.local/ns/prod/sa/frontend
        """))
    assert where(err) == (9, "server.authorization.allow", "expected a list, got string")


def test_an_unknown_node_binding_is_refused(files: Files) -> None:
    err = error(mutual_tls(files) + under_server("""
        authorization:
          node_binding: pod
        """))
    assert where(err) == (9, "server.authorization.node_binding",
                          "Input should be 'none', 'namespace' or 'id'")


def test_an_unknown_authorization_key_is_refused(files: Files) -> None:
    err = error(mutual_tls(files) + under_server("""
        authorization:
          deny: [x]
        """))
    assert where(err) == (9, "server.authorization.deny", (
        "unknown key (allowed: allow, node_binding, debug, debug_loopback, secrets)"))


def test_every_bad_rule_is_reported_at_once(files: Files) -> None:
    err = error(mutual_tls(files) + under_server("""
        authorization:
          allow: [{regex: x}]
          node_binding: pod
        """))
    assert [where(e) for e in err.errors] == [
        (9, "server.authorization.allow[0]",
         "unknown form 'regex' (expected a string, or one of exact, prefix, glob)"),
        (10, "server.authorization.node_binding",
         "Input should be 'none', 'namespace' or 'id'"),
    ]


@pytest.mark.parametrize(("rules", "key"), [
    ("{allow: [spiffe://cluster.local/ns/prod/sa/frontend]}", "allow"),
    ("{debug: [csds.ops.svc]}", "debug"),
    ("{node_binding: id}", "node_binding"),
    ("{node_binding: namespace, debug: [x]}", "debug"),
    ("{node_binding: namespace, allow: [x]}", "allow"),
])
def test_identity_rules_without_a_client_ca_are_refused(files: Files, rules: str,
                                                        key: str) -> None:
    err = error(server_tls(files) + f"  authorization: {rules}\n")
    assert where(err) == (3, "server", (
        f"authorization.{key} matches client certificates: set tls.client_ca_file (mutual "
        "TLS) so that clients present one"))


def test_identity_rules_without_tls_are_refused() -> None:
    err = error("""
        server:
          address: 0.0.0.0:18000
          authorization:
            allow: [spiffe://cluster.local/ns/prod/sa/frontend]
        """)
    assert str(err) == ("relay.yaml:3: server: authorization.allow matches client "
                        "certificates: set tls.client_ca_file (mutual TLS) so that clients "
                        "present one")


# --------------------------------------------------------------------------- secrets


def test_secret_rules_validate(files: Files) -> None:
    config = parse_config(document(mutual_tls(files) + under_server("""
        authorization:
          secrets:
            - identities: ["spiffe://cluster.local/ns/{namespace}/sa/*"]
              names: ["kubernetes://{namespace}/*", {prefix: "{namespace}/"}]
            - identities: [{prefix: "spiffe://cluster.local/ns/istio-system/"}, gw.example.com]
              names: [{prefix: ""}]
        """)), "relay.yaml")
    assert config.server.authorization.secret_rules() == [
        SecretRule([IdentityPattern("glob", "spiffe://cluster.local/ns/{namespace}/sa/*")],
                   [IdentityPattern("glob", "kubernetes://{namespace}/*"),
                    IdentityPattern("prefix", "{namespace}/")]),
        SecretRule([IdentityPattern("prefix", "spiffe://cluster.local/ns/istio-system/"),
                    IdentityPattern("exact", "gw.example.com")],
                   [IdentityPattern("prefix", "")]),
    ]


def test_no_secret_for_anyone_needs_no_client_certificates() -> None:
    config = parse_config(document("""
        server:
          authorization: {secrets: []}
        """))
    assert config.server.authorization.secret_rules() == []


def test_secret_rules_without_a_client_ca_are_refused(files: Files) -> None:
    err = error(server_tls(files) + "  authorization: {secrets: [{identities: [a], names: [b]}]}\n")
    assert where(err) == (3, "server", (
        "authorization.secrets matches client certificates: set tls.client_ca_file (mutual "
        "TLS) so that clients present one"))


@pytest.mark.parametrize(("rule", "field", "problem"), [
    ("{identities: [a], names: [b], namespace: prod}", "server.authorization.secrets[0].namespace",
     "unknown key (allowed: identities, names)"),
    ("{identities: [a]}", "server.authorization.secrets[0].names", "field required"),
    ("{identities: [], names: [b]}", "server.authorization.secrets[0]",
     "a rule without identities grants nothing: list the identities that may read these "
     "Secrets"),
    ("{identities: [a], names: ['']}", "server.authorization.secrets[0].names[0]",
     "an empty name matches no Secret"),
    ("{identities: [a], names: [{regex: b}]}", "server.authorization.secrets[0].names[0]",
     "unknown form 'regex' (expected a string, or one of exact, prefix, glob)"),
    ("{identities: ['spiffe://td/ns/{ns}/sa/*'], names: [b]}",
     "server.authorization.secrets[0].identities[0]",
     "unknown placeholder {ns} in 'spiffe://td/ns/{ns}/sa/*' (the one placeholder is "
     "{namespace})"),
    ("{identities: ['spiffe://td/ns/prod/sa/*'], names: ['{namespace}/*']}",
     "server.authorization.secrets[0]",
     "names use {namespace}, which identity 'spiffe://td/ns/prod/sa/*' does not capture "
     "(write {namespace} where its namespace is, as in "
     "spiffe://cluster.local/ns/{namespace}/sa/*)"),
    ("spiffe://td/ns/prod/sa/gw", "server.authorization.secrets[0]",
     "expected a mapping, got string"),
])
def test_a_bad_secret_rule_is_named(files: Files, rule: str, field: str, problem: str) -> None:
    err = error(mutual_tls(files) + under_server(f"""
        authorization:
          secrets:
            - {rule}
        """))
    assert where(err) == (10, field, problem)


def test_secrets_must_be_a_list_of_rules(files: Files) -> None:
    err = error(mutual_tls(files) + under_server("""
        authorization:
          secrets: {identities: [a], names: [b]}
        """))
    assert where(err) == (9, "server.authorization.secrets", "expected a list, got mapping")


# --------------------------------------------------------------------------- admin


def test_an_admin_key_of_another_certificate_is_refused(files: Files) -> None:
    err = error(f"""
        admin:
          tls:
            cert_file: {files.relay.cert_file}
            key_file: {files.other.key_file}
        """)
    assert where(err) == (4, "admin.tls", (
        f"key {files.other.key_file} is not the key of certificate "
        f"{files.relay.cert_file}"))


def test_a_missing_admin_certificate_is_named(files: Files) -> None:
    err = error(f"""
        admin:
          tls:
            cert_file: {files.missing}
            key_file: {files.relay.key_file}
        """)
    assert where(err) == (5, "admin.tls.cert_file", f"file not found: {files.missing}")


def test_admin_tls_needs_a_key(files: Files) -> None:
    err = error(f"""
        admin:
          tls: {{cert_file: {files.relay.cert_file}}}
        """)
    assert where(err) == (4, "admin.tls.key_file", "field required")


def test_a_missing_admin_token_file_is_named(files: Files) -> None:
    err = error(f"""
        admin:
          token_file: {files.missing}
        """)
    assert where(err) == (4, "admin.token_file", f"file not found: {files.missing}")


def test_an_admin_token_file_that_is_a_directory_is_named(tmp_path: Path) -> None:
    err = error(f"""
        admin:
          token_file: {tmp_path}
        """)
    assert where(err) == (4, "admin.token_file", f"not a file: {tmp_path}")


def test_an_unknown_admin_tls_key_is_refused(files: Files) -> None:
    err = error(f"""
        admin:
          tls:
            cert_file: {files.relay.cert_file}
            key_file: {files.relay.key_file}
            client_ca_file: {files.authority.cert_file}
        """)
    assert where(err) == (7, "admin.tls.client_ca_file",
                          "unknown key (allowed: cert_file, key_file)")
