"""Checking an origin response in steps, so that a big one holds up nobody."""

from __future__ import annotations

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from relay.upstream.responses import UnusableResponse, parse_response, parse_steps
from relay.xds_types import ENDPOINT
from tests.builders import endpoints


def response(count: int, broken: int | None = None) -> discovery_pb2.DeltaDiscoveryResponse:
    return discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce="1", resources=[
        discovery_pb2.Resource(name=f"r{i}", version="1", resource=any_pb2.Any(
            type_url=ENDPOINT,
            value=b"\xff" if i == broken else endpoints(f"r{i}", 80).SerializeToString()))
        for i in range(count)])


def test_a_response_is_checked_in_steps_and_gives_what_parsing_at_once_gives() -> None:
    message = response(2500)
    steps = parse_steps(message, step=1000)
    pauses = 0
    while True:
        try:
            next(steps)
            pauses += 1
        except StopIteration as done:
            parsed = done.value
            break
    assert pauses == 2
    assert [(r.name, r.version) for r in parsed.upserts] == \
        [(r.name, r.version) for r in parse_response(message).upserts]


def test_a_bad_resource_after_a_pause_still_makes_the_whole_response_unusable() -> None:
    steps = parse_steps(response(1500, broken=1200), step=1000)
    next(steps)  # the first thousand are fine
    with pytest.raises(UnusableResponse, match="'r1200' cannot be decoded"):
        next(steps)
