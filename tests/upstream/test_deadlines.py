"""The upstream's deadlines: typed records in one heap, soonest first, without I/O."""

from __future__ import annotations

from relay.upstream.deadlines import (
    Deadline,
    Deadlines,
    LingerEnds,
    ReconcileDue,
    SettleDue,
    WildcardLingerEnds,
)
from relay.xds_types import CLUSTER, ENDPOINT


def test_the_soonest_standing_deadline_comes_first() -> None:
    deadlines = Deadlines()
    deadlines.add(ReconcileDue(CLUSTER, 3.0))
    deadlines.add(SettleDue(ENDPOINT, 1.0))
    deadlines.add(LingerEnds(ENDPOINT, 2.0))
    assert deadlines.next(lambda _: True) == 1.0


def test_deadlines_that_no_longer_stand_are_dropped_on_the_way() -> None:
    deadlines = Deadlines()
    for deadline in (SettleDue(ENDPOINT, 1.0), LingerEnds(ENDPOINT, 2.0),
                     WildcardLingerEnds(CLUSTER, 3.0)):
        deadlines.add(deadline)
    asked: list[Deadline] = []

    def stands(deadline: Deadline) -> bool:
        asked.append(deadline)
        return isinstance(deadline, WildcardLingerEnds)

    assert deadlines.next(stands) == 3.0
    assert asked == [SettleDue(ENDPOINT, 1.0), LingerEnds(ENDPOINT, 2.0),
                     WildcardLingerEnds(CLUSTER, 3.0)]
    assert len(deadlines) == 1  # the two that fell are gone for good


def test_what_is_due_is_dropped_and_the_rest_kept() -> None:
    deadlines = Deadlines()
    deadlines.add(SettleDue(ENDPOINT, 1.0))
    deadlines.add(SettleDue(ENDPOINT, 1.0))  # equal records never need to compare
    deadlines.add(ReconcileDue(ENDPOINT, 5.0))
    deadlines.drop_due(1.0)
    assert len(deadlines) == 1 and deadlines.next(lambda _: True) == 5.0
    deadlines.drop_due(5.0)
    assert deadlines.next(lambda _: True) is None
