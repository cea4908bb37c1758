"""Checking an origin response in steps, so that a big one holds up nobody."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.upstream.responses import (
    Checked,
    ParsedResponse,
    Parsing,
    Unusable,
    parse_response,
    parse_steps,
)
from relay.xds_types import ENDPOINT
from tests.builders import endpoints
from tests.stepping import made_in_steps


def response(count: int, broken: int | None = None) -> discovery_pb2.DeltaDiscoveryResponse:
    return discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce="1", resources=[
        discovery_pb2.Resource(name=f"r{i}", version="1", resource=any_pb2.Any(
            type_url=ENDPOINT,
            value=b"\xff" if i == broken else endpoints(f"r{i}", 80).SerializeToString()))
        for i in range(count)])


def stepped(steps: Parsing) -> tuple[Checked, int]:
    """What ``steps`` returns, and how many times it paused on the way."""
    return made_in_steps(steps)


def test_a_response_is_checked_in_steps_and_gives_what_parsing_at_once_gives() -> None:
    message = response(2500)
    parsed, pauses = stepped(parse_steps(message, step=1000))
    # after the response is parsed (but for its resources), and after each
    # slice of 1,000 but the last
    assert pauses == 3
    at_once = parse_response(message)
    assert isinstance(parsed, ParsedResponse) and isinstance(at_once, ParsedResponse)
    assert [(r.name, r.version) for r in parsed.upserts] == \
        [(r.name, r.version) for r in at_once.upserts]


def test_a_bad_resource_after_a_pause_still_makes_the_whole_response_unusable() -> None:
    unusable, pauses = stepped(parse_steps(response(1500, broken=1200), step=1000))
    # The bulk check (a pause before its slices) stops at the slice that
    # does not decode; the check one by one, which says why, starts over
    # and stops at the bad resource.
    assert pauses == 3
    assert isinstance(unusable, Unusable)
    assert (unusable.type_url, unusable.nonce) == (ENDPOINT, "1")
    assert unusable.reason.startswith(f"resource 'r1200' cannot be decoded as {ENDPOINT}: ")


def test_a_response_breaking_a_rule_parses_into_the_reason_to_nack_it() -> None:
    nameless = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce="7")
    nameless.resources.add(version="1")
    assert parse_response(nameless) == Unusable(ENDPOINT, "7", "a resource has no name")
    assert parse_response(discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT)) == \
        Unusable(ENDPOINT, "", "response has no nonce")


def test_a_usable_response_carries_its_type_nonce_removals_and_errors() -> None:
    message = response(1)
    message.removed_resources.append("gone")
    message.resource_errors.add(error_detail={"code": 5, "message": "x"}).resource_name.name = "r9"
    parsed = parse_response(message)
    assert isinstance(parsed, ParsedResponse)
    assert (parsed.type_url, parsed.nonce, parsed.removed) == (ENDPOINT, "1", ["gone"])
    assert [(e.resource_name.name, e.error_detail.message) for e in parsed.errors] == \
        [("r9", "x")]
    assert [r.name for r in parsed.upserts] == ["r0"]
