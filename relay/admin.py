"""Admin HTTP endpoints: ``/ready``, ``/healthz``, ``/clients``, ``/origins``,
``/config_dump``, ``/config``, ``/logging``, ``/metrics``.

Two layers. :meth:`AdminServer.route` (and :func:`token_refusal`) decide the
reply to a request with no I/O: they are tested directly, and the hub of
``--workers`` reuses them. Around them, aiohttp's server speaks HTTP (and TLS)
and hands every request to one catch-all handler, within ``admin.header_timeout``,
``idle_timeout`` and ``connections_per_host`` (see :func:`relay.web.listen`).

Off loopback the endpoints want ``admin.token_file`` (a bearer token for all
but the probes' ``/healthz`` and ``/ready``) and ``admin.tls``. Both are files
that rotate: they are read again when they change, with no restart.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from relay.cache import ResourceCache
from relay.certificates import file_signature
from relay.config import AdminConfig, RelayConfig
from relay.config.models import LOG_LEVELS
from relay.config.running import running_config
from relay.errors import RelayError
from relay.logs import RateLimitedLog, log_level, set_log_level
from relay.redaction import redacted
from relay.server.access import REFUSAL_LOG_INTERVAL
from relay.server.status import ClientRecords
from relay.turns import give_turn
from relay.web import FollowedTLS, Listener, listen, quiet_malformed_requests
from relay.xds_types import PUSH_ORDER, message_class, short_name

if TYPE_CHECKING:
    from relay.console.server import Console
    from relay.console.source import ConsoleSource

__all__ = ["CLIENT_RESOURCES_PER_TURN", "OPEN_PATHS", "PATHS", "READ_METHODS", "WRITE_METHODS",
           "AdminServer", "BadQuery", "Reply", "token_refusal"]

log = logging.getLogger("relay.admin")
# aiohttp's own lines (see quiet_malformed_requests)
_http_log = logging.getLogger("relay.admin.http")

#: Every path served, in the order the 404 reply lists them.
PATHS = ("/healthz", "/ready", "/clients", "/origins", "/config_dump", "/config", "/logging",
         "/metrics")
#: Paths served without a token: probes (kubelet, Docker) carry none.
OPEN_PATHS = frozenset({"/healthz", "/ready"})
#: The methods every path answers (aiohttp leaves out the body of a HEAD reply).
READ_METHODS = ("GET", "HEAD")
#: The paths that change something, and the methods they answer. PUT, not
#: POST: a web page elsewhere can make a browser POST to a loopback admin
#: port (no token there) without asking, but not PUT.
WRITE_METHODS = {"/logging": (*READ_METHODS, "PUT")}
#: /clients is built and written a few clients at a time, letting the event
#: loop serve others in between: this many resources listed per turn.
CLIENT_RESOURCES_PER_TURN = 2_000
#: How long ``stop`` lets requests in progress finish (the hub's gathering takes up to 2 s).
STOP_GRACE = 2.0

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
_CONFIG_DUMP_PARAMETERS = ("type", "name")


@dataclass
class Reply:
    """What to answer: status, body (ending with a newline) and headers."""

    status: int
    body: bytes
    content_type: str = _TEXT
    headers: dict[str, str] = field(default_factory=dict)


class BadQuery(RelayError, ValueError):
    """A query the endpoint cannot answer (400); the message says what it takes."""


def token_refusal(path: str, authorization: str | None, token: bytes | None) -> Reply | None:
    """The 401 for a request to ``path`` carrying the ``Authorization`` header
    ``authorization``, or None if it may go on (no I/O).

    ``token`` None: no token is required. ``/healthz`` and ``/ready`` never need one.
    """
    if token is None or path in OPEN_PATHS:
        return None
    if authorization is None:
        return Reply(401, b"this path needs a token: send Authorization: Bearer <token> "
                          b"(the token of admin.token_file)\n",
                     headers={"WWW-Authenticate": "Bearer"})
    scheme, _, given = authorization.strip().partition(" ")
    try:
        # aiohttp decodes header bytes as UTF-8 with surrogateescape: this gives them back
        given_bytes = given.strip().encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        given_bytes = b""
    # compare_digest also when the scheme is wrong: the time taken tells nothing
    if not hmac.compare_digest(given_bytes, token) or scheme.lower() != "bearer":
        return Reply(401, b"wrong token: send the one in admin.token_file as "
                          b"Authorization: Bearer <token>\n",
                     headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    return None


class AdminServer:
    """Serves the admin endpoints for one relay."""

    def __init__(self, cache: ResourceCache, registry: CollectorRegistry | None,
                 not_ready_reason: Callable[[], str | None],
                 clients: Callable[[], Iterable[dict[str, Any]]] = list,
                 ready_detail: Callable[[], str] | None = None,
                 console: ConsoleSource | None = None,
                 origins: Callable[[], list[dict[str, Any]]] | None = None,
                 config: RelayConfig | None = None) -> None:
        """``clients`` gives ``/clients`` one client at a time (built as they
        are taken: see :meth:`clients_reply`); ``origins`` each origin's state
        for ``/origins`` (None: none to show); ``config`` is what ``/config``
        shows, redacted (None: it is not shown)."""
        self.cache = cache
        self.ready_detail = ready_detail
        self.registry = registry
        self.not_ready_reason = not_ready_reason
        self.clients = clients
        self.origins = origins
        self.config = config
        self._listener: Listener | None = None
        self._token: _TokenFile | None = None
        # lines about clients (too many connections, slow headers): a few per interval
        self._client_log = RateLimitedLog(log, REFUSAL_LOG_INTERVAL, time.monotonic)
        # the live console at / (relay.console), when told where its clients come from
        self._console_source = console
        self._console: Console | None = None

    async def start(self, config: AdminConfig) -> int:
        """Listen where ``config`` says, with its TLS, token and limits
        (``admin.header_timeout``, ...); returns the bound port.

        Raises ``OSError`` naming the address or file when it cannot listen, or
        when the TLS files or the token file cannot be used.
        """
        address = config.address
        tls = None if config.tls is None else FollowedTLS(
            config.tls.cert_file, config.tls.key_file, None, "admin.tls", log)
        self._token = _TokenFile(config.token_file) if config.token_file is not None else None
        _warn_if_exposed(config)
        handle: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]] = self._handle
        if self._console_source is not None:
            from relay.console.server import Console  # it imports this module

            self._console = Console(self, self._console_source,
                                    self._token.current if self._token is not None else None,
                                    tls is not None)
            handle = self._console.around(handle)
        self._listener = await listen(handle, "admin", address, tls, config.http_limits,
                                      self._client_log, _http_log, STOP_GRACE)
        if self._console is not None:
            self._console.start()  # its history, sampled from now on
        return self._listener.port

    async def stop(self) -> None:
        """Stop listening; requests in progress get ``STOP_GRACE`` to finish. Idempotent."""
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()
        console, self._console = self._console, None
        if console is not None:
            await console.stop()

    async def respond(self, method: str, target: str) -> Reply:
        """The reply for one (authorized) request: :meth:`route`'s, unless a
        subclass must ask elsewhere first (the hub of ``--workers`` asks its
        workers); ``/clients`` a few clients at a time (:meth:`clients_reply`)."""
        if method in READ_METHODS and urlsplit(target).path == "/clients":
            return await self.clients_reply()
        return self.route(method, target)

    async def clients_reply(self) -> Reply:
        """``/clients``, built and written while the event loop serves others.

        Each client is built (compared with the cache) and written as it is
        taken from ``clients``; after every :data:`CLIENT_RESOURCES_PER_TURN`
        resources listed, the loop runs what waits: 200 clients of 5,000
        names each take seconds to list, and no client of the relay waits for
        all of them. Clients given as :class:`~relay.server.status.ClientRecords`
        let the loop run within a big client's record too, at each of its slices.
        Each pause is a whole turn (:func:`relay.turns.give_turn`): with one
        ``sleep(0)``, a client waiting for a timer waited for the slice after too.
        """
        # each client's text as bytes at once: joining and encoding all of
        # them at the end held the loop for as long as tens of MB take
        parts: list[bytes] = []
        listed = 0
        records = self.clients()
        taken = records.slices() if isinstance(records, ClientRecords) else records
        for client in taken:
            if client is None:  # a slice of a big client's record: the others' turn
                listed = 0
                await give_turn()
                continue
            parts.append(textwrap.indent(json.dumps(client, indent=2), "    ").encode())
            listed += 1 + sum(len(state.get("versions", ())) + len(state.get("unsynced", ()))
                              for state in client.get("types", {}).values())
            if listed >= CLIENT_RESOURCES_PER_TURN:
                listed = 0
                await give_turn()
        if not parts:
            return Reply(200, b'{\n  "clients": []\n}\n', _JSON)
        parts[0] = b'{\n  "clients": [\n' + parts[0]
        parts[-1] += b"\n  ]\n}\n"
        return Reply(200, b",\n".join(parts), _JSON)  # (one copy of the whole)

    def route(self, method: str, target: str) -> Reply:
        """The reply for one request (no I/O; tested directly)."""
        url = urlsplit(target)
        if url.path not in PATHS:
            return Reply(404, f"not found; the paths are {' '.join(PATHS)}\n".encode())
        methods = WRITE_METHODS.get(url.path, READ_METHODS)
        if method not in methods:
            use = f"{', '.join(methods[:-1])} or {methods[-1]}"
            return Reply(405, f"{method} is not allowed; use {use}\n".encode(),
                         headers={"Allow": ", ".join(methods)})
        if url.path == "/healthz":
            return Reply(200, b"ok\n")
        if url.path == "/ready":
            reason = self.not_ready_reason()
            if reason is not None:
                return Reply(503, f"not ready: {reason}\n".encode())
            detail = f": {self.ready_detail()}" if self.ready_detail is not None else ""
            return Reply(200, f"ready{detail}\n".encode())
        if url.path == "/clients":
            return _json_reply({"clients": list(self.clients())})
        if url.path == "/origins":
            return _json_reply({"origins": self.origins() if self.origins is not None else []})
        if url.path == "/config":
            if self.config is None:
                return Reply(404, b"this server was given no config to show\n")
            return _json_reply(running_config(self.config))
        if url.path == "/logging":
            return _logging(method, url.query)
        if url.path == "/config_dump":
            try:
                dump = self.config_dump(**_config_dump_query(url.query))
            except BadQuery as error:
                return Reply(400, f"{error}\n".encode())
            return Reply(200, json.dumps(dump, indent=2).encode() + b"\n", _JSON)
        if self.registry is None:
            return Reply(404, b"this server keeps no metrics\n")
        return Reply(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)

    def config_dump(self, type_filter: str | None = None, name_filter: str | None = None
                    ) -> dict[str, Any]:
        """Cached resources with versions and variants, optionally filtered;
        sensitive fields (a ``Secret``'s private key, ...) are ``[redacted]``.

        ``type_filter`` is a type URL, a full message name or a short one
        (``Cluster``) and lists that type even when nothing of it is cached;
        ``name_filter`` an exact resource name. Raises :class:`BadQuery` for a
        type the relay neither knows nor caches.
        """
        type_urls = self.cache.type_urls() if type_filter is None else \
            self._types_named(type_filter)
        types: dict[str, Any] = {}
        for type_url in type_urls:
            body_class = message_class(type_url)
            entries = []
            for resource in sorted(self.cache.resources(type_url),
                                   key=lambda r: (r.name, r.variant_key)):
                if name_filter and resource.name != name_filter:
                    continue
                entry: dict[str, Any] = {"name": resource.name, "version": resource.version}
                if resource.variant_key:
                    entry["variant"] = resource.variant_key
                if body_class is not None:
                    try:
                        entry["resource"] = json_format.MessageToDict(
                            body_class.FromString(redacted(resource.body).value))
                    except (TypeError, ValueError, DecodeError) as error:
                        # an Any of a type this process has not imported (a filter's
                        # typed_config), or bytes that do not parse: this entry says
                        # so, rather than a 500 for the whole dump
                        entry["undecodable"] = str(error)
                entries.append(entry)
            types[type_url] = {"synced": self.cache.is_synced(type_url), "resources": entries}
        return {"types": types}

    def _types_named(self, type_filter: str) -> list[str]:
        """The type URLs ``type_filter`` names, among those the relay knows or caches.

        A name matching none is a 400, not an empty dump: ``?type=Clusters``
        is a typo, and an empty 200 would read as "nothing cached". 400 rather
        than 404 because /config_dump exists; its query is what is wrong.
        """
        known = sorted(set(PUSH_ORDER) | set(self.cache.type_urls()))
        named = [type_url for type_url in known
                 if type_filter in (type_url, type_url.rsplit("/", 1)[-1], short_name(type_url))]
        if not named:
            raise BadQuery(f"unknown type {type_filter!r}; known types: "
                           f"{', '.join(sorted({short_name(type_url) for type_url in known}))} "
                           f"(or their type URLs)")
        return named

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Every request: the token first, then :meth:`respond`."""
        # The raw target, as route() has always seen it: the token is checked
        # on the very path that route() serves.
        target = request.raw_path
        token = self._token.current() if self._token is not None else None
        reply = token_refusal(urlsplit(target).path, request.headers.get("Authorization"),
                              token)
        if reply is None:
            reply = await self.respond(request.method, target)
        return web.Response(status=reply.status, body=reply.body,
                            headers={"Content-Type": reply.content_type, **reply.headers})


quiet_malformed_requests(_http_log, log)


def _json_reply(data: object) -> Reply:
    return Reply(200, json.dumps(data, indent=2).encode() + b"\n", _JSON)


def _logging(method: str, query: str) -> Reply:
    """``/logging``: the level the relay logs at (GET), or a new one
    (``PUT /logging?level=debug``), in force at once and logged."""
    values = {key: value[-1] for key, value in parse_qs(query).items()}
    unknown = sorted(set(values) - {"level"})
    if unknown:
        return Reply(400, f"unknown parameter {unknown[0]!r}; /logging takes level\n".encode())
    if method != "PUT":
        if values:
            return Reply(400, b"to change the level, PUT /logging?level=LEVEL\n")
        return _json_reply({"level": log_level()})
    level = values.get("level", "").strip().lower()
    if level not in LOG_LEVELS:
        return Reply(400, f"level={level!r}: expected one of "
                          f"{', '.join(LOG_LEVELS)}\n".encode())
    return _json_reply({"level": level, "was": set_log_level(level)})


def _config_dump_query(query: str) -> dict[str, str | None]:
    """``type`` and ``name`` of a /config_dump query (the last of each);
    :class:`BadQuery` for any other parameter (a typo would dump everything)."""
    values = {key: value[-1] for key, value in parse_qs(query).items()}
    unknown = sorted(set(values) - set(_CONFIG_DUMP_PARAMETERS))
    if unknown:
        raise BadQuery(f"unknown parameter {unknown[0]!r}; /config_dump takes "
                       f"{' and '.join(_CONFIG_DUMP_PARAMETERS)}")
    return {"type_filter": values.get("type"), "name_filter": values.get("name")}


def _is_loopback(host: str) -> bool:
    if host.rstrip(".").lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a DNS name: it may resolve to anything
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _warn_if_exposed(config: AdminConfig) -> None:
    """One warning at start when the admin endpoints are reachable off this host
    unprotected, or when their token would cross the network in clear."""
    address = config.address
    if _is_loopback(address.host):
        return
    if config.token_file is None:
        log.warning("admin server on %s is not on loopback and has no token: /config_dump "
                    "and /clients are open to anyone who can reach it; set admin.token_file "
                    "(and admin.tls)", address)
    elif config.tls is None:
        log.warning("admin server on %s has admin.token_file but no admin.tls: the token "
                    "travels in clear text; set admin.tls", address)


class _TokenFile:
    """The bearer token in ``admin.token_file``, read again when the file changes.

    A change into a file that cannot be read or is empty (half written) is
    logged once per change and the previous token stays in force; a missing
    file (mid-swap) is waited out. The token itself is never logged.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._seen = file_signature((path,))
        try:
            self._token = self._read()
        except ValueError as error:
            raise OSError(str(error)) from None

    def current(self) -> bytes:
        """The token as the file says now (cheap: one ``stat`` unless it changed)."""
        seen = file_signature((self._path,))
        if seen is not None and seen != self._seen:
            self._seen = seen
            try:
                self._token = self._read()
            except ValueError as error:
                log.warning("%s; the previous admin token stays in force", error)
            else:
                log.info("admin.token_file %s changed: its new token is in force", self._path)
        return self._token

    def _read(self) -> bytes:
        try:
            token = self._path.read_bytes().strip()
        except OSError as error:
            raise ValueError(f"cannot read admin.token_file {self._path}: "
                             f"{error.strerror or error}") from None
        if not token:
            raise ValueError(f"admin.token_file {self._path} is empty")
        return token
