"""A cold big client's pages: sent whole while some of their names have not arrived.

A client subscribing to thousands of names the relay must first fetch sees
them arrive 2,000 a turn, in no order of its own: its pages hold names the
cache serves to all and names it knows nothing of yet. The name-by-name loop
skips the latter (UNKNOWN: still subscribed, unanswered, sent once the cache
has them); a page whose every name is one or the other
(:meth:`ResourceView.unknown_to_all <relay.protocol.view.ResourceView.unknown_to_all>`
says so, in C) is sent whole instead (``SubscriptionState._all_new``), with
the next pages that are so too. These tests count the work it claims (no
Python-level step per name) and hold it to the loop: random subscriptions
and cache states, the same responses and the same state after, delta and
SotW alike.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.authorization import SecretScope
from relay.cache import UNKNOWN, ResourceCache, Update
from relay.constraints import EMPTY_PARAMS, UNCONSTRAINED, Locator, compile_constraints, params_of
from relay.core import Core
from relay.encoding import length_delimited_field
from relay.protocol import subscription
from relay.protocol.delta import DeltaSubscription
from relay.protocol.sotw import SotwSubscription, own_terms
from relay.protocol.view import CacheView, NonceSource, ScopedView
from relay.resource import CachedResource
from relay.server.streams import DownstreamStream
from relay.xds_types import ENDPOINT, SECRET
from tests.server.test_big_pages import served
from tests.test_cache import FakeClock, resource_error
from tests.test_cache_served import steps_of

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest
Response = discovery_pb2.DeltaDiscoveryResponse

COLLECTION = "xdstp://auth/envoy.config.endpoint.v3.ClusterLoadAssignment/pool"
GLOB = f"{COLLECTION}/*"
CLASSIC = ["a", "b", "c", "d", "e", "f", "g", "h"]
MEMBERS = [f"{COLLECTION}/m1", f"{COLLECTION}/m2"]
NAMES = [*CLASSIC, *MEMBERS, "al"]  # ("al": an alias, when a resource says so)
ENVS = ["canary", "prod"]
PARAMS = [EMPTY_PARAMS, *(params_of({"env": env}) for env in ENVS)]


def made(name: str, kind: str, version: str, alias: bool = False, ttl: bool = False,
         do_not_cache: bool = False) -> CachedResource:
    """A resource of ``name``: from its encoding (the bulk path's plain one),
    parsed, or with constraints (``kind`` "canary" or "prod")."""
    resource = discovery_pb2.Resource(
        name=name, version=version, aliases=["al"] if alias else [],
        resource=any_pb2.Any(type_url=ENDPOINT, value=f"{name}{version}".encode()))
    if ttl:
        resource.ttl.seconds = 5
    if do_not_cache:
        resource.cache_control.do_not_cache = True
    if kind == "encoded" and not (alias or ttl or do_not_cache):
        return CachedResource.from_encoded(ENDPOINT, name, version, length_delimited_field(
            2, resource.SerializeToString()), received=1.0)
    if kind in ENVS:
        constraints = discovery_pb2.DynamicParameterConstraints(
            constraint={"key": "env", "value": kind})
        resource.resource_name.name = name
        resource.resource_name.dynamic_parameter_constraints.CopyFrom(constraints)
        return CachedResource(ENDPOINT, name, version, resource, compile_constraints(constraints))
    return CachedResource(ENDPOINT, name, version, resource, UNCONSTRAINED)


# -- the cache's count: a lower bound of the names UNKNOWN to everybody ----------

NAME = st.sampled_from(NAMES)
SOME = st.lists(st.sampled_from([*NAMES, GLOB]), max_size=4)
KIND = st.sampled_from(["encoded", "parsed", *ENVS])
RESOURCE = st.tuples(st.sampled_from(CLASSIC[:5] + MEMBERS), KIND, st.sampled_from(["1", "2"]),
                     st.booleans(), st.booleans())
LOCATOR = st.tuples(st.sampled_from([*NAMES, GLOB]), st.sampled_from(PARAMS))
CACHE_STEP = st.one_of(
    st.tuples(st.just("upsert"), st.lists(RESOURCE, max_size=4)),
    st.tuples(st.just("remove"), SOME),
    st.tuples(st.just("error"), NAME, st.sampled_from([None, "canary"])),
    st.tuples(st.just("answer"), st.lists(LOCATOR, max_size=3)),
    st.tuples(st.just("forget"), SOME),
    st.tuples(st.just("complete"), st.lists(RESOURCE, max_size=3)),
    st.tuples(st.just("expire"), st.just(None)),
)


def write(cache: ResourceCache, clock: FakeClock, what: str, arg: Any,
          *more: Any) -> frozenset[str]:
    """One write to the cache; the names it changed (what subscribers are told)."""
    if what == "upsert":
        return cache.apply(ENDPOINT, Update([made(*spec) for spec in arg]))
    if what == "remove":
        return cache.apply(ENDPOINT, Update(removed=arg))
    if what == "error":
        return cache.apply(ENDPOINT, Update(errors=[resource_error(arg, *more)]))
    if what == "answer":
        return cache.apply(ENDPOINT, Update(answered=[
            name if params == EMPTY_PARAMS else Locator(name, params) for name, params in arg]))
    if what == "forget":
        cache.forget(ENDPOINT, arg)
        return frozenset(arg)
    if what == "complete":
        return cache.replace_type(ENDPOINT, [made(*spec) for spec in arg])
    clock.now += 10
    changed: list[frozenset[str]] = []
    cache.add_listener(lambda change: changed.append(change.names))
    cache.expire()
    cache._listeners.pop()
    return frozenset().union(*changed)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(CACHE_STEP, max_size=10))
def test_names_counted_unknown_are_unknown_to_every_subscriber(
        steps: list[tuple[Any, ...]]) -> None:
    clock = FakeClock()
    cache = ResourceCache(clock=clock)
    view = CacheView(cache)
    assert cache.unknown_to_all(ENDPOINT, NAMES) == len(NAMES)  # (no type yet)
    for what, *args in steps:
        write(cache, clock, what, *args)
        for page in (NAMES, NAMES[::-1], NAMES[:3]):
            served = cache.served_to_all(ENDPOINT, page)
            unknown = [name for name in page if name not in served and all(
                view.lookup(ENDPOINT, name, params) is UNKNOWN for params in PARAMS)]
            counted = cache.unknown_to_all(ENDPOINT, page)
            assert counted <= len(unknown)  # (a lower bound)
            if cache.is_synced(ENDPOINT) and not cache.is_complete(ENDPOINT) and \
                    not cache._types[ENDPOINT].globs_answered and \
                    not cache._types[ENDPOINT].aliases:
                # exact: every name with no record at all
                records = cache._types[ENDPOINT].records
                assert counted == sum(name not in records for name in page)


def test_a_cold_type_counts_its_names_without_a_step_per_name() -> None:
    cache = ResourceCache()
    cached = [f"big-{i}" for i in range(0, 3_000, 3)]
    cache.apply(ENDPOINT, Update([made(name, "encoded", "1") for name in cached],
                                 answered=cached))
    page = [f"big-{i}" for i in range(3_000)]
    counts: list[int] = []
    small = steps_of(lambda: counts.append(cache.unknown_to_all(ENDPOINT, page[:30])))
    assert small == steps_of(lambda: counts.append(cache.unknown_to_all(ENDPOINT, page)))
    assert counts == [20, 2_000]


def test_a_complete_type_or_one_with_a_glob_answered_counts_none() -> None:
    cache = ResourceCache()
    cache.apply(ENDPOINT, Update([made("a", "encoded", "1")]))
    assert cache.unknown_to_all(ENDPOINT, ["a", "b", MEMBERS[0]]) == 2
    cache.apply(ENDPOINT, Update(answered=[Locator(GLOB, PARAMS[1])]))
    # (the member is absent for canary now: the count cannot tell the names apart)
    assert CacheView(cache).lookup(ENDPOINT, MEMBERS[0], PARAMS[1]) is not UNKNOWN
    assert cache.unknown_to_all(ENDPOINT, ["a", "b", MEMBERS[0]]) == 0
    other = ResourceCache()
    other.replace_type(ENDPOINT, [made("a", "encoded", "1")])
    assert other.unknown_to_all(ENDPOINT, ["b"]) == 0


def test_a_scoped_view_counts_none_of_its_type() -> None:
    cache = ResourceCache()
    cache.apply(SECRET, Update([]))
    cache.apply(ENDPOINT, Update([]))
    scoped = ScopedView(CacheView(cache), SECRET, SecretScope())
    assert scoped.unknown_to_all(SECRET, ["x", "y"]) == 0  # (absent to this client)
    assert scoped.unknown_to_all(ENDPOINT, ["x", "y"]) == 2


# -- the work a page takes ------------------------------------------------------------

def _cold(n: int, kind: str) -> tuple[Any, CacheView]:
    """A state subscribed to ``n`` names, a third of them cached (plain), the
    rest unknown yet: what its first response looks at."""
    cache = ResourceCache()
    names = [f"big-{i:05}" for i in range(n)]
    cache.apply(ENDPOINT, Update([made(name, "encoded", "1") for name in names[::3]]))
    state: Any
    if kind == "delta":
        state = DeltaSubscription(ENDPOINT)
        state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names))
    else:
        state = SotwSubscription(ENDPOINT)
        state.on_request(Sotw(type_url=ENDPOINT, resource_names=names))
        # (each resource's entry made and term hashed once, as for another
        # client: see own_terms)
        resources = cache.served_to_all(ENDPOINT, names).values()
        own_terms(resources)
        for resource in resources:
            assert resource.sotw_entry
    return state, CacheView(cache)


@pytest.mark.parametrize("kind", ["delta", "sotw"])
def test_a_page_partly_cached_costs_no_python_level_step_per_name(kind: str) -> None:
    sent: list[int] = []

    def steps(n: int) -> int:
        state, view = _cold(n, kind)
        plans: list[Any] = []
        counted = steps_of(lambda: plans.append(state.next_response(view, NonceSource())))
        sent.append(len(plans[0].resources))
        return counted

    # (one page each: a page's steps, not the pages')
    assert steps(60) == steps(2_400)
    assert sent == [20, 800]


def test_a_cold_client_is_sent_what_arrived_of_all_its_pages_without_a_lookup(
        monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"cla-{i:05d}" for i in range(6_000)]  # three pages
    arrived = random.Random(27).sample(names, 2_000)  # (an origin's turn: any order)
    lookups = [0]
    lookup = CacheView.lookup

    def counted(*args: Any) -> Any:
        lookups[0] += 1
        return lookup(*args)

    def join() -> list[Response]:
        core = Core.create()
        stream = DownstreamStream(core.serving, "delta", "peer")
        stream.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=names))
        responses = []
        # (first the type synced with none of them, as the relay's first
        # response to a cold client often finds it: every page unknown)
        for turn in ([], arrived, sorted(set(names) - set(arrived))):
            core.cache.apply(ENDPOINT, Update([made(name, "encoded", "1") for name in turn],
                                              answered=turn))
            responses += served(stream)
        return responses

    monkeypatch.setattr(CacheView, "lookup", counted)
    fast = join()
    assert [len(r.resources) for r in fast] == [2_000, 4_000]
    assert [r.name for r in fast[0].resources] == sorted(arrived)
    assert lookups[0] == 0
    monkeypatch.setattr(subscription, "PREFETCH_FROM", 10**9)  # every page: name by name
    slow = join()
    assert len(slow) > len(fast) and lookups[0] >= 2 * len(names)
    assert sorted(r.name for s in slow for r in s.resources) == names
    # (the same names in the same order where the loop's pages saw the same cache)
    assert [len(r.resources) for r in slow] == [2_000, 2_500, 1_500]
    assert [r.name for r in slow[0].resources] == sorted(arrived)


# -- any subscriptions and cache states: what the loop does ---------------------------

WANT = st.sampled_from([*NAMES, GLOB])
CLIENT_STEP = st.one_of(
    st.tuples(st.just("subscribe"), st.lists(WANT, max_size=8),
              st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(ENVS)), max_size=2)),
    st.tuples(st.just("unsubscribe"), st.lists(WANT, max_size=3), st.just([])),
    st.tuples(st.just("respond"), st.booleans(), st.just([])),
)
# (plain upserts, subscriptions and responses the most often: pages partly
# cached, partly unknown, and sent)
PLAIN = st.tuples(st.sampled_from(CLASSIC + MEMBERS), st.just("encoded"),
                  st.sampled_from(["1", "2"]), st.just(False), st.just(False))
STEP = st.one_of(CACHE_STEP, CLIENT_STEP,
                 st.tuples(st.just("upsert"), st.lists(PLAIN, min_size=1, max_size=3)),
                 st.tuples(st.just("subscribe"), st.lists(st.sampled_from(NAMES), min_size=2,
                                                          max_size=8), st.just([])),
                 st.tuples(st.just("respond"), st.just(False), st.just([])))


class Run:
    """One state driven by the steps, what it sent and its state after each."""

    def __init__(self, kind: str, held: list[str], limit: int | None) -> None:
        self.kind, self.limit = kind, limit
        self.nonces = NonceSource()
        self.seen: list[object] = []
        self.subscribed: set[str] = set()
        self.locators: dict[str, str] = {}
        self.state: Any
        if kind == "delta":
            self.state = DeltaSubscription(ENDPOINT)
            self.state.on_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["a"],
                                        initial_resource_versions=dict.fromkeys(held, "1")))
            self.subscribed.add("a")
        else:
            self.state = SotwSubscription(ENDPOINT, resource_in_sotw=bool(held))
            self.request()
        self.nonce = ""

    def request(self, nonce: str = "", nack: bool = False) -> None:
        names = [n for n in sorted(self.subscribed) if n not in self.locators]
        locators = [discovery_pb2.ResourceLocator(name=n, dynamic_parameters={"env": env})
                    for n, env in sorted(self.locators.items())]
        request = Sotw(type_url=ENDPOINT, resource_names=names, resource_locators=locators,
                       response_nonce=nonce)
        if nack:
            request.error_detail.message = "no"
        self.state.on_request(request)

    def client(self, what: str, names: Any, locators: list[tuple[str, str]]) -> None:
        if what == "subscribe":
            if self.kind == "sotw":
                names = [n for n in names if n != GLOB]
                self.subscribed.update(names)
                for name, env in locators:
                    self.subscribed.add(name)
                    self.locators[name] = env
                self.request(self.nonce)
            else:
                self.state.on_request(Delta(
                    type_url=ENDPOINT, resource_names_subscribe=names,
                    resource_locators_subscribe=[discovery_pb2.ResourceLocator(
                        name=n, dynamic_parameters={"env": env}) for n, env in locators]))
        elif what == "unsubscribe":
            if self.kind == "sotw":
                self.subscribed.difference_update(names)
                for name in names:
                    self.locators.pop(name, None)
                self.request(self.nonce)
            else:
                self.state.on_request(Delta(type_url=ENDPOINT,
                                            resource_names_unsubscribe=names))
        else:
            self.respond(view=self.view, nack=names)

    view: CacheView

    def respond(self, view: CacheView, nack: bool) -> None:
        plan = self.state.next_response(view, self.nonces, self.limit)
        if plan is None:
            self.seen.append(None)
            return
        if self.kind == "delta":
            self.seen.append(([r.name for r in plan.resources], plan.removed,
                              list(plan.removed_names), list(plan.errors),
                              [r.name for r in plan.heartbeats], plan.nonce))
            reply = Delta(type_url=ENDPOINT, response_nonce=plan.nonce)
            if nack:
                reply.error_detail.message = "no"
            self.state.on_request(reply)
        else:
            self.seen.append(([r.name for r in plan.resources], plan.version_info,
                              sorted(plan.wrapped), list(plan.errors),
                              sorted(plan.heartbeats), plan.nonce))
            self.nonce = plan.nonce
            self.request(plan.nonce, nack)

    def after(self) -> list[object]:
        """What the state holds and owes, as far as anyone can tell it apart."""
        state = self.state
        return [state.snapshot(), sorted(state._pending), state._backlog,
                {name: (type(held).__name__, held.name, held.version, held.variant_key)
                 for name, held in state._held.items()},
                sorted(getattr(state, "_unanswered", None) or ()),
                sorted(getattr(state, "_resend", None) or ()),
                state._errors_sent, sorted(state._refetch or ()),
                sorted(state._pending_heartbeats or ()), getattr(state, "_held_sum", None),
                state.has_work()]


def drive(kind: str, steps: list[tuple[Any, ...]], held: list[str], limit: int | None,
          fast: bool, backlogs: bool = False) -> list[object]:
    """What ``steps`` make a state send and hold (each step's state after it;
    ``backlogs``: each response's backlog after it, too), with the responses
    left due at the end; ``fast``: with pages looked at together."""
    clock = FakeClock()
    cache = ResourceCache(clock=clock)
    cache.apply(ENDPOINT, Update())  # (synced)
    run = Run(kind, held, limit)
    run.view = CacheView(cache)
    with pytest.MonkeyPatch.context() as patched:
        # fast: every page of a name or more looked at together; slow: the loop's
        patched.setattr(subscription, "PREFETCH_FROM", 1 if fast else 10**9)
        for what, *args in steps:
            if what in ("subscribe", "unsubscribe", "respond"):
                run.client(what, *args)
            else:
                changed = write(cache, clock, what, *args)
                # (as the interest index marks them: those the client wants)
                run.state.mark_changed(frozenset(filter(run.state._covers, changed)), False)
            run.seen.append(run.after())
        while run.state.has_work() and len(run.seen) < 200:
            run.respond(run.view, nack=False)
            if backlogs:
                backlog = run.state._backlog
                run.seen.append([backlog[:3] if backlog else None])
        run.seen.append(run.after())
    return run.seen


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(STEP, max_size=16), kind=st.sampled_from(["delta", "sotw"]),
       held=st.lists(st.sampled_from(CLASSIC), max_size=2), page=st.integers(1, 4),
       limit=st.sampled_from([None, 150, 220, 400]))
def test_pages_partly_unknown_are_what_the_loop_makes_of_them(
        steps: list[tuple[Any, ...]], kind: str, held: list[str], page: int,
        limit: int | None) -> None:
    with pytest.MonkeyPatch.context() as patched:
        # (pages sent whole take no page after them, not even the rest of one
        # cut short: the loop's pages, one a response, nonces and all; pages
        # taken together are held to the loop's below)
        patched.setattr(subscription, "MAX_NAMES_PER_RESPONSE", page)
        patched.setattr(subscription, "MAX_NAMES_PER_WHOLE_PAGE", 1)
        fast = drive(kind, steps, held, limit, fast=True)
        slow = drive(kind, steps, held, limit, fast=False)
    assert fast == slow


# (a cold join: many names subscribed at once, arriving a few a turn, answered
# between; now and then any other write)
COLD = st.tuples(
    st.tuples(st.just("subscribe"), st.lists(st.sampled_from(NAMES), min_size=4, max_size=11,
                                             unique=True), st.just([])),
    st.tuples(st.just("upsert"), st.lists(PLAIN, min_size=1, max_size=4)),
    st.lists(st.one_of(st.tuples(st.just("upsert"), st.lists(PLAIN, min_size=1, max_size=3)),
                       st.tuples(st.just("respond"), st.booleans(), st.just([])),
                       st.tuples(st.just("respond"), st.just(False), st.just([])),
                       CACHE_STEP, CLIENT_STEP), max_size=10),
).map(lambda join: [join[0], join[1], *join[2]])


@settings(max_examples=400, deadline=None)
@given(steps=COLD, kind=st.sampled_from(["delta", "sotw"]),
       held=st.lists(st.sampled_from(CLASSIC), max_size=2), page=st.integers(2, 5),
       limit=st.sampled_from([None, 150, 220, 400]))
def test_cold_joins_are_what_the_loop_makes_of_them(
        steps: list[tuple[Any, ...]], kind: str, held: list[str], page: int,
        limit: int | None) -> None:
    test_pages_partly_unknown_are_what_the_loop_makes_of_them.hypothesis.inner_test(
        steps, kind, held, page, limit)


@pytest.mark.parametrize("kind", ["delta", "sotw"])
@pytest.mark.parametrize("limit", [None, 150, 300])
def test_a_cold_join_cut_by_the_budget_is_what_the_loop_makes_of_it(
        kind: str, limit: int | None) -> None:
    names = [f"n{i:02}" for i in range(12)]
    steps: list[tuple[Any, ...]] = [
        ("subscribe", names, []),
        ("upsert", [(name, "encoded", "1", False, False) for name in names[1::2]]),
        *[("respond", False, [])] * 3,
        ("upsert", [(name, "encoded", "1", False, False) for name in names[::4]]),
        *[("respond", False, [])] * 3]
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(subscription, "MAX_NAMES_PER_RESPONSE", 5)
        patched.setattr(subscription, "MAX_NAMES_PER_WHOLE_PAGE", 5)
        fast = drive(kind, steps, [], limit, fast=True)
        slow = drive(kind, steps, [], limit, fast=False)
    assert fast == slow
    sent = [name for seen in fast if isinstance(seen, tuple) for name in seen[0]]
    assert sorted(sent) == sorted(names[1::2] + names[::4])


@pytest.mark.parametrize("kind", ["delta", "sotw"])
def test_pages_taken_together_stop_at_the_first_name_that_did_not_fit(kind: str) -> None:
    names = [f"n{i:02}" for i in range(30)]
    cached = names[::3]
    steps: list[tuple[Any, ...]] = [
        ("subscribe", names, []),
        ("upsert", [(name, "encoded", "1", False, False) for name in cached])]
    one = made(names[0], "encoded", "1")  # (every entry as long)
    entry = len(one.delta_entry if kind == "delta" else one.sotw_entry)
    limit = 64 + len(ENDPOINT) + 4 * entry + 2  # (four entries: the head's bytes, sizing)
    with pytest.MonkeyPatch.context() as patched:
        # pages of 5 names, up to three of them a response
        patched.setattr(subscription, "MAX_NAMES_PER_RESPONSE", 5)
        patched.setattr(subscription, "MAX_NAMES_PER_WHOLE_PAGE", 15)
        fast = drive(kind, steps, [], limit, fast=True, backlogs=True)
        slow = drive(kind, steps, [], limit, fast=False)
    sent = [[*seen[0]] for seen in fast if isinstance(seen, tuple)]
    assert sent == [cached[:4], cached[4:8], cached[8:]]
    # the loop's pages, one a response: the same names, in the same order
    assert [name for names in sent for name in names] == \
        [name for seen in slow if isinstance(seen, tuple) for name in seen[0]]
    # after each: what waits begins with the first name that did not fit
    assert [seen for seen in fast if isinstance(seen, list) and len(seen) == 1] == \
        [[names[12:15]], [names[24:27]], [None]]
    # the state after (but the nonces: the loop sent more responses)
    after, loop_after = fast[-1], slow[-1]
    assert isinstance(after, list) and isinstance(loop_after, list)
    assert after[1:] == loop_after[1:]
    assert (after[0].versions, after[0].resources) == \
        (loop_after[0].versions, loop_after[0].resources)


def test_pages_taken_together_look_at_no_more_names_than_the_bound() -> None:
    # (names looked at, not sent: a cold client of 100,000 names, few cached,
    # would else have them all looked at for one response)
    names = [f"n{i:02}" for i in range(30)]
    steps: list[tuple[Any, ...]] = [
        ("subscribe", names, []),
        ("upsert", [(name, "encoded", "1", False, False) for name in names[::10]])]
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(subscription, "MAX_NAMES_PER_RESPONSE", 5)
        patched.setattr(subscription, "MAX_NAMES_PER_WHOLE_PAGE", 15)
        seen = drive("delta", steps, [], None, fast=True, backlogs=True)
    assert [sent[0] for sent in seen if isinstance(sent, tuple)] == [["n00", "n10"], ["n20"]]
    backlogs = [sent for sent in seen if isinstance(sent, list) and len(sent) == 1]
    # ("a", subscribed first, and n00-n13: 15 names looked at)
    assert backlogs[0] == [names[14:17]] and backlogs[-1] == [None]
