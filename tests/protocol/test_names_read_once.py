"""A big delta request's subscribed names are read out of the message once
(read_in_pieces): the whole request's check and each piece's receive use
that list, where the check (twice), the split and each receive each made
every string anew; and the session comes out the same as from
split_request's pieces."""

from __future__ import annotations

from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.protocol.delta import read_in_pieces, split_request
from relay.protocol.session import Received, Session
from relay.xds_types import CLUSTER

Req = discovery_pb2.DeltaDiscoveryRequest


class CountedNames:
    """A message's ``resource_names_subscribe`` that counts each read of its strings."""

    def __init__(self, owner: Counting, names: Any) -> None:
        self._owner, self._names = owner, names

    def __len__(self) -> int:
        return len(self._names)

    def __bool__(self) -> bool:
        return bool(self._names)

    def __iter__(self) -> Any:
        self._owner.reads += 1
        return iter(self._names)

    def __getitem__(self, index: Any) -> Any:
        self._owner.reads += 1
        return self._names[index]


class Counting:
    """A request whose subscribed names count how often they are read."""

    def __init__(self, message: Req) -> None:
        self._message, self.reads = message, 0

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._message, name)
        return CountedNames(self, value) if name == "resource_names_subscribe" else value


def big_request() -> Req:
    return Req(type_url=CLUSTER, node=base_pb2.Node(id="n"),
               resource_names_subscribe=[f"c-{i:05d}" for i in range(5_000)],
               resource_names_unsubscribe=["gone"])


def test_the_names_are_read_once_for_the_check_and_every_piece() -> None:
    request = Counting(big_request())
    pieces, whole = read_in_pieces(request, 2_000)  # type: ignore[arg-type]
    session = Session("delta")
    session.check(whole)
    for piece in pieces:
        session.receive(piece)
    assert request.reads == 1 and len(pieces) == 3
    assert session.snapshot().types[0].subscribed == tuple(sorted(big_request().
                                                                  resource_names_subscribe))


def test_the_check_of_the_message_itself_reads_them_again() -> None:
    # (what the count above would see without the one read)
    request = Counting(big_request())
    Session("delta").check(request)  # type: ignore[arg-type]
    assert request.reads == 2


def test_a_request_within_the_limit_is_its_own_piece() -> None:
    request = Req(type_url=CLUSTER, resource_names_subscribe=["a", "b"])
    pieces, whole = read_in_pieces(request, 2_000)
    assert pieces == [request] and whole is request


def applied(session: Session, request: Req, pieces: list[Any], whole: Any
            ) -> tuple[str, list[Received]] | tuple[str, str]:
    try:
        session.check(whole)
        return "applied", [session.receive(piece) for piece in pieces]
    except Exception as error:  # (the refusal is what is compared)
        return type(error).__name__, str(error)


_NAMES = st.sampled_from(["a", "b", "c", "d", "*", "xdstp://au/envoy.config.cluster.v3.Cluster/x",
                          "xdstp://au/envoy.config.cluster.v3.Cluster/x?b=1&a=2",
                          "xdstp://au/envoy.config.cluster.v3.Cluster/g/*",
                          "xdstp://au/envoy.config.listener.v3.Listener/l",
                          "xdstp://bad authority/t/x", "n" * 300])


@settings(max_examples=150, deadline=None)
@given(subscribe=st.lists(_NAMES, max_size=12), unsubscribe=st.lists(_NAMES, max_size=4),
       locators=st.lists(_NAMES, max_size=4), held=st.dictionaries(_NAMES, st.just("1"),
                                                                   max_size=3),
       limit=st.integers(1, 5), node=st.booleans())
def test_pieces_read_once_do_what_split_pieces_do(subscribe: list[str], unsubscribe: list[str],
                                                  locators: list[str], held: dict[str, str],
                                                  limit: int, node: bool) -> None:
    request = Req(type_url=CLUSTER, resource_names_subscribe=subscribe,
                  resource_names_unsubscribe=unsubscribe, initial_resource_versions=held,
                  resource_locators_subscribe=[discovery_pb2.ResourceLocator(name=name)
                                               for name in locators],
                  response_nonce="x")
    if node:
        request.node.id = "n"
    general, fast = Session("delta", max_locator_size=250), Session("delta",
                                                                     max_locator_size=250)
    pieces, whole = read_in_pieces(request, limit)
    assert applied(fast, request, pieces, whole) == \
        applied(general, request, split_request(request, limit), request)
    assert fast.snapshot() == general.snapshot()
