"""A big client's pages: found with whole-set operations, the same bytes as name by name.

A client subscribing to thousands of cached names gets them over pages (see
:data:`relay.protocol.subscription.MAX_NAMES_PER_RESPONSE`). A page the
client holds none of, whose every name is a resource all subscribers get, is
built without a lookup per name (``SubscriptionState._all_new``), and takes
the next pages into the same response while they are so too, up to
:data:`~relay.protocol.subscription.MAX_NAMES_PER_WHOLE_PAGE` names and the
response's byte budget (``SubscriptionState._more_new``); a page that is not
so looks its names up together first (``SubscriptionState._lookups``). Delta
and SotW clients alike. All must send exactly what the name-by-name loop
sends, which is what they are checked against here (the loop is forced by
raising ``PREFETCH_FROM``; with pages as large as the whole-page bound, the
very same responses, SotW's versions included), and must do the work they
claim: counted, not timed.
"""

from __future__ import annotations

import gc
import operator
from collections.abc import Callable, Iterator

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import Update
from relay.constraints import compile_constraints
from relay.core import Core
from relay.protocol import sotw, subscription
from relay.protocol.delta import DeltaSubscription
from relay.protocol.sotw import SotwSubscription
from relay.protocol.view import CacheView
from relay.resource import CachedResource
from relay.server import plans
from relay.server.serving import ServingSettings
from relay.server.streams import DownstreamStream
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack

Delta = discovery_pb2.DeltaDiscoveryRequest
Response = discovery_pb2.DeltaDiscoveryResponse

N = 6_000  # three pages


def names(n: int = N, prefix: str = "cla") -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(n)]


def resource(name: str, version: str = "1", do_not_cache: bool = False) -> CachedResource:
    made = CachedResource.from_message(ENDPOINT, pack(endpoints(name, 80, 81)), name, version)
    made.resource.cache_control.do_not_cache = do_not_cache
    return made


def warm(core: Core, resources: list[CachedResource], complete: bool = False) -> None:
    core.cache.apply(ENDPOINT, Update(resources, complete=complete))


def served(stream: DownstreamStream) -> Iterator[Response]:
    """Every response due, each ACKed, until none is."""
    while due := list(stream.ready_responses()):
        for raw in due:
            response = Response.FromString(raw)
            yield response
            stream.handle_request(Delta(type_url=ENDPOINT, response_nonce=response.nonce))


def subscribe(core: Core, subscribed: list[str], **request: object) -> list[Response]:
    stream = DownstreamStream(core.serving, "delta", "peer")
    stream.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=subscribed,
                                **request))  # type: ignore[arg-type]
    return list(served(stream))


# Each scenario: a warm core, and what a client subscribes (with what it says it holds).
Scenario = Callable[[], tuple[Core, list[str], dict[str, object]]]


def all_cached() -> tuple[Core, list[str], dict[str, object]]:
    core = Core.create()
    warm(core, [resource(name) for name in names()])
    return core, names(), {}


def some_unknown_some_absent() -> tuple[Core, list[str], dict[str, object]]:
    core = Core.create()
    cached = names()
    warm(core, [resource(name) for name in cached[::3]])
    core.cache.apply(ENDPOINT, Update(removed=cached[1::3]))  # absent; the rest unknown
    return core, cached, {}


def complete_type_with_missing_names() -> tuple[Core, list[str], dict[str, object]]:
    core = Core.create()
    warm(core, [resource(name) for name in names()[:-100]], complete=True)
    return core, names(), {}


def held_already() -> tuple[Core, list[str], dict[str, object]]:
    core = Core.create()
    warm(core, [resource(name) for name in names()])
    # the client holds every other one of them at the current version, a few at an old one
    held = {name: "1" for name in names()[::2]} | {name: "0" for name in names()[1:50:2]}
    return core, names(), {"initial_resource_versions": held}


def some_do_not_cache() -> tuple[Core, list[str], dict[str, object]]:
    core = Core.create()
    warm(core, [resource(name, do_not_cache=i % 500 == 0) for i, name in enumerate(names())])
    return core, names(), {}


def in_one_page_of_aliases() -> tuple[Core, list[str], dict[str, object]]:
    core = Core.create()
    aliased = resource("cla-target")
    aliased.resource.aliases.extend(["alias-a", "alias-b"])
    warm(core, [resource(name) for name in names(200)] + [aliased])
    return core, ["alias-a", *names(200), "alias-b", "cla-target"], {}


def constrained(name: str, env: str) -> CachedResource:
    """Variant ``env`` of ``name``: for subscribers whose ``env`` parameter is ``env``."""
    constraints = discovery_pb2.DynamicParameterConstraints(
        constraint={"key": "env", "value": env})
    origin = discovery_pb2.Resource(version=env, resource=pack(endpoints(name, 80)))
    origin.resource_name.name = name
    origin.resource_name.dynamic_parameter_constraints.CopyFrom(constraints)
    return CachedResource(ENDPOINT, name, env, origin, compile_constraints(constraints))


def some_with_variants() -> tuple[Core, list[str], dict[str, object]]:
    core = Core.create()
    # every 100th name: one variant for prod, one for canary, and none unconstrained;
    # every 100th from the 50th: one for prod only
    warm(core, [resource(name) for i, name in enumerate(names()) if i % 50] +
         [constrained(name, env) for name in names()[::100] for env in ("prod", "canary")] +
         [constrained(name, "prod") for name in names()[50::100]])
    params = base_pb2.Node(id="client", dynamic_parameters={
        ENDPOINT: {"params": {"env": "canary"}}})
    return core, names(), {"node": params}


GLOB = "xdstp://auth/envoy.config.endpoint.v3.ClusterLoadAssignment/pool/*"


def members(n: int = N) -> list[str]:
    return [GLOB.replace("*", f"m-{i:05d}") for i in range(n)]


def a_glob_collection() -> tuple[Core, list[str], dict[str, object]]:
    core = Core.create()
    # its members, one of another collection, and classic names
    other = GLOB.replace("/pool/*", "/other/m-1")
    warm(core, [resource(name) for name in [*members(), other, *names(10)]])
    # (it says it holds a name it never subscribes, which is not sent)
    return core, [GLOB, *names(10)], {"initial_resource_versions": {other: "0"}}


SCENARIOS = [a_glob_collection, all_cached, some_unknown_some_absent,
             complete_type_with_missing_names, held_already, some_do_not_cache,
             in_one_page_of_aliases, some_with_variants]


def merged(responses: list[Response]) -> Response:
    """What ``responses`` sent, in order, as one (no nonce): pages cut
    elsewhere send the same."""
    whole = Response(type_url=ENDPOINT)
    for response in responses:
        whole.resources.extend(response.resources)
        whole.removed_resources.extend(response.removed_resources)
        whole.removed_resource_names.extend(response.removed_resource_names)
        whole.resource_errors.extend(response.resource_errors)
    return whole


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_a_big_page_sends_what_the_name_by_name_loop_sends(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    core, subscribed, request = scenario()
    fast = subscribe(core, subscribed, **request)
    core, subscribed, request = scenario()
    monkeypatch.setattr(subscription, "PREFETCH_FROM", 10**9)  # every page: name by name
    slow = subscribe(core, subscribed, **request)
    assert merged(fast) == merged(slow)
    assert len(merged(fast).resources) > 0
    assert len(fast) <= len(slow)


def a_plain_glob_collection() -> tuple[Core, list[str], dict[str, object]]:
    core = Core.create()
    warm(core, [resource(name) for name in members()])
    return core, [GLOB], {}


@pytest.mark.parametrize("scenario", [all_cached, a_plain_glob_collection],
                         ids=lambda s: s.__name__)
def test_pages_sent_whole_are_the_responses_of_the_loop_with_pages_as_large(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    core, subscribed, request = scenario()
    fast = subscribe(core, subscribed, **request)
    assert [len(r.resources) for r in fast] == [N]
    core, subscribed, request = scenario()
    monkeypatch.setattr(subscription, "PREFETCH_FROM", 10**9)
    monkeypatch.setattr(subscription, "MAX_NAMES_PER_RESPONSE",
                        subscription.MAX_NAMES_PER_WHOLE_PAGE)
    assert fast == subscribe(core, subscribed, **request)  # nonces and all


def test_pages_sent_whole_stop_at_the_whole_page_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscription, "MAX_NAMES_PER_WHOLE_PAGE", 5_000)
    core, subscribed, _ = all_cached()
    together = count_calls(monkeypatch, CacheView, "served_to_all")
    responses = subscribe(core, subscribed)
    assert [len(r.resources) for r in responses] == [5_000, 1_000]
    # pages of 2,500, 2,500 (of the bound: the first response), 1,000
    assert together[0] == 3
    assert [r.name for r in merged(responses).resources] == subscribed


def test_pages_sent_whole_keep_within_max_response_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    entry = len(resource(names()[0]).delta_entry)  # (every name as long, every entry too)
    limit = 64 + len(ENDPOINT) + 4_000 * entry  # (the head's bytes: see relay.protocol.sizing)

    def sized() -> tuple[Core, list[str], dict[str, object]]:
        core = Core.create(settings=ServingSettings(max_response_size=limit))
        warm(core, [resource(name) for name in names()])
        return core, names(), {}

    core, subscribed, _ = sized()
    fast = subscribe(core, subscribed)
    assert [len(r.resources) for r in fast] == [4_000, 2_000]
    assert all(r.ByteSize() <= limit for r in fast)
    core, subscribed, _ = sized()
    monkeypatch.setattr(subscription, "PREFETCH_FROM", 10**9)
    monkeypatch.setattr(subscription, "MAX_NAMES_PER_RESPONSE",
                        subscription.MAX_NAMES_PER_WHOLE_PAGE)
    assert fast == subscribe(core, subscribed)


def test_a_page_the_client_holds_some_of_is_not_sent_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core, subscribed, _ = all_cached()
    # it holds a name of the second page: the first page goes whole, alone
    request = {"initial_resource_versions": {subscribed[3_000]: "1"}}
    responses = subscribe(core, subscribed, **request)
    assert [len(r.resources) for r in responses] == [2_500, 2_499, 1_000]


def count_calls(monkeypatch: pytest.MonkeyPatch, cls: type, method: str) -> list[int]:
    calls = [0]
    original = getattr(cls, method)

    def counted(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(cls, method, counted)
    return calls


def test_a_fresh_big_client_is_served_without_a_lookup_per_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core, subscribed, _ = all_cached()
    lookups = count_calls(monkeypatch, CacheView, "lookup")
    together = count_calls(monkeypatch, CacheView, "served_to_all")
    responses = subscribe(core, subscribed)
    assert [len(r.resources) for r in responses] == [N]  # its pages whole, in one
    assert lookups[0] == 0
    assert together[0] == 3  # once per page


def test_a_glob_subscriber_is_served_without_a_lookup_per_member(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core, subscribed, _ = a_glob_collection()
    lookups = count_calls(monkeypatch, CacheView, "lookup")
    responses = subscribe(core, subscribed)
    assert sum(len(r.resources) for r in responses) == N + 10
    assert lookups[0] == 0


def test_a_page_with_names_not_served_to_all_looks_up_only_those(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core, subscribed, _ = some_unknown_some_absent()
    lookups = count_calls(monkeypatch, CacheView, "lookup")
    responses = subscribe(core, subscribed)
    assert sum(len(r.resources) for r in responses) == len(subscribed[::3])
    assert sum(len(r.removed_resources) for r in responses) == len(subscribed[1::3])
    # The cached third is found together; the absent and unknown rest, one by one.
    assert lookups[0] == N - len(subscribed[::3])


def test_a_small_push_looks_names_up_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    core, subscribed, _ = all_cached()
    stream = DownstreamStream(core.serving, "delta", "peer")
    stream.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=subscribed))
    list(served(stream))
    lookups = count_calls(monkeypatch, CacheView, "lookup")
    together = count_calls(monkeypatch, CacheView, "served_to_all")
    warm(core, [resource(name, "2") for name in subscribed[:3]])
    [push] = served(stream)
    assert [r.name for r in push.resources] == subscribed[:3]
    assert (lookups[0], together[0]) == (3, 0)


def unsubscribing_while_paged(core: Core) -> list[Response]:
    """Subscribes N names, and with the first page's ACK unsubscribes some
    that wait for a later page: they must not be sent."""
    stream = DownstreamStream(core.serving, "delta", "peer")
    stream.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names()))
    [first] = [Response.FromString(raw) for raw in stream.ready_responses()]
    stream.handle_request(Delta(type_url=ENDPOINT, response_nonce=first.nonce,
                                resource_names_unsubscribe=names()[3_000:3_100]))
    return [first, *served(stream)]


def test_names_unsubscribed_while_they_wait_for_a_page_are_not_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # (a page per response, so that names wait: else the first takes them all)
    monkeypatch.setattr(subscription, "MAX_NAMES_PER_WHOLE_PAGE",
                        subscription.MAX_NAMES_PER_RESPONSE)
    fast = unsubscribing_while_paged(all_cached()[0])
    monkeypatch.setattr(subscription, "PREFETCH_FROM", 10**9)
    assert fast == unsubscribing_while_paged(all_cached()[0])
    sent = [r.name for response in fast for r in response.resources]
    assert len(sent) == N - 100 and names()[3_000] not in sent


# -- SotW: the same pages, in DiscoveryResponses ------------------------------------------

Sotw = discovery_pb2.DiscoveryRequest
SotwResponse = discovery_pb2.DiscoveryResponse
RESOURCE_IN_SOTW = "xds.config.supports-resource-in-sotw"


def sotw_subscribe(core: Core, subscribed: list[str], **request: object) -> list[SotwResponse]:
    """A SotW client's responses, each ACKed (naming every name again, as
    Envoy's ACKs do), until none is due."""
    stream = DownstreamStream(core.serving, "sotw", "peer")
    stream.handle_request(Sotw(type_url=ENDPOINT, resource_names=subscribed,
                               **request))  # type: ignore[arg-type]
    return list(sotw_served(stream, subscribed))


def sotw_served(stream: DownstreamStream, subscribed: list[str]) -> Iterator[SotwResponse]:
    """Every response due, each ACKed, until none is."""
    while due := list(stream.ready_responses()):
        for raw in due:
            response = SotwResponse.FromString(raw)
            yield response
            stream.handle_request(Sotw(type_url=ENDPOINT, resource_names=subscribed,
                                       response_nonce=response.nonce,
                                       version_info=response.version_info))


def with_ttl() -> tuple[Core, list[str], dict[str, object]]:
    """Every 1,000th resource has a TTL, which a client taking Resource in
    SotW gets wrapped."""
    core = Core.create()
    made = [resource(name) for name in names()]
    for ttl in made[::1_000]:
        ttl.resource.ttl.FromSeconds(30)
    warm(core, made)
    node = base_pb2.Node(id="client", client_features=[RESOURCE_IN_SOTW])
    return core, names(), {"node": node}


def with_locators() -> tuple[Core, list[str], dict[str, object]]:
    """Names subscribed by plain name and, every 1,000th, by locator: those
    go wrapped in Resource."""
    core = Core.create()
    warm(core, [resource(name) for name in names()])
    located = names()[::1_000]
    return core, [n for n in names() if n not in located], {
        "resource_locators": [discovery_pb2.ResourceLocator(name=n) for n in located]}


SOTW_SCENARIOS = [all_cached, some_unknown_some_absent, complete_type_with_missing_names,
                  some_do_not_cache, in_one_page_of_aliases, some_with_variants, with_ttl,
                  with_locators]


def sotw_merged(responses: list[SotwResponse]) -> SotwResponse:
    """What ``responses`` sent, in order, as one, with the last version (no nonce)."""
    whole = SotwResponse(type_url=ENDPOINT, version_info=responses[-1].version_info)
    for response in responses:
        whole.resources.extend(response.resources)
        whole.resource_errors.extend(response.resource_errors)
    return whole


@pytest.mark.parametrize("scenario", SOTW_SCENARIOS, ids=lambda s: s.__name__)
def test_a_big_sotw_page_sends_what_the_name_by_name_loop_sends(
        scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    core, subscribed, request = scenario()
    fast = sotw_subscribe(core, subscribed, **request)
    core, subscribed, request = scenario()
    monkeypatch.setattr(subscription, "PREFETCH_FROM", 10**9)  # every page: name by name
    slow = sotw_subscribe(core, subscribed, **request)
    assert sotw_merged(fast) == sotw_merged(slow)  # the version (what it holds) too
    assert len(sotw_merged(fast).resources) > 0
    assert len(fast) <= len(slow)


def test_sotw_pages_sent_whole_are_the_responses_of_the_loop_with_pages_as_large(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core, subscribed, _ = all_cached()
    fast = sotw_subscribe(core, subscribed)
    assert [len(r.resources) for r in fast] == [N]
    core, subscribed, _ = all_cached()
    monkeypatch.setattr(subscription, "PREFETCH_FROM", 10**9)
    monkeypatch.setattr(subscription, "MAX_NAMES_PER_RESPONSE",
                        subscription.MAX_NAMES_PER_WHOLE_PAGE)
    assert fast == sotw_subscribe(core, subscribed)  # nonces, versions and all


def test_sotw_pages_sent_whole_keep_within_max_response_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    entry = len(resource(names()[0]).sotw_entry)
    limit = 64 + len(ENDPOINT) + 4_000 * entry  # (the head's bytes: see relay.protocol.sizing)

    def sized() -> Core:
        core = Core.create(settings=ServingSettings(max_response_size=limit))
        warm(core, [resource(name) for name in names()])
        return core

    fast = sotw_subscribe(sized(), names())
    assert [len(r.resources) for r in fast] == [4_000, 2_000]
    assert all(r.ByteSize() <= limit for r in fast)
    monkeypatch.setattr(subscription, "PREFETCH_FROM", 10**9)
    monkeypatch.setattr(subscription, "MAX_NAMES_PER_RESPONSE",
                        subscription.MAX_NAMES_PER_WHOLE_PAGE)
    assert fast == sotw_subscribe(sized(), names())


def test_a_fresh_big_sotw_client_is_served_without_a_lookup_per_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core, subscribed, _ = all_cached()
    lookups = count_calls(monkeypatch, CacheView, "lookup")
    together = count_calls(monkeypatch, CacheView, "served_to_all")
    responses = sotw_subscribe(core, subscribed)
    assert [len(r.resources) for r in responses] == [N]  # its pages whole, in one
    assert lookups[0] == 0
    assert together[0] == 3  # once per page


def sotw_holding_then_more(core: Core) -> list[SotwResponse]:
    """A SotW client holds the first 3,000 names; 10 of them change as, in
    its ACK, it asks for all 6,000: its responses from then on."""
    stream = DownstreamStream(core.serving, "sotw", "peer")
    first = names()[:3_000]
    stream.handle_request(Sotw(type_url=ENDPOINT, resource_names=first))
    held = list(sotw_served(stream, first))
    assert sum(len(r.resources) for r in held) == 3_000
    warm(core, [resource(name, "2") for name in first[:10]])
    stream.handle_request(Sotw(type_url=ENDPOINT, resource_names=names(),
                               version_info=held[-1].version_info,
                               response_nonce=held[-1].nonce))
    return list(sotw_served(stream, names()))


def test_a_sotw_page_the_client_holds_some_of_is_not_sent_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fast = sotw_holding_then_more(all_cached()[0])
    # the first page (10 changed, 2,490 new) name by name; the rest whole
    assert [len(r.resources) for r in fast] == [2_500, 510]
    monkeypatch.setattr(subscription, "PREFETCH_FROM", 10**9)
    slow = sotw_holding_then_more(all_cached()[0])
    for response in (*fast, *slow):
        response.nonce = ""  # (the loop took more responses for the first 3,000)
    assert fast == slow


class CountingGetter:
    """An attribute getter that counts its calls (a callable object, not a
    function: set on a class, it is not bound as a method)."""

    def __init__(self, attribute: str) -> None:
        self.get = operator.attrgetter(attribute)
        self.calls = 0

    def __call__(self, resource: CachedResource) -> bytes:
        self.calls += 1
        entry: bytes = self.get(resource)
        return entry


@pytest.mark.parametrize("protocol", ["delta", "sotw"])
def test_a_page_sent_whole_reads_each_entry_once(
        monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    """The page reads each resource's entry to size the response; the
    encoder sends those, not each read again."""
    core, subscribed, _ = all_cached()
    state = DeltaSubscription if protocol == "delta" else SotwSubscription
    attribute = "delta_entry" if protocol == "delta" else "sotw_entry"
    sized, encoded = CountingGetter(attribute), CountingGetter(attribute)
    monkeypatch.setattr(state, "_whole_entry", sized)
    monkeypatch.setattr(plans, "_DELTA_ENTRY" if protocol == "delta" else "_SOTW_ENTRY",
                        encoded)
    responses = subscribe(core, subscribed) if protocol == "delta" else \
        sotw_subscribe(core, subscribed)
    assert [len(r.resources) for r in responses] == [N]
    assert (sized.calls, encoded.calls) == (N, 0)


def test_a_second_sotw_client_finds_the_terms_of_its_version_without_a_call_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The version of a page sent whole is the sum of its resources' terms,
    hashed for the first client and found for the next in one pass: the
    same version_info, no Python call per resource."""
    core, subscribed, _ = all_cached()
    [first] = sotw_subscribe(core, subscribed)
    hashed = count_calls(monkeypatch, sotw, "own_term")
    [second] = sotw_subscribe(core, subscribed)
    assert second.version_info == first.version_info and hashed == [0]
    assert len(second.resources) == N


def test_a_resources_term_goes_with_it() -> None:
    gc.collect()  # (the resources of tests before, and their terms)
    before = len(sotw._OWN_TERMS)
    made = [resource(name) for name in names(10, "gone")]
    assert sotw.own_terms(made) == sum(map(sotw.own_term, made))
    assert len(sotw._OWN_TERMS) == before + 10
    del made
    gc.collect()
    assert len(sotw._OWN_TERMS) == before
