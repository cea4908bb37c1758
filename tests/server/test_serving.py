"""ServingContext: built whole, then read; its counts change through join and leave."""

from __future__ import annotations

import dataclasses

import pytest

from relay.core import Core
from relay.protocol.limits import Limits
from relay.server.serving import ServingContext, ServingSettings
from relay.server.streams import DownstreamStream
from tests.clock import ManualClock


def context(**settings: object) -> ServingContext:
    return Core.create(settings=ServingSettings(**settings)).serving  # type: ignore[arg-type]


def opened(serving: ServingContext, peer: str) -> DownstreamStream:
    stream = DownstreamStream(serving, "delta", peer)
    serving.join(stream)
    return stream


def test_join_and_leave_count_streams_per_connection_and_per_host() -> None:
    serving = context(limits=Limits(streams_per_host=3, connections_per_host=2))
    first = opened(serving, "ipv4:10.0.0.7:1000")
    second = opened(serving, "ipv4:10.0.0.7:1000")
    third = opened(serving, "ipv4:10.0.0.7:2000")
    assert set(serving.streams) == {first, second, third}
    assert dict(serving.per_connection) == {"ipv4:10.0.0.7:1000": 2, "ipv4:10.0.0.7:2000": 1}
    assert serving.admission_error("ipv4:10.0.0.7:3000") == (
        "streams_per_host", "ipv4:10.0.0.7 has 3 streams open, the most one client host may "
        "(limits.streams_per_host)")
    serving.leave(first)
    serving.leave(second)
    assert set(serving.streams) == {third}
    assert dict(serving.per_connection) == {"ipv4:10.0.0.7:2000": 1}
    # The connection that left is no longer counted against the host.
    opened(serving, "ipv4:10.0.0.7:3000")
    assert serving.admission_error("ipv4:10.0.0.7:4000") == (
        "connections_per_host", "ipv4:10.0.0.7 has 2 connections with streams open, the most "
        "one client host may (limits.connections_per_host)")
    assert serving.admission_error("ipv4:10.0.0.7:2000") is None  # a connection it has


def test_unix_socket_peers_share_no_connection_or_host_count() -> None:
    serving = context(limits=Limits(streams_per_connection=1, streams_per_host=1))
    opened(serving, "unix:/run/hub.sock")
    assert serving.admission_error("unix:/run/hub.sock") is None
    assert dict(serving.per_connection) == {"unix:/run/hub.sock": 1}


def test_a_stream_that_leaves_twice_is_uncounted_once() -> None:
    serving = context()
    stream = opened(serving, "ipv4:10.0.0.7:1000")
    opened(serving, "ipv4:10.0.0.7:1000")
    serving.leave(stream)
    serving.leave(stream)
    assert dict(serving.per_connection) == {"ipv4:10.0.0.7:1000": 1}


def test_the_counts_are_read_only_views_of_the_live_counts() -> None:
    serving = context()
    streams, per_connection = serving.streams, serving.per_connection
    stream = opened(serving, "ipv4:10.0.0.7:1000")
    assert stream in streams and per_connection["ipv4:10.0.0.7:1000"] == 1
    assert per_connection["ipv4:10.0.0.9:1"] == 0  # a connection with none
    assert not hasattr(streams, "add") and not hasattr(streams, "discard")
    with pytest.raises(TypeError):
        per_connection["ipv4:10.0.0.7:1000"] = 5  # type: ignore[index]
    serving.leave(stream)
    assert streams == set() and dict(per_connection) == {}


def test_settings_are_fixed_once_built() -> None:
    serving = context(limits=Limits(streams=1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        serving.settings.limits = Limits()  # type: ignore[misc]
    opened(serving, "ipv4:10.0.0.7:1000")
    assert serving.admission_error("ipv4:10.0.0.8:1") == (
        "streams", "the relay serves 1 streams, its most (limits.streams); "
        "connect to another replica")


def test_draining_starts_through_its_method_and_stays() -> None:
    serving = context()
    assert not serving.draining
    serving.start_draining()
    serving.start_draining()
    assert serving.draining


async def test_waiting_for_idle_ends_when_the_last_stream_leaves() -> None:
    serving, clock = context(), ManualClock()
    assert await serving.wait_idle(clock, 0)
    stream = opened(serving, "ipv4:10.0.0.7:1000")
    assert not await serving.wait_idle(clock, 0)
    serving.leave(stream)
    assert await serving.wait_idle(clock, 0)
