"""Fetches and REST polls with node groups: answered from the group of their node.

With ``upstream.node_groups`` a stream is served by the group its node
belongs to (see :mod:`relay.node_groups`); a one-shot fetch (the gRPC
``Fetch*`` methods) or REST poll carries a node too, and is answered the
same way: :class:`GroupedFetcher` joins the request's group, hands the
request to the group's own :class:`~relay.server.fetch.Fetcher` (whose
leases subscribe in the group's index, on the group's origin streams) and
leaves the group when the answer is made. A group that only polls keeps
its origin streams for ``node_groups.linger`` after the last poll; its
leases lapse ``rest.lease`` after it, or with the group if that is sooner.

So the relay asks its origin only as its groups' nodes: it opens no origin
stream of its own, and a poller gets its own group's configuration, never
the relay's.
"""

from __future__ import annotations

from relay.authorization import PeerIdentity
from relay.clock import Clock
from relay.node_groups import GroupKeyError, NodeGroups
from relay.protocol.limits import LimitExceeded
from relay.protocol.requests import SotwRequest
from relay.server.fetch import (
    DEFAULT_LEASE,
    DEFAULT_WAIT,
    Denied,
    Fetcher,
    FetchOutcome,
    Invalid,
    Lease,
    Limited,
    Served,
)
from relay.server.serving import ServingContext


class GroupedFetcher(Fetcher):
    """A :class:`Fetcher` that answers each request from its node's group."""

    def __init__(self, serving: ServingContext, clock: Clock, groups: NodeGroups,
                 lease: float = DEFAULT_LEASE, wait: float = DEFAULT_WAIT) -> None:
        super().__init__(serving, clock, lease, wait)
        self._relay = serving
        self._groups = groups

    async def fetch(self, request: SotwRequest, type_url: str, peer: str,
                    identity: PeerIdentity | None = None, method: str = "") -> FetchOutcome:
        node = request.node if request.HasField("node") else None
        access = self._relay.settings.access
        if access is not None:  # before the node may open a group
            error = access.node_error(identity, node)
            if error is not None:
                return Denied("node_binding", error)
        try:
            group = self._groups.join(node)
        except GroupKeyError as error:
            return Invalid(str(error))
        except LimitExceeded as error:
            self._relay.metrics.downstream_limited.add(1, {"limit": error.limit})
            self._relay.warn_limited(peer, error.limit, "refusing fetch from %s: %s", peer,
                                     error)
            return Limited(error.limit, str(error))
        try:
            return await group.core.fetcher.fetch(request, type_url, peer, identity, method)
        finally:
            self._groups.leave(group)

    def unchanged(self, served: Served) -> bool:
        """:meth:`Fetcher.unchanged` in the group whose lease answered it (the
        leases are the groups' own), whose linger that starts again, as a
        poll the whole way would (else a group only polled, its polls
        answered again, would close under them every ``linger``)."""
        for group in self._groups.groups():
            if group.core.fetcher.unchanged(served):
                self._groups.touch(group)
                return True
        return False

    def lease_counts(self) -> dict[tuple[str, ...], int]:
        counts: dict[tuple[str, ...], int] = {}
        for group in self._groups.groups():
            for key, count in group.core.fetcher.lease_counts().items():
                counts[key] = counts.get(key, 0) + count
        return counts

    def leases(self) -> list[Lease]:
        leases = [lease for group in self._groups.groups()
                  for lease in group.core.fetcher.leases()]
        return sorted(leases, key=lambda lease: lease.expires)
