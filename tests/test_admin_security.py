"""The admin server over real HTTP(S): TLS and its rotation, the bearer token,
HTTP errors, secrets left out of /config_dump, and the warning when exposed."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import json_format, message, struct_pb2
from udpa.type.v1 import typed_struct_pb2 as udpa_typed_struct_pb2
from xds.type.v3 import typed_struct_pb2 as xds_typed_struct_pb2

from relay.admin import AdminServer
from relay.cache import ResourceCache, Update
from relay.config import AdminConfig
from relay.resource import CachedResource
from relay.telemetry import prometheus_provider
from relay.xds_types import CLUSTER, LISTENER, SECRET
from tests.builders import cluster, pack, type_url_of

TOKEN = "first-token"


def cached(*messages: tuple[message.Message, str]) -> ResourceCache:
    """A cache holding ``messages`` (each with its name), every type synced."""
    cache = ResourceCache()
    by_type: dict[str, list[CachedResource]] = {}
    for msg, name in messages:
        type_url = type_url_of(msg)
        by_type.setdefault(type_url, []).append(CachedResource(
            type_url, name, "v1", discovery_pb2.Resource(name=name, version="v1",
                                                         resource=pack(msg))))
    for type_url, resources in by_type.items():
        cache.apply(type_url, Update(resources))
    return cache


def admin_server(cache: ResourceCache | None = None) -> AdminServer:
    _, registry = prometheus_provider()
    return AdminServer(cache if cache is not None else cached((cluster("a"), "a")), registry,
                       lambda: None)


@asynccontextmanager
async def serving(config: AdminConfig, server: AdminServer | None = None
                  ) -> AsyncIterator[int]:
    """The port of an admin server started with ``config``, stopped on leaving."""
    server = server if server is not None else admin_server()
    port = await server.start(config)
    try:
        yield port
    finally:
        await server.stop()


async def get(url: str, headers: dict[str, str] | None = None, method: str = "GET",
              tls: ssl.SSLContext | None = None) -> tuple[int, Any, bytes]:
    """Status, headers and raw body of one request, on a connection of its own."""
    async with aiohttp.ClientSession() as session, session.request(
            method, url, headers=headers, ssl=tls if tls is not None else True) as reply:
        return reply.status, reply.headers, await reply.read()


def replace(path: Path, data: bytes) -> None:
    """Rotate ``path`` as rotating tools do: a new file renamed over the old one."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_bytes(data)
    os.replace(fresh, path)


class KeyPairFiles:
    """A certificate and key on disk, as the admin server reads them."""

    def __init__(self, directory: Path, leaf: trustme.LeafCert) -> None:
        self.cert = directory / "tls.crt"
        self.key = directory / "tls.key"
        self.write(leaf)

    def write(self, leaf: trustme.LeafCert, cert: bool = True, key: bool = True) -> None:
        if cert:
            replace(self.cert, b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        if key:
            replace(self.key, leaf.private_key_pem.bytes())

    def config(self, **more: Any) -> AdminConfig:
        return AdminConfig(address="127.0.0.1:0",
                           tls={"cert_file": self.cert, "key_file": self.key}, **more)


def trusting(*cas: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    for ca in cas:
        ca.configure_trust(context)
    return context


def der(leaf: trustme.LeafCert) -> bytes:
    return ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())


async def served_certificate(port: int, tls: ssl.SSLContext) -> bytes:
    """The certificate a new connection is shown (DER), checked by ``tls``; the
    connection also gets an answer (the server is serving, not only handshaking)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        peer = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok\n")
        return bytes(peer)
    finally:
        writer.close()


# --- TLS ---------------------------------------------------------------------------------


async def test_https_is_served_with_the_configured_certificate(tmp_path: Path) -> None:
    ca = trustme.CA()
    files = KeyPairFiles(tmp_path, ca.issue_cert("127.0.0.1", "localhost"))
    async with serving(files.config()) as port:
        status, _, body = await get(f"https://127.0.0.1:{port}/ready", tls=trusting(ca))
        assert (status, body) == (200, b"ready\n")
        status, _, body = await get(f"https://localhost:{port}/healthz", tls=trusting(ca))
        assert (status, body) == (200, b"ok\n")


async def test_https_is_refused_by_a_client_that_does_not_trust_the_ca(tmp_path: Path) -> None:
    files = KeyPairFiles(tmp_path, trustme.CA().issue_cert("127.0.0.1"))
    async with serving(files.config()) as port:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await get(f"https://127.0.0.1:{port}/ready", tls=trusting(trustme.CA()))


async def test_rotated_files_are_served_to_new_connections_without_a_restart(
        tmp_path: Path) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    old, new = old_ca.issue_cert("127.0.0.1"), new_ca.issue_cert("127.0.0.1")
    files = KeyPairFiles(tmp_path, old)
    either = trusting(old_ca, new_ca)
    async with serving(files.config()) as port:
        assert await served_certificate(port, either) == der(old)
        # a connection made before the rotation goes on as it was
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=either)
        files.write(new)
        assert await served_certificate(port, either) == der(new)
        assert await served_certificate(port, trusting(new_ca)) == der(new)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await reader.read()).endswith(b"\r\n\r\nok\n")
        assert writer.get_extra_info("ssl_object").getpeercert(binary_form=True) == der(old)
        writer.close()


async def test_a_half_rotated_pair_keeps_the_old_certificate_and_warns_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    old, new = old_ca.issue_cert("127.0.0.1"), new_ca.issue_cert("127.0.0.1")
    files = KeyPairFiles(tmp_path, old)
    either = trusting(old_ca, new_ca)
    async with serving(files.config()) as port:
        files.write(new, key=False)  # the new certificate, the old key
        with caplog.at_level(logging.WARNING):
            assert await served_certificate(port, either) == der(old)
            assert await served_certificate(port, either) == der(old)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "not usable yet" in warnings[0].getMessage()
        files.write(new, cert=False)  # the key catches up
        assert await served_certificate(port, either) == der(new)


# --- the bearer token --------------------------------------------------------------------


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text(TOKEN + "\n")
    return path


def token_config(tmp_path: Path) -> AdminConfig:
    return AdminConfig(address="127.0.0.1:0", token_file=token_file(tmp_path))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_without_a_token_a_protected_path_is_401_asking_for_one(tmp_path: Path) -> None:
    async with serving(token_config(tmp_path)) as port:
        status, headers, body = await get(f"http://127.0.0.1:{port}/config_dump")
    assert (status, headers["WWW-Authenticate"]) == (401, "Bearer")
    assert body == (b"this path needs a token: send Authorization: Bearer <token> "
                    b"(the token of admin.token_file)\n")


async def test_a_wrong_token_is_401(tmp_path: Path) -> None:
    async with serving(token_config(tmp_path)) as port:
        for path in ("/config_dump", "/clients", "/metrics", "/nope"):
            status, headers, body = await get(f"http://127.0.0.1:{port}{path}",
                                              bearer("second-token"))
            assert status == 401, path
            assert headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
            assert body.startswith(b"wrong token") and TOKEN.encode() not in body


async def test_the_token_opens_every_path(tmp_path: Path) -> None:
    async with serving(token_config(tmp_path)) as port:
        for path in ("/config_dump", "/clients", "/metrics", "/healthz", "/ready"):
            status, _, _ = await get(f"http://127.0.0.1:{port}{path}", bearer(TOKEN))
            assert status == 200, path


async def test_probes_need_no_token(tmp_path: Path) -> None:
    async with serving(token_config(tmp_path)) as port:
        assert (await get(f"http://127.0.0.1:{port}/healthz"))[::2] == (200, b"ok\n")
        assert (await get(f"http://127.0.0.1:{port}/ready"))[::2] == (200, b"ready\n")


async def test_a_rewritten_token_file_replaces_the_token(tmp_path: Path) -> None:
    path = token_file(tmp_path)
    async with serving(AdminConfig(address="127.0.0.1:0", token_file=path)) as port:
        url = f"http://127.0.0.1:{port}/clients"
        assert (await get(url, bearer(TOKEN)))[0] == 200
        replace(path, b"the-second-token\n")
        assert (await get(url, bearer("the-second-token")))[0] == 200
        assert (await get(url, bearer(TOKEN)))[0] == 401


async def test_an_emptied_token_file_keeps_the_previous_token_and_warns(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = token_file(tmp_path)
    async with serving(AdminConfig(address="127.0.0.1:0", token_file=path)) as port:
        url = f"http://127.0.0.1:{port}/clients"
        replace(path, b"\n")  # half written
        with caplog.at_level(logging.WARNING, logger="relay.admin"):
            assert (await get(url, bearer(TOKEN)))[0] == 200
            assert (await get(url, bearer("")))[0] == 401
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"admin.token_file {path} is empty; the previous admin token stays "
                        f"in force"]
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


async def test_token_and_tls_together(tmp_path: Path) -> None:
    ca = trustme.CA()
    files = KeyPairFiles(tmp_path, ca.issue_cert("127.0.0.1"))
    async with serving(files.config(token_file=token_file(tmp_path))) as port:
        url = f"https://127.0.0.1:{port}/clients"
        assert (await get(url, tls=trusting(ca)))[0] == 401
        assert (await get(url, bearer(TOKEN), tls=trusting(ca)))[:3:2] == (
            200, b'{\n  "clients": []\n}\n')


# --- HTTP errors -------------------------------------------------------------------------


async def test_http_errors_have_exact_statuses_and_bodies() -> None:
    async with serving(AdminConfig(address="127.0.0.1:0")) as port:
        base = f"http://127.0.0.1:{port}"
        status, headers, body = await get(f"{base}/ready", method="POST")
        assert (status, headers["Allow"], body) == (
            405, "GET, HEAD", b"POST is not allowed; use GET or HEAD\n")
        status, headers, body = await get(f"{base}/config_dump", method="DELETE")
        assert (status, headers["Allow"], body) == (
            405, "GET, HEAD", b"DELETE is not allowed; use GET or HEAD\n")
        assert (await get(f"{base}/stats"))[::2] == (
            404, b"not found; the paths are /healthz /ready /clients /origins /config_dump "
                 b"/config /logging /metrics\n")
        status, _, body = await get(f"{base}/config_dump?type=Clusters")
        assert status == 400
        assert body == (b"unknown type 'Clusters'; known types: Cluster, ClusterLoadAssignment, "
                        b"Listener, RouteConfiguration, Runtime, ScopedRouteConfiguration, "
                        b"Secret, VirtualHost (or their type URLs)\n")
        assert (await get(f"{base}/config_dump?nam=a"))[::2] == (
            400, b"unknown parameter 'nam'; /config_dump takes type and name\n")


async def test_head_answers_headers_only() -> None:
    async with serving(AdminConfig(address="127.0.0.1:0")) as port:
        url = f"http://127.0.0.1:{port}/config_dump"
        _, _, got = await get(url)
        status, headers, body = await get(url, method="HEAD")
    assert (status, body) == (200, b"")
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(got)


async def test_malformed_http_is_400_and_no_error_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    async with serving(AdminConfig(address="127.0.0.1:0")) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with caplog.at_level(logging.INFO):
            writer.write(b"GET /ready HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
            answer = await reader.read()
        writer.close()
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
    assert caplog.records == []  # a client can send this at will: DEBUG only


# --- secrets ------------------------------------------------------------------------------


def tls_certificate(leaf: trustme.LeafCert, as_string: bool) -> common_pb2.TlsCertificate:
    key = leaf.private_key_pem.bytes()
    private_key = base_pb2.DataSource(inline_string=key.decode()) if as_string else \
        base_pb2.DataSource(inline_bytes=key)
    return common_pb2.TlsCertificate(
        certificate_chain=base_pb2.DataSource(inline_bytes=leaf.cert_chain_pems[0].bytes()),
        private_key=private_key)


def key_material(leaf: trustme.LeafCert) -> list[bytes]:
    """Pieces of the key as they would appear in JSON: a line of its PEM, and the
    start of the PEM in base64 (how ``bytes`` fields are shown)."""
    pem = leaf.private_key_pem.bytes()
    return [pem.splitlines()[2], base64.b64encode(pem)[:40]]


async def test_secrets_never_appear_in_config_dump() -> None:
    ca = trustme.CA()
    in_bytes, in_string, in_listener = (ca.issue_cert(f"{n}.example") for n in "abc")
    downstream = tls_pb2.DownstreamTlsContext()
    downstream.common_tls_context.tls_certificates.append(tls_certificate(in_listener, True))
    listener = listener_pb2.Listener(name="l")
    socket = listener.filter_chains.add().transport_socket
    socket.name = "envoy.transport_sockets.tls"
    socket.typed_config.Pack(downstream)
    cache = cached(
        (secret_pb2.Secret(name="bytes", tls_certificate=tls_certificate(in_bytes, False)),
         "bytes"),
        (secret_pb2.Secret(name="string", tls_certificate=tls_certificate(in_string, True)),
         "string"),
        (listener, "l"))
    async with serving(AdminConfig(address="127.0.0.1:0"), admin_server(cache)) as port:
        status, _, dump = await get(f"http://127.0.0.1:{port}/config_dump")
        _, _, secrets = await get(f"http://127.0.0.1:{port}/config_dump?type=Secret")
    assert status == 200
    assert b'"name": "bytes"' in dump and b'"name": "string"' in dump and b'"l"' in dump
    for leaf in (in_bytes, in_string, in_listener):
        for piece in key_material(leaf):
            assert piece not in dump and piece not in secrets
    assert b'"inlineString": "[redacted]"' in secrets
    assert base64.b64encode(b"[redacted]") in secrets  # the bytes key, as JSON shows bytes
    assert dump.count(b'"[redacted]"') == 2  # the string key, and the listener's inline one


async def test_clients_show_no_resource_bodies() -> None:
    async with serving(AdminConfig(address="127.0.0.1:0")) as port:
        assert (await get(f"http://127.0.0.1:{port}/clients"))[::2] == (
            200, b'{\n  "clients": []\n}\n')


async def test_a_resource_that_cannot_be_decoded_is_flagged_not_a_500() -> None:
    listener = listener_pb2.Listener(name="l")
    typed = listener.filter_chains.add().filters.add(name="f").typed_config
    typed.type_url = "type.googleapis.com/example.NotImported"
    cache = cached((listener, "l"), (cluster("a"), "a"))
    async with serving(AdminConfig(address="127.0.0.1:0"), admin_server(cache)) as port:
        status, _, dump = await get(f"http://127.0.0.1:{port}/config_dump")
    assert status == 200
    assert b'"undecodable": "Can not find message descriptor by type_url: ' \
           b'type.googleapis.com/example.NotImported"' in dump
    assert CLUSTER.encode() in dump and LISTENER.encode() in dump


# --- exposure warnings --------------------------------------------------------------------


def warnings_at_start(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "relay.admin" and r.levelno == logging.WARNING]


async def test_off_loopback_without_a_token_warns_that_anyone_may_read(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="relay.admin"):
        async with serving(AdminConfig(address="0.0.0.0:0")):
            pass
    [warning] = warnings_at_start(caplog)
    assert "0.0.0.0:0 is not on loopback and has no token" in warning
    assert "/config_dump and /clients are open to anyone" in warning
    assert "admin.token_file" in warning and "admin.tls" in warning


async def test_off_loopback_a_token_without_tls_warns_of_clear_text(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = token_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="relay.admin"):
        async with serving(AdminConfig(address="0.0.0.0:0", token_file=path)):
            pass
    [warning] = warnings_at_start(caplog)
    assert "the token travels in clear text" in warning and TOKEN not in warning


async def test_off_loopback_with_token_and_tls_nothing_is_warned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = KeyPairFiles(tmp_path, trustme.CA().issue_cert("127.0.0.1"))
    path = token_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="relay.admin"):
        async with serving(AdminConfig(address="0.0.0.0:0", token_file=path,
                                       tls={"cert_file": files.cert, "key_file": files.key})):
            pass
    assert warnings_at_start(caplog) == []


async def test_on_loopback_nothing_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="relay.admin"):
        async with serving(AdminConfig(address="127.0.0.1:0")):
            pass
    assert warnings_at_start(caplog) == []


async def test_a_port_in_use_is_an_error_naming_the_address() -> None:
    async with serving(AdminConfig(address="127.0.0.1:0")) as port:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port} "
                                          r"\(admin.address\)"):
            await admin_server().start(AdminConfig(address=f"127.0.0.1:{port}"))


async def test_a_secret_with_a_sensitive_any_is_shown_redacted() -> None:
    # the sensitive Any keeps its type (so the dump still renders it), its content blanked
    secret = secret_pb2.Secret(name="hsm")
    provider = secret.tls_certificate.private_key_provider
    provider.provider_name = "pkcs11"
    provider.typed_config.Pack(struct_pb2.Struct(fields={
        "pin": struct_pb2.Value(string_value="hunter2")}))
    cache = cached((secret, "hsm"), (cluster("a"), "a"))
    async with serving(AdminConfig(address="127.0.0.1:0"), admin_server(cache)) as port:
        status, _, dump = await get(f"http://127.0.0.1:{port}/config_dump")
    assert status == 200 and b'"undecodable"' not in dump and b'"name": "a"' in dump
    shown = json.loads(dump)["types"][SECRET]["resources"][0]["resource"]
    assert shown["tlsCertificate"]["privateKeyProvider"] == {
        "providerName": "pkcs11", "typedConfig": {
            "@type": "type.googleapis.com/google.protobuf.Struct",
            "value": {"pin": "[redacted]"}}}
    assert b"hunter2" not in dump


async def test_keys_in_typed_structs_are_shown_redacted() -> None:
    # A TLS context as JSON, in each kind of TypedStruct: its key is redacted there too.
    ca = trustme.CA()
    leaves = [ca.issue_cert(f"{n}.example") for n in "ab"]
    listener = listener_pb2.Listener(name="l")
    for typed_struct_class, leaf, as_string in zip(
            (xds_typed_struct_pb2.TypedStruct, udpa_typed_struct_pb2.TypedStruct), leaves,
            (True, False), strict=True):
        context = tls_pb2.DownstreamTlsContext()
        context.common_tls_context.tls_certificates.append(tls_certificate(leaf, as_string))
        typed: Any = typed_struct_class(type_url=type_url_of(context))
        typed.value.update(json_format.MessageToDict(context))
        listener.filter_chains.add().transport_socket.typed_config.Pack(typed)
    cache = cached((listener, "l"))
    async with serving(AdminConfig(address="127.0.0.1:0"), admin_server(cache)) as port:
        status, _, dump = await get(f"http://127.0.0.1:{port}/config_dump")
    assert status == 200 and b'"undecodable"' not in dump
    for leaf in leaves:
        for piece in key_material(leaf):
            assert piece not in dump
    chains = json.loads(dump)["types"][LISTENER]["resources"][0]["resource"]["filterChains"]
    shown = [chain["transportSocket"]["typedConfig"] for chain in chains]
    assert [config["@type"] for config in shown] == [
        "type.googleapis.com/xds.type.v3.TypedStruct",
        "type.googleapis.com/udpa.type.v1.TypedStruct"]
    assert [config["value"]["commonTlsContext"]["tlsCertificates"][0]["privateKey"]
            for config in shown] == [
        {"inlineString": "[redacted]"},
        {"inlineBytes": base64.b64encode(b"[redacted]").decode()}]
    assert shown[0]["value"]["commonTlsContext"]["tlsCertificates"][0]["certificateChain"] == {
        "inlineBytes": base64.b64encode(leaves[0].cert_chain_pems[0].bytes()).decode()}
