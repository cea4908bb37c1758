"""What an idle stream served through gRPC holds of the relay's own (issue 27
item 3: RSS per idle stream against a bare ``grpc.aio`` server).

:mod:`tests.server.test_idle_stream_memory` counts a stream's objects made
by hand; this counts what serving it adds: the handler's coroutines, the
reader's task, what waits for a wake. Blocks count as much as bytes: the
relay runs on glibc's malloc (:mod:`relay.memory`), where each block costs
16 to 24 bytes more than its size.
"""

from __future__ import annotations

import gc
import inspect
import tracemalloc

from relay.server.streams import DownstreamStream
from relay.xds_types import ENDPOINT
from tests.builders import endpoints
from tests.harness import Stack, eventually, node, running_stack

# streams measured together (what one holds is their mean); on one connection
# (limits.streams_per_connection is 100), so gRPC's own connections stay out
STREAMS = 60
# what serving adds of its own code's objects
SERVING = ("*/relay/server/streams.py", "*/relay/server/services.py")


def grpc_reading() -> tracemalloc.Filter:
    """Leaves out what gRPC makes to read requests (its receiver's generator
    and read operations, ~1.4 KiB here, the bare server's as much), which
    tracemalloc charges to the stream's ``async for``."""
    lines, first = inspect.getsourcelines(DownstreamStream._read)
    (at,) = [first + i for i, line in enumerate(lines) if "async for request in" in line]
    return tracemalloc.Filter(False, inspect.getfile(DownstreamStream), at)

# per idle stream: 10 blocks and 1,130 bytes here when written; 17 blocks and
# 1,690 bytes before gRPC's cancellation of the handler ended a stream whose
# call ended (a done callback on the call did, through a weak reference) and
# before the wait for a wake was awaited in place (a coroutine of its own)
SERVING_BLOCKS = 12
SERVING_BYTES = 1_300


async def idle_streams(stack: Stack, first: int, count: int) -> None:
    """``count`` delta streams subscribed to ``bench``, answered and ACKed."""
    clients = [stack.client() for _ in range(count)]
    for i, client in enumerate(clients, first):
        await client.send(node=node(f"idle-{i}"), type_url=ENDPOINT,
                          resource_names_subscribe=["bench"])
    for client in clients:
        await client.ack(await client.recv())

    def all_acked() -> bool:
        streams = stack.relay.serving.streams
        return len(streams) == first + count and all(
            stream.times().latest()[0] is not None for stream in streams)

    await eventually(all_acked)


async def test_a_served_idle_stream_holds_few_blocks_of_the_relays_own() -> None:
    async with running_stack(limits="streams_per_host: 1000") as stack:
        stack.origin.set(endpoints("bench", 1))
        await idle_streams(stack, 0, 1)  # the first: cached, and what all share
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            await idle_streams(stack, 1, STREAMS)
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    own = [*(tracemalloc.Filter(True, pattern) for pattern in SERVING), grpc_reading()]
    stats = after.filter_traces(own).compare_to(before.filter_traces(own), "lineno")
    blocks = sum(stat.count_diff for stat in stats) / STREAMS
    held = sum(stat.size_diff for stat in stats) / STREAMS
    shown = ", ".join(f"{stat.traceback[0].filename.rsplit('/', 1)[-1]}:"
                      f"{stat.traceback[0].lineno} {stat.size_diff / STREAMS:.0f}/"
                      f"{stat.count_diff / STREAMS:.2f}" for stat in stats[:10])
    assert blocks < SERVING_BLOCKS, f"{blocks:.1f} blocks a stream: {shown}"
    assert held < SERVING_BYTES, f"{held:.0f} bytes a stream: {shown}"
