"""One name's stored entry: what goes in comes back, and bad bytes are refused."""

from __future__ import annotations

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import duration_pb2

from relay.constraints import compile_constraints
from relay.encoding import length_delimited_field
from relay.persistence.entries import FORMAT, CorruptEntry, decode_entry, encode_entry
from relay.resource import CachedResource
from relay.xds_types import CLUSTER
from tests.builders import cluster, pack

DPC = discovery_pb2.DynamicParameterConstraints


def origin_resource(name: str, version: str = "v1", env: str | None = None,
                    ttl: int | None = None, aliases: tuple[str, ...] = ()) -> CachedResource:
    """A resource as parse_response builds it from an origin's ``Resource``."""
    resource = discovery_pb2.Resource(version=version, resource=pack(cluster(name)),
                                      aliases=list(aliases))
    constraints = DPC()
    if env is None:
        resource.name = name
    else:
        constraints.constraint.key = "env"
        constraints.constraint.value = env
        resource.resource_name.name = name
        resource.resource_name.dynamic_parameter_constraints.CopyFrom(constraints)
    if ttl is not None:
        resource.ttl.CopyFrom(duration_pb2.Duration(seconds=ttl))
    return CachedResource.from_origin(CLUSTER, name, resource, compile_constraints(constraints))


def test_variants_come_back_with_their_bytes_constraints_and_expiry() -> None:
    prod, canary = origin_resource("a", env="prod", ttl=30), origin_resource("a", env="canary")
    name, variants = decode_entry(CLUSTER, encode_entry("a", [(prod, 1234.5), (canary, None)]))
    assert name == "a"
    assert [(v.resource.resource.SerializeToString(), v.resource.variant_key, v.expires_at)
            for v in variants] == [
        (prod.resource.SerializeToString(), prod.variant_key, 1234.5),
        (canary.resource.SerializeToString(), canary.variant_key, None)]
    assert all(v.resource.digest == r.digest for v, r in zip(variants, [prod, canary],
                                                             strict=True))


def test_a_derived_version_comes_back_derived_so_a_resend_is_no_news() -> None:
    # istiod sends no version: the relay derives one from the content.
    stored = origin_resource("a", version="")
    assert stored.derived_version
    _, (variant,) = decode_entry(CLUSTER, encode_entry("a", [(stored, None)]))
    resent = origin_resource("a", version="")
    assert variant.resource.derived_version
    assert variant.resource.version == stored.version == resent.version
    assert variant.resource.digest == resent.digest
    assert variant.resource.origin_version == ""


def test_a_derived_version_made_from_the_encoding_comes_back_the_same() -> None:
    # A response of many plain resources is checked in bulk (relay.upstream.bulk):
    # each is made from its encoding, its digest taken over those bytes. The
    # snapshot is restored one by one: the same version and digest as either
    # path gives the origin's resend, so that it is no news.
    def plain() -> CachedResource:
        resource = discovery_pb2.Resource(name="a", resource=pack(cluster("a")))
        entry = length_delimited_field(2, resource.SerializeToString())
        return CachedResource.from_encoded(CLUSTER, "a", "", entry, 0.0)

    stored = plain()
    assert stored.plain and stored.derived_version
    _, (variant,) = decode_entry(CLUSTER, encode_entry("a", [(stored, None)]))
    restored = variant.resource
    for resent in (plain(), origin_resource("a", version="")):
        assert (restored.version, restored.digest) == (resent.version, resent.digest)
        assert restored.is_current(resent) and resent.is_current(restored)
    assert restored.derived_version and restored.delta_entry == stored.delta_entry


def test_an_origin_version_stays_the_origins() -> None:
    _, (variant,) = decode_entry(CLUSTER, encode_entry("a", [(origin_resource("a", "v7"), None)]))
    assert not variant.resource.derived_version
    assert variant.resource.version == "v7"


def test_aliases_and_names_with_any_character_survive() -> None:
    name = "xdstp://authority/envoy.config.cluster.v3.Cluster/ü/\n/a b"
    stored = origin_resource(name, aliases=("alias-1",))
    decoded, (variant,) = decode_entry(CLUSTER, encode_entry(name, [(stored, None)]))
    assert decoded == name
    assert list(variant.resource.resource.aliases) == ["alias-1"]


def good_entry() -> bytes:
    return encode_entry("a", [(origin_resource("a"), None)])


@pytest.mark.parametrize(("blob", "reason"), [
    (b"", "not an entry"),
    (b"garbage that is no entry", "not an entry"),
    (b"xr\x09" + good_entry()[3:], f"an entry of format 9, expected format {FORMAT}"),
    (good_entry()[:-5], "truncated"),
    (good_entry()[:5], "no variants"),
    (good_entry()[:6], "variant 1: no resource"),
    (good_entry()[:5] + b"\x02\x00\x00", "truncated"),  # an expiry cut short
])
def test_unreadable_entries_are_refused_with_a_reason(blob: bytes, reason: str) -> None:
    with pytest.raises(CorruptEntry, match=reason):
        decode_entry(CLUSTER, blob)


def test_an_entry_holding_another_name_or_type_is_refused() -> None:
    other = encode_entry("a", [(origin_resource("b"), None)])
    with pytest.raises(CorruptEntry, match="named 'b'"):
        decode_entry(CLUSTER, other)
    with pytest.raises(CorruptEntry, match="of type"):
        decode_entry("type.googleapis.com/envoy.config.listener.v3.Listener", good_entry())


def test_undecodable_resource_bytes_are_refused() -> None:
    blob = bytearray(good_entry())
    header = 3 + 1 + 1 + 1  # magic, name length, name, flags
    blob[header + 2:header + 6] = b"\xff\xff\xff\xff"  # inside the Resource message
    with pytest.raises(CorruptEntry):
        decode_entry(CLUSTER, bytes(blob))
