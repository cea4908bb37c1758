"""A resend of what the relay holds (istiod's, on every new stream) is not
decoded again: the bulk check, handed the cache's copies, decodes only the
entries that are not byte for byte the ones those copies were made from,
and hashes none of those for a derived version; what it makes, and what it
NACKs and why, are what checking every resource gives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay import resource as resource_module
from relay.cache import ResourceCache, Update
from relay.resource import CachedResource
from relay.upstream import bulk
from relay.upstream.responses import Checked, ParsedResponse, Unusable, parse_response
from relay.xds_types import ENDPOINT
from tests.builders import endpoints
from tests.upstream.test_responses_bulk import UNKNOWN, one_by_one, parsed_message, plain, response

N = 2_500  # three slices of bulk.SLICE
# a body that does not decode as a ClusterLoadAssignment (field 1, a string, cut short)
UNDECODABLE = b"\x0a\x05ab"


class Work:
    """Bodies decoded by the bulk check (resources in its ``Checked`` parses)
    and entries hashed (for a derived version or a digest)."""

    def __init__(self, patch: pytest.MonkeyPatch) -> None:
        self.decoded = self.hashed = 0
        shadows, digest = bulk.shadows, resource_module._digest
        work = self

        def counting_shadows(type_url: str) -> Any:
            found = shadows(type_url)

            class Checked:
                @staticmethod
                def FromString(value: bytes) -> Any:
                    checked = found.checked.FromString(value)
                    work.decoded += len(checked.resources)
                    return checked
            return bulk.Shadows({"Entries": found.entries, "Checked": Checked,
                                 "Listed": found.listed})

        def counting_digest(encoded: bytes) -> bytes:
            work.hashed += 1
            return digest(encoded)

        patch.setattr(bulk, "shadows", counting_shadows)
        patch.setattr(resource_module, "_digest", counting_digest)

    def reset(self) -> None:
        self.decoded = self.hashed = 0


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Iterator[Work]:
    yield Work(monkeypatch)


def copy(message: discovery_pb2.DeltaDiscoveryResponse) -> discovery_pb2.DeltaDiscoveryResponse:
    return discovery_pb2.DeltaDiscoveryResponse.FromString(message.SerializeToString())


def cached(message: discovery_pb2.DeltaDiscoveryResponse) -> ResourceCache:
    """A cache that took ``message`` (checked with no cache)."""
    parsed = parse_response(copy(message))
    assert isinstance(parsed, ParsedResponse)
    cache = ResourceCache()
    cache.apply(parsed.type_url, Update(parsed.upserts))
    return cache


def seen(made: CachedResource) -> tuple[Any, ...]:
    """What a reader of a resource made from an origin's can see of it."""
    return (made.type_url, made.name, made.version, made.derived_version, made.delta_entry,
            made.digest, made.plain, made.constraints, made.variant_key)


def assert_same_result(ours: Checked, general: Checked, cache: ResourceCache | None = None
                       ) -> None:
    """``ours`` (checked knowing ``cache``) is what the general check gives."""
    assert type(ours) is type(general)
    if isinstance(ours, Unusable):
        assert ours == general
        return
    assert isinstance(general, ParsedResponse)
    assert (ours.type_url, ours.nonce, ours.removed, ours.removed_variants, ours.heartbeats,
            ours.errors, ours.plain) == \
        (general.type_url, general.nonce, general.removed, general.removed_variants,
         general.heartbeats, general.errors, general.plain)
    assert [seen(r) for r in ours.upserts] == [seen(r) for r in general.upserts]
    # those made now stamped in order of arrival, one after another (a copy
    # the cache holds, resent, is that copy: stamped when it first came)
    arrivals = [r.arrival for r in ours.upserts
                if cache is None or cache.served_one(r.type_url, r.name) is not r]
    assert arrivals == list(range(arrivals[0], arrivals[0] + len(arrivals))) if arrivals else True


@pytest.mark.parametrize("version", ["", "v1"], ids=["derived", "origin"])
def test_a_resend_of_unchanged_resources_decodes_and_hashes_none(
        work: Work, version: str) -> None:
    message = response([plain(i, version) for i in range(N)])
    cache = cached(message)
    held = {name: cache.served_one(ENDPOINT, name) for name in cache.names(ENDPOINT)}
    assert work.decoded == N  # (taking it the first time: every body decoded)
    for _ in range(2):  # (twice: the second as the first)
        work.reset()
        resent = parse_response(copy(message), known=cache.served_to_all)
        # none decoded, none hashed: each is the copy the cache holds ...
        assert (work.decoded, work.hashed) == (0, 0)
        assert_same_result(resent, parse_response(copy(message)), cache)
        assert isinstance(resent, ParsedResponse) and resent.plain
        assert all(r is held[r.name] for r in resent.upserts)
        assert not any(parsed_message(r) for r in resent.upserts)
        # ... and the cache sees no change: nothing is written, nobody is told
        assert cache.apply(ENDPOINT, Update(resent.upserts)) == frozenset()
        assert all(cache.served_one(ENDPOINT, name) is held[name] for name in held)


@pytest.mark.parametrize("version", ["", "v1"], ids=["derived", "origin"])
def test_one_changed_body_among_a_resend_is_the_one_decoded(work: Work, version: str) -> None:
    message = response([plain(i, version) for i in range(N)])
    cache = cached(message)
    unchanged = parse_response(copy(message), known=cache.served_to_all)
    assert isinstance(unchanged, ParsedResponse)
    cache.apply(ENDPOINT, Update(unchanged.upserts))
    changed = copy(message)
    changed.resources[1_234].resource.value = endpoints("r1234", 99).SerializeToString()
    work.reset()
    resent = parse_response(copy(changed), known=cache.served_to_all)
    # decoded: that one; hashed: its derived version (an origin's: its digest, when read)
    assert (work.decoded, work.hashed) == (1, 0 if version else 1)
    assert_same_result(resent, parse_response(copy(changed)), cache)
    assert isinstance(resent, ParsedResponse)
    assert cache.apply(ENDPOINT, Update(resent.upserts)) == frozenset({"r1234"})


def test_a_cold_response_decodes_every_body(work: Work) -> None:
    message = response([plain(i, "") for i in range(N)])
    for cache in (cached(response([plain(i, "") for i in range(N, N + 50)])),  # other names
                  ResourceCache()):  # (the type not synced yet)
        work.reset()
        cold = parse_response(copy(message), known=cache.served_to_all)
        assert (work.decoded, work.hashed) == (N, N)
        assert_same_result(cold, parse_response(copy(message)), cache)


def test_a_body_resent_with_a_version_is_not_the_copy_made_without_one(work: Work) -> None:
    # The cached copy's entry is the origin's message with the derived version
    # first: the same bytes as the resend when the origin now sends that very
    # version. The copy made then has the origin's version (not derived), and
    # a digest of its own.
    message = response([plain(i, "") for i in range(64)])
    cache = cached(message)
    resent = copy(message)
    for resource in resent.resources:
        resource.version = cache.served_one(ENDPOINT, resource.name).version  # type: ignore[union-attr]
    work.reset()
    ours = parse_response(copy(resent), known=cache.served_to_all)
    assert work.decoded == 64
    assert_same_result(ours, parse_response(copy(resent)), cache)
    assert isinstance(ours, ParsedResponse) and not any(r.derived_version for r in ours.upserts)


def test_a_body_whose_encoding_ends_the_cached_one_is_not_taken_for_it() -> None:
    # An opaque body (a type this process does not know) that ends with the
    # resend's body field: the cached entry then ends with the new payload (body,
    # name), but is longer than an entry of it with a derived version.
    new = [plain(i, "", UNKNOWN) for i in range(64)]
    old = []
    for resource in new:
        body_field = discovery_pb2.Resource(resource=resource.resource).SerializeToString()
        old.append(discovery_pb2.Resource(name=resource.name, resource=any_pb2.Any(
            type_url=UNKNOWN, value=b"\x01" + body_field)))
        assert old[-1].SerializeToString().endswith(resource.SerializeToString())
    cache = cached(response(old, UNKNOWN))
    message = response(new, UNKNOWN)
    assert_same_result(parse_response(copy(message), known=cache.served_to_all),
                       parse_response(copy(message)), cache)


# -- any resend holds to the check of every resource ---------------------------

KEEP, ALTER, BREAK, RENAME, REVERSION = "keep", "alter", "break", "rename", "reversion"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=st.integers(bulk.BULK_FROM, 80), versions=st.sampled_from(["", "v"]),
       first=st.sampled_from(["bulk", "one by one"]), data=st.data())
def test_any_resend_is_checked_as_every_resource_would_be(
        count: int, versions: str, first: str, data: st.DataObject) -> None:
    original = response([plain(i, f"{versions}{i}" if versions else "") for i in range(count)])
    if first == "bulk":
        cache = cached(original)
    else:  # (copies made from messages: never taken for the entries resent)
        general = one_by_one(original)
        assert isinstance(general, ParsedResponse)
        cache = ResourceCache()
        cache.apply(ENDPOINT, Update(general.upserts))
    resent = copy(original)
    changes = data.draw(st.lists(st.sampled_from([KEEP, KEEP, KEEP, ALTER, RENAME, REVERSION]),
                                 min_size=count, max_size=count))
    # (a few broken at most: one makes the whole response a NACK)
    for i in data.draw(st.lists(st.integers(0, count - 1), max_size=2)):
        changes[i] = BREAK
    for i, (resource, change) in enumerate(zip(resent.resources, changes, strict=True)):
        if change == ALTER:
            resource.resource.value = endpoints(resource.name, 7, i).SerializeToString()
        elif change == BREAK:
            resource.resource.value = UNDECODABLE
        elif change == RENAME:
            resource.name = f"new-{i}"
        elif change == REVERSION:
            resource.version = f"w{i}"  # (among none: some with one, all decoded)
    ours = parse_response(copy(resent), known=cache.served_to_all)
    assert_same_result(ours, parse_response(copy(resent)), cache)
    if BREAK in changes:
        assert isinstance(ours, Unusable) and ours == one_by_one(resent)
        first_broken = resent.resources[changes.index(BREAK)].name
        assert ours.reason.startswith(f"resource {first_broken!r} cannot be decoded as ")
