"""A worker's config and node, and the port the hub holds for the workers."""

from __future__ import annotations

import socket

import pytest

from relay.config import Address, parse_config
from relay.workers.hub import reserve_port
from relay.workers.worker import worker_config

CONFIG = """
node: {id: relay-zone-a, cluster: edge}
server: {address: "127.0.0.1:0", workers: 4}
upstream: {address: "origin:18000", linger: 5s, backoff: {initial: 2s, max: 60s}}
metrics: {otlp: {endpoint: "http://collector:4318"}}
"""


def test_worker_config_follows_the_hub_under_a_node_id_of_its_own() -> None:
    config = parse_config(CONFIG)
    worker = worker_config(config, 3, 18123)
    assert worker.node.id == "relay-zone-a/worker-3"
    assert worker.node.cluster == "edge"
    assert worker.server.address == Address("127.0.0.1", 18123)
    assert worker.server.workers == 1
    assert worker.upstream.initial_versions == "honoured"  # the hub is a relay
    assert (worker.upstream.backoff.initial, worker.upstream.backoff.max) == (0.05, 1.0)
    assert worker.upstream.linger == 5.0
    assert worker.metrics.otlp is None  # the hub's /metrics has the workers' series
    assert config.node.id == "relay-zone-a"  # the origin still sees this one


def test_worker_config_serves_rest_on_the_port_the_hub_holds() -> None:
    config = parse_config(CONFIG + 'rest: {address: "127.0.0.1:0"}\n')
    assert worker_config(config, 1, 18123, 18080).rest.address == Address("127.0.0.1", 18080)
    assert worker_config(parse_config(CONFIG), 1, 18123, None).rest.address is None


def test_reserved_port_is_shared_with_reuseport_listeners_only() -> None:
    held = reserve_port(Address("127.0.0.1", 0))
    try:
        port = held.getsockname()[1]
        assert port != 0
        # Not listening: a connection finds no one until a worker listens.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        with socket.socket() as worker:
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))
            worker.listen()
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        with socket.socket() as stranger, pytest.raises(OSError):
            stranger.bind(("127.0.0.1", port))
    finally:
        held.close()


def test_reserving_a_port_in_use_names_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            reserve_port(Address("127.0.0.1", port))
