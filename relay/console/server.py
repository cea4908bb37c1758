"""The console's routes on the admin port: the page, its two static files,
signing in, and the JSON the page polls.

========================  ======  ==========================================
path                      method  what
========================  ======  ==========================================
``/``                     GET     the page (HTML; no data in it)
``/console/static/*``     GET     ``console.css``, ``console.js``, ``icon.svg``
``/console/session``      GET     whether a token is needed, and given
``/console/login``        POST    the form's ``token``; answered with a cookie
``/console/logout``       POST    ends the sign-in
``/console/data``         GET     readiness, origins, cache, a page of
                                  clients, chart points (see :func:`_data`)
``/console/client``       GET     one client's streams (``node``, ``peer``,
                                  ``worker``)
``/console/resource``     GET     one cached resource, secrets redacted
                                  (``type``, ``name``: ``/config_dump``'s)
========================  ======  ==========================================

The page, its files and ``/console/session`` hold nothing about the relay
and are open; the rest want, with ``admin.token_file``, the sign-in cookie
(:mod:`relay.console.auth`) or the bearer header of the other endpoints.
Everything is served from the package (no CDN, no build step), with a
Content-Security-Policy that lets the page run its own script and nothing
else: no inline script, no other origin, no frames.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import parse_qs

from aiohttp import web

from relay.admin import BadQuery as DumpQuery
from relay.admin import token_refusal
from relay.cache import ResourceCache
from relay.console import auth
from relay.console.clients import BadQuery, Query
from relay.console.data import (
    cache_view,
    client_view,
    history_view,
    origins_view,
    readiness_view,
)
from relay.console.history import History, Sampler
from relay.console.source import ConsoleSource

__all__ = ["PREFIX", "Console"]

#: Every console path but ``/`` starts with this.
PREFIX = "/console/"
#: The static files, by name, with their content types.
STATIC = {"console.css": "text/css; charset=utf-8",
          "console.js": "text/javascript; charset=utf-8",
          "icon.svg": "image/svg+xml"}
#: The login form's body is at most this long.
LOGIN_BODY_LIMIT = 64 * 1024

_JSON = "application/json"
_HTML = "text/html; charset=utf-8"
_TEXT = "text/plain; charset=utf-8"
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class AdminView(Protocol):
    """What the console reads of the admin server (:class:`relay.admin.AdminServer`)."""

    cache: ResourceCache
    not_ready_reason: Callable[[], str | None]
    ready_detail: Callable[[], str] | None
    origins: Callable[[], list[dict[str, Any]]] | None

    def config_dump(self, type_filter: str | None = None,
                    name_filter: str | None = None) -> dict[str, Any]: ...


class Console:
    """The console of one admin server: its routes, and the history it samples.

    ``source`` gives the clients and readings; ``token`` the current token
    of ``admin.token_file`` (None: none is needed); ``tls`` whether the
    admin port speaks TLS (the cookie is then ``Secure``).
    """

    def __init__(self, admin: AdminView, source: ConsoleSource,
                 token: Callable[[], bytes] | None, tls: bool,
                 history: History | None = None, wall: Callable[[], float] = time.time) -> None:
        self._admin = admin
        self._source = source
        self._token = token
        self._tls = tls
        self._wall = wall
        self.history = history or History()
        self._sampler = Sampler(source.readings, self.history, wall=wall)
        self._files = {name: _package_file(name) for name in ("index.html", *STATIC)}

    def start(self) -> None:
        """Start sampling the history (on the running loop)."""
        self._sampler.start()

    async def stop(self) -> None:
        await self._sampler.stop()

    def around(self, handle: Handler) -> Handler:
        """``handle`` with the console's paths served first."""

        async def handled(request: web.BaseRequest) -> web.StreamResponse:
            response = await self.handle(request)
            return response if response is not None else await handle(request)

        return handled

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse | None:
        """The console's answer to ``request``; None for a path not its own."""
        path = request.path
        if path != "/" and not path.startswith(PREFIX):
            return None
        method = request.method
        if path == "/" or path.startswith(PREFIX + "static/"):
            name = "index.html" if path == "/" else path.removeprefix(PREFIX + "static/")
            if name not in self._files:
                return _reply(404, f"not found; the console's files are "
                                   f"{', '.join(STATIC)}\n")
            if method not in ("GET", "HEAD"):
                return _not_allowed(method, "GET, HEAD")
            return self._file(request, name)
        if path in (PREFIX + "login", PREFIX + "logout"):
            if method != "POST":
                return _not_allowed(method, "POST")
            return await (self._login(request) if path.endswith("login") else
                          self._logout(request))
        readers: dict[str, Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]] = {
            PREFIX + "session": self._session, PREFIX + "data": self._data,
            PREFIX + "client": self._client, PREFIX + "resource": self._resource}
        reader = readers.get(path)
        if reader is None:
            return _reply(404, "not found; the console's paths are / and "
                               f"{', '.join(sorted(readers))}, {PREFIX}login, {PREFIX}logout\n")
        if method not in ("GET", "HEAD"):
            return _not_allowed(method, "GET, HEAD")
        if reader != self._session and not self._signed_in(request):
            return _json(401, {"error": "sign in: this console needs the token of "
                                        "admin.token_file", "sign_in": True})
        return await reader(request)

    # -- signing in -------------------------------------------------------------

    def _signed_in(self, request: web.BaseRequest) -> bool:
        """Whether ``request`` may read the relay's state: no token is needed,
        or it carries the sign-in cookie or the bearer token."""
        if self._token is None:
            return True
        token = self._token()
        if auth.signed_in(request.cookies, token, request.host, self._wall(), self._tls):
            return True
        authorization = request.headers.get("Authorization")
        return authorization is not None and \
            token_refusal(request.path, authorization, token) is None

    async def _session(self, request: web.BaseRequest) -> web.StreamResponse:
        return _json(200, {"token_required": self._token is not None,
                           "signed_in": self._signed_in(request)})

    async def _login(self, request: web.BaseRequest) -> web.StreamResponse:
        if self._token is None:
            return _json(400, {"error": "this relay has no admin.token_file: there is "
                                        "nothing to sign in to"})
        if not _same_origin(request):
            return _json(403, {"error": "a sign-in from another site's page is refused"})
        body = None
        if (request.content_length or 0) <= LOGIN_BODY_LIMIT:
            body = await _body(request, LOGIN_BODY_LIMIT)
        if body is None:
            return _json(413, {"error": f"the form is over {LOGIN_BODY_LIMIT} bytes"})
        given = parse_qs(body.decode("latin-1"), encoding="latin-1").get("token", [""])[-1]
        token = self._token()
        if not auth.token_matches(given.encode("latin-1"), token):
            return _json(401, {"error": "wrong token: give the one in admin.token_file"})
        response = _json(200, {"signed_in": True})
        response.headers["Set-Cookie"] = auth.session_cookie(token, request.host, self._wall(),
                                                             self._tls)
        return response

    async def _logout(self, request: web.BaseRequest) -> web.StreamResponse:
        if not _same_origin(request):
            return _json(403, {"error": "a sign-out from another site's page is refused"})
        response = _json(200, {"signed_in": False})
        response.headers["Set-Cookie"] = auth.signed_out_cookie(self._tls)
        return response

    # -- what it shows ---------------------------------------------------------------

    async def _data(self, request: web.BaseRequest) -> web.StreamResponse:
        """Everything the page shows but a client's page: readiness, origins,
        cache, snapshot, the page of clients its query asks for, and the
        chart points after ``since`` (Unix time)."""
        params = {key: value for key, value in request.query.items()}
        try:
            query = Query.from_params(params)
            since = _since(params.get("since"))
        except BadQuery as error:
            return _json(400, {"error": str(error)})
        admin = self._admin
        clients = await self._source.clients(query)
        return _json(200, {
            "now": self._wall(),
            "ready": readiness_view(admin.not_ready_reason, admin.ready_detail),
            "origins": origins_view(admin.origins),
            "cache": cache_view(admin.cache),
            "snapshot": self._source.snapshot(),
            "clients": clients.to_json(),
            "history": history_view(self.history, since),
        })

    async def _client(self, request: web.BaseRequest) -> web.StreamResponse:
        """One client's streams: those of node id ``node`` from ``peer``
        (served by ``worker``, with ``--workers``)."""
        query = request.query
        worker_text = query.get("worker", "")
        if worker_text and not worker_text.isdigit():
            return _json(400, {"error": f"worker {worker_text!r}: expected a number"})
        node_id, peer = query.get("node", ""), query.get("peer", "")
        records = await self._source.client(node_id, peer,
                                            int(worker_text) if worker_text else None)
        if not records:
            return _json(404, {"error": "no such client is connected now", "node_id": node_id,
                               "peer": peer})
        return _json(200, {"now": self._wall(), "streams": client_view(records)})

    async def _resource(self, request: web.BaseRequest) -> web.StreamResponse:
        """A cached resource as ``/config_dump`` shows it (secrets redacted)."""
        query = request.query
        type_url, name = query.get("type", ""), query.get("name", "")
        if not type_url or not name:
            return _json(400, {"error": "give the resource's type and name"})
        try:
            dump = self._admin.config_dump(type_url, name)
        except DumpQuery as error:
            return _json(400, {"error": str(error)})
        return _json(200, dump)

    def _file(self, request: web.BaseRequest, name: str) -> web.StreamResponse:
        body, etag = self._files[name]
        headers = {**_SECURITY_HEADERS, "ETag": etag, "Cache-Control": "no-cache"}
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        content_type = _HTML if name == "index.html" else STATIC[name]
        return web.Response(status=200, body=body,
                            headers={**headers, "Content-Type": content_type})


def _package_file(name: str) -> tuple[bytes, str]:
    """A static file's bytes (package data) and its ETag."""
    body = importlib.resources.files("relay.console").joinpath("static", name).read_bytes()
    return body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


async def _body(request: web.BaseRequest, limit: int) -> bytes | None:
    """The request's body, or None when it is longer than ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(limit + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None
    return b"".join(chunks)


def _since(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise BadQuery(f"since {text!r}: expected a Unix time") from None


def _same_origin(request: web.BaseRequest) -> bool:
    """Whether a POST came from a page of this admin server (browsers say
    where in ``Origin``; a client with no ``Origin`` is not a browser's page)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return origin.partition("://")[2] == request.host


def _json(status: int, data: Any) -> web.Response:
    return web.Response(status=status, body=json.dumps(data, separators=(",", ":")).encode(),
                        headers={**_SECURITY_HEADERS, "Content-Type": _JSON,
                                 "Cache-Control": "no-store"})


def _reply(status: int, text: str) -> web.Response:
    return web.Response(status=status, body=text.encode(),
                        headers={**_SECURITY_HEADERS, "Content-Type": _TEXT})


def _not_allowed(method: str, allowed: str) -> web.Response:
    response = _reply(405, f"{method} is not allowed here; use {allowed}\n")
    response.headers["Allow"] = allowed
    return response
