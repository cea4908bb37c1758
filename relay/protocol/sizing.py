"""How many bytes a response may take: ``server.max_response_size``.

A client refuses a message over its receive limit (gRPC's default is
4 MiB, and most clients other than Envoy keep it), and a response it
refuses ends its stream: it could never be served. So a response is built
against a :class:`ResponseBudget`, and what does not fit waits for the next
response, as names beyond the count a response looks at do (see
:data:`relay.protocol.subscription.MAX_NAMES_PER_RESPONSE`).

Sizes are those of the pre-encoded entries the response is assembled from
(see :mod:`relay.encoding`), known from the cached bytes: nothing is
serialized to measure it. Full-state SotW types (listeners, clusters)
cannot be split: every response is the whole set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from relay.resource import CachedResource

__all__ = ["DEFAULT_MAX_RESPONSE_SIZE", "ResponseBudget", "cut_heartbeats"]

#: ``server.max_response_size`` when not configured: gRPC's default receive
#: limit, which most clients other than Envoy keep.
DEFAULT_MAX_RESPONSE_SIZE = 4 * 1024 * 1024

# A response's small fields besides what it carries, all but the type URL's
# characters: the nonce (a counter, at most 20 digits), SotW's version_info
# (16 hex digits), the tags and lengths of these and of the type URL,
# rounded up.
_HEAD_BYTES = 64
# A budget without a limit: more than any response holds.
_UNBOUNDED = 1 << 62


class ResponseBudget:
    """What one response may still take, in bytes (``limit``: None, no limit).

    Whatever a response holds counts: resources, removals, errors. The first
    entry always fits: a resource larger than the limit on its own goes
    alone, since no split makes it smaller.
    """

    __slots__ = ("_empty", "_left")

    def __init__(self, limit: int | None, type_url: str) -> None:
        # (built for every response: no encoding, as a type URL is ASCII)
        self._left = _UNBOUNDED if limit is None else limit - _HEAD_BYTES - (
            len(type_url) if type_url.isascii() else len(type_url.encode()))
        self._empty = True

    def take(self, size: int) -> bool:
        """Whether an entry of ``size`` bytes fits; if it does, it is counted."""
        if size > self._left and not self._empty:
            return False
        self._left -= size
        self._empty = False
        return True

    def take_all(self, size: int) -> bool:
        """Whether entries of ``size`` bytes in all fit (no first-entry
        exception: they are several); if they do, they are counted."""
        if size > self._left:
            return False
        self._left -= size
        self._empty = self._empty and not size
        return True

    def count(self, size: int) -> None:
        """Count an entry that goes whether it fits or not (an origin error
        already marked as passed on)."""
        self._left -= size
        self._empty = False

    def fitting(self, sizes: Iterable[int]) -> int:
        """How many of the entries of ``sizes``, in order, fit (each counted)."""
        fit = 0
        for size in sizes:
            if not self.take(size):
                break
            fit += 1
        return fit


def cut_heartbeats(budget: ResponseBudget, heartbeats: list[CachedResource],
                   entry: Callable[[CachedResource], bytes], due: set[str],
                   sending: Iterable[CachedResource]) -> set[str] | None:
    """Cut ``heartbeats`` (in place) to those that fit in ``budget`` as their
    ``entry``; returns the names of ``due`` (the heartbeats that were due) still
    due after the response that is ``sending`` these resources, or None."""
    fit = budget.fitting(len(entry(r)) for r in heartbeats)
    if fit == len(heartbeats):
        return None
    due -= {r.name for r in sending}
    due -= {r.name for r in heartbeats[:fit]}
    del heartbeats[fit:]
    return due or None
