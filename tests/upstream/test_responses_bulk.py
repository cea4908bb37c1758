"""The bulk check of plain resources (relay.upstream.bulk): what it makes is
what the check one by one makes, byte for byte; any response it cannot take
gets the general check's result; and it does no work per resource but make it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay import resource as resource_module
from relay.cache import ResourceCache, Update
from relay.resource import CachedResource
from relay.upstream import bulk, responses
from relay.upstream.responses import Checked, ParsedResponse, Unusable, parse_response
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import endpoints
from tests.variants import CANARY

COUNT = 64  # over bulk.BULK_FROM
UNKNOWN = "type.googleapis.com/example.NotAKnownMessage"


def plain(i: int, version: str = "v1", type_url: str = ENDPOINT) -> discovery_pb2.Resource:
    body = (endpoints(f"r{i}", 80, 81).SerializeToString() if type_url == ENDPOINT
            else b"\x08\x01opaque" + bytes([i % 256]))
    return discovery_pb2.Resource(name=f"r{i}", version=version,
                                  resource=any_pb2.Any(type_url=type_url, value=body))


def response(resources: list[discovery_pb2.Resource],
             type_url: str = ENDPOINT) -> discovery_pb2.DeltaDiscoveryResponse:
    return discovery_pb2.DeltaDiscoveryResponse(type_url=type_url, nonce="5",
                                                resources=resources)


def one_by_one(message: discovery_pb2.DeltaDiscoveryResponse) -> Checked:
    """The general check's result: the bulk check takes no response."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bulk, "BULK_FROM", 10**9)
        return parse_response(discovery_pb2.DeltaDiscoveryResponse.FromString(
            message.SerializeToString()))


def parsed_message(made: CachedResource) -> bool:
    """Whether ``made`` holds its ``Resource`` message (made or parsed)."""
    try:
        object.__getattribute__(made, "resource")
    except AttributeError:
        return False
    return True


def assert_same(made: CachedResource, general: CachedResource) -> None:
    """Everything a reader of the two can see is the same."""
    fields = ("type_url", "name", "version", "derived_version", "constraints", "variant_key",
              "ttl_seconds", "do_not_cache", "resource_name")
    assert [getattr(made, f) for f in fields] == [getattr(general, f) for f in fields]
    assert list(made.aliases) == list(general.aliases)
    assert made.delta_entry == general.delta_entry
    assert made.digest == general.digest
    assert made.is_current(general) and general.is_current(made)
    assert made.resource == general.resource
    for entry in ("sotw_entry", "sotw_wrapped_entry", "heartbeat_entry", "sotw_heartbeat_entry"):
        assert getattr(made, entry) == getattr(general, entry), entry


@pytest.mark.parametrize("version,type_url", [("v1", ENDPOINT), ("", ENDPOINT), ("v7", UNKNOWN),
                                              ("", UNKNOWN)])
def test_plain_resources_made_in_bulk_are_those_made_one_by_one(version: str,
                                                                type_url: str) -> None:
    message = response([plain(i, version, type_url) for i in range(COUNT)], type_url)
    made, general = parse_response(message), one_by_one(message)
    assert isinstance(made, ParsedResponse) and isinstance(general, ParsedResponse)
    assert not any(parsed_message(r) for r in made.upserts)  # (made in bulk)
    assert all(parsed_message(r) for r in general.upserts)
    assert len(made.upserts) == len(general.upserts) == COUNT
    for ours, theirs in zip(made.upserts, general.upserts, strict=True):
        assert_same(ours, theirs)
    # a version the relay derived is the digest of the content without it
    assert made.upserts[0].derived_version == (not version)


def test_an_unknown_field_of_resource_is_kept_as_the_general_check_keeps_it() -> None:
    message = response([plain(i) for i in range(COUNT)])
    raw = message.SerializeToString()
    # Resource field 15 (a varint), unknown to this relay, in the first resource
    first = message.resources[0].SerializeToString() + b"\x78\x2a"
    message = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
    message.resources[0].ParseFromString(first)
    made, general = parse_response(message), one_by_one(message)
    assert isinstance(made, ParsedResponse) and isinstance(general, ParsedResponse)
    assert not parsed_message(made.upserts[0])
    assert made.upserts[0].delta_entry.endswith(b"\x78\x2a")
    for ours, theirs in zip(made.upserts, general.upserts, strict=True):
        assert_same(ours, theirs)


def _ttl(r: discovery_pb2.Resource) -> None:
    r.ttl.seconds = 30


def _empty_ttl(r: discovery_pb2.Resource) -> None:
    r.ttl.SetInParent()  # present, zero: a field of no bytes


def _alias(r: discovery_pb2.Resource) -> None:
    r.aliases.append("also-r40")


def _metadata(r: discovery_pb2.Resource) -> None:
    r.metadata.filter_metadata["x"].CopyFrom(struct_pb2.Struct(fields={
        "b": struct_pb2.Value(string_value="2"), "a": struct_pb2.Value(string_value="1")}))


def _constraints(r: discovery_pb2.Resource) -> None:
    r.resource_name.name = r.name
    r.resource_name.dynamic_parameter_constraints.CopyFrom(CANARY)
    r.ClearField("name")


def _do_not_cache(r: discovery_pb2.Resource) -> None:
    r.cache_control.do_not_cache = True


def _heartbeat(r: discovery_pb2.Resource) -> None:
    r.ClearField("resource")


def _other_type(r: discovery_pb2.Resource) -> None:
    r.resource.type_url = CLUSTER


def _undecodable(r: discovery_pb2.Resource) -> None:
    r.resource.value = b"\xff"


def _nameless(r: discovery_pb2.Resource) -> None:
    r.ClearField("name")


def _duplicate(r: discovery_pb2.Resource) -> None:
    r.name = "r3"


IRREGULAR: list[Callable[[discovery_pb2.Resource], None]] = [
    _ttl, _empty_ttl, _alias, _metadata, _constraints, _do_not_cache, _heartbeat,
    _other_type, _undecodable, _nameless, _duplicate]


@pytest.mark.parametrize("change", IRREGULAR, ids=lambda change: change.__name__)
def test_a_response_the_bulk_check_cannot_take_gets_the_general_checks_result(
        change: Callable[[discovery_pb2.Resource], None]) -> None:
    message = response([plain(i) for i in range(COUNT)])
    change(message.resources[40])
    made, general = parse_response(message), one_by_one(message)
    assert type(made) is type(general)
    if isinstance(made, Unusable):
        assert made == general
        return
    assert isinstance(general, ParsedResponse)
    assert made.heartbeats == general.heartbeats
    assert all(parsed_message(r) for r in made.upserts)  # (checked one by one)
    for ours, theirs in zip(made.upserts, general.upserts, strict=True):
        assert_same(ours, theirs)


def test_the_nack_reasons_are_those_of_the_general_check() -> None:
    reasons = {}
    for change in (_other_type, _undecodable, _nameless, _duplicate):
        message = response([plain(i) for i in range(COUNT)])
        change(message.resources[40])
        checked = parse_response(message)
        assert isinstance(checked, Unusable)
        reasons[change.__name__] = checked.reason
    assert reasons["_other_type"] == (f"resource 'r40' has type {CLUSTER!r} in a response "
                                      f"for {ENDPOINT!r}")
    assert reasons["_undecodable"].startswith(f"resource 'r40' cannot be decoded as {ENDPOINT}: ")
    assert reasons["_nameless"] == "a resource has no name"
    assert reasons["_duplicate"] == "resource 'r3' appears more than once"


class Counts:
    """Calls of the per-resource work of the general check, and bulk decodes."""

    def __init__(self, patch: pytest.MonkeyPatch) -> None:
        self.made_one_by_one = self.decoded_one_by_one = self.bulk_decodes = 0
        self.messages_parsed = 0
        # the size of what each bulk decode took
        self.bulk_decoded: list[int] = []
        from_origin = CachedResource.from_origin
        message_class = responses.message_class
        shadows = bulk.shadows

        def counting_from_origin(*args: Any, **kwargs: Any) -> CachedResource:
            self.made_one_by_one += 1
            return from_origin(*args, **kwargs)

        def counting_message_class(type_url: str) -> Any:
            found = message_class(type_url)
            if found is None:
                return None
            counts = self

            class Counting:
                @staticmethod
                def FromString(value: bytes) -> Any:
                    counts.decoded_one_by_one += 1
                    return found.FromString(value)
            return Counting

        def counting_shadows(type_url: str) -> Any:
            found = shadows(type_url)
            checked, counts = found.checked, self

            class Checked:
                @staticmethod
                def FromString(value: bytes) -> Any:
                    counts.bulk_decodes += 1
                    counts.bulk_decoded.append(len(value))
                    return checked.FromString(value)
            found = bulk.Shadows({"Entries": found.entries, "Checked": Checked,
                                  "Listed": found.listed})
            return found

        resource_parse = resource_module._LAZY["resource"]

        def counting_parse(made: CachedResource) -> object:
            self.messages_parsed += 1
            return resource_parse(made)

        patch.setattr(CachedResource, "from_origin", counting_from_origin)
        patch.setattr(responses, "message_class", counting_message_class)
        patch.setattr(bulk, "shadows", counting_shadows)
        patch.setitem(resource_module._LAZY, "resource", counting_parse)


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counts]:
    yield Counts(monkeypatch)


def test_a_plain_response_is_decoded_in_slices_and_no_resource_is_parsed(
        counts: Counts) -> None:
    message = response([plain(i, version="" if i % 2 else "v1") for i in range(2_500)])
    checked = parse_response(message)
    assert isinstance(checked, ParsedResponse)
    cache = ResourceCache()
    cache.apply(ENDPOINT, Update(checked.upserts))
    entries = [r.delta_entry for r in checked.upserts]
    assert len(entries) == 2_500
    # one decode per slice of 1,000; nothing made, decoded or parsed one by one
    assert (counts.bulk_decodes, counts.made_one_by_one, counts.decoded_one_by_one,
            counts.messages_parsed) == (3, 0, 0, 0)


@pytest.mark.parametrize("ports", [200, 600])
def test_large_resources_are_decoded_in_slices_of_about_slice_bytes(
        counts: Counts, ports: int) -> None:
    # 2,000 resources of ~4.3 KB (200 endpoints) or ~13 KB: 1,000 of them
    # decoded at once took 39 or 141 MiB of protobuf's arena (and 36 or 120 ms)
    body = endpoints("", *range(ports)).SerializeToString()
    message = response([discovery_pb2.Resource(
        name=f"r{i}", version="v1", resource=any_pb2.Any(type_url=ENDPOINT, value=body))
        for i in range(2_000)])
    checked = parse_response(message)
    assert isinstance(checked, ParsedResponse) and len(checked.upserts) == 2_000
    size = message.ByteSize()
    per_slice = bulk.SLICE_BYTES * 2_000 // size
    assert per_slice < bulk.SLICE // 2
    assert counts.bulk_decodes == -(-2_000 // per_slice)
    # each slice about SLICE_BYTES: its resources' entries, no more
    assert max(counts.bulk_decoded) <= bulk.SLICE_BYTES
    assert sum(counts.bulk_decoded) < size
    assert [r.delta_entry for r in checked.upserts] == \
        [r.delta_entry for r in one_by_one(message).upserts]  # type: ignore[union-attr]


@pytest.mark.parametrize("change,one_by_one_made", [(_ttl, 2_500), (_heartbeat, 2_499),
                                                    (_other_type, 1_500)],
                         ids=["ttl", "heartbeat", "other_type"])
def test_a_response_the_bulk_check_cannot_take_is_checked_once_one_by_one(
        counts: Counts, change: Callable[[discovery_pb2.Resource], None],
        one_by_one_made: int) -> None:
    message = response([plain(i) for i in range(2_500)])
    change(message.resources[1_500])
    parse_response(message)
    # what is not plain is seen in its slice (the second), before that slice
    # is decoded: the first was, in vain
    assert (counts.bulk_decodes, counts.made_one_by_one, counts.decoded_one_by_one) == \
        (1, one_by_one_made, one_by_one_made)


def test_a_small_response_is_checked_one_by_one(counts: Counts) -> None:
    message = response([plain(i) for i in range(bulk.BULK_FROM - 1)])
    assert isinstance(parse_response(message), ParsedResponse)
    assert (counts.bulk_decodes, counts.made_one_by_one) == (0, bulk.BULK_FROM - 1)


def test_the_shadow_types_are_made_once_per_message_type() -> None:
    assert bulk.shadows(ENDPOINT) is bulk.shadows(ENDPOINT)
    assert bulk.shadows(ENDPOINT) is not bulk.shadows(CLUSTER)
    # another type URL of the same message (a pool file can be added once)
    other = "example.com/" + ENDPOINT.rsplit("/", 1)[1]
    assert bulk.shadows(other) is bulk.shadows(ENDPOINT)
    # types this process does not know all read bodies as bytes
    assert bulk.shadows(UNKNOWN) is bulk.shadows("example.com/another.Unknown")
    # a node is no response type, and still gets types of its own
    node = "type.googleapis.com/" + base_pb2.Node.DESCRIPTOR.full_name
    assert bulk.shadows(node).checked is not bulk.shadows(ENDPOINT).checked


def test_a_message_under_another_type_url_is_checked_in_bulk_too() -> None:
    other = "example.com/" + ENDPOINT.rsplit("/", 1)[1]
    message = response([plain(i, type_url=other) for i in range(COUNT)], other)
    for resource in message.resources:  # (plain() gives opaque bodies to unknown URLs)
        resource.resource.value = endpoints(resource.name, 80).SerializeToString()
    made, general = parse_response(message), one_by_one(message)
    assert isinstance(made, ParsedResponse) and isinstance(general, ParsedResponse)
    assert not any(parsed_message(r) for r in made.upserts)
    for ours, theirs in zip(made.upserts, general.upserts, strict=True):
        assert_same(ours, theirs)
    message.resources[9].resource.value = b"\xff"
    assert parse_response(message) == one_by_one(message)
    assert isinstance(parse_response(message), Unusable)


def test_entries_of_any_length_are_framed_once_per_length_as_one_by_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # bodies whose lengths take 1, 2 and 3 bytes as varints, each length twice
    lengths = [3, 100, 127, 128, 300, 16_383, 16_384, 70_000] * (bulk.BULK_FROM // 4)
    message = response([discovery_pb2.Resource(
        name=f"r{i:03}", version="v1", resource=any_pb2.Any(
            type_url=UNKNOWN, value=b"\x0a" + bytes([0]) * (length - 1)))
        for i, length in enumerate(lengths)], UNKNOWN)
    framed: list[int] = []
    prefix = bulk._entry_prefix.__wrapped__

    def counting(length: int) -> bytes:
        framed.append(length)
        return prefix(length)
    monkeypatch.setattr(bulk, "_entry_prefix", functools.lru_cache(maxsize=1_024)(counting))
    made, general = parse_response(message), one_by_one(message)
    assert isinstance(made, ParsedResponse) and isinstance(general, ParsedResponse)
    assert not any(parsed_message(r) for r in made.upserts)  # (made in bulk)
    for ours, theirs in zip(made.upserts, general.upserts, strict=True):
        assert_same(ours, theirs)
    # each distinct entry length framed once (a varint call), not once per resource
    entry_lengths = {len(r.SerializeToString()) for r in message.resources}
    assert sorted(framed) == sorted(entry_lengths) and len(framed) == 8


# -- names and versions listed in one parse; resources made in one loop -------

_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                 max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(_NAMES, min_size=bulk.BULK_FROM, max_size=90, unique=True),
       versions=st.sampled_from(["all", "none", "some"]), lengths=st.data(),
       type_url=st.sampled_from([ENDPOINT, UNKNOWN]))
def test_any_plain_response_is_made_in_bulk_as_one_by_one(
        names: list[str], versions: str, lengths: st.DataObject, type_url: str) -> None:
    resources = []
    for i, name in enumerate(names):
        version = {"all": f"v{i}", "none": "", "some": f"v{i}" if i % 3 else ""}[versions]
        body = (endpoints(name, *range(80, 80 + lengths.draw(st.integers(0, 6)))
                          ).SerializeToString() if type_url == ENDPOINT
                else bytes(lengths.draw(st.integers(0, 200))))
        resources.append(discovery_pb2.Resource(name=name, version=version, resource=any_pb2.Any(
            type_url=type_url, value=body)))
    message = response(resources, type_url)
    made = parse_response(message)
    clock = resource_module.arrival_clock()
    general = one_by_one(message)
    assert isinstance(made, ParsedResponse) and isinstance(general, ParsedResponse)
    assert not any(parsed_message(r) for r in made.upserts)  # (made in bulk)
    for ours, theirs in zip(made.upserts, general.upserts, strict=True):
        assert_same(ours, theirs)
    # stamped in order of arrival, one after another, as one by one
    arrivals = [r.arrival for r in made.upserts]
    assert arrivals == list(range(clock - len(names) + 1, clock + 1))


class Reads:
    """Parses of the listing shadow type, bulk decodes, reads of the decoded
    resources (a Python object each), and resources made one call each."""

    def __init__(self, patch: pytest.MonkeyPatch) -> None:
        self.listed = self.decodes = self.resources_read = self.from_encoded = 0
        shadows, from_encoded = bulk.shadows, CachedResource.from_encoded
        reads = self

        class Decoded:
            def __init__(self, checked: Any) -> None:
                self._checked = checked

            @property
            def resources(self) -> Any:
                reads.resources_read += 1
                return self._checked.resources

        def counting_shadows(type_url: str) -> Any:
            found = shadows(type_url)

            class Checked:
                @staticmethod
                def FromString(value: bytes) -> Any:
                    reads.decodes += 1
                    return Decoded(found.checked.FromString(value))

            class Listed:
                @staticmethod
                def FromString(value: bytes) -> Any:
                    reads.listed += 1
                    return found.listed.FromString(value)
            return bulk.Shadows({"Entries": found.entries, "Checked": Checked,
                                 "Listed": Listed})

        def counting_from_encoded(*args: Any) -> CachedResource:
            self.from_encoded += 1
            return from_encoded(*args)

        patch.setattr(bulk, "shadows", counting_shadows)
        patch.setattr(CachedResource, "from_encoded", counting_from_encoded)


@pytest.mark.parametrize("versions,expected", [
    ("all", (3, 3, 0, 0)),  # names and versions listed; no call a resource
    ("none", (3, 3, 0, 2_500)),  # versions derived: from_encoded each (hashing)
    ("some", (3, 3, 3, 2_500)),  # versions read from the decoded resources, a slice at a time
])
def test_names_and_versions_are_listed_in_one_parse_a_slice_and_made_with_no_call_each(
        monkeypatch: pytest.MonkeyPatch, versions: str, expected: tuple[int, ...]) -> None:
    reads = Reads(monkeypatch)
    message = response([plain(i, {"all": "v1", "none": "", "some": "" if i % 2 else "v1"}[
        versions]) for i in range(2_500)])
    made, general = parse_response(message), one_by_one(message)
    assert isinstance(made, ParsedResponse) and isinstance(general, ParsedResponse)
    assert (reads.listed, reads.decodes, reads.resources_read, reads.from_encoded) == expected
    assert [r.version for r in made.upserts] == [r.version for r in general.upserts]
    assert made.upserts[-1].delta_entry == general.upserts[-1].delta_entry
