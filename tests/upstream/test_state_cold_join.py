"""UpstreamState: a cold client's names, subscribed a turn at a time and
answered in pieces, give the origin the same requests and the cache the
same answers with the whole-set paths (targets' ``_joining_together`` and
``_subscribe_together``, settling's plain subscribe and ``_move_together``,
the request cutter's ``add_names``) as with the loops alone.

Hypothesis draws the names (some also held with parameters by a second
client), the turns (sets, as the upstream client takes them, or lists), the
origin's pieces and when they come (before the grace or after), linger and
the request size limit, and some names let go and wanted again while the
rest settle; each step's requests (bytes), outcome (what is
kept, what is answered), unanswered names and next deadline must match.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.cache import ResourceCache
from relay.constraints import EMPTY_PARAMS, Locator, Params, params_of
from relay.interest import InterestChange, InterestIndex
from relay.upstream import requests as requests_module
from relay.upstream import settling as settling_module
from relay.upstream import targets as targets_module
from relay.upstream.settling import Settling
from relay.upstream.state import UpstreamState
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack
from tests.upstream.test_upstream_state import Sub, receive

CANARY = params_of({"env": "canary"})


def subscribed_one_by_one(self: Settling, type_url: str,
                          locators: dict[str, Iterable[Params]], now: float) -> None:
    """Settling.subscribed_all as Locators, one at a time."""
    self.subscribed(type_url, [Locator(name, params) for name, params_set in locators.items()
                               for params in params_set], now)


def loops_only(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(targets_module, "_joining_together", lambda *args: None)
    patch.setattr(targets_module, "_subscribe_together", lambda *args: None)
    patch.setattr(settling_module, "_move_together", lambda *args: None)
    patch.setattr(Settling, "subscribed_all", subscribed_one_by_one)
    patch.setattr(requests_module._Builder, "add_names", lambda *args: False)


def origin_answer(nonce: str, names: list[str]) -> discovery_pb2.DeltaDiscoveryResponse:
    out = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce=nonce)
    for name in names:
        out.resources.add(name=name, version="1", resource=pack(endpoints(name, 80)))
    return out


def played(count: int, with_params: int, turn: int, as_sets: bool, pieces: int,
           answered_at: list[float], linger: float, limit: int, churn: int) -> list[Any]:
    names = [f"n{i:03d}" for i in range(count)]
    cache, index = ResourceCache(), InterestIndex()
    state = UpstreamState(base_pb2.Node(id="relay"), cache, linger, max_request_size=limit)
    seen: list[Any] = [state.on_connect(index, 0.0)]
    if with_params:
        index.apply(Sub(), ENDPOINT, InterestChange(added=dict.fromkeys(names[:with_params],
                                                                        CANARY)))
    client = Sub()
    index.apply(client, ENDPOINT, InterestChange(added=dict.fromkeys(names, EMPTY_PARAMS)))
    now = 0.0
    for start in range(0, count, turn):
        now += 0.1
        taken = names[start:start + turn]
        requests = state.on_interest_changed(ENDPOINT, index, now,
                                             set(taken) if as_sets else taken)
        seen.append([r.SerializeToString() for r in requests])
        seen.append((state.unanswered_names(), state.next_deadline()))
    size = -(-count // pieces)
    for number, start in enumerate(range(0, count, size)):
        now += answered_at[number % len(answered_at)]
        outcome = receive(state, origin_answer(str(number), names[start:start + size]),
                          index, now)
        update = outcome.update  # type: ignore[union-attr]
        seen.append([r.SerializeToString() for r in outcome.requests])
        seen.append(None if update is None else (
            [r.name for r in update.upserts], list(update.answered)))
        seen.append((state.unanswered_names(), state.next_deadline()))
        if number == 0 and churn:  # some let go and wanted again while others settle
            for change in (InterestChange(removed=dict.fromkeys(names[:churn], EMPTY_PARAMS)),
                           InterestChange(added=dict.fromkeys(names[:churn], EMPTY_PARAMS))):
                index.apply(client, ENDPOINT, change)
                now += 0.1
                requests = state.on_interest_changed(ENDPOINT, index, now, set(names[:churn]))
                seen.append([r.SerializeToString() for r in requests])
                seen.append((state.unanswered_names(), state.next_deadline()))
    for later in (0.3, 0.6, 1.0):
        requests = state.on_tick(index, now + later)
        seen.append(([r.SerializeToString() for r in requests], state.next_deadline(),
                     sorted(cache.is_answered(ENDPOINT, Locator(name)) for name in names)))
    return seen


@settings(max_examples=120, deadline=None)
@given(count=st.integers(1, 70), with_params=st.sampled_from([0, 0, 3]),
       turn=st.integers(1, 30), as_sets=st.booleans(), pieces=st.integers(1, 4),
       answered_at=st.lists(st.sampled_from([0.05, 0.3, 0.7]), min_size=1, max_size=3),
       linger=st.sampled_from([0.0, 30.0]), limit=st.sampled_from([1 << 20, 200]),
       churn=st.sampled_from([0, 0, 5]))
def test_a_cold_join_asks_and_settles_as_the_loops_do(
        count: int, with_params: int, turn: int, as_sets: bool, pieces: int,
        answered_at: list[float], linger: float, limit: int, churn: int) -> None:
    args = (count, with_params, turn, as_sets, pieces, answered_at, linger, limit, churn)
    together = played(*args)
    with pytest.MonkeyPatch.context() as patch:
        loops_only(patch)
        alone = played(*args)
    assert together == alone
