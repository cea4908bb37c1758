"""What a stream does per response it writes (``DownstreamStream._sent``):
the push counter and latency, and the encoding. A push of one resource, each
stream's share of a fan-out, finds its newest receive time without a pass
over the resources; a response of many takes one pass. Counted, not timed."""

from __future__ import annotations

import operator

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import Update
from relay.core import Core
from relay.resource import CachedResource
from relay.server import streams
from relay.server.streams import DownstreamStream
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack

Delta = discovery_pb2.DeltaDiscoveryRequest
Response = discovery_pb2.DeltaDiscoveryResponse


def put(core: Core, names: list[str], version: str) -> None:
    core.cache.apply(ENDPOINT, Update([
        CachedResource.from_message(ENDPOINT, pack(endpoints(name, 80)), name, version)
        for name in names]))


def written(stream: DownstreamStream) -> list[Response]:
    """The responses due, each ACKed."""
    out = [Response.FromString(raw) for raw in stream.ready_responses()]
    for response in out:
        stream.handle_request(Delta(type_url=ENDPOINT, response_nonce=response.nonce))
    return out


def pushes_recorded(core: Core) -> int:
    histogram = core.serving.metrics.push_latency
    return sum(sum(counts) for counts in histogram._counts.values())


def test_a_push_of_one_resource_takes_no_pass_for_its_receive_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core = Core.create()
    put(core, ["a", "b"], "1")
    stream = DownstreamStream(core.serving, "delta", "ipv4:127.0.0.1:1")
    stream.handle_request(Delta(type_url=ENDPOINT, resource_names_subscribe=["a", "b"]))
    assert [len(r.resources) for r in written(stream)] == [2]
    read: list[CachedResource] = []
    received = operator.attrgetter("received")

    def counting(resource: CachedResource) -> float:
        read.append(resource)
        value: float = received(resource)
        return value

    monkeypatch.setattr(streams, "_RECEIVED", counting)
    before = pushes_recorded(core)
    put(core, ["a"], "2")
    stream.resources_changed(ENDPOINT, frozenset(["a"]), False)
    [push] = written(stream)
    assert [r.version for r in push.resources] == ["2"]
    assert read == [] and pushes_recorded(core) == before + 1
    put(core, ["a", "b"], "3")
    stream.resources_changed(ENDPOINT, frozenset(["a", "b"]), False)
    [push] = written(stream)
    assert len(push.resources) == 2 and len(read) == 2  # one pass
    assert pushes_recorded(core) == before + 2
