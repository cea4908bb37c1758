"""What an idle stream holds (issue 27 item 3: RSS per idle stream against a
bare gRPC server): a delta stream subscribed to one name, answered and ACKed,
as a fan-out's thousands of streams are between pushes.

Counted in Python objects (tracemalloc) and, for protobuf messages, whether
the stream keeps any of its own: each holds an arena of its own in C (about
1 KiB for a Node), where tracemalloc does not look.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import message

from relay.authorization import Authorizer
from relay.core import Core
from relay.protocol.limits import Limits
from relay.resource import CachedResource
from relay.server.access import ANONYMOUS, Access
from relay.server.serving import ServingContext, ServingSettings
from relay.server.streams import DownstreamStream
from relay.telemetry import new_metrics
from relay.xds_types import ENDPOINT, KNOWN_TYPE_URLS
from tests.builders import endpoints
from tests.server.test_stream_adapter import decoded, put

Delta = discovery_pb2.DeltaDiscoveryRequest

# streams measured together (what one holds is their mean)
STREAMS = 300
# Where a stream's own objects are made: the stream, its session (its
# subscription states and the interest index's entries are counted by their
# own tests), the view and identity it is given.
OWN = ("*/relay/server/streams.py", "*/relay/protocol/session.py",
       "*/relay/protocol/limits.py", "*/relay/server/serving.py", "*/relay/server/access.py",
       "*/relay/authorization.py", "*/relay/protocol/view.py")
# bytes of its own objects one idle delta stream may hold: 1,060 to 1,360 here
# when written (CPython's free lists, which earlier tests fill, hand some
# blocks over unseen); 1,650 before its Node was kept encoded, its type URL
# interned, its per-type times one object, its session slotted and its view
# and identity shared
OWN_BYTES = 1_500


def serving_as_the_relay() -> ServingContext:
    """Streams served as the relay serves them on a plaintext port: the types
    it knows, the authorization rules on (none, so each client is anonymous)."""
    metrics = new_metrics()
    access = Access(Authorizer(), metrics, lambda: 0.0)
    limits = Limits(type_urls=frozenset(KNOWN_TYPE_URLS))
    serving = Core.create(metrics, ServingSettings(limits=limits, access=access)).serving
    put(serving, ENDPOINT, "bench", endpoints("bench", 1))
    return serving


def envoy_node(i: int) -> base_pb2.Node:
    """A Node as an Envoy sends it, metadata and all (most of which is not kept)."""
    node = base_pb2.Node(id=f"sidecar~10.1.{i // 250}.{i % 250}~pod-{i}.ns~ns.svc.cluster.local",
                         cluster="backend", user_agent_name="envoy",
                         user_agent_version="1.31.0",
                         client_features=["envoy.lb.does_not_support_overprovisioning",
                                          "envoy.lrs.supports_send_all_clusters"])
    node.locality.zone = "zone-a"
    node.metadata.update({"NAMESPACE": "ns", "LABELS": {"app": "backend", "version": "v1"}})
    return node


def idle_stream(serving: ServingContext, i: int) -> DownstreamStream:
    """A delta stream that subscribed to ``bench``, was answered and ACKed."""
    stream = DownstreamStream(serving, "delta", f"ipv4:10.1.{i // 250}.{i % 250}:{1024 + i}",
                              identity=ANONYMOUS)
    # the requests as gRPC hands them over: decoded from bytes
    stream.handle_request(Delta.FromString(Delta(
        node=envoy_node(i), type_url=ENDPOINT,
        resource_names_subscribe=["bench"]).SerializeToString()))
    (response,) = decoded(stream)
    assert [r.name for r in response.resources] == ["bench"]
    stream.handle_request(Delta.FromString(Delta(
        type_url=ENDPOINT, response_nonce=response.nonce).SerializeToString()))
    assert list(stream.ready_responses()) == []
    return stream


def own_messages(root: Any, shared: set[int]) -> list[message.Message]:
    """The protobuf messages reachable from ``root`` without going through
    an object in ``shared`` (by id) or a cached resource (the cache's)."""
    seen, found, todo = set(shared), [], [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type | CachedResource):
            continue
        seen.add(id(obj))
        if isinstance(obj, message.Message):
            found.append(obj)
            continue
        todo.extend(gc.get_referents(obj))
        for slot in getattr(type(obj), "__slots__", ()):
            todo.append(getattr(obj, slot, None))
    return found


def test_an_idle_stream_holds_few_objects_of_its_own() -> None:
    serving = serving_as_the_relay()
    idle_stream(serving, STREAMS)  # the first: what all streams share, made once
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        streams = [idle_stream(serving, i) for i in range(STREAMS)]
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert len(streams) == STREAMS
    own = [tracemalloc.Filter(True, pattern) for pattern in OWN]
    stats = after.filter_traces(own).compare_to(before.filter_traces(own), "lineno")
    held = sum(stat.size_diff for stat in stats)
    assert held / STREAMS < OWN_BYTES, f"{held / STREAMS:.0f} bytes a stream: " + ", ".join(
        f"{stat.traceback[0].filename.rsplit('/', 2)[-1]}:{stat.traceback[0].lineno} "
        f"{stat.size_diff / STREAMS:.0f}/{stat.count_diff / STREAMS:.2f}" for stat in stats[:8])


def test_an_idle_stream_keeps_no_protobuf_message_of_its_own() -> None:
    serving = serving_as_the_relay()
    stream = idle_stream(serving, 7)
    shared = {id(serving), id(serving.cache), id(serving.index), id(serving.view),
              id(stream.view)}
    assert own_messages(stream, shared) == []
    # what it keeps of the Node is there when asked for
    node = stream.node
    assert node is not None and node.id == envoy_node(7).id and node.locality.zone == "zone-a"
    assert list(node.client_features) == list(envoy_node(7).client_features)
    assert stream.node_id == envoy_node(7).id
    assert not node.HasField("metadata")


def test_clients_without_a_certificate_share_their_view_and_identity() -> None:
    serving = serving_as_the_relay()
    first, second = idle_stream(serving, 1), idle_stream(serving, 2)
    assert first.view is second.view
    assert serving.anonymous_view is first.view
    # still without the Secrets (no certificate: none of them)
    assert first.view is not serving.view
