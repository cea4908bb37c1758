"""Node groups: clients whose nodes agree on some fields share an origin stream.

Origins that build configuration per node (go-control-plane's
``SnapshotCache`` keyed by a ``NodeHash``, istiod's per-proxy generation)
answer the relay's own node with the relay's configuration. With
``upstream.node_groups`` the relay sorts its clients by the ``key`` fields of
their nodes; each group is served by a core of its own (cache, interest
index, a client per origin) whose origin streams carry a node built from the
relay's plus the group's key fields and the ``copy`` fields of its first
client (see :func:`group_node`). A stream joins its group at its first
request and keeps it; the group's streams to its origins open with its first
client and close ``linger`` after its last one left.

The top of this module is pure (the key of a node, a group's node); the
bottom, :class:`NodeGroups`, keeps the groups open and closes idle ones on
the relay's clock. What a group's core is, the app builds
(:func:`relay.app.build_relay`): this module only asks for one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal, Protocol

from envoy.config.core.v3 import base_pb2
from google.protobuf import json_format, struct_pb2

from relay.clock import ended
from relay.protocol.limits import LimitExceeded, shown
from relay.protocol.outcome import ProtocolError

if TYPE_CHECKING:
    from relay.cache import ResourceCache
    from relay.clock import Clock
    from relay.interest import InterestIndex
    from relay.protocol.view import CacheView
    from relay.server.fetch import Fetcher

log = logging.getLogger("relay.groups")

#: upstream.node_groups.max_groups when not configured.
DEFAULT_MAX_GROUPS = 1000
#: upstream.node_groups.linger when not configured: an idle group's origin
#: stream stays open this long (seconds), for clients that reconnect.
DEFAULT_GROUP_LINGER = 300.0
#: The longest value of one key field (characters): longer ones are refused.
MAX_KEY_VALUE = 128
#: What the limit counts under (xds_relay_downstream_limited_streams' label).
MAX_GROUPS_LIMIT = "node_groups.max_groups"

#: Node fields a key or copy may name, besides ``metadata.<field>[.<field>...]``.
NODE_FIELDS: Final = ("id", "cluster", "user_agent_name", "locality.region",
                      "locality.zone", "locality.sub_zone")

Missing = Literal["empty", "refuse"]


class GroupKeyError(ProtocolError):
    """A client's node gives no usable group key (the stream is refused)."""


def field_error(name: str) -> str | None:
    """Why ``name`` is not a node field a group may name (None: it is)."""
    if name in NODE_FIELDS:
        return None
    if name.startswith("metadata."):
        if all(name.split(".")[1:]):
            return None
        return f"{name!r} has an empty part: metadata fields are metadata.A or metadata.A.B"
    return (f"{name!r} is not a node field a group can use; use one of "
            f"{', '.join(NODE_FIELDS)} or metadata.<field> (nested with dots)")


def _metadata_value(node: base_pb2.Node, path: list[str]) -> struct_pb2.Value | None:
    struct: struct_pb2.Struct = node.metadata
    for depth, part in enumerate(path):
        if part not in struct.fields:
            return None
        value: struct_pb2.Value = struct.fields[part]
        if depth == len(path) - 1:
            return value
        if value.WhichOneof("kind") != "struct_value":
            return None
        struct = value.struct_value
    return None


def field_value(node: base_pb2.Node, name: str) -> str | None:
    """The value of the node field ``name`` as text (None: the node has none).

    A metadata value that is not a string is its JSON, keys sorted: equal
    values give equal text whatever order the client wrote them in.
    """
    if name.startswith("metadata."):
        value = _metadata_value(node, name.split(".")[1:])
        if value is None or value.WhichOneof("kind") in (None, "null_value"):
            return None
        if value.WhichOneof("kind") == "string_value":
            return value.string_value or None
        return json.dumps(json_format.MessageToDict(value), sort_keys=True,
                          separators=(",", ":"))
    owner: object = node
    *parents, last = name.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    text: str = getattr(owner, last)
    return text or None


@dataclass(frozen=True)
class GroupSpec:
    """``upstream.node_groups``: which node fields make a client's group."""

    key: tuple[str, ...]
    copy: tuple[str, ...] = ()
    max_groups: int = DEFAULT_MAX_GROUPS
    linger: float = DEFAULT_GROUP_LINGER
    missing: Missing = "empty"

    def key_of(self, node: base_pb2.Node | None) -> tuple[str, ...]:
        """The values of the key fields of ``node`` (a missing one: empty, or
        :class:`GroupKeyError` when ``missing`` is refuse; one over
        :data:`MAX_KEY_VALUE` characters: GroupKeyError)."""
        node = node if node is not None else base_pb2.Node()
        values = []
        for name in self.key:
            value = field_value(node, name)
            if value is None:
                if self.missing == "refuse":
                    raise GroupKeyError(
                        f"the client's node has no {name}, which upstream.node_groups.key "
                        f"needs (node_groups.missing is refuse)")
                value = ""
            elif len(value) > MAX_KEY_VALUE:
                raise GroupKeyError(
                    f"the client's node {name} is {len(value)} characters, more than the "
                    f"{MAX_KEY_VALUE} a node group key value may be: {shown(value, 32)}")
            values.append(value)
        return tuple(values)


def group_id(key: tuple[str, ...]) -> str:
    """A short, stable name for the group of ``key``: what its origins and
    ``/clients`` call it (the values themselves may be long and are
    shown bounded)."""
    digest = hashlib.blake2b(json.dumps(key).encode(), digest_size=6).hexdigest()
    return f"g-{digest}"


def _set_metadata(target: base_pb2.Node, path: list[str], value: struct_pb2.Value) -> None:
    struct: struct_pb2.Struct = target.metadata
    for part in path[:-1]:
        inner = struct.fields[part]
        if inner.WhichOneof("kind") != "struct_value":
            inner.struct_value.Clear()  # a scalar there: the nested field wins
        struct = inner.struct_value
    struct.fields[path[-1]].CopyFrom(value)


def group_node(relay_node: base_pb2.Node, client: base_pb2.Node | None,
               fields: Iterable[str]) -> base_pb2.Node:
    """The node a group's origin streams carry: the relay's, with ``fields``
    (the key and copy fields) as ``client`` (the group's first) has them.

    The id stays the relay's unless ``id`` is among ``fields``; a field the
    client lacks stays as the relay has it.
    """
    made = base_pb2.Node()
    made.CopyFrom(relay_node)
    if client is None:
        return made
    for name in fields:
        if name.startswith("metadata."):
            path = name.split(".")[1:]
            value = _metadata_value(client, path)
            if value is not None:
                _set_metadata(made, path, value)
            continue
        text = field_value(client, name)
        if text is None:
            continue
        owner: object = made
        *parents, last = name.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, last, text)
    return made


# -- the groups open ---------------------------------------------------------


class GroupCore(Protocol):
    """What a group is served from: its own cache (seen through ``view``),
    interest index and origin clients."""

    @property
    def cache(self) -> ResourceCache: ...

    @property
    def index(self) -> InterestIndex: ...

    @property
    def view(self) -> CacheView: ...

    @property
    def fetcher(self) -> Fetcher:
        """Answers the group's nodes' fetches and polls (its leases in the group's index)."""

    async def run(self, clients: Callable[[], int]) -> None:
        """Follow the group's origins until cancelled (``clients()``: how many
        streams the group serves now)."""

    async def retire(self) -> None:
        """The group closed for good (idle): forget what it keeps outside the
        process (its snapshot). Not called when the relay stops."""

    async def close(self) -> None:
        """The group is closed (after :meth:`run` ended, or without it ever
        running): write what is left and release what it holds."""


#: Builds a group's core: (group id, key, the node its origin streams carry).
CoreFactory = Callable[[str, tuple[str, ...], base_pb2.Node], GroupCore]


@dataclass(eq=False)
class Group:
    """One group: its key, its core, and how many streams it serves."""

    id: str
    key: tuple[str, ...]
    core: GroupCore
    clients: int = 0
    _task: asyncio.Task[None] | None = field(default=None, repr=False)
    _closing: asyncio.Task[None] | None = field(default=None, repr=False)

    def shown_key(self) -> list[str]:
        """The key's values, each cut to 64 characters (for /clients and logs)."""
        return [shown(value, 64) for value in self.key]


class NodeGroups:
    """The groups open: joined by each stream at its first request, left when
    it ends, closed ``spec.linger`` after their last stream left (on ``clock``).
    """

    def __init__(self, spec: GroupSpec, relay_node: base_pb2.Node, make: CoreFactory,
                 clock: Clock) -> None:
        self.spec: Final = spec
        self._relay_node = relay_node
        self._make = make
        self._clock = clock
        self._groups: dict[str, Group] = {}
        self._fields = tuple(dict.fromkeys((*spec.key, *spec.copy)))
        # by group id: groups closed for good whose cores are still retiring (see
        # _close); a group of the same key opened meanwhile runs once it is done
        self._retiring: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def groups(self) -> list[Group]:
        """The groups open now (a copy)."""
        return list(self._groups.values())

    def sizes(self) -> list[int]:
        """How many streams each open group serves."""
        return [group.clients for group in list(self._groups.values())]

    def join(self, node: base_pb2.Node | None) -> Group:
        """The group of a stream whose first request carried ``node``, counted as
        serving it; opened if it was not. Raises :class:`GroupKeyError`, or
        :class:`LimitExceeded` when it would be group ``max_groups + 1``."""
        key = self.spec.key_of(node)
        gid = group_id(key)
        group = self._groups.get(gid)
        if group is None:
            if len(self._groups) >= self.spec.max_groups and not self._close_an_idle_group():
                raise LimitExceeded(MAX_GROUPS_LIMIT, (
                    f"the relay serves {len(self._groups)} node groups, its most "
                    f"(upstream.node_groups.max_groups); this client's would be a new one"))
            group = Group(gid, key, self._make(gid, key, group_node(self._relay_node, node,
                                                                     self._fields)))
            self._groups[gid] = group
            log.info("node group %s opened for %s", gid,
                     ", ".join(f"{name}={value!r}"
                               for name, value in zip(self.spec.key, group.shown_key(),
                                                      strict=True)))
        if group._task is None:  # new, or restored and joined for the first time
            group._task = asyncio.get_running_loop().create_task(
                self._run(group), name=f"node-group-{gid}")
        if group._closing is not None:
            group._closing.cancel()
            group._closing = None
        group.clients += 1
        return group

    async def _run(self, group: Group) -> None:
        """Run ``group``'s core, once a closed group of its key has retired (whose
        snapshot it would otherwise lose to the retiring one's deletion)."""
        await _ended(self._retiring.get(group.id))
        await group.core.run(lambda: group.clients)

    def restore(self, gid: str, key: tuple[str, ...], node: base_pb2.Node) -> Group | None:
        """A group a snapshot held (``node``: what its origin streams asked as),
        open but not running: its origin streams open when a client joins it,
        and it closes for good ``linger`` from now if none does. None: there are
        ``max_groups`` already.

        Its streams ask as this relay's node with the key and copy fields of
        ``node`` (those its first client gave): the rest is this relay's own
        (its id, locality, metadata), not that of the relay that wrote the
        snapshot, which may be another replica or an older configuration."""
        if gid in self._groups or len(self._groups) >= self.spec.max_groups:
            return None
        made = group_node(self._relay_node, node, self._fields)
        group = self._groups[gid] = Group(gid, key, self._make(gid, key, made))
        group._closing = asyncio.get_running_loop().create_task(
            self._close_at(group, self._clock.now() + self.spec.linger),
            name=f"node-group-linger-{gid}")
        return group

    def leave(self, group: Group) -> None:
        """A stream of ``group`` ended: the group closes after linger if it was its last."""
        group.clients -= 1
        if group.clients or self._groups.get(group.id) is not group:
            return
        # From now, not from when the task first runs.
        deadline = self._clock.now() + self.spec.linger
        group._closing = asyncio.get_running_loop().create_task(
            self._close_at(group, deadline), name=f"node-group-linger-{group.id}")

    def touch(self, group: Group) -> None:
        """A request of ``group`` answered without joining it (a REST poll
        answered again, see :meth:`relay.server.fetch.Fetcher.unchanged`): as
        if it had joined and left, an idle group's linger starts again now."""
        if self._groups.get(group.id) is not group:
            return
        if group._closing is not None:
            group._closing.cancel()
            group._closing = None
        group.clients += 1
        self.leave(group)

    async def _close_at(self, group: Group, deadline: float) -> None:
        await self._clock.sleep(deadline - self._clock.now())
        if not group.clients:
            group._closing = None
            self._close(group, retire=True)

    def _close_an_idle_group(self) -> bool:
        """Close the idle group that lingers (the first such): whether one did."""
        for group in self._groups.values():
            if not group.clients:
                self._close(group, retire=True)
                return True
        return False

    def _close(self, group: Group, *, retire: bool) -> None:
        """Close ``group``; ``retire``: for good (idle), its snapshot deleted too."""
        if self._groups.get(group.id) is group:
            del self._groups[group.id]
        closing, group._closing = group._closing, None
        if closing is not None and closing is not asyncio.current_task():
            closing.cancel()
        if group._task is not None:
            group._task.cancel()
        log.info("node group %s closed", group.id)
        if retire:
            before = self._retiring.get(group.id)
            task = self._retiring[group.id] = asyncio.get_running_loop().create_task(
                self._retire(group, before), name=f"node-group-retire-{group.id}")
            task.add_done_callback(
                lambda done: self._retiring.pop(group.id, None)
                if self._retiring.get(group.id) is done else None)

    async def _retire(self, group: Group, before: asyncio.Task[None] | None) -> None:
        await _ended(before)  # the same key's group retiring earlier
        await _ended(group._task)
        try:
            await group.core.retire()
        finally:
            await group.core.close()

    async def close(self) -> None:
        """Close every group (the relay stops): each writes what is left of its
        snapshot and keeps it, for the next start."""
        groups = list(self._groups.values())
        for group in groups:
            self._close(group, retire=False)
        for group in groups:
            await _ended(group._task)
        # together: each may wait for its store (a stopping relay waits for the slowest)
        await asyncio.gather(*(group.core.close() for group in groups), return_exceptions=True)
        for task in list(self._retiring.values()):
            await _ended(task)


async def _ended(task: asyncio.Task[None] | None) -> None:
    """Wait for ``task`` (cancelled, or done) to end, whatever its outcome
    (a cancellation of the waiting task's own is raised: see :func:`ended`)."""
    await ended(task, errors_too=True)
