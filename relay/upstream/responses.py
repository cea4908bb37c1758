"""Checking one origin response before anything of it is used.

A response parses into either a :class:`ParsedResponse`, ready for the
cache, or an :class:`Unusable`: one the relay cannot use entirely (a type
mismatch, a duplicate name, an undecodable resource, malformed constraints),
with the reason it is NACKed for; nothing of it reaches the cache.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import message

from relay.constraints import (
    UNCONSTRAINED,
    Constraints,
    InvalidConstraints,
    compile_constraints,
)
from relay.errors import RelayError
from relay.resource import CachedResource
from relay.turns import made
from relay.upstream.bulk import (
    Known,
    plain_resources,
    sliced_resources,
    undecoded,
)
from relay.xds_types import message_class


class UnusableResponse(RelayError):
    """Raised inside the parser where a response breaks a rule; the message
    is the NACK's reason. :func:`parse_steps` returns it as an :class:`Unusable`."""


@dataclass(frozen=True)
class ParsedResponse:
    """What a usable response carries, ready for the cache."""

    type_url: str
    nonce: str
    upserts: list[CachedResource]
    # names removed whole (removed_resources)
    removed: list[str]
    # variants removed by name and constraints: (name, variant key)
    removed_variants: list[tuple[str, str]]
    # resources sent without a body: (name, variant key, version)
    heartbeats: list[tuple[str, str, str]]
    # the origin's per-resource errors
    errors: list[discovery_pb2.ResourceError]
    # whether every upsert is plain (checked in bulk: see relay.upstream.bulk)
    plain: bool = False


@dataclass(frozen=True)
class Unusable:
    """A response the relay cannot use, and why: the reason its NACK gives."""

    type_url: str
    nonce: str
    reason: str


Checked = ParsedResponse | Unusable


def resource_name_of(resource: discovery_pb2.Resource) -> str:
    name: str = (resource.resource_name.name if resource.HasField("resource_name")
                 else resource.name)
    return name


# How many resources :func:`parse_steps` checks between two pauses.
RESOURCES_PER_STEP = 1_000

Parsing = Generator[None, None, Checked]


class UndecodableResponse(RelayError):
    """What the origin sent is not a ``DeltaDiscoveryResponse`` (no type URL
    or nonce can be read from it to NACK): the stream is at fault."""


#: An origin response: as received (its encoding), or a message.
Response: TypeAlias = "discovery_pb2.DeltaDiscoveryResponse | bytes"


def parse_response(response: Response, known: Known | None = None) -> Checked:
    """What a response carries, or why it is unusable (see :func:`parse_steps`)."""
    return made(parse_steps(response, step=0, known=known))  # (with no step, it never pauses)


def parse_steps(response: Response, step: int = RESOURCES_PER_STEP,
                known: Known | None = None) -> Parsing:
    """:func:`parse_response` in steps: a generator that pauses (yields) after
    every ``step`` resources (and between the bulk check's stages, see
    :func:`~relay.upstream.bulk.plain_resources`; never with 0) and returns
    the parsed response, or an :class:`Unusable` with the reason to NACK it.

    Checking a resource means decoding it: 10,000 of them take over 100 ms,
    so a caller with other work to do (an event loop) lets it run between
    steps. The response is used only once all of it is checked.

    ``known`` (the cache's copies of names, see :data:`~relay.upstream.bulk.Known`)
    spares the bulk check the bodies resent byte for byte as cached: the
    result is the same with it or without.

    The response is best given as received (bytes): it is parsed here in
    steps too, its resources a slice at a time (see
    :func:`~relay.upstream.bulk.undecoded`). Raises
    :class:`UndecodableResponse` where the bytes are not a response.
    """
    raw = response if isinstance(response, bytes) else response.SerializeToString()
    try:
        head = undecoded(raw)
    except message.DecodeError as error:
        raise UndecodableResponse(f"the origin sent what is not a DeltaDiscoveryResponse "
                                  f"({len(raw)} bytes): {_why_not(raw, error)}") from None
    try:
        return (yield from _parse(head, raw, step, known))
    except UnusableResponse as error:
        return Unusable(head.type_url, head.nonce, str(error))


def _why_not(raw: bytes, error: message.DecodeError) -> str:
    """Why ``raw`` does not parse, as the response type says it (the error
    ``undecoded`` raised names its own type)."""
    try:
        discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
    except message.DecodeError as stricter:
        return str(stricter)
    return str(error)


def _parse(head: Any, raw: bytes, step: int,
           known: Known | None) -> Generator[None, None, ParsedResponse]:
    """``head``: the response but for its resources (bytes, as the origin
    encoded them), ``raw`` all of it."""
    type_url = _checked_type_url(head)
    if step:
        yield
    # Plain resources are checked in bulk (relay.upstream.bulk); any other
    # response, or one the bulk check finds fault with, one by one here.
    bulk = yield from plain_resources(head.resources, len(raw), type_url, time.monotonic(),
                                      step > 0, known)
    heartbeats: list[tuple[str, str, str]] = []
    if bulk is not None:
        upserts = bulk
    else:
        upserts, heartbeats = yield from _one_by_one(_resources(head, raw), type_url, step)
    removed_variants = _removed_variants(head)
    _check_resource_errors(head)
    return ParsedResponse(type_url, head.nonce, upserts, list(head.removed_resources),
                          removed_variants, heartbeats, list(head.resource_errors),
                          plain=bulk is not None)


def _resources(head: Any, raw: bytes) -> Iterator[discovery_pb2.Resource]:
    """The response's resources for the general check, parsed a slice at a
    time as they are checked (see :func:`~relay.upstream.bulk.sliced_resources`)."""
    try:
        yield from sliced_resources(head.resources, len(raw))
    except message.DecodeError as error:
        raise UnusableResponse(f"the response cannot be decoded: {error}") from None


def _one_by_one(resources: Iterable[discovery_pb2.Resource], type_url: str, step: int
                ) -> Generator[None, None, tuple[list[CachedResource],
                                                 list[tuple[str, str, str]]]]:
    """The resources, checked one at a time: (upserts, heartbeats)."""
    body_class = message_class(type_url)
    decode = body_class.FromString if body_class is not None else None
    from_origin = CachedResource.from_origin
    seen: set[tuple[str, str]] = set()
    upserts: list[CachedResource] = []
    heartbeats: list[tuple[str, str, str]] = []
    # (one pass, no call per resource but the body's decoding and the cached
    # copy's making)
    for number, resource in enumerate(resources, 1):
        if step and number % step == 0:
            yield
        if resource.HasField("resource_name"):
            resource_name = resource.resource_name
            name = resource_name.name
            constraints = _compiled(resource_name.dynamic_parameter_constraints,
                                    f"resource {name!r}")
        else:
            # A plain name: unconstrained.
            name = resource.name
            constraints = UNCONSTRAINED
        if not name:
            raise UnusableResponse("a resource has no name")
        key = (name, constraints.key)
        if key in seen:
            raise UnusableResponse(f"resource {name!r} appears more than once")
        seen.add(key)
        if not resource.HasField("resource"):
            heartbeats.append((name, constraints.key, resource.version))
            continue  # a heartbeat: nothing changes, the TTL restarts
        body = resource.resource
        if body.type_url != type_url:
            raise UnusableResponse(
                f"resource {name!r} has type {body.type_url!r} in a response for {type_url!r}")
        if decode is not None:
            # Decoded to be checked: what does not decode as its type is NACKed.
            try:
                decode(body.value)
            except message.DecodeError as error:
                raise UnusableResponse(
                    f"resource {name!r} cannot be decoded as {type_url}: {error}") from None
        upserts.append(from_origin(type_url, name, resource, constraints))
    return upserts, heartbeats


def _checked_type_url(response: discovery_pb2.DeltaDiscoveryResponse) -> str:
    """The response's type URL, once it has one and a nonce."""
    if not response.type_url:
        raise UnusableResponse("response has no type_url")
    if not response.nonce:
        raise UnusableResponse("response has no nonce")
    type_url: str = response.type_url
    return type_url


def _compiled(msg: discovery_pb2.DynamicParameterConstraints, what: str) -> Constraints:
    """The constraints of ``what`` (a resource, a removal, an error), or why not."""
    try:
        return compile_constraints(msg)
    except InvalidConstraints as error:
        raise UnusableResponse(
            f"{what} has invalid dynamic parameter constraints: {error}") from None


def _removed_variants(response: discovery_pb2.DeltaDiscoveryResponse) -> list[tuple[str, str]]:
    """What the response removes: (name, variant key) per removed resource."""
    return [(removed.name, _compiled(removed.dynamic_parameter_constraints,
                                     f"removed resource {removed.name!r}").key)
            for removed in response.removed_resource_names]


def _check_resource_errors(response: discovery_pb2.DeltaDiscoveryResponse) -> None:
    """Raise unless each resource error names a resource, with valid constraints."""
    for failed in response.resource_errors:
        failed_name = failed.resource_name
        if not failed_name.name:
            raise UnusableResponse("a resource error names no resource")
        _compiled(failed_name.dynamic_parameter_constraints,
                  f"resource error for {failed_name.name!r}")
