"""InterestIndex and glob collections: held once, as names; members' changes fanned out."""

from __future__ import annotations

from relay.cache import CacheChange
from relay.interest import InterestIndex
from relay.xds_types import ENDPOINT
from tests.test_interest import Sub, Up, interest

EDS = "envoy.config.endpoint.v3.ClusterLoadAssignment"
GLOB = f"xdstp://auth/{EDS}/pool/*?zone=b"
M1 = f"xdstp://auth/{EDS}/pool/m1?zone=b"
M2 = f"xdstp://auth/{EDS}/pool/m2?zone=b"
OTHER_ZONE = f"xdstp://auth/{EDS}/pool/m1?zone=c"


def changed(*names: str) -> CacheChange:
    return CacheChange(ENDPOINT, frozenset(names))


def test_invariant_36_a_glob_is_in_the_union_once_for_all_its_subscribers() -> None:
    index, up = InterestIndex(), Up()
    index.link(up)
    first, second = Sub(), Sub()
    index.update(first, ENDPOINT, interest(GLOB))
    index.update(second, ENDPOINT, interest(GLOB))
    assert list(index.wanted_locators(ENDPOINT)) == [GLOB]
    assert up.names == [[GLOB]]  # the second subscriber asked the origin nothing
    assert index.upstream_names == 1


def test_invariant_36_a_member_change_reaches_the_collection_and_the_member_subscribers() -> None:
    index = InterestIndex()
    by_glob, by_name, both, other = Sub(), Sub(), Sub(), Sub()
    index.update(by_glob, ENDPOINT, interest(GLOB))
    index.update(by_name, ENDPOINT, interest(M1))
    index.update(both, ENDPOINT, interest(GLOB, M1))
    index.update(other, ENDPOINT, interest("classic"))
    index.on_cache_change(changed(M1))
    for sub in (by_glob, by_name, both):
        assert sub.seen == [(ENDPOINT, frozenset({M1}), False)]
    assert other.seen == []
    index.on_cache_change(changed(M2, OTHER_ZONE, "classic"))
    assert by_glob.seen[-1] == (ENDPOINT, frozenset({M2}), False)
    assert by_name.seen == [(ENDPOINT, frozenset({M1}), False)]
    assert other.seen == [(ENDPOINT, frozenset({"classic"}), False)]


def test_once_the_last_glob_subscriber_leaves_members_reach_nobody() -> None:
    index, up = InterestIndex(), Up()
    index.link(up)
    sub = Sub()
    index.update(sub, ENDPOINT, interest(GLOB))
    index.remove(sub)
    assert up.names[-1] == [GLOB]  # the union lost it: the origin is told
    assert index.wanted_locators(ENDPOINT) == {}
    later = Sub()
    index.update(later, ENDPOINT, interest(M2))
    index.on_cache_change(changed(M1))
    assert sub.seen == [] and later.seen == []
