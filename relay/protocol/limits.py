"""What one client may ask of the relay, and how much of what it says is kept.

Every limit has a config key (``limits.*``) named in the error that enforces
it, so that a client's operator can tell what to change, and the relay's
operator what to raise. Client-supplied text the relay keeps or shows (NACK
messages, node ids, names in logs) is cut to :data:`MAX_SHOWN` characters:
what a client sends never decides how large a log line or a view grows.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from envoy.config.core.v3 import base_pb2

from relay.protocol.outcome import ProtocolError

__all__ = ["DEFAULT_LIMITS", "LIMITED_REASONS", "MAX_NACK_MESSAGE", "MAX_SHOWN", "NUMBERED_LIMITS",
           "ORIGIN_REFUSED", "LimitExceeded", "Limits", "kept_node", "shown"]

#: The most characters of a client's text that a log line, /clients or CSDS shows.
MAX_SHOWN = 256
#: ... except a NACK's message, which says what the client found wrong.
MAX_NACK_MESSAGE = 1024


class LimitExceeded(ProtocolError):
    """A request beyond one of ``limits.*``; ``limit`` is the key's last part."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Limits:
    """What clients may ask (``limits.*``; these defaults are the config's)."""

    streams: int = 100_000
    streams_per_connection: int = 100
    # Per client host (its address; every port, every connection): what one
    # machine may hold of a process that serves a whole zone.
    streams_per_host: int = 1_000
    connections_per_host: int = 100
    # How fast new streams are taken (a token bucket; see relay.admission):
    # about a fifth of what one process took of small wildcard streams here
    # (2,000-2,800 a second), leaving room for larger answers and pushes.
    new_streams_per_second: int = 500
    new_streams_burst: int = 1_000
    # REST polls and gRPC fetches: the resource sets one client host keeps
    # subscribed at once (rest.lease after each poll).
    leases_per_host: int = 100
    request_size: int = 16 * 1024 * 1024
    names_per_request: int = 100_000
    names_per_stream: int = 200_000
    name_length: int = 4_096
    node_size: int = 64 * 1024
    dynamic_parameters: int = 64
    # Names clients make the relay subscribe on its origin stream, all types:
    # in all, and of one client host. A default relay accepts names_per_stream
    # on one stream, so a relay chained to another stays below what it accepts.
    upstream_names: int = 200_000
    upstream_names_per_host: int = 100_000
    # Load report streams forwarded to the origins at once (each holds a
    # stream to every origin; see relay.server.load_reports).
    load_report_streams: int = 10_000
    # the type URLs a stream may ask for (None: any)
    type_urls: frozenset[str] | None = None


DEFAULT_LIMITS = Limits()
#: The limits that are numbers (a count or a size in bytes), by their key's last part.
NUMBERED_LIMITS = tuple(f.name for f in fields(Limits) if isinstance(f.default, int))
#: The ``limit`` of a subscription to a name the origin refused lately (see relay.demand).
ORIGIN_REFUSED = "origin"
#: What ``xds_relay_downstream_limited_streams_total{limit}`` counts: every
#: numbered limit a client can pass (a burst size is not one), and the origin's
#: refusals.
LIMITED_REASONS = (*(name for name in NUMBERED_LIMITS if name != "new_streams_burst"),
                   ORIGIN_REFUSED)


def shown(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def kept_node(node: base_pb2.Node) -> base_pb2.Node:
    """What a stream keeps of its client's Node: who it is (id, cluster,
    locality, user agent; an id or cluster over :data:`MAX_SHOWN` characters
    cut), what it supports (client features) and its dynamic parameters.
    Metadata, extensions and listening addresses (often most of an Envoy's
    Node) are not kept."""
    kept = base_pb2.Node(id=shown(node.id), cluster=shown(node.cluster),
                         user_agent_name=node.user_agent_name,
                         client_features=node.client_features)
    if node.HasField("locality"):
        kept.locality.CopyFrom(node.locality)
    version = node.WhichOneof("user_agent_version_type")
    if version == "user_agent_version":
        kept.user_agent_version = node.user_agent_version
    elif version == "user_agent_build_version":
        kept.user_agent_build_version.CopyFrom(node.user_agent_build_version)
    for type_url, params in node.dynamic_parameters.items():
        kept.dynamic_parameters[type_url].CopyFrom(params)
    return kept
