"""The relay's layers wired together, in the one place the app and the tests share.

Data flows one way: a source (the origin stream, or files) writes into the
cache; the cache tells the interest index what changed; the index wakes the
streams that hold those names. The only way back up is
:class:`relay.interest.Upward`, which :meth:`Core.follow` connects to the
upstream client: clients' interest changed, or names to fetch afresh.

The relay's own words (answered, settle, linger, resync, reconcile, held,
declared, lease, demand, upward, variant, scope, ...) are defined, each with
where it lives, in ``docs/glossary.md``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from relay.cache import CacheChange, ResourceCache
from relay.clock import Clock, MonotonicClock, wait_until
from relay.interest import InterestIndex
from relay.server.serving import ServingContext, ServingSettings
from relay.telemetry import Metrics, new_metrics
from relay.upstream.backoff import Backoff
from relay.upstream.client import UpstreamClient
from relay.upstream.dial import Dialer
from relay.upstream.origins import DEFAULT_ORIGIN, Origins, Routes
from relay.upstream.state import UpstreamState
from relay.upstream.targets import Demand


@dataclass
class Core:
    """Cache, interest index and what every downstream stream shares, wired."""

    cache: ResourceCache
    index: InterestIndex
    serving: ServingContext
    clock: Clock = field(default_factory=MonotonicClock)

    @classmethod
    def create(cls, metrics: Metrics | None = None, settings: ServingSettings | None = None,
               clock: Clock | None = None) -> Core:
        """The layers, serving streams as ``settings`` say (by default: anyone
        anything, at once)."""
        clock = clock or MonotonicClock()
        cache = ResourceCache(clock.now)
        index = InterestIndex()
        cache.add_listener(index.on_cache_change)
        serving = ServingContext.create(cache, index, metrics or new_metrics(), settings)
        if serving.settings.memory is not None:
            let_go = serving.settings.memory.let_go
            cache.add_forget_listener(lambda forgotten: let_go(forgotten.dropped))
        return cls(cache, index, serving, clock)

    def follow(self, dialer: Dialer, state: UpstreamState, backoff: Backoff) -> UpstreamClient:
        """The client of the origin stream, linked as the way back up from the index."""
        client = self.client(dialer, state, self.index, backoff)
        self.index.link(client)
        return client

    def client(self, servers: Dialer | Sequence[Dialer], state: UpstreamState, demand: Demand,
               backoff: Backoff, origin: str = DEFAULT_ORIGIN) -> UpstreamClient:
        """The client of the origin ``origin``'s stream (``servers``: primary first,
        then its fallbacks), reading what clients want from ``demand``.

        It batches what clients ask of the origin over ``server.batch_window``,
        as pushes to clients are batched (see :class:`UpstreamClient`).
        """
        return UpstreamClient(servers, state, demand, backoff, self.serving.metrics,
                              self.clock, self.serving.settings.batch_window, origin=origin)

    def follow_origins(self, routes: Routes, clients: Mapping[str, UpstreamClient]) -> Origins:
        """``clients`` (one per origin, by name) linked, through :class:`Origins`, as
        the way back up from the index."""
        origins = Origins(routes, clients)
        self.index.link(origins)
        return origins

    async def expire_ttls(self) -> None:
        """Remove resources whose TTL lapsed without a heartbeat (never invents one).

        Sleeps until the next deadline; any cache change may bring an earlier
        one, so it wakes to look again. Runs until cancelled.
        """
        changed = asyncio.Event()

        def wake(_change: CacheChange) -> None:
            changed.set()

        self.cache.add_listener(wake)
        while True:
            changed.clear()
            if not await wait_until(self.clock, changed, self.cache.next_expiry()):
                self.cache.expire()
