"""Small builders of xDS messages for tests."""

from __future__ import annotations

import hashlib

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf import any_pb2, message

from relay import xds_types


def pack(msg: message.Message) -> any_pb2.Any:
    body = any_pb2.Any()
    body.Pack(msg)
    return body


def cluster(name: str, timeout_s: int = 1) -> message.Message:
    c = cluster_pb2.Cluster(name=name, type=cluster_pb2.Cluster.EDS)
    c.connect_timeout.seconds = timeout_s
    return c


def endpoints(name: str, *ports: int) -> message.Message:
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    group = cla.endpoints.add()
    for port in ports:
        address = group.lb_endpoints.add().endpoint.address.socket_address
        address.address = "127.0.0.1"
        address.port_value = port
    return cla


def listener(name: str, port: int = 10000) -> message.Message:
    lst = listener_pb2.Listener(name=name)
    lst.address.socket_address.address = "0.0.0.0"
    lst.address.socket_address.port_value = port
    return lst


def route(name: str, cluster_name: str = "c") -> message.Message:
    rc = route_pb2.RouteConfiguration(name=name)
    vh = rc.virtual_hosts.add(name="vh", domains=["*"])
    vh.routes.add().route.cluster = cluster_name
    return rc


def type_url_of(msg: message.Message) -> str:
    return xds_types.TYPE_PREFIX + msg.DESCRIPTOR.full_name


def version_of(msg: message.Message) -> str:
    return hashlib.sha256(msg.SerializeToString(deterministic=True)).hexdigest()[:12]
