"""The upstream makes the known types' shadow types as it starts.

The first call of :func:`relay.upstream.bulk.shadows` imports every known
type's generated modules and adds a file to the descriptor pool (14-30 ms
for Envoy's types): made as the upstream starts, that is not paid inside the
first big response's check, on a cold client's path.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor

from relay.upstream import bulk
from relay.upstream.responses import ParsedResponse, parse_response
from relay.xds_types import ENDPOINT, KNOWN_TYPE_URLS, message_class
from tests.upstream.test_client_batching import make
from tests.upstream.test_responses_bulk import plain, response


def recording(patch: pytest.MonkeyPatch) -> list[Descriptor | None]:
    """The message types whose shadow types are asked for, in order."""
    asked: list[Descriptor | None] = []
    made = bulk._shadows

    def record(body: Descriptor | None) -> Any:
        asked.append(body)
        return made(body)
    patch.setattr(bulk, "_shadows", record)
    return asked


async def test_the_upstream_makes_every_known_types_shadows_before_it_dials(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked = recording(monkeypatch)
    dials: list[int] = []
    dialled = asyncio.Event()
    client, _, _, _ = make()
    monkeypatch.setattr(client, "_attempt", lambda: _never(dials, len(asked), dialled))
    running = asyncio.create_task(client.run())
    try:
        await asyncio.wait_for(dialled.wait(), 5)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    known = {found.DESCRIPTOR for found in map(message_class, KNOWN_TYPE_URLS)
             if found is not None}
    assert len(known) == len(KNOWN_TYPE_URLS)
    # all of them, before the first stream is opened
    assert set(asked) == known and dials == [len(asked)]


async def _never(dials: list[int], asked: int, dialled: asyncio.Event) -> None:
    """A stream that is never opened, noting how many types were asked for first."""
    dials.append(asked)
    dialled.set()
    await asyncio.Event().wait()


def test_once_made_a_big_responses_check_makes_no_shadow_type() -> None:
    bulk.prepare([ENDPOINT])
    before = bulk._shadows.cache_info()
    checked = parse_response(response([plain(i) for i in range(bulk.BULK_FROM)]))
    after = bulk._shadows.cache_info()
    assert isinstance(checked, ParsedResponse) and checked.plain
    assert (after.misses, after.currsize, after.hits) == (
        before.misses, before.currsize, before.hits + 1)
