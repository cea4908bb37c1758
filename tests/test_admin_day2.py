"""The admin endpoints for day 2: /origins, /config (redacted), /logging, and
/clients built without holding up the event loop."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relay.admin import CLIENT_RESOURCES_PER_TURN, AdminServer
from relay.cache import ResourceCache
from relay.config import AdminConfig, parse_config
from relay.xds_types import CLUSTER
from tests.test_admin_security import TOKEN, bearer, get, serving, token_config

ORIGINS = [{"origin": "default", "server": "cp:18000", "fallback": False, "connected": True,
            "connected_since": 1_700_000_000.5, "synced": True, "reconnects": 0,
            "last_response": {CLUSTER: 1_700_000_001.25}}]


def server(**given: Any) -> AdminServer:
    return AdminServer(ResourceCache(), None, lambda: None, **given)


def body_of(reply: Any) -> Any:
    assert reply.status == 200, reply.body
    assert reply.content_type == "application/json"
    return json.loads(reply.body)


# -- /origins -------------------------------------------------------------------------


def test_origins_lists_what_the_relay_says_of_each_origin() -> None:
    assert body_of(server(origins=lambda: ORIGINS).route("GET", "/origins")) == {
        "origins": ORIGINS}


def test_origins_of_a_server_told_of_none_is_an_empty_list() -> None:
    assert body_of(server().route("GET", "/origins")) == {"origins": []}


async def test_origins_config_and_logging_need_the_token(tmp_path: Path) -> None:
    admin = server(origins=lambda: ORIGINS, config=parse_config("node: {id: a}\n"
                                                                "upstream: {address: 'o:1'}\n"))
    async with serving(token_config(tmp_path), admin) as port:
        for path, method in (("/origins", "GET"), ("/config", "GET"), ("/logging", "GET"),
                             ("/logging?level=debug", "PUT")):
            url = f"http://127.0.0.1:{port}{path}"
            assert (await get(url, method=method))[0] == 401, path
            if method == "GET":
                assert (await get(url, bearer(TOKEN)))[0] == 200, path
    assert logging.getLogger().level != logging.DEBUG  # refused: nothing changed


# -- /config ------------------------------------------------------------------------


def test_config_is_every_key_as_written_with_secrets_redacted(tmp_path: Path) -> None:
    token = tmp_path / "origin-token"
    token.write_text("origin-token-contents")
    password = tmp_path / "redis-password"
    password.write_text("redis-password-contents")
    config = parse_config(f"""
node: {{id: relay-a}}
server: {{batch_window: 5ms}}
upstream:
  address: istiod:15012
  token_file: {token}
  initial_metadata: {{clusterid: Kubernetes, x-api-key: metadata-secret}}
metrics: {{otlp: {{endpoint: "http://user:otlp-secret@collector:4318"}}}}
persistence:
  redis: {{url: "redis://:url-secret@cache:6379/0", password_file: {password}}}
""")
    reply = server(config=config).route("GET", "/config")
    shown = body_of(reply)
    for secret in (b"origin-token-contents", b"redis-password-contents", b"metadata-secret",
                   b"otlp-secret", b"url-secret"):
        assert secret not in reply.body
    assert shown["upstream"]["initial_metadata"] == {"clusterid": "[redacted]",
                                                     "x-api-key": "[redacted]"}
    assert shown["upstream"]["token_file"] == str(token)
    assert shown["persistence"]["redis"]["url"] == "redis://:[redacted]@cache:6379/0"
    assert shown["persistence"]["redis"]["password_file"] == str(password)
    assert shown["metrics"]["otlp"]["endpoint"].startswith(
        "http://user:[redacted]@collector:4318")
    # as the YAML writes it, defaults included
    assert (shown["node"]["id"], shown["server"]["batch_window"], shown["server"]["address"],
            shown["admin"]["address"], shown["upstream"]["address"]) == (
        "relay-a", "5ms", "127.0.0.1:18000", "127.0.0.1:19000", "istiod:15012")
    assert shown["limits"]["streams"] == config.limits.streams


def test_config_of_a_server_given_none_is_404() -> None:
    reply = server().route("GET", "/config")
    assert (reply.status, reply.body) == (404, b"this server was given no config to show\n")


# -- /logging -----------------------------------------------------------------------


@pytest.fixture
def root_level() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.setLevel(level)


@pytest.mark.usefixtures("root_level")
def test_logging_says_the_level_and_put_changes_it_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    admin = server()
    assert body_of(admin.route("GET", "/logging")) == {"level": "info"}
    assert body_of(admin.route("PUT", "/logging?level=DEBUG")) == {
        "level": "debug", "was": "info"}
    assert logging.getLogger("relay.downstream").isEnabledFor(logging.DEBUG)
    assert body_of(admin.route("PUT", "/logging?level=warning")) == {
        "level": "warning", "was": "debug"}
    assert not logging.getLogger("relay.downstream").isEnabledFor(logging.INFO)
    assert body_of(admin.route("GET", "/logging")) == {"level": "warning"}
    assert [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "relay"] == [("INFO", "log level debug (was info)"),
                                     ("INFO", "log level warning (was debug)")]


@pytest.mark.usefixtures("root_level")
@pytest.mark.parametrize(("method", "target", "status", "body"), [
    ("PUT", "/logging?level=loud", 400,
     b"level='loud': expected one of debug, info, warning, error\n"),
    ("PUT", "/logging", 400, b"level='': expected one of debug, info, warning, error\n"),
    ("PUT", "/logging?levle=debug", 400, b"unknown parameter 'levle'; /logging takes level\n"),
    ("GET", "/logging?level=debug", 400, b"to change the level, PUT /logging?level=LEVEL\n"),
    ("POST", "/logging?level=debug", 405, b"POST is not allowed; use GET, HEAD or PUT\n"),
])
def test_logging_refuses_what_it_cannot_do(method: str, target: str, status: int,
                                           body: bytes) -> None:
    reply = server().route(method, target)
    assert (reply.status, reply.body) == (status, body)
    assert logging.getLogger().level == logging.INFO


def test_put_is_only_for_logging() -> None:
    reply = server().route("PUT", "/clients")
    assert (reply.status, reply.headers) == (405, {"Allow": "GET, HEAD"})


# -- /clients, a few at a time --------------------------------------------------------


def big_client(number: int) -> dict[str, Any]:
    """A /clients record listing CLIENT_RESOURCES_PER_TURN resources: one a turn."""
    versions = {f"c{i}": "1" for i in range(CLIENT_RESOURCES_PER_TURN)}
    return {"node_id": f"n{number}", "peer": "ipv4:10.0.0.1:1", "protocol": "sotw",
            "types": {CLUSTER: {"versions": versions, "unsynced": {}, "sync": "synced"}}}


async def test_clients_are_built_while_other_requests_are_served() -> None:
    answered: list[int] = []  # /healthz answers, as each client is built
    count = 20

    def clients() -> Iterator[dict[str, Any]]:
        for number in range(count):
            answered.append(healthz)
            yield big_client(number)

    healthz = 0
    probing = asyncio.Event()
    admin = server(clients=clients)
    async with serving(AdminConfig(address="127.0.0.1:0"), admin) as port, \
            aiohttp.ClientSession() as session:
        base = f"http://127.0.0.1:{port}"

        async def probe() -> None:
            nonlocal healthz
            while True:
                async with session.get(f"{base}/healthz") as reply:
                    assert reply.status == 200
                healthz += 1
                probing.set()

        prober = asyncio.create_task(probe())
        try:
            await probing.wait()  # the probe's connection is up
            async with session.get(f"{base}/clients") as reply:
                listed = json.loads(await reply.read())
        finally:
            prober.cancel()
    assert [c["node_id"] for c in listed["clients"]] == [f"n{i}" for i in range(count)]
    # while the list was built, /healthz kept being answered
    assert answered[-1] > answered[0]


async def test_clients_written_a_few_at_a_time_are_the_same_json() -> None:
    records = [big_client(0), {"node_id": "n1", "types": {}}]
    admin = server(clients=lambda: iter(records))
    reply = await admin.respond("GET", "/clients")
    assert reply.body == json.dumps({"clients": records}, indent=2).encode() + b"\n"
    assert reply.body == admin.route("GET", "/clients").body
    empty = await server().respond("GET", "/clients")
    assert empty.body == json.dumps({"clients": []}, indent=2).encode() + b"\n"
