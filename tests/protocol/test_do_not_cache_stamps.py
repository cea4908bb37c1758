"""When a subscriber stamps the names it subscribes (issue 23).

A do-not-cache copy that arrived before a client subscribed is not served to
it; telling needs the arrival stamp at which each name was subscribed (38
bytes a name). Until a do-not-cache resource has arrived in the process none
can be stale, so no name is stamped: the flag is reset here for each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from envoy.service.discovery.v3 import discovery_pb2

import relay.resource
from relay.cache import ResourceCache, Update
from relay.protocol.delta import DeltaSubscription
from relay.protocol.view import NonceSource
from relay.resource import CachedResource, do_not_cache_seen
from relay.xds_types import ENDPOINT
from tests.protocol.fakes import FakeView

Req = discovery_pb2.DeltaDiscoveryRequest


@pytest.fixture(autouse=True)
def no_do_not_cache_yet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(relay.resource, "_do_not_cache_seen", False)
    yield


def served(state: DeltaSubscription, view: FakeView) -> list[str]:
    """The names the next response carries (ACKed at once)."""
    plan = state.next_response(view, NonceSource())
    if plan is None:
        return []
    state.on_request(Req(type_url=ENDPOINT, response_nonce=plan.nonce))
    return sorted(r.name for r in plan.resources)


def test_names_subscribed_before_any_do_not_cache_copy_are_not_stamped() -> None:
    state, view = DeltaSubscription(ENDPOINT), FakeView(ENDPOINT, {})
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["a", "b"]))
    assert state._since == {}  # the memory this saves
    view.set("a", "1", do_not_cache=True)
    assert do_not_cache_seen()
    state.mark_changed(frozenset({"a"}), False)
    assert served(state, view) == ["a"] and state.take_refetch() == frozenset()


def test_a_name_subscribed_before_any_do_not_cache_copy_is_never_stale() -> None:
    # "a" has no stamp; the wildcard, subscribed after its copy arrived, has
    # one: the name's own (earlier) subscription decides, as a stamp would.
    state, view = DeltaSubscription(ENDPOINT), FakeView(ENDPOINT, {})
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    view.set("a", "1", do_not_cache=True)
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["*"]))
    assert served(state, view) == ["a"] and state.take_refetch() == frozenset()


def test_once_a_do_not_cache_copy_arrived_names_are_stamped() -> None:
    state, view = DeltaSubscription(ENDPOINT), FakeView(ENDPOINT, {})
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["early"]))
    view.set("early", "1", do_not_cache=True)
    view.set("late", "1", do_not_cache=True)
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["late"]))
    assert list(state._since) == ["late"]
    # The copy of "late" arrived before it was subscribed: fetched afresh.
    assert served(state, view) == ["early"] and state.take_refetch() == {"late"}
    view.set("late", "2", do_not_cache=True)
    state.mark_changed(frozenset({"late"}), False)
    assert served(state, view) == ["late"]


def test_the_cache_notes_a_do_not_cache_resource_it_stores() -> None:
    # Marked after the copy was made, as tests and the fakes do: the cache,
    # not the copy's making, is where every such resource passes.
    made = CachedResource(ENDPOINT, "a", "1", discovery_pb2.Resource(name="a", version="1"))
    made.resource.cache_control.do_not_cache = True
    cache = ResourceCache()
    cache.apply(ENDPOINT, Update([CachedResource(ENDPOINT, "b", "1",
                                                 discovery_pb2.Resource(name="b"))]))
    assert not do_not_cache_seen()
    cache.apply(ENDPOINT, Update([made]))
    assert do_not_cache_seen()


def test_a_copy_from_the_origin_is_noted_as_it_is_made() -> None:
    # An origin response is checked a few resources per turn of the event
    # loop before it enters the cache: a client subscribing in between is
    # later than the copy, and must stamp its names.
    resource = discovery_pb2.Resource(name="a", version="1")
    CachedResource.from_origin(ENDPOINT, "b", discovery_pb2.Resource(name="b", version="1"))
    assert not do_not_cache_seen()
    resource.cache_control.do_not_cache = True
    made = CachedResource.from_origin(ENDPOINT, "a", resource)
    assert do_not_cache_seen()
    state, view = DeltaSubscription(ENDPOINT), FakeView(ENDPOINT, {})
    state.on_request(Req(type_url=ENDPOINT, resource_names_subscribe=["a"]))
    view._resources["a"] = made  # it enters the cache after the subscription
    assert served(state, view) == [] and state.take_refetch() == {"a"}
