"""UpstreamState._update: a response whose resources are all subscribed by
their own names (a cold client's) is kept whole, looked up in C; what is
cached and told is what the loop over each resource (collections, aliases,
names not subscribed) gives, and the loop does not run for it (counted)."""

from __future__ import annotations

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.interest import Interest
from relay.upstream import state as state_module
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack
from tests.counting import calls_of
from tests.upstream.test_upstream_state import Sub, make, receive

POOL = "xdstp://auth/envoy.config.endpoint.v3.ClusterLoadAssignment/pool"
NAMES = [f"e{i}" for i in range(40)]


def origin_response(nonce: str, names: list[str],
                    aliases: dict[str, str] | None = None) -> discovery_pb2.DeltaDiscoveryResponse:
    out = discovery_pb2.DeltaDiscoveryResponse(type_url=ENDPOINT, nonce=nonce)
    for name in names:
        added = out.resources.add(name=name, version="1", resource=pack(endpoints(name, 80)))
        if aliases and name in aliases:
            added.aliases.append(aliases[name])
    return out


def played(interest: Interest, responses: list[discovery_pb2.DeltaDiscoveryResponse]
           ) -> list[object]:
    state, index, cache = make()
    index.update(Sub(), ENDPOINT, interest)
    state.on_connect(index, 0.0)
    seen: list[object] = []
    for at, message in enumerate(responses, 1):
        outcome = receive(state, message, index, float(at))
        update = getattr(outcome, "update", None)
        seen.append(None if update is None else sorted(r.name for r in update.upserts))
        seen.append(sorted(cache.names(ENDPOINT)))
    return seen


CASES: dict[str, tuple[Interest, list[discovery_pb2.DeltaDiscoveryResponse]]] = {
    "all subscribed": (Interest(frozenset(NAMES)), [origin_response("1", NAMES)]),
    "some not": (Interest(frozenset(NAMES[:30])), [origin_response("1", NAMES)]),
    "collection members": (Interest(frozenset({f"{POOL}/*", "a"})), [
        origin_response("1", ["a", f"{POOL}/m1", f"{POOL}/m2", *NAMES])]),
    "by alias": (Interest(frozenset({"alias-of-e3", *NAMES[5:]})), [
        origin_response("1", NAMES, {"e3": "alias-of-e3"})]),
    "wildcard": (Interest(frozenset(), wildcard=True), [origin_response("1", NAMES)]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_response_kept_whole_keeps_what_the_loop_keeps(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    interest, responses = CASES[case]
    together = played(interest, responses)
    monkeypatch.setattr(state_module, "_all_subscribed", lambda *args: None)
    assert together == played(interest, responses)


def test_a_cold_clients_response_is_kept_with_no_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    looked = calls_of(monkeypatch, state_module, "in_collection")
    names = [f"big-{i}" for i in range(2_000)]
    assert played(Interest(frozenset(names)), [origin_response("1", names)])[0] == sorted(names)
    assert looked == []
    played(*CASES["some not"])
    assert len(looked) == 10  # (the loop: a name not subscribed is looked for in collections)
