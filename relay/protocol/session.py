"""One downstream stream's xDS protocol, every type of it, with no I/O.

A :class:`Session` takes the stream's requests and the cache changes that
concern it, and says what to send and in which order, which subscriptions
the interest index must learn, and which names need a fresh copy from the
origin. The gRPC adapter (:mod:`relay.server.streams`) only moves messages,
wakes up, counts and logs.

What the session decides on its own, beyond each type's protocol:

* the node: the first request that carries one names it for the stream; only
  its dynamic parameters may change later (re-evaluating plain names);
* the service's type: a per-type service accepts its own type only, ADS
  requires a type URL;
* make-before-break order: clusters, endpoints, listeners, routes, then the
  rest, with a delta response that only removes clusters last, so that
  nothing still points at a cluster when it disappears;
* warming: after a SotW cluster push, the next endpoint request is answered
  even if it looks like a plain ACK (Envoy waits for it);
* names the relay could not forward to its origin are refused, and so are
  malformed ``xdstp://`` names, ones of another type than the request's, and
  glob collections over SotW (see :mod:`relay.protocol.xdstp`);
* how large a response may be (``max_response_size``): what does not fit
  goes in the next response of its type, after the client's ACK.
"""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

from envoy.config.core.v3 import base_pb2

from relay.constraints import EMPTY_PARAMS, Params, params_of
from relay.encoding import locator_size
from relay.interest import InterestChange
from relay.protocol.delta import DeltaResponsePlan, DeltaSubscription
from relay.protocol.limits import DEFAULT_LIMITS, LimitExceeded, Limits, kept_node, shown
from relay.protocol.outcome import ProtocolError, RequestOutcome
from relay.protocol.requests import DeltaRequest, Request, ResourceLocator
from relay.protocol.snapshot import SessionSnapshot
from relay.protocol.sotw import SotwResponsePlan, SotwSubscription
from relay.protocol.view import NonceSource, ResourceView
from relay.protocol.xdstp import in_request
from relay.xds_types import CLUSTER, ENDPOINT, push_rank

if TYPE_CHECKING:
    from typing_extensions import TypeIs

__all__ = ["SUPPORTS_RESOURCE_IN_SOTW", "Due", "Plan", "Received", "Request", "Session",
           "State", "XdsProtocol"]

# The two xDS wire protocols: state of the world and incremental.
XdsProtocol = Literal["sotw", "delta"]

# A SotW client announcing this accepts resources wrapped in Resource (TTLs,
# heartbeats); others get bare resources.
SUPPORTS_RESOURCE_IN_SOTW = "xds.config.supports-resource-in-sotw"

# How many of a request's names one look for xdstp names takes at once (see
# Session._check_xdstp): the strings of a few thousand, not of all.
_XDSTP_CHECKED_AT_ONCE = 5_000

Plan: TypeAlias = DeltaResponsePlan | SotwResponsePlan
State: TypeAlias = DeltaSubscription | SotwSubscription


@dataclass(slots=True)
class Received:
    """What one request meant."""

    type_url: str
    outcome: RequestOutcome
    # how subscriptions changed, per type, for the interest index to learn
    interest: list[tuple[str, InterestChange]] = field(default_factory=list)


@dataclass(slots=True)
class Due:
    """What the session has to say now."""

    # responses to send, in this order
    responses: list[Plan] = field(default_factory=list)
    # per type, names whose cached copy may not be served: fetch them afresh
    refetch: dict[str, frozenset[str]] = field(default_factory=dict)


class Session:
    """The protocol state of one downstream stream (ADS, or one per-type service)."""

    # one per stream, thousands of them idle: no instance dict
    __slots__ = ("_fixed_type_url", "_in_push_order", "_limits", "_max_locator_size",
                 "_max_response_size", "_node", "_node_id", "_node_params", "_nonces",
                 "_states", "protocol")

    def __init__(self, protocol: XdsProtocol, fixed_type_url: str | None = None,
                 max_locator_size: int | None = None, limits: Limits = DEFAULT_LIMITS,
                 max_response_size: int | None = None) -> None:
        self.protocol: XdsProtocol = protocol
        self._fixed_type_url = fixed_type_url
        self._max_locator_size = max_locator_size
        self._limits = limits
        # the most bytes a response takes (server.max_response_size; None: any,
        # as a one-shot fetch, which has one response to give)
        self._max_response_size = max_response_size
        # what the stream keeps of its client's first Node (kept_node), encoded:
        # a message object of its own costs about 1 KiB a stream (its arena),
        # where the bytes cost their length; decoded when asked for (the
        # client's status, a SotW type's first request), and its id kept apart
        self._node: bytes | None = None
        self._node_id = ""
        # per type URL, the node's dynamic parameters (the latest node sent)
        self._node_params: Mapping[str, Params] = _NO_NODE_PARAMS
        self._states: dict[str, State] = {}
        # the states in make-before-break order (see :func:`push_rank`)
        self._in_push_order: tuple[tuple[str, State], ...] = ()
        self._nonces = NonceSource()

    @property
    def node(self) -> base_pb2.Node | None:
        """What the stream keeps of its client's first Node (a message of its own)."""
        return base_pb2.Node.FromString(self._node) if self._node is not None else None

    @property
    def node_id(self) -> str:
        return self._node_id

    def types(self) -> list[str]:
        """The types this stream has asked for."""
        return list(self._states)

    def rejections(self) -> list[tuple[str, bool]]:
        """Each type this stream has asked for, and whether the client NACKed
        its latest answered response (no ACK since)."""
        return [(type_url, state.rejected) for type_url, state in self._states.items()]

    def has_work(self) -> bool:
        """Whether :meth:`due` may have a response to send now."""
        # A loop: any() over a generator costs more, on every request and write.
        for state in self._states.values():  # noqa: SIM110
            if state.has_work():
                return True
        return False

    # -- input -----------------------------------------------------------------

    def check(self, request: Request) -> None:
        """Raise the :class:`ProtocolError` :meth:`receive` would, changing nothing.

        A request the stream applies in pieces is checked whole first: refused,
        none of it reaches the interest index (or the origin). Its names are
        read out of the message as each check looks at them, a few thousand
        at a time, not copied into a list: such a request is a big one, and
        the copy (7 MB for 100,000 names) was part of its subscription's peak.
        (The stream hands it a request whose names it read out once for the
        check and its pieces alike: see :func:`~relay.protocol.delta.read_in_pieces`.)
        """
        type_url = self._type_url_of(request)
        has_node = request.HasField("node")
        if has_node:
            self._check_node(request.node)
        node_params = _node_params_of(request.node) if has_node else self._node_params
        names, locators, count = self._subscribing(request, copied=False)
        longest = max(map(len, names), default=0)  # (once: each read of the field makes them)
        self._check_locator_sizes(names, locators, node_params.get(type_url, EMPTY_PARAMS),
                                  longest)
        self._check_names(locators, count, longest)
        self._check_xdstp(type_url, request, names)

    def receive(self, request: Request) -> Received:
        """Apply one request; raises :class:`ProtocolError` for one that breaks the
        protocol or :class:`LimitExceeded` for one beyond ``limits``."""
        type_url = self._type_url_of(request)
        if not request.HasField("node"):
            # An ACK, most often: nothing to check, no interest changed.
            state = self._states.get(type_url)
            replied = None
            if self._is_delta(request):
                if isinstance(state, DeltaSubscription):
                    replied = state.on_reply(request)
            elif isinstance(state, SotwSubscription):
                replied = state.on_reply(request, self._limits.names_per_request)
            if replied is not None:
                return Received(type_url, replied)
        node_changed = False
        if request.HasField("node"):
            self._check_node(request.node)
            if self._node is None:
                kept = kept_node(request.node)
                self._node, self._node_id = kept.SerializeToString(), kept.id
            node_changed = self._update_node_params(request.node)
        names, locators, count = self._subscribing(request)
        longest = max(map(len, names), default=0)
        self._check_locator_sizes(names, locators,
                                  self._node_params.get(type_url, EMPTY_PARAMS), longest)
        self._check_names(locators, count, longest)
        state = self._states.get(type_url)
        first = state is None
        if state is None:
            state = self._new_state(type_url)
        # The stream's protocol chose both the state and the request's type.
        if self._is_delta(request):
            assert isinstance(state, DeltaSubscription)
            outcome = state.on_request(request, names)
        else:
            assert isinstance(state, SotwSubscription)
            outcome = state.on_request(request, names)
        # A new node may change every type's parameters; a request, its own type.
        touched = self._states.items() if node_changed else [(type_url, state)]
        interest = [(t, change) for t, s in touched
                    if (change := s.take_interest_change()) is not None]
        outcome.interest_changed = any(t == type_url for t, _ in interest)
        if outcome.interest_changed:
            self._check_names_held()
        if first and not outcome.interest_changed:
            # Registered even with no names, to hear that the type became synced.
            interest.append((type_url, InterestChange()))
        return Received(type_url, outcome, interest)

    def _is_delta(self, request: Request) -> TypeIs[DeltaRequest]:
        """Whether ``request`` is a delta one: the stream's protocol (the gRPC
        method it came on) says so."""
        return self.protocol == "delta"

    def _subscribing(self, request: Request, copied: bool = True
                     ) -> tuple[Sequence[str], Sequence[ResourceLocator], int]:
        """The plain names and the locators ``request`` subscribes, and how many
        names it carries in all (unsubscribed ones too).

        The names are read out of the message once, into a list: each read of
        a repeated string field makes every string anew, and they are looked
        at more than once (a SotW ACK carries the whole subscription). Not
        ``copied``: the message's own field, read again by each look.
        """
        if self._is_delta(request):
            names, locators = request.resource_names_subscribe, \
                request.resource_locators_subscribe
            count = len(names) + len(locators) + len(request.resource_names_unsubscribe) + \
                len(request.resource_locators_unsubscribe)
        else:
            names, locators = request.resource_names, request.resource_locators
            count = len(names) + len(locators)
        if not names:
            return (), locators, count
        return list(names) if copied else names, locators, count

    def _new_state(self, type_url: str) -> State:
        state: State
        if self.protocol == "delta":
            state = DeltaSubscription(type_url)
        else:
            node = self.node
            aware = node is not None and SUPPORTS_RESOURCE_IN_SOTW in node.client_features
            state = SotwSubscription(type_url, resource_in_sotw=aware)
        state.set_node_params(self._node_params.get(type_url, EMPTY_PARAMS))
        self._states[type_url] = state
        self._in_push_order = tuple(sorted(self._states.items(),
                                           key=lambda item: push_rank(item[0])))
        return state

    def _type_url_of(self, request: Request) -> str:
        """The type a request is for, checked against the service it came on."""
        if self._fixed_type_url is not None:
            if request.type_url and request.type_url != self._fixed_type_url:
                raise ProtocolError(
                    f"type_url {request.type_url!r} sent on the discovery service for "
                    f"{self._fixed_type_url!r}")
            return self._fixed_type_url
        if not request.type_url:
            raise ProtocolError("type_url is required on an aggregated (ADS) stream")
        type_url: str = request.type_url
        known = self._limits.type_urls
        if known is not None and type_url not in known and type_url not in self._states:
            raise ProtocolError(
                f"type_url {shown(type_url, 200)!r} is not a type this relay serves "
                f"(server.extra_type_urls adds others)")
        # One string for every stream of a type the relay serves: each request
        # makes its own, and a stream keeps the ones it is first sent (about
        # 120 bytes each, in its states and its stream's per-type times).
        return sys.intern(type_url) if known is not None and type_url in known else type_url

    # -- limits --------------------------------------------------------------------

    def _check_node(self, node: base_pb2.Node) -> None:
        limits = self._limits
        size = node.ByteSize()
        if size > limits.node_size:
            raise LimitExceeded("node_size", f"the node is {size} bytes; the relay takes "
                                f"nodes of at most {limits.node_size} (limits.node_size)")
        for params in node.dynamic_parameters.values():
            self._check_parameter_count(len(params.params), "the node's")

    def _check_parameter_count(self, count: int, whose: str) -> None:
        limit = self._limits.dynamic_parameters
        if count > limit:
            raise LimitExceeded("dynamic_parameters", f"{whose} dynamic parameters number "
                                f"{count}; at most {limit} per locator "
                                f"(limits.dynamic_parameters)")

    def _check_names(self, locators: Sequence[ResourceLocator], count: int,
                     longest: int) -> None:
        """A request's names (``count`` in all, of which plain ones as long as
        ``longest`` at most, and ``locators``, subscribed): how many, how
        long, their parameters."""
        limits = self._limits
        if not count:
            return  # an ACK, most often
        if count > limits.names_per_request:
            raise LimitExceeded("names_per_request", f"the request names {count} resources; "
                                f"at most {limits.names_per_request} per request "
                                f"(limits.names_per_request)")
        for locator in locators:
            longest = max(longest, len(locator.name))
            self._check_parameter_count(len(locator.dynamic_parameters),
                                        f"locator {shown(locator.name, 64)!r}'s")
        if longest > limits.name_length:
            raise LimitExceeded("name_length", f"a resource name has {longest} characters; "
                                f"at most {limits.name_length} (limits.name_length)")

    def _check_xdstp(self, type_url: str, request: Request, names: Sequence[str]) -> None:
        """Refuse the xdstp names a state would refuse (malformed, of another
        type, a glob collection over SotW), for a request checked whole;
        ``names`` are the plain names it subscribes.

        (A request applied as it comes is checked by its state, which puts
        its names in canonical form: see :mod:`relay.protocol.xdstp`.)
        """
        lists: tuple[Collection[str], ...]
        if self._is_delta(request):
            lists = (names, request.resource_names_unsubscribe,
                     [loc.name for loc in request.resource_locators_subscribe],
                     [loc.name for loc in request.resource_locators_unsubscribe],
                     request.initial_resource_versions)
        else:
            lists = (names, [loc.name for loc in request.resource_locators])
        globs = self.protocol == "delta"
        for each in lists:
            # (a few thousand at a time: in_request joins its names into one
            # string, which reads a message's field, or a map's keys, into a
            # list first)
            names_left = iter(each)
            while some := list(itertools.islice(names_left, _XDSTP_CHECKED_AT_ONCE)):
                in_request(some, type_url, globs=globs)

    def _check_names_held(self) -> None:
        """The stream's subscriptions, all types together."""
        limit = self._limits.names_per_stream
        total = sum(state.name_count() for state in self._states.values())
        if total > limit:
            raise LimitExceeded("names_per_stream", f"the stream subscribes to {total} "
                                f"resources; at most {limit} per stream "
                                f"(limits.names_per_stream)")

    def _update_node_params(self, node: base_pb2.Node) -> bool:
        """Take the node's dynamic parameters; whether they changed."""
        params = _node_params_of(node)
        if params == self._node_params:
            return False
        self._node_params = params
        for type_url, state in self._states.items():
            state.set_node_params(params.get(type_url, EMPTY_PARAMS))
        return True

    def _check_locator_sizes(self, names: Sequence[str], locators: Sequence[ResourceLocator],
                             node_params: Params, longest: int) -> None:
        """Refuse a name subscribed that the relay could not forward to its origin.

        The relay's subscription upstream carries every client's names (with
        the node's dynamic parameters for the type, if any). One too large
        for a request to the origin is never sent there (see
        :mod:`relay.upstream.requests`); the client that asked for it is told.
        """
        limit = self._max_locator_size
        if limit is None:
            return
        if not (names or locators):
            return  # an ACK, most often
        with_params = locator_size("", node_params) if node_params else 0
        # (a character is at most four bytes: checked for the longest name
        # first, ``longest``, most requests need no look at each)
        if names and 4 * longest + 8 + with_params <= limit:
            names = ()
        for name in names:
            # A character is at most four bytes: most names need no encoding.
            if 4 * len(name) + 8 + with_params > limit and \
                    (size := locator_size(name, node_params)) > limit:
                raise ProtocolError(
                    f"resource name {name[:64]!r}... has {size} bytes with the node's dynamic "
                    f"parameters; the relay forwards names of at most {limit} bytes to its "
                    "origin (upstream.max_request_size)")
        for locator in locators:
            size = locator_size(locator.name, locator.dynamic_parameters.items())
            if size > limit:
                raise ProtocolError(
                    f"resource locator {locator.name[:64]!r} has {size} bytes with its "
                    f"dynamic parameters; the relay forwards locators of at most {limit} "
                    "bytes to its origin (upstream.max_request_size)")

    # -- cache changes -----------------------------------------------------------

    def mark_changed(self, type_url: str, names: frozenset[str],
                     everything: bool) -> int | None:
        """Mark these names of ``type_url`` changed in the cache (or, with
        ``everything``, possibly any of the type); returns how many changes
        coalesced behind a response the client has not ACKed or NACKed yet
        (see :meth:`SubscriptionState.mark_changed
        <relay.protocol.subscription.SubscriptionState.mark_changed>`), or None
        when the stream does not subscribe to the type."""
        state = self._states.get(type_url)
        if state is None:
            return None
        return state.mark_changed(names, everything)

    def first_answers_ready(self, type_url: str, view: ResourceView) -> bool:
        """Whether the change of ``type_url`` just marked is the last of what
        the client waits for, and all there is to send: the names it
        subscribed to and was never answered, each in the cache now, and
        nothing else marked, of any type. No later part of the origin's
        burst can be one it waits for, nor change the order of what goes
        out (invariant 20 is about changes to what clients hold): its
        stream need not wait for the batch window to close."""
        state = self._states.get(type_url)
        if state is None or not state.only_first_answers(view):
            return False
        return not any(other.has_changes() for other in self._states.values()
                       if other is not state)

    def heartbeats_received(self, type_url: str, names: frozenset[str]) -> bool:
        """The origin confirmed these names unchanged; whether the stream cares."""
        state = self._states.get(type_url)
        if state is None:
            return False
        state.heartbeats_received(names)
        return True

    # -- output --------------------------------------------------------------------

    def due(self, view: ResourceView) -> Due:
        """The responses to send now, in make-before-break order, and re-fetches."""
        if len(self._in_push_order) == 1:
            # (one type, as a per-type service's stream: no order to keep)
            [(type_url, state)] = self._in_push_order
            plan = state.next_response(view, self._nonces, self._max_response_size)
            names = state.take_refetch()
            return Due([] if plan is None else [plan], {type_url: names} if names else {})
        responses: list[Plan] = []
        cluster_removals: list[Plan] = []
        for type_url, state in self._in_push_order:
            plan = state.next_response(view, self._nonces, self._max_response_size)
            if plan is None:
                continue
            if type_url == CLUSTER and isinstance(plan, DeltaResponsePlan) and \
                    plan.only_removes():
                cluster_removals.append(plan)
                continue
            if type_url == CLUSTER:
                endpoints = self._states.get(ENDPOINT)
                if endpoints is not None:
                    endpoints.expect_request()  # warming (SotW; delta resubscribes)
            responses.append(plan)
        refetch = {type_url: names for type_url, state in self._in_push_order
                   if (names := state.take_refetch())}
        return Due(responses + cluster_removals, refetch)

    def snapshot(self) -> SessionSnapshot:
        """What the client subscribes to and holds, per type."""
        return SessionSnapshot(self.node, self.protocol,
                               tuple(state.snapshot() for _, state in
                                     sorted(self._states.items())),
                               self._fixed_type_url)


# the node parameters of a stream whose node has none (most): one for all
_NO_NODE_PARAMS: Mapping[str, Params] = types.MappingProxyType({})


def _node_params_of(node: base_pb2.Node) -> dict[str, Params]:
    """A node's dynamic parameters, per type URL."""
    return {type_url: params_of(context.params)
            for type_url, context in node.dynamic_parameters.items()}
