"""A cache change reaches every stream holding its names without a copy each.

istiod's push of 50,000 changed endpoints reaches each stream that holds
them in the one step that writes the cache: each stream marked them to look
at by copying the change's names into sets of its own, twice (5-7 ms a
stream here), so a zone of such streams held the event loop for as many
copies. A stream now keeps the change's own frozenset until something else
is marked, and copies it only then. These tests count the memory the marks
take and hold the shared marks to what each stream then sends.
"""

from __future__ import annotations

import gc
import tracemalloc

from envoy.service.discovery.v3 import discovery_pb2

from relay.protocol.session import Session
from tests.protocol.fakes import FakeView

EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest
NAMES = [f"ep-{i:05d}" for i in range(5_000)]
STREAMS = 8


def settled(session: Session, view: FakeView, delta: bool = True) -> Session:
    """``session`` subscribed to NAMES, every response sent and ACKed."""
    if delta:
        session.receive(Delta(type_url=EDS, resource_names_subscribe=NAMES))
    else:
        session.receive(Sotw(type_url=EDS, resource_names=NAMES))
    while plans := session.due(view).responses:
        for plan in plans:
            if delta:
                session.receive(Delta(type_url=EDS, response_nonce=plan.nonce))
            else:
                session.receive(Sotw(type_url=EDS, resource_names=NAMES,
                                     version_info=plan.version_info,
                                     response_nonce=plan.nonce))
    return session


def sent(session: Session, view: FakeView) -> list[tuple[str, str]]:
    """(name, version) of each resource a delta session sends now, in order,
    its responses ACKed one by one."""
    out = []
    while plans := session.due(view).responses:
        for plan in plans:
            out += [(r.name, r.version) for r in plan.resources]
            session.receive(Delta(type_url=EDS, response_nonce=plan.nonce))
    return out


def test_a_change_marked_on_many_streams_takes_no_memory_a_stream() -> None:
    view = FakeView(EDS, dict.fromkeys(NAMES, "1"))
    sessions = [settled(Session("delta"), view) for _ in range(STREAMS)]
    for name in NAMES:
        view.set(name, "2")
    changed = frozenset(NAMES)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for session in sessions:
            assert session.mark_changed(EDS, changed, False) == 0
        marked = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # (a copy of 5,000 names is a set of 256 KiB: two a stream, before)
    assert marked < 1_024 * STREAMS, f"{marked / STREAMS:.0f} bytes a stream"
    for session in sessions:
        assert sent(session, view) == [(name, "2") for name in NAMES]


def test_a_stream_marked_again_sends_both_and_the_others_only_theirs() -> None:
    view = FakeView(EDS, dict.fromkeys(NAMES, "1"))
    first, second, sotw = (settled(Session("delta"), view), settled(Session("delta"), view),
                           settled(Session("sotw"), view, delta=False))
    shared = frozenset(NAMES[:3])
    for name in [*NAMES[:3], NAMES[-1]]:
        view.set(name, "2")
    for session in (first, second, sotw):
        session.mark_changed(EDS, shared, False)
    first.mark_changed(EDS, frozenset({NAMES[-1]}), False)  # (only the first holds it)
    assert shared == frozenset(NAMES[:3])
    assert sent(first, view) == [(name, "2") for name in [*NAMES[:3], NAMES[-1]]]
    assert sent(second, view) == [(name, "2") for name in NAMES[:3]]
    # (endpoints are not a full-state type: SotW sends what changed too)
    [plan] = sotw.due(view).responses
    assert [(r.name, r.version) for r in plan.resources] == [(name, "2") for name in NAMES[:3]]
    assert sent(first, view) == sent(second, view) == []
