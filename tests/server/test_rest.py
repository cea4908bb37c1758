"""REST polling's decisions, without a server: which path is which type, what
a body means, which reply an outcome gets, who a certificate says it is."""

from __future__ import annotations

import json
from typing import Any

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.service.discovery.v3 import discovery_pb2
from google.api import annotations_pb2
from google.protobuf import any_pb2, descriptor_pool, json_format
from hypothesis import given
from hypothesis import strategies as st

from relay.admin import Reply
from relay.authorization import PeerIdentity
from relay.protocol.sotw import SotwResponsePlan
from relay.resource import CachedResource
from relay.server.fetch import Denied, Invalid, Limited, Served, Unavailable
from relay.server.rest import (
    REST_PATHS,
    BadRequest,
    decode_request,
    peer_identity,
    render_json,
    reply_for,
    route,
)
from relay.xds_types import CLUSTER, LISTENER, PER_TYPE_SERVICES
from tests.builders import cluster, pack

# ----------------------------------------------------------------------------- paths


def test_the_paths_are_the_http_annotations_of_the_fetch_methods() -> None:
    import envoy.service.cluster.v3.cds_pb2
    import envoy.service.endpoint.v3.eds_pb2
    import envoy.service.listener.v3.lds_pb2
    import envoy.service.route.v3.rds_pb2
    import envoy.service.route.v3.srds_pb2
    import envoy.service.runtime.v3.rtds_pb2
    import envoy.service.secret.v3.sds_pb2  # noqa: F401

    pool = descriptor_pool.Default()
    annotated = {}
    for service in PER_TYPE_SERVICES:
        if service.fetch_method is not None:
            method = pool.FindServiceByName(service.service).methods_by_name[
                service.fetch_method]
            http = method.GetOptions().Extensions[annotations_pb2.http]
            annotated[http.post] = service.type_url
    assert dict(REST_PATHS) == annotated


def test_a_known_path_posted_is_its_type() -> None:
    assert route("POST", "/v3/discovery:clusters") == CLUSTER


def test_an_unknown_path_is_404_naming_the_paths() -> None:
    reply = route("POST", "/v2/discovery:clusters")
    assert isinstance(reply, Reply)
    assert (reply.status, reply.body) == (404, (
        b"not found; REST polling is served on /v3/discovery:clusters "
        b"/v3/discovery:endpoints /v3/discovery:listeners /v3/discovery:routes "
        b"/v3/discovery:scoped-routes /v3/discovery:secrets /v3/discovery:runtime\n"))


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT"])
def test_another_method_is_405_allowing_post(method: str) -> None:
    reply = route(method, "/v3/discovery:clusters")
    assert isinstance(reply, Reply)
    assert (reply.status, reply.body, reply.headers) == (
        405, f"{method} is not allowed; POST a JSON DiscoveryRequest\n".encode(),
        {"Allow": "POST"})


# ----------------------------------------------------------------------------- bodies


def test_a_json_discovery_request_is_decoded() -> None:
    request = decode_request(b'{"node": {"id": "n1"}, "resourceNames": ["a", "b"], '
                             b'"type_url": "' + CLUSTER.encode() + b'", "versionInfo": "v"}')
    assert request == discovery_pb2.DiscoveryRequest(
        node={"id": "n1"}, resource_names=["a", "b"], type_url=CLUSTER, version_info="v")


@pytest.mark.parametrize(("body", "message"), [
    (b"", "the body is empty: POST a DiscoveryRequest as a JSON object"),
    (b'{"node": ', "the body is not JSON: Expecting value: line 1 column 10 (char 9)"),
    (b"\xff\xfe\x00", "the body is not JSON: "),
    (b'["a"]', "the body is a JSON array, not an object: POST a DiscoveryRequest as a "
               "JSON object"),
    (b"null", "the body is a JSON null, not an object: POST a DiscoveryRequest as a "
              "JSON object"),
    (b'{"resourceNames": "a"}', "the body is not a DiscoveryRequest: Failed to parse "
                                "resourceNames field: repeated field resourceNames must be "
                                "in [] which is a at DiscoveryRequest."),
    (b'{"resourceNames": ["a"], "hidden": 1}',
     'the body is not a DiscoveryRequest: Message type '
     '"envoy.service.discovery.v3.DiscoveryRequest" has no field named "hidden"'),
    (b"[" * 100_000 + b"]" * 100_000, "the body is not JSON: "),
    (b'{"resourceNames": ["\\ud800"]}', "the body is not a DiscoveryRequest: Failed to "
                                        "parse resourceNames field: Unpaired surrogate"),
])
def test_a_body_that_is_no_discovery_request_says_why(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as error:
        decode_request(body)
    assert str(error.value).startswith(message)
    assert len(str(error.value)) < 1500


# ----------------------------------------------------------------------------- replies


def plan(version: str = "v1", *names: str) -> SotwResponsePlan:
    return SotwResponsePlan(CLUSTER, "7", version, [
        CachedResource.from_message(CLUSTER, pack(cluster(name)), name, "1") for name in names])


def test_a_served_poll_is_200_with_the_json_response_and_no_nonce() -> None:
    reply = reply_for(Served(plan("v1", "a")), "v0")
    assert (reply.status, reply.content_type) == (200, "application/json")
    assert json.loads(reply.body) == {
        "versionInfo": "v1", "typeUrl": CLUSTER,
        "resources": [json_format.MessageToDict(pack(cluster("a")))]}


def test_a_poll_holding_the_version_it_would_get_is_304_with_no_body() -> None:
    assert reply_for(Served(plan("v1", "a")), "v1") == Reply(304, b"")


def test_a_first_poll_with_no_version_is_200_even_for_an_empty_state() -> None:
    assert reply_for(Served(plan("0000000000000000")), "").status == 200


@pytest.mark.parametrize(("outcome", "status", "headers"), [
    (Denied("node_binding", "no"), 403, {}),
    (Invalid("no"), 400, {}),
    (Limited("request_size", "no"), 413, {}),
    (Limited("names_per_request", "no"), 400, {}),
    (Limited("streams", "no"), 429, {"Retry-After": "1"}),
    (Unavailable("no"), 503, {"Retry-After": "1"}),
])
def test_a_refusal_is_its_status_with_the_message(outcome: object, status: int,
                                                  headers: dict[str, str]) -> None:
    reply = reply_for(outcome, "")  # type: ignore[arg-type]
    assert (reply.status, reply.body, reply.headers) == (status, b"no\n", headers)


def test_a_response_of_a_type_no_module_describes_is_500_saying_so() -> None:
    unknown = any_pb2.Any(type_url="type.googleapis.com/example.Unknown", value=b"\x08\x01")
    served = Served(SotwResponsePlan(CLUSTER, "1", "v", [
        CachedResource.from_message(CLUSTER, unknown, "x", "1")]))
    reply = reply_for(served, "")
    assert reply.status == 500
    assert reply.body.startswith(b"the relay cannot write this response as JSON (")
    assert reply.body.endswith(b"poll over gRPC (api_type: GRPC)\n")


def test_a_response_holding_a_corrupt_nested_any_is_500_saying_so() -> None:
    lst = listener_pb2.Listener(name="l")
    lst.filter_chains.add().filters.add(name="hcm").typed_config.CopyFrom(any_pb2.Any(
        type_url="type.googleapis.com/envoy.extensions.filters.network."
                 "http_connection_manager.v3.HttpConnectionManager", value=b"\xff\xff"))
    served = Served(SotwResponsePlan(LISTENER, "1", "v", [
        CachedResource.from_message(LISTENER, pack(lst), "l", "1")]))
    reply = reply_for(served, "")
    assert reply.status == 500
    assert reply.body.startswith(b"the relay cannot write this response as JSON (")


def test_nested_any_types_are_written_as_json() -> None:
    manager = hcm_pb2.HttpConnectionManager(stat_prefix="ingress")
    lst = listener_pb2.Listener(name="l")
    lst.filter_chains.add().filters.add(name="hcm").typed_config.Pack(manager)
    body = json.loads(render_json(SotwResponsePlan(LISTENER, "1", "v", [
        CachedResource.from_message(LISTENER, pack(lst), "l", "1")])))
    typed = body["resources"][0]["filterChains"][0]["filters"][0]["typedConfig"]
    assert typed == {"@type": "type.googleapis.com/envoy.extensions.filters.network."
                              "http_connection_manager.v3.HttpConnectionManager",
                     "statPrefix": "ingress"}


# ----------------------------------------------------------------------------- identity


def test_a_certificate_with_one_spiffe_uri_and_dns_names() -> None:
    cert = {"subjectAltName": (("DNS", "a.test"), ("URI", "spiffe://mesh.test/ns/x/sa/y"),
                               ("DNS", "b.test"), ("IP Address", "10.0.0.1"))}
    assert peer_identity(cert) == PeerIdentity("spiffe://mesh.test/ns/x/sa/y",
                                               ("a.test", "b.test"))


@pytest.mark.parametrize("uris", [
    ("spiffe://mesh.test/a", "spiffe://mesh.test/b"),  # two: neither is taken, as gRPC does
    ("https://mesh.test/a",),
    ("spiffe:///no-trust-domain",),
])
def test_no_spiffe_id_unless_exactly_one_uri_that_is_one(uris: tuple[str, ...]) -> None:
    cert = {"subjectAltName": (*(("URI", uri) for uri in uris), ("DNS", "a.test"))}
    assert peer_identity(cert) == PeerIdentity(None, ("a.test",))


def test_no_certificate_is_no_identity() -> None:
    assert peer_identity(None) == PeerIdentity() == peer_identity({})


_POLL_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.text(),
                         st.lists(st.one_of(st.text(), st.integers()), max_size=4),
                         st.dictionaries(st.sampled_from(["id", "cluster", "hidden"]),
                                         st.one_of(st.text(), st.integers()), max_size=2))


@given(st.dictionaries(
    st.sampled_from(["node", "resourceNames", "typeUrl", "versionInfo", "responseNonce",
                     "resource_names", "errorDetail", "hidden"]),
    _POLL_VALUES, max_size=5))
def test_a_poll_decodes_as_json_format_decodes_it(data: dict[str, Any]) -> None:
    # decode_request skips json_format for the usual fields: it must agree with
    # it on every body, its request or its error
    body = json.dumps(data).encode()
    expected = discovery_pb2.DiscoveryRequest()
    try:
        json_format.ParseDict(data, expected)
    except (json_format.ParseError, ValueError, TypeError) as error:
        with pytest.raises(BadRequest) as refused:
            decode_request(body)
        assert str(refused.value).startswith("the body is not a DiscoveryRequest: "
                                             f"{str(error)[:200]}")
    else:
        assert decode_request(body) == expected
