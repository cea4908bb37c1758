"""A big delta request is applied in pieces, each let go once applied (issue 23).

A client of 100,000 names sends them in one request, which the stream splits
into ~50 pieces applied a turn of the event loop apart: holding the request
and every piece until the last is applied held its names twice, at the peak
of its subscription. Messages take no weak references, so the stream's
reader is driven here with stand-ins that do.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator

import pytest

import relay.server.streams
from relay.core import Core
from relay.server.streams import DownstreamStream


class Stand:
    """A request or a piece of one, whose life a weak reference can follow."""

    def __init__(self, name: str) -> None:
        self.name = name


class Session:
    protocol = "delta"

    def __init__(self) -> None:
        self.checked: list[str] = []

    def check(self, request: Stand) -> None:
        self.checked.append(request.name)

    def has_work(self) -> bool:
        return False


@pytest.mark.parametrize("count", [1, 4])
async def test_the_request_and_each_piece_are_let_go_once_applied(
        monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    stream = DownstreamStream(Core.create().serving, "delta", "ipv4:10.0.0.7:1000")
    requests: list[weakref.ref[Stand]] = []
    pieces: list[weakref.ref[Stand]] = []

    def split(request: Stand) -> tuple[list[Stand], Stand]:
        requests.append(weakref.ref(request))
        made = [Stand(f"piece {i}") for i in range(count)] if count > 1 else [request]
        pieces.extend(weakref.ref(piece) for piece in made)
        return made, request

    alive: list[tuple[str, bool, list[bool]]] = []

    def handle(piece: Stand) -> None:
        alive.append((piece.name, requests[0]() is not None,
                      [ref() is not None for ref in pieces]))

    session = Session()
    monkeypatch.setattr(relay.server.streams, "read_in_pieces", split)
    monkeypatch.setattr(stream, "session", session)
    # (on the class: a stream is slotted)
    monkeypatch.setattr(DownstreamStream, "handle_request",
                        lambda _stream, piece: handle(piece))

    async def sent() -> AsyncIterator[Stand]:
        yield Stand("request")

    await stream._read(sent())  # type: ignore[arg-type]
    if count == 1:
        # Applied as it came, unchecked: the request is its only piece.
        assert session.checked == [] and alive == [("request", True, [True])]
        return
    assert session.checked == ["request"]  # checked whole, before any piece
    assert alive == [(f"piece {i}", False, [False] * i + [True] * (count - i))
                     for i in range(count)]
    assert [ref() for ref in pieces] == [None] * count
