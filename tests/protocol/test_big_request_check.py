"""Session.check: a big request is checked whole without copying its names
(issue 23: the copy was 7 MB for a client of 100,000 names, at the peak of
its subscription), and refused for any name wherever it is."""

from __future__ import annotations

import tracemalloc

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from relay.protocol.limits import DEFAULT_LIMITS, LimitExceeded
from relay.protocol.outcome import ProtocolError
from relay.protocol.session import Session
from relay.xds_types import CLUSTER, ENDPOINT

Req = discovery_pb2.DeltaDiscoveryRequest


def names(count: int) -> list[str]:
    return [f"cluster-{i:06d}.namespace.svc.cluster.local" for i in range(count)]


def peak_of_check(request: Req) -> int:
    """The most memory a fresh delta session's check of ``request`` allocated."""
    session = Session("delta")
    tracemalloc.start()
    try:
        session.check(request)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_big_request_is_checked_without_a_copy_of_its_names() -> None:
    peak = peak_of_check(Req(type_url=ENDPOINT, resource_names_subscribe=names(50_000)))
    # The names' strings alone are 4.4 MB (89 bytes each): a few thousand
    # at a time are a tenth of that.
    assert peak < 1_000_000


def refusal(session: Session, request: Req) -> str:
    with pytest.raises(ProtocolError) as raised:
        session.check(request)
    return str(raised.value)


@pytest.mark.parametrize("bad", [
    f"xdstp://example.com/{CLUSTER.split('/')[-1]}/of-another-type",  # type
    "xdstp://example.com",  # malformed
])
def test_an_xdstp_name_late_in_a_big_request_refuses_it_as_alone(bad: str) -> None:
    session = Session("delta")
    alone = refusal(session, Req(type_url=ENDPOINT, resource_names_subscribe=[bad]))
    many = names(12_000)
    many[11_000] = bad  # in the third few thousand looked at together
    assert refusal(session, Req(type_url=ENDPOINT, resource_names_subscribe=many)) == alone
    assert refusal(session, Req(type_url=ENDPOINT, resource_names_unsubscribe=many)) == alone
    assert refusal(session, Req(type_url=ENDPOINT, initial_resource_versions=dict.fromkeys(
        many, "1"))) == alone


def test_initial_versions_are_checked_without_a_copy_of_their_names() -> None:
    request = Req(type_url=ENDPOINT, initial_resource_versions=dict.fromkeys(names(50_000), "1"))
    assert peak_of_check(request) < 1_000_000


def test_a_name_too_long_late_in_a_big_request_refuses_it() -> None:
    many = names(12_000)
    many[-1] = "n" * (DEFAULT_LIMITS.name_length + 1)
    with pytest.raises(LimitExceeded) as raised:
        Session("delta").check(Req(type_url=ENDPOINT, resource_names_subscribe=many))
    assert str(raised.value) == (
        f"a resource name has {DEFAULT_LIMITS.name_length + 1} characters; at most "
        f"{DEFAULT_LIMITS.name_length} (limits.name_length)")


class Passes(list[str]):
    """Names that count the passes made over them."""

    passes = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        Passes.passes += 1
        return super().__iter__()


@pytest.mark.parametrize("applied", [False, True])
def test_a_request_s_names_are_measured_in_one_pass(
        monkeypatch: pytest.MonkeyPatch, applied: bool) -> None:
    """The longest name is found once, for the limit on names' lengths and
    the one on what the relay forwards (each pass over a message's field
    makes every string anew): checked, one more pass for xdstp names;
    applied, two in the state (its set, its xdstp names)."""
    subscribing = Session._subscribing

    def counted(self: Session, request: Req, copied: bool = True) -> object:
        names, locators, count = subscribing(self, request, copied)
        return Passes(names), locators, count

    monkeypatch.setattr(Session, "_subscribing", counted)
    session = Session("delta", max_locator_size=4096)
    request = Req(type_url=ENDPOINT, resource_names_subscribe=names(10))
    Passes.passes = 0
    if applied:
        session.receive(request)
    else:
        session.check(request)
    assert Passes.passes == (3 if applied else 2)  # (before: 4 and 3)
