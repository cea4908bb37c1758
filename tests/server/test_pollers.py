"""The REST pollers /clients lists, on injected clocks."""

from __future__ import annotations

from typing import Any

from relay.server.pollers import NAMES_LISTED, PollerBook
from relay.xds_types import CLUSTER, ENDPOINT

LEASE = 60.0


class Clock:
    """Seconds that pass when the test says; the wall clock 1,000,000 s ahead."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def now(self) -> float:
        return self.seconds

    def wall(self) -> float:
        return 1_000_000.0 + self.seconds

    def advance(self, seconds: float) -> None:
        self.seconds += seconds


def book(limit: int = 10, per_host: int = 10) -> tuple[PollerBook, Clock]:
    clock = Clock()
    return PollerBook(limit, per_host, clock.now, clock.wall), clock


def only(pollers: PollerBook) -> dict[str, Any]:
    [listed] = pollers.summaries()
    return listed


def test_a_poll_answered_200_is_stale_until_the_next_poll_carries_its_version() -> None:
    pollers, clock = book()
    pollers.polled("n1", "ipv4:10.0.0.7", CLUSTER, ("a",), "", 200, lease=LEASE, sent="v1")
    assert only(pollers)["types"][CLUSTER]["sync"] == "stale"
    clock.advance(5)
    # v2 is the cache's now: it is sent v2, but it took v1 (its poll says so)
    pollers.polled("n1", "ipv4:10.0.0.7", CLUSTER, ("a",), "v1", 200, lease=LEASE, sent="v2")
    polled = only(pollers)["types"][CLUSTER]
    assert (polled["acked"], polled["in_flight"], polled["sync"], polled["acked_at"]) == (
        "v1", "v2", "stale", 1_000_005.0)


def test_an_unanswered_poll_keeps_what_is_in_flight() -> None:
    pollers, _ = book()
    pollers.polled("n1", "h", CLUSTER, (), "", 200, lease=LEASE, sent="v1")
    pollers.polled("n1", "h", CLUSTER, (), "", 503, lease=LEASE)
    polled = only(pollers)["types"][CLUSTER]
    assert (polled["wildcard"], polled["in_flight"], polled["sync"]) == (True, None, "not_sent")


def test_a_nack_stays_nacked_until_an_ack_after_it() -> None:
    pollers, clock = book()
    pollers.polled("n1", "h", CLUSTER, ("a",), "", 200, lease=LEASE, sent="v1")
    clock.advance(1)
    pollers.polled("n1", "h", CLUSTER, ("a",), "", 200, lease=LEASE, sent="v1", nack="bad")
    assert only(pollers)["types"][CLUSTER]["sync"] == "nacked"
    clock.advance(1)
    pollers.polled("n1", "h", CLUSTER, ("a",), "v2", 304, lease=LEASE)
    listed = only(pollers)
    polled = listed["types"][CLUSTER]
    assert (polled["sync"], polled["last_nack"], polled["nacked_at"], polled["acked_at"]) == (
        "synced", {"version": "", "message": "bad"}, 1_000_001.0, 1_000_002.0)
    assert (listed["connected_since"], listed["last_poll"], listed["acked_at"],
            listed["nacked_at"]) == (1_000_000.0, 1_000_002.0, 1_000_002.0, 1_000_001.0)


def test_types_of_one_node_and_host_are_one_poller() -> None:
    pollers, _ = book()
    pollers.polled("n1", "h", CLUSTER, (), "", 200, lease=LEASE, sent="v1")
    pollers.polled("n1", "h", ENDPOINT, ("a",), "", 200, lease=LEASE, sent="v1")
    pollers.polled("n1", "other-host", CLUSTER, (), "", 200, lease=LEASE, sent="v1")
    assert [(p["peer"], sorted(p["types"])) for p in pollers.summaries()] == [
        ("h", sorted([CLUSTER, ENDPOINT])), ("other-host", [CLUSTER])]


def test_a_poller_is_forgotten_a_lease_after_its_last_poll() -> None:
    pollers, clock = book()
    pollers.polled("n1", "h", CLUSTER, (), "", 200, lease=LEASE, sent="v1")
    clock.advance(LEASE - 1)
    pollers.polled("n2", "h", CLUSTER, (), "", 200, lease=LEASE, sent="v1")
    clock.advance(1)
    assert [p["node_id"] for p in pollers.summaries()] == ["n2"]


def test_past_the_limit_the_least_recently_polled_is_forgotten() -> None:
    pollers, clock = book(limit=2)
    for node_id in ("n1", "n2"):
        pollers.polled(node_id, "h", CLUSTER, (), "", 200, lease=LEASE, sent="v1")
        clock.advance(1)
    pollers.polled("n1", "h", CLUSTER, (), "v1", 304, lease=LEASE)
    pollers.polled("n3", "h", CLUSTER, (), "", 200, lease=LEASE, sent="v1")
    assert [p["node_id"] for p in pollers.summaries()] == ["n1", "n3"]
    assert len(pollers) == 2


def test_one_host_keeps_at_most_per_host_pollers_and_others_are_kept() -> None:
    pollers, clock = book(limit=10, per_host=2)
    for node_id, host in (("n1", "h"), ("n2", "h"), ("other", "g"), ("n3", "h")):
        pollers.polled(node_id, host, CLUSTER, (), "", 200, lease=LEASE, sent="v1")
        clock.advance(1)
    assert [(p["node_id"], p["peer"]) for p in pollers.summaries()] == [
        ("n2", "h"), ("n3", "h"), ("other", "g")]


def test_a_type_polled_for_many_names_lists_the_first_and_counts_them_all() -> None:
    pollers, _ = book()
    names = [f"name-{i:04d}" for i in range(NAMES_LISTED + 5)]
    pollers.polled("n1", "h", CLUSTER, names, "", 200, lease=LEASE, sent="v1")
    polled = only(pollers)["types"][CLUSTER]
    assert (polled["subscribed"], polled["subscribed_count"]) == (
        names[:NAMES_LISTED], NAMES_LISTED + 5)
    pollers.polled("n1", "h", CLUSTER, names[:3], "", 200, lease=LEASE, sent="v1")
    assert "subscribed_count" not in only(pollers)["types"][CLUSTER]
