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

from collections.abc import Callable, Iterable

from relay.constraints import Locator
from relay.upstream.deadlines import Deadlines, SettleDue


class Settling:
    """Per type, the locators subscribed on the current stream until they are answered.

    Both maps keep their locators in the order they were subscribed, which is
    the order they come due: the first of a type is the soonest.
    """

    def __init__(self, grace: float, deadlines: Deadlines) -> None:
        self.grace = grace
        self._deadlines = deadlines
        # locators no response has followed yet, with when they were subscribed
        self._unsettled: dict[str, dict[Locator, float]] = {}
        # locators a response followed too soon: answered at the time given
        self._settling: dict[str, dict[Locator, float]] = {}

    def new_stream(self) -> None:
        """A new stream: nothing subscribed on it yet."""
        self._unsettled = {}
        self._settling = {}

    def subscribed(self, type_url: str, locators: Iterable[Locator], now: float) -> None:
        unsettled = self._unsettled.setdefault(type_url, {})
        for locator in locators:
            unsettled.pop(locator, None)  # kept in the order they were subscribed
            unsettled[locator] = now

    def unsubscribed(self, type_url: str, locators: Iterable[Locator]) -> None:
        unsettled = self._unsettled.get(type_url, {})
        settling = self._settling.get(type_url, {})
        for locator in locators:
            unsettled.pop(locator, None)
            settling.pop(locator, None)

    def on_response(self, type_url: str, now: float) -> list[Locator]:
        """A response of the type arrived: the locators it answers (subscribed
        ``grace`` before it, or earlier); the rest settle ``grace`` after
        they were subscribed."""
        unsettled = self._unsettled.pop(type_url, {})
        settling = self._settling.setdefault(type_url, {})
        last_due = None
        for locator, subscribed_at in unsettled.items():
            due = subscribed_at + self.grace
            settling.pop(locator, None)  # kept in the order they come due
            settling[locator] = due
            if due > now and due != last_due:
                # one deadline for every locator of the type due at once
                self._deadlines.add(SettleDue(type_url, due))
                last_due = due
        return self._settled(type_url, now)

    def due(self, now: float) -> dict[str, list[Locator]]:
        """Per type, the settling locators answered by ``now`` (none left out)."""
        settled = {type_url: self._settled(type_url, now) for type_url in list(self._settling)}
        return {type_url: locators for type_url, locators in settled.items() if locators}

    def stands(self, deadline: SettleDue) -> bool:
        """Whether the soonest locator of the type still settles at the deadline.

        Every time a locator settles at has a deadline in the heap until it
        passes, so a deadline is the soonest standing one only while the
        type's first settling locator is due at it.
        """
        settling = self._settling.get(deadline.type_url)
        return settling is not None and next(iter(settling.values()), None) == deadline.at

    def _settled(self, type_url: str, now: float) -> list[Locator]:
        settling = self._settling.get(type_url, {})
        due = []
        for locator, at in settling.items():
            if at > now:
                break
            due.append(locator)
        for locator in due:
            del settling[locator]
        if not settling:
            self._settling.pop(type_url, None)
        return due

    def unanswered_names(self, is_answered: Callable[[str, Locator], bool]
                         ) -> dict[str, set[str]]:
        """Per type, the names no response has followed yet on this stream
        that were not answered on an earlier one either (``is_answered``
        says); all those no response has followed when none is new."""
        suspects: dict[str, set[str]] = {}
        waiting: dict[str, set[str]] = {}
        for type_url, locators in self._unsettled.items():
            for locator in locators:
                waiting.setdefault(type_url, set()).add(locator.name)
                if not is_answered(type_url, locator):
                    suspects.setdefault(type_url, set()).add(locator.name)
        return suspects or waiting
