"""Hypothesis strategies for what xDS clients send a relay.

A :class:`Case` is one client: the method it calls (ADS or a per-type
service, SotW or delta, a stream or a fetch), the requests it sends in order
(:class:`Step`), and how it ends (half-close or cancel). Requests are valid
(known type URLs, plausible names, a Node with metadata and dynamic
parameters, nonces taken from the responses received or made up, NACKs) or
not (unknown or missing type URLs, a name subscribed and unsubscribed at once,
empty and duplicate names, breaches of the relay's limits, bytes that are no
request at all).

A step may take its nonce from a response the client has received
(``answer``): it is resolved when the step is sent, so a case stays a plain
value that Hypothesis can print and shrink, and :meth:`Case.to_json` /
:meth:`Case.from_json` carry it to a replay.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2
from hypothesis import strategies as st

from relay.protocol.session import SUPPORTS_RESOURCE_IN_SOTW
from relay.xds_types import (
    ADS_SERVICE,
    CLUSTER,
    ENDPOINT,
    LISTENER,
    PER_TYPE_SERVICES,
    ROUTE,
    WILDCARD,
)
from tests.fuzz.rules import KNOWN_TYPES, Limits, decode, request_class

# -- methods ------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """A discovery method a client calls."""

    path: str                          # "/package.Service/Method"
    protocol: Literal["sotw", "delta"]
    type_url: str | None = None        # the per-type service's type (None: ADS)
    fetch: bool = False                # unary REST-style fetch (SotW)

    def __repr__(self) -> str:
        return f"Method({self.path!r})"


ADS_SOTW = Method(f"/{ADS_SERVICE}/StreamAggregatedResources", "sotw")
ADS_DELTA = Method(f"/{ADS_SERVICE}/DeltaAggregatedResources", "delta")


def _all_methods() -> tuple[Method, ...]:
    methods = [ADS_SOTW, ADS_DELTA]
    for service in PER_TYPE_SERVICES:
        if service.sotw_method:
            methods.append(Method(f"/{service.service}/{service.sotw_method}", "sotw",
                                  service.type_url))
        if service.delta_method:
            methods.append(Method(f"/{service.service}/{service.delta_method}", "delta",
                                  service.type_url))
        if service.fetch_method:
            methods.append(Method(f"/{service.service}/{service.fetch_method}", "sotw",
                                  service.type_url, fetch=True))
    return tuple(methods)


METHODS = _all_methods()
METHODS_BY_PATH = {m.path: m for m in METHODS}
STREAM_METHODS = tuple(m for m in METHODS if not m.fetch)
FETCH_METHODS = tuple(m for m in METHODS if m.fetch)


def methods(fetch: bool = True) -> st.SearchStrategy[Method]:
    """A method to call; ADS twice as often as any one per-type method."""
    streams = st.sampled_from(STREAM_METHODS)
    ads = st.sampled_from((ADS_SOTW, ADS_DELTA))
    choices = [ads, streams]
    if fetch:
        choices.append(st.sampled_from(FETCH_METHODS))
    return st.one_of(*choices)


# -- what the fuzz origin holds -------------------------------------------------------

# The resources the origin of a fuzz run holds, by type (see tests/fuzz/driver.py);
# WATCHED is the ClusterLoadAssignment the watchers follow.
WATCHED = "watched"
ORIGIN_NAMES: dict[str, tuple[str, ...]] = {
    CLUSTER: ("a", "b"),
    ENDPOINT: (WATCHED, "a", "b"),
    LISTENER: ("l1",),
    ROUTE: ("r1",),
}
PLAUSIBLE_NAMES = (WATCHED, "a", "b", "l1", "r1", "missing", WILDCARD,
                   "xdstp://fuzz/envoy.config.cluster.v3.Cluster/a", "routes/host.example:80")

# -- steps and cases --------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Step:
    """One request: a message, or raw bytes that may not be one.

    ``answer``: before sending, take ``response_nonce`` (and SotW's
    ``version_info``) from the ``answer``-th newest response received of the
    request's type (0: the newest), if there is one. ``wait``: let a response
    arrive (briefly) before the next step.
    """

    request: Any = None               # DiscoveryRequest | DeltaDiscoveryRequest
    raw: bytes | None = None
    answer: int | None = None
    wait: bool = False
    label: str = "valid"              # what the generator meant it to be

    def payload(self, responses: Sequence[tuple[str, str, str]]) -> bytes:
        """The bytes to send, given the (type_url, nonce, version_info) received so far."""
        if self.raw is not None:
            return self.raw
        request = self.request
        if self.answer is not None and responses:
            of_type = [r for r in responses if not request.type_url or r[0] == request.type_url]
            if len(of_type) > self.answer:
                _, nonce, version = of_type[-1 - self.answer]
                request = type(request)()
                request.CopyFrom(self.request)
                request.response_nonce = nonce
                if isinstance(request, discovery_pb2.DiscoveryRequest):
                    request.version_info = version
        return bytes(request.SerializeToString())

    def __repr__(self) -> str:
        extra = "".join([f", answer={self.answer}" if self.answer is not None else "",
                         ", wait=True" if self.wait else ""])
        if self.raw is not None:
            shown = self.raw[:48].hex() + ("..." if len(self.raw) > 48 else "")
            return f"Step[{self.label}](raw={len(self.raw)}B {shown}{extra})"
        return f"Step[{self.label}]({describe(self.request)}{extra})"


@dataclass(frozen=True, eq=False)
class Case:
    """One client of the relay: what it calls, sends, and how it ends."""

    method: Method
    steps: tuple[Step, ...]
    ending: Literal["close", "cancel"] = "close"

    def __repr__(self) -> str:
        steps = "".join(f"\n    {step!r}," for step in self.steps)
        return f"Case({self.method!r}, ending={self.ending!r}, steps=[{steps}\n])"

    def to_json(self) -> str:
        """The case as JSON, for :meth:`from_json` (a reproducible example)."""
        return json.dumps({
            "method": self.method.path, "ending": self.ending,
            "steps": [{"bytes": (s.raw if s.raw is not None
                                 else s.request.SerializeToString()).hex(),
                       "raw": s.raw is not None, "answer": s.answer, "wait": s.wait,
                       "label": s.label} for s in self.steps]})

    @classmethod
    def from_json(cls, text: str) -> Case:
        data = json.loads(text)
        method = METHODS_BY_PATH[data["method"]]
        steps = []
        for s in data["steps"]:
            payload = bytes.fromhex(s["bytes"])
            if s["raw"]:
                steps.append(Step(raw=payload, answer=s["answer"], wait=s["wait"],
                                  label=s["label"]))
            else:
                steps.append(Step(request_class(method.protocol).FromString(payload),
                                  answer=s["answer"], wait=s["wait"], label=s["label"]))
        return cls(method, tuple(steps), data["ending"])


def describe(request: Any) -> str:
    """A request in one line, long lists and strings cut short."""
    parts = []
    for descriptor, value in request.ListFields():
        name = descriptor.name
        if name == "node":
            parts.append(f"node=<{value.ByteSize()}B id={value.id[:20]!r} "
                         f"params={len(value.dynamic_parameters)}>")
        elif name == "error_detail":
            parts.append(f"error_detail=<code={value.code} message={_cut(value.message)}>")
        elif name in ("resource_locators", "resource_locators_subscribe",
                      "resource_locators_unsubscribe"):
            parts.append(f"{name}=[{', '.join(_locator(loc) for loc in value[:4])}"
                         f"{', ...' if len(value) > 4 else ''}]({len(value)})")
        elif name == "initial_resource_versions":
            parts.append(f"{name}={{{len(value)} names}}")
        elif isinstance(value, str):
            parts.append(f"{name}={_cut(value)}")
        else:
            names = list(value)
            shown = ", ".join(_cut(n) for n in names[:4])
            parts.append(f"{name}=[{shown}{', ...' if len(names) > 4 else ''}]({len(names)})")
    return f"{type(request).__name__}({', '.join(parts)})"


def _cut(text: str, length: int = 40) -> str:
    return repr(text) if len(text) <= length else f"{text[:length]!r}...({len(text)} chars)"


def _locator(loc: discovery_pb2.ResourceLocator) -> str:
    return f"{_cut(loc.name)}<{len(loc.dynamic_parameters)} params>"


# -- parts of requests ----------------------------------------------------------------------

_SHORT = st.text(max_size=12)
_ASCII = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_./:", min_size=1, max_size=16)


def names() -> st.SearchStrategy[str]:
    """A resource name: mostly ones the origin has, or plausible; sometimes any text."""
    return st.one_of(st.sampled_from(PLAUSIBLE_NAMES), st.sampled_from(PLAUSIBLE_NAMES),
                     _ASCII, st.text(min_size=1, max_size=24))


def name_lists(max_size: int = 5) -> st.SearchStrategy[list[str]]:
    return st.lists(names(), max_size=max_size, unique=True)


def params() -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(("zone", "version", "shard", "k")), _SHORT,
                           max_size=2)


def locators(excluding: Sequence[str] = (), max_size: int = 2
             ) -> st.SearchStrategy[list[discovery_pb2.ResourceLocator]]:
    return st.lists(st.builds(
        lambda name, p: discovery_pb2.ResourceLocator(name=name, dynamic_parameters=p),
        names().filter(lambda n: n not in excluding), params()),
        max_size=max_size, unique_by=lambda loc: loc.name)


@st.composite
def nodes(draw: st.DrawFn) -> base_pb2.Node:
    """A small Node: id, cluster, metadata, locality, client features, and
    dynamic parameters for a few types."""
    node = base_pb2.Node(id=draw(_SHORT), cluster=draw(_SHORT),
                         user_agent_name=draw(st.sampled_from(("envoy", "grpc-go", ""))))
    metadata = draw(st.dictionaries(_SHORT, st.one_of(
        _SHORT, st.integers(-1000, 1000), st.booleans(), st.none()), max_size=3))
    if metadata:
        node.metadata.update(metadata)
    if draw(st.booleans()):
        node.locality.region = draw(_SHORT)
        node.locality.zone = draw(_SHORT)
    node.client_features.extend(draw(st.lists(st.sampled_from(
        (SUPPORTS_RESOURCE_IN_SOTW, "xds.config.resource-ttl",
         "envoy.lb.does_not_support_overprovisioning")), max_size=2, unique=True)))
    for type_url in draw(st.lists(st.sampled_from(KNOWN_TYPES), max_size=2, unique=True)):
        node.dynamic_parameters[type_url].params.update(draw(params()))
    return node


def nonces() -> st.SearchStrategy[str]:
    return st.one_of(st.just(""), st.sampled_from(("1", "2", "n1", "o1")), _SHORT)


def error_details() -> st.SearchStrategy[status_pb2.Status | None]:
    return st.one_of(st.none(), st.builds(
        lambda code, message: status_pb2.Status(code=code, message=message),
        st.integers(0, 16), st.text(max_size=40)))


def type_urls(method: Method) -> st.SearchStrategy[str]:
    """A valid type URL for the method: a known one on ADS; the service's own,
    or none, on a per-type service."""
    if method.type_url is None:
        return st.sampled_from(KNOWN_TYPES)
    return st.sampled_from(("", method.type_url))


# -- valid requests -----------------------------------------------------------------------


@st.composite
def valid_requests(draw: st.DrawFn, method: Method, first: bool = False,
                   type_url: str | None = None) -> Step:
    """A request the relay must take: known type, plausible names, maybe a Node
    (more likely first), a nonce made up or taken from a response, maybe a NACK."""
    if type_url is None:
        type_url = draw(type_urls(method))
    with_node = draw(st.booleans()) if first else draw(st.integers(0, 9)) == 0
    node = draw(nodes()) if with_node else None
    error = draw(error_details()) if draw(st.integers(0, 3)) == 0 else None
    answer = draw(st.one_of(st.none(), st.integers(0, 2)))
    nonce = draw(nonces())
    if method.protocol == "delta":
        subscribe = draw(name_lists())
        unsubscribe = draw(name_lists(3).map(lambda ns: [n for n in ns if n not in subscribe]))
        taken = subscribe + unsubscribe
        locs = draw(locators(excluding=taken)) if draw(st.integers(0, 3)) == 0 else []
        taken += [loc.name for loc in locs]
        unlocs = draw(locators(excluding=taken, max_size=1)) \
            if draw(st.integers(0, 5)) == 0 else []
        initial = draw(st.dictionaries(st.sampled_from(PLAUSIBLE_NAMES[:5]), _SHORT,
                                       max_size=2)) if first else {}
        request = discovery_pb2.DeltaDiscoveryRequest(
            type_url=type_url, resource_names_subscribe=subscribe,
            resource_names_unsubscribe=unsubscribe, resource_locators_subscribe=locs,
            resource_locators_unsubscribe=unlocs, initial_resource_versions=initial,
            response_nonce=nonce)
    else:
        resource_names = draw(name_lists())
        locs = draw(locators(excluding=resource_names)) if draw(st.integers(0, 3)) == 0 else []
        request = discovery_pb2.DiscoveryRequest(
            type_url=type_url, resource_names=resource_names, resource_locators=locs,
            response_nonce=nonce, version_info=draw(st.one_of(st.just(""), _SHORT)))
    # (a per-type service's request may leave its type out: the method's is meant)
    _xdstp_names_of_its_type(request, type_url or method.type_url or "")
    if node is not None:
        request.node.CopyFrom(node)
    if error is not None:
        request.error_detail.CopyFrom(error)
    return Step(request, answer=answer, wait=draw(st.integers(0, 3)) == 0)


def _xdstp_names_of_its_type(request: Any, type_url: str) -> None:
    """Make a valid request's xdstp names well-formed names of its own type
    (TP1: the relay refuses another type's name, a malformed one, and a glob
    over SotW), each once in the request."""
    typed = f"xdstp://fuzz/{type_url.rpartition('/')[2]}/a" if type_url else "missing"

    def fixed(name: str) -> str:
        return typed if name.startswith("xdstp:") else name

    seen: set[str] = set()

    def once(field: Any) -> None:
        kept = [n for n in map(fixed, field) if not (n in seen or seen.add(n))]  # type: ignore[func-returns-value]
        del field[:]
        field.extend(kept)

    if isinstance(request, discovery_pb2.DeltaDiscoveryRequest):
        once(request.resource_names_subscribe)
        once(request.resource_names_unsubscribe)
        locator_fields = (request.resource_locators_subscribe,
                          request.resource_locators_unsubscribe)
    else:
        once(request.resource_names)
        locator_fields = (request.resource_locators,)
    for field in locator_fields:
        kept = []
        for locator in field:
            locator.name = fixed(locator.name)
            if locator.name not in seen:
                seen.add(locator.name)
                kept.append(locator)
        kept = [discovery_pb2.ResourceLocator(name=loc.name,
                                              dynamic_parameters=dict(loc.dynamic_parameters))
                for loc in kept]
        del field[:]
        field.extend(kept)


# -- invalid requests ------------------------------------------------------------------------

# Sizes used for a limit the relay is not known to have: large, to stress it.
STRESS = Limits(names_per_request=300, names_per_stream=600, name_length=4096,
                node_size=16384, dynamic_parameters=40, request_size=262144)

# The largest request sent (gRPC servers refuse more than their receive limit).
MAX_PAYLOAD = 8 * 1024 * 1024


def _set_names(request: Any, names: list[str]) -> None:
    field = "resource_names_subscribe" if isinstance(
        request, discovery_pb2.DeltaDiscoveryRequest) else "resource_names"
    del getattr(request, field)[:]
    getattr(request, field).extend(names)


def _limit(limits: Limits, kind: str) -> tuple[int, bool]:
    """The limit of ``kind`` and whether the relay enforces it (else a stress size)."""
    value = getattr(limits, kind)
    return (value, True) if value is not None else (getattr(STRESS, kind), False)


def invalid_kinds(method: Method) -> list[str]:
    kinds = ["unknown_type", "empty_name", "duplicate_names", "too_many_names", "long_name",
             "big_node", "many_params", "many_node_params", "big_request", "names_at_limit",
             "name_at_limit"]
    kinds.append("no_type" if method.type_url is None else "wrong_type")
    if method.protocol == "delta":
        kinds += ["subscribe_and_unsubscribe", "too_many_stream_names"]
    return kinds


@st.composite
def invalid_steps(draw: st.DrawFn, method: Method, limits: Limits) -> list[Step]:
    """One request the relay must (or may) refuse, made from a valid one; or,
    for the names of a stream, a run of requests that together go over."""
    kind = draw(st.sampled_from(invalid_kinds(method)))
    base = draw(valid_requests(method))
    request = base.request
    delta = method.protocol == "delta"
    if kind == "unknown_type":
        request.type_url = draw(st.one_of(
            st.text(min_size=1, max_size=60),
            st.sampled_from(("type.googleapis.com/envoy.config.foo.v3.Bar",
                             "type.googleapis.com/google.protobuf.Empty",
                             "envoy.config.cluster.v3.Cluster",
                             "type.googleapis.com/envoy.api.v2.Cluster"))).filter(
            lambda t: t not in KNOWN_TYPES and t != (method.type_url or "")))
    elif kind == "no_type":
        request.type_url = ""
    elif kind == "wrong_type":
        request.type_url = draw(st.sampled_from(
            [t for t in KNOWN_TYPES if t != method.type_url]))
    elif kind == "subscribe_and_unsubscribe":
        both = draw(st.lists(names(), min_size=1, max_size=3, unique=True))
        request.resource_names_subscribe.extend(
            n for n in both if n not in request.resource_names_subscribe)
        request.resource_names_unsubscribe.extend(
            n for n in both if n not in request.resource_names_unsubscribe)
    elif kind == "empty_name":
        _set_names(request, [*draw(name_lists(2)), ""])
    elif kind == "duplicate_names":
        name = draw(names())
        _set_names(request, [name, *draw(name_lists(2)), name])
    elif kind in ("too_many_names", "names_at_limit"):
        limit, _ = _limit(limits, "names_per_request")
        count = limit + draw(st.integers(1, 3)) if kind == "too_many_names" else limit
        _set_names(request, [f"n{i}" for i in range(count)])
    elif kind in ("long_name", "name_at_limit"):
        limit, _ = _limit(limits, "name_length")
        length = limit + draw(st.integers(1, 64)) if kind == "long_name" else limit
        _set_names(request, [*draw(name_lists(2)), "x" * length])
    elif kind == "big_node":
        limit, _ = _limit(limits, "node_size")
        request.node.id = draw(_SHORT)
        request.node.metadata.update({"blob": "m" * (2 * limit + draw(st.integers(1, 512)))})
    elif kind == "many_params":
        limit, _ = _limit(limits, "dynamic_parameters")
        count = limit + draw(st.integers(1, 3))
        loc = discovery_pb2.ResourceLocator(
            name=draw(names().filter(lambda n: n != WILDCARD)),
            dynamic_parameters={f"p{i}": str(i) for i in range(count)})
        (request.resource_locators_subscribe if delta else request.resource_locators).append(loc)
    elif kind == "many_node_params":
        limit, _ = _limit(limits, "dynamic_parameters")
        count = limit + draw(st.integers(1, 3))
        request.node.id = draw(_SHORT)
        params = request.node.dynamic_parameters[draw(st.sampled_from(KNOWN_TYPES))].params
        params.update({f"p{i}": str(i) for i in range(count)})
    elif kind == "big_request":
        limit, _ = _limit(limits, "request_size")
        size = min(limit + draw(st.integers(1, 1024)), MAX_PAYLOAD)
        request.error_detail.code = 3
        request.error_detail.message = "e" * max(size - request.ByteSize(), 0)
    elif kind == "too_many_stream_names":
        per_stream, _ = _limit(limits, "names_per_stream")
        per_request = min(_limit(limits, "names_per_request")[0], 500)
        type_url = request.type_url
        steps, start = [], 0
        while start <= per_stream:
            count = min(per_request, per_stream + 1 - start)
            steps.append(Step(discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url,
                resource_names_subscribe=[f"s{i}" for i in range(start, start + count)]),
                label=kind))
            start += count
        return steps
    return [Step(request, answer=base.answer, wait=base.wait, label=kind)]


# -- bytes that may be no request -------------------------------------------------------------


@st.composite
def raw_payloads(draw: st.DrawFn, method: Method) -> Step:
    """Bytes: random, truncated or extended requests, the other protocol's
    request, or bytes sure to be corrupt. They may decode (then they are
    judged as the request they decode to)."""
    kind = draw(st.sampled_from(("random", "truncated", "appended", "other_protocol",
                                 "corrupt")))
    valid = draw(valid_requests(method)).request.SerializeToString()
    if kind == "random":
        payload = draw(st.binary(min_size=1, max_size=64))
    elif kind == "truncated" and len(valid) > 1:
        payload = valid[:draw(st.integers(1, len(valid) - 1))]
    elif kind == "appended":
        payload = valid + draw(st.binary(min_size=1, max_size=16))
    elif kind == "other_protocol":
        other = Method(method.path, "sotw" if method.protocol == "delta" else "delta",
                       method.type_url)
        payload = draw(valid_requests(other)).request.SerializeToString()
    else:
        # a field number 0, a length past the end, or bad UTF-8 in type_url
        payload = draw(st.sampled_from((b"\x00", b"\x12\x7f", b"\xff\xff\xff\xff\x0f"))) + \
            draw(st.binary(max_size=16))
    return Step(raw=payload, label=f"raw_{kind}")


def undecodable_payloads(method: Method) -> st.SearchStrategy[Step]:
    """Bytes the relay cannot decode as the method's request."""
    return raw_payloads(method).filter(
        lambda step: decode(method.protocol, step.raw or b"") is None)


# -- cases -----------------------------------------------------------------------------------

Mix = Literal["valid", "invalid", "undecodable", "any"]


@st.composite
def cases(draw: st.DrawFn, limits: Limits, mix: Mix = "any",
          method: st.SearchStrategy[Method] | None = None) -> Case:
    """A client: a method, 1-5 valid requests (a fetch: one), and for
    ``invalid`` / ``undecodable`` one bad request somewhere among them; ``any``
    mixes every kind of request freely."""
    chosen = draw(method if method is not None else methods())
    count = 1 if chosen.fetch else draw(st.integers(1, 5))
    steps: list[Step] = []
    for number in range(count):
        if mix == "any" and draw(st.integers(0, 3)) == 0:
            steps += draw(st.one_of(invalid_steps(chosen, limits),
                                    raw_payloads(chosen).map(lambda s: [s])))
        else:
            steps.append(draw(valid_requests(chosen, first=number == 0)))
    if mix in ("invalid", "undecodable"):
        bad = draw(invalid_steps(chosen, limits)) if mix == "invalid" else \
            [draw(undecodable_payloads(chosen))]
        if chosen.fetch:
            steps = bad[:1]
        else:
            position = draw(st.integers(0, len(steps)))
            steps[position:position] = bad
            if draw(st.booleans()):
                steps.append(draw(valid_requests(chosen)))
    ending: Literal["close", "cancel"] = "close" if chosen.fetch else draw(
        st.sampled_from(("close", "close", "close", "cancel")))
    return Case(chosen, tuple(steps), ending)
