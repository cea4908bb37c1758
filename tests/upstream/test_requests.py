"""Requests to the origin split under a size limit, without I/O."""

from __future__ import annotations

import logging

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from hypothesis import given
from hypothesis import strategies as st

from relay.constraints import EMPTY_PARAMS, params_of
from relay.encoding import locator_size, pair_size, text_size
from relay.upstream.requests import (
    MAX_NACK_MESSAGE,
    RequestCutter,
    SubscriptionChange,
    split_requests,
)
from relay.xds_types import ENDPOINT

NODE = base_pb2.Node(id="relay", cluster="xds-relay")


def plain(*names: str) -> dict[str, set[frozenset[tuple[str, str]]]]:
    return {name: {EMPTY_PARAMS} for name in names}


def test_a_change_that_fits_is_one_request_with_the_node() -> None:
    split = split_requests(SubscriptionChange(
        ENDPOINT, subscribe=plain("b", "a"), unsubscribe=plain("c"),
        initial_versions={"a": "1"}), 1 << 20, NODE)
    [request] = split.requests
    assert request == discovery_pb2.DeltaDiscoveryRequest(
        node=NODE, type_url=ENDPOINT, resource_names_subscribe=["a", "b"],
        resource_names_unsubscribe=["c"], initial_resource_versions={"a": "1"})
    assert split.declared == {"a": "1"}


def test_a_large_subscription_is_split_under_the_limit_in_order() -> None:
    names = [f"endpoint-{i:05d}-" + "x" * 80 for i in range(2000)]
    limit = 32 * 1024
    split = split_requests(SubscriptionChange(ENDPOINT, subscribe=plain(*names)), limit, NODE)
    assert len(split.requests) > 5
    assert all(r.ByteSize() <= limit for r in split.requests)
    assert all(r.type_url == ENDPOINT for r in split.requests)
    assert [r.HasField("node") for r in split.requests] == [True] + [False] * (
        len(split.requests) - 1)
    assert [n for r in split.requests for n in r.resource_names_subscribe] == names


def test_initial_versions_go_only_in_the_first_request_and_what_does_not_fit_is_left_out(
) -> None:
    versions = {f"name-{i:04d}": f"version-{i:04d}" for i in range(1000)}
    limit = 16 * 1024
    split = split_requests(SubscriptionChange(
        ENDPOINT, subscribe=plain(*versions), initial_versions=versions), limit)
    first, *rest = split.requests
    assert dict(first.initial_resource_versions) == split.declared
    assert 0 < len(split.declared) < len(versions)
    assert all(versions[name] == v for name, v in split.declared.items())
    assert not any(r.initial_resource_versions for r in rest)
    assert all(r.ByteSize() <= limit for r in split.requests)
    assert sorted(n for r in split.requests for n in r.resource_names_subscribe) == \
        sorted(versions)


def test_wildcard_subscribe_goes_first_and_its_unsubscribe_last() -> None:
    [request] = split_requests(SubscriptionChange(
        ENDPOINT, subscribe=plain("a"), wildcard=True), 1 << 20).requests
    assert list(request.resource_names_subscribe) == ["*", "a"]
    [request] = split_requests(SubscriptionChange(
        ENDPOINT, unsubscribe=plain("a"), wildcard=False), 1 << 20).requests
    assert list(request.resource_names_unsubscribe) == ["a", "*"]


def test_locators_with_parameters_travel_as_resource_locators() -> None:
    params = params_of({"env": "canary"})
    [request] = split_requests(SubscriptionChange(
        ENDPOINT, subscribe={"a": {EMPTY_PARAMS, params}}, unsubscribe={"b": {params}}),
        1 << 20).requests
    assert list(request.resource_names_subscribe) == ["a"]
    assert [(loc.name, dict(loc.dynamic_parameters))
            for loc in request.resource_locators_subscribe] == [("a", {"env": "canary"})]
    assert [(loc.name, dict(loc.dynamic_parameters))
            for loc in request.resource_locators_unsubscribe] == [("b", {"env": "canary"})]


def test_a_locator_too_large_for_any_request_is_left_out_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    huge = "h" * 20_000
    with caplog.at_level(logging.ERROR, "relay.upstream"):
        split = split_requests(SubscriptionChange(ENDPOINT, subscribe=plain("a", huge, "b")),
                               16 * 1024)
    assert [n for r in split.requests for n in r.resource_names_subscribe] == ["a", "b"]
    assert "do not fit in a request to the origin" in caplog.text


def test_the_node_alone_does_not_keep_a_name_from_the_next_request() -> None:
    node = base_pb2.Node(id="relay", cluster="x" * 15_000)
    name = "n" * 2_000
    split = split_requests(SubscriptionChange(ENDPOINT, subscribe=plain(name)), 16 * 1024, node)
    assert [r.HasField("node") for r in split.requests] == [True, False]
    assert list(split.requests[1].resource_names_subscribe) == [name]


def test_the_cutter_puts_the_node_in_the_first_request_of_each_stream_only() -> None:
    cutter = RequestCutter(NODE, 1 << 20)
    ack = cutter.ack(ENDPOINT, "1")
    [subscribe] = cutter.split(SubscriptionChange(ENDPOINT, subscribe=plain("a"))).requests
    assert ack == discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT, response_nonce="1",
                                                      node=NODE)
    assert not subscribe.HasField("node")
    cutter.new_stream()
    [again] = cutter.split(SubscriptionChange(ENDPOINT, subscribe=plain("a"))).requests
    assert again.node == NODE and not cutter.ack(ENDPOINT, "2").HasField("node")


def test_a_nack_gives_its_reason_as_invalid_argument_cut_to_a_readable_size() -> None:
    cutter = RequestCutter(NODE, 1 << 20)
    cutter.new_stream()
    cutter.ack(ENDPOINT, "0")
    nack = cutter.nack(ENDPOINT, "1", "bad resource")
    assert nack == discovery_pb2.DeltaDiscoveryRequest(
        type_url=ENDPOINT, response_nonce="1",
        error_detail={"code": 3, "message": "bad resource"})
    long = cutter.nack(ENDPOINT, "2", "x" * (MAX_NACK_MESSAGE + 1))
    assert long.error_detail.message == "x" * MAX_NACK_MESSAGE + "..."


def test_a_change_that_asks_nothing_is_empty() -> None:
    assert SubscriptionChange(ENDPOINT).is_empty()
    assert not SubscriptionChange(ENDPOINT, wildcard=False).is_empty()
    assert not SubscriptionChange(ENDPOINT, unsubscribe=plain("a")).is_empty()


_text = st.text(max_size=300)


@given(name=_text, params=st.dictionaries(_text, _text, max_size=4))
def test_locator_size_is_what_a_locator_adds_to_a_request(name: str,
                                                          params: dict[str, str]) -> None:
    empty = discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT)
    request = discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT)
    if params:
        request.resource_locators_subscribe.add(name=name, dynamic_parameters=params)
    else:
        request.resource_names_subscribe.append(name)
    added = request.ByteSize() - empty.ByteSize()
    # Empty strings inside a locator are left off the wire: the estimate may
    # count a few bytes more, never fewer.
    assert 0 <= locator_size(name, params.items()) - added <= 2 + 4 * len(params)
    if not params:
        assert locator_size(name, ()) == added == text_size(name)


@given(key=_text, value=_text)
def test_pair_size_bounds_a_map_entry(key: str, value: str) -> None:
    empty = discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT)
    request = discovery_pb2.DeltaDiscoveryRequest(type_url=ENDPOINT,
                                                  initial_resource_versions={key: value})
    added = request.ByteSize() - empty.ByteSize()
    assert 0 <= pair_size(key, value) - added <= 4
