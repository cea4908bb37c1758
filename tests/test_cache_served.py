"""ResourceCache.served_to_all: a page of names looked up in the type's table
of plain names (one variant, unconstrained) by C code. It gives what the
per-name rule over the records gives, in the same order, after any sequence
of writes (a property test), and takes no Python-level step per name
(counted with a trace function: lines and calls, not time)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.cache import ResourceCache, Update
from relay.constraints import UNCONSTRAINED, Constraints, compile_constraints
from relay.encoding import length_delimited_field
from relay.resource import CachedResource
from relay.xds_types import CLUSTER
from tests.test_cache import FakeClock, env, resource_error
from tests.variants import DPC

COLLECTION = "xdstp://auth/envoy.config.cluster.v3.Cluster/pool"
NAMES = ["a", "b", "c", "al", "bl", f"{COLLECTION}/m1", f"{COLLECTION}/m2"]
GLOB = f"{COLLECTION}/*"
# how a resource is made: from its encoding (the bulk path's plain one), or
# parsed, unconstrained, with constraints, or with constraints whose key is
# not UNCONSTRAINED's
KINDS = ["encoded", "parsed", "canary", "prod", "empty_and"]
KEYS = ["", env("canary").key, env("prod").key, "and()"]


def by_the_records(cache: ResourceCache, names: Iterable[str]) -> dict[str, CachedResource]:
    """The per-name rule served_to_all kept before its table: each name whose
    own record holds one variant, unconstrained, with it."""
    entry = cache._types.get(CLUSTER)
    if entry is None or not entry.synced:
        return {}
    served = {}
    for name in names:
        record = entry.records.get(name)
        variants = entry.variants_of(name, record) if record is not None else {}
        if len(variants) == 1 and (only := variants.get("")) is not None and \
                only.constraints is UNCONSTRAINED:
            served[name] = only
    return served


def made(name: str, kind: str, version: str, aliases: list[str], ttl: bool) -> CachedResource:
    resource = discovery_pb2.Resource(
        name=name, version=version, aliases=aliases,
        resource=any_pb2.Any(type_url=CLUSTER, value=version.encode()))
    if ttl:
        resource.ttl.seconds = 5
    if kind == "encoded" and not aliases and not ttl:
        return CachedResource.from_encoded(CLUSTER, name, version, length_delimited_field(
            2, resource.SerializeToString()), received=1.0)
    constraints: Constraints = {
        "canary": env("canary"), "prod": env("prod"),
        "empty_and": compile_constraints(DPC(and_constraints=DPC.ConstraintList())),
    }.get(kind, UNCONSTRAINED)
    return CachedResource(CLUSTER, name, version, resource, constraints)


NAME = st.sampled_from(NAMES)
SOME = st.lists(st.sampled_from([*NAMES, GLOB]), max_size=4)
RESOURCE = st.tuples(NAME, st.sampled_from(KINDS), st.sampled_from(["1", "2"]),
                     st.lists(st.sampled_from(["al", "bl"]), max_size=1, unique=True),
                     st.booleans())
STEP = st.one_of(
    st.tuples(st.just("upsert"), st.lists(RESOURCE, max_size=5)),
    st.tuples(st.just("remove"), SOME),
    st.tuples(st.just("remove_variant"), NAME, st.sampled_from(KEYS)),
    st.tuples(st.just("error"), NAME, st.sampled_from([None, "canary"])),
    st.tuples(st.just("answer"), SOME),
    st.tuples(st.just("forget"), SOME, SOME),
    st.tuples(st.just("forget_variants"), NAME, st.lists(st.sampled_from(KEYS), max_size=2)),
    st.tuples(st.just("replace_type"), st.lists(RESOURCE, max_size=4)),
    st.tuples(st.just("end_wildcard"), SOME),
    st.tuples(st.just("expire"), st.just(None)),
    st.tuples(st.just("members"), st.just(None)),
)


def step(cache: ResourceCache, clock: FakeClock, what: str, *args: Any) -> None:
    """One write (or the collection index built, which the writes then keep)."""
    if what in ("upsert", "replace_type"):
        resources = [made(*spec) for spec in args[0]]
        if what == "upsert":
            cache.apply(CLUSTER, Update(resources))
        else:
            cache.replace_type(CLUSTER, resources)
    elif what == "remove":
        cache.apply(CLUSTER, Update(removed=args[0]))
    elif what == "remove_variant":
        cache.apply(CLUSTER, Update(removed_variants=[args]))
    elif what == "error":
        cache.apply(CLUSTER, Update(errors=[resource_error(*args)]))
    elif what == "answer":
        cache.apply(CLUSTER, Update(answered=args[0]))
    elif what == "forget":
        cache.forget(CLUSTER, args[0], set(args[1]))
    elif what == "forget_variants":
        cache.forget_variants(CLUSTER, args[0], args[1], ())
    elif what == "end_wildcard":
        cache.end_wildcard(CLUSTER, set(args[0]))
    elif what == "expire":
        clock.now += 10
        cache.expire()
    else:
        cache.members(CLUSTER, GLOB)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(STEP, max_size=12),
       pages=st.lists(st.lists(st.sampled_from([*NAMES, "unknown", GLOB])), max_size=3))
def test_served_to_all_gives_what_the_records_give_after_any_writes(
        steps: list[tuple[Any, ...]], pages: list[list[str]]) -> None:
    clock = FakeClock()
    cache = ResourceCache(clock=clock)
    assert cache.served_to_all(CLUSTER, NAMES) == {}
    for what, *args in steps:
        step(cache, clock, what, *args)
        for page in [NAMES, NAMES[::-1], *pages]:  # (pages with a name twice, too)
            expected = list(by_the_records(cache, page).items())
            # (the same resources, the same order: CachedResource compares by identity)
            assert list(cache.served_to_all(CLUSTER, page).items()) == expected
            assert list(cache.served_to_all(CLUSTER, iter(page)).items()) == expected


def steps_of(call: Callable[[], object]) -> int:
    """How many Python-level steps (calls, lines, returns) ``call`` takes.

    The collector is run first and kept off meanwhile: a collection that
    fell inside ``call`` would run finalizers of other tests' garbage
    (``__del__``, weakref callbacks), and their steps would be counted as
    the call's (CI saw 28 steps for a page that takes 15)."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        count += 1
        return tracer

    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(previous)
        if collecting:
            gc.enable()
    return count


def test_a_page_costs_no_python_level_step_per_name() -> None:
    cache = ResourceCache()
    served = [f"big-{i}" for i in range(1_000)]
    cache.apply(CLUSTER, Update(
        [made(name, "encoded" if i % 2 else "parsed", "1", [], False)
         for i, name in enumerate(served)] +
        [made(f"canary-{i}", "canary", "1", [], False) for i in range(500)],
        removed=[f"gone-{i}" for i in range(500)]))
    # (names given as new strings, as a client's request gives them)
    whole = [name[:3] + name[3:] for name in served]
    mixed = [name for i in range(500) for name in (whole[i], f"canary-{i}", f"gone-{i}")]

    def steps(page: list[str], found: int) -> int:
        result: dict[str, CachedResource] = {}
        counted = steps_of(lambda: result.update(cache.served_to_all(CLUSTER, page)))
        assert len(result) == found
        return counted

    assert steps(whole[:10], 10) == steps(whole, 1_000)
    assert steps(mixed[:30], 10) == steps(mixed, 500)
