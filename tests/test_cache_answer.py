"""ResourceCache's answers (Update.answered) and the settling of a big client's
names: a plain name may be given as its name, and an answer a reader cannot
see (the name holds one unconstrained variant) is written without telling the
listeners. What readers see is what the Locator path gives."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.cache import ABSENT, CacheChange, Missing, ResourceCache, Update
from relay.constraints import EMPTY_PARAMS, Locator, compile_constraints, params_of
from relay.protocol.view import CacheView
from relay.resource import CachedResource
from relay.upstream import settling as settling_module
from relay.upstream.deadlines import Deadlines
from relay.upstream.responses import Unusable, parse_response
from relay.upstream.settling import Settling
from relay.xds_types import ENDPOINT
from tests.builders import endpoints
from tests.variants import CANARY

GLOB = "xdstp://auth/envoy.config.endpoint.v3.ClusterLoadAssignment/pool/*"
MEMBER = "xdstp://auth/envoy.config.endpoint.v3.ClusterLoadAssignment/pool/m1"
DEV = params_of({"env": "dev"})


def resource(name: str, constraints: Any = None) -> CachedResource:
    message = discovery_pb2.Resource(name=name, version="1", resource=any_pb2.Any(
        type_url=ENDPOINT, value=endpoints(name, 80).SerializeToString()))
    if constraints is None:
        return CachedResource(ENDPOINT, name, "1", message)
    return CachedResource(ENDPOINT, name, "1", message, compile_constraints(constraints))


def written(as_names: bool) -> tuple[ResourceCache, list[CacheChange]]:
    """A cache of names in every state a record can be in, then answered."""
    cache = ResourceCache(clock=lambda: 100.0)
    cache.apply(ENDPOINT, Update([resource("plain"), resource("aliased"),
                                  resource("canary", CANARY)], removed=["gone"]))
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    plain = ["plain", "canary", "gone", "unknown", GLOB, MEMBER]
    answered: list[Locator | str] = [*plain] if as_names else [Locator(n) for n in plain]
    cache.apply(ENDPOINT, Update(answered=[*answered, Locator("plain", DEV),
                                           Locator("unknown", DEV)]))
    return cache, changes


def seen(cache: ResourceCache) -> list[object]:
    view = CacheView(cache)
    return [(name, params, found if isinstance(found := view.lookup(ENDPOINT, name, params),
                                                  Missing) else found.variant_key,
             cache.is_answered(ENDPOINT, Locator(name, params)))
            for name in ("plain", "canary", "gone", "unknown", GLOB, MEMBER, "other")
            for params in (EMPTY_PARAMS, DEV)]


def test_plain_names_given_as_names_are_answered_as_their_locators() -> None:
    (by_name, changes_by_name), (by_locator, changes) = written(True), written(False)
    assert seen(by_name) == seen(by_locator)
    assert changes_by_name == changes


def test_an_answer_a_reader_cannot_see_tells_nobody() -> None:
    cache, changes = written(True)
    # "plain" holds one unconstrained variant: every subscriber gets it,
    # answered or not. The others' answers are news: a canary variant the
    # node's parameters may not match, a name removed or never sent, a glob.
    [change] = changes
    assert change.names == frozenset({"canary", "gone", "unknown", GLOB, MEMBER})
    assert cache.is_answered(ENDPOINT, Locator("plain"))
    assert cache.is_answered(ENDPOINT, Locator("plain", DEV))
    assert CacheView(cache).lookup(ENDPOINT, "canary", EMPTY_PARAMS) is ABSENT
    assert compile_constraints(CANARY).matches(EMPTY_PARAMS) is False


def test_answering_a_cached_name_again_changes_nothing() -> None:
    cache, changes = written(True)
    before = seen(cache)
    assert cache.apply(ENDPOINT, Update(answered=["plain", "canary", Locator("plain", DEV)])) \
        == frozenset()
    assert len(changes) == 1 and seen(cache) == before


@pytest.mark.parametrize("count", [1, 3_000])
def test_a_big_clients_names_settle_with_no_locator_made_and_nobody_told(
        count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []
    real = settling_module._locator

    def counting(key: Any) -> Locator:
        made.append(key)
        return real(key)

    monkeypatch.setattr(settling_module, "_locator", counting)
    cache = ResourceCache(clock=lambda: 1.0)
    names = [f"big-{i}" for i in range(count)]
    settling = Settling(0.5, Deadlines())
    settling.subscribed_all(ENDPOINT, dict.fromkeys(names, frozenset({EMPTY_PARAMS})), 1.0)
    response = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce="1")
    for name in names:
        response.resources.add(name=name, version="1", resource=any_pb2.Any(
            type_url=ENDPOINT, value=endpoints(name, 80).SerializeToString()))
    parsed = parse_response(response)
    assert not isinstance(parsed, Unusable)
    too_soon = settling.answered_keys(ENDPOINT, 1.1)
    cache.apply(ENDPOINT, Update(parsed.upserts, answered=too_soon))
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    settled = settling.due_keys(1.5)
    assert too_soon == [] and settled == {ENDPOINT: names}
    cache.apply(ENDPOINT, Update(answered=settled[ENDPOINT]))
    assert made == []
    assert all(cache.is_answered(ENDPOINT, Locator(name)) for name in names)
    assert changes == []  # the same as a client would see: the resources, sent already
