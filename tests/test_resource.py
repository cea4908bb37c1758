"""CachedResource: what is computed on first read is computed once, and one
made from its encoding is parsed only when its message is read."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay import resource as resource_module
from relay.encoding import length_delimited_field
from relay.resource import CachedResource, content_digest
from relay.xds_types import ENDPOINT
from tests.builders import endpoints


def origin(version: str = "v1") -> discovery_pb2.Resource:
    return discovery_pb2.Resource(name="a", version=version, resource=any_pb2.Any(
        type_url=ENDPOINT, value=endpoints("a", 80).SerializeToString()))


def test_a_lazy_attribute_is_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    compute = resource_module._LAZY["delta_entry"]

    def counting(made: CachedResource) -> object:
        calls.append(made.name)
        return compute(made)

    monkeypatch.setitem(resource_module._LAZY, "delta_entry", counting)
    made = CachedResource(ENDPOINT, "a", "v1", origin())
    assert made.delta_entry is made.delta_entry
    assert made.delta_entry == length_delimited_field(2, origin().SerializeToString())
    assert calls == ["a"]


def test_one_made_from_its_encoding_is_parsed_only_when_its_message_is_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parses = []
    compute = resource_module._LAZY["resource"]

    def counting(made: CachedResource) -> object:
        parses.append(made.name)
        return compute(made)

    monkeypatch.setitem(resource_module._LAZY, "resource", counting)
    entry = length_delimited_field(2, origin().SerializeToString())
    made = CachedResource.from_encoded(ENDPOINT, "a", "v1", entry, received=5.0)
    assert (made.delta_entry, made.digest, made.plain, made.aliases, made.ttl_seconds,
            made.do_not_cache, made.received) == (
        entry, content_digest(origin()), True, (), None, False, 5.0)
    assert parses == []
    assert made.resource == origin() and made.resource is made.resource
    assert made.sotw_entry == length_delimited_field(2, origin().resource.SerializeToString())
    assert parses == ["a"]


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    made = CachedResource(ENDPOINT, "a", "v1", origin())
    with pytest.raises(AttributeError, match="'CachedResource' object has no attribute 'nope'"):
        made.nope  # type: ignore[attr-defined]  # noqa: B018


def test_it_is_weakly_referenced_and_holds_no_dict() -> None:
    made = CachedResource(ENDPOINT, "a", "v1", origin())
    ref = weakref.ref(made)
    assert not hasattr(made, "__dict__")
    del made
    gc.collect()
    assert ref() is None


def test_a_derived_version_is_the_digest_of_the_content_without_it() -> None:
    made = CachedResource.from_origin(ENDPOINT, "a", origin(version=""))
    assert made.derived_version and made.version == content_digest(origin(version="")).hex()
    assert made.origin_version == ""
    assert made.resource.version == made.version


@pytest.mark.parametrize("versions", [["v1", "v2", "v3"], [], ["v1", "", "v3"]],
                         ids=["all", "none", "some"])
def test_many_made_from_their_encodings_are_each_as_from_encoded(versions: list[str]) -> None:
    sent = [origin(version) for version in versions or ["", "", ""]]
    for i, resource in enumerate(sent):
        resource.name = f"r{i}"
    entries = [length_delimited_field(2, resource.SerializeToString()) for resource in sent]
    names = [resource.name for resource in sent]
    many = CachedResource.from_encoded_many(ENDPOINT, names, versions, entries, 5.0)
    clock = resource_module.arrival_clock()
    one_by_one = [CachedResource.from_encoded(ENDPOINT, name, resource.version, entry, 5.0)
                  for name, resource, entry in zip(names, sent, entries, strict=True)]
    # every slot set as from_encoded sets it (read before anything is computed
    # on first read), so that a slot one day set in __init__ is not missed here
    assert list(map(set_slots, many)) == list(map(set_slots, one_by_one))
    fields = ("type_url", "name", "version", "derived_version", "delta_entry", "digest",
              "plain", "received", "variant_key", "resource")
    assert [[getattr(made, f) for f in fields] for made in many] == \
        [[getattr(made, f) for f in fields] for made in one_by_one]
    # stamped one after another, the last the clock's
    assert [made.arrival for made in many] == [clock - 2, clock - 1, clock]


def set_slots(made: CachedResource) -> dict[str, object]:
    """The slots of ``made`` that are set (not computed on this read), but its arrival stamp."""
    found = {}
    for slot in CachedResource.__slots__:
        if slot in ("__weakref__", "arrival"):
            continue
        with contextlib.suppress(AttributeError):
            found[slot] = CachedResource.__dict__[slot].__get__(made)
    return found
