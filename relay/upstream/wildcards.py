"""Whether the origin has answered the relay's wildcard subscription of a type.

A client subscribing ``*`` is answered once the cache holds the type's
wildcard set (:meth:`relay.cache.ResourceCache.holds_wildcard`): the
origin's next response of the type after the relay subscribed ``*`` is taken
as its answer. Only a ``*`` subscribed while the cache does not hold the set
is followed here (one re-declared on a new stream, with the set held, has
nobody waiting). An origin with nothing new to say may never answer a ``*``
added to a type it already serves by name: go-control-plane's delta server
answers only a type's first request when nothing changed (this relay, as
another's origin, answers with an empty response). So once ``grace``
(``upstream.answer_grace``) has passed on a connected stream with no
response, the wildcard counts as answered with what the cache holds; a
client waits no longer than that (Envoy waits for its first answer to start
up). Not while disconnected: in an outage a wildcard set the relay does not
hold waits for the origin.
"""

from __future__ import annotations

from relay.upstream.deadlines import Deadlines, WildcardAnswerDue


class WildcardAnswers:
    """Per type, when ``*`` was subscribed on the current stream, until answered."""

    def __init__(self, grace: float, deadlines: Deadlines) -> None:
        self.grace = grace
        self._deadlines = deadlines
        self._asked: dict[str, float] = {}

    def new_stream(self) -> None:
        """A new stream, or none: nothing asked on it yet."""
        self._asked = {}

    def asked(self, type_url: str, now: float) -> None:
        """``*`` of ``type_url`` was subscribed at ``now``."""
        self._asked[type_url] = now
        self._deadlines.add(WildcardAnswerDue(type_url, now + self.grace))

    def settled(self, type_url: str) -> None:
        """A response of the type came (its answer), or ``*`` was unsubscribed."""
        self._asked.pop(type_url, None)

    def due(self, now: float) -> list[str]:
        """The types whose ``*`` went unanswered for ``grace`` by ``now``: settled now."""
        due = [type_url for type_url, at in self._asked.items() if at + self.grace <= now]
        for type_url in due:
            del self._asked[type_url]
        return due

    def stands(self, deadline: WildcardAnswerDue) -> bool:
        asked = self._asked.get(deadline.type_url)
        return asked is not None and asked + self.grace == deadline.at
