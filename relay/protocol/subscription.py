"""What the delta and SotW subscription states share.

Both track, for one type on one stream, which names the client subscribed to
(with which dynamic parameters), what it holds, and which names to look at
again before the next response. They differ in how requests are read and
what a response looks like; see :mod:`relay.protocol.delta` and
:mod:`relay.protocol.sotw`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from relay.constraints import EMPTY_PARAMS, Params
from relay.interest import Interest
from relay.protocol.held import Held
from relay.protocol.outcome import Nack
from relay.protocol.view import ResourceView
from relay.resource import CachedResource


@dataclass
class SubscriptionState:
    """Subscription state of one type on one stream, either variant."""

    type_url: str
    wildcard: bool = False
    names: set[str] = field(default_factory=set)
    # dynamic parameters of names subscribed with a ResourceLocator
    locator_params: dict[str, Params] = field(default_factory=dict)
    # the node's dynamic parameters for this type: they apply to plain names
    node_params: Params = EMPTY_PARAMS
    # name -> what the client holds, as far as we know
    held: dict[str, Held] = field(default_factory=dict)
    # names to re-evaluate on the next response; ``recheck_all`` means every name
    pending: set[str] = field(default_factory=set)
    recheck_all: bool = False
    pending_heartbeats: set[str] = field(default_factory=set)
    # names the cache changed since the last response was built (a subset of
    # ``pending``, which also holds names just subscribed)
    changed: set[str] = field(default_factory=set)
    # arrival stamp when each name was subscribed; names whose do-not-cache
    # copy is older need a fresh fetch from the origin (``refetch``)
    since: dict[str, int] = field(default_factory=dict)
    refetch: set[str] = field(default_factory=set)
    # a response is owed even if it would be empty (first wildcard request)
    must_answer: bool = False
    started: bool = False
    # nonce of the response the client has not answered yet
    inflight_nonce: str | None = None
    last_nack: Nack | None = None
    # name -> the origin's error as last forwarded, so each is sent once
    errors_sent: dict[str, discovery_pb2.ResourceError] = field(default_factory=dict)

    def resources_changed(self, names: frozenset[str], everything: bool) -> int:
        """The cache changed these names (or, with ``everything``, possibly any).

        Returns how many of them were already waiting behind a response the
        client has not answered: the change before this one will never reach
        it (coalesced, latest wins).
        """
        if everything:
            self.recheck_all = True
        coalesced = len(self.changed & names) if self.inflight_nonce and self.changed else 0
        self.changed.update(names)
        self.pending.update(names)
        return coalesced

    def params_for(self, name: str) -> Params:
        """A locator's own parameters, else the node's for this type."""
        return self.locator_params.get(name, self.node_params)

    def set_node_params(self, params: Params) -> bool:
        """The node's parameters for this type changed: re-evaluate plain names.

        Returns whether the subscription's interest changed.
        """
        if params == self.node_params:
            return False
        before = self.interest()
        self.node_params = params
        self.pending.update(n for n in self.names if n not in self.locator_params)
        if self.wildcard:
            self.recheck_all = True
        return self.interest() != before

    def interest(self) -> Interest:
        params = frozenset((name, p) for name in self.names if (p := self.params_for(name)))
        return Interest(frozenset(self.names), self.wildcard, params)


def heartbeats_due(names: set[str], sending: list[CachedResource], view: ResourceView,
                   type_url: str, held: dict[str, Held], params_for: Callable[[str], Params],
                   subscribed: Callable[[str], bool]) -> list[CachedResource]:
    """Resources to send as heartbeats: confirmed, held by the client, not being sent."""
    out = []
    being_sent = {r.name for r in sending}
    for name in sorted(names - being_sent):
        if not subscribed(name):
            continue
        found = view.lookup(type_url, name, params_for(name))
        current = held.get(name)
        if isinstance(found, CachedResource) and current is not None and \
                current.is_current(found):
            out.append(found)
    return out


def forward_error(error: discovery_pb2.ResourceError | None, name: str,
                  sent: dict[str, discovery_pb2.ResourceError]
                  ) -> discovery_pb2.ResourceError | None:
    """The origin's error for ``name`` if this client has not been told it yet."""
    if error is None:
        sent.pop(name, None)
        return None
    if sent.get(name) == error:
        return None
    sent[name] = error
    return error
