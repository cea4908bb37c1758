"""Each cached resource's JSON, written once for every REST poll that answers it.

``json_format`` writes a resource of a poll's answer in 20-35 µs (a
ClusterLoadAssignment of ~100 bytes): a first answer of 50,000 names took
~1.8 s of CPU, made again for every new lease of the same resources (another
node's parameters, another set of names) and for every lease at each change
of any one of them. What a resource's JSON is depends only on the resource
(the cache's object for one version of one variant) and on which of its
encoded entries the answer holds (:data:`PLAIN`, :data:`WRAPPED` in a
``Resource``, or a :data:`HEARTBEAT`), so it is kept here, by resource and
entry, and the answers join what is kept.

What it holds: each fragment (its JSON, and about :data:`OVERHEAD` bytes of
bookkeeping) while its resource lives, that is while that version is cached
or held by an answer or a stream; a resource replaced or forgotten by the
cache takes its fragments with it (a weak reference's callback). Never more
than ``limit`` bytes in all: past it, fragments are written and not kept
until others go.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Final

from relay.resource import CachedResource

__all__ = ["FRAGMENTS_SIZE", "HEARTBEAT", "OVERHEAD", "PLAIN", "WRAPPED", "JsonFragments"]

#: Which encoded entry of a resource a fragment is the JSON of (see
#: :func:`relay.server.plans.encode_plan`).
PLAIN: Final = 0
WRAPPED: Final = 1
HEARTBEAT: Final = 2
#: The bytes a REST server's fragments may hold at most, all together.
FRAGMENTS_SIZE = 64 * 1024 * 1024
#: What a fragment costs besides its JSON: its weak reference (with its key
#: and the fragment), its key and its slot in the table.
OVERHEAD = 250


class _Held(weakref.ref[CachedResource]):
    """A weak reference to a resource that carries its fragment, its kind
    and its resource's identity."""

    __slots__ = ("fragment", "ident", "kind")

    fragment: bytes
    ident: int
    kind: int


class JsonFragments:
    """Resources' JSON fragments, by entry kind and resource (identity)."""

    __slots__ = ("__weakref__", "_gone", "_tables", "limit", "made", "size")

    def __init__(self, limit: int = FRAGMENTS_SIZE) -> None:
        self.limit = limit
        # per kind: id(resource) -> its fragment
        self._tables: tuple[dict[int, _Held], ...] = ({}, {}, {})
        # every fragment's callback, holding this table weakly (a table let
        # go takes its entries with it, not the resources' lives)
        self._gone = _forgetting(weakref.ref(self))
        #: the bytes held now (each fragment's length and OVERHEAD)
        self.size = 0
        #: fragments written (tests count them)
        self.made = 0

    def __len__(self) -> int:
        return sum(map(len, self._tables))

    def get(self, resource: CachedResource, kind: int) -> bytes | None:
        """The JSON of ``resource``'s entry of ``kind``, when kept."""
        return self.found([resource], [kind])[0]

    def found(self, resources: list[CachedResource], kinds: list[int] | None
              ) -> list[bytes | None]:
        """The JSON of each resource's entry of its kind (None: each its plain
        one), or None where none is kept; in C but for one check each."""
        if kinds is None:
            held: Iterable[_Held | None] = map(self._tables[PLAIN].get, map(id, resources))
        else:
            held = map(dict.get, map(self._tables.__getitem__, kinds), map(id, resources))
        # (an id is reused only after its object is gone, and with it its entry)
        return [fragment.fragment if fragment is not None and fragment() is resource else None
                for fragment, resource in zip(held, resources, strict=True)]

    def keep(self, resource: CachedResource, kind: int, fragment: bytes) -> None:
        """Keep ``fragment`` as the JSON of ``resource``'s entry of ``kind``,
        while the resource lives, if there is room."""
        table, ident = self._tables[kind], id(resource)
        cost = len(fragment) + OVERHEAD
        if ident in table or self.size + cost > self.limit:
            return
        held = _Held(resource, self._gone)
        held.fragment, held.ident, held.kind = fragment, ident, kind
        table[ident] = held
        self.size += cost

    def clear(self) -> None:
        """Forget every fragment."""
        for table in self._tables:
            table.clear()
        self.size = 0

    def forget(self, held: _Held) -> None:
        """A fragment's resource is gone: so is the fragment."""
        table = self._tables[held.kind]
        if table.get(held.ident) is held:
            del table[held.ident]
            self.size -= len(held.fragment) + OVERHEAD


def _forgetting(table: weakref.ref[JsonFragments]) -> Callable[[_Held], None]:
    """The callback of a fragment's weak reference: its table forgets it."""
    def gone(held: _Held) -> None:
        fragments = table()
        if fragments is not None:
            fragments.forget(held)
    return gone
