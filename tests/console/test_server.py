"""The console's routes over real HTTP on the admin port: files, sign-in, data."""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.admin import AdminServer
from relay.cache import ResourceCache, Update
from relay.config import AdminConfig
from relay.console.auth import COOKIE, SECURE_COOKIE
from relay.console.history import Reading
from relay.console.server import Console
from relay.console.source import LocalSource
from relay.resource import CachedResource
from relay.xds_types import CLUSTER, SECRET
from tests.builders import cluster, pack
from tests.certs import Authority

TOKEN = "console-test-token"
PRIVATE_KEY = "-----BEGIN PRIVATE KEY-----never shown-----END PRIVATE KEY-----"
STATIC = Path(__file__).resolve().parents[2] / "relay" / "console" / "static"
FILES = {name: (STATIC / name).read_bytes() for name in ("console.js", "console.css", "icon.svg")}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


def client_record(node_id: str, peer: str, sync: str = "synced") -> dict[str, Any]:
    return {"node_id": node_id, "peer": peer, "protocol": "delta",
            "service": "envoy.service.discovery.v3.AggregatedDiscoveryService",
            "types": {CLUSTER: {"subscribed": ["a"], "wildcard": False,
                                "versions": {"a": "v1"}, "acked": "n1", "in_flight": None,
                                "last_nack": None, "sync": sync, "unsynced": {}}}}


def filled_cache() -> ResourceCache:
    cache = ResourceCache()
    cache.apply(CLUSTER, Update([CachedResource(CLUSTER, "a", "v1", discovery_pb2.Resource(
        name="a", version="v1", resource=pack(cluster("a"))))]))
    certificate = common_pb2.TlsCertificate()
    certificate.private_key.inline_string = PRIVATE_KEY
    secret = secret_pb2.Secret(name="server-cert", tls_certificate=certificate)
    cache.apply(SECRET, Update([CachedResource(SECRET, "server-cert", "v1",
                                               discovery_pb2.Resource(
                                                   name="server-cert", version="v1",
                                                   resource=pack(secret)))]))
    return cache


@contextlib.asynccontextmanager
async def console(tmp_path: Path, token: bool = False,
                  origins: Callable[[], list[dict[str, Any]]] | None = None,
                  tls: Authority | None = None
                  ) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """An admin server with a console whose clients are two fixed records
    (over TLS with a certificate of ``tls``); its base URL and a client
    session (with a cookie jar that keeps the cookies of an IP address)."""
    records = [client_record("envoy-1", "ipv4:10.0.0.1:5"),
               client_record("envoy-2", "ipv4:10.0.0.2:5", "nacked")]
    source = LocalSource(lambda: records, lambda: Reading(len(records), 0))
    admin = AdminServer(filled_cache(), None, lambda: None, lambda: records,
                        lambda: "synced with the origin", console=source, origins=origins)
    options: dict[str, Any] = {"address": "127.0.0.1:0"}
    if token:
        (tmp_path / "token").write_text(TOKEN + "\n")
        options["token_file"] = tmp_path / "token"
    connector = None
    if tls is not None:
        leaf = tls.relay_leaf()
        options["tls"] = {"cert_file": leaf.cert_file, "key_file": leaf.key_file}
        connector = aiohttp.TCPConnector(
            ssl=ssl.create_default_context(cafile=str(tls.cert_file)))
    port = await admin.start(AdminConfig(**options))
    scheme = "http" if tls is None else "https"
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True),
                                         connector=connector) as session:
            yield f"{scheme}://127.0.0.1:{port}", session
    finally:
        await admin.stop()


async def get(session: aiohttp.ClientSession, url: str, **options: Any
              ) -> tuple[int, Mapping[str, str], bytes]:
    """Status, headers (any case) and body."""
    async with session.get(url, **options) as response:
        return response.status, response.headers.copy(), await response.read()


async def test_the_page_and_its_files_come_from_the_package(tmp_path: Path) -> None:
    async with console(tmp_path) as (base, session):
        status, headers, body = await get(session, base + "/")
        assert (status, headers["Content-Type"]) == (200, "text/html; charset=utf-8")
        assert b'<script src="/console/static/console.js" defer></script>' in body
        assert headers["Content-Security-Policy"] == CSP
        assert headers["X-Content-Type-Options"] == "nosniff"
        for name, content_type in (("console.js", "text/javascript; charset=utf-8"),
                                   ("console.css", "text/css; charset=utf-8"),
                                   ("icon.svg", "image/svg+xml")):
            status, headers, body = await get(session, f"{base}/console/static/{name}")
            assert (status, headers["Content-Type"]) == (200, content_type)
            assert body == FILES[name]
            status, _, _ = await get(session, f"{base}/console/static/{name}",
                                     headers={"If-None-Match": headers["ETag"]})
            assert status == 304


async def test_the_script_never_puts_data_into_html() -> None:
    script = FILES["console.js"].decode()
    assert "innerHTML" not in script and "outerHTML" not in script
    assert "insertAdjacentHTML" not in script and "document.write" not in script


async def test_other_paths_are_still_the_admin_s(tmp_path: Path) -> None:
    async with console(tmp_path) as (base, session):
        status, _, body = await get(session, base + "/ready")
        assert (status, body) == (200, b"ready: synced with the origin\n")
        status, _, body = await get(session, base + "/console/nope")
        assert status == 404 and body.startswith(b"not found; the console's paths are / and ")
        status, _, _ = await get(session, base + "/console/static/secrets.txt")
        assert status == 404
        async with session.post(base + "/console/data") as response:
            assert (response.status, response.headers["Allow"]) == (405, "GET, HEAD")


async def test_without_a_token_file_the_data_is_open(tmp_path: Path) -> None:
    async with console(tmp_path) as (base, session):
        status, headers, body = await get(session, base + "/console/data")
        data = json.loads(body)
        assert (status, headers["Cache-Control"]) == (200, "no-store")
        assert data["ready"] == {"ready": True, "why": "synced with the origin"}
        assert [row["node_id"] for row in data["clients"]["rows"]] == ["envoy-2", "envoy-1"]
        assert data["clients"]["states"] == {"nacked": 1, "stale": 0, "not_sent": 0,
                                             "synced": 1}
        assert [t["type"] for t in data["cache"]] == ["Cluster", "Secret"]
        assert data["origins"] is None and data["snapshot"] is None


async def test_origins_are_shown_when_the_admin_reports_them(tmp_path: Path) -> None:
    origins = [{"origin": "default", "server": "cp:18000", "servers": ["cp:18000"],
                "fallback": 0, "connected": True, "since": 1.0, "reconnects": 2,
                "last_response": {"Cluster": 5.0, "Listener": 4.0}}]
    async with console(tmp_path, origins=lambda: origins) as (base, session):
        [shown] = json.loads((await get(session, base + "/console/data"))[2])["origins"]
        assert shown["server"] == "cp:18000" and shown["reconnects"] == 2
        assert [r["type"] for r in shown["last_response"]] == ["Cluster", "Listener"]


async def test_a_bad_query_is_400_saying_why(tmp_path: Path) -> None:
    async with console(tmp_path) as (base, session):
        status, _, body = await get(session, base + "/console/data?sort=age")
        assert (status, json.loads(body)) == (400, {
            "error": "sort 'age': expected one of worst, node, peer, protocol, worker"})
        status, _, body = await get(session, base + "/console/data?since=yesterday")
        assert (status, json.loads(body)) == (400, {
            "error": "since 'yesterday': expected a Unix time"})


async def test_with_a_token_file_the_data_wants_the_cookie_or_the_bearer(tmp_path: Path
                                                                           ) -> None:
    async with console(tmp_path, token=True) as (base, session):
        status, _, body = await get(session, base + "/")
        assert status == 200  # the page holds no data
        status, _, body = await get(session, base + "/console/session")
        assert json.loads(body) == {"token_required": True, "signed_in": False}
        for path in ("/console/data", "/console/client?node=envoy-1&peer=ipv4:10.0.0.1:5",
                     f"/console/resource?type={CLUSTER}&name=a"):
            status, _, body = await get(session, base + path)
            assert (status, json.loads(body)) == (401, {
                "error": "sign in: this console needs the token of admin.token_file",
                "sign_in": True}), path
        status, _, _ = await get(session, base + "/console/data",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        status, _, _ = await get(session, base + "/console/data",
                                 headers={"Authorization": "Bearer wrong"})
        assert status == 401


async def test_signing_in_with_the_token_gives_a_cookie_that_reads_the_data(tmp_path: Path
                                                                              ) -> None:
    async with console(tmp_path, token=True) as (base, session):
        async with session.post(base + "/console/login", data={"token": TOKEN}) as response:
            assert (response.status, await response.json()) == (200, {"signed_in": True})
            set_cookie = response.headers["Set-Cookie"]
        assert set_cookie.startswith(f"{COOKIE}=") and TOKEN not in set_cookie
        assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        status, _, body = await get(session, base + "/console/session")
        assert json.loads(body) == {"token_required": True, "signed_in": True}
        status, _, _ = await get(session, base + "/console/data")
        assert status == 200
        async with session.post(base + "/console/logout") as response:
            assert response.status == 200
        status, _, _ = await get(session, base + "/console/data")
        assert status == 401


async def test_over_admin_tls_the_cookie_is_secure_and_host_only(tmp_path: Path) -> None:
    async with console(tmp_path, token=True, tls=Authority(tmp_path)) as (base, session):
        async with session.post(base + "/console/login", data={"token": TOKEN}) as response:
            set_cookie = response.headers["Set-Cookie"]
        assert set_cookie.startswith(f"{SECURE_COOKIE}=") and set_cookie.endswith("; Secure")
        assert "Domain=" not in set_cookie
        status, _, _ = await get(session, base + "/console/data")
        assert status == 200


async def test_a_wrong_token_signs_nobody_in(tmp_path: Path) -> None:
    async with console(tmp_path, token=True) as (base, session), \
            session.post(base + "/console/login", data={"token": "guess"}) as response:
        assert (response.status, await response.json()) == (401, {
            "error": "wrong token: give the one in admin.token_file"})
        assert "Set-Cookie" not in response.headers


async def test_a_sign_in_from_another_site_s_page_is_refused(tmp_path: Path) -> None:
    async with console(tmp_path, token=True) as (base, session):
        async with session.post(base + "/console/login", data={"token": TOKEN},
                                headers={"Origin": "https://evil.example"}) as response:
            assert response.status == 403 and "Set-Cookie" not in response.headers
        async with session.post(base + "/console/login", data={"token": TOKEN},
                                headers={"Origin": base}) as response:
            assert response.status == 200


async def test_signing_in_is_a_post_never_a_url(tmp_path: Path) -> None:
    async with console(tmp_path, token=True) as (base, session):
        status, headers, _ = await get(session, f"{base}/console/login?token={TOKEN}")
        assert (status, headers["Allow"]) == (405, "POST")
        status, _, _ = await get(session, base + "/console/data")
        assert status == 401


async def test_without_a_token_file_there_is_nothing_to_sign_in_to(tmp_path: Path) -> None:
    async with console(tmp_path) as (base, session), \
            session.post(base + "/console/login", data={"token": "x"}) as response:
        assert response.status == 400


async def test_a_client_s_page(tmp_path: Path) -> None:
    async with console(tmp_path) as (base, session):
        status, _, body = await get(session,
                                    base + "/console/client?node=envoy-1&peer=ipv4:10.0.0.1:5")
        [stream] = json.loads(body)["streams"]
        assert status == 200 and stream["node_id"] == "envoy-1"
        [cds] = stream["types"]
        assert cds["resources"] == [{"name": "a", "status": "acked", "held": "v1",
                                     "cached": "v1"}]
        status, _, body = await get(session, base + "/console/client?node=gone&peer=x")
        assert status == 404
        assert json.loads(body)["error"] == "no such client is connected now"


async def test_a_resource_is_shown_with_its_secrets_redacted(tmp_path: Path) -> None:
    async with console(tmp_path) as (base, session):
        status, _, body = await get(session,
                                    f"{base}/console/resource?type={SECRET}&name=server-cert")
        assert status == 200
        assert PRIVATE_KEY.encode() not in body and b"[redacted]" in body
        status, _, body = await get(session, f"{base}/console/resource?type=Nope&name=a")
        assert status == 400 and json.loads(body)["error"].startswith("unknown type 'Nope'")


async def test_the_history_is_sampled_while_the_admin_serves(tmp_path: Path) -> None:
    async with console(tmp_path) as (base, session):
        data = json.loads((await get(session, base + "/console/data"))[2])
        assert data["history"]["fields"][0] == "at" and data["history"]["capacity"] == 600


async def test_an_admin_server_without_a_source_serves_no_console() -> None:
    admin = AdminServer(ResourceCache(), None, lambda: None)
    port = await admin.start(AdminConfig(address="127.0.0.1:0"))
    try:
        async with aiohttp.ClientSession() as session:
            status, _, body = await get(session, f"http://127.0.0.1:{port}/")
            assert status == 404 and body.startswith(b"not found; the paths are")
    finally:
        await admin.stop()


@pytest.mark.parametrize("path", ["/", "/console/data"])
async def test_head_is_answered_like_get(tmp_path: Path, path: str) -> None:
    async with console(tmp_path) as (base, session), session.head(base + path) as response:
        assert response.status == 200


def test_the_console_is_a_class_of_its_own_module() -> None:
    assert Console.__module__ == "relay.console.server"


async def test_a_login_form_over_the_limit_is_413(tmp_path: Path) -> None:
    async with console(tmp_path, token=True) as (base, session), \
            session.post(base + "/console/login", data={"token": "x" * 70_000}) as response:
        assert response.status == 413 and "Set-Cookie" not in response.headers
