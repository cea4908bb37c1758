"""One relay process: its layers (see :mod:`relay.core`), its source of
resources, its servers, readiness and drain."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import grpc
from envoy.config.core.v3 import base_pb2
from opentelemetry.metrics import MeterProvider
from prometheus_client import CollectorRegistry

from relay.admin import AdminServer
from relay.admission import TokenBucket
from relay.authorization import Authorizer
from relay.cache import ResourceCache
from relay.certificates import WatchedKeyPair
from relay.clock import Clock, MonotonicClock, ended, within
from relay.config import RelayConfig, node_proto
from relay.config.models import FallbackServerConfig, UpstreamConfig
from relay.console.data import snapshot_views
from relay.console.source import local_source
from relay.core import Core
from relay.demand import DemandLedger
from relay.encoding import MAX_MESSAGE_SIZE
from relay.interest import InterestIndex
from relay.logs import RateLimitedLog
from relay.memory import MemoryReturn
from relay.node_groups import MAX_GROUPS_LIMIT, Group, NodeGroups, group_id
from relay.persistence.entries import CorruptEntry
from relay.persistence.groups import (
    GroupOrigin,
    GroupSnapshot,
    StoredGroup,
    decode_group,
    forget_group,
)
from relay.persistence.restore import Restored, restore
from relay.persistence.stores import (
    ClearableStore,
    DirectoryGroupRegistry,
    DirectoryStore,
    GroupRegistry,
    RedisGroupRegistry,
    RedisStore,
    StoreError,
)
from relay.persistence.writer import SnapshotWriter
from relay.protocol.limits import LIMITED_REASONS, NUMBERED_LIMITS, Limits
from relay.protocol.view import CacheView
from relay.server.access import (
    REFUSAL_LOG_INTERVAL,
    REFUSAL_REASONS,
    Access,
    server_credentials,
)
from relay.server.ecosystem import Health, add_ecosystem_services
from relay.server.fetch import Fetcher
from relay.server.group_fetch import GroupedFetcher
from relay.server.rest import RestServer
from relay.server.services import DRAINING, discovery_handlers
from relay.server.serving import ServingContext, ServingSettings
from relay.telemetry import (
    Metrics,
    new_metrics,
    prometheus_provider,
    watch_gc_pauses,
    watch_loop_lag,
)
from relay.upstream.backoff import Backoff
from relay.upstream.client import UpstreamClient
from relay.upstream.dial import Dialer, OriginTLS
from relay.upstream.origins import DEFAULT_ORIGIN, Origins, RoutedDemand, Routes
from relay.upstream.requests import max_locator_size
from relay.upstream.scoped import OriginCache, ScopedCache
from relay.upstream.state import UpstreamState
from relay.upstream.targets import Demand
from relay.xds_types import KNOWN_TYPE_URLS

if TYPE_CHECKING:
    from relay.sources.files import FileSource

log = logging.getLogger("relay")

# Downstream clients hold their streams open for hours; keep them alive
# through idle NATs and load balancers, and let many share one connection.
_SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Ping idle connections too: a client that froze or vanished while idle
    # must be found as surely as a busy one (gRPC stops after 2 pings otherwise).
    ("grpc.http2.max_pings_without_data", 0),
    # A response is as large as what clients subscribe to: as large as the
    # origin's own (istiod's CDS runs to many MB). Clients set their own limits.
    ("grpc.max_send_message_length", -1),
    # New streams wait in gRPC's queue until the event loop takes them, one per
    # turn. gRPC's defaults (1000, hard limit 3000) cancel the excess of a
    # reconnect storm with a bare CANCELLED, and the clients retry. Each call
    # queued holds memory until it is taken, and a client resetting streams
    # in a loop (HTTP/2 rapid reset) fills the queue at no cost to itself:
    # 20,000 queued calls took the relay past its pod's 512 MiB. A queue a
    # few times gRPC's own absorbs a restart's burst and stays small.
    ("grpc.server.max_pending_requests", 5_000),
    ("grpc.server.max_pending_requests_hard_limit", 10_000),
]


def server_options(config: RelayConfig, private: bool = False) -> list[tuple[str, Any]]:
    """gRPC's options for the xDS server of ``config`` (``private``: the hub's
    socket between the processes of ``--workers``, whose links are never
    retired for their age)."""
    keepalive, limits = config.server.keepalive, config.limits
    return [
        *_SERVER_OPTIONS,
        # Advertised in SETTINGS: a client may not open more on one connection,
        # so a reset flood holds no more than this many calls per connection.
        ("grpc.max_concurrent_streams", limits.streams_per_connection),
        *([] if private else connection_age_options(config.server.max_connection_age,
                                                    config.server.max_connection_age_grace)),
        ("grpc.keepalive_time_ms", int(keepalive.time * 1000)),
        ("grpc.keepalive_timeout_ms", int(keepalive.timeout * 1000)),
        # What ends a connection whose ping goes unanswered: without it, gRPC
        # waits a minute whatever keepalive_timeout says (and its calls with it).
        ("grpc.http2.ping_timeout_ms", int(keepalive.timeout * 1000)),
        # Twice limits.request_size: gRPC refuses more before the relay sees it;
        # the relay refuses what is between, with a status that names the limit.
        ("grpc.max_receive_message_length", min(2 * limits.request_size, MAX_MESSAGE_SIZE)),
    ]


def connection_age_options(age: float, grace: float) -> list[tuple[str, int]]:
    """gRPC's options retiring connections after ``age`` seconds (0: never).

    gRPC spreads each connection's age by ±10 % itself, sends GOAWAY when it
    is reached, and after ``grace`` more ends the streams still open with
    UNAVAILABLE, which xDS clients answer by reconnecting at once.
    """
    if age <= 0:
        return []
    return [("grpc.max_connection_age_ms", max(1, round(age * 1000))),
            ("grpc.max_connection_age_grace_ms", max(1, round(grace * 1000)))]


def dialer(upstream: UpstreamConfig | FallbackServerConfig, key: str = "upstream") -> Dialer:
    """How to reach the server ``upstream`` describes (one with an ``address``;
    ``key`` is where it is configured, for logs and errors)."""
    assert upstream.address is not None
    tls = upstream.tls
    if upstream.token_file is not None and tls is None:
        log.warning("%s.token_file is set without %s.tls: the token goes to the "
                    "origin in clear text", key, key)
    return Dialer(
        str(upstream.address),
        tls=None if tls is None else OriginTLS(tls.ca_file, tls.cert_file, tls.key_file,
                                               tls.server_name),
        token_file=upstream.token_file,
        initial_metadata=tuple(upstream.initial_metadata.items()),
        keepalive_time=upstream.keepalive.time, keepalive_timeout=upstream.keepalive.timeout,
        max_response_size=upstream.max_response_size,
        connect_timeout=upstream.connect_timeout, key=key)


def dialers(upstream: UpstreamConfig, key: str = "upstream") -> list[Dialer]:
    """An origin's servers, primary first, then its ``fallback`` servers (gRFC A71)."""
    return [dialer(upstream, key), *(dialer(server, f"{key}.fallback[{i}]")
                                     for i, server in enumerate(upstream.fallback))]


def routes(config: RelayConfig) -> Routes:
    """Which origin of ``config`` serves each name (see :mod:`relay.upstream.origins`)."""
    upstream = config.upstream
    return Routes(config.authorities, upstream is not None and upstream.address is not None)


def demand_ledger(config: RelayConfig, clock: Clock) -> DemandLedger:
    """The bounds on what clients make one process that serves them
    subscribe upstream: with ``server.workers``, each takes an equal share of
    ``limits.upstream_names`` (their hub adds them up on the origin stream)."""
    limits, workers = config.limits, max(1, config.server.workers)
    table = routes(config)
    # (where every name is served, the ledger asks nothing of each new name:
    # a cold client's 10,000 names asked 1.9 ms of calls that all said None)
    return DemandLedger(-(-limits.upstream_names // workers), limits.upstream_names_per_host,
                        clock.now,
                        routes=None if table.serves_every_name else table.refusal)


def snapshot_stores(config: RelayConfig, group: str | None = None,
                    shared: Mapping[str, ClearableStore] | None = None
                    ) -> dict[str, ClearableStore]:
    """Where ``config`` keeps each origin's snapshot, by origin (empty: it keeps none).

    Each origin has a key space of its own: the default origin's is the one a
    relay of a single origin uses (``persistence.redis.key_prefix``, or the
    directory); an authority's adds ``:authority:NAME`` to the prefix, or
    ``authorities/NAME`` to the directory. A node group's (``group``, its id)
    is the same under ``:group:ID`` after the prefix, or ``groups/ID`` in the
    directory, on the connections (or thread) of the relay's store of the
    origin (``shared``: the stores this function made without ``group``).
    """
    persistence = config.persistence
    if persistence is None:
        return {}
    stores: dict[str, ClearableStore] = {}
    for origin in config.origins():
        share = None if shared is None else shared.get(origin)
        if persistence.directory is not None:
            directory = persistence.directory
            if group is not None:
                directory = directory / "groups" / group
            if origin != DEFAULT_ORIGIN:
                directory = directory / "authorities" / \
                    quote(origin, safe="").replace(".", "%2E")
            stores[origin] = DirectoryStore(
                directory, share=share if isinstance(share, DirectoryStore) else None)
            continue
        redis = persistence.redis
        assert redis is not None  # the config has exactly one store
        password = None if redis.password_file is None or share is not None else \
            redis.password_file.read_text().strip()
        prefix = config.snapshot_prefix()
        if group is not None:
            prefix += f":group:{group}"
        if origin != DEFAULT_ORIGIN:
            prefix += f":authority:{origin}"
        stores[origin] = RedisStore(redis.url, prefix, redis.timeout, password,
                                    share=share if isinstance(share, RedisStore) else None)
    return stores


def group_registry(stores: Mapping[str, ClearableStore]) -> GroupRegistry | None:
    """Where the node groups that have a snapshot are listed: beside the relay's
    snapshot of its default origin (or of its first), on its connections."""
    store = stores.get(DEFAULT_ORIGIN) or next(iter(stores.values()), None)
    if isinstance(store, RedisStore):
        return RedisGroupRegistry(store)
    if isinstance(store, DirectoryStore):
        return DirectoryGroupRegistry(store)
    return None


def serving_settings(config: RelayConfig, metrics: Metrics, clock: Clock, *,
                     private: bool, forwards: bool) -> ServingSettings:
    """What ``limits.*``, ``server.*`` and ``server.authorization`` ask of every
    stream, fetch and poll. ``private``: serving the processes of ``--workers``
    (no authorization, any response size); ``forwards``: the relay has an origin
    (locators are bounded by what it can forward)."""
    limits, server = config.limits, config.server
    access = None
    if not private:
        rules = server.authorization
        access = Access(Authorizer(rules.allow, rules.node_binding, rules.debug,
                                   rules.debug_loopback, rules.secret_rules()),
                        metrics, clock.now)
    return ServingSettings(
        batch_window=server.batch_window,
        limits=Limits(**limits.model_dump(),
                      type_urls=frozenset(KNOWN_TYPE_URLS) | frozenset(server.extra_type_urls)),
        access=access,
        # On the machine's time, not the relay's clock: it paces real load
        # (streams wait for it with asyncio.sleep).
        admission=TokenBucket(limits.new_streams_per_second, limits.new_streams_burst,
                              time.monotonic),
        refusal_log=RateLimitedLog(logging.getLogger("relay.downstream"),
                                   REFUSAL_LOG_INTERVAL, clock.now),
        max_locator_size=min(max_locator_size(origin.max_request_size)
                             for origin in config.origins().values()) if forwards else None,
        # Clients keep gRPC's receive limit; the hub's workers take any size.
        max_response_size=None if private else server.max_response_size,
        # Memory back once big clients leave or large requests are refused.
        memory=MemoryReturn.for_this_process())


def drain_schedule(count: int, period: float) -> list[float]:
    """When to close each of ``count`` streams, in seconds from the drain's start.

    Evenly spread: the first at once, the rest ``period / count`` apart, so the
    reconnect rate elsewhere is ``count / period`` per second at most.
    """
    if count == 0:
        return []
    step = period / count
    return [i * step for i in range(count)]


def build_relay(config: RelayConfig, clock: Clock | None = None, *,
                origin: Dialer | None = None, listen: str | None = None,
                reuse_port: bool = False, admin: bool = True,
                readiness: Callable[[], str | None] | None = None) -> Relay:
    """A relay built from a validated config. ``start`` it, then ``stop`` it.

    ``clock`` drives its timers (TTLs, the upstream's deadlines, backoff, the
    drain); tests give one they advance themselves. The processes of
    ``--workers`` (:mod:`relay.workers`) set the rest: ``origin`` is followed
    instead of ``upstream.address`` or ``upstream.files``; xDS is served on
    ``listen`` (a gRPC address such as ``unix:/path``, private to the relay's
    processes: plaintext, and no ``server.authorization``) instead of
    ``server.address``; ``reuse_port`` lets other processes listen on the same
    port (SO_REUSEPORT); ``admin=False`` serves no admin endpoints;
    ``readiness`` is what ``/ready`` and ``xds_relay_ready`` go by instead of
    :meth:`Relay.not_ready_reason` (the hub counts its workers in).
    """
    clock = clock or MonotonicClock()
    otlp = config.metrics.otlp
    provider, registry = prometheus_provider(
        otlp.endpoint if otlp else None, otlp.interval if otlp else 15.0)
    metrics = new_metrics(provider, registry)
    # serving the processes of --workers, not clients
    private = listen is not None
    forwards = origin is not None or bool(config.origins())
    settings = serving_settings(config, metrics, clock, private=private, forwards=forwards)
    # The snapshot: only of what an origin sent (files are their own), and
    # only where the origin is a real one (not a --workers hub).
    snapshots = snapshot_stores(config) if origin is None else {}
    ledger = demand_ledger(config, clock)
    wall = relay_wall(clock)
    groups, listed = (None, None) if origin is not None or private else \
        _node_groups(config, metrics, settings, clock, snapshots, ledger, wall)
    if groups is not None:
        settings = replace(settings, groups=groups)
    core = Core.create(metrics, settings, clock)
    upstream = _origins(config, core, origin) if forwards else None
    if upstream is not None and not private:
        core.index.limit_demand(ledger if groups is None else
                                ledger.member(lambda: core.index.upstream_names))
    # server.tls is for clients, not for the private socket between the processes
    tls = None if private else config.server.tls
    # With node groups a fetch or REST poll is answered from its node's group,
    # as a stream is (see relay.server.group_fetch).
    fetcher = Fetcher(core.serving, clock, config.rest.lease, config.rest.wait) \
        if groups is None else \
        GroupedFetcher(core.serving, clock, groups, config.rest.lease, config.rest.wait)
    parts = RelayParts(
        clock=clock, meter_provider=provider, registry=registry, core=core,
        upstream=upstream, files=_file_source(config, core) if upstream is None else None,
        snapshots=snapshots, group_registry=listed, wall=wall,
        certificates=None if tls is None else
        WatchedKeyPair(tls.cert_file, tls.key_file, tls.client_ca_file),
        fetcher=fetcher,
        # REST is served by the processes that serve clients (not a --workers hub).
        rest=None if private or config.rest.address is None else
        RestServer(core.serving, fetcher, config.rest.address, config.server.tls, reuse_port,
                   config.rest.http_limits),
        listen=listen or str(config.server.address), private=private, reuse_port=reuse_port)
    return Relay(config, parts, admin=admin, readiness=readiness)


def _node_groups(config: RelayConfig, metrics: Metrics, plain: ServingSettings, clock: Clock,
                 snapshots: dict[str, ClearableStore], ledger: DemandLedger,
                 wall: Callable[[], float]
                 ) -> tuple[NodeGroups | None, GroupRegistry | None]:
    """With ``upstream.node_groups``: the groups, each served by a core of its
    own as the relay's own would be without groups (``plain``), the demand
    bounds one budget across them (see :mod:`relay.demand`), and the list of
    groups with a snapshot. (None, None) without."""
    grouping = config.upstream.node_groups if config.upstream is not None else None
    if grouping is None:
        return None, None
    listed = group_registry(snapshots)
    spec = grouping.spec()

    def group_core(group: str, key: tuple[str, ...], node: base_pb2.Node) -> GroupCore:
        stored = StoredGroup(group, spec.key, key, node)
        return GroupCore.create(config, metrics, plain, clock, stored, ledger,
                                None if listed is None else (listed, snapshots), wall)

    return NodeGroups(spec, node_proto(config), group_core, clock), listed


@dataclass(frozen=True)
class GroupCore:
    """What one node group is served from (see :mod:`relay.node_groups`): a core of
    its own, a client per origin whose streams carry the group's node, the
    fetches and polls of its nodes, and its snapshot (with ``persistence``)."""

    core: Core
    origins: Origins
    fetcher: Fetcher
    # the group's share of the relay's demand budget
    demand: DemandLedger
    snapshot: GroupSnapshot | None = None

    @classmethod
    def create(cls, config: RelayConfig, metrics: Metrics, settings: ServingSettings,
               clock: Clock, group: StoredGroup, ledger: DemandLedger,
               persisting: tuple[GroupRegistry, Mapping[str, ClearableStore]] | None,
               wall: Callable[[], float] = time.time) -> GroupCore:
        """The core of ``group``, asking every origin as its node, its demand a
        member of ``ledger``; ``persisting``: where groups are listed, and the
        relay's stores (whose connections the group's share); ``wall``: the wall
        clock as the relay's ``clock`` runs (see :func:`relay_wall`)."""
        core = Core.create(metrics, settings, clock)
        origins = _origins(config, core, None, group.node, group.id)
        demand = ledger.member(lambda: core.index.upstream_names)
        core.index.limit_demand(demand)
        fetcher = Fetcher(core.serving, clock, config.rest.lease, config.rest.wait)
        snapshot = None
        if persisting is not None:
            registry, shared = persisting
            several = origins.routes.several
            parts = {name: GroupOrigin(
                store, ScopedCache(core.cache, origins.routes.owned_by(name),
                                   takes_wildcard=name == DEFAULT_ORIGIN) if several
                else core.cache, origins.routes.owned_by(name) if several else None)
                for name, store in snapshot_stores(config, group.id, shared).items()}
            snapshot = GroupSnapshot(group, registry, core.cache, parts, metrics, clock,
                                     _group_linger(config), wall)
        return cls(core, origins, fetcher, demand, snapshot)

    def synced(self) -> bool:
        """Whether every origin of the group answered once, or its snapshot serves."""
        return self.origins.synced() or (self.snapshot is not None and
                                         self.snapshot.restored_types() > 0)

    @property
    def cache(self) -> ResourceCache:
        return self.core.cache

    @property
    def index(self) -> InterestIndex:
        return self.core.index

    @property
    def view(self) -> CacheView:
        return self.core.serving.view

    async def run(self, clients: Callable[[], int]) -> None:
        """Follow the group's origins, expire its TTLs and write its snapshot
        (``clients()``: the streams it serves now), until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.origins.run())
            tasks.create_task(self.core.expire_ttls())
            if self.snapshot is not None:
                tasks.create_task(self.snapshot.run(clients))

    async def retire(self) -> None:
        """The group closed for good: its snapshot goes."""
        if self.snapshot is not None:
            await self.snapshot.forget()

    async def close(self) -> None:
        """Drop the group's leases and demand; write what is left of its snapshot."""
        self.demand.leave()
        await self.fetcher.aclose()
        if self.snapshot is not None:
            await self.snapshot.flush()
            await self.snapshot.close()


def _origins(config: RelayConfig, core: Core, hub: Dialer | None,
             node: base_pb2.Node | None = None, group: str | None = None) -> Origins:
    """A client per origin (``hub``: the one origin of a --workers process), wired into
    ``core`` as the way back up from its index. ``node``: what the clients ask as
    (None: the relay's ``node:``); ``group``: the node group they serve, named in
    their origin names (``default/GROUP``)."""
    if hub is not None:
        only = Routes((), default=True)
        client = _upstream_client(config, config.hub_link(), core, hub, core.cache, core.index)
        return core.follow_origins(only, {DEFAULT_ORIGIN: client})
    table = routes(config)
    clients = {}
    for name, upstream in config.origins().items():
        key = "upstream" if name == DEFAULT_ORIGIN else f"authorities.{name}"
        if table.several:  # each origin sees its own names only
            owns = table.owned_by(name)
            cache: OriginCache = ScopedCache(core.cache, owns,
                                             takes_wildcard=name == DEFAULT_ORIGIN)
            demand: Demand = RoutedDemand(core.index, table, name)
        else:
            cache, demand = core.cache, core.index
        clients[name] = _upstream_client(
            config, upstream, core, dialers(upstream, key), cache, demand,
            name if group is None else f"{name}/{group}", node)
    return core.follow_origins(table, clients)


def _group_linger(config: RelayConfig) -> float:
    grouping = config.upstream.node_groups if config.upstream is not None else None
    assert grouping is not None
    return grouping.linger


def relay_wall(clock: Clock) -> Callable[[], float]:
    """The wall clock as ``clock`` runs: the time now, moved on as ``clock`` moves
    (what a snapshot compares across relays, on the relay's own timers)."""
    offset = time.time() - clock.now()
    return lambda: clock.now() + offset


def _origin_status(client: UpstreamClient) -> dict[str, Any]:
    """One origin stream's state, as ``/origins`` lists it."""
    status = client.status()
    return {**status.to_json(),
            "connected_since": status.since if status.connected else None,
            "disconnected_since": None if status.connected else status.since,
            "synced": client.synced_event.is_set()}


def _upstream_client(config: RelayConfig, upstream: UpstreamConfig, core: Core,
                     servers: Dialer | list[Dialer], cache: OriginCache, demand: Demand,
                     origin: str = DEFAULT_ORIGIN, node: base_pb2.Node | None = None
                     ) -> UpstreamClient:
    """The client of the origin ``origin``'s stream, as ``upstream`` says (asking as
    ``node``; None: the relay's)."""
    state = UpstreamState(node or node_proto(config), cache, upstream.linger,
                          upstream.answer_grace, upstream.max_request_size,
                          upstream.initial_versions, upstream.linger_names)
    return core.client(servers, state, demand,
                       Backoff(upstream.backoff.initial, upstream.backoff.max), origin)


def _file_source(config: RelayConfig, core: Core) -> FileSource:
    """The file source of ``upstream.files``, writing into ``core``'s cache."""
    from relay.sources.files import FileSource

    upstream = config.upstream
    assert upstream is not None and upstream.files is not None  # no origin: files
    return FileSource(upstream.files, core.cache, upstream.poll_interval, core.serving.metrics)


@dataclass(frozen=True, kw_only=True)
class RelayParts:
    """What :func:`build_relay` makes of a config, for a :class:`Relay` to run."""

    clock: Clock
    meter_provider: MeterProvider
    registry: CollectorRegistry
    core: Core
    # the source of resources, exactly one: the origins (or the hub of --workers), or files
    upstream: Origins | None
    files: FileSource | None
    # where each origin's snapshot is kept, by origin (empty: no persistence);
    # with node groups, each group's is under a key space of its own beside it
    snapshots: dict[str, ClearableStore]
    # with node groups and persistence: where the groups with a snapshot are listed
    group_registry: GroupRegistry | None
    # the wall clock as ``clock`` runs (see relay_wall)
    wall: Callable[[], float]
    # the xDS port's certificate (server.tls)
    certificates: WatchedKeyPair | None
    # one-shot fetches (gRPC Fetch*, REST polling) and the leases they hold
    fetcher: Fetcher
    rest: RestServer | None
    # where xDS is served: server.address, or the private socket of --workers
    listen: str
    private: bool
    reuse_port: bool


class Lifecycle(enum.Enum):
    """Where a relay is in its life; each state comes after the one before."""

    BUILT = "built"  # made from its config, not listening
    SERVING = "serving"  # listening (see Relay.start)
    DRAINING = "draining"  # refusing new streams, closing the open ones (see Relay.drain)
    STOPPED = "stopped"  # closed for good (see Relay.stop)


# Why /ready says 503 in each state but SERVING.
_NOT_READY = {Lifecycle.BUILT: "not serving yet", Lifecycle.DRAINING: "draining",
              Lifecycle.STOPPED: "stopped"}


class Relay:
    """One relay process, running what :func:`build_relay` made of its config.

    Its life is one :class:`Lifecycle`: built, serving once :meth:`start`
    has bound its ports, draining once :meth:`drain` began, stopped once
    :meth:`stop` ran. ``readiness`` (by default :meth:`not_ready_reason`) is
    what ``/ready`` and ``xds_relay_ready`` go by.
    """

    def __init__(self, config: RelayConfig, parts: RelayParts, *, admin: bool = True,
                 readiness: Callable[[], str | None] | None = None) -> None:
        self.config: Final = config
        self._parts = parts
        self.origins: Final = parts.upstream
        # The default origin's client (or the only one): what a single-origin
        # relay, a --workers process and the tests follow.
        self.upstream: Final = None if parts.upstream is None else \
            parts.upstream.default or next(iter(parts.upstream.clients.values()))
        self.rest: Final = parts.rest
        self._readiness = readiness or self.not_ready_reason
        self._health = Health()
        self.admin: Final = None if not admin else AdminServer(
            parts.core.cache, parts.registry, self._readiness,
            parts.core.serving.iter_client_statuses, self.ready_detail,
            origins=self.origin_statuses, config=config,
            console=local_source(parts.core.serving, lambda: snapshot_views(
                self.snapshot_writers, self.restored_of)))
        self._state = Lifecycle.BUILT
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # per origin: what writes its snapshot back, what its snapshot held at start
        self._snapshot_writers: dict[str, SnapshotWriter] = {}
        self._restored: dict[str, Restored] = {}
        self._xds_port = self._admin_port = self._rest_port = 0
        self._observe_state()
        self._count_from_zero()

    # -- what others read ------------------------------------------------------

    @property
    def state(self) -> Lifecycle:
        """Where the relay is in its life."""
        return self._state

    @property
    def cache(self) -> ResourceCache:
        """The resources cached."""
        return self._parts.core.cache

    @property
    def index(self) -> InterestIndex:
        """Who wants what, and the way back up."""
        return self._parts.core.index

    @property
    def serving(self) -> ServingContext:
        """What every stream, fetch and poll shares."""
        return self._parts.core.serving

    @property
    def metrics(self) -> Metrics:
        """The relay's instruments."""
        return self._parts.core.serving.metrics

    @property
    def registry(self) -> CollectorRegistry:
        """The Prometheus registry ``/metrics`` serves."""
        return self._parts.registry

    @property
    def xds_port(self) -> int:
        """The port xDS is served on, once serving (0 before, and on a unix socket)."""
        return self._xds_port

    @property
    def admin_port(self) -> int:
        """The admin endpoints' port, once serving (0 before, or without them)."""
        return self._admin_port

    @property
    def rest_port(self) -> int:
        """The REST polling port, once serving (0 before, or without it)."""
        return self._rest_port

    @property
    def snapshot_writer(self) -> SnapshotWriter | None:
        """What writes the default origin's snapshot back (the only origin's), once
        started with persistence."""
        return self.snapshot_writers.get(self._first_origin())

    @property
    def snapshot_writers(self) -> dict[str, SnapshotWriter]:
        """What writes each origin's snapshot back, by origin, once started."""
        return self._snapshot_writers

    @property
    def restored(self) -> Restored | None:
        """What the default origin's (the only origin's) snapshot held when the relay
        started (None: nothing loaded)."""
        return self._restored.get(self._first_origin())

    def restored_of(self, origin: str) -> Restored | None:
        """What ``origin``'s snapshot held when the relay started (None: nothing loaded)."""
        return self._restored.get(origin)

    def _first_origin(self) -> str:
        return next(iter(self._parts.snapshots), DEFAULT_ORIGIN)

    def _observe_state(self) -> None:
        """Gauges counted from the relay's state when metrics are collected."""
        groups = self.serving.settings.groups
        if groups is not None:
            self.metrics.observe_node_groups(groups.sizes, self._parts.registry)
        self.metrics.observe_state(
            self._cache_counts if groups is not None else self.cache.counts,
            self.serving.subscription_counts,
            self._upstream_subscription_counts if self.origins is not None else None)
        self.metrics.observe(
            "xds_relay_ready", "1 while /ready says ready (serving what it has), 0 otherwise",
            (), lambda: {(): int(self._readiness() is None)})
        self.metrics.observe(
            "xds_relay_downstream_nacked_streams",
            "Streams whose latest answered response of a type was NACKed, no ACK since: "
            "clients running older config than the relay sent", ("protocol", "type"),
            self.serving.rejection_counts)
        self.metrics.observe(
            "xds_relay_fetch_leases",
            "Resource sets kept subscribed for REST polls and gRPC fetches (rest.lease after "
            "their last poll; at most limits.streams)", ("type",),
            self._parts.fetcher.lease_counts)
        # What "near a limit" alerts divide by.
        limits = self.config.limits
        self.metrics.observe(
            "xds_relay_limit", "The configured limits.* (counts, and sizes in bytes); "
            "streams are per process",
            ("limit",), lambda: {(name,): getattr(limits, name) for name in NUMBERED_LIMITS})
        certificates = self._parts.certificates
        if certificates is not None:
            # what alerts on a certificate that rotation failed to renew watch
            self.metrics.observe(
                "xds_relay_tls_certificate_expiry_timestamp_seconds",
                "When the certificate the xDS port serves expires (Unix time)", (),
                lambda: {(): int(certificates.current.not_after.timestamp())})

    def origin_statuses(self) -> list[dict[str, Any]]:
        """Each origin's state, for ``/origins``, ``xds-relay status`` and the console:
        the server in use (and whether it is a fallback), connected or not since
        when (Unix seconds), synced, reconnects, the last response per type."""
        if self.origins is None:
            return []
        if self.groups is not None:
            return self._group_origin_statuses()
        return [_origin_status(client) for _, client in self.origins]

    def _group_origin_statuses(self) -> list[dict[str, Any]]:
        """With node groups: each group's origin streams (the relay opens none of its
        own), each with ``group`` (its id, key shown bounded, and clients), and
        whether it serves its snapshot; a group restored that no client joined yet
        has no stream open."""
        statuses = []
        for group, core in self._group_cores():
            for _, client in core.origins:
                restored = 0 if core.snapshot is None else core.snapshot.restored_types()
                statuses.append({
                    **_origin_status(client),
                    "group": {"id": group.id, "key": group.shown_key(),
                              "clients": group.clients},
                    "snapshot": restored > 0 and not client.synced_event.is_set()})
        return statuses

    def _upstream_subscription_counts(self) -> dict[tuple[str, str], int]:
        """Per (origin, type URL): locators subscribed on the origin's stream; with
        node groups, on each group's (``ORIGIN/GROUP ID``)."""
        assert self.origins is not None
        clients = [client for _, client in self.origins] if self.groups is None else \
            [client for _, core in self._group_cores() for _, client in core.origins]
        return {(client.origin, type_url): count for client in clients
                for type_url, count in client.state.subscription_counts().items()}

    def _cache_counts(self) -> dict[str, tuple[int, int]]:
        """:meth:`ResourceCache.counts` of every open node group's cache together
        (a resource two groups hold counts twice: it is cached twice)."""
        out = self.cache.counts()
        for _, core in self._group_cores():
            for type_url, (names, variants) in core.cache.counts().items():
                had = out.get(type_url, (0, 0))
                out[type_url] = (had[0] + names, had[1] + variants)
        return out

    def _count_from_zero(self) -> None:
        """Start at 0 the series that alerts take ``increase()`` of, rather
        than at their first count: the first refusal, limit hit or failed
        write is then an increase, and a relay that never reached its origin
        says ``xds_relay_upstream_connected 0``."""
        metrics = self.metrics
        for limit in LIMITED_REASONS:
            metrics.downstream_limited.add(0, {"limit": limit})
        if self.serving.settings.groups is not None:
            metrics.downstream_limited.add(0, {"limit": MAX_GROUPS_LIMIT})
        for reason in REFUSAL_REASONS:
            metrics.downstream_refused.add(0, {"reason": reason})
        if self._parts.snapshots:
            for outcome in ("ok", "failed"):
                metrics.snapshot_writes.add(0, {"outcome": outcome})

    async def set_not_serving(self) -> None:
        """Turn every gRPC health status NOT_SERVING, for good (when draining starts)."""
        await self._health.set_not_serving()

    @property
    def groups(self) -> NodeGroups | None:
        """The node groups open (None: without ``upstream.node_groups``)."""
        return self.serving.settings.groups

    def _group_cores(self) -> list[tuple[Group, GroupCore]]:
        """Each open node group with its core."""
        groups = self.groups
        found = []
        for group in [] if groups is None else groups.groups():
            core = group.core
            assert isinstance(core, GroupCore)  # what build_relay makes
            found.append((group, core))
        return found

    def not_ready_reason(self) -> str | None:
        """Why ``/ready`` says 503, or None when ready.

        With node groups the relay is ready once serving: it has no origin
        stream of its own whose sync would say it can serve, each group's
        first client waits for its group's stream as it would for the origin,
        and a group syncing is what every new group does (holding every
        other group's clients off for it would take the relay out of its load
        balancer whenever a new kind of client arrives). ``ready_detail`` and
        ``/origins`` say how each group stands.
        """
        if self._state is not Lifecycle.SERVING:
            return _NOT_READY[self._state]
        if self._parts.files is not None or self.groups is not None:
            return None
        # Once synced, the relay stays ready while an origin is away: it
        # serves what it has cached, to new clients too. So does one that
        # restored a snapshot: it serves the zone's last-known-good config.
        waiting = [name for name in self._origin_names() if not self._origin_ready(name)]
        if not waiting:
            return None
        return "not yet synced with " + self._origin_list(waiting)

    def _origin_names(self) -> list[str]:
        return [] if self.origins is None else list(self.origins.clients)

    def _origin_ready(self, origin: str) -> bool:
        """Whether ``origin``'s part is served: it answered once, or its snapshot is."""
        assert self.origins is not None
        if self.origins.clients[origin].synced_event.is_set():
            return True
        restored = self._restored.get(origin)
        return restored is not None and restored.types > 0

    def _origin_list(self, names: list[str]) -> str:
        """``names`` of origins as /ready says them: "the origin" for a lone one."""
        if len(self._origin_names()) == 1:
            return "the origin"
        return ("origin " if len(names) == 1 else "origins ") + ", ".join(names)

    def serves_snapshot(self) -> bool:
        """Whether a restored snapshot is what the relay serves, until the origins answer."""
        return any(restored.types > 0 for restored in self._restored.values()) or any(
            core.snapshot is not None and core.snapshot.restored_types() > 0 and
            not core.origins.synced() for _, core in self._group_cores())

    def ready_detail(self) -> str:
        """What a ready relay serves, for ``/ready``'s 200 body: per origin, whether
        it is connected (and since when), synced, or served from its snapshot;
        with node groups, how many groups are in each of those states."""
        if self._parts.files is not None:
            return "serving files"
        if self.groups is not None:
            return self._groups_detail()
        return "; ".join(self._origin_detail(name) for name in self._origin_names())

    def _groups_detail(self) -> str:
        cores = self._group_cores()
        synced = sum(core.origins.synced() for _, core in cores)
        snapshot = sum(not core.origins.synced() and core.synced() for _, core in cores)
        idle = sum(group.clients == 0 for group, _ in cores)
        return (f"serving node groups: {len(cores)} open ({idle} without clients); "
                f"{synced} synced with their origins, {snapshot} serving a snapshot, "
                f"{len(cores) - synced - snapshot} not yet synced (see /origins)")

    def _origin_detail(self, origin: str) -> str:
        assert self.origins is not None
        client = self.origins.clients[origin]
        lone = len(self.origins.clients) == 1
        who = "the origin" if lone else f"origin {origin}"
        status = client.status()
        server = status.server + (f" (fallback {status.in_use} of {len(status.servers) - 1})"
                                  if status.on_fallback else "")
        if client.synced_event.is_set():
            if status.connected:
                return f"synced with {who} at {server}"
            since = "" if status.since is None else \
                time.strftime(" since %Y-%m-%dT%H:%M:%SZ", time.gmtime(status.since))
            return f"{who} at {server} unreachable{since} (serving what it sent)"
        restored = self._restored.get(origin)
        if restored is not None and restored.types:
            age = "" if restored.written_at is None else \
                f", saved {max(0.0, time.time() - restored.written_at):.0f}s ago"
            return (f"serving a snapshot ({restored.resources} resources of "
                    f"{restored.types} types from {restored.where}{age}); "
                    f"not yet synced with {who}")
        return f"not yet synced with {who}"

    async def _restore(self, origin: str, store: ClearableStore) -> None:
        """Load ``origin``'s snapshot into the cache, waiting
        ``persistence.load_timeout`` at most."""
        assert self.config.persistence is not None
        where = store.description
        timeout = self.config.persistence.load_timeout
        try:
            stored = await within(store.load(), timeout)
        except TimeoutError:
            log.warning("snapshot not loaded: no answer from %s within %gs "
                        "(persistence.load_timeout); serving without it", where, timeout)
            return
        except StoreError as error:
            log.warning("snapshot not loaded: %s; serving without it", error)
            return
        if stored is None:
            log.info("no snapshot at %s yet: starting empty", where)
            return

        def skipped(reason: str, count: int) -> None:
            self.metrics.snapshot_skipped.add(count, {"reason": reason})

        restored = self._restored[origin] = restore(
            self._origin_cache(origin), stored, where, self._parts.clock.now(), time.time(),
            skipped)
        self.metrics.snapshot_restored.add(restored.resources)
        if restored.types:
            log.info("restored %d resources of %d types from the snapshot at %s; serving them "
                     "until the origin answers", restored.resources, restored.types, where)

    async def _restore_groups(self, groups: NodeGroups) -> None:
        """Open, not running, each node group the snapshot lists (at most
        ``max_groups``), its resources loaded: served to the first client that
        joins it. Groups listed under another key, or beyond ``max_groups``,
        are deleted from the snapshot."""
        persistence, registry = self.config.persistence, self._parts.group_registry
        if persistence is None or registry is None:
            return
        timeout = persistence.load_timeout
        try:
            listed = await within(registry.load(), timeout)
        except TimeoutError:
            log.warning("node groups not restored: no answer from %s within %gs "
                        "(persistence.load_timeout)", registry.description, timeout)
            return
        except StoreError as error:
            log.warning("node groups not restored: %s", error)
            return
        wall, restored, resources = time.time(), 0, 0
        for gid, entry in sorted(listed.items()):
            try:
                stored: StoredGroup | None = decode_group(entry)
            except CorruptEntry as error:
                log.warning("node group %s in %s skipped: %s", gid[:32], registry.description,
                            error)
                stored = None
            group, why = None, "its entry is unreadable"
            if stored is not None and stored.id == gid == group_id(stored.key):
                why = "it was grouped by other fields than upstream.node_groups.key's"
                if stored.fields == groups.spec.key:
                    why = "restoring it would pass upstream.node_groups.max_groups"
                    group = groups.restore(gid, stored.key, stored.node)
            if group is None:
                await self._forget_group(gid, registry, why)
                continue
            core = group.core
            assert isinstance(core, GroupCore) and core.snapshot is not None
            await core.snapshot.restore(timeout, wall)
            restored += 1
            resources += sum(done.resources for done in core.snapshot.restored.values())
        if restored:
            log.info("restored %d node groups (%d resources) from %s; each is served from it "
                     "until its origin answers, and closed after linger if no client joins",
                     restored, resources, registry.description)

    async def _forget_group(self, gid: str, registry: GroupRegistry, why: str) -> None:
        """Delete the snapshot of a listed group that is not restored (unless a
        relay sharing the snapshot served it lately: see ``forget_group``)."""
        # only an id the relay made names key spaces (folders); another is dropped alone
        named = len(gid) <= 64 and gid.replace("-", "").isalnum()
        stores = snapshot_stores(self.config, gid, self._parts.snapshots) if named else {}
        try:
            await forget_group(registry, gid, stores, _group_linger(self.config),
                               self._parts.wall(), why)
        except StoreError as error:
            log.warning("node group %s not deleted from the snapshot: %s", gid[:32], error)
        finally:
            for store in stores.values():
                await store.close()

    def _origin_cache(self, origin: str) -> OriginCache:
        """The cache as ``origin`` writes it (its own names only, with several)."""
        assert self.origins is not None
        if not self.origins.routes.several:
            return self.cache
        return ScopedCache(self.cache, self.origins.routes.owned_by(origin),
                           takes_wildcard=origin == DEFAULT_ORIGIN)

    async def drain(self, period: float | None = None) -> None:
        """Stop taking streams and close the open ones spread over ``period``.

        ``/ready`` turns 503 at once, so that load balancers stop sending
        clients here; the clients already connected are told to go away a few
        at a time (``UNAVAILABLE``), so that they reconnect elsewhere without
        a thundering herd. The origin stream stays up meanwhile: the clients
        not yet closed still get updates. ``stop`` afterwards.
        """
        if self._state is Lifecycle.STOPPED:
            return
        if period is None:
            period = self.config.server.drain_period
        self._state = Lifecycle.DRAINING
        self.serving.start_draining()
        await self.set_not_serving()
        streams = list(self.serving.streams)
        random.shuffle(streams)
        log.info("draining: closing %d client streams over %.1fs", len(streams), period)
        started = self._parts.clock.now()
        for stream, offset in zip(streams, drain_schedule(len(streams), period), strict=True):
            await self._parts.clock.sleep(max(0.0, started + offset - self._parts.clock.now()))
            stream.close(DRAINING)
        await self.serving.wait_idle(self._parts.clock, 1.0)
        log.info("drained in %.1fs", self._parts.clock.now() - started)

    async def start(self) -> None:
        """Bind the servers and start following the origin: built, then serving.

        With persistence, the snapshot is loaded first: the first client is
        served from it. Then every change the cache takes is written back.
        """
        if self._state is not Lifecycle.BUILT:
            raise RuntimeError(f"a relay starts once; this one is {self._state.value}")
        parts = self._parts
        if self.groups is not None:
            # Each group keeps its own snapshot (written while it runs); the
            # relay's stores only lend them their connections.
            await self._restore_groups(self.groups)
        for origin, store in parts.snapshots.items() if self.groups is None else ():
            await self._restore(origin, store)
            writer = self._snapshot_writers[origin] = SnapshotWriter(
                self.cache, store, self.metrics, parts.clock,
                owns=self.origins.routes.owned_by(origin)
                if self.origins is not None and self.origins.routes.several else None)
            self.cache.add_listener(writer.on_cache_change)
            self.cache.add_forget_listener(writer.on_forget)
            self._tasks.append(asyncio.create_task(writer.run(), name=f"snapshot-{origin}"))
        if parts.files is not None:
            parts.files.load()  # served before the first client can connect
            self._tasks.append(asyncio.create_task(parts.files.run(), name="file-source"))
        server = await self._bind()
        await server.start()
        self._server, self._state = server, Lifecycle.SERVING
        if self.admin is not None:
            self._admin_port = await self.admin.start(self.config.admin)
        if self.rest is not None:
            self._rest_port = await self.rest.start()
        if self.origins is not None and self.groups is None:
            # With node groups every stream, fetch and poll is served by its
            # group, whose origin streams open with its first client: the
            # relay's own would serve nobody, so it is never opened.
            self._tasks.append(asyncio.create_task(self.origins.run(), name="upstream"))
        self._tasks.append(asyncio.create_task(self._report_ready(), name="ready"))
        self._tasks.append(asyncio.create_task(parts.core.expire_ttls(), name="ttl"))
        self._tasks.append(asyncio.create_task(watch_loop_lag(self.metrics.loop_lag),
                                               name="loop-lag"))
        self._tasks.append(asyncio.create_task(watch_gc_pauses(self.metrics.gc_pauses),
                                               name="gc-pauses"))
        self._log_serving()

    async def _bind(self) -> grpc.aio.Server:
        """The xDS server, its services added and its port bound (not started)."""
        parts = self._parts
        # gRPC sets SO_REUSEPORT unless told not to: then a second relay
        # started on the same port would silently take half its connections.
        # Only the worker processes of one relay share a port, on purpose.
        options = [*server_options(self.config, private=parts.private),
                   ("grpc.so_reuseport", 1 if parts.reuse_port else 0)]
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers(discovery_handlers(self.serving, parts.fetcher))
        await add_ecosystem_services(server, self.serving, self._health, self.origins)
        try:
            if parts.certificates is not None:
                self._xds_port = server.add_secure_port(
                    parts.listen, server_credentials(parts.certificates))
            else:
                self._xds_port = server.add_insecure_port(parts.listen)
        except RuntimeError:  # what gRPC raises when it cannot bind
            self._xds_port = 0
        if self._xds_port == 0:  # gRPC says no more than that it failed
            key = "the workers' socket" if parts.private else "server.address"
            raise OSError(f"cannot listen on {parts.listen} ({key}): the port is in use, or "
                          f"the address is not this host's")
        return server

    def _log_serving(self) -> None:
        """Say where xDS (and the admin endpoints) are served."""
        listen, certificates = self._parts.listen, self._parts.certificates
        serving = listen if listen.startswith("unix:") else \
            f"{self.config.server.address.host}:{self._xds_port}"
        if certificates is not None:
            mutual = certificates.current.client_ca_pem is not None
            serving += " (mutual TLS)" if mutual else " (TLS)"
        if self.admin is None:
            log.info("serving xDS on %s", serving)
        else:
            log.info("serving xDS on %s, admin on %s:%d", serving,
                     self.config.admin.address.host, self._admin_port)

    async def _report_ready(self) -> None:
        """Turn the xDS services' gRPC health SERVING once synced, or at once
        when serving a snapshot (as ``/ready``)."""
        if self.origins is not None and self.groups is None:
            for origin, client in self.origins:
                if not self._origin_ready(origin):
                    await client.synced_event.wait()
        await self._health.set_ready()

    async def stop(self, grace: float | None = 0.5) -> None:
        """Stop serving; close downstream streams and the origin stream. Idempotent."""
        if self._state is Lifecycle.STOPPED:
            return
        self._state = Lifecycle.STOPPED
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            await ended(task)
        self._tasks = []
        if self.admin is not None:
            await self.admin.stop()
        if self.rest is not None:
            await self.rest.stop()
        if self.groups is None:
            await self._close_snapshot()
        server, self._server = self._server, None
        if server is not None:  # it was serving
            # Streams never end on their own: close them with a status the
            # clients understand, rather than leaving gRPC to cancel them.
            self.serving.close_streams("the relay is shutting down")
            await server.stop(grace)
        # after both servers: no fetch can take a new lease any more
        await self._parts.fetcher.aclose()
        if self.groups is not None:
            # each group writes what is left of its snapshot, on the relay's
            # connections: closed after them
            await self.groups.close()
            await self._close_snapshot()
        # Bounded: a collector that does not answer must not hold up the exit.
        self._parts.meter_provider.shutdown(timeout_millis=1000)  # type: ignore[attr-defined]

    async def _close_snapshot(self) -> None:
        """Write what is left (a store that does not answer soon is given up
        on: the next relay catches up from the origin) and close the store."""
        writers = list(self._snapshot_writers.values())
        if writers:
            with contextlib.suppress(TimeoutError):
                await within(
                    asyncio.gather(*(writer.write_pending() for writer in writers)), 2.0)
        for store in self._parts.snapshots.values():
            await store.close()

    async def wait(self) -> None:
        """Run until the server stops."""
        if self._server is not None:
            await self._server.wait_for_termination()


def signal_queue() -> asyncio.Queue[signal.Signals]:
    """SIGINT and SIGTERM as they arrive from now on (handled on the running loop).

    Install it before starting anything: a SIGTERM while starting must still
    end in a clean exit.
    """
    signals: asyncio.Queue[signal.Signals] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, signals.put_nowait, signum)
    return signals


async def serve_until_signalled(relay: Relay, signals: asyncio.Queue[signal.Signals]) -> None:
    """Serve until a signal, then stop: SIGTERM drains first (see :meth:`Relay.drain`);
    SIGINT, or a second signal during the drain, stops at once."""
    received = await signals.get()
    if received == signal.SIGTERM:
        log.info("SIGTERM: draining over %.1fs (signal again to stop now)",
                 relay.config.server.drain_period)
        drain = asyncio.create_task(relay.drain())
        again = asyncio.create_task(signals.get())
        await asyncio.wait({drain, again}, return_when=asyncio.FIRST_COMPLETED)
        for task in (drain, again):
            task.cancel()
        if drain.done() and not drain.cancelled() and drain.exception() is not None:
            log.error("drain failed; stopping now", exc_info=drain.exception())
    log.info("shutting down")
    await relay.stop(grace=1.0)
