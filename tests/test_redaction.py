"""relay.redaction: every ``(udpa.annotations.sensitive)`` field shown as
``[redacted]``, wherever it sits, in a copy; what clients get is never touched."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.config.trace.v3 import skywalking_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from google.protobuf import any_pb2, json_format, struct_pb2
from google.protobuf.message import Message
from udpa.type.v1 import typed_struct_pb2 as udpa_typed_struct_pb2
from xds.type.v3 import typed_struct_pb2 as xds_typed_struct_pb2

from relay.redaction import REDACTED, redacted

KEY_PEM = "-----BEGIN PRIVATE KEY-----\nTOPSECRETKEYMATERIAL\n-----END PRIVATE KEY-----\n"
CERT_PEM = "-----BEGIN CERTIFICATE-----\nPUBLICCERTIFICATE\n-----END CERTIFICATE-----\n"
SECRET_MARKERS = (b"TOPSECRET", b"hunter2", b"ticketkey", b"apikey", b"s3cr3t")


def pack(message: Message) -> any_pb2.Any:
    holder = any_pb2.Any()
    holder.Pack(message)
    return holder


def shown(body: any_pb2.Any) -> tuple[any_pb2.Any, bytes]:
    """``redacted(body)``, after checking it left ``body`` as it was."""
    before = body.SerializeToString(deterministic=True)
    out = redacted(body)
    assert body.SerializeToString(deterministic=True) == before
    return out, before


def assert_no_secret_in(out: any_pb2.Any) -> None:
    serialized = out.SerializeToString()
    for marker in SECRET_MARKERS:
        assert marker not in serialized


def inline_key_certificate() -> common_pb2.TlsCertificate:
    certificate = common_pb2.TlsCertificate()
    certificate.certificate_chain.inline_string = CERT_PEM
    certificate.private_key.inline_string = KEY_PEM
    return certificate


# --------------------------------------------------------------------------- Secret


def test_an_inline_string_private_key_is_redacted() -> None:
    secret = secret_pb2.Secret(name="server-cert", tls_certificate=inline_key_certificate())
    body = pack(secret)
    out, before = shown(body)
    assert out is not body
    assert out.type_url == body.type_url
    result = secret_pb2.Secret.FromString(out.value)
    assert result.name == "server-cert"
    assert result.tls_certificate.private_key.inline_string == REDACTED
    assert result.tls_certificate.certificate_chain.inline_string == CERT_PEM
    assert b"TOPSECRETKEYMATERIAL" in before
    assert_no_secret_in(out)


def test_an_inline_bytes_private_key_is_redacted() -> None:
    secret = secret_pb2.Secret(name="s")
    secret.tls_certificate.private_key.inline_bytes = KEY_PEM.encode()
    out, _ = shown(pack(secret))
    result = secret_pb2.Secret.FromString(out.value)
    assert result.tls_certificate.private_key.inline_bytes == REDACTED.encode()
    assert result.tls_certificate.private_key.WhichOneof("specifier") == "inline_bytes"
    assert_no_secret_in(out)


def test_a_private_key_file_name_is_redacted_too() -> None:
    # As Envoy's admin: nothing of a sensitive field stays readable.
    secret = secret_pb2.Secret(name="s")
    secret.tls_certificate.private_key.filename = "/etc/certs/TOPSECRET.key"
    secret.tls_certificate.certificate_chain.filename = "/etc/certs/cert.pem"
    out, _ = shown(pack(secret))
    result = secret_pb2.Secret.FromString(out.value)
    assert result.tls_certificate.private_key.filename == REDACTED
    assert result.tls_certificate.certificate_chain.filename == "/etc/certs/cert.pem"
    assert_no_secret_in(out)


def test_a_key_password_and_pkcs12_are_redacted() -> None:
    secret = secret_pb2.Secret(name="s")
    secret.tls_certificate.password.inline_string = "hunter2"
    secret.tls_certificate.pkcs12.inline_bytes = b"TOPSECRET-p12"
    out, _ = shown(pack(secret))
    result = secret_pb2.Secret.FromString(out.value)
    assert result.tls_certificate.password.inline_string == REDACTED
    assert result.tls_certificate.pkcs12.inline_bytes == REDACTED.encode()
    assert_no_secret_in(out)


def test_a_generic_secret_is_redacted() -> None:
    secret = secret_pb2.Secret(name="hmac")
    secret.generic_secret.secret.inline_bytes = b"s3cr3t-hmac"
    out, _ = shown(pack(secret))
    result = secret_pb2.Secret.FromString(out.value)
    assert result.generic_secret.secret.inline_bytes == REDACTED.encode()
    assert_no_secret_in(out)


def test_every_session_ticket_key_is_redacted() -> None:
    secret = secret_pb2.Secret(name="tickets")
    for n in range(3):
        secret.session_ticket_keys.keys.add().inline_bytes = b"ticketkey-%d" % n
    out, _ = shown(pack(secret))
    result = secret_pb2.Secret.FromString(out.value)
    assert [key.inline_bytes for key in result.session_ticket_keys.keys] == \
        [REDACTED.encode()] * 3
    assert_no_secret_in(out)


def test_every_entry_of_a_generic_secrets_map_is_redacted() -> None:
    secret = secret_pb2.Secret(name="credentials")
    secret.generic_secret.secrets["client_id"].inline_string = "apikey-id"
    secret.generic_secret.secrets["client_secret"].inline_bytes = b"s3cr3t"
    out, _ = shown(pack(secret))
    result = secret_pb2.Secret.FromString(out.value)
    assert set(result.generic_secret.secrets) == {"client_id", "client_secret"}
    assert result.generic_secret.secrets["client_id"].inline_string == REDACTED
    assert result.generic_secret.secrets["client_secret"].inline_bytes == REDACTED.encode()
    assert_no_secret_in(out)


def test_a_validation_context_secret_is_returned_itself() -> None:
    secret = secret_pb2.Secret(name="ca")
    secret.validation_context.trusted_ca.inline_string = CERT_PEM
    secret.validation_context.match_typed_subject_alt_names.add().matcher.exact = "relay.test"
    body = pack(secret)
    assert redacted(body) is body


def test_a_certificate_without_a_key_is_returned_itself() -> None:
    secret = secret_pb2.Secret(name="s")
    secret.tls_certificate.certificate_chain.inline_string = CERT_PEM
    body = pack(secret)
    assert redacted(body) is body


def test_a_sensitive_any_stays_decodable() -> None:
    secret = secret_pb2.Secret(name="hsm")
    provider = secret.tls_certificate.private_key_provider
    provider.provider_name = "pkcs11"
    provider.typed_config.Pack(struct_pb2.Struct(fields={
        "pin": struct_pb2.Value(string_value="hunter2")}))
    out, _ = shown(pack(secret))
    assert_no_secret_in(out)
    result = secret_pb2.Secret.FromString(out.value)
    assert result.tls_certificate.private_key_provider.provider_name == "pkcs11"
    json_format.MessageToDict(result)  # what /config_dump does with it


# --------------------------------------------------------------------------- inside Any fields


def test_a_listeners_inline_downstream_tls_key_is_redacted() -> None:
    context = tls_pb2.DownstreamTlsContext()
    context.require_client_certificate.value = True
    context.common_tls_context.tls_certificates.append(inline_key_certificate())
    listener = listener_pb2.Listener(name="ingress")
    chain = listener.filter_chains.add()
    chain.transport_socket.name = "envoy.transport_sockets.tls"
    chain.transport_socket.typed_config.Pack(context)
    body = pack(listener)
    out, before = shown(body)
    assert b"TOPSECRETKEYMATERIAL" in before
    assert_no_secret_in(out)
    result = listener_pb2.Listener.FromString(out.value)
    socket = result.filter_chains[0].transport_socket
    assert socket.name == "envoy.transport_sockets.tls"
    assert socket.typed_config.type_url == chain.transport_socket.typed_config.type_url
    inner = tls_pb2.DownstreamTlsContext()
    assert socket.typed_config.Unpack(inner)
    assert inner.require_client_certificate.value is True
    certificate = inner.common_tls_context.tls_certificates[0]
    assert certificate.private_key.inline_string == REDACTED
    assert certificate.certificate_chain.inline_string == CERT_PEM


def test_a_clusters_inline_upstream_tls_key_is_redacted() -> None:
    context = tls_pb2.UpstreamTlsContext(sni="backend.internal")
    context.common_tls_context.tls_certificates.append(inline_key_certificate())
    cluster = cluster_pb2.Cluster(name="backend")
    cluster.transport_socket.name = "envoy.transport_sockets.tls"
    cluster.transport_socket.typed_config.Pack(context)
    out, _ = shown(pack(cluster))
    assert_no_secret_in(out)
    result = cluster_pb2.Cluster.FromString(out.value)
    inner = tls_pb2.UpstreamTlsContext()
    assert result.transport_socket.typed_config.Unpack(inner)
    assert inner.sni == "backend.internal"
    assert inner.common_tls_context.tls_certificates[0].private_key.inline_string == REDACTED
    assert inner.common_tls_context.tls_certificates[0].certificate_chain.inline_string == \
        CERT_PEM


def test_a_secret_two_anys_deep_is_redacted() -> None:
    # Listener -> HttpConnectionManager (Any) -> tracing provider (Any) -> a token string.
    skywalking = skywalking_pb2.SkyWalkingConfig()
    skywalking.client_config.backend_token = "s3cr3t-token"
    skywalking.client_config.service_name = "frontend"
    manager = http_connection_manager_pb2.HttpConnectionManager(stat_prefix="ingress")
    manager.tracing.provider.name = "envoy.tracers.skywalking"
    manager.tracing.provider.typed_config.Pack(skywalking)
    listener = listener_pb2.Listener(name="ingress")
    hcm = listener.filter_chains.add().filters.add()
    hcm.name = "envoy.filters.network.http_connection_manager"
    hcm.typed_config.Pack(manager)
    out, _ = shown(pack(listener))
    assert_no_secret_in(out)
    result = listener_pb2.Listener.FromString(out.value)
    manager_out = http_connection_manager_pb2.HttpConnectionManager()
    assert result.filter_chains[0].filters[0].typed_config.Unpack(manager_out)
    skywalking_out = skywalking_pb2.SkyWalkingConfig()
    assert manager_out.tracing.provider.typed_config.Unpack(skywalking_out)
    assert skywalking_out.client_config.backend_token == REDACTED
    assert skywalking_out.client_config.service_name == "frontend"


def test_every_value_of_a_sensitive_string_map_is_redacted() -> None:
    # ext_authz's per-route context_extensions: a map<string, string> marked sensitive.
    per_route = ext_authz_pb2.ExtAuthzPerRoute()
    per_route.check_settings.context_extensions["api_key"] = "apikey-123"
    per_route.check_settings.context_extensions["tenant"] = "s3cr3t-tenant"
    routes = route_pb2.RouteConfiguration(name="local")
    host = routes.virtual_hosts.add(name="all", domains=["*"])
    host.typed_per_filter_config["envoy.filters.http.ext_authz"].Pack(per_route)
    out, _ = shown(pack(routes))
    assert_no_secret_in(out)
    result = route_pb2.RouteConfiguration.FromString(out.value)
    per_route_out = ext_authz_pb2.ExtAuthzPerRoute()
    assert result.virtual_hosts[0].typed_per_filter_config[
        "envoy.filters.http.ext_authz"].Unpack(per_route_out)
    assert dict(per_route_out.check_settings.context_extensions) == {
        "api_key": REDACTED, "tenant": REDACTED}
    assert result.virtual_hosts[0].domains == ["*"]


# --------------------------------------------------------------------------- inside TypedStruct
#
# A TypedStruct holds a message as JSON: the key is found by the named type's
# fields, and shown as it would be had the message been packed in an Any (a
# bytes marker in base64, as JSON shows bytes); nothing else of the JSON changes.

TYPED_STRUCTS = pytest.mark.parametrize(
    "typed_struct_class", [xds_typed_struct_pb2.TypedStruct, udpa_typed_struct_pb2.TypedStruct],
    ids=["xds.type.v3", "udpa.type.v1"])
REDACTED_BASE64 = base64.b64encode(REDACTED.encode()).decode()


def typed_struct(typed_struct_class: type[Message], type_name: str,
                 value: dict[str, Any]) -> Any:
    typed: Any = typed_struct_class()
    typed.type_url = f"type.googleapis.com/{type_name}"
    typed.value.update(value)
    return typed


def listener_with_socket(typed_config: Message) -> listener_pb2.Listener:
    """A Listener whose one filter chain's TLS transport socket packs ``typed_config``."""
    listener = listener_pb2.Listener(name="ingress")
    listener.address.socket_address.port_value = 8443
    chain = listener.filter_chains.add()
    chain.transport_socket.name = "envoy.transport_sockets.tls"
    chain.transport_socket.typed_config.Pack(typed_config)
    return listener


def shown_socket_config(out: any_pb2.Any, typed_struct_class: type[Message]) -> Any:
    """The TypedStruct a redacted ``listener_with_socket`` packs, checking the rest."""
    result = listener_pb2.Listener.FromString(out.value)
    assert result.address.socket_address.port_value == 8443
    socket = result.filter_chains[0].transport_socket
    assert socket.name == "envoy.transport_sockets.tls"
    typed: Any = typed_struct_class()
    assert socket.typed_config.Unpack(typed)
    return typed


def tls_context_json(private_key: dict[str, str]) -> dict[str, Any]:
    return {"requireClientCertificate": True,
            "commonTlsContext": {
                "alpnProtocols": ["h2", "http/1.1"],
                "tlsCertificates": [{"certificateChain": {"inlineString": CERT_PEM},
                                     "privateKey": private_key}]}}


@TYPED_STRUCTS
def test_an_inline_string_key_in_a_typed_struct_is_redacted(
        typed_struct_class: type[Message]) -> None:
    json = tls_context_json({"inlineString": KEY_PEM})
    listener = listener_with_socket(typed_struct(
        typed_struct_class, "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        json))
    out, before = shown(pack(listener))
    assert b"TOPSECRETKEYMATERIAL" in before
    assert_no_secret_in(out)
    typed = shown_socket_config(out, typed_struct_class)
    assert typed.type_url == \
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
    expected = copy.deepcopy(json)
    expected["commonTlsContext"]["tlsCertificates"][0]["privateKey"] = {"inlineString": REDACTED}
    assert json_format.MessageToDict(typed.value) == expected
    context = json_format.ParseDict(json_format.MessageToDict(typed.value),
                                    tls_pb2.DownstreamTlsContext())
    assert context.common_tls_context.tls_certificates[0].private_key.inline_string == REDACTED


@TYPED_STRUCTS
def test_an_inline_bytes_key_in_a_typed_struct_is_redacted_as_json_shows_bytes(
        typed_struct_class: type[Message]) -> None:
    json = tls_context_json({"inlineBytes": base64.b64encode(KEY_PEM.encode()).decode()})
    listener = listener_with_socket(typed_struct(
        typed_struct_class, "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        json))
    out, before = shown(pack(listener))
    assert base64.b64encode(KEY_PEM.encode()) in before
    assert base64.b64encode(KEY_PEM.encode()) not in out.SerializeToString()
    typed = shown_socket_config(out, typed_struct_class)
    context = json_format.ParseDict(json_format.MessageToDict(typed.value),
                                    tls_pb2.DownstreamTlsContext())
    certificate = context.common_tls_context.tls_certificates[0]
    assert certificate.private_key.inline_bytes == REDACTED.encode()
    assert certificate.certificate_chain.inline_string == CERT_PEM
    assert context.require_client_certificate.value is True
    assert list(context.common_tls_context.alpn_protocols) == ["h2", "http/1.1"]


def test_proto_field_names_in_a_typed_struct_are_read_too() -> None:
    # A JSON parser takes "private_key" as well as "privateKey", and so does Envoy.
    json = {"common_tls_context": {"tls_certificates": [
        {"private_key": {"inline_string": KEY_PEM}, "password": {"inline_string": "hunter2"},
         "certificate_chain": {"inline_string": CERT_PEM}}]}}
    listener = listener_with_socket(typed_struct(
        xds_typed_struct_pb2.TypedStruct,
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext", json))
    out, _ = shown(pack(listener))
    assert_no_secret_in(out)
    typed = shown_socket_config(out, xds_typed_struct_pb2.TypedStruct)
    assert json_format.MessageToDict(typed.value) == {"common_tls_context": {"tls_certificates": [
        {"private_key": {"inline_string": REDACTED}, "password": {"inline_string": REDACTED},
         "certificate_chain": {"inline_string": CERT_PEM}}]}}


def test_repeated_and_map_secrets_in_a_typed_struct_are_redacted() -> None:
    ticket_keys = [base64.b64encode(b"ticketkey-%d" % n).decode() for n in range(2)]
    json = {"sessionTicketKeys": {"keys": [{"inlineBytes": key} for key in ticket_keys]}}
    listener = listener_with_socket(typed_struct(
        udpa_typed_struct_pb2.TypedStruct,
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext", json))
    routes = route_pb2.RouteConfiguration(name="local")
    routes.virtual_hosts.add(name="all", domains=["*"]).typed_per_filter_config[
        "envoy.filters.http.ext_authz"].Pack(typed_struct(
            xds_typed_struct_pb2.TypedStruct,
            "envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute",
            {"checkSettings": {"contextExtensions": {"api_key": "apikey-123"}}}))
    out, _ = shown(pack(listener))
    assert json_format.MessageToDict(
        shown_socket_config(out, udpa_typed_struct_pb2.TypedStruct).value) == {
        "sessionTicketKeys": {"keys": [{"inlineBytes": REDACTED_BASE64}] * 2}}
    out, _ = shown(pack(routes))
    assert_no_secret_in(out)
    per_route: Any = xds_typed_struct_pb2.TypedStruct()
    assert route_pb2.RouteConfiguration.FromString(out.value).virtual_hosts[0]\
        .typed_per_filter_config["envoy.filters.http.ext_authz"].Unpack(per_route)
    assert json_format.MessageToDict(per_route.value) == {
        "checkSettings": {"contextExtensions": {"api_key": REDACTED}}}


def test_typed_struct_any_typed_struct_nesting_is_walked() -> None:
    # Listener -> filter (Any: TypedStruct of an HttpConnectionManager) -> its tracing
    # provider (an Any in JSON, holding a TypedStruct of SkyWalking) -> the token; and a
    # second provider-like Any in JSON packing SkyWalking itself (an access log's).
    skywalking_json = {"clientConfig": {"backendToken": "s3cr3t-token",
                                        "serviceName": "frontend"}}
    manager_json: dict[str, Any] = {
        "statPrefix": "ingress",
        "tracing": {"provider": {"name": "envoy.tracers.skywalking", "typedConfig": {
            "@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
            "typeUrl": "type.googleapis.com/envoy.config.trace.v3.SkyWalkingConfig",
            "value": skywalking_json}}},
        "accessLog": [{"name": "log", "typedConfig": {
            "@type": "type.googleapis.com/envoy.config.trace.v3.SkyWalkingConfig",
            **skywalking_json}}]}
    listener = listener_pb2.Listener(name="ingress")
    hcm = listener.filter_chains.add().filters.add(
        name="envoy.filters.network.http_connection_manager")
    hcm.typed_config.Pack(typed_struct(
        xds_typed_struct_pb2.TypedStruct,
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        manager_json))
    out, before = shown(pack(listener))
    assert b"s3cr3t-token" in before
    assert_no_secret_in(out)
    typed: Any = xds_typed_struct_pb2.TypedStruct()
    assert listener_pb2.Listener.FromString(out.value).filter_chains[0].filters[0]\
        .typed_config.Unpack(typed)
    expected = copy.deepcopy(manager_json)
    expected["tracing"]["provider"]["typedConfig"]["value"]["clientConfig"][
        "backendToken"] = REDACTED
    expected["accessLog"][0]["typedConfig"]["clientConfig"]["backendToken"] = REDACTED
    assert json_format.MessageToDict(typed.value) == expected


def test_a_typed_struct_under_a_sensitive_field_is_blanked_keeping_its_type() -> None:
    secret = secret_pb2.Secret(name="hsm")
    provider = secret.tls_certificate.private_key_provider
    provider.provider_name = "custom"
    provider.typed_config.Pack(typed_struct(
        xds_typed_struct_pb2.TypedStruct, "envoy.config.core.v3.Node",
        {"id": "hunter2", "metadata": {"pin": "s3cr3t"}}))
    out, _ = shown(pack(secret))
    assert_no_secret_in(out)
    typed: Any = xds_typed_struct_pb2.TypedStruct()
    result = secret_pb2.Secret.FromString(out.value)
    assert result.tls_certificate.private_key_provider.typed_config.Unpack(typed)
    assert typed.type_url == "type.googleapis.com/envoy.config.core.v3.Node"
    assert json_format.MessageToDict(typed.value) == {
        "id": REDACTED, "metadata": {"pin": REDACTED}}


@TYPED_STRUCTS
def test_a_typed_struct_of_an_unknown_type_is_shown_without_its_json(
        typed_struct_class: type[Message]) -> None:
    # Envoy shows it as it is; the relay, as for an unknown Any, fails closed.
    listener = listener_with_socket(typed_struct(
        typed_struct_class, "example.CustomTls", {"key": "TOPSECRET", "port": 1}))
    out, _ = shown(pack(listener))
    assert_no_secret_in(out)
    typed = shown_socket_config(out, typed_struct_class)
    assert typed == typed_struct(typed_struct_class, "example.CustomTls", {})
    assert not typed.HasField("value")


def test_an_unknown_any_in_a_typed_structs_json_keeps_only_its_type() -> None:
    manager_json = {"statPrefix": "ingress", "httpFilters": [
        {"name": "custom", "typedConfig": {"@type": "type.googleapis.com/example.Custom",
                                           "apiKey": "apikey-1"}}]}
    listener = listener_pb2.Listener(name="ingress")
    listener.filter_chains.add().filters.add(name="hcm").typed_config.Pack(typed_struct(
        xds_typed_struct_pb2.TypedStruct,
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        manager_json))
    out, _ = shown(pack(listener))
    assert_no_secret_in(out)
    typed: Any = xds_typed_struct_pb2.TypedStruct()
    assert listener_pb2.Listener.FromString(out.value).filter_chains[0].filters[0]\
        .typed_config.Unpack(typed)
    assert json_format.MessageToDict(typed.value) == {"statPrefix": "ingress", "httpFilters": [
        {"name": "custom", "typedConfig": {"@type": "type.googleapis.com/example.Custom"}}]}


def test_json_that_does_not_parse_as_its_type_is_still_redacted() -> None:
    """Envoy shows a TypedStruct whose JSON does not parse as it is; here keys the
    type lacks are scrubbed, values of the wrong kind too, and the rest walked."""
    json = {"requireClientCertificate": True,
            "futureField": {"token": "s3cr3t-future", "count": 3, "on": True},
            "commonTlsContext": {"tlsCertificates": [
                {"privateKey": "TOPSECRET-as-a-string",
                 "certificateChain": {"inlineString": CERT_PEM}},
                {"privateKey": {"inlineString": KEY_PEM}}]}}
    type_name = "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
    with pytest.raises(json_format.ParseError):
        json_format.ParseDict(json, tls_pb2.DownstreamTlsContext())
    listener = listener_with_socket(typed_struct(
        xds_typed_struct_pb2.TypedStruct, type_name, json))
    out, _ = shown(pack(listener))
    assert_no_secret_in(out)
    typed = shown_socket_config(out, xds_typed_struct_pb2.TypedStruct)
    assert json_format.MessageToDict(typed.value) == {
        "requireClientCertificate": True,
        "futureField": {"token": REDACTED, "count": None, "on": None},
        "commonTlsContext": {"tlsCertificates": [
            {"privateKey": REDACTED, "certificateChain": {"inlineString": CERT_PEM}},
            {"privateKey": {"inlineString": REDACTED}}]}}


def test_a_typed_struct_without_secrets_is_returned_itself() -> None:
    listener = listener_pb2.Listener(name="plain")
    listener.filter_chains.add().filters.add(name="hcm").typed_config.Pack(typed_struct(
        udpa_typed_struct_pb2.TypedStruct,
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        {"statPrefix": "plain", "routeConfig": {"name": "local"}}))
    listener.filter_chains[0].transport_socket.typed_config.Pack(typed_struct(
        xds_typed_struct_pb2.TypedStruct,
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        tls_context_json({"filename": "/etc/certs/key.pem"})
        | {"commonTlsContext": {"alpnProtocols": ["h2"]}}))
    body = pack(listener)
    assert redacted(body) is body


def test_redacting_a_typed_struct_twice_gives_the_same_bytes() -> None:
    listener = listener_with_socket(typed_struct(
        xds_typed_struct_pb2.TypedStruct,
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        tls_context_json({"inlineString": KEY_PEM})))
    once = redacted(pack(listener))
    assert redacted(once).value == once.value


# --------------------------------------------------------------------------- left alone


def test_a_listener_without_secrets_is_returned_itself() -> None:
    listener = listener_pb2.Listener(name="plain")
    listener.address.socket_address.address = "0.0.0.0"
    listener.address.socket_address.port_value = 8080
    manager = http_connection_manager_pb2.HttpConnectionManager(stat_prefix="plain")
    listener.filter_chains.add().filters.add().typed_config.Pack(manager)
    body = pack(listener)
    assert redacted(body) is body


def test_a_resource_of_an_unknown_type_is_shown_empty() -> None:
    """What cannot be read cannot be checked for secrets: fail closed."""
    body = any_pb2.Any(type_url="type.googleapis.com/unknown.Type",
                       value=b"\n\x0bTOPSECRETxx")
    out, _ = shown(body)
    assert out == any_pb2.Any(type_url="type.googleapis.com/unknown.Type")


def test_an_unknown_type_packed_inside_a_known_one_is_emptied() -> None:
    cluster = cluster_pb2.Cluster(name="c")
    cluster.transport_socket.name = "custom"
    cluster.transport_socket.typed_config.type_url = "type.googleapis.com/unknown.Type"
    cluster.transport_socket.typed_config.value = b"opaque"
    out = cluster_pb2.Cluster()
    redacted(pack(cluster)).Unpack(out)
    assert out.transport_socket.name == "custom"
    assert out.transport_socket.typed_config == any_pb2.Any(
        type_url="type.googleapis.com/unknown.Type")


def test_a_type_that_cannot_hold_secrets_is_returned_itself() -> None:
    body = pack(base_pb2.Node(id="node-1"))
    assert redacted(body) is body


def test_redacting_twice_gives_the_same_bytes() -> None:
    secret = secret_pb2.Secret(name="s", tls_certificate=inline_key_certificate())
    once = redacted(pack(secret))
    twice = redacted(once)
    assert twice.value == once.value


_FRESH_PROCESS = """
import sys
from google.protobuf import any_pb2
from relay.redaction import redacted
body = any_pb2.Any.FromString(sys.stdin.buffer.read())
sys.stdout.buffer.write(redacted(body).SerializeToString())
"""


def test_types_nothing_imported_are_found_and_unknown_ones_shown_empty() -> None:
    """In a process that imported none of the extension types a Listener packs
    (as the relay: it never needs them), the TLS context's key is still
    redacted, packed in an Any or in a TypedStruct; a type no installed module
    has is emptied, not shown."""
    import subprocess
    import sys

    from envoy.config.listener.v3 import listener_pb2
    from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2

    context = tls_pb2.DownstreamTlsContext(common_tls_context=tls_pb2.CommonTlsContext(
        tls_certificates=[common_pb2.TlsCertificate(
            private_key={"inline_bytes": b"FRESH-PROCESS-KEY"})]))
    listener = listener_pb2.Listener(name="l")
    chain = listener.filter_chains.add()
    chain.transport_socket.typed_config.Pack(context)
    custom = chain.filters.add(name="custom")
    custom.typed_config.type_url = "type.googleapis.com/example.Custom"
    custom.typed_config.value = b"\x0a\x0dCUSTOM-SECRET"
    as_json = listener.filter_chains.add().transport_socket.typed_config
    as_json.Pack(typed_struct(
        udpa_typed_struct_pb2.TypedStruct,
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        tls_context_json({"inlineString": "FRESH-PROCESS-JSON-KEY"})))
    body = any_pb2.Any()
    body.Pack(listener)
    out = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], input=body.SerializeToString(),
                         capture_output=True, check=True).stdout
    assert b"FRESH-PROCESS-KEY" not in out and b"CUSTOM-SECRET" not in out
    assert b"FRESH-PROCESS-JSON-KEY" not in out
    shown = listener_pb2.Listener()
    any_pb2.Any.FromString(out).Unpack(shown)
    held = tls_pb2.DownstreamTlsContext()
    shown.filter_chains[0].transport_socket.typed_config.Unpack(held)
    assert held.common_tls_context.tls_certificates[0].private_key.inline_bytes == b"[redacted]"
    assert shown.filter_chains[0].filters[0].typed_config == any_pb2.Any(
        type_url="type.googleapis.com/example.Custom")
    json_held: Any = udpa_typed_struct_pb2.TypedStruct()
    shown.filter_chains[1].transport_socket.typed_config.Unpack(json_held)
    assert json_format.MessageToDict(json_held.value)["commonTlsContext"]["tlsCertificates"][0][
        "privateKey"] == {"inlineString": "[redacted]"}
