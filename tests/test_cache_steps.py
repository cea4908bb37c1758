"""ResourceCache.apply_steps: a big write of plain upserts (istiod's resend)
looked at a slice at a time, then written in one step.

Held to :meth:`ResourceCache.apply` on random writes: what each returns,
tells and holds after is the same; between two of its steps a reader sees
the cache as it was before the write; a write that comes in between makes
it apply the update in one go, after that write; the copies it replaces
are let go only after it has written."""

from __future__ import annotations

import weakref

from hypothesis import example, given, settings
from hypothesis import strategies as st

from relay.cache import CacheChange, ResourceCache, Update
from relay.resource import CachedResource
from relay.xds_types import CLUSTER
from tests.stepping import made_in_steps
from tests.test_cache import FakeClock, resource_error
from tests.test_cache_plain import observed
from tests.test_cache_served import made

NAMES = [f"n{i}" for i in range(12)]
STEP = 3


def twins() -> tuple[tuple[ResourceCache, ResourceCache], FakeClock,
                     tuple[list[CacheChange], list[CacheChange]]]:
    clock = FakeClock()
    caches = (ResourceCache(clock), ResourceCache(clock))
    told: tuple[list[CacheChange], list[CacheChange]] = ([], [])
    for cache, changes in zip(caches, told, strict=True):
        cache.add_listener(changes.append)
    return caches, clock, told


# what the cache holds first: each name absent, plain, changed, constrained or in error
HELD = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(["encoded", "canary"]),
                          st.sampled_from(["1", "2"])), max_size=10)
# the big write: each name resent as held, with new content, new, or twice
RESENT = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(["held", "1", "2", "3"]),
                            st.sampled_from(["encoded", "encoded", "encoded", "parsed"])),
                  min_size=STEP + 1, max_size=12)


def first_writes(caches: tuple[ResourceCache, ...], held: list[tuple[str, str, str]],
                 erred: list[str]) -> None:
    """The same writes to each cache, of the same copies."""
    first = Update([made(name, kind, version, [], False) for name, kind, version in held],
                   answered=[name for name, _, _ in held[:3]])
    errors = Update(errors=[resource_error(name, None) for name in erred])
    for cache in caches:
        cache.apply(CLUSTER, first)
        if erred:
            cache.apply(CLUSTER, errors)


def resend(cache: ResourceCache, resent: list[tuple[str, str, str]]) -> list[CachedResource]:
    upserts = []
    for name, version, kind in resent:
        found = cache.served_one(CLUSTER, name) if version == "held" else None
        upserts.append(found if found is not None
                       else made(name, kind, "1" if version == "held" else version, [], False))
    return upserts


@settings(max_examples=300, deadline=None)
@given(held=HELD, erred=st.lists(st.sampled_from(NAMES), max_size=2), resent=RESENT,
       answered=st.booleans())
@example(held=[(name, "encoded", "1") for name in NAMES], erred=[],
         resent=[(name, "held" if i % 3 else "2", "encoded") for i, name in enumerate(NAMES)],
         answered=True)
def test_a_write_made_in_steps_is_the_write_made_at_once(
        held: list[tuple[str, str, str]], erred: list[str],
        resent: list[tuple[str, str, str]], answered: bool) -> None:
    (stepped, whole), clock, told = twins()
    # (the same copies in both: the first write's, then the resend's)
    first_writes((stepped, whole), held, erred)
    upserts = resend(stepped, resent)
    assert observed(stepped, clock) == observed(whole, clock)
    update = Update(upserts, answered=[u.name for u in upserts] if answered else ())
    before = observed(stepped, clock)
    told_before = len(told[0])

    def unchanged_to_readers() -> None:
        if len(told[0]) == told_before:  # (until it has written: nothing to see)
            assert observed(stepped, clock) == before

    got, _ = made_in_steps(stepped.apply_steps(CLUSTER, update, STEP), unchanged_to_readers)
    assert got == whole.apply(CLUSTER, update)
    assert told[0] == told[1]
    assert observed(stepped, clock) == observed(whole, clock)


def test_istiods_resend_is_looked_at_in_steps_then_written_in_one() -> None:
    (stepped, whole), clock, told = twins()
    first = [made(name, "encoded", "1", [], False) for name in NAMES]
    for cache in (stepped, whole):
        cache.apply(CLUSTER, Update(first))
    upserts = [made(name, "encoded", "2", [], False) if i % 4 == 0 else first[i]
               for i, name in enumerate(NAMES)]
    replaced = [weakref.ref(first[i]) for i in range(0, len(NAMES), 4)]
    del first
    seen: list[tuple[int, int]] = []  # (changes told, copies replaced still held) a pause

    def pause() -> None:
        seen.append((len(told[0]), sum(ref() is not None for ref in replaced)))

    got, pauses = made_in_steps(stepped.apply_steps(CLUSTER, Update(upserts), STEP), pause)
    assert got == whole.apply(CLUSTER, Update(upserts)) == frozenset(NAMES[::4])
    # four slices looked at (a pause after each, the last before the write),
    # written with one change told, then the three copies replaced let go, a
    # slice of them a pause
    assert pauses == len(NAMES) // STEP + 1
    assert seen == [(1, 3), (1, 3), (1, 3), (1, 3), (2, 3)]
    assert [ref() for ref in replaced] == [None, None, None]
    assert told[0] == told[1] and observed(stepped, clock) == observed(whole, clock)


def test_a_write_that_comes_in_between_makes_it_apply_at_once() -> None:
    (stepped, whole), clock, told = twins()
    first = [made(name, "encoded", "1", [], False) for name in NAMES]
    for cache in (stepped, whole):
        cache.apply(CLUSTER, Update(first))
    upserts = [made(name, "encoded", "2", [], False) for name in NAMES]
    # (another write of the type, between two steps: of a name looked at already)
    meanwhile = Update(errors=[resource_error(NAMES[0], None)])
    steps = stepped.apply_steps(CLUSTER, Update(upserts), STEP)
    next(steps)
    stepped.apply(CLUSTER, meanwhile)
    got, _ = made_in_steps(steps)
    whole.apply(CLUSTER, meanwhile)
    assert got == whole.apply(CLUSTER, Update(upserts)) == frozenset(NAMES)
    assert told[0] == told[1] and observed(stepped, clock) == observed(whole, clock)
    assert stepped.error(CLUSTER, NAMES[0], frozenset()) is None  # (cleared by the upsert)


def test_a_small_write_or_one_with_more_than_upserts_is_applied_at_once() -> None:
    cache = ResourceCache()
    few = [made(name, "encoded", "1", [], False) for name in NAMES[:STEP]]
    assert made_in_steps(cache.apply_steps(CLUSTER, Update(few), STEP)) == \
        (frozenset(NAMES[:STEP]), 0)
    more = [made(name, "encoded", "2", [], False) for name in NAMES]
    assert made_in_steps(cache.apply_steps(CLUSTER, Update(more, removed=["x"]), STEP)) == \
        (frozenset([*NAMES, "x"]), 0)
