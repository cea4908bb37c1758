"""The relay's side of its Delta-ADS stream to the origin, without I/O.

:class:`UpstreamState` turns downstream interest into subscribe and
unsubscribe requests, checks each origin response, writes usable ones into
the cache and says whether to ACK or NACK. The client loop in
:mod:`relay.upstream.client` only moves its messages over gRPC.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import message
from google.rpc import code_pb2, status_pb2

from relay.cache import ResourceCache
from relay.resource import CachedResource
from relay.subscriptions import Interest, SubscriptionIndex
from relay.xds_types import WILDCARD, message_class, short_name

log = logging.getLogger("relay.upstream")


class UnusableResponse(Exception):
    """An origin response the relay must NACK; the message is the NACK's reason."""


def variant_key_of(resource: discovery_pb2.Resource) -> str:
    """The cache's variant key for a resource: its constraints in canonical bytes."""
    if not resource.HasField("resource_name") or \
            not resource.resource_name.HasField("dynamic_parameter_constraints"):
        return ""
    constraints = resource.resource_name.dynamic_parameter_constraints
    if constraints.WhichOneof("type") is None:
        return ""
    return str(constraints.SerializeToString(deterministic=True).hex())


def resource_name_of(resource: discovery_pb2.Resource) -> str:
    name: str = (resource.resource_name.name if resource.HasField("resource_name")
                 else resource.name)
    return name


@dataclass
class _TypeSubscription:
    """What the origin has been asked for on the current stream."""

    names: set[str] = field(default_factory=set)
    wildcard: bool = False
    answered: bool = False  # a response for this type arrived on this stream


class UpstreamState:
    """Subscription and ACK bookkeeping for the one origin stream."""

    def __init__(self, node: base_pb2.Node, cache: ResourceCache, index: SubscriptionIndex,
                 linger: float = 0.0) -> None:
        self.node = node
        self.cache = cache
        self.index = index
        self.linger = linger
        self.connected = False
        self._node_sent = False
        self._subscribed: dict[str, _TypeSubscription] = {}
        # (type_url, name or "*") -> monotonic time after which it may be dropped
        self._lingering: dict[tuple[str, str], float] = {}
        self.last_nack: dict[str, str] = {}

    # -- connection lifecycle ---------------------------------------------

    def on_connect(self, now: float) -> list[discovery_pb2.DeltaDiscoveryRequest]:
        """A new stream: resubscribe everything, telling the origin what is cached."""
        self.connected = True
        self._node_sent = False
        self._subscribed = {}
        requests = []
        for type_url in sorted(set(self.index.wanted_types()) |
                               {t for t, _ in self._lingering}):
            target = self._target(type_url, now)
            if not target.names and not target.wildcard:
                continue
            sub = _TypeSubscription(set(target.names), target.wildcard)
            self._subscribed[type_url] = sub
            names = sorted(target.names) + ([WILDCARD] if target.wildcard else [])
            cached = {r.name: r.version for r in self.cache.resources(type_url)
                      if target.wildcard or r.name in target.names}
            requests.append(self._request(type_url, subscribe=names, initial_versions=cached))
        return requests

    def on_disconnect(self) -> None:
        self.connected = False

    # -- interest -----------------------------------------------------------

    def on_interest_changed(self, type_url: str,
                            now: float) -> list[discovery_pb2.DeltaDiscoveryRequest]:
        """Downstream interest in ``type_url`` changed: the request to send, if any."""
        wanted = self.index.wanted(type_url)
        sub = self._subscribed.get(type_url, _TypeSubscription())
        # Whatever nobody wants any more starts lingering (or goes at once).
        for name in sub.names - wanted.names:
            self._lingering.setdefault((type_url, name), now + self.linger)
        if sub.wildcard and not wanted.wildcard:
            self._lingering.setdefault((type_url, WILDCARD), now + self.linger)
        for name in wanted.names:
            self._lingering.pop((type_url, name), None)
        if wanted.wildcard:
            self._lingering.pop((type_url, WILDCARD), None)
        return self._sync_type(type_url, now)

    def on_tick(self, now: float) -> list[discovery_pb2.DeltaDiscoveryRequest]:
        """Drop lingering subscriptions whose time is up."""
        due = sorted({t for (t, _), deadline in self._lingering.items() if deadline <= now})
        requests = []
        for type_url in due:
            requests.extend(self._sync_type(type_url, now))
        return requests

    def next_deadline(self) -> float | None:
        return min(self._lingering.values(), default=None)

    def _target(self, type_url: str, now: float) -> Interest:
        """What we should be subscribed to: wanted, plus what still lingers."""
        wanted = self.index.wanted(type_url)
        lingering = {n for (t, n), deadline in self._lingering.items()
                     if t == type_url and deadline > now}
        return Interest(wanted.names | (lingering - {WILDCARD}),
                        wanted.wildcard or WILDCARD in lingering)

    def _sync_type(self, type_url: str, now: float) -> list[discovery_pb2.DeltaDiscoveryRequest]:
        for key in [k for k, d in self._lingering.items() if k[0] == type_url and d <= now]:
            del self._lingering[key]
        target = self._target(type_url, now)
        sub = self._subscribed.setdefault(type_url, _TypeSubscription())
        subscribe = sorted(target.names - sub.names)
        unsubscribe = sorted(sub.names - target.names)
        if target.wildcard and not sub.wildcard:
            subscribe.append(WILDCARD)
        if sub.wildcard and not target.wildcard:
            unsubscribe.append(WILDCARD)
            self.cache.forget_all_but(type_url, set(target.names))
        self.cache.forget(type_url, [n for n in unsubscribe if n != WILDCARD])
        sub.names = set(target.names)
        sub.wildcard = target.wildcard
        if not sub.names and not sub.wildcard:
            del self._subscribed[type_url]
        if not self.connected or not (subscribe or unsubscribe):
            return []
        return [self._request(type_url, subscribe=subscribe, unsubscribe=unsubscribe)]

    def subscription(self, type_url: str) -> Interest:
        """What the origin has been asked for (for tests and the admin view)."""
        sub = self._subscribed.get(type_url)
        return Interest(frozenset(sub.names), sub.wildcard) if sub else Interest()

    # -- responses ------------------------------------------------------------

    def on_response(self, response: discovery_pb2.DeltaDiscoveryResponse
                    ) -> discovery_pb2.DeltaDiscoveryRequest:
        """Check and apply one origin response; return its ACK or NACK."""
        type_url = response.type_url
        try:
            upserts, removed_variants = self._check(response)
        except UnusableResponse as error:
            self.last_nack[type_url] = str(error)
            log.warning("NACK to origin type=%s nonce=%s: %s", short_name(type_url),
                        response.nonce, error)
            return self._request(type_url, nonce=response.nonce, error=str(error))
        sub = self._subscribed.get(type_url)
        if sub is not None:
            wanted = [r for r in upserts if sub.wildcard or r.name in sub.names]
            removed = [n for n in response.removed_resources
                       if sub.wildcard or n in sub.names]
            sub.answered = True
            self.cache.apply(type_url, wanted, removed, removed_variants,
                             complete=True if sub.wildcard else None)
        # A response for a type we no longer subscribe to raced our unsubscribe:
        # nothing in it is wanted, but it was valid, so it is ACKed.
        return self._request(type_url, nonce=response.nonce)

    def _check(self, response: discovery_pb2.DeltaDiscoveryResponse
               ) -> tuple[list[CachedResource], list[tuple[str, str]]]:
        type_url = response.type_url
        if not type_url:
            raise UnusableResponse("response has no type_url")
        if not response.nonce:
            raise UnusableResponse("response has no nonce")
        body_class = message_class(type_url)
        seen: set[tuple[str, str]] = set()
        upserts: list[CachedResource] = []
        for resource in response.resources:
            name = resource_name_of(resource)
            if not name:
                raise UnusableResponse("a resource has no name")
            key = (name, variant_key_of(resource))
            if key in seen:
                raise UnusableResponse(f"resource {name!r} appears more than once")
            seen.add(key)
            if not resource.HasField("resource"):
                continue  # a heartbeat: nothing changes
            body = resource.resource
            if body.type_url != type_url:
                raise UnusableResponse(
                    f"resource {name!r} has type {body.type_url!r} in a response for "
                    f"{type_url!r}")
            if body_class is not None:
                try:
                    body_class.FromString(body.value)
                except message.DecodeError as error:
                    raise UnusableResponse(
                        f"resource {name!r} cannot be decoded as {type_url}: {error}") from None
            upserts.append(CachedResource(type_url, name, resource.version, resource, key[1]))
        removed_variants = []
        for removed in response.removed_resource_names:
            rn = discovery_pb2.Resource(resource_name=removed)
            removed_variants.append((removed.name, variant_key_of(rn)))
        return upserts, removed_variants

    def _request(self, type_url: str, *, subscribe: list[str] | None = None,
                 unsubscribe: list[str] | None = None,
                 initial_versions: dict[str, str] | None = None, nonce: str = "",
                 error: str | None = None) -> discovery_pb2.DeltaDiscoveryRequest:
        request = discovery_pb2.DeltaDiscoveryRequest(
            type_url=type_url, resource_names_subscribe=subscribe or [],
            resource_names_unsubscribe=unsubscribe or [],
            initial_resource_versions=initial_versions or {}, response_nonce=nonce)
        if error is not None:
            request.error_detail.CopyFrom(
                status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=error))
        if not self._node_sent:
            request.node.CopyFrom(self.node)
            self._node_sent = True
        return request
