"""REST pollers as ``/clients`` and ``xds-relay status`` show them.

A REST poller holds no stream: each poll is a fresh request (see
:mod:`relay.server.rest`). What a poll says of its client is recorded here,
by node id and client host, and per type: what it subscribes to, the version
it holds (the poll's ``version_info``), how it was answered, and its last
NACK (a poll carrying ``error_detail``: the version it sent was rejected). A
poller is forgotten ``rest.lease`` after its last poll, as its lease is, and
at most ``limit`` are kept, ``per_host`` of one client host (the least
recently polled go first). Of the names a type is polled for, the first
:data:`NAMES_LISTED` are kept (and how many there are): the lease keeps the
names; this is only what ``/clients`` shows.

No I/O: the clocks are injected. Wall time (Unix seconds) is what
``/clients`` shows; the monotonic one decides when a poller is forgotten.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from relay.server.status import NACKED, NOT_SENT, STALE, SYNCED

__all__ = ["NAMES_LISTED", "REST_SERVICE", "PollerBook"]

#: The ``service`` of a REST poller in ``/clients``.
REST_SERVICE = "REST"
#: Names of a polled type listed in ``/clients`` at most (``subscribed_count``: all).
NAMES_LISTED = 100


@dataclass(slots=True)
class _PolledType:
    """What the polls of one type from one poller said last."""

    subscribed: tuple[str, ...]   # the first NAMES_LISTED
    count: int                    # of all the names polled for
    wildcard: bool
    version: str                  # the version_info of its latest poll: what it holds
    status: int                   # the HTTP status of the latest answer
    sent: str | None = None       # the version of the latest 200 answer
    acked_at: float | None = None
    nacked_at: float | None = None
    last_nack: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """The type's entry in ``/clients``, shaped as a stream's (see
        :func:`relay.server.status.client_summary`)."""
        if self.last_nack is not None and self.nacked_at is not None and \
                (self.acked_at is None or self.nacked_at >= self.acked_at):
            sync = NACKED
        elif self.status == 304:
            sync = SYNCED           # it holds the version it would get now
        elif self.status == 200:
            sync = STALE            # sent a version: the next poll says if it took it
        else:
            sync = NOT_SENT         # nothing to answer with yet (503), or refused
        listed = {} if self.count == len(self.subscribed) else \
            {"subscribed_count": self.count}
        return {"subscribed": list(self.subscribed), **listed, "wildcard": self.wildcard,
                "versions": {}, "acked": self.version or None,
                "in_flight": self.sent if sync == STALE else None,
                "last_nack": self.last_nack, "sync": sync, "unsynced": {},
                "acked_at": self.acked_at, "nacked_at": self.nacked_at}


@dataclass(slots=True)
class _Poller:
    node_id: str
    host: str
    first_poll: float
    last_poll: float
    expires: float
    types: dict[str, _PolledType] = field(default_factory=dict)


class PollerBook:
    """The REST pollers seen lately (see the module)."""

    def __init__(self, limit: int, per_host: int, now: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.limit = limit
        self.per_host = per_host
        self._now = now
        self._wall = wall
        # by (node id, host), the least recently polled first
        self._pollers: OrderedDict[tuple[str, str], _Poller] = OrderedDict()
        self._per_host: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._pollers)

    def polled(self, node_id: str, host: str, type_url: str, names: Sequence[str],
               version: str, status: int, *, lease: float, sent: str | None = None,
               nack: str | None = None, count: int | None = None) -> None:
        """One poll of ``type_url`` for ``names`` (none: a wildcard) from
        ``host``, carrying ``version`` (and ``nack``, its ``error_detail``
        message, when it rejects that version), answered with ``status`` (and,
        for a 200, the version ``sent``). The poller is kept ``lease`` seconds.
        ``count``: how many names the poll has, when ``names`` is only the
        first :data:`NAMES_LISTED` of them."""
        self._expire()
        now, wall = self._now(), self._wall()
        key = (node_id, host)
        poller = self._pollers.get(key)
        if poller is None:
            if self._per_host[host] >= self.per_host:
                self._forget(next(k for k, p in self._pollers.items() if p.host == host))
            elif len(self._pollers) >= self.limit:
                self._forget(next(iter(self._pollers)))
            poller = self._pollers[key] = _Poller(node_id, host, wall, wall, now + lease)
            self._per_host[host] += 1
        else:
            poller.last_poll, poller.expires = wall, now + lease
            self._pollers.move_to_end(key)
        previous = poller.types.get(type_url)
        count = len(names) if count is None else count
        polled = _PolledType(tuple(names[:NAMES_LISTED]), count, not count, version,
                             status, sent if status == 200 else None)
        if previous is not None:
            polled.acked_at, polled.nacked_at = previous.acked_at, previous.nacked_at
            polled.last_nack = previous.last_nack
            if status != 200 and previous.sent is not None and version != previous.sent:
                polled.sent = previous.sent  # still not taken up
        if nack is not None:
            polled.nacked_at = wall
            polled.last_nack = {"version": version, "message": nack}
        elif version and (status == 304 or
                          (previous is not None and version == previous.sent)):
            polled.acked_at = wall  # it holds what it was sent: an ACK
        poller.types[type_url] = polled

    def summaries(self) -> Iterator[dict[str, Any]]:
        """Each poller as ``/clients`` shows it, by node id and host."""
        self._expire()
        for poller in sorted(list(self._pollers.values()), key=lambda p: (p.node_id, p.host)):
            types = {type_url: polled.summary() for type_url, polled in poller.types.items()}
            acks = [t["acked_at"] for t in types.values() if t["acked_at"] is not None]
            nacks = [t["nacked_at"] for t in types.values() if t["nacked_at"] is not None]
            yield {"node_id": poller.node_id, "peer": poller.host, "protocol": "rest",
                   "service": REST_SERVICE, "connected_since": poller.first_poll,
                   "last_poll": poller.last_poll, "acked_at": max(acks, default=None),
                   "nacked_at": max(nacks, default=None), "types": types}

    def _expire(self) -> None:
        now = self._now()
        while self._pollers:
            key, first = next(iter(self._pollers.items()))
            if first.expires > now:
                return
            self._forget(key)

    def _forget(self, key: tuple[str, str]) -> None:
        host = self._pollers.pop(key).host
        left = self._per_host[host] - 1
        if left > 0:
            self._per_host[host] = left
        else:
            del self._per_host[host]
