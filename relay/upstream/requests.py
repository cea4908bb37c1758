"""Requests to the origin, split so that none is too large for it to read.

A gRPC server fails a stream whose message exceeds its receive limit (4 MiB
unless configured otherwise), and the relay's subscription is the union of
every client's: a reconnect with tens of thousands of names, or a few very
long ones, would otherwise break the one upstream stream for everyone, on
every reconnect. So one logical subscription change may go out as several
requests, each at most ``limit`` bytes.

``initial_resource_versions`` may only travel in the first request of a
type on a stream; versions that do not fit there are left out, which costs
the origin resending those resources and nothing else (see
:mod:`relay.upstream.state` for how the relay reconciles after a reconnect).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.constraints import Params
from relay.encoding import locator_size, pair_size, text_size
from relay.xds_types import WILDCARD, short_name

log = logging.getLogger("relay.upstream")

# The generated messages carry no type information; this names what flows.
Request: TypeAlias = Any  # discovery_pb2.DeltaDiscoveryRequest
Locators = Mapping[str, Iterable[Params]]

# Room kept in every request for what is not a name: type URL, nonce, tags.
# A downstream locator larger than the limit less this is refused (see
# ``max_locator_size``), so that every locator fits in some request.
REQUEST_OVERHEAD = 1024


def max_locator_size(limit: int) -> int:
    """The largest locator (name and parameters, encoded) a request can carry."""
    return limit - REQUEST_OVERHEAD


@dataclass
class SubscriptionChange:
    """What to ask of the origin for one type, before it is split."""

    type_url: str
    subscribe: Locators = field(default_factory=dict)
    unsubscribe: Locators = field(default_factory=dict)
    # True: subscribe to the wildcard; False: unsubscribe from it; None: no change
    wildcard: bool | None = None
    initial_versions: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Split:
    """The requests for one change, and which initial versions made it in."""

    requests: list[Request]
    declared: dict[str, str]


def split_requests(change: SubscriptionChange, limit: int,
                   node: base_pb2.Node | None = None) -> Split:
    """``change`` as requests of at most ``limit`` bytes each; ``node`` goes in the first.

    Names keep their order (sorted); the wildcard subscription and the
    initial versions go first, unsubscriptions last. A locator too large for
    any request is left out and logged (the relay refuses such names from
    its clients, so this only guards the stream).
    """
    builder = _Builder(change.type_url, limit, node)
    if change.wildcard is True:
        builder.add("resource_names_subscribe", WILDCARD, text_size(WILDCARD))
    declared: dict[str, str] = {}
    first = builder.current
    for name, version in change.initial_versions.items():
        size = pair_size(name, version)
        if builder.fits(size) and builder.current is first:
            first.initial_resource_versions[name] = version
            builder.used += size
            declared[name] = version
    for names_field, locators_field, locators in (
            ("resource_names_subscribe", "resource_locators_subscribe", change.subscribe),
            ("resource_names_unsubscribe", "resource_locators_unsubscribe", change.unsubscribe)):
        for name in sorted(locators):
            for params in sorted(locators[name], key=sorted):
                size = locator_size(name, params)
                if params:
                    builder.add(locators_field, (name, params), size)
                else:
                    builder.add(names_field, name, size)
    if change.wildcard is False:
        builder.add("resource_names_unsubscribe", WILDCARD, text_size(WILDCARD))
    return Split(builder.finish(), declared)


class _Builder:
    """Fills requests one entry at a time, starting a new one when full."""

    def __init__(self, type_url: str, limit: int, node: base_pb2.Node | None) -> None:
        self.type_url = type_url
        self.limit = limit
        self.requests: list[Request] = []
        self.current = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url)
        # the size of a request that carries nothing but its type
        self.empty: int = self.current.ByteSize()
        if node is not None:
            self.current.node.CopyFrom(node)
        self.used: int = self.current.ByteSize()

    def fits(self, size: int) -> bool:
        return self.used + size <= self.limit

    def add(self, field_name: str, entry: str | tuple[str, Params], size: int) -> None:
        if not self.fits(size) and self.used > self.empty:
            self.requests.append(self.current)
            self.current = discovery_pb2.DeltaDiscoveryRequest(type_url=self.type_url)
            self.used = self.empty
        if not self.fits(size):
            name = entry if isinstance(entry, str) else entry[0]
            log.error("not subscribing %s %.80r...: %d bytes do not fit in a request to the "
                      "origin (upstream.max_request_size %d)", short_name(self.type_url), name,
                      size, self.limit)
            return
        if isinstance(entry, str):
            getattr(self.current, field_name).append(entry)
        else:
            name, params = entry
            getattr(self.current, field_name).add(name=name, dynamic_parameters=dict(params))
        self.used += size

    def finish(self) -> list[Request]:
        if self.used > self.empty or not self.requests:
            self.requests.append(self.current)
        return self.requests
