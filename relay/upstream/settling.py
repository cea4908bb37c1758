"""Which subscribed locators the origin has answered, and from when.

A response tells nothing of which requests the origin had read when it sent
it. A locator is taken as answered (its clients may be told that nothing
exists for them) only by a response at least ``grace`` after it was
subscribed. Those a response followed sooner are *settling*: they count as
answered ``grace`` after they were subscribed, when a timer (a
:class:`~relay.upstream.deadlines.SettleDue`) or a later response notices.
See "settle" in ``docs/glossary.md``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from operator import countOf

from relay.constraints import EMPTY_PARAMS, Locator, Params
from relay.upstream.deadlines import Deadlines, SettleDue
from relay.upstream.requests import PLAIN

#: A locator as the maps below key it: a plain name is the name itself, whose
#: string the subscription holds anyway; only a name with parameters is a
#: :class:`Locator` (a client of 100,000 plain names settling would otherwise
#: hold 100,000 tuples of 72 bytes each).
_Key = str | Locator


def _key(locator: Locator) -> _Key:
    return locator if locator.params else locator.name


def _locator(key: _Key) -> Locator:
    return Locator(key, EMPTY_PARAMS) if isinstance(key, str) else key


def _move_together(settling: dict[_Key, float], unsettled: dict[_Key, float]
                   ) -> Iterable[float] | None:
    """What :meth:`Settling.answered_keys`'s loop does to ``settling`` where
    none of ``unsettled`` is settling already (a big client's names): all
    moved at once, in C (both maps hold when each was subscribed, so nothing
    is computed per locator); the times they were subscribed, in order; None
    where some are (the loop runs). tests/upstream/test_settling_all.py
    holds it to the loop."""
    if not settling.keys().isdisjoint(unsettled.keys()):
        return None
    settling.update(unsettled)
    return unsettled.values()


class Settling:
    """Per type, the locators subscribed on the current stream until they are answered.

    Both maps keep their locators in the order they were subscribed, which is
    the order they come due: the first of a type is the soonest.
    """

    def __init__(self, grace: float, deadlines: Deadlines) -> None:
        self.grace = grace
        self._deadlines = deadlines
        # locators no response has followed yet, with when they were subscribed
        self._unsettled: dict[str, dict[_Key, float]] = {}
        # locators a response followed too soon, with when they were
        # subscribed: answered ``grace`` after it (the time is not moved
        # per locator: a big client's names move whole)
        self._settling: dict[str, dict[_Key, float]] = {}

    def new_stream(self) -> None:
        """A new stream: nothing subscribed on it yet."""
        self._unsettled = {}
        self._settling = {}

    def subscribed(self, type_url: str, locators: Iterable[Locator], now: float) -> None:
        unsettled = self._unsettled.setdefault(type_url, {})
        for locator in locators:
            key = _key(locator)
            unsettled.pop(key, None)  # kept in the order they were subscribed
            unsettled[key] = now

    def subscribed_all(self, type_url: str, locators: Mapping[str, Iterable[Params]],
                       now: float) -> None:
        """:meth:`subscribed`, given as a subscription holds them (name ->
        parameter sets). New plain names, a big client's thousands, go in
        together, with no :class:`Locator` made for each."""
        unsettled = self._unsettled.setdefault(type_url, {})
        # (counted in C; PLAIN is the very object a subscription holds: no compare)
        if countOf(locators.values(), PLAIN) == len(locators) and \
                unsettled.keys().isdisjoint(locators.keys()):
            unsettled.update(dict.fromkeys(locators, now))
        else:
            self.subscribed(type_url, (Locator(name, params) for name, params_set in
                                       locators.items() for params in params_set), now)

    def unsubscribed(self, type_url: str, locators: Iterable[Locator]) -> None:
        unsettled = self._unsettled.get(type_url, {})
        settling = self._settling.get(type_url, {})
        for locator in locators:
            key = _key(locator)
            unsettled.pop(key, None)
            settling.pop(key, None)

    def on_response(self, type_url: str, now: float) -> list[Locator]:
        """A response of the type arrived: the locators it answers (subscribed
        ``grace`` before it, or earlier); the rest settle ``grace`` after
        they were subscribed."""
        return [_locator(key) for key in self.answered_keys(type_url, now)]

    def answered_keys(self, type_url: str, now: float) -> list[_Key]:
        """:meth:`on_response`, each locator as the maps key it: a plain name
        as its name (what :attr:`relay.cache.Update.answered` takes), so that
        a big client's thousands of names settle with no Locator made for each."""
        unsettled = self._unsettled.pop(type_url, {})
        settling = self._settling.setdefault(type_url, {})
        moved = _move_together(settling, unsettled)
        if moved is None:
            for key, subscribed_at in unsettled.items():
                settling.pop(key, None)  # kept in the order they come due
                settling[key] = subscribed_at
            moved = unsettled.values()
        last_due = None
        for subscribed_at, _ in itertools.groupby(moved):
            due = subscribed_at + self.grace
            if due > now and due != last_due:
                # one deadline for every locator of the type due at once
                self._deadlines.add(SettleDue(type_url, due))
                last_due = due
        return self._settled(type_url, now)

    def due(self, now: float) -> dict[str, list[Locator]]:
        """Per type, the settling locators answered by ``now`` (none left out)."""
        return {type_url: [_locator(key) for key in keys]
                for type_url, keys in self.due_keys(now).items()}

    def due_keys(self, now: float) -> dict[str, list[_Key]]:
        """:meth:`due`, each locator as the maps key it (see :meth:`answered_keys`)."""
        settled = {type_url: self._settled(type_url, now) for type_url in list(self._settling)}
        return {type_url: keys for type_url, keys in settled.items() if keys}

    def stands(self, deadline: SettleDue) -> bool:
        """Whether the soonest locator of the type still settles at the deadline.

        Every time a locator settles at has a deadline in the heap until it
        passes, so a deadline is the soonest standing one only while the
        type's first settling locator is due at it.
        """
        settling = self._settling.get(deadline.type_url)
        first = None if settling is None else next(iter(settling.values()), None)
        return first is not None and first + self.grace == deadline.at

    def _settled(self, type_url: str, now: float) -> list[_Key]:
        settling = self._settling.get(type_url)
        if not settling:
            self._settling.pop(type_url, None)
            return []
        if next(reversed(settling.values())) + self.grace <= now:
            # all of them (a big client's names, subscribed together, settle
            # together): taken whole, with no loop over them
            del self._settling[type_url]
            return list(settling)
        due = []
        for key, subscribed_at in settling.items():
            if subscribed_at + self.grace > now:
                break
            due.append(key)
        for key in due:
            del settling[key]
        return due

    def unanswered_names(self, is_answered: Callable[[str, Locator], bool]
                         ) -> dict[str, set[str]]:
        """Per type, the names no response has followed yet on this stream
        that were not answered on an earlier one either (``is_answered``
        says); all those no response has followed when none is new."""
        suspects: dict[str, set[str]] = {}
        waiting: dict[str, set[str]] = {}
        for type_url, keys in self._unsettled.items():
            for key in keys:
                locator = _locator(key)
                waiting.setdefault(type_url, set()).add(locator.name)
                if not is_answered(type_url, locator):
                    suspects.setdefault(type_url, set()).add(locator.name)
        return suspects or waiting
