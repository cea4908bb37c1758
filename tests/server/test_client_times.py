"""When, in /clients: a stream's start and its client's last ACK and NACK
(Unix seconds), per stream and per type; and the list built one client at a time."""

from __future__ import annotations

import time

from google.rpc import status_pb2

from relay.xds_types import CLUSTER, ENDPOINT
from tests.builders import cluster, endpoints
from tests.server.test_status import Sotw, open_stream, put, send, sent, serving


def test_a_stream_says_when_it_connected_and_was_last_acked_and_nacked_per_type() -> None:
    before = time.time()
    ctx = serving()
    put(ctx, cluster("a"), "1")
    put(ctx, endpoints("a", 1), "1")
    stream = open_stream(ctx, "sotw")
    send(stream, Sotw(type_url=CLUSTER, resource_names=["a"]))
    [clusters] = sent(stream)
    [listed] = ctx.client_statuses()
    assert (listed["acked_at"], listed["nacked_at"]) == (None, None)
    assert (listed["types"][CLUSTER]["acked_at"], listed["types"][CLUSTER]["nacked_at"]) == (
        None, None)

    send(stream, Sotw(type_url=CLUSTER, resource_names=["a"], response_nonce=clusters.nonce,
                      version_info=clusters.version_info))
    acked = time.time()
    send(stream, Sotw(type_url=ENDPOINT, resource_names=["a"]))
    [eds] = sent(stream)
    send(stream, Sotw(type_url=ENDPOINT, resource_names=["a"], response_nonce=eds.nonce,
                      error_detail=status_pb2.Status(code=3, message="bad port")))
    after = time.time()

    [listed] = ctx.client_statuses()
    cds, eds_state = listed["types"][CLUSTER], listed["types"][ENDPOINT]
    assert before <= listed["connected_since"] <= cds["acked_at"] <= acked
    assert acked <= eds_state["nacked_at"] <= after
    assert (cds["nacked_at"], eds_state["acked_at"]) == (None, None)
    assert (listed["acked_at"], listed["nacked_at"]) == (cds["acked_at"], eds_state["nacked_at"])
    assert list(listed) == ["node_id", "peer", "protocol", "service", "connected_since",
                            "acked_at", "nacked_at", "types"]


def test_the_client_list_is_built_as_it_is_taken() -> None:
    ctx = serving()
    put(ctx, cluster("a"), "1")
    first, second = open_stream(ctx, "sotw", "n1"), open_stream(ctx, "sotw", "n2")
    for stream in (first, second):
        send(stream, Sotw(type_url=CLUSTER, resource_names=["a"]))
    clients = ctx.iter_client_statuses()
    assert next(clients)["node_id"] == "n1"
    # n2 answers between the two: its entry, built after, has the ACK
    [response] = sent(second)
    send(second, Sotw(type_url=CLUSTER, resource_names=["a"], response_nonce=response.nonce,
                      version_info=response.version_info))
    listed = next(clients)
    assert (listed["node_id"], listed["types"][CLUSTER]["sync"]) == ("n2", "synced")
    assert list(clients) == []
