"""UpstreamClient's reading of the origin stream keeps no response once applied.

No network: a call that hands out scripted responses stands in for the stream.
"""

from __future__ import annotations

import asyncio
import gc

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from relay.upstream.dial import Dialer
from relay.upstream.requests import Request
from relay.xds_types import ENDPOINT
from tests.upstream.test_client_batching import make


class ScriptedCall:
    """Hands out ``responses`` (their bytes, as gRPC does), then waits for the
    stream's end until ``end`` is set."""

    def __init__(self, *responses: bytes) -> None:
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
        type_url=ENDPOINT, nonce="n1", removed_resources=[f"e{i}" for i in range(1000)]
    ).SerializeToString()
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
