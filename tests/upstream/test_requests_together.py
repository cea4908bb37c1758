"""split_requests: a change of plain names goes in together (sizes summed at
once, each request taking the run that fits it), and so do the initial
versions; the requests are the bytes the name-by-name path makes (and the
same made a few names at a time), and no size is computed per name
(counted)."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.constraints import EMPTY_PARAMS, params_of
from relay.turns import made
from relay.upstream import requests as requests_module
from relay.upstream.requests import SubscriptionChange, split_requests, split_steps
from relay.xds_types import ENDPOINT
from tests.counting import calls_of

NODE = base_pb2.Node(id="relay", cluster="xds-relay")
PLAIN = frozenset({EMPTY_PARAMS})
DEV = params_of({"env": "dev"})


def both(change: SubscriptionChange, limit: int, node: base_pb2.Node | None
         ) -> tuple[list[bytes], list[bytes]]:
    """The requests' bytes, with the whole-set path and without it."""
    together = split_requests(change, limit, node)
    builder = requests_module._Builder
    original = builder.add_names, builder.add_versions
    builder.add_names = lambda *args: False  # type: ignore[method-assign]
    builder.add_versions = builder._add_versions_one_by_one  # type: ignore[method-assign]
    try:
        alone = split_requests(change, limit, node)
    finally:
        builder.add_names, builder.add_versions = original  # type: ignore[method-assign]
    assert together.declared == alone.declared
    return ([r.SerializeToString() for r in together.requests],
            [r.SerializeToString() for r in alone.requests])


NAME = st.one_of(st.text(alphabet="abcxyz-0123456789", max_size=12),
                 st.text(max_size=8),  # (not ASCII, some of them)
                 st.just("n" * 127), st.just("l" * 128), st.just(""))


@settings(max_examples=150, deadline=None)
@given(subscribe=st.lists(NAME, max_size=40), unsubscribe=st.lists(NAME, max_size=10),
       versions=st.dictionaries(NAME, st.one_of(st.text(alphabet="v0123", max_size=6),
                                                st.text(max_size=4)), max_size=12),
       with_params=st.sets(NAME, max_size=2), wildcard=st.sampled_from([None, True, False]),
       limit=st.sampled_from([40, 90, 200, 400, 1 << 20]), node=st.booleans())
def test_names_together_make_the_requests_names_one_by_one_make(
        subscribe: list[str], unsubscribe: list[str], versions: dict[str, str],
        with_params: set[str], wildcard: bool | None, limit: int, node: bool) -> None:
    change = SubscriptionChange(
        ENDPOINT, {n: frozenset({DEV}) if n in with_params else PLAIN for n in subscribe},
        dict.fromkeys(unsubscribe, PLAIN), wildcard=wildcard, initial_versions=versions)
    together, alone = both(change, limit, NODE if node else None)
    assert together == alone
    # made in steps of a few names (a new stream's, see UpstreamState.connect_steps): the same
    split = split_requests(change, limit, NODE if node else None)
    for step in (1, 3):
        stepped = made(split_steps(change, limit, NODE if node else None, step))
        assert [r.SerializeToString() for r in stepped.requests] == together
        assert stepped.declared == split.declared


def test_a_big_clients_names_are_sized_together(monkeypatch: pytest.MonkeyPatch) -> None:
    sized = calls_of(monkeypatch, requests_module, "text_size")
    cuts: list[object] = []
    accumulate = requests_module.itertools.accumulate

    def cut_points(*args: Any) -> Any:
        cuts.append(args)
        return accumulate(*args)

    monkeypatch.setattr(requests_module.itertools, "accumulate", cut_points)
    names = [f"big-{i}" for i in range(10_000)]
    change = SubscriptionChange(ENDPOINT, dict.fromkeys(reversed(names), PLAIN))
    [request] = split_requests(change, 1 << 20, NODE).requests
    assert sized == [] and list(request.resource_names_subscribe) == sorted(names)
    assert cuts == []  # all fit the one request: summed whole, no cut points sought
    # too many for one request: cut where they no longer fit, still together
    several = split_requests(change, 40_000, NODE).requests
    assert len(several) == 3 and sized == [] and len(cuts) == 1
    assert [n for r in several for n in r.resource_names_subscribe] == sorted(names)


def test_a_big_clients_versions_are_sized_together(monkeypatch: pytest.MonkeyPatch) -> None:
    sized = calls_of(monkeypatch, requests_module, "pair_size")
    versions = {f"big-{i}": f"{i:016x}" for i in range(50_000)}
    change = SubscriptionChange(ENDPOINT, dict.fromkeys(versions, PLAIN),
                                initial_versions=versions)
    for limit in (1 << 20, 4 << 20):  # (the relay's default cuts them; a larger one does not)
        split = split_requests(change, limit, NODE)
        assert sized == []
        assert 0 < len(split.declared) <= len(versions)
        assert list(split.declared) == list(versions)[:len(split.declared)]
        assert dict(split.requests[0].initial_resource_versions) == split.declared
        assert all(r.ByteSize() <= limit for r in split.requests)
    assert len(split.declared) == len(versions)
    # one larger than the room left, and smaller ones after it: taken if they fit
    short = {"a" * 60: "1", "b" * 90: "2", "c": "3", "d" * 30: "4", "e" * 40: "5"}
    split = split_requests(SubscriptionChange(ENDPOINT, initial_versions=short), 200)
    assert sized == [] and list(split.declared) == ["a" * 60, "c", "d" * 30]
    together, alone = both(SubscriptionChange(ENDPOINT, initial_versions=short), 200, None)
    assert together == alone and sized != []  # (the reference sizes each)


@pytest.mark.parametrize("node", [None, NODE])
def test_requests_are_cut_where_one_by_one_cuts_them(node: base_pb2.Node | None) -> None:
    names = [f"n{i:03d}" * (1 + i % 3) for i in range(30)]
    unsubscribe = [f"u{i}" for i in range(7)]
    for limit in range(30, 260):  # (every cut point, the node alone too large for some)
        change = SubscriptionChange(ENDPOINT, dict.fromkeys(names, PLAIN),
                                    dict.fromkeys(unsubscribe, PLAIN))
        together, alone = both(change, limit, node)
        assert together == alone, limit
