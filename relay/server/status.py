"""What each downstream client holds, as Client Status Discovery Service (CSDS) messages.

Pure functions from stream state to ``envoy.service.status.v3`` messages; the
gRPC servicer around them is in :mod:`relay.server.ecosystem`. The relay is
the management server of its clients, so every resource carries both views:
``config_status`` (what the relay sent and how it was answered) and
``client_status`` (what the client therefore holds).

The protocol state records per name only what was last sent (``held``), so
some answers are approximations, and say so below:

* delta: a resource is NACKED while the latest NACK of its type listed it at
  the version it holds (an older NACK overwritten by a newer one is lost);
* SotW: a response is accepted or rejected as a whole, and the state does
  not remember which names a response carried, so every held name of a type
  shares the fate of the latest response of that type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from envoy.admin.v3 import config_dump_shared_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.status.v3 import csds_pb2
from envoy.type.matcher.v3 import node_pb2, string_pb2
from google.protobuf import any_pb2

from relay.cache import Missing, ResourceCache
from relay.protocol.delta import DeltaSubscription
from relay.protocol.held import Held
from relay.protocol.sotw import SotwSubscription
from relay.server.streams import DownstreamStream

GenericXdsConfig = csds_pb2.ClientConfig.GenericXdsConfig
ClientStatus = config_dump_shared_pb2.ClientResourceStatus
ConfigStatus = csds_pb2.ConfigStatus
NodePredicate = Callable[[base_pb2.Node | None], bool]

# client_status -> config_status, the relay's side of the same fact
_CONFIG_STATUS = {
    ClientStatus.ACKED: ConfigStatus.SYNCED,
    ClientStatus.NACKED: ConfigStatus.ERROR,
    ClientStatus.REQUESTED: ConfigStatus.NOT_SENT,
    # sent, not yet answered: the client's view is not known yet
    ClientStatus.UNKNOWN: ConfigStatus.STALE,
}


class UnsupportedMatcher(ValueError):
    """A ``node_matchers`` entry this relay cannot evaluate."""


def client_status(request: csds_pb2.ClientStatusRequest,
                  streams: Iterable[DownstreamStream],
                  cache: ResourceCache) -> csds_pb2.ClientStatusResponse:
    """Answer one CSDS request: a ClientConfig per connected stream the matchers select.

    Raises :class:`UnsupportedMatcher` for matchers the relay cannot evaluate,
    whether or not any stream is connected.
    """
    selected = node_predicate(request.node_matchers)
    contents = not request.exclude_resource_contents
    chosen = sorted((s for s in streams if selected(s.node)),
                    key=lambda s: (s.node_id, s.peer))
    return csds_pb2.ClientStatusResponse(
        config=[client_config(s, cache, contents) for s in chosen])


def client_config(stream: DownstreamStream, cache: ResourceCache,
                  contents: bool = True) -> csds_pb2.ClientConfig:
    """One stream's node and, per type and name, what its client holds or awaits.

    With ``contents`` false the resource bodies are left out.
    """
    config = csds_pb2.ClientConfig()
    if stream.node is not None:
        config.node.CopyFrom(stream.node)
    entries: list[csds_pb2.ClientConfig.GenericXdsConfig] = []
    for state in stream.states.values():
        entries.extend(resource_configs(state, cache, contents))
    entries.sort(key=lambda e: (e.type_url, e.name))
    config.generic_xds_configs.extend(entries)
    return config


def resource_configs(state: DeltaSubscription | SotwSubscription, cache: ResourceCache,
                     contents: bool = True) -> list[csds_pb2.ClientConfig.GenericXdsConfig]:
    """The GenericXdsConfig of every name one type's state holds or is subscribed to."""
    out: list[csds_pb2.ClientConfig.GenericXdsConfig] = []
    for name, held in state.held.items():
        if not (state.wildcard or name in state.names):
            continue  # declared in initial_resource_versions, never subscribed
        status = (_delta_held_status(state, held, name) if isinstance(state, DeltaSubscription)
                  else _sotw_held_status(state))
        entry = GenericXdsConfig(type_url=state.type_url, name=held.canonical or name,
                                 version_info=held.version, client_status=status,
                                 config_status=_CONFIG_STATUS[status])
        body = _body(cache, state.type_url, name, held) if contents else None
        if body is not None:
            entry.xds_config.CopyFrom(body)
        nack = state.last_nack
        if status == ClientStatus.NACKED and nack is not None:
            entry.error_state.details = nack.message
            entry.error_state.version_info = held.version
        out.append(entry)
    for name in sorted(state.names - state.held.keys()):
        entry = GenericXdsConfig(type_url=state.type_url, name=name)
        error = state.errors_sent.get(name)
        if error is not None:
            # The origin's error for it was passed on; the client holds nothing.
            entry.client_status = ClientStatus.RECEIVED_ERROR
            entry.error_state.details = error.error_detail.message
        elif _told_absent(state, name):
            entry.client_status = ClientStatus.DOES_NOT_EXIST
        else:
            entry.client_status = ClientStatus.REQUESTED
            entry.config_status = ConfigStatus.NOT_SENT
        out.append(entry)
    return out


def _delta_held_status(state: DeltaSubscription, held: Held,
                       name: str) -> config_dump_shared_pb2.ClientResourceStatus:
    token = f"{held.canonical or name}={held.version}"
    if state.inflight_nonce is not None and _lists(state.inflight_versions, token):
        return ClientStatus.UNKNOWN
    if state.last_nack is not None and _lists(state.last_nack.version, token):
        return ClientStatus.NACKED
    # Answered with an ACK, or declared by the client in initial_resource_versions.
    return ClientStatus.ACKED


def _sotw_held_status(state: SotwSubscription) -> config_dump_shared_pb2.ClientResourceStatus:
    if state.inflight_nonce is not None:
        return ClientStatus.UNKNOWN
    if state.acked_version == state.version_info:
        return ClientStatus.ACKED
    nack = state.last_nack
    if nack is not None and nack.version == state.version_info:
        return ClientStatus.NACKED
    return ClientStatus.UNKNOWN


def _lists(versions: str, token: str) -> bool:
    """Whether a ``name=version,...`` list holds ``token`` (names may hold commas)."""
    return f",{token}," in f",{versions},"


def _told_absent(state: DeltaSubscription | SotwSubscription, name: str) -> bool:
    """Whether the relay told the client that a subscribed name does not exist."""
    if isinstance(state, DeltaSubscription):
        # Subscribed names leave ``unanswered`` with the resource or its removal.
        return name not in state.unanswered
    # Full-state types: a response that went out after the subscription and
    # did not list the name said that it does not exist. Other SotW types
    # cannot say it.
    return (state.full_state and state.last_nonce is not None and
            name not in state.pending and not state.recheck_all)


def _body(cache: ResourceCache, type_url: str, name: str, held: Held) -> any_pb2.Any | None:
    """The cached body of the exact version and variant the client holds, if still cached."""
    variants = cache.variants(type_url, name)
    if isinstance(variants, Missing):
        return None
    if held.variant_key is not None:
        candidates = [variants[held.variant_key]] if held.variant_key in variants else []
    else:
        candidates = list(variants.values())
    for resource in candidates:
        if resource.version == held.version and resource.resource.HasField("resource"):
            return resource.body
    return None


# -- node matchers -----------------------------------------------------------


def node_predicate(matchers: Sequence[node_pb2.NodeMatcher]) -> NodePredicate:
    """A test of nodes for ``node_matchers``: any matcher may match (none means all).

    Supports matching the node id with ``exact``, ``prefix``, ``suffix`` and
    ``contains`` (optionally ``ignore_case``). Raises :class:`UnsupportedMatcher`
    for anything else: ``safe_regex`` (RE2 syntax, which Python's ``re`` does
    not follow exactly), ``custom`` and ``node_metadatas``.
    """
    tests = [_node_test(m) for m in matchers]
    if not tests:
        return lambda node: True
    return lambda node: any(test(node.id if node is not None else "") for test in tests)


def _node_test(matcher: node_pb2.NodeMatcher) -> Callable[[str], bool]:
    if matcher.node_metadatas:
        raise UnsupportedMatcher("node_matchers: node_metadatas are not supported; "
                                 "match on node_id")
    if not matcher.HasField("node_id"):
        return lambda node_id: True
    return string_test(matcher.node_id)


def string_test(matcher: string_pb2.StringMatcher) -> Callable[[str], bool]:
    """A test of strings for one StringMatcher (see :func:`node_predicate`)."""
    kind = matcher.WhichOneof("match_pattern")
    if kind not in ("exact", "prefix", "suffix", "contains"):
        what = "a StringMatcher without a pattern" if kind is None else f"{kind!r}"
        raise UnsupportedMatcher(f"node_matchers: {what} is not supported; use exact, "
                                 "prefix, suffix or contains")
    pattern: str = getattr(matcher, kind)
    fold = matcher.ignore_case
    if fold:
        pattern = pattern.casefold()

    def test(value: str) -> bool:
        if fold:
            value = value.casefold()
        if kind == "exact":
            return value == pattern
        if kind == "prefix":
            return value.startswith(pattern)
        if kind == "suffix":
            return value.endswith(pattern)
        return pattern in value

    return test
