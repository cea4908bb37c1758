"""What each downstream client holds: CSDS messages and the admin view's summary.

Pure functions from :class:`~relay.protocol.snapshot.SessionSnapshot` (one per
stream) to ``envoy.service.status.v3`` messages, and to the dictionaries
``/clients`` shows: both render the same snapshot. ``/clients`` also compares
it with the cache (:func:`type_sync`), which CSDS does not. The gRPC servicer around
them is in :mod:`relay.server.ecosystem`. The relay is the management server
of its clients, so every resource carries both views: ``config_status`` (what
the relay sent and how it was answered) and ``client_status`` (what the
client therefore holds).

The protocol state records per name only what was last sent, so some answers
are approximations (see the states' ``_held_status``): for delta, a resource
is NACKED while the latest NACK of its type listed it at the version it holds
(an older NACK overwritten by a newer one is lost); for SotW, every held name
of a type shares the fate of the latest response of that type.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envoy.admin.v3 import config_dump_shared_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.status.v3 import csds_pb2
from envoy.type.matcher.v3 import node_pb2, string_pb2
from google.protobuf import any_pb2

from relay.cache import Missing, ResourceCache
from relay.constraints import UNCONSTRAINED
from relay.errors import RelayError
from relay.protocol.snapshot import (
    ResourceState,
    ResourceStatus,
    SessionSnapshot,
    TypeSnapshot,
)
from relay.redaction import redacted
from relay.turns import made
from relay.xds_types import ADS_SERVICE, PER_TYPE_SERVICES

GenericXdsConfig = csds_pb2.ClientConfig.GenericXdsConfig
# per type URL, the per-type service whose streams are fixed to it
_SERVICES = {service.type_url: service.service for service in PER_TYPE_SERVICES}
ClientStatus = config_dump_shared_pb2.ClientResourceStatus
ConfigStatus = csds_pb2.ConfigStatus
NodePredicate = Callable[[base_pb2.Node | None], bool]

# what the client holds -> (client_status, config_status: the relay's side of it)
_STATUSES = {
    ResourceStatus.ACKED: (ClientStatus.ACKED, ConfigStatus.SYNCED),
    ResourceStatus.NACKED: (ClientStatus.NACKED, ConfigStatus.ERROR),
    # sent, not yet answered: the client's view is not known yet
    ResourceStatus.SENT: (ClientStatus.UNKNOWN, ConfigStatus.STALE),
    ResourceStatus.REQUESTED: (ClientStatus.REQUESTED, ConfigStatus.NOT_SENT),
    ResourceStatus.DOES_NOT_EXIST: (ClientStatus.DOES_NOT_EXIST, ConfigStatus.UNKNOWN),
    ResourceStatus.RECEIVED_ERROR: (ClientStatus.RECEIVED_ERROR, ConfigStatus.UNKNOWN),
}


class UnsupportedMatcher(RelayError, ValueError):
    """A ``node_matchers`` entry this relay cannot evaluate."""


def client_status(request: csds_pb2.ClientStatusRequest,
                  clients: Iterable[tuple[SessionSnapshot, str]],
                  cache: ResourceCache) -> csds_pb2.ClientStatusResponse:
    """Answer one CSDS request: a ClientConfig per connected stream the matchers select.

    ``clients`` are snapshots with their peers. Raises :class:`UnsupportedMatcher`
    for matchers the relay cannot evaluate, whether or not any stream is connected.
    """
    selected = node_predicate(request.node_matchers)
    contents = not request.exclude_resource_contents
    chosen = sorted(((snapshot, peer) for snapshot, peer in clients if selected(snapshot.node)),
                    key=lambda item: (item[0].node_id, item[1]))
    return csds_pb2.ClientStatusResponse(
        config=[client_config(snapshot, cache, contents) for snapshot, _ in chosen])


def client_config(snapshot: SessionSnapshot, cache: ResourceCache,
                  contents: bool = True) -> csds_pb2.ClientConfig:
    """One stream's node and, per type and name, what its client holds or awaits.

    With ``contents`` false the resource bodies are left out.
    """
    config = csds_pb2.ClientConfig()
    if snapshot.node is not None:
        config.node.CopyFrom(snapshot.node)
    entries = [entry for state in snapshot.types
               for entry in resource_configs(state, cache, contents)]
    entries.sort(key=lambda e: (e.type_url, e.name))
    config.generic_xds_configs.extend(entries)
    return config


def resource_configs(state: TypeSnapshot, cache: ResourceCache,
                     contents: bool = True) -> list[csds_pb2.ClientConfig.GenericXdsConfig]:
    """The GenericXdsConfig of every name one type's state holds or is subscribed to."""
    out: list[csds_pb2.ClientConfig.GenericXdsConfig] = []
    for resource in state.resources:
        client, config = _STATUSES[resource.status]
        entry = GenericXdsConfig(type_url=state.type_url, name=resource.name,
                                 client_status=client)
        if resource.status in (ResourceStatus.ACKED, ResourceStatus.NACKED,
                               ResourceStatus.SENT, ResourceStatus.REQUESTED):
            entry.config_status = config
        if resource.version:
            entry.version_info = resource.version
            body = _body(cache, state.type_url, resource) if contents else None
            if body is not None:
                entry.xds_config.CopyFrom(body)
        if resource.status is ResourceStatus.NACKED:
            entry.error_state.details = resource.message
            entry.error_state.version_info = resource.version
        elif resource.status is ResourceStatus.RECEIVED_ERROR:
            # The origin's error for it was passed on; the client holds nothing.
            entry.error_state.details = resource.message
        out.append(entry)
    return out


def _body(cache: ResourceCache, type_url: str, held: ResourceState) -> any_pb2.Any | None:
    """The cached body of the exact version and variant the client holds, if still
    cached, its secrets redacted."""
    variants = cache.variants(type_url, held.subscribed_as)
    if isinstance(variants, Missing):
        return None
    if held.variant_key is not None:
        candidates = [variants[held.variant_key]] if held.variant_key in variants else []
    else:
        candidates = list(variants.values())
    for resource in candidates:
        if resource.version == held.version and resource.resource.HasField("resource"):
            return redacted(resource.body)
    return None


@dataclass(frozen=True, slots=True)
class StreamTimes:
    """When a stream opened and was last answered, in Unix seconds (wall time).

    ``answered`` has, per type URL, when the client last ACKed and last NACKed
    a response of that type (None: never).
    """

    connected_since: float
    answered: Mapping[str, tuple[float | None, float | None]]

    def latest(self) -> tuple[float | None, float | None]:
        """The stream's last ACK and last NACK, of any type."""
        acks = [acked for acked, _ in self.answered.values() if acked is not None]
        nacks = [nacked for _, nacked in self.answered.values() if nacked is not None]
        return max(acks, default=None), max(nacks, default=None)


#: Resources a ``/clients`` record compares with the cache between two of
#: :func:`client_summary_slices`' pauses (a few milliseconds of the loop).
RESOURCES_PER_SLICE = 1_000


class ClientRecords:
    """``/clients`` records, each built as it is taken.

    Iterated, whole records (an iterator). :meth:`slices` gives the same
    records with ``None`` between slices of a record's making as well (see
    :func:`client_summary_slices`): a caller that can let others run there
    does, so that a client of 5,000 resources does not hold the loop for
    all of them at once. ``parts`` makes them, with those ``None``.
    """

    def __init__(self, parts: Iterator[dict[str, Any] | None]) -> None:
        self._parts = parts

    def __iter__(self) -> ClientRecords:
        return self

    def __next__(self) -> dict[str, Any]:
        for part in self._parts:
            if part is not None:
                return part
        raise StopIteration

    def slices(self) -> Iterator[dict[str, Any] | None]:
        """The records left, with ``None`` wherever the loop may run others."""
        return self._parts


def client_summary(snapshot: SessionSnapshot, peer: str, cache: ResourceCache,
                   times: StreamTimes | None = None) -> dict[str, Any]:
    """:func:`client_summary_slices`, made in one go."""
    return made(client_summary_slices(snapshot, peer, cache, times))


def client_summary_slices(snapshot: SessionSnapshot, peer: str, cache: ResourceCache,
                          times: StreamTimes | None = None,
                          per_slice: int = RESOURCES_PER_SLICE
                          ) -> Generator[None, None, dict[str, Any]]:
    """What ``/clients`` shows of one stream: per type, what it subscribes to,
    holds, ACKed and last NACKed, and how that compares with the cache.

    ``acked`` is the version_info of the last ACKed response for SotW, and its
    nonce for delta (whose versions are per resource: ``versions``). A NACK
    names what it rejected: SotW's ``version``, delta's ``versions``. ``sync``
    and ``unsynced`` compare the stream with ``cache``: see :func:`type_sync`.

    With ``times``, the stream has ``connected_since``, ``acked_at`` and
    ``nacked_at`` (its last ACK and NACK of any type), and each type its own
    ``acked_at`` and ``nacked_at``: Unix seconds, null for never.

    The record is what the generator returns; it yields (``None``) first
    when the snapshot holds more than ``per_slice`` resources (it was just
    made), then after each ``per_slice`` resources compared with the cache,
    where its caller may let others run (the comparison reads the cache as
    it is then).
    """
    answered = {} if times is None else times.answered
    types: dict[str, Any] = {}
    budget = _Slices(per_slice)
    if sum(len(state.resources) for state in snapshot.types) > per_slice:
        # A big snapshot was just made (a copy of the stream's state): a pause of its own.
        yield
    for state in snapshot.types:
        rejected = _rejected(state, snapshot.protocol)
        sync, unsynced = yield from _type_sync_slices(state, cache, budget)
        types[state.type_url] = {
            "subscribed": list(state.subscribed),
            "wildcard": state.wildcard,
            # what the client was last sent (or declared it has), per name
            "versions": dict(state.versions),
            "acked": state.acked,
            # the response the client has not answered yet: until it does,
            # ``versions`` may not be what the client runs
            "in_flight": state.in_flight,
            "last_nack": rejected,
            "sync": sync,
            "unsynced": unsynced,
        }
        if times is not None:
            acked_at, nacked_at = answered.get(state.type_url, (None, None))
            types[state.type_url].update(acked_at=acked_at, nacked_at=nacked_at)
    summary: dict[str, Any] = {"node_id": snapshot.node_id, "peer": peer,
                               "protocol": snapshot.protocol, "service": service_of(snapshot)}
    if times is not None:
        acked_at, nacked_at = times.latest()
        summary.update(connected_since=times.connected_since, acked_at=acked_at,
                       nacked_at=nacked_at)
    summary["types"] = types
    return summary


def _rejected(state: TypeSnapshot, protocol: str) -> dict[str, Any] | None:
    """The stream's last NACK of a type as ``/clients`` shows it (None: none):
    what it rejected, SotW's ``version`` or delta's ``versions``."""
    nack = state.last_nack
    if nack is None:
        return None
    rejected: dict[str, Any] = {"nonce": nack.nonce, "message": nack.message}
    if protocol == "delta":
        rejected["versions"] = dict(nack.resources)
    else:
        rejected["version"] = nack.version_info
    return rejected


def service_of(snapshot: SessionSnapshot) -> str:
    """The gRPC service a stream came through: ADS, or the per-type service of its type."""
    fixed = snapshot.fixed_type_url
    return ADS_SERVICE if fixed is None else _SERVICES[fixed]


# The values of ``sync``, from the worst.
NACKED = "nacked"
STALE = "stale"
NOT_SENT = "not_sent"
SYNCED = "synced"


def type_sync(state: TypeSnapshot, cache: ResourceCache) -> tuple[str, dict[str, Any]]:
    """How one type of one stream compares with the cache: its ``sync``, and
    what ``unsynced`` lists.

    ``unsynced`` has, by the name subscribed (as in ``versions``), every
    resource that the client does not hold ACKED at the version the cache has
    for it (those are the common case: they are in ``versions`` only, so that
    a client in sync costs nothing more). Each entry has ``status`` (a
    :class:`~relay.protocol.snapshot.ResourceStatus` value: what CSDS reports
    as its ``client_status``); ``version``, what the client holds, when it
    holds something; ``cached_version`` when the cache's differs from
    ``version`` (null: the cache has none); ``name`` when the resource goes
    by another name than the one subscribed (an alias); ``error``, the
    origin's message, for ``received_error``. A NACK's message is the type's
    ``last_nack``, not repeated per resource.

    ``sync``, the first of these that holds:

    * ``nacked``: a resource is NACKED (the latest response carrying it was
      rejected, and nothing the client accepted has replaced it);
    * ``stale``: a response is in flight (sent, not yet answered), or the
      cache has moved on from what the client holds (a new version, another
      variant, or a resource the cache no longer has): a push is under way;
    * ``not_sent``: a subscribed name (or, for a wildcard, any name of the
      type) is cached but nothing of it was sent yet;
    * ``synced``: otherwise. Names the origin has not answered, names the
      client was told do not exist and the origin's errors do not stop a type
      from being synced: the client has what the cache has.

    The cache's version of a held resource is that of the variant it was
    sent. For a name not held (and one the client only declared), only an
    unconstrained variant is compared: which constrained variant a client's
    parameters select is not in the snapshot. CSDS reports the same resource
    statuses; it does not compare with the cache.
    """
    return made(_type_sync_slices(state, cache, _Slices(RESOURCES_PER_SLICE)))


class _Slices:
    """Counts the resources compared, saying when a slice's worth is done."""

    __slots__ = ("_left", "_size")

    def __init__(self, size: int) -> None:
        self._size = self._left = max(1, size)

    def done(self, count: int) -> bool:
        """``count`` more compared: True when a slice is full (counting starts again)."""
        self._left -= count
        if self._left > 0:
            return False
        self._left = self._size
        return True


def _type_sync_slices(state: TypeSnapshot, cache: ResourceCache, budget: _Slices
                      ) -> Generator[None, None, tuple[str, dict[str, Any]]]:
    """:func:`type_sync`, yielding whenever ``budget`` says a slice is done."""
    unsynced: dict[str, Any] = {}
    sync = _Sync(stale=state.in_flight is not None)
    seen: set[str] = set()
    for resource in state.resources:
        if budget.done(1):
            yield
        subscribed_as = resource.subscribed_as or resource.name
        seen.add(subscribed_as)
        known, cached = _cached_version(cache, state.type_url, subscribed_as,
                                        resource.variant_key)
        if resource.status is ResourceStatus.ACKED and (not known or cached == resource.version):
            continue
        unsynced[subscribed_as] = _unsynced_entry(resource, subscribed_as, known, cached)
        sync.count(resource.status, cached)
    if state.wildcard:
        for name, cached in _cached_not_held(cache, state.type_url, seen, budget):
            if name is None:
                yield
                continue
            unsynced[name] = {"status": ResourceStatus.REQUESTED.value, "cached_version": cached}
            sync.count(ResourceStatus.REQUESTED, cached)
    return sync.verdict(), unsynced


@dataclass
class _Sync:
    """What the unsynced resources of one type found so far, folded into its ``sync``."""

    stale: bool
    nacked: bool = False
    not_sent: bool = False

    def count(self, status: ResourceStatus, cached: str | None) -> None:
        """Fold in one unsynced resource: its status, and the cache's version of
        it (None: the cache has none)."""
        if status is ResourceStatus.NACKED:
            self.nacked = True
        elif status in (ResourceStatus.ACKED, ResourceStatus.SENT):
            self.stale = True
        elif status is ResourceStatus.DOES_NOT_EXIST:
            self.stale = self.stale or cached is not None
        elif status is ResourceStatus.REQUESTED:
            self.not_sent = self.not_sent or cached is not None

    def verdict(self) -> str:
        """The type's ``sync``: the worst that holds."""
        if self.nacked:
            return NACKED
        if self.stale:
            return STALE
        return NOT_SENT if self.not_sent else SYNCED


def _unsynced_entry(resource: ResourceState, subscribed_as: str, known: bool,
                    cached: str | None) -> dict[str, Any]:
    """What ``unsynced`` shows of one resource (see :func:`type_sync`)."""
    entry: dict[str, Any] = {"status": resource.status.value}
    if resource.version:
        entry["version"] = resource.version
    if known and cached != (resource.version or None):
        entry["cached_version"] = cached
    if resource.name != subscribed_as:
        entry["name"] = resource.name
    if resource.status is ResourceStatus.RECEIVED_ERROR:
        entry["error"] = resource.message
    return entry


def _cached_not_held(cache: ResourceCache, type_url: str, seen: set[str], budget: _Slices
                     ) -> Iterator[tuple[str, str] | tuple[None, None]]:
    """The names of a type the cache has (unconstrained) and the snapshot does
    not, with their versions: what a wildcard subscription was not sent yet;
    ``(None, None)`` whenever ``budget`` says a slice is done."""
    for name in cache.names(type_url):
        if budget.done(1):
            yield None, None
        if name in seen:
            continue
        known, cached = _cached_version(cache, type_url, name, None)
        if known and cached is not None:
            yield name, cached


def _cached_version(cache: ResourceCache, type_url: str, name: str,
                    variant_key: str | None) -> tuple[bool, str | None]:
    """Whether the cache's version to compare with is known, and that version
    (None: the cache has none).

    ``variant_key`` is the variant the client was sent; None for a name it
    was sent nothing of, or only declared a version of: then the
    unconstrained variant, which every client gets, if there is one.
    """
    variants = cache.variants(type_url, name)
    if isinstance(variants, Missing):
        return True, None
    found = variants.get(variant_key if variant_key is not None else UNCONSTRAINED.key)
    if found is not None:
        return True, found.version
    if variant_key is not None:
        return True, None  # the variant sent is gone
    return False, None


# -- node matchers -----------------------------------------------------------


def node_predicate(matchers: Sequence[node_pb2.NodeMatcher]) -> NodePredicate:
    """A test of nodes for ``node_matchers``: any matcher may match (none means all).

    Supports matching the node id with ``exact``, ``prefix``, ``suffix`` and
    ``contains`` (optionally ``ignore_case``). Raises :class:`UnsupportedMatcher`
    for anything else: ``safe_regex`` (RE2 syntax, which Python's ``re`` does
    not follow exactly), ``custom`` and ``node_metadatas``.
    """
    tests = [_node_test(m) for m in matchers]
    if not tests:
        return lambda node: True
    return lambda node: any(test(node.id if node is not None else "") for test in tests)


def _node_test(matcher: node_pb2.NodeMatcher) -> Callable[[str], bool]:
    if matcher.node_metadatas:
        raise UnsupportedMatcher("node_matchers: node_metadatas are not supported; "
                                 "match on node_id")
    if not matcher.HasField("node_id"):
        return lambda node_id: True
    return string_test(matcher.node_id)


def string_test(matcher: string_pb2.StringMatcher) -> Callable[[str], bool]:
    """A test of strings for one StringMatcher (see :func:`node_predicate`)."""
    kind = matcher.WhichOneof("match_pattern")
    if kind not in ("exact", "prefix", "suffix", "contains"):
        what = "a StringMatcher without a pattern" if kind is None else f"{kind!r}"
        raise UnsupportedMatcher(f"node_matchers: {what} is not supported; use exact, "
                                 "prefix, suffix or contains")
    pattern: str = getattr(matcher, kind)
    fold = matcher.ignore_case
    if fold:
        pattern = pattern.casefold()

    def test(value: str) -> bool:
        if fold:
            value = value.casefold()
        if kind == "exact":
            return value == pattern
        if kind == "prefix":
            return value.startswith(pattern)
        if kind == "suffix":
            return value.endswith(pattern)
        return pattern in value

    return test
