"""ResourceCache's plain records: a name that holds one plain resource and
nothing more has no record of its own (a shared one, the resource in the
type's ``plain`` only), and a cold client's names, new and plain, are
written and answered in bulk by C code.

Held to the general path (every name a record of its own, written name by
name) on random sequences of writes: every read gives the same after each
step. Counted: the bulk write takes as many Python-level steps for 3,000
names as for 30, and makes no record."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from relay import cache as cache_module
from relay.cache import CacheChange, Forgotten, ResourceCache, Update
from relay.constraints import EMPTY_PARAMS, Locator, params_of
from relay.protocol.view import CacheView
from relay.resource import CachedResource
from relay.xds_types import CLUSTER
from tests.test_cache import FakeClock, env, resource_error
from tests.test_cache_served import GLOB, KEYS, NAMES, RESOURCE, made, steps_of

PARAMS = [EMPTY_PARAMS, params_of({"env": "canary"}), params_of({"env": "prod"})]
EVERY = [*NAMES, GLOB, "unknown"]


class RecordsCache(ResourceCache):
    """The general path: each upsert written by ``_upsert``, so every name
    has a record of its own and no bulk write is taken."""

    def _upserts(self, type_url: str, entry: Any, update: Update, now: float,
                 changed: set[str], beats: set[str]) -> set[str]:
        for resource in update.upserts:
            self._upsert(type_url, entry, resource, now, changed, beats, update.deadlines)
        return set()


def observed(cache: ResourceCache, clock: FakeClock) -> dict[str, Any]:
    """Everything a reader can ask of the cache (resources compare by identity)."""
    view = CacheView(cache)
    return {
        "variants": [cache.variants(CLUSTER, name) for name in EVERY],
        "lookups": [view.lookup(CLUSTER, name, params) for name in EVERY for params in PARAMS],
        "answered": [cache.is_answered(CLUSTER, Locator(name, params))
                     for name in EVERY for params in PARAMS],
        "errors": [cache.error(CLUSTER, name, params) for name in EVERY for params in PARAMS],
        "aliases": [cache.aliases_of(CLUSTER, name) for name in EVERY],
        "expiry": [cache.expiry(CLUSTER, name, key) for name in EVERY for key in KEYS],
        "served": list(cache.served_to_all(CLUSTER, EVERY).items()),
        "served one": [cache.served_one(CLUSTER, name) for name in EVERY],
        "unknown": [cache.unknown_to_all(CLUSTER, page) for page in (EVERY, NAMES[:3])],
        "names": cache.names(CLUSTER),
        "resources": cache.resources(CLUSTER),
        "counts": cache.counts(),
        "members": sorted(cache.members(CLUSTER, GLOB)),
        "state": (cache.is_synced(CLUSTER), cache.is_complete(CLUSTER),
                  cache.has_errors(CLUSTER), cache.next_expiry(), clock.now),
    }


LOCATOR = st.one_of(st.sampled_from([*NAMES, GLOB]),
                    st.builds(Locator, st.sampled_from([*NAMES, GLOB]), st.sampled_from(PARAMS)))
WRITE = st.one_of(
    # a response: upserts (mostly plain: the bulk path), answered in the same write or not
    st.tuples(st.just("respond"), st.lists(RESOURCE, max_size=5), st.lists(LOCATOR, max_size=5),
              st.booleans(), st.sampled_from([None, True, False])),
    st.tuples(st.just("respond_plain"), st.lists(st.sampled_from([*NAMES, GLOB]), max_size=5),
              st.sampled_from(["1", "2"]), st.booleans()),
    # istiod's resend: the copies held, some names with a new plain one
    st.tuples(st.just("resend_held"), st.lists(st.sampled_from([*NAMES, GLOB]), max_size=5),
              st.lists(st.sampled_from([*NAMES, GLOB]), max_size=2)),
    st.tuples(st.just("remove"), st.lists(st.sampled_from([*NAMES, GLOB]), max_size=3)),
    st.tuples(st.just("remove_variant"), st.sampled_from(NAMES), st.sampled_from(KEYS)),
    st.tuples(st.just("error"), st.sampled_from(NAMES), st.sampled_from([None, "canary"])),
    st.tuples(st.just("heartbeat"), st.sampled_from(NAMES), st.sampled_from(KEYS),
              st.sampled_from(["1", "2"])),
    st.tuples(st.just("answer"), st.lists(LOCATOR, max_size=5)),
    st.tuples(st.just("forget"), st.lists(st.sampled_from([*NAMES, GLOB]), max_size=3),
              st.lists(st.sampled_from(NAMES), max_size=2)),
    st.tuples(st.just("forget_variants"), st.sampled_from(NAMES),
              st.lists(st.sampled_from(KEYS), max_size=2), st.lists(st.sampled_from(PARAMS))),
    st.tuples(st.just("replace_type"), st.lists(RESOURCE, max_size=4)),
    st.tuples(st.just("end_wildcard"), st.lists(st.sampled_from([*NAMES, GLOB]), max_size=3)),
    st.tuples(st.just("expire"), st.just(None)),
    st.tuples(st.just("members"), st.just(None)),
)


def write(caches: list[ResourceCache], clock: FakeClock, what: str, *args: Any) -> list[Any]:
    """One write to each cache, the same resources to each: what each returns."""
    if what == "respond":
        specs, answered, plain_answer, complete = args
        upserts = [made(*spec) for spec in specs]
        answers = list(answered) + ([spec[0] for spec in specs] if plain_answer else [])
        return [c.apply(CLUSTER, Update(upserts, answered=answers, complete=complete))
                for c in caches]
    if what == "respond_plain":  # (a cold client's: each new plain name answered with it)
        names, version, answer = args
        upserts = [made(name, "encoded", version, [], False) for name in names]
        return [c.apply(CLUSTER, Update(upserts, answered=names if answer else ()))
                for c in caches]
    if what == "resend_held":  # (the copies the first cache holds: each cache holds the same)
        names, changed = args
        held = [caches[0].served_one(CLUSTER, name) for name in names]
        upserts = [made(name, "encoded", "3", [], False) if name in changed or found is None
                   else found for name, found in zip(names, held, strict=True)]
        return [c.apply(CLUSTER, Update(upserts)) for c in caches]
    if what == "replace_type":
        resources = [made(*spec) for spec in args[0]]
        return [c.replace_type(CLUSTER, resources) for c in caches]
    if what == "expire":
        clock.now += 10
    results = []
    for cache in caches:
        if what == "remove":
            results.append(cache.apply(CLUSTER, Update(removed=args[0])))
        elif what == "remove_variant":
            results.append(cache.apply(CLUSTER, Update(removed_variants=[args])))
        elif what == "error":
            results.append(cache.apply(CLUSTER, Update(errors=[resource_error(*args)])))
        elif what == "heartbeat":
            results.append(cache.apply(CLUSTER, Update(heartbeats=[args])))
        elif what == "answer":
            results.append(cache.apply(CLUSTER, Update(answered=iter(args[0]))))
        elif what == "forget":
            results.append(cache.forget(CLUSTER, args[0], set(args[1])))
        elif what == "forget_variants":
            results.append(cache.forget_variants(CLUSTER, *args))
        elif what == "end_wildcard":
            results.append(cache.end_wildcard(CLUSTER, set(args[0])))
        elif what == "expire":
            results.append(cache.expire())
        else:
            results.append(cache.members(CLUSTER, GLOB))
    return results


@settings(max_examples=600, deadline=None)
@given(writes=st.lists(WRITE, max_size=12))
# (rare draws, kept: a glob's answer, a heartbeat of a plain resource)
@example(writes=[("respond_plain", ["a", GLOB], "1", True)])
@example(writes=[("respond_plain", ["a", "b"], "1", False), ("heartbeat", "b", "", "1")])
# (a copy held, resent to a name in error: the error goes, as with any upsert)
@example(writes=[("respond_plain", ["a", "b"], "1", True), ("error", "a", None),
                 ("resend_held", ["b", "a"], [])])
def test_plain_records_and_bulk_writes_read_as_the_general_path(
        writes: list[tuple[Any, ...]]) -> None:
    clock = FakeClock()
    fast, general = ResourceCache(clock), RecordsCache(clock)
    told: tuple[list[CacheChange], list[CacheChange]] = ([], [])
    forgot: tuple[list[Forgotten], list[Forgotten]] = ([], [])
    for cache, changes, dropped in zip((fast, general), told, forgot, strict=True):
        cache.add_listener(changes.append)
        cache.add_forget_listener(dropped.append)
    assert observed(fast, clock) == observed(general, clock)
    for what, *args in writes:
        got, expected = write([fast, general], clock, what, *args)
        assert got == expected, what
        assert told[0] == told[1] and forgot[0] == forgot[1], what
        assert observed(fast, clock) == observed(general, clock), what
        assert [fast.served_one(CLUSTER, name) for name in EVERY] == \
            [fast.served_to_all(CLUSTER, [name]).get(name) for name in EVERY]


def cold(count: int, answered_later: bool = False) -> tuple[ResourceCache, Update, Update]:
    """A cache that holds a few names of the type, and a response of
    ``count`` new plain names, answered by it (or by a later write)."""
    cache = ResourceCache()
    cache.apply(CLUSTER, Update([made("warm", "encoded", "1", [], False),
                                 made("canary", "canary", "1", [], False)],
                                answered=["warm", Locator("canary", PARAMS[1])]))
    names = [f"big-{i}" for i in range(count)]
    upserts = [made(name, "encoded", "1", [], False) for name in names]
    if answered_later:
        return cache, Update(upserts), Update(answered=names)
    return cache, Update(upserts, answered=names), Update()


def test_a_cold_response_is_written_with_no_step_or_record_per_name() -> None:
    small, big = cold(30), cold(3_000)
    changes: list[frozenset[str]] = []
    assert steps_of(lambda: changes.append(small[0].apply(CLUSTER, small[1]))) == \
        steps_of(lambda: changes.append(big[0].apply(CLUSTER, big[1])))
    assert [len(names) for names in changes] == [30, 3_000]
    records = big[0]._types[CLUSTER].records
    # one shared record for all of them, answered as plain names
    assert {id(records[f"big-{i}"]) for i in range(3_000)} == {id(cache_module._PLAIN_ANSWERED)}
    assert big[0].is_answered(CLUSTER, Locator("big-7", EMPTY_PARAMS))
    assert big[0].variants(CLUSTER, "big-7") == {"": big[1].upserts[7]}


def test_names_answered_by_a_later_write_are_answered_with_no_step_per_name() -> None:
    small, big = cold(30, answered_later=True), cold(3_000, answered_later=True)
    for cache, upserts, _ in (small, big):
        cache.apply(CLUSTER, upserts)
        assert not cache.is_answered(CLUSTER, Locator("big-7", EMPTY_PARAMS))
    changes: list[frozenset[str]] = []
    assert steps_of(lambda: changes.append(small[0].apply(CLUSTER, small[2]))) == \
        steps_of(lambda: changes.append(big[0].apply(CLUSTER, big[2])))
    assert changes == [frozenset(), frozenset()]  # (each served to all before: no news)
    assert big[0].is_answered(CLUSTER, Locator("big-7", EMPTY_PARAMS))


def test_a_plain_name_gets_a_record_of_its_own_when_it_needs_more() -> None:
    cache, update, _ = cold(3)
    cache.apply(CLUSTER, update)
    records = cache._types[CLUSTER].records
    canary = made("big-1", "canary", "1", [], False)
    cache.apply(CLUSTER, Update([canary], errors=[resource_error("big-2", "canary")],
                                answered=[Locator("big-0", PARAMS[2])]))
    shared = {id(cache_module._PLAIN_NEW), id(cache_module._PLAIN_ANSWERED)}
    assert [id(records[f"big-{i}"]) in shared for i in range(3)] == [False, False, False]
    assert cache.variants(CLUSTER, "big-1") == {"": update.upserts[1], env("canary").key: canary}
    assert cache.is_answered(CLUSTER, Locator("big-0", PARAMS[2]))
    assert cache.error(CLUSTER, "big-2", PARAMS[1]) is not None
    assert cache.variants(CLUSTER, "big-2") == {"": update.upserts[2]}


def resend(cache: ResourceCache, resources: list[CachedResource]) -> frozenset[str]:
    return cache.apply(CLUSTER, Update(resources))


def test_a_plain_resend_keeps_the_shared_record() -> None:
    cache, update, _ = cold(2)
    cache.apply(CLUSTER, update)
    again = [made("big-0", "encoded", "1", [], False), made("big-1", "encoded", "2", [], False)]
    assert resend(cache, again) == {"big-1"}  # (big-0 the same content: no news)
    records = cache._types[CLUSTER].records
    assert records["big-0"] is records["big-1"] is cache_module._PLAIN_ANSWERED
    assert cache.variants(CLUSTER, "big-1") == {"": again[1]}
    assert cache.variants(CLUSTER, "big-0") == {"": update.upserts[0]}
