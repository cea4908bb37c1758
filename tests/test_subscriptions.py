"""SubscriptionIndex: fan-out of cache changes and the union kept for the upstream."""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.cache import CacheChange
from relay.subscriptions import Interest, SubscriptionIndex
from relay.xds_types import CLUSTER, ENDPOINT


@dataclass(eq=False)
class Sub:
    seen: list[tuple[str, frozenset[str], bool]] = field(default_factory=list)

    def __hash__(self) -> int:
        return id(self)

    def resources_changed(self, type_url: str, names: frozenset[str], everything: bool) -> None:
        self.seen.append((type_url, names, everything))


def interest(*names: str, wildcard: bool = False) -> Interest:
    return Interest(frozenset(names), wildcard)


def test_union_and_interest_events() -> None:
    index = SubscriptionIndex()
    events: list[str] = []
    index.add_interest_listener(events.append)
    a, b = Sub(), Sub()
    index.update(a, ENDPOINT, interest("x", "y"))
    index.update(b, ENDPOINT, interest("y"))
    assert index.wanted(ENDPOINT) == interest("x", "y")
    assert events == [ENDPOINT]  # b added nothing new to the union
    index.update(a, ENDPOINT, interest("y"))
    assert index.wanted(ENDPOINT) == interest("y") and events == [ENDPOINT, ENDPOINT]
    index.remove(b)
    assert len(events) == 2  # a still wants y
    index.remove(a)
    assert index.wanted(ENDPOINT) == interest() and len(events) == 3
    assert index.wanted_types() == []


def test_wildcard_union() -> None:
    index = SubscriptionIndex()
    events: list[str] = []
    index.add_interest_listener(events.append)
    a, b = Sub(), Sub()
    index.update(a, CLUSTER, interest(wildcard=True))
    index.update(b, CLUSTER, interest(wildcard=True))
    assert index.wanted(CLUSTER) == interest(wildcard=True) and events == [CLUSTER]
    index.remove(a)
    assert events == [CLUSTER]
    index.remove(b)
    assert index.wanted(CLUSTER) == interest() and events == [CLUSTER, CLUSTER]


def test_change_reaches_only_subscribers_of_the_name_and_wildcards() -> None:
    index = SubscriptionIndex()
    on_x, on_y, everything, other_type = Sub(), Sub(), Sub(), Sub()
    index.update(on_x, CLUSTER, interest("x"))
    index.update(on_y, CLUSTER, interest("y"))
    index.update(everything, CLUSTER, interest(wildcard=True))
    index.update(other_type, ENDPOINT, interest("x"))
    index.on_cache_change(CacheChange(CLUSTER, frozenset({"x"})))
    assert on_x.seen == [(CLUSTER, frozenset({"x"}), False)]
    assert on_y.seen == [] and other_type.seen == []
    assert everything.seen == [(CLUSTER, frozenset({"x"}), False)]


def test_sync_reaches_every_subscriber_of_the_type() -> None:
    index = SubscriptionIndex()
    named, idle = Sub(), Sub()
    index.update(named, CLUSTER, interest("x"))
    index.update(idle, CLUSTER, interest())
    index.on_cache_change(CacheChange(CLUSTER, frozenset(), True))
    assert named.seen == [(CLUSTER, frozenset(), True)]
    assert idle.seen == [(CLUSTER, frozenset(), True)]
