"""A fetch of many names costs what its names do: it is answered a page's
worth of names at a time, never acknowledging pages with the whole request
(which made it N / MAX_NAMES_PER_RESPONSE times N), and the joined answer is
the very response the paged one is. No network; time is a ManualClock."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.cache import Update
from relay.core import Core
from relay.protocol.limits import DEFAULT_LIMITS
from relay.protocol.session import Session
from relay.protocol.subscription import MAX_NAMES_PER_RESPONSE
from relay.resource import CachedResource
from relay.server.fetch import Fetcher, Served
from relay.server.plans import encode_plan
from relay.server.serving import ServingSettings
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack
from tests.clock import ManualClock

COUNT = 3 * MAX_NAMES_PER_RESPONSE + 17


class Up:
    def interest_changed(self, type_url: str, names: Any) -> None:
        pass

    def refetch(self, type_url: str, names: Any) -> None:
        pass


def setup(names: list[str]) -> tuple[Core, Fetcher]:
    clock = ManualClock()
    core = Core.create(settings=ServingSettings(limits=dataclasses.replace(
        DEFAULT_LIMITS, leases_per_host=10)), clock=clock)
    core.index.link(Up())
    core.cache.apply(ENDPOINT, Update([
        CachedResource.from_message(ENDPOINT, pack(endpoints(name, 1 + i % 7)), name, f"v{i}")
        for i, name in enumerate(names)]))
    return core, Fetcher(core.serving, clock, 60.0, 0.0)


def request(names: list[str]) -> discovery_pb2.DiscoveryRequest:
    node = {"id": "n", "client_features": ["xds.config.supports-resource-in-sotw"]}
    return discovery_pb2.DiscoveryRequest(node=node, resource_names=names)


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The names of every request a fetch's sessions receive."""
    counts: list[int] = []
    receive = Session.receive

    def counted(self: Session, request: Any) -> Any:
        counts.append(len(request.resource_names))
        return receive(self, request)

    monkeypatch.setattr(Session, "receive", counted)
    return counts


async def test_a_fetch_of_many_names_receives_each_name_twice_at_most(
        received: list[int]) -> None:
    names = [f"e{i:05d}" for i in range(COUNT)]
    # in no order, a name twice, and names the cache has not
    asked = names[::-1] + names[:3] + ["missing-1", "missing-2"]
    _, fetcher = setup(names)
    outcome = await fetcher.fetch(request(asked), ENDPOINT, "ipv4:127.0.0.1:1")
    assert isinstance(outcome, Served)
    assert [r.name for r in outcome.plan.resources] == names
    # the whole request once, in slices (its limits, its interest), then each name once more;
    # paged, each of the 4 pages was ACKed with all the names
    assert sum(received) == len(asked) + COUNT + 2
    assert max(received[1:]) == MAX_NAMES_PER_RESPONSE


async def test_the_joined_answer_is_the_paged_answer_to_the_byte() -> None:
    names = [f"e{i:05d}" for i in range(COUNT)]
    asked = [*names[::-1], "missing"]
    core, fetcher = setup(names)
    outcome = await fetcher.fetch(request(asked), ENDPOINT, "ipv4:127.0.0.1:1")
    assert isinstance(outcome, Served)
    settings = core.serving.settings
    session = Session("sotw", ENDPOINT, settings.max_locator_size, settings.limits)
    session.receive(request(asked))
    paged = await fetcher._answer(session, core.serving.view, request(asked), many=True)
    assert paged is not None
    assert encode_plan(dataclasses.replace(outcome.plan, nonce="")) == \
        encode_plan(dataclasses.replace(paged, nonce=""))
    assert outcome.plan.version_info == paged.version_info
    # a name the origin said nothing of yet: not the answer to give again
    assert outcome.generation is None


async def test_a_fetch_of_a_page_of_names_or_fewer_is_answered_as_before(
        received: list[int]) -> None:
    names = [f"e{i:05d}" for i in range(MAX_NAMES_PER_RESPONSE)]
    _, fetcher = setup(names)
    outcome = await fetcher.fetch(request(names), ENDPOINT, "ipv4:127.0.0.1:1")
    assert isinstance(outcome, Served)
    assert len(outcome.plan.resources) == MAX_NAMES_PER_RESPONSE
    assert received == [MAX_NAMES_PER_RESPONSE]
