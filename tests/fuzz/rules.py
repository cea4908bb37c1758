"""How the relay must answer what a client sends: the oracle of the fuzz tests.

The contract (issue 14, item 6):

* a request the relay cannot decode ends its stream with INVALID_ARGUMENT;
* a request that breaks the protocol (no type URL on ADS, another type than
  the per-type service's, a type URL the relay does not know) ends it with
  INVALID_ARGUMENT (a name both subscribed and unsubscribed in one delta
  request is left to the relay: the protocol does not call it an error);
* a request over one of the relay's limits (``limits.*``: names per request,
  names per stream, name length, Node size, dynamic parameters per locator,
  request size) ends it with RESOURCE_EXHAUSTED or INVALID_ARGUMENT, and the
  status message names the limit (it contains ``limits.``);
* every stream ended because of what the client sent ends with a non-OK
  status and a non-empty message; a stream of valid requests that the client
  half-closes ends with OK.

Where the contract leaves room (is an empty name valid? does a SotW request
the relay ignores as stale count towards the names of the stream? bytes or
characters?) a request is judged ``maybe``: the relay may take it or refuse
it, but a refusal must still follow the rules above. Each measure is taken in
two ways, a lower bound (certainly counted) and an upper bound (counted by the
most generous reading); only the lower bound over a limit is a certain breach.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import message as pb_message
from google.protobuf import unknown_fields

from relay import xds_types
from relay.config import config_keys, parse_size
from relay.xds_types import WILDCARD

# The types a client may ask for (the relay refuses others, unless configured).
KNOWN_TYPES: tuple[str, ...] = tuple(sorted(getattr(xds_types, "KNOWN_TYPE_URLS",
                                                    xds_types.PUSH_ORDER)))

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
LIMIT_CODES = frozenset({INVALID, EXHAUSTED})

# -- limits ---------------------------------------------------------------------

# The limits (``limits.<kind>`` config keys) a request can break.
LIMIT_KINDS = ("names_per_request", "names_per_stream", "name_length", "node_size",
               "dynamic_parameters", "request_size")


def limit_keys() -> dict[str, str]:
    """Per limit kind the config has a key for, the key's default."""
    defaults = {key.key: key.default for key in config_keys()}
    return {kind: defaults[f"limits.{kind}"] for kind in LIMIT_KINDS
            if f"limits.{kind}" in defaults}


@dataclass(frozen=True)
class Limits:
    """The limits a relay enforces (None: it has none of that kind, or the
    fuzzer could not find its key; no breach of it is generated then)."""

    names_per_request: int | None = None
    names_per_stream: int | None = None
    name_length: int | None = None
    node_size: int | None = None
    dynamic_parameters: int | None = None   # per locator, and per type on the Node
    request_size: int | None = None

    @classmethod
    def defaults(cls) -> Limits:
        """The relay's defaults, for a relay run without a ``limits`` section."""
        values: dict[str, int] = {}
        for kind, default in limit_keys().items():
            try:
                values[kind] = parse_size(default)
            except ValueError:
                continue  # "(none)": unlimited
        return cls(**values)

    def configured(self) -> tuple[Limits, str]:
        """These limits where the config has keys for them, and those keys
        (YAML flow, for :func:`tests.harness.relay_config`'s ``limits``)."""
        keys = limit_keys()
        values = {kind: getattr(self, kind) for kind in keys if getattr(self, kind) is not None}
        return Limits(**values), ", ".join(f"{kind}: {value}" for kind, value in values.items())


# The limits the test relay runs with: small, so that breaches are cheap to send.
TEST_LIMITS = Limits(names_per_request=64, names_per_stream=160, name_length=200,
                     node_size=4096, dynamic_parameters=8, request_size=65536)


# -- judgements -------------------------------------------------------------------


@dataclass(frozen=True)
class Reason:
    """Why a request may or must be refused."""

    what: str
    definite: bool                    # must be refused (else: may be)
    codes: frozenset[grpc.StatusCode] = frozenset({INVALID})
    limit: bool = False               # the status message must name it ("limits.")


@dataclass(frozen=True)
class Judgement:
    """What one request was, for the relay."""

    reasons: tuple[Reason, ...] = ()
    type_url: str | None = None       # the type it is for (None: undecodable)

    @property
    def verdict(self) -> Literal["valid", "maybe", "invalid"]:
        if any(r.definite for r in self.reasons):
            return "invalid"
        return "maybe" if self.reasons else "valid"

    def kinds(self) -> list[str]:
        return [r.what.split(":", 1)[0] for r in self.reasons]


Request = Any  # discovery_pb2.DiscoveryRequest | discovery_pb2.DeltaDiscoveryRequest


def request_class(protocol: str) -> Any:
    return (discovery_pb2.DeltaDiscoveryRequest if protocol == "delta"
            else discovery_pb2.DiscoveryRequest)


def response_class(protocol: str) -> Any:
    return (discovery_pb2.DeltaDiscoveryResponse if protocol == "delta"
            else discovery_pb2.DiscoveryResponse)


def decode(protocol: str, payload: bytes) -> Request | None:
    """The request as the relay decodes it, or None if it cannot be."""
    try:
        decoded: Request = request_class(protocol).FromString(payload)
    except pb_message.DecodeError:
        return None
    return decoded


def _too_many(what: str, low: int, high: int, limit: int | None, key: str) -> Reason | None:
    if limit is None or high <= limit:
        return None
    return Reason(f"limits.{key}: {what} {low if low > limit else high} > {limit}",
                  definite=low > limit, codes=LIMIT_CODES, limit=True)


@dataclass
class _TypeNames:
    """What one type of a stream subscribes to: certainly (``low``) and at most
    (``high``, never forgetting, wildcard included)."""

    low: set[str] = field(default_factory=set)
    high: set[str] = field(default_factory=set)


class StreamOracle:
    """Judges the requests of one stream (or one fetch) in order.

    ``fixed_type_url``: the per-type service's type (None: ADS).
    """

    def __init__(self, protocol: str, fixed_type_url: str | None, limits: Limits,
                 fetch: bool = False) -> None:
        self.protocol = protocol
        self.fixed_type_url = fixed_type_url
        self.limits = limits
        self.fetch = fetch
        self._types: dict[str, _TypeNames] = {}
        self._node_params: dict[str, int] = {}
        self.judgements: list[Judgement] = []

    def judge(self, payload: bytes) -> Judgement:
        request = decode(self.protocol, payload)
        if request is None:
            judgement = Judgement((Reason("undecodable: the bytes are no "
                                          f"{request_class(self.protocol).__name__}", True),))
        else:
            judgement = self._judge(request, len(payload))
        if self.fetch:
            # The contract names no limits for fetches: a fetch over one may be answered.
            judgement = replace(judgement, reasons=tuple(
                replace(r, definite=False) if r.limit else r for r in judgement.reasons))
        self.judgements.append(judgement)
        return judgement

    def _judge(self, request: Request, size: int) -> Judgement:
        reasons: list[Reason] = []
        limits = self.limits
        delta = self.protocol == "delta"
        type_url = self._type_url(request, reasons)
        if unknown_fields.UnknownFieldSet(request):
            reasons.append(Reason("unknown fields: the request has fields its message has not",
                                  definite=False))
        if limits.request_size is not None and size > limits.request_size:
            reasons.append(Reason(f"limits.request_size: {size} bytes > {limits.request_size}",
                                  definite=True, codes=LIMIT_CODES, limit=True))
        if request.HasField("node"):
            node_size = request.node.ByteSize()
            if limits.node_size is not None and node_size > limits.node_size // 2:
                reasons.append(Reason(
                    f"limits.node_size: Node of {node_size} bytes, limit {limits.node_size}",
                    definite=node_size > 2 * limits.node_size, codes=LIMIT_CODES, limit=True))
            self._node_params = {t: len(c.params)
                                 for t, c in request.node.dynamic_parameters.items()}

        if delta:
            lists: list[Sequence[str]] = [
                request.resource_names_subscribe, request.resource_names_unsubscribe,
                [loc.name for loc in request.resource_locators_subscribe],
                [loc.name for loc in request.resource_locators_unsubscribe]]
            subscribed = set(lists[0]) | set(lists[2])
            unsubscribed = set(lists[1]) | set(lists[3])
            if subscribed & unsubscribed:
                reasons.append(Reason(
                    f"subscribe and unsubscribe: {_few(subscribed & unsubscribed)} in both "
                    "(by name and by locator)", definite=False))
            locators = [*request.resource_locators_subscribe,
                        *request.resource_locators_unsubscribe]
        else:
            lists = [request.resource_names, [loc.name for loc in request.resource_locators]]
            subscribed, unsubscribed = set(lists[0]) | set(lists[1]), set()
            locators = list(request.resource_locators)

        for names in lists:
            if len(set(names)) < len(names):
                reasons.append(Reason("duplicate names: a name twice in one list",
                                      definite=False))
                break
        if any(name == "" for names in lists for name in names):
            reasons.append(Reason("empty name: a resource name of no characters",
                                  definite=False))

        # names per request: distinct names of the largest list .. every entry
        low = max((len(set(names) - {WILDCARD}) for names in lists), default=0)
        high = sum(len(names) for names in lists) + (
            len(request.initial_resource_versions) if delta else 0)
        if (reason := _too_many("names per request", low, high, limits.names_per_request,
                                "names_per_request")) is not None:
            reasons.append(reason)

        # name length: characters .. UTF-8 bytes, of any name in the request
        all_names = [name for names in lists for name in names]
        if delta:
            all_names += list(request.initial_resource_versions)
        if limits.name_length is not None and all_names:
            low = max(len(n) for n in subscribed) if subscribed else 0
            high = max(len(n.encode()) for n in all_names)
            if (reason := _too_many("name length", low, high, limits.name_length,
                                    "name_length")) is not None:
                reasons.append(reason)

        # dynamic parameters per locator: its own .. with the node's for the type
        if limits.dynamic_parameters is not None and type_url is not None:
            subscribing = request.resource_locators_subscribe if delta else locators
            low = max([len(loc.dynamic_parameters) for loc in subscribing] +
                      list(self._node_params.values()), default=0)
            high = max([len(loc.dynamic_parameters) for loc in locators], default=0) + \
                self._node_params.get(type_url, 0)
            high = max(high, low)
            if (reason := _too_many("dynamic parameters of a locator (or the Node's, per type)",
                                    low, high, limits.dynamic_parameters,
                                    "dynamic_parameters")) is not None:
                reasons.append(reason)

        # names per stream: the largest type's certain names .. every name ever, all types
        if type_url is not None and not self.fetch:
            state = self._types.get(type_url)
            first = state is None
            if state is None:
                state = self._types[type_url] = _TypeNames()
            before = (set(state.low), set(state.high))
            if delta:
                state.low |= subscribed - {WILDCARD}
                state.low -= unsubscribed
                state.high |= subscribed
            else:
                if first:  # the first SotW request of a type is never ignored as stale
                    state.low = subscribed - {WILDCARD}
                state.high |= subscribed
            low = max(len(s.low) for s in self._types.values())
            high = sum(len(s.high) for s in self._types.values())
            reason = _too_many("names on the stream", low, high, limits.names_per_stream,
                               "names_per_stream")
            if reason is not None:
                reasons.append(reason)
            if any(r.definite for r in reasons):  # refused: changes nothing
                state.low, state.high = before
        return Judgement(tuple(reasons), type_url)

    def _type_url(self, request: Request, reasons: list[Reason]) -> str | None:
        type_url: str = request.type_url
        fixed = self.fixed_type_url
        if fixed is not None:
            if type_url and type_url != fixed:
                reasons.append(Reason(f"wrong type: {type_url[:80]!r} on the service for "
                                      f"{fixed}", definite=True))
                return None
            return fixed
        if not type_url:
            reasons.append(Reason("no type: an ADS request without type_url", definite=True))
            return None
        if type_url not in KNOWN_TYPES:
            reasons.append(Reason(f"unknown type: {type_url[:80]!r}", definite=True))
            return None
        return type_url


def _few(names: Iterable[str]) -> str:
    shown = sorted(names)[:3]
    return ", ".join(repr(n[:40]) for n in shown)


# -- outcomes ---------------------------------------------------------------------

# What a grpc.aio client reports, now and then, instead of the status the server
# sent, when it went on writing after the server ended the stream (a plain
# grpc.aio server aborting a stream shows the same): not the relay's doing.
LOST_STATUS = (grpc.StatusCode.INTERNAL, "Internal error from Core")


@dataclass
class Outcome:
    """How a stream (or fetch) ended, as its client saw it."""

    code: grpc.StatusCode | None          # None: it had not ended in time
    details: str
    ended: Literal["close", "cancel"]     # how the client ended it
    judgements: list[Judgement]
    sent: int                             # requests written before the stream ended
    attempted: int = 0                    # ... and those it tried to write after
    response_types: list[str] = field(default_factory=list)
    undecodable_responses: int = 0


def lost_status(outcome: Outcome) -> bool:
    """Whether the client lost the relay's status to gRPC's race (see
    :data:`LOST_STATUS`): it wrote more after a request the relay may refuse."""
    first = next((i for i, j in enumerate(outcome.judgements) if j.reasons), None)
    return (outcome.code, outcome.details) == LOST_STATUS and first is not None and \
        max(outcome.sent, outcome.attempted) > first + 1


def violations(outcome: Outcome, fetch: bool = False) -> list[str]:
    """The rules the relay broke, in words (empty: it behaved)."""
    broken: list[str] = []
    code, details = outcome.code, outcome.details
    allowed: dict[grpc.StatusCode, list[Reason]] = {}
    definite: tuple[int, Reason] | None = None
    for number, judgement in enumerate(outcome.judgements):
        for reason in judgement.reasons:
            for c in reason.codes:
                allowed.setdefault(c, []).append(reason)
        firm = [r for r in judgement.reasons if r.definite]
        if firm:
            definite = (number, firm[0])
            break
    if fetch and definite is None:
        # A valid fetch may find nothing cached to answer with.
        allowed.setdefault(grpc.StatusCode.UNAVAILABLE, [])
    asked = {j.type_url for j in outcome.judgements if j.type_url is not None}
    strays = sorted(set(outcome.response_types) - asked)
    if strays:
        broken.append(f"responses of types never asked for: {strays}")
    if outcome.undecodable_responses:
        broken.append(f"{outcome.undecodable_responses} responses that do not decode")

    if code is None:
        broken.append("the stream did not end after the client " +
                      ("half-closed it" if outcome.ended == "close" else "cancelled it"))
        return broken
    if outcome.ended == "cancel" and code == grpc.StatusCode.CANCELLED:
        return broken  # the client's own doing; nothing the relay said
    if lost_status(outcome):
        return broken
    if code == grpc.StatusCode.OK:
        if definite is not None:
            number, reason = definite
            broken.append(f"status OK although request {number} was to be refused "
                          f"({reason.what})")
        return broken
    if not details:
        broken.append(f"status {code.name} with no message")
    if code not in allowed:
        expected = sorted({c.name for c in allowed} |
                          ({"OK"} if definite is None and outcome.ended == "close" else set()))
        why = f" (request {definite[0]}: {definite[1].what})" if definite else ""
        broken.append(f"status {code.name} {details[:200]!r}; expected {' or '.join(expected)}"
                      f"{why}")
    elif all(r.limit for r in allowed[code]) and allowed[code] and "limits." not in details:
        broken.append(f"status {code.name} {details[:200]!r} does not name the limit "
                      f"(limits.*): {allowed[code][0].what}")
    return broken
