"""Admin HTTP endpoints: ``/ready``, ``/healthz``, ``/config_dump``, ``/clients``, ``/metrics``.

A deliberately small HTTP/1.1 server on asyncio streams: GET only, one
request per connection. It serves operators and probes, not traffic.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from google.protobuf import json_format
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from relay.cache import ResourceCache
from relay.config import AdminConfig
from relay.xds_types import message_class, short_name

log = logging.getLogger("relay.admin")


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable",
            400: "Bad Request"}


class AdminServer:
    """Serves the admin endpoints for one relay."""

    def __init__(self, cache: ResourceCache, registry: CollectorRegistry | None,
                 not_ready_reason: Callable[[], str | None],
                 clients: Callable[[], list[dict[str, Any]]] = list,
                 ready_detail: Callable[[], str] | None = None) -> None:
        self.cache = cache
        self.ready_detail = ready_detail
        self.registry = registry
        self.not_ready_reason = not_ready_reason
        self.clients = clients
        self._server: asyncio.Server | None = None

    async def start(self, config: AdminConfig) -> int:
        """Listen where ``config`` says; returns the bound port."""
        self._server = await asyncio.start_server(self._handle, config.address.host,
                                                  config.address.port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def respond(self, method: str, target: str) -> Reply:
        """The reply for one request: :meth:`route`'s, unless a subclass must
        ask elsewhere first (the hub of ``--workers`` asks its workers)."""
        return self.route(method, target)

    def route(self, method: str, target: str) -> Reply:
        """The reply for one request (no I/O; tested directly)."""
        if method != "GET":
            return Reply(405, b"only GET is supported\n")
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path == "/healthz":
            return Reply(200, b"ok\n")
        if url.path == "/ready":
            reason = self.not_ready_reason()
            if reason is not None:
                return Reply(503, f"not ready: {reason}\n".encode())
            detail = f": {self.ready_detail()}" if self.ready_detail is not None else ""
            return Reply(200, f"ready{detail}\n".encode())
        if url.path == "/clients":
            return Reply(200, json.dumps({"clients": self.clients()}, indent=2).encode() + b"\n",
                         "application/json")
        if url.path == "/config_dump":
            body = json.dumps(self.config_dump(query.get("type"), query.get("name")), indent=2)
            return Reply(200, body.encode() + b"\n", "application/json")
        if url.path == "/metrics" and self.registry is not None:
            return Reply(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        return Reply(404, b"not found\n")

    def config_dump(self, type_filter: str | None, name_filter: str | None) -> dict[str, Any]:
        """Cached resources with versions and variants, optionally filtered.

        ``type_filter`` is a type URL, a full message name or a short one
        (``Cluster``); ``name_filter`` an exact resource name.
        """
        types: dict[str, Any] = {}
        for type_url in self.cache.type_urls():
            if type_filter and type_filter not in (type_url, type_url.rsplit("/", 1)[-1],
                                                   short_name(type_url)):
                continue
            entries = []
            for resource in sorted(self.cache.resources(type_url),
                                   key=lambda r: (r.name, r.variant_key)):
                if name_filter and resource.name != name_filter:
                    continue
                entry: dict[str, Any] = {"name": resource.name, "version": resource.version}
                if resource.variant_key:
                    entry["variant"] = resource.variant_key
                body_class = message_class(type_url)
                if body_class is not None:
                    entry["resource"] = json_format.MessageToDict(
                        body_class.FromString(resource.body.value))
                entries.append(entry)
            types[type_url] = {"synced": self.cache.is_synced(type_url), "resources": entries}
        return {"types": types}

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            reply = await self.respond(parts[0], parts[1]) if len(parts) >= 2 else \
                Reply(400, b"bad request\n")
            head = (f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, '')}\r\n"
                    f"Content-Type: {reply.content_type}\r\n"
                    f"Content-Length: {len(reply.body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + reply.body)
            await writer.drain()
        except (TimeoutError, ConnectionError) as error:
            log.debug("admin connection dropped: %s", error)
        finally:
            writer.close()
