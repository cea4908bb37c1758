"""The gRPC ecosystem services served beside xDS on the same port.

* ``grpc.health.v1.Health``: ``""`` (what Kubernetes gRPC probes ask) is
  SERVING while the process serves, every xDS service once the relay has
  synced with its origin; all NOT_SERVING once it drains;
* server reflection, so that ``grpcurl`` and friends can list and call them;
* CSDS (``envoy.service.status.v3.ClientStatusDiscoveryService``): what each
  connected client holds, computed by :mod:`relay.server.status`; with node
  groups each client is compared with its group's cache, and its
  ``client_scope`` is its group's id (see :func:`grouped_client_status`);
* LRS (``envoy.service.load_stats.v3.LoadReportingService``): load reports
  forwarded to the origins, by :mod:`relay.server.load_reports`.

CSDS and reflection tell a caller about every client, so they answer only
peers allowed to debug (``server.authorization.debug``, and processes on the
relay's host): see :meth:`relay.server.access.Access.admit_debug`.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import TYPE_CHECKING

import grpc
from envoy.service.status.v3 import csds_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from relay.server.load_reports import LRS_SERVICE, load_report_handlers
from relay.server.serving import ServingContext
from relay.server.status import UnsupportedMatcher, client_config, client_status, node_predicate
from relay.xds_types import ADS_SERVICE, PER_TYPE_SERVICES

if TYPE_CHECKING:
    from relay.upstream.origins import Origins

CSDS_SERVICE = "envoy.service.status.v3.ClientStatusDiscoveryService"
HEALTH_SERVICE = "grpc.health.v1.Health"
REFLECTION_SERVICE: str = reflection.SERVICE_NAME

# The services whose health is reported by name, besides the overall "".
XDS_SERVICES: tuple[str, ...] = (ADS_SERVICE, *(s.service for s in PER_TYPE_SERVICES))


def served_services() -> list[str]:
    """Every gRPC service on the xDS port, sorted: what reflection lists."""
    return sorted({*XDS_SERVICES, CSDS_SERVICE, HEALTH_SERVICE, REFLECTION_SERVICE,
                   LRS_SERVICE})


class Health:
    """The relay's ``grpc.health.v1.Health`` statuses.

    Overall (``""``, what Kubernetes gRPC probes ask by default) is SERVING as
    soon as the server runs: the process is alive. The xDS services turn
    SERVING with :meth:`set_ready`, once the relay has synced with its origin,
    as ``/ready`` does. :meth:`set_not_serving` turns every status NOT_SERVING
    for good (the drain).
    """

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()

    async def set_started(self) -> None:
        await self.servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        for service in XDS_SERVICES:
            await self.servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def set_ready(self) -> None:
        for service in XDS_SERVICES:
            await self.servicer.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def set_not_serving(self) -> None:
        """Every status NOT_SERVING, and later :meth:`set_ready` calls ignored."""
        await self.servicer.enter_graceful_shutdown()


class _Reflection(reflection.aio.ReflectionServicer):  # type: ignore[misc]
    """Server reflection for peers allowed to debug."""

    def __init__(self, serving: ServingContext) -> None:
        super().__init__(served_services())
        self._serving = serving

    async def ServerReflectionInfo(
            self, request_iterator: AsyncIterable[reflection_pb2.ServerReflectionRequest],
            context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[reflection_pb2.ServerReflectionResponse]:
        access = self._serving.settings.access
        if access is not None:
            await access.admit_debug(context)
        async for response in super().ServerReflectionInfo(request_iterator, context):
            yield response


def grouped_client_status(request: csds_pb2.ClientStatusRequest,
                          serving: ServingContext) -> csds_pb2.ClientStatusResponse:
    """CSDS with node groups: each selected stream's ClientConfig against the
    cache of its group (where its resources are), ``client_scope`` its group's
    id (as ``/clients``, ``/origins`` and the origin label name it).

    ``client_scope`` rather than node metadata: ``node`` stays the node the
    client sent, as without groups, and ``client_scope`` is the field CSDS
    has for the scope (here: the group's origin streams and cache) the
    config is used in. Raises :class:`UnsupportedMatcher` as
    :func:`client_status` does.
    """
    selected = node_predicate(request.node_matchers)
    contents = not request.exclude_resource_contents
    chosen = sorted(((stream.session.snapshot(), stream) for stream in list(serving.streams)),
                    key=lambda item: (item[0].node_id, item[1].peer))
    configs = []
    for snapshot, stream in chosen:
        if not selected(snapshot.node):
            continue
        config = client_config(snapshot, stream.cache, contents)
        if stream.group is not None:
            config.client_scope = stream.group.id
        configs.append(config)
    return csds_pb2.ClientStatusResponse(config=configs)


def _csds_handlers(serving: ServingContext) -> grpc.GenericRpcHandler:
    async def answer(request: csds_pb2.ClientStatusRequest,
                     context: grpc.aio.ServicerContext) -> csds_pb2.ClientStatusResponse:
        try:
            if serving.settings.groups is not None:
                return grouped_client_status(request, serving)
            return client_status(request, serving.snapshots(), serving.cache)
        except UnsupportedMatcher as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            raise  # abort raises; this only tells the type checker

    async def stream(requests: AsyncIterator[csds_pb2.ClientStatusRequest],
                     context: grpc.aio.ServicerContext) -> None:
        if serving.settings.access is not None:
            await serving.settings.access.admit_debug(context)
        async for request in requests:
            await context.write(await answer(request, context))

    async def fetch(request: csds_pb2.ClientStatusRequest,
                    context: grpc.aio.ServicerContext) -> csds_pb2.ClientStatusResponse:
        if serving.settings.access is not None:
            await serving.settings.access.admit_debug(context)
        return await answer(request, context)

    serialize = csds_pb2.ClientStatusResponse.SerializeToString
    deserialize = csds_pb2.ClientStatusRequest.FromString
    return grpc.method_handlers_generic_handler(CSDS_SERVICE, {
        "FetchClientStatus": grpc.unary_unary_rpc_method_handler(
            fetch, request_deserializer=deserialize, response_serializer=serialize),
        "StreamClientStatus": grpc.stream_stream_rpc_method_handler(
            stream, request_deserializer=deserialize, response_serializer=serialize),
    })


def _import_service_descriptors() -> None:
    """Load the xDS service definitions, so that reflection can describe them."""
    import envoy.service.cluster.v3.cds_pb2
    import envoy.service.discovery.v3.ads_pb2
    import envoy.service.endpoint.v3.eds_pb2
    import envoy.service.listener.v3.lds_pb2
    import envoy.service.load_stats.v3.lrs_pb2
    import envoy.service.route.v3.rds_pb2
    import envoy.service.route.v3.srds_pb2
    import envoy.service.runtime.v3.rtds_pb2
    import envoy.service.secret.v3.sds_pb2  # noqa: F401


async def add_ecosystem_services(server: grpc.aio.Server, serving: ServingContext,
                                 health_status: Health, origins: Origins | None = None) -> None:
    """Register health, reflection, CSDS and LRS (forwarded to ``origins``; None:
    refused) on ``server``; report the process up."""
    health_pb2_grpc.add_HealthServicer_to_server(health_status.servicer, server)
    server.add_generic_rpc_handlers([_csds_handlers(serving),
                                     load_report_handlers(serving, origins)])
    _import_service_descriptors()
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(_Reflection(serving), server)
    await health_status.set_started()
