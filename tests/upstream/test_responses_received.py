"""Origin responses as received (their bytes, as gRPC hands them over):
parsed in steps, a slice of resources at a time; an origin's own encoding
gives what the canonical one gives, byte for byte; and bytes that do not
decode are NACKed, or end the stream where no nonce can be read."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, duration_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.encoding import varint
from relay.upstream import bulk
from relay.upstream.responses import (
    ParsedResponse,
    UndecodableResponse,
    Unusable,
    parse_response,
    parse_steps,
)
from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import endpoints
from tests.upstream.test_responses import stepped
from tests.upstream.test_responses_bulk import Counts, assert_same, counts, parsed_message

__all__ = ["counts"]  # (a fixture)


def field(number: int, payload: bytes) -> bytes:
    return bytes(((number << 3) | 2,)) + varint(len(payload)) + payload


def overlong(number: int, payload: bytes) -> bytes:
    """A length-delimited field whose length takes a byte more than it needs."""
    return bytes(((number << 3) | 2, 0x80 | len(payload) & 0x7F, len(payload) >> 7)) + payload


def canonical(name: str, version: str, body: bytes) -> bytes:
    """A ``Resource`` as protobuf writes it: by field number, nothing empty."""
    return ((field(1, version.encode()) if version else b"")
            + field(2, field(1, ENDPOINT.encode()) + field(2, body)) + field(3, name.encode()))


def declared_order(name: str, version: str, body: bytes) -> bytes:
    """As an encoder that writes fields in the order the .proto declares them
    (name, then version, then the body; an Any's value before its type URL)."""
    return (field(3, name.encode()) + (field(1, version.encode()) if version else b"")
            + field(2, field(2, body) + field(1, ENDPOINT.encode())))


def name_twice(name: str, version: str, body: bytes) -> bytes:
    """A name written twice: the last one counts."""
    return field(3, b"not-" + name.encode()) + canonical(name, version, body)


def empty_version(name: str, version: str, body: bytes) -> bytes:
    """An empty version written out (as none)."""
    return (field(1, version.encode()) + field(2, field(1, ENDPOINT.encode()) + field(2, body))
            + field(3, name.encode()))


def overlong_lengths(name: str, version: str, body: bytes) -> bytes:
    return ((overlong(1, version.encode()) if version else b"")
            + overlong(2, overlong(1, ENDPOINT.encode()) + field(2, body))
            + overlong(3, name.encode()))


Encoder = Callable[[str, str, bytes], bytes]
ENCODERS: list[Encoder] = [canonical, declared_order, name_twice, empty_version,
                           overlong_lengths]


def received(resources: list[bytes], type_url: str = ENDPOINT, nonce: str = "7") -> bytes:
    """A response's bytes, its resources as encoded, its type URL and nonce after them."""
    return (b"".join(field(2, resource) for resource in resources)
            + field(4, type_url.encode()) + field(5, nonce.encode()))


def general(raw: bytes) -> ParsedResponse:
    """The general check of the response the bytes decode to (one by one)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bulk, "BULK_FROM", 10**9)
        parsed = parse_response(discovery_pb2.DeltaDiscoveryResponse.FromString(raw))
    assert isinstance(parsed, ParsedResponse)
    return parsed


def bodies(count: int) -> list[bytes]:
    return [endpoints(f"r{i}", 80 + i % 7).SerializeToString() for i in range(count)]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(encoders=st.lists(st.sampled_from(ENCODERS), min_size=bulk.BULK_FROM, max_size=80),
       versions=st.sampled_from(["all", "none", "some"]))
def test_an_origins_own_encoding_gives_what_the_canonical_one_gives(
        encoders: list[Encoder], versions: str) -> None:
    count = len(encoders)
    names = [f"r{i}" for i in range(count)]
    versions_of = [{"all": f"v{i}", "none": "", "some": f"v{i}" if i % 3 else ""}[versions]
                   for i in range(count)]
    raw = received([encode(name, version, body) for encode, name, version, body in zip(
        encoders, names, versions_of, bodies(count), strict=True)])
    made, theirs = parse_response(raw), general(raw)
    assert isinstance(made, ParsedResponse) and made.plain
    assert not any(parsed_message(r) for r in made.upserts)  # (made in bulk)
    assert [r.name for r in made.upserts] == names
    for ours, one_by_one in zip(made.upserts, theirs.upserts, strict=True):
        assert_same(ours, one_by_one)
        # what is cached and served is the canonical encoding
        assert ours.delta_entry == field(2, one_by_one.resource.SerializeToString())


def test_only_a_slice_not_canonical_is_encoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[bool] = []
    canonical_of = bulk._canonical

    def recording(entries: bytes) -> bytes | None:
        made = canonical_of(entries)
        encoded.append(made != entries)
        return made

    monkeypatch.setattr(bulk, "_canonical", recording)
    count = 2_500  # three slices of 1,000 at most
    raw = received([(declared_order if i == 1_500 else canonical)(f"r{i}", "v1", body)
                    for i, body in enumerate(bodies(count))])
    made = parse_response(raw)
    assert isinstance(made, ParsedResponse) and made.plain
    assert encoded == [False, True, False]
    for ours, theirs in zip(made.upserts, general(raw).upserts, strict=True):
        assert_same(ours, theirs)


def test_a_large_response_is_never_parsed_or_encoded_whole(
        counts: Counts, monkeypatch: pytest.MonkeyPatch) -> None:
    # 2,000 resources of ~13 KB, 26 MiB: one parse took 5.8 ms and one
    # encoding 61 ms; at 64 MiB (an istiod push), 39-60 ms and 190-260 ms
    sizes: list[int] = []
    canonical_of = bulk._canonical

    def recording(entries: bytes) -> bytes | None:
        sizes.append(len(entries))
        return canonical_of(entries)

    monkeypatch.setattr(bulk, "_canonical", recording)
    body = endpoints("", *range(600)).SerializeToString()
    raw = received([canonical(f"r{i}", "v1", body) for i in range(2_000)])
    made, pauses = stepped(parse_steps(raw, step=1_000))
    assert isinstance(made, ParsedResponse) and made.plain and len(made.upserts) == 2_000
    per_slice = bulk.SLICE_BYTES * 2_000 // len(raw)
    # encoded a slice at a time (no more than SLICE_BYTES each), a pause after
    # the first parse and between two slices; nothing checked one by one
    assert len(sizes) == -(-2_000 // per_slice) and max(sizes) <= bulk.SLICE_BYTES
    assert sum(sizes) < len(raw)
    assert pauses == len(sizes)
    assert (counts.made_one_by_one, counts.decoded_one_by_one) == (0, 0)


def test_bytes_that_are_no_response_raise_and_nothing_else() -> None:
    for raw in (b"\x22\x02\xff\xfe",  # a type URL that is not UTF-8
                b"\x12\x10abc",  # an entry longer than what is left
                b"\xff"):  # no field at all
        with pytest.raises(UndecodableResponse, match="not a DeltaDiscoveryResponse"):
            parse_response(raw)


@pytest.mark.parametrize("count", [1, bulk.BULK_FROM, 1_500])
def test_a_resource_that_does_not_decode_is_nacked_with_the_nonce(count: int) -> None:
    resources = [canonical(f"r{i}", "v1", body) for i, body in enumerate(bodies(count))]
    resources[-1] = field(3, b"\xff\xfe") + resources[-1]  # a name that is not UTF-8
    checked = parse_response(received(resources, nonce="n9"))
    assert isinstance(checked, Unusable)
    assert (checked.type_url, checked.nonce) == (ENDPOINT, "n9")
    assert checked.reason.startswith("the response cannot be decoded: ")


def test_a_message_and_its_bytes_give_the_same() -> None:
    message = discovery_pb2.DeltaDiscoveryResponse(
        type_url=CLUSTER, nonce="3", removed_resources=["gone"])
    message.resources.add(name="a", version="1").resource.Pack(
        discovery_pb2.DeltaDiscoveryRequest())  # (of another type: NACKed the same)
    assert parse_response(message) == parse_response(message.SerializeToString())
    message.resources[0].resource.type_url = CLUSTER
    message.resources[0].resource.value = b""
    ours, theirs = parse_response(message), parse_response(message.SerializeToString())
    assert isinstance(ours, ParsedResponse) and isinstance(theirs, ParsedResponse)
    assert (ours.removed, theirs.removed) == (["gone"], ["gone"])
    assert_same(ours.upserts[0], theirs.upserts[0])


def test_a_large_response_that_is_not_plain_is_parsed_a_slice_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    parsed_entries = bulk._parsed_entries

    def recording(entries: bytes) -> discovery_pb2.DeltaDiscoveryResponse:
        sizes.append(len(entries))
        return parsed_entries(entries)

    monkeypatch.setattr(bulk, "_parsed_entries", recording)
    body = endpoints("", *range(200)).SerializeToString()  # ~4.3 KB
    message = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce="4", resources=[
        discovery_pb2.Resource(name=f"r{i}", version="v1", ttl=duration_pb2.Duration(seconds=30),
                               resource=any_pb2.Any(type_url=ENDPOINT, value=body))
        for i in range(1_000)])  # (a TTL each: not plain, checked one by one)
    raw = message.SerializeToString()
    sliced, pauses = stepped(parse_steps(raw, step=100))
    assert isinstance(sliced, ParsedResponse) and not sliced.plain
    per_slice = bulk.SLICE_BYTES * 1_000 // len(raw)
    assert len(sizes) == -(-1_000 // per_slice) > 1 and max(sizes) <= bulk.SLICE_BYTES
    assert pauses == 1 + 1_000 // 100  # (the first parse, then before every 100th checked)
    # what the same check makes of the response parsed whole, in one slice
    monkeypatch.setattr(bulk, "SLICE_BYTES", 10**12)
    whole = parse_response(raw)
    assert isinstance(whole, ParsedResponse) and sizes[-1] > 4_000_000
    assert [r.ttl_seconds for r in sliced.upserts] == [30] * 1_000
    for ours, theirs in zip(sliced.upserts, whole.upserts, strict=True):
        assert_same(ours, theirs)
