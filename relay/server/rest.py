"""REST-JSON polling, as Envoy's ``api_type: REST`` subscriptions do it.

A poller POSTs a JSON ``DiscoveryRequest`` to ``/v3/discovery:clusters`` (or
the path of another type: :data:`REST_PATHS`) every ``refresh_delay`` and
gets a JSON ``DiscoveryResponse``, answered from the cache as a SotW stream's
first response would be (see :mod:`relay.server.fetch`, shared with the gRPC
``Fetch*`` methods), or ``304 Not Modified`` with no body when its
``version_info`` is already the version it would get.

Two layers, as in :mod:`relay.admin`. The decisions take no I/O and are
tested directly: :func:`route` (path and method), :func:`decode_request`
(JSON to a request, or what is wrong with it), :func:`reply_for` (a fetch's
outcome as a status, headers and body) and :func:`peer_identity` (a TLS peer
certificate's SPIFFE ID and DNS names). :class:`RestServer` is aiohttp around
them, with the xDS port's TLS (re-read on rotation), mutual TLS and
``server.authorization``, and ``rest.*``'s limits: each body is read within
``body_timeout`` and held within ``max_buffered_body`` (a
:class:`~relay.http_limits.BodyBudget`), the connections within
:func:`relay.web.listen`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypeVar, cast

from aiohttp import web
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, json_format
from google.protobuf.message import DecodeError, Message

from relay.admin import Reply
from relay.authorization import PeerIdentity
from relay.config.models import ServerTLSConfig
from relay.config.values import Address, format_size
from relay.errors import RelayError
from relay.http_limits import DEFAULT_HTTP_LIMITS, BodyBudget, BodyRefusal, HeldBody, HttpLimits
from relay.protocol.limits import MAX_NACK_MESSAGE, ORIGIN_REFUSED, shown
from relay.protocol.sotw import SotwResponsePlan
from relay.redaction import message_class
from relay.resource import CachedResource
from relay.server.fetch import (
    Denied,
    Fetcher,
    FetchOutcome,
    Invalid,
    Limited,
    Served,
    Unavailable,
)
from relay.server.json_fragments import HEARTBEAT, PLAIN, WRAPPED, JsonFragments
from relay.server.plans import encode_plan
from relay.server.pollers import NAMES_LISTED
from relay.server.serving import ServingContext, client_host
from relay.turns import Turn, give_turn, made_in_turns
from relay.web import RETRY_AFTER, FollowedTLS, Listener, listen, quiet_malformed_requests
from relay.xds_types import (
    CLUSTER,
    ENDPOINT,
    LISTENER,
    ROUTE,
    RUNTIME,
    SCOPED_ROUTE,
    SECRET,
    short_name,
)

__all__ = ["RESOURCES_PER_RENDER", "REST_PATHS", "BadRequest", "RestServer", "decode_request",
           "peer_identity", "render_json", "render_json_slices", "reply_for", "route"]

T = TypeVar("T")
log = logging.getLogger("relay.rest")
# aiohttp's own lines (see quiet_malformed_requests)
_http_log = logging.getLogger("relay.rest.http")

#: The paths polled, each with its type: the ``google.api.http`` POST path of
#: each type's ``Fetch*`` method in the xDS protos, which Envoy polls.
REST_PATHS: Mapping[str, str] = {
    "/v3/discovery:clusters": CLUSTER,
    "/v3/discovery:endpoints": ENDPOINT,
    "/v3/discovery:listeners": LISTENER,
    "/v3/discovery:routes": ROUTE,
    "/v3/discovery:scoped-routes": SCOPED_ROUTE,
    "/v3/discovery:secrets": SECRET,
    "/v3/discovery:runtime": RUNTIME,
}
#: Limits that a poll may pass later, as others' subscriptions lapse (429, not 400).
_LIMITS_OF_NOW = frozenset({"streams", "leases_per_host", "upstream_names",
                            "upstream_names_per_host", ORIGIN_REFUSED})
#: How long ``stop`` lets polls in progress finish.
STOP_GRACE = 1.0
#: The status message while the relay drains (as the xDS port's).
DRAINING = "the relay is draining; poll another replica"

_JSON = "application/json"
#: Resources written as JSON between two turns of the event loop (see
#: :func:`render_json_slices`): ``json_format`` takes 20-60 µs a resource
#: (a ClusterLoadAssignment of ~100 bytes), so the first answer of a lease
#: of 5,000 held the loop 115-230 ms in one go, of 50,000 ~1.8 s. 250 took
#: 13-15 ms on a quiet machine and 50-70 on a loaded one (the longest holds
#: of a 50,000-name first poll); 100 take 5-6 (a turn between two slices
#: costs ~20 µs).
RESOURCES_PER_RENDER = 100
#: Resources whose JSON is found written (see :mod:`relay.server.json_fragments`)
#: between two turns: a look-up and a join, ~0.3 µs each.
LOOKUPS_PER_RENDER = 10_000
# DiscoveryResponse's JSON keys in field order, as json_format writes them
_RESPONSE_FIELDS = {field.json_name: field.number
                    for field in discovery_pb2.DiscoveryResponse.DESCRIPTOR.fields}


#: How many answers the REST server keeps to give again to the same poll,
#: and the bytes they hold at most: each its key (a poll's body, up to
#: :data:`BODY_KEPT`; a digest of a longer one) and a slot per resource
#: of its response.
ANSWERS_KEPT = 4096
ANSWERS_SIZE = 32 * 1024 * 1024
BODY_KEPT = 64 * 1024

# A poll as the answers kept know it: its type, the client's certificate
# identity (None: none asked), and its body, or the SHA-256 of a longer one
# (True: a digest).
_AnswerKey: TypeAlias = tuple[str, PeerIdentity | None, bytes, bool]


def _answer_key(type_url: str, identity: PeerIdentity | None, body: bytes) -> _AnswerKey:
    """The key of a poll's answer: the body itself when short (a dict hashes
    it several times faster than a digest is made, and compares it exactly)."""
    if len(body) <= BODY_KEPT:
        return type_url, identity, body, False
    return type_url, identity, hashlib.sha256(body).digest(), True


@dataclass(frozen=True, slots=True)
class _Poll:
    """What the counting and ``/clients`` need of a poll, kept without its body."""

    node_id: str                # shown()
    names: tuple[str, ...]      # the first NAMES_LISTED
    count: int                  # how many names it polls
    version_info: str
    nack: str | None            # its error_detail's message

    @classmethod
    def of(cls, request: Any) -> _Poll:
        names = request.resource_names
        return cls(shown(request.node.id), tuple(names[:NAMES_LISTED]), len(names),
                   request.version_info,
                   request.error_detail.message if request.HasField("error_detail") else None)


@dataclass(frozen=True, slots=True)
class _Answer:
    """A poll answered from an unchanged lease, to answer it again."""

    served: Served
    poll: _Poll
    size: int  # bytes it holds (ANSWERS_SIZE)


class BadRequest(RelayError, ValueError):
    """A body that is not a JSON DiscoveryRequest (400); the message says why."""


class Unrenderable(RelayError, ValueError):
    """A response holding a type no installed module describes: no JSON for it."""


# -- decisions, no I/O --------------------------------------------------------------


def route(method: str, path: str) -> str | Reply:
    """The type URL a request to ``path`` polls, or the 404 or 405 to answer."""
    type_url = REST_PATHS.get(path)
    if type_url is None:
        return Reply(404, f"not found; REST polling is served on {' '.join(REST_PATHS)}\n"
                     .encode())
    if method != "POST":
        return Reply(405, f"{method} is not allowed; POST a JSON DiscoveryRequest\n".encode(),
                     headers={"Allow": "POST"})
    return type_url


def decode_request(body: bytes) -> Any:
    """The ``DiscoveryRequest`` a body holds as JSON; :class:`BadRequest` saying
    what is wrong otherwise (unknown fields are wrong: a typo would be lost)."""
    if not body.strip():
        raise BadRequest("the body is empty: POST a DiscoveryRequest as a JSON object")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as error:  # (UnicodeDecodeError is a ValueError)
        raise BadRequest(f"the body is not JSON: {shown(str(error))}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body is a JSON {_json_kind(data)}, not an object: POST a "
                         f"DiscoveryRequest as a JSON object")
    request = _plain_request(data)
    if request is not None:
        return request
    request = discovery_pb2.DiscoveryRequest()
    try:
        json_format.ParseDict(data, request)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as error:
        raise BadRequest(f"the body is not a DiscoveryRequest: "
                         f"{shown(str(error), MAX_NACK_MESSAGE)}") from None
    return request


# The fields of a poll as Envoy writes them, each with the type its JSON must have.
_PLAIN_STRINGS = {"typeUrl": "type_url", "versionInfo": "version_info",
                  "responseNonce": "response_nonce"}


def _plain_request(data: dict[str, Any]) -> Any:
    """``data`` as a DiscoveryRequest without ``json_format`` walking every
    name (most of a poll's decoding time), when it holds only what a poll
    usually does, well typed: its names, strings and a node (decoded by
    ``json_format``: it is small). None otherwise, for ``json_format`` to
    decode, or to say what is wrong."""
    request = discovery_pb2.DiscoveryRequest()
    try:
        for key, value in data.items():
            if key == "resourceNames":
                if not isinstance(value, list) or \
                        not all(isinstance(name, str) for name in value):
                    return None
                request.resource_names.extend(value)
            elif key in _PLAIN_STRINGS:
                if not isinstance(value, str):
                    return None
                setattr(request, _PLAIN_STRINGS[key], value)
            elif key == "node" and isinstance(value, dict):
                request.node.SetInParent()  # present, even when empty (as json_format has it)
                json_format.ParseDict(value, request.node)
            else:
                return None
    # a string protobuf cannot hold (a lone surrogate), a bad node: json_format says why
    except (json_format.ParseError, ValueError, TypeError, RecursionError):
        return None
    return request


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def render_json(plan: SotwResponsePlan) -> bytes:
    """The JSON of a planned response, without its nonce (a poll is no stream);
    :class:`Unrenderable` for a resource of a type no installed module has."""
    text = _json_of(_response_of(plan), lambda message: json_format.MessageToJson(
        message, indent=None))
    return text.encode() + b"\n"


def render_json_slices(plan: SotwResponsePlan, per_slice: int = RESOURCES_PER_RENDER,
                       fragments: JsonFragments | None = None) -> Generator[None, None, bytes]:
    """:func:`render_json`, the very bytes, pausing (yielding) after each
    ``per_slice`` resources written (and each :data:`LOOKUPS_PER_RENDER`
    looked up in ``fragments``).

    ``json_format`` writes a message as ``json.dumps`` of the dictionary it
    makes of it: here each resource's dictionary is made and dumped on its
    own, a slice at a time (each slice's resources encoded as the whole
    response encodes them: :func:`~relay.server.plans.encode_plan` encodes
    each on its own), and the pieces are joined as ``json.dumps`` joins a
    list's items and a dictionary's keys (``, `` and ``: ``), the resources
    at their field's place among the response's other fields. The whole is
    joined once, as bytes (ASCII: ``json.dumps`` escapes the rest). A
    resource's JSON found in ``fragments`` is taken from there; one written
    is kept there.
    """
    resources = plan.resources
    if not resources or (fragments is None and len(resources) <= per_slice):
        return render_json(plan)
    kinds = _kinds(plan)
    written: list[bytes | None] = []
    pause = False
    for start in range(0, len(resources), LOOKUPS_PER_RENDER):
        batch = resources[start:start + LOOKUPS_PER_RENDER]
        if fragments is None:
            found: list[bytes | None] = [None] * len(batch)
        else:
            if pause:
                yield
            found = fragments.found(batch, kinds and kinds[start:start + LOOKUPS_PER_RENDER])
            pause = False  # (the look-ups go with the first slice written after them)
        missing = [at for at, fragment in enumerate(found, start) if fragment is None]
        written += found
        for first in range(0, len(missing), per_slice):
            if pause:
                yield
            _write(plan, written, missing[first:first + per_slice], kinds, fragments)
            pause = True
        pause = pause or fragments is not None
    return _joined_json(plan, cast(list[bytes], written))


def _kinds(plan: SotwResponsePlan) -> list[int] | None:
    """Which entry of each of ``plan``'s resources it holds (None: each its plain one)."""
    wrapped, heartbeats = plan.wrapped, plan.heartbeats
    if not (wrapped or heartbeats):
        return None
    return [HEARTBEAT if resource.name in heartbeats else
            WRAPPED if resource.name in wrapped else PLAIN for resource in plan.resources]


def _write(plan: SotwResponsePlan, written: list[bytes | None], missing: list[int],
           kinds: list[int] | None, fragments: JsonFragments | None) -> None:
    """Write the JSON of the resources of ``plan`` that ``missing`` places in
    ``written`` (each as the whole response would hold it: the entry of its
    kind, see :func:`_kinds`), keeping each in ``fragments``."""
    resources = plan.resources
    page = _response_of(_plan_of(plan, [resources[at] for at in missing], []))
    for at, body in zip(missing, page.resources, strict=True):
        fragment = json.dumps(_json_of(body, json_format.MessageToDict)).encode()
        written[at] = fragment
        if fragments is not None:
            fragments.made += 1
            fragments.keep(resources[at], PLAIN if kinds is None else kinds[at], fragment)


def _joined_json(plan: SotwResponsePlan, resources: list[bytes]) -> bytes:
    """The JSON of ``plan`` around its resources' (at least one), copied once:
    what comes before them joined to the first, what comes after to the last."""
    head = _json_of(_response_of(_plan_of(plan, [], plan.errors)), json_format.MessageToDict)
    fields = {key: json.dumps(value).encode() for key, value in head.items()}
    before, after = [b"{"], [b"]"]
    pieces = before
    for key in sorted([*fields, "resources"], key=_RESPONSE_FIELDS.__getitem__):
        if pieces is not before or len(before) > 1:
            pieces.append(b", ")
        pieces += [json.dumps(key).encode(), b": "]
        if key == "resources":
            pieces.append(b"[")
            pieces = after
        else:
            pieces.append(fields[key])
    after.append(b"}\n")
    resources[0] = b"".join([*before, resources[0]])
    resources[-1] = b"".join([resources[-1], *after])
    return b", ".join(resources)


def _plan_of(plan: SotwResponsePlan, resources: list[CachedResource],
             errors: list[discovery_pb2.ResourceError]) -> SotwResponsePlan:
    """``plan`` holding ``resources`` and ``errors`` (made afresh, not
    copied: nothing it may carry of its resources' is carried over)."""
    return SotwResponsePlan(plan.type_url, plan.nonce, plan.version_info, resources,
                            plan.wrapped, errors, plan.heartbeats)


def _response_of(plan: SotwResponsePlan) -> discovery_pb2.DiscoveryResponse:
    """The response ``plan`` is, without its nonce (an empty field is left out)."""
    return discovery_pb2.DiscoveryResponse.FromString(
        encode_plan(dataclasses.replace(plan, nonce="")))


def _json_of(message: Message, convert: Callable[[Message], T]) -> T:
    """``convert(message)`` (``json_format``'s), importing the modules of the
    types its ``Any`` fields hold when it needs them; :class:`Unrenderable`
    when it cannot."""
    try:
        return convert(message)
    except TypeError:
        # An Any of a type nothing imported yet (a filter's typed_config): its
        # package's modules are imported, then once more.
        _import_any_types(message)
        try:
            return convert(message)
        except (TypeError, ValueError, DecodeError) as error:
            raise Unrenderable(str(error)) from None
    except (ValueError, DecodeError) as error:  # an Any whose bytes do not parse
        raise Unrenderable(str(error)) from None


def _import_any_types(message: Message) -> None:
    """Import the modules of every type an ``Any`` in ``message`` holds, at any depth."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        values: Iterable[Any]
        if field.message_type.GetOptions().map_entry:
            values = value.values()
        elif isinstance(value, Message):
            values = (value,)
        else:  # repeated
            values = value
        for item in values:
            if not isinstance(item, Message):
                continue  # a map of scalars
            if isinstance(item, any_pb2.Any):
                found = message_class(item.type_url.rsplit("/", 1)[-1])
                if found is not None:
                    with contextlib.suppress(DecodeError):  # MessageToJson will say so
                        _import_any_types(found.FromString(item.value))
            else:
                _import_any_types(item)


def reply_for(outcome: FetchOutcome, version_info: str,
              render: Callable[[Served], bytes] = lambda served: render_json(served.plan)
              ) -> Reply:
    """What to answer a poll carrying ``version_info``: 200 with the JSON
    response (``render`` makes it), 304 with no body when the poller holds that
    version already, or the refusal's status with its message."""
    if isinstance(outcome, Served):
        if _holds(version_info, outcome):
            return Reply(304, b"")
        try:
            return Reply(200, render(outcome), _JSON)
        except Unrenderable as error:
            return Reply(500, f"the relay cannot write this response as JSON ({error}); "
                              f"poll over gRPC (api_type: GRPC)\n".encode())
    message = f"{outcome.message}\n".encode()
    if isinstance(outcome, Denied):
        return Reply(403, message)
    if isinstance(outcome, Invalid):
        return Reply(400, message)
    if isinstance(outcome, Limited):
        if outcome.limit == "request_size":
            return Reply(413, message)
        if outcome.limit in _LIMITS_OF_NOW:  # the relay is full now; it may not be later
            return Reply(429, message, headers={"Retry-After": RETRY_AFTER})
        return Reply(400, message)  # this request will never be taken as it is
    return Reply(503, message, headers={"Retry-After": RETRY_AFTER})


def peer_identity(peercert: Mapping[str, Any] | None) -> PeerIdentity:
    """What a client certificate (``SSLSocket.getpeercert()``'s dict) says it is:
    its SPIFFE ID when it has exactly one URI SAN and that is a SPIFFE ID (as
    gRPC reads it), and its DNS SANs."""
    names = peercert.get("subjectAltName", ()) if peercert else ()
    uris = [value for kind, value in names if kind == "URI"]
    dns = tuple(value for kind, value in names if kind == "DNS")
    spiffe = uris[0] if len(uris) == 1 and _is_spiffe_id(uris[0]) else None
    return PeerIdentity(spiffe, dns)


def _is_spiffe_id(uri: str) -> bool:
    scheme, _, rest = uri.partition("://")
    trust_domain = rest.split("/", 1)[0]
    return scheme.lower() == "spiffe" and bool(trust_domain) and \
        not any(c in trust_domain for c in "@:?#")


# -- the server ---------------------------------------------------------------------


class RestServer:
    """Serves REST polling on one address, for one relay's cache.

    With ``tls`` (``server.tls``), HTTPS with the xDS port's certificate
    (followed through rotation), and with its ``client_ca_file`` every poller
    must present a certificate that chains to it; ``serving.settings.access`` applies
    ``server.authorization`` to the certificate's identity and the request's
    node. ``reuse_port``: the processes of ``--workers`` share the port.
    ``limits``: ``rest.*``'s timeouts, connections and buffered bodies.
    """

    def __init__(self, serving: ServingContext, fetcher: Fetcher, address: Address,
                 tls: ServerTLSConfig | None = None, reuse_port: bool = False,
                 limits: HttpLimits = DEFAULT_HTTP_LIMITS,
                 render_slice: int = RESOURCES_PER_RENDER, turn: Turn = give_turn,
                 fragments: JsonFragments | None = None) -> None:
        """``render_slice``: resources written as JSON between two awaits of
        ``turn`` (what lets the loop serve others; tests count them);
        ``fragments``: the resources' JSON kept for every answer (a table of
        its own by default)."""
        self._serving = serving
        self._render_slice = max(1, render_slice)
        self.fragments = JsonFragments() if fragments is None else fragments
        self._turn = turn
        self._fetcher = fetcher
        self._address = address
        self._tls = tls
        self._reuse_port = reuse_port
        self._limits = limits
        self._budget = BodyBudget(limits.max_buffered_body)
        self._listener: Listener | None = None
        # the latest answers, by poll (see _again), the least recently used first
        self._answers: OrderedDict[_AnswerKey, _Answer] = OrderedDict()
        self._answers_size = 0
        #: polls answered again without being decoded or fetched (tests count them)
        self.answered_again = 0

    @property
    def body_budget(self) -> BodyBudget:
        """The request body bytes held now, all polls together (read-only use)."""
        return self._budget

    async def start(self) -> int:
        """Listen; returns the bound port. ``OSError`` naming the address when it cannot."""
        tls = None if self._tls is None else FollowedTLS(
            self._tls.cert_file, self._tls.key_file, self._tls.client_ca_file,
            "server.tls (for rest.address)", log)
        # The body is read here, within limits.request_size (client_max_size
        # only bounds request.read(), which this never calls). Lines about
        # clients go where the xDS port's go, bounded with them.
        self._listener = await listen(self._handle, "rest", self._address, tls, self._limits,
                                      self._serving.settings.refusal_log, _http_log, STOP_GRACE,
                                      self._reuse_port)
        port = self._listener.port
        scheme = "http" if tls is None else "https"
        mutual = " (mutual TLS)" if tls is not None and tls.mutual else ""
        log.info("serving REST polling on %s://%s:%d%s", scheme, self._address.host, port,
                 mutual)
        return port

    async def stop(self) -> None:
        """Stop listening; polls in progress get ``STOP_GRACE`` to finish. Idempotent."""
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        routed = route(request.method, request.path)
        if isinstance(routed, Reply):
            return _response(routed)
        type_url = routed
        serving = self._serving
        if serving.draining:
            return _response(Reply(503, f"{DRAINING}\n".encode(),
                                   headers={"Retry-After": RETRY_AFTER}), close=True)
        peer = _peer(request)
        access = serving.settings.access
        identity: PeerIdentity | None = None
        if access is not None and access.checks_identity:
            transport = request.transport
            identity = peer_identity(transport.get_extra_info("peercert")
                                     if transport is not None else None)
            error = access.authorizer.connect_error(identity)
            if error is not None:
                access.refused("identity", peer, error)
                return _response(Reply(403, f"{error}\n".encode()))
        held = HeldBody(self._budget, serving.settings.limits.request_size, request.content_length)
        try:
            body = await _read_body(request, held, self._limits.body_timeout)
            if isinstance(body, str):
                return self._unread(peer, body)
            key = _answer_key(type_url, identity, body)
            again = self._again(key, peer)
            if again is None:
                discovery_request = decode_request(body)
        except BadRequest as bad:
            return _response(self._rejected(peer, str(bad)))
        finally:
            held.release()  # decoded, or read no further: the bytes are no longer held
        if again is not None:
            return _response(again)
        outcome = await self._fetcher.fetch(discovery_request, type_url, peer, identity,
                                            f"POST {request.path}")
        if isinstance(outcome, Denied):
            assert access is not None
            access.refused(outcome.reason, peer, outcome.message)
        elif isinstance(outcome, Invalid):
            return _response(self._rejected(peer, outcome.message))
        reply = await self._reply(outcome, discovery_request.version_info)
        poll = _Poll.of(discovery_request)
        self._answered(peer, type_url, poll, outcome, reply.status)
        if isinstance(outcome, Served) and outcome.generation is not None and \
                poll.nack is None and reply.status in (200, 304):
            self._remember(key, _Answer(outcome, poll,
                                        len(key[2]) + 8 * len(outcome.plan.resources)))
        return _response(reply)

    async def _reply(self, outcome: FetchOutcome, version_info: str) -> Reply:
        """:func:`reply_for`, its JSON written a slice at a time (the loop
        serving others between two), once per version for all the pollers
        of a lease."""
        rendered: bytes | Unrenderable = b""
        if isinstance(outcome, Served) and not _holds(version_info, outcome):
            plan, lease = outcome.plan, outcome.lease
            key = (plan.version_info, plan.wrapped)
            try:
                if lease is not None and lease.rendered is not None and \
                        lease.rendered[0] == key and not plan.errors:
                    rendered = lease.rendered[1]
                else:
                    rendered = await made_in_turns(render_json_slices(
                        plan, self._render_slice, self.fragments), self._turn)
                    if lease is not None and not plan.errors:
                        lease.rendered = (key, rendered)
            except Unrenderable as error:
                rendered = error
        return reply_for(outcome, version_info, lambda _: _given(rendered))

    def _again(self, key: _AnswerKey, peer: str) -> Reply | None:
        """The answer to a poll whose body, type and client identity are those
        of a poll answered before, when that answer still stands (its lease
        has seen no change: :meth:`Fetcher.unchanged`, which renews it), as
        a 304 or the JSON already rendered; None: decode and fetch.

        Nothing about the poll is checked again because nothing that the
        checks read differs: the body (its node, names, version), the
        certificate's identity, the settings (fixed for the relay's life).
        The poll is counted and recorded as any other.
        """
        answer = self._answers.get(key)
        if answer is None:
            return None
        served, poll = answer.served, answer.poll
        if not self._fetcher.unchanged(served):
            del self._answers[key]
            self._answers_size -= answer.size
            return None
        plan, lease = served.plan, served.lease
        if poll.version_info and poll.version_info == plan.version_info:
            reply = Reply(304, b"")
        elif lease is not None and lease.rendered is not None and \
                lease.rendered[0] == (plan.version_info, plan.wrapped):
            reply = Reply(200, lease.rendered[1], _JSON)
        else:
            return None  # (the lease renders for pollers of another kind now)
        self._answers.move_to_end(key)
        self.answered_again += 1
        self._answered(peer, key[0], poll, served, reply.status)
        return reply

    def _remember(self, key: _AnswerKey, answer: _Answer) -> None:
        answers = self._answers
        replaced = answers.pop(key, None)
        if replaced is not None:
            self._answers_size -= replaced.size
        answers[key] = answer
        self._answers_size += answer.size
        while len(answers) > ANSWERS_KEPT or self._answers_size > ANSWERS_SIZE:
            _, forgotten = answers.popitem(last=False)
            self._answers_size -= forgotten.size

    def _answered(self, peer: str, type_url: str, poll: _Poll, outcome: FetchOutcome,
                  status: int) -> None:
        """Count, log (a NACK, rate-limited as a stream's) and record (for
        /clients) a poll answered with ``status``."""
        serving, short = self._serving, short_name(type_url)
        nack = poll.nack
        if nack is not None:
            # The poller rejected the version it was sent (and polls with the one it holds).
            serving.metrics.downstream_nacks.add("rest", short)
            serving.warn_limited(peer, f"nack {type_url}",
                                 "NACK from node=%r peer=%s type=%s version=%s: %s",
                                 poll.node_id, peer, short,
                                 shown(poll.version_info), shown(nack, MAX_NACK_MESSAGE))
        if status == 200:
            serving.metrics.push("rest", type_url)
        elif status == 304 and nack is None:
            # The poller holds the current version: what a SotW client's ACK says.
            serving.metrics.downstream_acks.add("rest", short)
        host = client_host(peer)
        if host is not None and isinstance(outcome, Served | Unavailable):
            serving.pollers.polled(
                poll.node_id, host, type_url, poll.names, poll.version_info, status,
                lease=self._fetcher.lease, count=poll.count,
                sent=outcome.plan.version_info if isinstance(outcome, Served) else None,
                nack=None if nack is None else shown(nack, MAX_NACK_MESSAGE))

    def _unread(self, peer: str, why: _Unread) -> web.Response:
        """Answer (and close) a poll whose body was read no further, saying why."""
        serving = self._serving
        if why == "lost":  # nobody is there to read an answer
            log.debug("REST poll from %s: the client left before its whole body came", peer)
            return _response(Reply(400, b""), close=True)
        if why == "malformed":
            return _response(self._rejected(
                peer, "the body is not framed as its headers say (Content-Length or chunks)"),
                close=True)
        if why == "request_size":
            limit = serving.settings.limits.request_size
            message = (f"a request of more than {limit} bytes; the relay takes requests of at "
                       f"most {limit} (limits.request_size)")
            serving.metrics.downstream_limited.add(1, {"limit": "request_size"})
            serving.warn_limited(peer, "request_size", "refusing REST poll from %s: %s", peer,
                                 message)
            return _response(Reply(413, f"{message}\n".encode()), close=True)
        if why == "max_buffered_body":
            reply = Reply(503, f"the relay holds as many request bodies as it may at once "
                               f"({format_size(self._limits.max_buffered_body)}, "
                               f"rest.max_buffered_body); retry\n".encode(),
                          headers={"Retry-After": RETRY_AFTER})
        else:
            reply = Reply(408, f"the body took more than {self._limits.body_timeout:g}s to "
                               f"come (rest.body_timeout)\n".encode())
        serving.warn_limited(peer, f"rest.{why}", "refusing REST poll from %s: %s", peer,
                             reply.body.decode().rstrip())
        return _response(reply, close=True)

    def _rejected(self, peer: str, message: str) -> Reply:
        """Count, log (rate-limited) and answer a poll that breaks the protocol."""
        self._serving.metrics.downstream_rejected.add(1, {"protocol": "rest"})
        self._serving.warn_limited(peer, "invalid", "rejecting REST poll from %s: %s", peer,
                                   message)
        return Reply(400, f"{message}\n".encode())


def _holds(version_info: str, served: Served) -> bool:
    """Whether a poll carrying ``version_info`` holds the version ``served`` (304)."""
    return bool(version_info) and version_info == served.plan.version_info


def _given(rendered: bytes | Unrenderable) -> bytes:
    """What :meth:`RestServer._reply` rendered, for :func:`reply_for` (which
    answers :class:`Unrenderable` with a 500)."""
    if isinstance(rendered, Unrenderable):
        raise rendered
    return rendered


def _response(reply: Reply, close: bool = False) -> web.Response:
    headers = dict(reply.headers)
    if reply.status != 304:
        headers["Content-Type"] = reply.content_type
    response = web.Response(status=reply.status, body=reply.body or None, headers=headers)
    if close:
        response.force_close()
    return response


#: Why a body was read no further: refused (:data:`BodyRefusal`), too slow
#: (``rest.body_timeout``), the client gone, or framed unlike its headers say.
_Unread = BodyRefusal | Literal["body_timeout", "lost", "malformed"]


async def _read_body(request: web.BaseRequest, held: HeldBody, timeout: float
                     ) -> bytes | _Unread:
    """The request's body, held in ``held`` as it comes, within ``timeout``
    seconds; or why it was read no further (the caller releases ``held``)."""
    refused = held.check()
    if refused is not None:
        return refused
    if request.version >= (1, 1) and \
            request.headers.get("Expect", "").lower() == "100-continue" and \
            request.transport is not None:
        # The client waits for this before sending its body (curl does past 1 MiB).
        request.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    content = request.content
    try:
        if content.is_eof():
            # The whole body came with the headers (a poll's usually does):
            # taken at once, with no timer to start and stop.
            refused = held.add(content.read_nowait())
            if refused is not None:
                return refused
        else:
            async with asyncio.timeout(timeout):
                async for chunk in content.iter_any():
                    refused = held.add(chunk)
                    if refused is not None:
                        return refused
    except TimeoutError:
        return "body_timeout"
    except ConnectionError:
        return "lost"
    except web.RequestPayloadError:
        return "malformed"
    return held.body()


def _peer(request: web.BaseRequest) -> str:
    """The client's address as gRPC writes a peer (``ipv4:10.0.0.7:41000``)."""
    transport = request.transport
    peername = transport.get_extra_info("peername") if transport is not None else None
    if not peername:
        return "unknown"
    host, port = peername[0], peername[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


quiet_malformed_requests(_http_log, log)
