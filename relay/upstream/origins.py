"""Several origins behind one relay, each reached by the authority of its names.

xDS federation names resources ``xdstp://AUTHORITY/TYPE/ID``: the authority
says which control plane serves it. The relay follows one origin per
configured authority (``authorities:``), each over a Delta-ADS stream of its
own, and the default origin (``upstream:``) for classic names and for
``xdstp`` names of authorities it does not list. A name no origin serves is
refused to the client that asks (see :meth:`Routes.refusal`).

All origins write into the relay's one cache, and the one interest index
says what clients want. :class:`Origins` stands between them: it is the
index's way back up (:class:`relay.interest.Upward`), telling each origin's
client of the names that route to it, and each client reads what is wanted
through a :class:`RoutedDemand` (its names only; the wildcard is the default
origin's) and writes through a :class:`~relay.upstream.scoped.ScopedCache`.
So each origin is followed, resynced and reconciled on its own: one origin's
outage, NACK or reconnect touches only its names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

from relay.constraints import Params
from relay.protocol.xdstp import authority_of

if TYPE_CHECKING:
    from relay.upstream.client import UpstreamClient
    from relay.upstream.targets import Demand

#: The name of the origin of ``upstream:`` (the others are named by their authority).
DEFAULT_ORIGIN: Final = "default"

class Routes:
    """Which origin serves each name: by its authority, else the default.

    ``authorities`` are the authorities with an origin of their own (each
    origin is named by its authority); ``default`` says whether ``upstream:``
    is an origin, which serves classic names and unlisted authorities.
    """

    def __init__(self, authorities: Iterable[str], default: bool) -> None:
        self.authorities: Final = frozenset(authorities)
        self.default: Final = DEFAULT_ORIGIN if default else None

    @property
    def several(self) -> bool:
        """Whether more than one origin shares the cache."""
        return len(self.authorities) + (self.default is not None) > 1

    def origins(self) -> list[str]:
        """Every origin's name, the default first."""
        return [*([self.default] if self.default else []), *sorted(self.authorities)]

    def origin_of(self, name: str) -> str | None:
        """The origin that serves ``name`` (None: none does)."""
        authority = authority_of(name)
        if authority is not None and authority in self.authorities:
            return authority
        return self.default

    def owned_by(self, origin: str) -> Callable[[str], bool]:
        """Whether a name is ``origin``'s to serve."""
        def owns(name: str) -> bool:
            return self.origin_of(name) == origin
        return owns

    @property
    def serves_every_name(self) -> bool:
        """Whether some origin serves every name (:meth:`refusal` is always None)."""
        return self.default is not None or not self.authorities

    def refusal(self, name: str) -> str | None:
        """Why a client may not subscribe ``name`` (None: some origin serves it)."""
        if self.serves_every_name:
            return None
        authority = authority_of(name)
        if authority is None:
            return (f"{name[:200]!r} is not an xdstp:// name, and the relay has no default "
                    f"origin (upstream:) for classic names; its origins serve the "
                    f"authorities {', '.join(sorted(self.authorities))}")
        if authority in self.authorities:
            return None
        return (f"no origin of the relay serves the authority {authority[:200]!r} of "
                f"{name[:200]!r}; it serves {', '.join(sorted(self.authorities))} "
                f"(authorities:) and has no default origin (upstream:)")

    def split(self, names: Iterable[str]) -> dict[str | None, list[str]]:
        """``names`` by the origin that serves each (None: none does)."""
        by_origin: dict[str | None, list[str]] = {}
        for name in names:
            by_origin.setdefault(self.origin_of(name), []).append(name)
        return by_origin


class RoutedDemand:
    """The clients' demand as one origin sees it: the names routed to it, and
    the wildcard if it is the default origin."""

    def __init__(self, demand: Demand, routes: Routes, origin: str) -> None:
        self._demand = demand
        self._owns = routes.owned_by(origin)
        self._wildcard = origin == routes.default

    def wanted_types(self) -> list[str]:
        return [t for t in self._demand.wanted_types()
                if (self._wildcard and self._demand.wants_wildcard(t))
                or any(map(self._owns, self._demand.wanted_locators(t)))]

    def wanted_locators(self, type_url: str) -> dict[str, frozenset[Params]]:
        return {name: params for name, params in self._demand.wanted_locators(type_url).items()
                if self._owns(name)}

    def wanted_params(self, type_url: str, name: str) -> frozenset[Params]:
        return self._demand.wanted_params(type_url, name) if self._owns(name) else frozenset()

    def wanted_among(self, type_url: str, names: Collection[str]) -> list[frozenset[Params]]:
        owned = list(map(self._owns, names))
        wanted = self._demand.wanted_among(type_url, names)
        if all(owned):
            return wanted
        return [params if owns else frozenset()
                for params, owns in zip(wanted, owned, strict=True)]

    def wants_wildcard(self, type_url: str) -> bool:
        return self._wildcard and self._demand.wants_wildcard(type_url)

    def origin_refused(self, type_url: str, names: Iterable[str], message: str) -> int:
        return self._demand.origin_refused(type_url, names, message)


class Origins:
    """Every origin's client, and the way back up from the index to them.

    With one origin the index could be linked to its client directly; with
    several, this tells each of the names routed to it (the default origin
    always hears of the type, as the wildcard is its).
    """

    def __init__(self, routes: Routes, clients: Mapping[str, UpstreamClient]) -> None:
        self.routes: Final = routes
        self.clients: Final = dict(clients)
        # set once every origin's client has synced (see UpstreamClient.synced_event)
        self.synced_event = asyncio.Event()

    def __iter__(self) -> Iterator[tuple[str, UpstreamClient]]:
        return iter(self.clients.items())

    @property
    def default(self) -> UpstreamClient | None:
        """The client of the default origin (``upstream:``), if it is one."""
        return None if self.routes.default is None else self.clients.get(self.routes.default)

    def interest_changed(self, type_url: str, names: Iterable[str]) -> None:
        """The union of what clients want of ``type_url`` changed (see Upward)."""
        default = self.default
        if not self.routes.several and default is not None:
            default.interest_changed(type_url, names)  # one origin: no routing to do
            return
        by_origin = self.routes.split(names)
        if default is not None:
            default.interest_changed(type_url, by_origin.pop(self.routes.default, ()))
        for origin, routed in by_origin.items():
            client = None if origin is None else self.clients.get(origin)
            if client is not None:
                client.interest_changed(type_url, routed)

    def refetch(self, type_url: str, names: frozenset[str]) -> None:
        """Clients need fresh copies of these resources (see Upward)."""
        for origin, routed in self.routes.split(names).items():
            client = None if origin is None else self.clients.get(origin)
            if client is not None:
                client.refetch(type_url, frozenset(routed))

    def synced(self) -> bool:
        """Whether every origin has sent a usable response."""
        return all(client.synced_event.is_set() for client in self.clients.values())

    async def run(self) -> None:
        """Follow every origin until cancelled."""
        async with asyncio.TaskGroup() as group:
            for origin, client in self.clients.items():
                group.create_task(client.run(), name=f"upstream-{origin}")
            group.create_task(self._note_synced(), name="upstream-synced")

    async def _note_synced(self) -> None:
        for client in self.clients.values():
            await client.synced_event.wait()
        self.synced_event.set()
