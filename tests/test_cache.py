"""ResourceCache: storage, lookup states and change notification."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import ABSENT, UNKNOWN, CacheChange, ResourceCache, Update
from relay.constraints import (
    EMPTY_PARAMS,
    UNCONSTRAINED,
    Constraints,
    Locator,
    compile_constraints,
    params_of,
)
from relay.resource import CachedResource
from relay.xds_types import CLUSTER
from tests.allocations import traced


def env(value: str) -> Constraints:
    return compile_constraints(discovery_pb2.DynamicParameterConstraints(
        constraint={"key": "env", "value": value}))


def res(name: str, version: str, constraints: Constraints = UNCONSTRAINED) -> CachedResource:
    return CachedResource(CLUSTER, name, version,
                          discovery_pb2.Resource(name=name, version=version), constraints)


def recording() -> tuple[ResourceCache, list[CacheChange]]:
    cache = ResourceCache()
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    return cache, changes


def test_unsynced_type_is_unknown() -> None:
    cache, _ = recording()
    assert cache.variants(CLUSTER, "a") is UNKNOWN
    assert not cache.is_synced(CLUSTER)


def test_first_write_syncs_and_notifies_changed_names() -> None:
    cache, changes = recording()
    cache.apply(CLUSTER, Update([res("a", "1")]))
    assert changes == [CacheChange(CLUSTER, frozenset({"a"}), True)]
    found = cache.variants(CLUSTER, "a")
    assert not isinstance(found, type(UNKNOWN)) and found[""].version == "1"


def test_empty_first_write_still_syncs() -> None:
    cache, changes = recording()
    cache.apply(CLUSTER, Update())
    assert cache.is_synced(CLUSTER)
    assert changes == [CacheChange(CLUSTER, frozenset(), True)]


def test_unchanged_resource_is_not_a_change() -> None:
    cache, changes = recording()
    cache.apply(CLUSTER, Update([res("a", "1")]))
    assert cache.apply(CLUSTER, Update([res("a", "1")])) == frozenset()
    assert len(changes) == 1


def test_removed_name_becomes_absent_and_notifies() -> None:
    cache, changes = recording()
    cache.apply(CLUSTER, Update([res("a", "1")]))
    cache.apply(CLUSTER, Update(removed=["a"]))
    assert cache.variants(CLUSTER, "a") is ABSENT
    assert changes[-1] == CacheChange(CLUSTER, frozenset({"a"}))


def test_missing_name_is_unknown_unless_type_is_complete() -> None:
    cache, _ = recording()
    cache.apply(CLUSTER, Update([res("a", "1")]))
    assert cache.variants(CLUSTER, "zz") is UNKNOWN
    cache.apply(CLUSTER, Update(complete=True))
    assert cache.variants(CLUSTER, "zz") is ABSENT


def test_variants_are_separate_entries_and_removed_one_by_one() -> None:
    cache, _ = recording()
    k1, k2 = env("canary").key, env("prod").key
    cache.apply(CLUSTER, Update([res("a", "1", env("canary")), res("a", "1", env("prod"))]))
    found = cache.variants(CLUSTER, "a")
    assert not isinstance(found, type(UNKNOWN)) and sorted(found) == sorted([k1, k2])
    cache.apply(CLUSTER, Update(removed_variants=[("a", k1)]))
    found = cache.variants(CLUSTER, "a")
    assert not isinstance(found, type(UNKNOWN)) and list(found) == [k2]
    cache.apply(CLUSTER, Update(removed_variants=[("a", k2)]))
    assert cache.variants(CLUSTER, "a") is ABSENT


def test_replace_type_removes_what_is_not_listed() -> None:
    cache, _changes = recording()
    cache.replace_type(CLUSTER, [res("a", "1"), res("b", "1")])
    changed = cache.replace_type(CLUSTER, [res("b", "2")])
    assert changed == frozenset({"a", "b"})
    assert cache.variants(CLUSTER, "a") is ABSENT


def test_forget_drops_without_notifying() -> None:
    cache, changes = recording()
    cache.apply(CLUSTER, Update([res("a", "1"), res("b", "1")]))
    cache.forget(CLUSTER, ["a"])
    assert cache.variants(CLUSTER, "a") is UNKNOWN
    cache.end_wildcard(CLUSTER, {"b"})
    assert list(cache.names(CLUSTER)) == ["b"]
    assert len(changes) == 1


def test_settled_locators_are_per_parameters_and_notify_once() -> None:
    cache, changes = recording()
    cache.apply(CLUSTER, Update([res("a", "1", env("canary"))]))
    prod = params_of({"env": "prod"})
    assert not cache.is_answered(CLUSTER, Locator("a", prod))
    cache.apply(CLUSTER, Update(answered=[Locator("a", prod)]))
    assert cache.is_answered(CLUSTER, Locator("a", prod))
    assert not cache.is_answered(CLUSTER, Locator("a", params_of({"env": "dev"})))
    assert changes[-1] == CacheChange(CLUSTER, frozenset({"a"}))
    count = len(changes)
    cache.apply(CLUSTER, Update(answered=[Locator("a", prod)]))
    assert len(changes) == count
    cache.forget(CLUSTER, ["a"])
    assert not cache.is_answered(CLUSTER, Locator("a", prod))


def test_forget_variants_keeps_only_the_listed_ones() -> None:
    cache, _ = recording()
    cache.apply(CLUSTER, Update([res("a", "1", env("canary")), res("a", "1", env("prod"))]))
    prod = params_of({"env": "prod"})
    cache.apply(CLUSTER, Update(answered=[Locator("a", prod)]))
    cache.forget_variants(CLUSTER, "a", [env("canary").key], [prod])
    found = cache.variants(CLUSTER, "a")
    assert not isinstance(found, type(UNKNOWN)) and list(found) == [env("canary").key]
    assert not cache.is_answered(CLUSTER, Locator("a", prod))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def with_ttl(name: str, version: str, seconds: int) -> CachedResource:
    resource = discovery_pb2.Resource(name=name, version=version)
    resource.ttl.seconds = seconds
    return CachedResource(CLUSTER, name, version, resource)


def test_invariant_22_ttl_lapses_without_heartbeat_and_heartbeat_restarts_it() -> None:
    clock = FakeClock()
    cache = ResourceCache(clock)
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    cache.apply(CLUSTER, Update([with_ttl("a", "1", 10), res("b", "1")]))
    assert cache.next_expiry() == 110.0
    clock.now = 108.0
    assert cache.apply(CLUSTER, Update(heartbeats=[("a", "", "1")])) == frozenset()
    assert changes[-1] == CacheChange(CLUSTER, frozenset(), heartbeats=frozenset({"a"}))
    assert cache.next_expiry() == 118.0
    clock.now = 117.0
    cache.expire()
    assert not isinstance(cache.variants(CLUSTER, "a"), type(UNKNOWN))
    clock.now = 118.0
    cache.expire()
    assert cache.variants(CLUSTER, "a") is ABSENT
    assert changes[-1] == CacheChange(CLUSTER, frozenset({"a"}))
    assert cache.next_expiry() is None
    assert cache.variants(CLUSTER, "b") is not ABSENT  # no TTL, never lapses


def test_heartbeat_for_another_version_changes_nothing() -> None:
    clock = FakeClock()
    cache = ResourceCache(clock)
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    cache.apply(CLUSTER, Update([with_ttl("a", "1", 10)]))
    assert cache.apply(CLUSTER, Update(heartbeats=[("a", "", "2"), ("zz", "", "1")])) == \
        frozenset()
    assert len(changes) == 1  # the first write only: no heartbeat was heard
    assert cache.next_expiry() == 110.0


def resource_error(name: str, env_value: str | None = None) -> discovery_pb2.ResourceError:
    error = discovery_pb2.ResourceError(error_detail={"code": 5, "message": f"{env_value}"})
    error.resource_name.name = name
    if env_value is not None:
        error.resource_name.dynamic_parameter_constraints.constraint.key = "env"
        error.resource_name.dynamic_parameter_constraints.constraint.value = env_value
    return error


def test_resource_errors_are_per_variant_and_cleared_by_that_variant() -> None:
    cache = ResourceCache()
    canary, whole = resource_error("a", "canary"), resource_error("b")
    cache.apply(CLUSTER, Update(errors=[canary, whole]))
    canary_params, prod_params = params_of({"env": "canary"}), params_of({"env": "prod"})
    assert cache.error(CLUSTER, "a", canary_params) == canary
    assert cache.error(CLUSTER, "a", prod_params) is None
    # An error about the name as a whole is everyone's.
    assert cache.error(CLUSTER, "b", prod_params) == whole
    # The prod variant arriving leaves the canary error; the canary one clears it.
    cache.apply(CLUSTER, Update([res("a", "1", env("prod"))]))
    assert cache.error(CLUSTER, "a", canary_params) == canary
    cache.apply(CLUSTER, Update([res("a", "1", env("canary"))]))
    assert cache.error(CLUSTER, "a", canary_params) is None
    cache.apply(CLUSTER, Update([res("b", "1", env("prod"))]))
    assert cache.error(CLUSTER, "b", prod_params) is None


def with_body(name: str, version: str, body: bytes) -> CachedResource:
    resource = discovery_pb2.Resource(name=name, version=version)
    resource.resource.type_url = CLUSTER
    resource.resource.value = body
    return CachedResource(CLUSTER, name, version, resource)


def test_an_identical_resend_is_no_change() -> None:
    cache, changes = recording()
    cache.apply(CLUSTER, Update([with_body("a", "1", b"\x08\x01")]))
    kept = cache.variants(CLUSTER, "a")
    assert cache.apply(CLUSTER, Update([with_body("a", "1", b"\x08\x01")])) == frozenset()
    assert len(changes) == 1
    assert cache.variants(CLUSTER, "a") == kept  # the first copy stays, with its bytes


def test_new_content_under_the_same_version_is_a_change() -> None:
    cache, changes = recording()
    cache.apply(CLUSTER, Update([with_body("a", "1", b"\x08\x01")]))
    assert cache.apply(CLUSTER, Update([with_body("a", "1", b"\x08\x02")])) == frozenset({"a"})
    assert changes[-1] == CacheChange(CLUSTER, frozenset({"a"}))


def test_a_new_version_of_the_same_content_is_a_change() -> None:
    cache, _ = recording()
    cache.apply(CLUSTER, Update([with_body("a", "1", b"\x08\x01")]))
    assert cache.apply(CLUSTER, Update([with_body("a", "2", b"\x08\x01")])) == frozenset({"a"})


def test_derived_versions_follow_the_content_and_heartbeats_the_origins_version() -> None:
    def origin_copy(body: bytes) -> CachedResource:
        resource = discovery_pb2.Resource(name="a")
        resource.resource.type_url = CLUSTER
        resource.resource.value = body
        resource.ttl.seconds = 10
        return CachedResource.from_origin(CLUSTER, "a", resource)

    first, again, other = origin_copy(b"\x08\x01"), origin_copy(b"\x08\x01"), \
        origin_copy(b"\x08\x02")
    assert first.derived_version and first.origin_version == ""
    assert first.version == again.version != other.version
    assert first.digest == again.digest != other.digest
    assert first.resource.version == first.version  # what delta clients are sent
    clock = FakeClock()
    cache = ResourceCache(clock)
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    cache.apply(CLUSTER, Update([first]))
    # The origin's heartbeat carries its own (empty) version, not the derived one.
    cache.apply(CLUSTER, Update(heartbeats=[("a", "", "")]))
    assert changes[-1] == CacheChange(CLUSTER, frozenset(), heartbeats=frozenset({"a"}))
    cache.apply(CLUSTER, Update(heartbeats=[("a", "", first.version)]))
    assert len(changes) == 2


def test_an_identical_resend_of_a_resource_with_a_ttl_is_a_heartbeat() -> None:
    clock = FakeClock()
    cache = ResourceCache(clock)
    changes: list[CacheChange] = []
    cache.add_listener(changes.append)
    cache.apply(CLUSTER, Update([with_ttl("a", "1", 10)]))
    clock.now = 105.0
    assert cache.apply(CLUSTER, Update([with_ttl("a", "1", 10)])) == frozenset()
    assert changes[-1] == CacheChange(CLUSTER, frozenset(), heartbeats=frozenset({"a"}))
    assert cache.next_expiry() == 115.0  # the TTL restarted


def test_forgetting_a_name_drops_everything_known_of_it() -> None:
    clock = FakeClock()
    cache = ResourceCache(clock)
    aliased = with_ttl("a", "1", 10)
    aliased.resource.aliases.append("alias-of-a")
    canary = params_of({"env": "canary"})
    cache.apply(CLUSTER, Update([aliased], errors=[resource_error("a", "prod")],
                                answered=[Locator("a", canary)]))
    assert cache.aliases_of(CLUSTER, "a") == {"alias-of-a"}
    assert cache.next_expiry() == 110.0
    cache.forget(CLUSTER, ["a"])
    assert cache.variants(CLUSTER, "a") is UNKNOWN
    assert cache.variants(CLUSTER, "alias-of-a") is UNKNOWN
    assert cache.error(CLUSTER, "a", params_of({"env": "prod"})) is None
    assert not cache.is_answered(CLUSTER, Locator("a", canary))
    assert cache.aliases_of(CLUSTER, "a") == set()
    assert cache.next_expiry() is None  # its TTL went with it
    # Subscribed again later, the name starts from nothing: no stale error.
    cache.apply(CLUSTER, Update([res("a", "2")]))
    assert cache.error(CLUSTER, "a", params_of({"env": "prod"})) is None


def test_the_end_of_a_wildcard_forgets_every_field_of_the_names_not_kept() -> None:
    cache = ResourceCache()
    cache.apply(CLUSTER, Update([res("a", "1"), with_ttl("b", "1", 10)],
                                errors=[resource_error("b")], complete=True))
    cache.end_wildcard(CLUSTER, {"a"})
    assert not cache.is_complete(CLUSTER)
    assert cache.names(CLUSTER) == ["a"]
    assert cache.error(CLUSTER, "b", params_of({})) is None
    assert cache.next_expiry() is None


def test_a_name_that_does_not_exist_costs_the_cache_no_record_of_its_own() -> None:
    names = [f"made-up-{i}" for i in range(10_000)]
    cache = ResourceCache()
    cache.apply(CLUSTER, Update())
    with traced() as held:
        cache.apply(CLUSTER, Update(removed=names, answered=[Locator(n, EMPTY_PARAMS)
                                                              for n in names]))
        per_name = held() / len(names)
    # A slot in the type's table; a record of its own took 526 bytes (790 before).
    assert per_name < 100, per_name
    assert cache.variants(CLUSTER, "made-up-7") is ABSENT
    assert cache.is_answered(CLUSTER, Locator("made-up-7", EMPTY_PARAMS))


def test_writing_to_a_name_that_does_not_exist_leaves_the_others_as_they_were() -> None:
    cache, changes = recording()
    canary = params_of({"env": "canary"})
    cache.apply(CLUSTER, Update(removed=["a", "b", "c", "d"],
                                answered=[Locator(n, EMPTY_PARAMS) for n in "abcd"]))
    cache.apply(CLUSTER, Update([res("a", "1")], errors=[resource_error("b")],
                                answered=[Locator("c", canary)]))
    cache.forget_variants(CLUSTER, "d", keep=[], unanswer=[EMPTY_PARAMS])
    assert changes[-1] == CacheChange(CLUSTER, frozenset({"a", "b", "c"}))
    found = cache.variants(CLUSTER, "a")
    assert not isinstance(found, type(ABSENT)) and found[""].version == "1"
    assert cache.error(CLUSTER, "b", EMPTY_PARAMS) is not None
    assert cache.variants(CLUSTER, "b") is ABSENT and cache.variants(CLUSTER, "c") is ABSENT
    assert cache.is_answered(CLUSTER, Locator("c", canary))
    assert not cache.is_answered(CLUSTER, Locator("d", EMPTY_PARAMS))
    assert cache.variants(CLUSTER, "d") is ABSENT  # what the origin said stays
    # None of that reached the names written alongside.
    assert cache.error(CLUSTER, "c", EMPTY_PARAMS) is None
    assert not cache.is_answered(CLUSTER, Locator("b", canary))
    assert cache.is_answered(CLUSTER, Locator("b", EMPTY_PARAMS))
    cache.apply(CLUSTER, Update(removed=["a"]))
    assert cache.variants(CLUSTER, "a") is ABSENT


def test_forgetting_tells_how_many_names_went_and_gives_the_table_back() -> None:
    names = [f"made-up-{i}" for i in range(20_000)]
    cache = ResourceCache()
    forgotten: list[int] = []
    cache.add_forget_listener(lambda forgot: forgotten.append(forgot.dropped))
    cache.apply(CLUSTER, Update())
    with traced() as held:
        cache.apply(CLUSTER, Update(removed=names))
        full = held()
        cache.forget(CLUSTER, names[10:])
        cache.forget(CLUSTER, ["never-known"])
        left = held()
    assert forgotten == [len(names) - 10]
    # Dicts do not shrink as entries go: the table is copied once most are gone.
    assert left < full / 20, (left, full)
    assert cache.variants(CLUSTER, names[0]) is ABSENT
