"""UpstreamClient's reading of the origin stream keeps no response once applied.

No network: a call that hands out scripted responses stands in for the stream.
"""

from __future__ import annotations

import asyncio
import gc

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2

import relay.upstream.client as client_module
from relay.upstream.dial import Dialer
from relay.upstream.requests import Request
from relay.upstream.responses import Parsing, parse_steps
from relay.xds_types import ENDPOINT
from tests.upstream.test_client_batching import make
from tests.upstream.test_responses import response


class ScriptedCall:
    """Hands out ``responses``, then waits for the stream's end until ``end`` is set."""

    def __init__(self, *responses: discovery_pb2.DeltaDiscoveryResponse) -> None:
        self.responses = list(responses)
        self.waiting = asyncio.Event()
        self.end = asyncio.Event()

    async def read(self) -> object:
        if self.responses:
            return self.responses.pop(0)
        self.waiting.set()
        await self.end.wait()
        return grpc.aio.EOF


async def test_a_response_applied_is_not_kept_while_the_next_is_awaited() -> None:
    client, _, _, _ = make()
    response = discovery_pb2.DeltaDiscoveryResponse(
        type_url=ENDPOINT, nonce="n1", removed_resources=[f"e{i}" for i in range(1000)])
    call = ScriptedCall(response)
    outbox: asyncio.Queue[Request] = asyncio.Queue()
    stream: grpc.aio.StreamStreamCall = call  # type: ignore[assignment]
    reading = asyncio.create_task(client._read(stream, outbox, Dialer("127.0.0.1:1")))
    await asyncio.wait_for(call.waiting.wait(), 5)
    [ack] = [outbox.get_nowait() for _ in range(outbox.qsize())]
    assert ack.response_nonce == "n1"
    gc.collect()
    # Only the test holds the response (and what it was parsed into is gone).
    assert gc.get_referrers(response) == []
    call.end.set()
    assert await reading is True


async def test_a_stream_woken_during_a_parse_step_runs_before_the_next_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While a big response is checked in steps, a task woken by a timer that
    fell due during a step (a downstream stream whose batch window closed:
    it pushes what the previous response brought) runs before the next step,
    not after two more (by then the response being checked has batched it
    again). Each step asks whether the woken task has run yet."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    ran: list[str] = []

    async def stream() -> None:
        await woken
        ran.append("pushed")

    pushing = asyncio.create_task(stream())
    seen: list[bool] = []

    def steps(response: discovery_pb2.DeltaDiscoveryResponse) -> Parsing:
        checking = parse_steps(response)
        paused = 0
        while True:
            try:
                next(checking)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            seen.append(bool(ran))
            if paused == 0:
                # the batch window's timer falls due during this step
                loop.call_later(0, woken.set_result, None)
            paused += 1
            yield

    monkeypatch.setattr(client_module, "parse_steps", steps)
    client, _, _, _ = make()
    call = ScriptedCall(response(2500))
    outbox: asyncio.Queue[Request] = asyncio.Queue()
    reading = asyncio.create_task(client._read(
        call, outbox, Dialer("127.0.0.1:1")))  # type: ignore[arg-type]
    await asyncio.wait_for(call.waiting.wait(), 5)
    [ack] = [outbox.get_nowait() for _ in range(outbox.qsize())]
    assert not ack.HasField("error_detail"), ack.error_detail
    # paused after encoding, after the fields' check and after the first of
    # three slices: the task woken in the first step has run by the second
    assert seen == [False, True, True, True]
    await pushing
    call.end.set()
    assert await reading is True
