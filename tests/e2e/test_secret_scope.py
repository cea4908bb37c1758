"""End to end: Secrets scoped to client identities (server.authorization.secrets)
over mutual TLS with certificates made here, real gRPC and REST clients.

A Secret a client may not have does not exist for it: a delta client is told
it was removed, a SotW client gets nothing of it, a wildcard finds only the
permitted ones, and the relay never asks its origin for one on its behalf.
Without a client certificate (a plaintext port), no Secret at all.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.xds_types import SECRET
from tests.certs import Authority, Leaf, tls_channel
from tests.harness import ADS, ScriptedOrigin, Stack, XdsClient, names_of, node, running_stack

DELTA_ADS = ADS + "DeltaAggregatedResources"
SOTW_ADS = ADS + "StreamAggregatedResources"
FETCH_SECRETS = "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets"
REST_SECRETS = "/v3/discovery:secrets"

APP_CERT = "kubernetes://app/frontend-cert"
APP_KEY = "kubernetes://app/session-key"
PAYMENTS_CERT = "kubernetes://payments/db-cert"
# each workload may have the Secrets of its own namespace, as istiod's gateways
RULES = ("secrets: [{identities: ['spiffe://mesh.test/ns/{namespace}/sa/*'], "
         "names: ['kubernetes://{namespace}/*']}]")


@pytest.fixture
def pki(tmp_path: Path) -> Authority:
    return Authority(tmp_path)


def secrets_origin() -> ScriptedOrigin:
    origin = ScriptedOrigin()
    origin.set(*(secret_pb2.Secret(name=name) for name in (APP_CERT, APP_KEY, PAYMENTS_CERT)))
    return origin


@contextlib.asynccontextmanager
async def mutual_tls_stack(ca: Authority, rules: str = RULES) -> AsyncIterator[Stack]:
    """A relay on mutual TLS (xDS and REST) with ``rules`` for authorization."""
    relay = ca.relay_leaf()
    server = (f"tls: {{cert_file: '{relay.cert_file}', key_file: '{relay.key_file}', "
              f"client_ca_file: '{ca.cert_file}'}}, authorization: {{{rules}}}")
    # (no linger: a client following another into the same wildcard may find
    # it ended, and waits for the origin's answer: see test_wildcard_again)
    async with running_stack(secrets_origin(), server=server,
                             rest='address: "127.0.0.1:0"') as stack:
        yield stack


@contextlib.asynccontextmanager
async def client(stack: Stack, ca: Authority, leaf: Leaf, delta: bool
                 ) -> AsyncIterator[XdsClient]:
    channel = tls_channel(stack.relay.xds_port, ca, leaf)
    stream = XdsClient(channel, DELTA_ADS if delta else SOTW_ADS, delta)
    try:
        yield stream
    finally:
        stream.close()
        await channel.close()


def workload(ca: Authority, namespace: str) -> Leaf:
    return ca.issue(f"{namespace}-workload",
                    spiffe_id=f"spiffe://mesh.test/ns/{namespace}/sa/workload")


def asked_of_origin(stack: Stack) -> set[str]:
    """Every Secret name the relay subscribed to at its origin."""
    return {name for request in stack.origin.subscription_requests()
            if request.type_url == SECRET for name in request.resource_names_subscribe}


async def test_a_delta_client_gets_its_secret_and_another_identity_is_told_it_is_removed(
        pki: Authority) -> None:
    async with mutual_tls_stack(pki) as stack, \
            client(stack, pki, workload(pki, "app"), delta=True) as app, \
            client(stack, pki, workload(pki, "payments"), delta=True) as payments:
        await app.send(node=node("app"), type_url=SECRET, resource_names_subscribe=[APP_CERT])
        got = await app.recv()
        assert names_of(got) == [APP_CERT] and list(got.removed_resources) == []
        await app.ack(got)
        await payments.send(node=node("payments"), type_url=SECRET,
                            resource_names_subscribe=[APP_CERT, "kubernetes://app/x"])
        refused = await payments.recv()
        assert names_of(refused) == []
        assert sorted(refused.removed_resources) == sorted([APP_CERT, "kubernetes://app/x"])
        # One it may have, after: by the time it arrives, the relay has sent
        # its origin every subscription these requests made.
        await payments.ack(refused, resource_names_subscribe=[PAYMENTS_CERT])
        assert names_of(await payments.recv()) == [PAYMENTS_CERT]
        assert asked_of_origin(stack) == {APP_CERT, PAYMENTS_CERT}
        assert set(stack.relay.index.wanted_locators(SECRET)) == {APP_CERT, PAYMENTS_CERT}


async def test_a_sotw_client_gets_only_the_secrets_it_may_have(pki: Authority) -> None:
    async with mutual_tls_stack(pki) as stack, \
            client(stack, pki, workload(pki, "payments"), delta=False) as payments:
        await payments.send(node=node("payments"), type_url=SECRET,
                            resource_names=[APP_CERT, PAYMENTS_CERT])
        got = await payments.recv()
        assert names_of(got) == [PAYMENTS_CERT]
        assert asked_of_origin(stack) == {PAYMENTS_CERT}


async def test_a_wildcard_finds_only_the_secrets_of_the_clients_namespace(
        pki: Authority) -> None:
    async with mutual_tls_stack(pki) as stack:
        async with client(stack, pki, workload(pki, "app"), delta=True) as app:
            await app.send(node=node("app"), type_url=SECRET, resource_names_subscribe=["*"])
            got = await app.recv()
            assert sorted(names_of(got)) == [APP_CERT, APP_KEY]
        async with client(stack, pki, workload(pki, "payments"), delta=False) as payments:
            await payments.send(node=node("payments"), type_url=SECRET, resource_names=["*"])
            assert names_of(await payments.recv()) == [PAYMENTS_CERT]


async def test_a_certificate_no_rule_names_has_no_secret_and_asks_the_origin_for_none(
        pki: Authority) -> None:
    async with mutual_tls_stack(pki) as stack, \
            client(stack, pki, pki.issue("gw", dns=("gw.mesh.test",)), delta=False) as gateway:
        await gateway.send(node=node("gw"), type_url=SECRET, resource_names=["*"])
        # the answer to a wildcard, at once: no Secret is there for it
        assert names_of(await gateway.recv()) == []
        assert not stack.relay.index.wants_wildcard(SECRET)
        assert asked_of_origin(stack) == set()


async def test_a_plaintext_client_gets_no_secret_by_default() -> None:
    async with running_stack(secrets_origin()) as stack:
        delta = stack.client(delta=True)
        await delta.send(node=node("plain"), type_url=SECRET,
                         resource_names_subscribe=[APP_CERT])
        told = await delta.recv()
        assert names_of(told) == [] and list(told.removed_resources) == [APP_CERT]
        sotw = stack.client(delta=False)
        await sotw.send(node=node("plain"), type_url=SECRET, resource_names=["*"])
        assert names_of(await sotw.recv()) == []
        assert asked_of_origin(stack) == set()
        assert not stack.relay.index.wants_wildcard(SECRET)


async def test_with_mutual_tls_and_no_rules_a_certified_client_gets_every_secret(
        pki: Authority) -> None:
    async with mutual_tls_stack(pki, rules="allow: []") as stack, \
            client(stack, pki, workload(pki, "payments"), delta=False) as payments:
        await payments.send(node=node("payments"), type_url=SECRET, resource_names=["*"])
        assert sorted(names_of(await payments.recv())) == [APP_CERT, APP_KEY, PAYMENTS_CERT]


# -- one-shot fetches: REST polling and gRPC Fetch ------------------------------------------


def https_context(ca: Authority, leaf: Leaf) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca.cert_file)
    context.load_cert_chain(leaf.cert_file, leaf.key_file)
    return context


async def rest_poll(stack: Stack, ca: Authority, leaf: Leaf, names: list[str]
                    ) -> tuple[int, list[str]]:
    """A REST poll of Secrets over mutual TLS: the status and the names served."""
    async with aiohttp.ClientSession() as http, http.post(
            f"https://127.0.0.1:{stack.relay.rest_port}{REST_SECRETS}",
            data=json.dumps({"node": {"id": "poller"}, "resourceNames": names}),
            ssl=https_context(ca, leaf),
            headers={"Content-Type": "application/json"}) as response:
        body: dict[str, Any] = json.loads(await response.read())
    return response.status, sorted(r["name"] for r in body.get("resources", []))


async def test_a_rest_poll_gets_only_the_secrets_of_the_pollers_namespace(
        pki: Authority) -> None:
    app, payments = workload(pki, "app"), workload(pki, "payments")
    async with mutual_tls_stack(pki) as stack:
        assert await rest_poll(stack, pki, app, ["*"]) == (200, [APP_CERT, APP_KEY])
        # The same wildcard, another scope: not the other poller's answer.
        assert await rest_poll(stack, pki, payments, ["*"]) == (200, [PAYMENTS_CERT])
        assert await rest_poll(stack, pki, payments, [APP_CERT, PAYMENTS_CERT]) == (
            200, [PAYMENTS_CERT])
        assert await rest_poll(stack, pki, payments, [APP_KEY]) == (200, [])
        assert APP_KEY not in stack.relay.index.wanted_locators(SECRET)


async def test_a_grpc_fetch_gets_only_the_secrets_the_client_may_have(pki: Authority) -> None:
    async with mutual_tls_stack(pki) as stack:
        channel = tls_channel(stack.relay.xds_port, pki, workload(pki, "payments"))
        try:
            fetch = channel.unary_unary(
                FETCH_SECRETS,
                request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
            response = await fetch(discovery_pb2.DiscoveryRequest(
                node=node("payments"), type_url=SECRET,
                resource_names=[APP_CERT, PAYMENTS_CERT]), timeout=5)
            assert names_of(response) == [PAYMENTS_CERT]
        finally:
            await channel.close()


async def test_a_rest_poll_over_plain_http_gets_no_secret() -> None:
    async with running_stack(secrets_origin(), rest='address: "127.0.0.1:0"') as stack, \
            aiohttp.ClientSession() as http, http.post(
                f"http://127.0.0.1:{stack.relay.rest_port}{REST_SECRETS}",
                data=json.dumps({"resourceNames": ["*"]}),
                headers={"Content-Type": "application/json"}) as response:
        assert response.status == 200
        assert json.loads(await response.read()).get("resources", []) == []
        assert asked_of_origin(stack) == set()


async def test_a_client_not_allowed_to_connect_is_refused_before_any_secret(
        pki: Authority) -> None:
    """The secrets rules narrow what an admitted client sees; allow still admits."""
    rules = f"allow: ['spiffe://mesh.test/ns/app/sa/*'], {RULES}"
    async with mutual_tls_stack(pki, rules) as stack, \
            client(stack, pki, workload(pki, "payments"), delta=True) as payments:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await payments.send(node=node("payments"), type_url=SECRET,
                                resource_names_subscribe=[PAYMENTS_CERT])
            await payments.recv()
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
