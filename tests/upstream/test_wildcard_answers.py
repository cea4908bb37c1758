"""relay/upstream/wildcards.py: a ``*`` the origin does not answer counts as
answered ``grace`` after it was subscribed, on the stream it was asked on."""

from __future__ import annotations

from relay.upstream.deadlines import Deadlines, WildcardAnswerDue
from relay.upstream.wildcards import WildcardAnswers
from relay.xds_types import CLUSTER, LISTENER


def test_an_unanswered_wildcard_is_due_after_the_grace_and_an_answered_one_never() -> None:
    deadlines = Deadlines()
    wildcards = WildcardAnswers(0.5, deadlines)
    wildcards.asked(CLUSTER, 10.0)
    wildcards.asked(LISTENER, 10.2)
    assert deadlines.next(lambda d: isinstance(d, WildcardAnswerDue) and wildcards.stands(d)) \
        == 10.5
    wildcards.settled(LISTENER)  # (its answer came)
    assert wildcards.due(10.4) == []
    assert wildcards.due(10.5) == [CLUSTER]
    assert wildcards.due(11.0) == []  # (once)
    assert deadlines.next(lambda d: isinstance(d, WildcardAnswerDue) and wildcards.stands(d)) \
        is None


def test_a_new_stream_or_none_forgets_what_was_asked() -> None:
    """Disconnected, nothing settles: in an outage the wildcard waits for the origin."""
    wildcards = WildcardAnswers(0.5, Deadlines())
    wildcards.asked(CLUSTER, 10.0)
    wildcards.new_stream()
    assert wildcards.due(20.0) == []
    assert not wildcards.stands(WildcardAnswerDue(CLUSTER, 10.5))
    wildcards.asked(CLUSTER, 30.0)  # (asked again on the next stream)
    assert not wildcards.stands(WildcardAnswerDue(CLUSTER, 10.5))
    assert wildcards.stands(WildcardAnswerDue(CLUSTER, 30.5))
