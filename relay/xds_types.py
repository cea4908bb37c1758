"""xDS resource types the relay knows by name, and the facts it needs about each.

The relay forwards any type URL it is asked for; this table only adds what is
type-specific: which per-type gRPC service serves it, whether an empty first
request means wildcard, whether SotW responses must carry the full state, and
the make-before-break order in which types go out.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from google.protobuf import message, symbol_database

TYPE_PREFIX = "type.googleapis.com/"

LISTENER = TYPE_PREFIX + "envoy.config.listener.v3.Listener"
ROUTE = TYPE_PREFIX + "envoy.config.route.v3.RouteConfiguration"
SCOPED_ROUTE = TYPE_PREFIX + "envoy.config.route.v3.ScopedRouteConfiguration"
VIRTUAL_HOST = TYPE_PREFIX + "envoy.config.route.v3.VirtualHost"
CLUSTER = TYPE_PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT = TYPE_PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
SECRET = TYPE_PREFIX + "envoy.extensions.transport_sockets.tls.v3.Secret"
RUNTIME = TYPE_PREFIX + "envoy.service.runtime.v3.Runtime"

WILDCARD = "*"

# Types for which an empty first subscription means "everything" (legacy
# wildcard). Any other type becomes wildcard only through an explicit "*".
LEGACY_WILDCARD_TYPES = frozenset({LISTENER, CLUSTER})

# SotW responses of these types list every subscribed resource: absence means
# deletion. Other types send only what changed.
FULL_STATE_TYPES = frozenset({LISTENER, CLUSTER})

# Make-before-break: clusters before their endpoints, both before the
# listeners and routes that point at them. Unknown types go after these.
PUSH_ORDER: tuple[str, ...] = (CLUSTER, ENDPOINT, LISTENER, ROUTE, SCOPED_ROUTE, VIRTUAL_HOST,
                               SECRET, RUNTIME)
# Extension configs (ECDS): Envoy's filters fetched on their own.
EXTENSION_CONFIG = TYPE_PREFIX + "envoy.config.core.v3.TypedExtensionConfig"
#: The types a client may ask for without ``server.extra_type_urls``.
KNOWN_TYPE_URLS = frozenset({*PUSH_ORDER, EXTENSION_CONFIG})


@lru_cache(maxsize=256)
def push_rank(type_url: str) -> int:
    """Position of a type in make-before-break order (unknown types last)."""
    try:
        return PUSH_ORDER.index(type_url)
    except ValueError:
        return len(PUSH_ORDER)


@dataclass(frozen=True)
class TypeService:
    """A per-type discovery service (e.g. ``ClusterDiscoveryService``)."""

    service: str          # fully qualified gRPC service name
    type_url: str
    sotw_method: str | None
    delta_method: str | None
    fetch_method: str | None
    abbreviation: str     # what Envoy's docs call it: CDS, EDS, ...


PER_TYPE_SERVICES: tuple[TypeService, ...] = (
    TypeService("envoy.service.listener.v3.ListenerDiscoveryService", LISTENER,
                "StreamListeners", "DeltaListeners", "FetchListeners", "LDS"),
    TypeService("envoy.service.route.v3.RouteDiscoveryService", ROUTE,
                "StreamRoutes", "DeltaRoutes", "FetchRoutes", "RDS"),
    TypeService("envoy.service.route.v3.ScopedRoutesDiscoveryService", SCOPED_ROUTE,
                "StreamScopedRoutes", "DeltaScopedRoutes", "FetchScopedRoutes", "SRDS"),
    TypeService("envoy.service.route.v3.VirtualHostDiscoveryService", VIRTUAL_HOST,
                None, "DeltaVirtualHosts", None, "VHDS"),
    TypeService("envoy.service.cluster.v3.ClusterDiscoveryService", CLUSTER,
                "StreamClusters", "DeltaClusters", "FetchClusters", "CDS"),
    TypeService("envoy.service.endpoint.v3.EndpointDiscoveryService", ENDPOINT,
                "StreamEndpoints", "DeltaEndpoints", "FetchEndpoints", "EDS"),
    TypeService("envoy.service.secret.v3.SecretDiscoveryService", SECRET,
                "StreamSecrets", "DeltaSecrets", "FetchSecrets", "SDS"),
    TypeService("envoy.service.runtime.v3.RuntimeDiscoveryService", RUNTIME,
                "StreamRuntime", "DeltaRuntime", "FetchRuntime", "RTDS"),
)

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"

_imported = False


def _import_known_messages() -> None:
    """Import the generated modules so their messages are in the default pool."""
    global _imported
    if _imported:
        return
    import envoy.config.cluster.v3.cluster_pb2
    import envoy.config.endpoint.v3.endpoint_pb2
    import envoy.config.listener.v3.listener_pb2
    import envoy.config.route.v3.route_components_pb2
    import envoy.config.route.v3.route_pb2
    import envoy.config.route.v3.scoped_route_pb2
    import envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2
    import envoy.extensions.transport_sockets.tls.v3.secret_pb2
    import envoy.service.runtime.v3.rtds_pb2  # noqa: F401

    _imported = True


def message_class(type_url: str) -> type[message.Message] | None:
    """The generated class for a type URL, or None if this process has no such message."""
    _import_known_messages()
    full_name = type_url.rsplit("/", 1)[-1]
    try:
        found: type[message.Message] = symbol_database.Default().GetSymbol(full_name)
        return found
    except KeyError:
        return None


@lru_cache(maxsize=256)
def short_name(type_url: str) -> str:
    """``Cluster`` for ``type.googleapis.com/envoy.config.cluster.v3.Cluster`` (for
    logs and metric labels: on the fan-out path, so known types are looked up)."""
    known = _SHORT_NAMES.get(type_url)
    return known if known is not None else type_url.rsplit(".", 1)[-1]


_SHORT_NAMES = {type_url: type_url.rsplit(".", 1)[-1] for type_url in PUSH_ORDER}
