"""A client that subscribes to thousands of cached names in one request gets
them in one response (issue 27, big clients), over delta or SotW.

The stream applies a request of more than ``MAX_NAMES_PER_PIECE`` names in
pieces, a turn of the event loop apart; the request is one change for its
client, so it is answered once the last piece is applied. Answered after the
first piece, a warm client of 6,000 names took two responses (and two ACKs
and round trips) where one does. A SotW client's pages went one per ACK
(2,500 names each: three responses) until they were sent whole as delta's
are.
"""

from __future__ import annotations

from relay.protocol.delta import MAX_NAMES_PER_PIECE
from relay.xds_types import ENDPOINT
from tests.harness import ScriptedOrigin, endpoints, names_of, node, running_stack

NAMES = [f"e{i:05}" for i in range(3 * MAX_NAMES_PER_PIECE)]


async def test_a_warm_client_of_thousands_of_names_gets_them_in_one_response() -> None:
    origin = ScriptedOrigin()
    origin.set(*(endpoints(name, 1) for name in NAMES))
    async with running_stack(origin) as stack:
        # The first client warms the cache (the origin's answer comes in parts).
        first = stack.client()
        await first.send(node=node("warm"), type_url=ENDPOINT, resource_names_subscribe=NAMES)
        got: set[str] = set()
        while len(got) < len(NAMES):
            response = await first.recv(timeout=20)
            got.update(names_of(response))
            await first.ack(response)
        # The second is answered from the cache: all of it, in one response.
        second = stack.client()
        await second.send(node=node("joins"), type_url=ENDPOINT,
                          resource_names_subscribe=NAMES)
        response = await second.recv(timeout=20)
        assert sorted(names_of(response)) == NAMES
        await second.ack(response)
        await second.expect_nothing()


async def test_a_warm_sotw_client_of_thousands_of_names_gets_them_in_one_response() -> None:
    origin = ScriptedOrigin()
    origin.set(*(endpoints(name, 1) for name in NAMES))
    async with running_stack(origin) as stack:
        first = stack.client(delta=False)  # warms the cache, as a SotW client
        await first.send(node=node("warm"), type_url=ENDPOINT, resource_names=NAMES)
        got: set[str] = set()
        while len(got) < len(NAMES):
            response = await first.recv(timeout=20)
            got.update(names_of(response))
            await first.ack(response, resource_names=NAMES)
        second = stack.client(delta=False)
        await second.send(node=node("joins"), type_url=ENDPOINT, resource_names=NAMES)
        response = await second.recv(timeout=20)
        assert sorted(names_of(response)) == NAMES
        await second.ack(response, resource_names=NAMES)
        await second.expect_nothing()
