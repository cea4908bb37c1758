"""relay.authorization: identity patterns, peer identities and the Authorizer's
decisions, with the exact sentences a refused client's operator reads."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2

from relay.authorization import (
    EVERY_SECRET,
    NO_SECRET,
    Authorizer,
    IdentityPattern,
    PeerIdentity,
    SecretRule,
    SecretScope,
    is_loopback,
    node_namespace,
    parse_pattern,
    parse_secret_identity,
    parse_secret_name,
)

SPIFFE = "spiffe://cluster.local/ns/prod/sa/frontend"
WORKLOAD = PeerIdentity(SPIFFE, ("frontend.prod.svc", "frontend"))
NO_CERT_IDENTITY = "a client without a certificate identity (no SPIFFE ID or DNS SAN)"


def node(node_id: str = "", **metadata: Any) -> base_pb2.Node:
    message = base_pb2.Node(id=node_id)
    message.metadata.update(metadata)
    return message


# --------------------------------------------------------------------------- parse_pattern


def test_a_plain_string_is_an_exact_identity() -> None:
    assert parse_pattern(SPIFFE) == IdentityPattern("exact", SPIFFE)


def test_a_string_with_a_star_is_a_glob() -> None:
    assert parse_pattern("spiffe://cluster.local/ns/*/sa/frontend") == IdentityPattern(
        "glob", "spiffe://cluster.local/ns/*/sa/frontend")


@pytest.mark.parametrize("kind", ["exact", "prefix", "glob"])
def test_a_mapping_names_its_form(kind: str) -> None:
    assert parse_pattern({kind: "spiffe://cluster.local/ns/prod/"}) == IdentityPattern(
        kind, "spiffe://cluster.local/ns/prod/")  # type: ignore[arg-type]


def test_an_explicit_exact_keeps_a_star_literal() -> None:
    pattern = parse_pattern({"exact": "spiffe://td/ns/*"})
    assert pattern.kind == "exact"
    assert pattern.matches("spiffe://td/ns/*")
    assert not pattern.matches("spiffe://td/ns/prod")


@pytest.mark.parametrize(("raw", "problem"), [
    ({"regex": "x"}, "unknown form 'regex' (expected a string, or one of exact, prefix, glob)"),
    ({"exact": "a", "prefix": "b"}, "expected one of exact, prefix, glob, got exact, prefix"),
    ({}, "expected one of exact, prefix, glob, got an empty mapping"),
    ("", "an empty identity matches no client"),
    ({"exact": 3}, "exact: expected a non-empty string"),
    ({"prefix": ""}, "prefix: expected a non-empty string"),
    ({"glob": None}, "glob: expected a non-empty string"),
    (["spiffe://td/ns/prod/sa/a"], "expected an identity (a string) or a mapping such as "
                                   "{prefix: spiffe://cluster.local/ns/prod/}"),
    (7, "expected an identity (a string) or a mapping such as "
        "{prefix: spiffe://cluster.local/ns/prod/}"),
    (None, "expected an identity (a string) or a mapping such as "
           "{prefix: spiffe://cluster.local/ns/prod/}"),
])
def test_a_bad_pattern_is_refused_with_a_reason(raw: object, problem: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_pattern(raw)
    assert str(info.value) == problem


# --------------------------------------------------------------------------- matching


def test_exact_matches_only_the_identity_itself() -> None:
    pattern = IdentityPattern("exact", SPIFFE)
    assert pattern.matches(SPIFFE)
    assert not pattern.matches(SPIFFE + "x")
    assert not pattern.matches(SPIFFE[:-1])
    assert not pattern.matches(SPIFFE.upper())


def test_prefix_matches_what_starts_with_it_across_slashes() -> None:
    pattern = IdentityPattern("prefix", "spiffe://td/ns/prod/")
    assert pattern.matches("spiffe://td/ns/prod/")
    assert pattern.matches("spiffe://td/ns/prod/sa/a")
    assert not pattern.matches("spiffe://td/ns/production/sa/a")
    assert not pattern.matches("spiffe://td/ns/pro")


def test_glob_star_stands_for_one_path_segment() -> None:
    pattern = IdentityPattern("glob", "spiffe://td/ns/*/sa/frontend")
    assert pattern.matches("spiffe://td/ns/prod/sa/frontend")
    assert not pattern.matches("spiffe://td/ns/prod/extra/sa/frontend")
    assert not pattern.matches("spiffe://td/ns/prod/sa/frontend/x")


def test_glob_star_at_the_end_does_not_reach_into_deeper_segments() -> None:
    pattern = IdentityPattern("glob", "spiffe://td/ns/prod/*")
    assert pattern.matches("spiffe://td/ns/prod/sa")
    assert not pattern.matches("spiffe://td/ns/prod/sa/frontend")


def test_glob_star_matches_an_empty_run() -> None:
    assert IdentityPattern("glob", "spiffe://td/ns/*/sa/a").matches("spiffe://td/ns//sa/a")
    assert IdentityPattern("glob", "front*").matches("front")


def test_glob_star_spans_dns_labels() -> None:
    pattern = IdentityPattern("glob", "*.prod.svc")
    assert pattern.matches("frontend.prod.svc")
    assert pattern.matches("a.b.prod.svc")  # "any part of a DNS name", dots included
    assert not pattern.matches("frontend.prod.svc.evil")


def test_glob_matches_the_whole_identity_not_a_part() -> None:
    pattern = IdentityPattern("glob", "front*")
    assert pattern.matches("frontend")
    assert not pattern.matches("xfrontend")


@pytest.mark.parametrize(("glob", "literal", "not_matched"), [
    ("*.prod.svc", "a.prod.svc", "a.prodXsvc"),
    ("a+*", "a+b", "aab"),
    ("a?*", "a?b", "ab"),
    ("[ab]*", "[ab]c", "ac"),
    ("(a|b)*", "(a|b)c", "ac"),
    ("^a$*", "^a$b", "ab"),
    ("a\\d*", "a\\dx", "a1x"),
])
def test_only_the_star_is_special_in_a_glob(glob: str, literal: str, not_matched: str) -> None:
    pattern = IdentityPattern("glob", glob)
    assert pattern.matches(literal)
    assert not pattern.matches(not_matched)


# --------------------------------------------------------------------------- PeerIdentity


def test_identity_from_grpc_auth_context() -> None:
    identity = PeerIdentity.from_auth_context({
        "transport_security_type": [b"ssl"],
        "x509_common_name": [b"frontend"],
        "peer_spiffe_id": [SPIFFE.encode()],
        "peer_dns": [b"frontend.prod.svc", b"frontend"],
    })
    assert identity == WORKLOAD
    assert identity.names == (SPIFFE, "frontend.prod.svc", "frontend")
    assert str(identity) == f"{SPIFFE} / frontend.prod.svc / frontend"


def test_identity_with_dns_names_only() -> None:
    identity = PeerIdentity.from_auth_context({"peer_dns": [b"relay.test"]})
    assert identity == PeerIdentity(None, ("relay.test",))
    assert identity.names == ("relay.test",)
    assert str(identity) == "relay.test"


def test_identity_with_a_spiffe_id_only() -> None:
    identity = PeerIdentity.from_auth_context({"peer_spiffe_id": [SPIFFE.encode()]})
    assert identity == PeerIdentity(SPIFFE, ())
    assert identity.names == (SPIFFE,)
    assert str(identity) == SPIFFE


def test_an_empty_auth_context_is_no_identity() -> None:
    identity = PeerIdentity.from_auth_context({})
    assert identity == PeerIdentity()
    assert identity.names == ()
    assert str(identity) == NO_CERT_IDENTITY


# --------------------------------------------------------------------------- is_loopback


@pytest.mark.parametrize(("peer", "loopback"), [
    ("ipv4:127.0.0.1:5", True),
    ("ipv4:127.0.0.1:65535", True),
    # an Istio sidecar's inbound connections, whoever the client is
    ("ipv4:127.0.0.6:5", False),
    ("ipv4:127.3.4.5:5", False),
    ("ipv4:127.0.0.10:5", False),
    ("ipv4:10.0.0.1:5", False),
    ("ipv4:1.27.0.0:5", False),
    ("ipv6:%5B::1%5D:5", True),
    ("ipv6:[::1]:5", True),
    ("ipv6:%5B::ffff:127.0.0.1%5D:5", True),
    ("ipv6:%5B::ffff:127.0.0.6%5D:5", False),
    ("ipv6:%5B2001:db8::1%5D:5", False),
    ("ipv6:%5B::10%5D:5", False),
    ("unix:", True),
    ("unix:/tmp/x", True),
    ("unix-abstract:relay", True),
    ("ipv4:not-an-address:5", False),
    ("dns:localhost:5", False),
])
def test_is_loopback(peer: str, loopback: bool) -> None:
    assert is_loopback(peer) is loopback


# --------------------------------------------------------------------------- node_namespace


def test_namespace_from_metadata() -> None:
    assert node_namespace(node("anything", NAMESPACE="prod")) == "prod"


def test_namespace_metadata_wins_over_the_istio_id() -> None:
    istio = "sidecar~10.0.0.1~pod.other~other.svc.cluster.local"
    assert node_namespace(node(istio, NAMESPACE="prod")) == "prod"


def test_namespace_from_an_istio_id() -> None:
    assert node_namespace(node("sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local")) == "ns"


@pytest.mark.parametrize("value", [3, True, ["prod"], {"name": "prod"}, None, ""])
def test_namespace_metadata_that_is_not_a_string_is_ignored(value: object) -> None:
    assert node_namespace(node("relay-1", NAMESPACE=value)) is None
    assert node_namespace(node("sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local",
                               NAMESPACE=value)) == "ns"


@pytest.mark.parametrize("node_id", [
    "",
    "relay-1",
    "pod.ns",
    "sidecar~10.0.0.1~pod.ns",  # three parts
    "sidecar~10.0.0.1~pod.ns~ns.svc~extra",  # five
])
def test_ids_not_in_istio_form_declare_no_namespace(node_id: str) -> None:
    assert node_namespace(node(node_id)) is None


def test_namespace_from_an_istio_id_whose_pod_name_has_dots() -> None:
    assert node_namespace(node("sidecar~10.0.0.1~web.v1.prod~prod.svc.cluster.local")) == \
        "prod"


# --------------------------------------------------------------------------- connect_error


def test_without_allow_rules_any_client_connects() -> None:
    authorizer = Authorizer()
    assert authorizer.connect_error(WORKLOAD) is None
    assert authorizer.connect_error(PeerIdentity()) is None


def test_a_client_matching_an_allow_rule_connects() -> None:
    authorizer = Authorizer(allow=[IdentityPattern("prefix", "spiffe://cluster.local/ns/prod/")])
    assert authorizer.connect_error(WORKLOAD) is None


def test_any_name_of_the_certificate_may_match() -> None:
    authorizer = Authorizer(allow=[IdentityPattern("exact", "nomatch"),
                                   IdentityPattern("glob", "*.prod.svc")])
    assert authorizer.connect_error(WORKLOAD) is None


def test_a_client_matching_no_allow_rule_is_refused() -> None:
    authorizer = Authorizer(allow=[IdentityPattern("prefix", "spiffe://cluster.local/ns/dev/")])
    assert authorizer.connect_error(WORKLOAD) == (
        f"client identity {SPIFFE} / frontend.prod.svc / frontend is not allowed to connect "
        "(server.authorization.allow)")


def test_a_client_without_an_identity_is_refused_when_rules_are_set() -> None:
    authorizer = Authorizer(allow=[IdentityPattern("glob", "*")])
    assert authorizer.connect_error(PeerIdentity()) == (
        f"client identity {NO_CERT_IDENTITY} is not allowed to connect "
        "(server.authorization.allow)")


# --------------------------------------------------------------------------- node_error


def test_node_binding_none_checks_nothing() -> None:
    authorizer = Authorizer(node_binding="none")
    assert authorizer.node_error(PeerIdentity(), None) is None
    assert authorizer.node_error(WORKLOAD, node("someone-else", NAMESPACE="dev")) is None


@pytest.mark.parametrize("binding", ["id", "namespace"])
def test_a_binding_needs_a_node_id(binding: Any) -> None:
    authorizer = Authorizer(node_binding=binding)
    problem = "the first request carries no node id; server.authorization.node_binding needs one"
    assert authorizer.node_error(WORKLOAD, None) == problem
    assert authorizer.node_error(WORKLOAD, node("", NAMESPACE="prod")) == problem


@pytest.mark.parametrize("node_id", [SPIFFE, "frontend.prod.svc", "frontend"])
def test_id_binding_accepts_any_identity_of_the_certificate(node_id: str) -> None:
    assert Authorizer(node_binding="id").node_error(WORKLOAD, node(node_id)) is None


def test_id_binding_refuses_another_id() -> None:
    assert Authorizer(node_binding="id").node_error(WORKLOAD, node("backend")) == (
        f"node id 'backend' is not the identity of its certificate ({SPIFFE} / "
        "frontend.prod.svc / frontend) (server.authorization.node_binding: id)")


def test_id_binding_refuses_a_client_without_an_identity() -> None:
    assert Authorizer(node_binding="id").node_error(PeerIdentity(), node("frontend")) == (
        f"node id 'frontend' is not the identity of its certificate ({NO_CERT_IDENTITY}) "
        "(server.authorization.node_binding: id)")


def test_namespace_binding_accepts_the_certificates_namespace() -> None:
    authorizer = Authorizer(node_binding="namespace")
    assert authorizer.node_error(WORKLOAD, node("relay-client", NAMESPACE="prod")) is None
    assert authorizer.node_error(
        WORKLOAD, node("sidecar~10.0.0.1~frontend-7d9.prod~prod.svc.cluster.local")) is None


def test_namespace_binding_accepts_the_certificates_service_account() -> None:
    authorizer = Authorizer(node_binding="namespace")
    assert authorizer.node_error(
        WORKLOAD, node("c", NAMESPACE="prod", SERVICE_ACCOUNT="frontend")) is None


def test_namespace_binding_refuses_another_namespace() -> None:
    authorizer = Authorizer(node_binding="namespace")
    assert authorizer.node_error(WORKLOAD, node("c", NAMESPACE="dev")) == (
        f"node 'c' is in namespace 'dev' but its certificate {SPIFFE} is for namespace "
        "'prod' (server.authorization.node_binding: namespace)")


def test_namespace_binding_refuses_another_service_account() -> None:
    authorizer = Authorizer(node_binding="namespace")
    assert authorizer.node_error(
        WORKLOAD, node("c", NAMESPACE="prod", SERVICE_ACCOUNT="backend")) == (
        f"node 'c' runs as service account 'backend' but its certificate {SPIFFE} is for "
        "'frontend' (server.authorization.node_binding: namespace)")


def test_namespace_binding_ignores_an_empty_service_account() -> None:
    authorizer = Authorizer(node_binding="namespace")
    assert authorizer.node_error(WORKLOAD, node("c", NAMESPACE="prod", SERVICE_ACCOUNT="")) \
        is None


def test_namespace_binding_refuses_a_node_without_a_namespace() -> None:
    authorizer = Authorizer(node_binding="namespace")
    assert authorizer.node_error(WORKLOAD, node("relay-client")) == (
        "node 'relay-client' declares no namespace (NAMESPACE metadata or an Istio-style "
        "id); server.authorization.node_binding: namespace needs one")


@pytest.mark.parametrize("identity", [
    PeerIdentity(None, ("frontend.prod.svc",)),
    PeerIdentity("spiffe://cluster.local/workload/frontend"),
    PeerIdentity("spiffe://cluster.local/ns/prod/sa"),
    PeerIdentity("spiffe://cluster.local/ns/prod/sa/frontend/extra"),
    PeerIdentity("spiffe://cluster.local/namespace/prod/sa/frontend"),
    PeerIdentity("spiffe://cluster.local/ns/prod/serviceaccount/frontend"),
])
def test_namespace_binding_needs_a_kubernetes_spiffe_id(identity: PeerIdentity) -> None:
    authorizer = Authorizer(node_binding="namespace")
    assert authorizer.node_error(identity, node("c", NAMESPACE="prod")) == (
        f"the certificate ({identity}) has no Kubernetes SPIFFE ID "
        "(spiffe://<trust domain>/ns/<namespace>/sa/<service account>) to bind node 'c' to "
        "(server.authorization.node_binding: namespace)")


def test_namespace_binding_refuses_a_client_without_an_identity() -> None:
    authorizer = Authorizer(node_binding="namespace")
    assert authorizer.node_error(PeerIdentity(), node("c", NAMESPACE="prod")) == (
        f"the certificate ({NO_CERT_IDENTITY}) has no Kubernetes SPIFFE ID "
        "(spiffe://<trust domain>/ns/<namespace>/sa/<service account>) to bind node 'c' to "
        "(server.authorization.node_binding: namespace)")


# --------------------------------------------------------------------------- debug_error


def test_loopback_clients_may_debug_by_default() -> None:
    authorizer = Authorizer()
    assert authorizer.debug_error(PeerIdentity(), "ipv4:127.0.0.1:4000") is None
    assert authorizer.debug_error(PeerIdentity(), "unix:/run/relay.sock") is None


def test_remote_clients_may_not_debug_by_default() -> None:
    assert Authorizer().debug_error(WORKLOAD, "ipv4:10.0.0.1:4000") == (
        "CSDS and reflection answer only processes on the relay's host (127.0.0.1, ::1, a "
        "unix socket) and the identities in server.authorization.debug; "
        f"{SPIFFE} / frontend.prod.svc / frontend is not one of them (the admin listener's "
        "/clients shows every client)")


def test_a_client_behind_a_sidecar_is_not_on_the_relays_host() -> None:
    """Istio's sidecar connects to the relay from 127.0.0.6 for every client of the mesh."""
    assert Authorizer().debug_error(PeerIdentity(), "ipv4:127.0.0.6:41000") == (
        "CSDS and reflection answer only processes on the relay's host (127.0.0.1, ::1, a "
        f"unix socket) and the identities in server.authorization.debug; {NO_CERT_IDENTITY} "
        "is not one of them (the admin listener's /clients shows every client)")


def test_identities_in_the_debug_list_may_debug_from_anywhere() -> None:
    authorizer = Authorizer(debug=[IdentityPattern("exact", "frontend")])
    assert authorizer.debug_error(WORKLOAD, "ipv4:10.0.0.1:4000") is None


def test_allow_rules_do_not_grant_debug() -> None:
    authorizer = Authorizer(allow=[IdentityPattern("exact", SPIFFE)], debug_loopback=False)
    assert authorizer.debug_error(WORKLOAD, "ipv4:10.0.0.1:4000") is not None


def test_loopback_needs_the_debug_list_when_debug_loopback_is_off() -> None:
    authorizer = Authorizer(debug=[IdentityPattern("prefix", "spiffe://cluster.local/ns/ops/")],
                            debug_loopback=False)
    assert authorizer.debug_error(WORKLOAD, "ipv4:127.0.0.1:4000") == (
        "CSDS and reflection answer only the identities in server.authorization.debug; "
        f"{SPIFFE} / frontend.prod.svc / frontend is not one of them (the admin listener's "
        "/clients shows every client)")
    ops = PeerIdentity("spiffe://cluster.local/ns/ops/sa/csds")
    assert authorizer.debug_error(ops, "ipv4:127.0.0.1:4000") is None


def test_a_debug_refusal_names_a_client_without_an_identity() -> None:
    authorizer = Authorizer(debug_loopback=False)
    assert authorizer.debug_error(PeerIdentity(), "ipv6:%5B::1%5D:4000") == (
        "CSDS and reflection answer only the identities in server.authorization.debug; "
        f"{NO_CERT_IDENTITY} is not one of them (the admin listener's /clients shows every "
        "client)")


# --------------------------------------------------------------------------- secrets

GATEWAY = PeerIdentity("spiffe://cluster.local/ns/istio-system/sa/ingress")
NAMESPACED = SecretRule([parse_secret_identity("spiffe://cluster.local/ns/{namespace}/sa/*")],
                        [parse_secret_name("kubernetes://{namespace}/*"),
                         parse_secret_name("{namespace}/*")])


def test_without_rules_a_client_with_a_certificate_identity_may_have_every_secret() -> None:
    assert Authorizer().secret_scope(WORKLOAD) == EVERY_SECRET
    assert Authorizer().secret_scope(PeerIdentity(None, ("gw.example.com",))) == EVERY_SECRET
    assert EVERY_SECRET.may_read("kubernetes://prod/any/thing")


def test_without_rules_a_client_without_a_certificate_has_no_secret() -> None:
    scope = Authorizer().secret_scope(PeerIdentity())
    assert scope == NO_SECRET and scope.is_empty
    assert not scope.may_read("default")


def test_with_rules_a_client_has_only_what_they_grant() -> None:
    rule = SecretRule([parse_secret_identity(SPIFFE)], [parse_secret_name("frontend-cert")])
    authorizer = Authorizer(secrets=[rule])
    scope = authorizer.secret_scope(WORKLOAD)
    assert scope == SecretScope(frozenset({IdentityPattern("exact", "frontend-cert")}))
    assert scope.may_read("frontend-cert")
    assert not scope.may_read("frontend-cert-2")
    assert authorizer.secret_scope(GATEWAY) == NO_SECRET
    assert authorizer.secret_scope(PeerIdentity()) == NO_SECRET


def test_an_empty_rule_list_grants_no_secret_to_anyone() -> None:
    assert Authorizer(secrets=[]).secret_scope(WORKLOAD) == NO_SECRET


def test_a_namespace_placeholder_scopes_names_to_the_identitys_namespace() -> None:
    scope = Authorizer(secrets=[NAMESPACED]).secret_scope(WORKLOAD)
    assert scope == SecretScope(frozenset({IdentityPattern("glob", "kubernetes://prod/*"),
                                           IdentityPattern("glob", "prod/*")}))
    assert scope.may_read("kubernetes://prod/frontend-cert")
    assert scope.may_read("prod/frontend-cert")
    assert not scope.may_read("kubernetes://payments/db-cert")
    assert not scope.may_read("payments/db-cert")
    # a glob's * never crosses a /
    assert not scope.may_read("kubernetes://prod/a/b")


def test_a_namespace_placeholder_matches_only_a_namespace() -> None:
    authorizer = Authorizer(secrets=[NAMESPACED])
    for stranger in ("spiffe://cluster.local/ns/prod/extra/sa/x",  # not one segment
                     "spiffe://cluster.local/ns/Prod/sa/x",  # not a DNS label
                     "spiffe://cluster.local/ns/*/sa/x",
                     "spiffe://other.domain/ns/prod/sa/x"):
        assert authorizer.secret_scope(PeerIdentity(stranger)) == NO_SECRET, stranger


def test_a_namespace_placeholder_twice_must_capture_the_same_namespace() -> None:
    rule = SecretRule([parse_secret_identity("spiffe://td/ns/{namespace}/sa/{namespace}-gw")],
                      [parse_secret_name("{namespace}/*")])
    authorizer = Authorizer(secrets=[rule])
    assert authorizer.secret_scope(PeerIdentity("spiffe://td/ns/edge/sa/edge-gw")).may_read(
        "edge/cert")
    assert authorizer.secret_scope(PeerIdentity("spiffe://td/ns/edge/sa/core-gw")) == NO_SECRET


def test_a_namespace_placeholder_works_in_a_prefix_and_a_dns_name() -> None:
    rule = SecretRule([parse_secret_identity({"prefix": "gw.{namespace}.svc"})],
                      [parse_secret_name({"prefix": "kubernetes://{namespace}/"})])
    scope = Authorizer(secrets=[rule]).secret_scope(PeerIdentity(None, ("gw.edge.svc.local",)))
    assert scope == SecretScope(frozenset({IdentityPattern("prefix", "kubernetes://edge/")}))


def test_rules_add_up_and_every_secret_is_one_scope() -> None:
    everything = SecretRule([parse_secret_identity(GATEWAY.spiffe_id)],
                            [parse_secret_name({"prefix": ""})])
    authorizer = Authorizer(secrets=[NAMESPACED, everything])
    assert authorizer.secret_scope(GATEWAY) == EVERY_SECRET
    prod = authorizer.secret_scope(WORKLOAD)
    assert prod.may_read("prod/a") and not prod.may_read("istio-system/a")


def test_secret_scopes_of_the_same_grants_are_equal() -> None:
    """What lets pollers of the same scope share one lease (and one rendered body)."""
    authorizer = Authorizer(secrets=[NAMESPACED])
    other = PeerIdentity("spiffe://cluster.local/ns/prod/sa/backend")
    assert authorizer.secret_scope(WORKLOAD) == authorizer.secret_scope(other)
    assert hash(authorizer.secret_scope(WORKLOAD)) == hash(authorizer.secret_scope(other))


def test_secret_name_patterns() -> None:
    assert parse_secret_name("default") == IdentityPattern("exact", "default")
    assert parse_secret_name("kubernetes://*") == IdentityPattern("glob", "kubernetes://*")
    assert parse_secret_name({"prefix": ""}) == IdentityPattern("prefix", "")


@pytest.mark.parametrize(("parse", "raw", "problem"), [
    (parse_secret_name, "", "an empty name matches no Secret"),
    (parse_secret_name, 7, 'expected a Secret name (a string) or a mapping such as '
                           '{prefix: "kubernetes://"}'),
    (parse_secret_name, {"glob": ""}, "glob: expected a non-empty string"),
    (parse_secret_name, "{ns}/*", "unknown placeholder {ns} in '{ns}/*' (the one placeholder "
                                  "is {namespace})"),
    (parse_secret_identity, "spiffe://td/ns/{NAMESPACE}/sa/*",
     "unknown placeholder {NAMESPACE} in 'spiffe://td/ns/{NAMESPACE}/sa/*' (the one "
     "placeholder is {namespace})"),
    (parse_secret_identity, "", "an empty identity matches no client"),
])
def test_a_bad_secret_pattern_is_refused_with_a_reason(parse: Any, raw: object,
                                                       problem: str) -> None:
    with pytest.raises(ValueError) as info:
        parse(raw)
    assert str(info.value) == problem


@pytest.mark.parametrize(("identities", "names", "problem"), [
    ([], ["a"], "a rule without identities grants nothing: list the identities that may "
                "read these Secrets"),
    (["x"], [], "a rule without names grants nothing: list the Secret names (or "
                "{prefix: ...}) these identities may read"),
    (["spiffe://td/ns/{namespace}/sa/*", "spiffe://td/ns/ops/sa/*"], ["{namespace}/*"],
     "names use {namespace}, which identity 'spiffe://td/ns/ops/sa/*' does not capture (write "
     "{namespace} where its namespace is, as in spiffe://cluster.local/ns/{namespace}/sa/*)"),
])
def test_an_incoherent_secret_rule_is_refused(identities: list[str], names: list[str],
                                              problem: str) -> None:
    with pytest.raises(ValueError) as info:
        SecretRule([parse_secret_identity(i) for i in identities],
                   [parse_secret_name(n) for n in names])
    assert str(info.value) == problem
