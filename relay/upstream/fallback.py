"""Which of an origin's servers the relay follows: gRFC A71's fallback, without I/O.

An origin may list further servers after its primary (``upstream.fallback``).
The relay follows one of them at a time, on its one Delta-ADS stream, and
moves only when it must:

* An attempt on a server is *unreachable* when it ends before the server sent
  any response on it: a credential file could not be read, the connection
  was not up within ``connect_timeout``, or the stream ended (with any
  status, OK included) before its first ``DeltaDiscoveryResponse``. A
  response the relay NACKs is an answer: a server sending bad data is
  reachable, and its data errors are no reason to fall back.
* After an unreachable attempt the relay moves to the next server only if a
  client watches a resource the cache cannot answer (see
  :func:`watches_uncached`); with everything cached it keeps trying the same
  server after each backoff step, serving what it has, and moves as soon as
  a client asks for something uncached. After the last server comes the
  primary again, after a backoff step (every server failed in turn).
* A server that answered is reconnected to, whatever ends its stream.
* While on a fallback the client probes the primary after each step of a
  backoff of its own (:func:`probe_requests` say what it asks); as soon as
  the primary answers a probe the relay goes back to it and closes the
  fallback's stream.

Every move is a new stream, resynced as after a reconnect: everything is
subscribed again, what is cached is declared, and what the new server does
not confirm is removed once the reconcile is due (see
:mod:`relay.upstream.resync`). Resources of two servers never stay mixed, and
one the new server sends unchanged reaches no client again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from envoy.config.core.v3 import base_pb2

from relay.cache import ABSENT, Missing, Variants
from relay.constraints import EMPTY_PARAMS, UNCONSTRAINED, Locator, Params
from relay.upstream.requests import Request, SubscriptionChange, split_requests
from relay.upstream.targets import Demand

__all__ = ["CacheReader", "Failover", "Next", "is_cached", "probe_requests", "watches_uncached"]


class CacheReader(Protocol):
    """What the fallback rule reads of an origin's cache (the cache, or its scoped view)."""

    def variants(self, type_url: str, name: str) -> Variants | Missing: ...

    def is_answered(self, type_url: str, locator: Locator) -> bool: ...

    def is_complete(self, type_url: str) -> bool: ...

    def names(self, type_url: str) -> list[str]: ...


@dataclass(frozen=True)
class Next:
    """Where the next attempt goes: ``server`` (0 the primary, ``n`` the
    n-th fallback), after a backoff step if ``wait``."""

    server: int
    wait: bool


class Failover:
    """An origin's ``servers`` (primary first): which one is in use, and where to go next."""

    def __init__(self, servers: int) -> None:
        if servers < 1:
            raise ValueError("an origin has at least one server")
        self.servers = servers
        self.in_use = 0

    @property
    def on_fallback(self) -> bool:
        return self.in_use > 0

    def after_attempt(self, answered: bool, uncached: bool) -> Next:
        """The stream on the server in use ended: ``answered`` says whether the
        server sent a response on it, ``uncached`` whether a client watches a
        resource the cache cannot answer (only asked of an unreachable one)."""
        if answered or not uncached or self.servers == 1:
            # Retry the same server: at once after an answer (the client waits
            # if the stream was short), after a backoff step otherwise.
            return Next(self.in_use, wait=not answered)
        self.in_use = (self.in_use + 1) % self.servers
        # the next fallback at once; the primary again after a whole round failed
        return Next(self.in_use, wait=self.in_use == 0)

    def primary_answered(self) -> bool:
        """The primary answered a probe: it is the one in use (whether that changed)."""
        changed, self.in_use = self.in_use != 0, 0
        return changed


def is_cached(cache: CacheReader, type_url: str, name: str, params: Params) -> bool:
    """Whether the cache answers a client watching ``name`` with ``params``: it
    holds a variant that fits them, or knows there is none (the origin said
    so, or answered the locator without it; A71 counts "does not exist" as
    cached)."""
    found = cache.variants(type_url, name)
    if found is ABSENT:
        return True
    if isinstance(found, Mapping) and any(
            r.constraints is UNCONSTRAINED or r.constraints.matches(params)
            for r in found.values()):
        return True
    return cache.is_complete(type_url) or cache.is_answered(type_url, Locator(name, params))


def watches_uncached(cache: CacheReader, demand: Demand,
                     changed: Mapping[str, Collection[str]] | None = None) -> bool:
    """Whether a client watches something the cache cannot answer: A71's
    condition for falling back. ``changed`` limits the look to those names
    (and the wildcards of their types), per type; None looks at everything.

    A wildcard watch is answered once the cache holds the whole type or any
    resource of it.
    """
    types = demand.wanted_types() if changed is None else sorted(changed)
    for type_url in types:
        if demand.wants_wildcard(type_url) and not (
                cache.is_complete(type_url) or cache.names(type_url)):
            return True
        locators = demand.wanted_locators(type_url) if changed is None else {
            name: demand.wanted_params(type_url, name) for name in changed[type_url]}
        for name, params_set in locators.items():
            if any(not is_cached(cache, type_url, name, params) for params in params_set):
                return True
    return False


def probe_requests(node: base_pb2.Node, cache: CacheReader, demand: Demand,
                   max_request_size: int) -> list[Request]:
    """What a probe asks the primary, to learn whether it answers: per type
    clients want, one name (the least of those the cache holds a variant of,
    which the primary most likely has too; else the least wanted; else the
    wildcard), with the parameters a client wants it with. Small answers, and
    any one of them is enough. Empty when clients want nothing."""
    requests: list[Request] = []
    for type_url in demand.wanted_types():
        locators = demand.wanted_locators(type_url)
        candidates = [*locators] if locators else cache.names(type_url)
        held = [name for name in candidates if isinstance(cache.variants(type_url, name), Mapping)]
        name = min(held or candidates, default=None)
        if name is None:
            change = SubscriptionChange(type_url, wildcard=True)
        else:
            params = sorted(locators.get(name) or {EMPTY_PARAMS}, key=sorted)[:1]
            change = SubscriptionChange(type_url, {name: params})
        requests += split_requests(change, max_request_size,
                                   None if requests else node).requests
    return requests

