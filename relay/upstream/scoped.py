"""The cache as one origin sees it, when several share it (xDS federation).

Every origin writes into the relay's one cache, so that a stream is served
from one place whatever origin its names come from. What an origin does to a
*whole type* must then stay within its own names: forgetting what its
subscription no longer covers after a reconnect, declaring what is cached to
it (``initial_resource_versions``), restoring its part of a snapshot. A
:class:`ScopedCache` gives an origin's upstream state exactly that view: the
names and resources of a type are the ones it owns (``owns(name)``), a
forget keeps every name it does not own, and nothing it sends marks a type
*complete*: a type is only complete as one origin's wildcard saw it, and
names of another origin are not absent because this one lacks them.

With one origin the upstream is given the cache itself: nothing is filtered.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Generator, Iterable
from dataclasses import replace
from typing import Protocol

from relay.cache import Missing, ResourceCache, Update, Variants
from relay.constraints import Locator, Params
from relay.resource import CachedResource


class OriginCache(Protocol):
    """What an origin's upstream state reads and writes of the cache."""

    def variants(self, type_url: str, name: str) -> Variants | Missing: ...

    def aliases_of(self, type_url: str, name: str) -> set[str]: ...

    def is_complete(self, type_url: str) -> bool: ...

    def is_synced(self, type_url: str) -> bool: ...

    def holds_wildcard(self, type_url: str) -> bool: ...

    def is_answered(self, type_url: str, locator: Locator) -> bool: ...

    def served_to_all(self, type_url: str, names: Iterable[str]) -> dict[str, CachedResource]: ...

    def names(self, type_url: str) -> list[str]: ...

    def resources(self, type_url: str) -> list[CachedResource]: ...

    def type_urls(self) -> list[str]: ...

    def apply(self, type_url: str, update: Update) -> frozenset[str]: ...

    def apply_steps(self, type_url: str, update: Update, step: int
                    ) -> Generator[None, None, frozenset[str]]: ...

    def forget(self, type_url: str, names: Iterable[str], keep: Container[str] = ()) -> None: ...

    def forget_variants(self, type_url: str, name: str, keep: Iterable[str],
                        unanswer: Iterable[Params]) -> None: ...

    def end_wildcard(self, type_url: str, keep: Container[str]) -> None: ...


class _KeepOthers:
    """``keep``, and every name the origin does not own."""

    __slots__ = ("_keep", "_owns")

    def __init__(self, keep: Container[str], owns: Callable[[str], bool]) -> None:
        self._keep, self._owns = keep, owns

    def __contains__(self, name: object) -> bool:
        return name in self._keep or not (isinstance(name, str) and self._owns(name))


class ScopedCache:
    """``cache`` limited, for whole-type work, to the names ``owns`` accepts."""

    def __init__(self, cache: ResourceCache, owns: Callable[[str], bool], *,
                 takes_wildcard: bool = False) -> None:
        self.cache = cache
        self.owns = owns
        # whether wildcards go to this origin (the default): only its wildcard
        # ending lets the type's wildcard set go (see ResourceCache.end_wildcard)
        self.takes_wildcard = takes_wildcard

    def variants(self, type_url: str, name: str) -> Variants | Missing:
        return self.cache.variants(type_url, name)

    def aliases_of(self, type_url: str, name: str) -> set[str]:
        return self.cache.aliases_of(type_url, name)

    def is_complete(self, type_url: str) -> bool:
        # Never set through a scoped view (see apply), so never true of one.
        return False

    def is_synced(self, type_url: str) -> bool:
        return self.cache.is_synced(type_url)

    def holds_wildcard(self, type_url: str) -> bool:
        return self.cache.holds_wildcard(type_url)

    def served_to_all(self, type_url: str, names: Iterable[str]) -> dict[str, CachedResource]:
        # (any origin's copy: one made from the same bytes was checked as well)
        return self.cache.served_to_all(type_url, names)

    def is_answered(self, type_url: str, locator: Locator) -> bool:
        return self.cache.is_answered(type_url, locator)

    def names(self, type_url: str) -> list[str]:
        return [name for name in self.cache.names(type_url) if self.owns(name)]

    def resources(self, type_url: str) -> list[CachedResource]:
        return [r for r in self.cache.resources(type_url) if self.owns(r.name)]

    def type_urls(self) -> list[str]:
        return self.cache.type_urls()

    def apply(self, type_url: str, update: Update) -> frozenset[str]:
        return self.cache.apply(type_url, _incomplete(update))

    def apply_steps(self, type_url: str, update: Update, step: int
                    ) -> Generator[None, None, frozenset[str]]:
        return self.cache.apply_steps(type_url, _incomplete(update), step)

    def forget(self, type_url: str, names: Iterable[str], keep: Container[str] = ()) -> None:
        self.cache.forget(type_url, names, keep)

    def forget_variants(self, type_url: str, name: str, keep: Iterable[str],
                        unanswer: Iterable[Params]) -> None:
        self.cache.forget_variants(type_url, name, keep, unanswer)

    def end_wildcard(self, type_url: str, keep: Container[str]) -> None:
        self.cache.end_wildcard(type_url, _KeepOthers(keep, self.owns),
                                lets_wildcard_go=self.takes_wildcard)


def _incomplete(update: Update) -> Update:
    """``update`` marking nothing complete: one origin's names are not a whole type."""
    return replace(update, complete=None) if update.complete else update
