"""gRPC method handlers for ADS and the per-type discovery services.

Handlers are registered generically rather than through the generated
servicer classes so that responses can be written as bytes assembled from
pre-encoded resources (the serializer is the identity).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from relay.server.decoding import RequestTooLarge, UndecodableRequest, request_decoder
from relay.server.fetch import Denied, Fetcher, Invalid, Limited, Served
from relay.server.serving import ServingContext
from relay.server.streams import DownstreamStream, XdsProtocol
from relay.xds_types import ADS_SERVICE, PER_TYPE_SERVICES

# The status message of streams refused or closed while the relay drains.
DRAINING = "the relay is draining; connect to another replica"
# ... of a stream past the rate new streams are taken at.
NEW_STREAMS = ("the relay is taking new streams as fast as it may "
               "(limits.new_streams_per_second); retry, or connect to another replica")


def _identity(data: bytes) -> bytes:
    return data


def _stream_handler(serving: ServingContext, protocol: XdsProtocol,
                    fixed_type_url: str | None) -> grpc.RpcMethodHandler:
    request_class: Any = (discovery_pb2.DeltaDiscoveryRequest if protocol == "delta"
                          else discovery_pb2.DiscoveryRequest)

    async def behaviour(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        if serving.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING)
        peer = context.peer()
        refusal = serving.admission_error(peer)
        if refusal is not None:
            limit, message = refusal
            serving.metrics.downstream_limited.add(1, {"limit": limit})
            serving.warn_limited(peer, limit, "refusing stream from %s: %s", peer, message)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        wait = serving.admission_wait(peer)
        if wait is None:
            limit = "new_streams_per_second"
            serving.metrics.downstream_limited.add(1, {"limit": limit})
            serving.warn_limited(peer, limit, "refusing stream from %s: %s", peer, NEW_STREAMS)
            await context.abort(grpc.StatusCode.UNAVAILABLE, NEW_STREAMS)
        elif wait:
            await asyncio.sleep(wait)
        identity = await serving.settings.access.admit(context) \
            if serving.settings.access is not None else None
        stream = DownstreamStream(serving, protocol, peer, fixed_type_url, identity)
        await stream.serve(requests, context)

    return grpc.stream_stream_rpc_method_handler(
        behaviour, request_deserializer=request_decoder(request_class,
                                                        serving.settings.limits.request_size),
        response_serializer=_identity)


def _fetch_handler(serving: ServingContext, fetcher: Fetcher, service: str,
                   method: str, type_url: str) -> grpc.RpcMethodHandler:
    """REST-style one-shot fetch: the current state of the requested resources
    (see :mod:`relay.server.fetch`, which REST polling shares)."""

    # Decoded here, not by gRPC: a unary call's decoding error would end it
    # UNKNOWN, with a traceback in the log.
    decode = request_decoder(discovery_pb2.DiscoveryRequest, serving.settings.limits.request_size)
    path = f"/{service}/{method}"

    async def behaviour(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if serving.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING)
        try:
            request = decode(data)
        except RequestTooLarge as too_large:
            serving.metrics.downstream_limited.add(1, {"limit": too_large.limit})
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(too_large))
        except UndecodableRequest as undecodable:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(undecodable))
        identity = await serving.settings.access.admit(context) \
            if serving.settings.access is not None else None
        outcome = await fetcher.fetch(request, type_url, context.peer(), identity, path)
        if isinstance(outcome, Served):
            return serving.encoder.encode(outcome.plan)
        if isinstance(outcome, Denied):
            assert serving.settings.access is not None
            await serving.settings.access.refuse(context, outcome.reason, outcome.message)
        code = (grpc.StatusCode.INVALID_ARGUMENT if isinstance(outcome, Invalid) else
                grpc.StatusCode.RESOURCE_EXHAUSTED if isinstance(outcome, Limited) else
                grpc.StatusCode.UNAVAILABLE)
        await context.abort(code, outcome.message)
        raise AssertionError("abort returned")  # (it raises)

    return grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=_identity, response_serializer=_identity)


def discovery_handlers(serving: ServingContext, fetcher: Fetcher
                       ) -> list[grpc.GenericRpcHandler]:
    """Handlers for ADS (both variants) and every per-type discovery service;
    ``fetcher`` answers the ``Fetch*`` methods."""
    handlers = [grpc.method_handlers_generic_handler(ADS_SERVICE, {
        "StreamAggregatedResources": _stream_handler(serving, "sotw", None),
        "DeltaAggregatedResources": _stream_handler(serving, "delta", None),
    })]
    for service in PER_TYPE_SERVICES:
        methods: dict[str, grpc.RpcMethodHandler] = {}
        if service.sotw_method:
            methods[service.sotw_method] = _stream_handler(serving, "sotw", service.type_url)
        if service.delta_method:
            methods[service.delta_method] = _stream_handler(serving, "delta", service.type_url)
        if service.fetch_method:
            methods[service.fetch_method] = _fetch_handler(
                serving, fetcher, service.service, service.fetch_method, service.type_url)
        handlers.append(grpc.method_handlers_generic_handler(service.service, methods))
    return handlers

