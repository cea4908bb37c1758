"""Requests to the origin, split so that none is too large for it to read.

A gRPC server fails a stream whose message exceeds its receive limit (4 MiB
unless configured otherwise), and the relay's subscription is the union of
every client's: a reconnect with tens of thousands of names, or a few very
long ones, would otherwise break the one upstream stream for everyone, on
every reconnect. So one logical subscription change may go out as several
requests, each at most ``limit`` bytes.

``initial_resource_versions`` may only travel in the first request of a
type on a stream; versions that do not fit there are left out, which costs
the origin resending those resources and nothing else (see
:mod:`relay.upstream.resync` for how the relay reconciles after a reconnect).

:class:`RequestCutter` cuts every request of one stream: the node in its
first, ACKs and NACKs, subscription changes split to size.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import operator
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import countOf
from typing import Any, TypeAlias

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import code_pb2, status_pb2

from relay.constraints import EMPTY_PARAMS, Params
from relay.encoding import locator_size, pair_size, text_size
from relay.turns import made, slice_starts
from relay.xds_types import WILDCARD, short_name

log = logging.getLogger("relay.upstream")

# The generated messages carry no type information; this names what flows.
Request: TypeAlias = Any  # discovery_pb2.DeltaDiscoveryRequest
Locators = Mapping[str, Iterable[Params]]

# Room kept in every request for what is not a name: type URL, nonce, tags.
# A downstream locator larger than the limit less this is refused (see
# ``max_locator_size``), so that every locator fits in some request.
REQUEST_OVERHEAD = 1024
# A NACK's reason quotes names from the response; keep it readable and small.
MAX_NACK_MESSAGE = 2048


def max_locator_size(limit: int) -> int:
    """The largest locator (name and parameters, encoded) a request can carry."""
    return limit - REQUEST_OVERHEAD


@dataclass
class SubscriptionChange:
    """What to ask of the origin for one type, before it is split."""

    type_url: str
    subscribe: Locators = field(default_factory=dict)
    unsubscribe: Locators = field(default_factory=dict)
    # True: subscribe to the wildcard; False: unsubscribe from it; None: no change
    wildcard: bool | None = None
    initial_versions: Mapping[str, str] = field(default_factory=dict)

    def is_empty(self) -> bool:
        """Whether it asks nothing of the origin."""
        return not (self.subscribe or self.unsubscribe or self.wildcard is not None
                    or self.initial_versions)


@dataclass
class Split:
    """The requests for one change, and which initial versions made it in."""

    requests: list[Request]
    declared: dict[str, str]


class RequestCutter:
    """Every request of one stream to the origin: the node goes in the first.

    One per origin; :meth:`new_stream` starts over for a new stream.
    """

    def __init__(self, node: base_pb2.Node, max_request_size: int) -> None:
        self.node = node
        self.max_request_size = max_request_size
        self._node_sent = False

    def new_stream(self) -> None:
        self._node_sent = False

    def ack(self, type_url: str, nonce: str) -> Request:
        return self._reply(type_url, nonce)

    def nack(self, type_url: str, nonce: str, reason: str) -> Request:
        """A NACK with ``reason`` (shortened to :data:`MAX_NACK_MESSAGE`)."""
        request = self._reply(type_url, nonce)
        if len(reason) > MAX_NACK_MESSAGE:
            reason = reason[:MAX_NACK_MESSAGE] + "..."
        request.error_detail.CopyFrom(
            status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=reason))
        return request

    def split(self, change: SubscriptionChange) -> Split:
        """``change`` as requests the origin can read (see :func:`split_requests`)."""
        return made(self.split_steps(change))

    def split_steps(self, change: SubscriptionChange, step: int = 0
                    ) -> Generator[None, None, Split]:
        """:meth:`split` in steps (see :func:`split_steps`)."""
        node = None if self._node_sent else self.node
        self._node_sent = True
        return (yield from split_steps(change, self.max_request_size, node, step))

    def _reply(self, type_url: str, nonce: str) -> Request:
        request = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=nonce)
        if not self._node_sent:
            request.node.CopyFrom(self.node)
            self._node_sent = True
        return request


#: The parameter sets of a plain name: one object, which targets and settling
#: use too, so that a count of plain names (countOf) finds each by identity,
#: with no compare of sets (a big client's 2,000 names a turn, counted thrice).
PLAIN: frozenset[Params] = frozenset({EMPTY_PARAMS})
_PLAIN = PLAIN


def answered_requests(requests: Sequence[Request]) -> int:
    """How many of a new stream's subscription ``requests`` (of one type)
    an origin answers, a response each: the first (a type's first request is
    answered, whatever it holds) and each later one that subscribes names
    (one that only declares versions may go unanswered)."""
    return 1 + sum(1 for request in requests[1:] if request.resource_names_subscribe)


def split_requests(change: SubscriptionChange, limit: int,
                   node: base_pb2.Node | None = None) -> Split:
    """``change`` as requests of at most ``limit`` bytes each; ``node`` goes in the first.

    Names keep their order (sorted); the wildcard subscription and the
    initial versions go first, unsubscriptions last. A locator too large for
    any request is left out and logged (the relay refuses such names from
    its clients, so this only guards the stream).
    """
    return made(split_steps(change, limit, node))


def split_steps(change: SubscriptionChange, limit: int, node: base_pb2.Node | None = None,
                step: int = 0) -> Generator[None, None, Split]:
    """:func:`split_requests` in steps: a generator that pauses (yields)
    after every ``step`` versions or names (never with 0), and returns the
    same requests: a new stream's subscription of a big client's 50,000
    names, declaring as many versions, is cut a slice at a time."""
    builder = _Builder(change.type_url, limit, node)
    if change.wildcard is True:
        builder.add_name("resource_names_subscribe", WILDCARD)
    names, versions = list(change.initial_versions), list(change.initial_versions.values())
    for start in slice_starts(len(names), step):
        if start:
            yield
        builder.add_versions(names[start:start + step or None],
                             versions[start:start + step or None])
    for names_field, locators_field, locators in (
            ("resource_names_subscribe", "resource_locators_subscribe", change.subscribe),
            ("resource_names_unsubscribe", "resource_locators_unsubscribe", change.unsubscribe)):
        ordered = sorted(locators)
        if step and ordered:
            yield
        if countOf(locators.values(), _PLAIN) == len(ordered):  # all plain names: a big client's
            for start in slice_starts(len(ordered), step):
                if start:
                    yield
                some = ordered[start:start + step or None]
                if not builder.add_names(names_field, some):
                    for name in some:
                        builder.add_name(names_field, name)
            continue
        for name in ordered:
            params_set = locators[name]
            if params_set == _PLAIN:
                builder.add_name(names_field, name)  # a plain name: nearly always
                continue
            for params in sorted(params_set, key=sorted):
                if params:
                    builder.add_locator(locators_field, name, params)
                else:
                    builder.add_name(names_field, name)
    if change.wildcard is False:
        builder.add_name("resource_names_unsubscribe", WILDCARD)
    if step:
        yield
    return Split(builder.finish(), builder.initial_versions)


class _Builder:
    """Fills requests entry by entry, starting a new one when the current is full.

    Entries are gathered in lists and written into each request at once
    (protobuf's repeated fields are slow to grow one element at a time).
    """

    def __init__(self, type_url: str, limit: int, node: base_pb2.Node | None) -> None:
        self.type_url = type_url
        self.limit = limit
        self.node = node
        self.requests: list[Request] = []
        # the size of a request that carries nothing but its type
        self.empty: int = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url).ByteSize()
        self.used: int = discovery_pb2.DeltaDiscoveryRequest(
            type_url=type_url, node=node).ByteSize()
        # initial_resource_versions of the first request (their size is in ``used``)
        self.initial_versions: dict[str, str] = {}
        self.names: dict[str, list[str]] = {}
        self.locators: dict[str, list[tuple[str, Params]]] = {}

    def fits(self, size: int) -> bool:
        return self.used + size <= self.limit

    def add_versions(self, names: list[str], versions: list[str]) -> None:
        """Add to the first request's ``initial_resource_versions`` each of
        ``names`` (with its version, in ``versions``) that fits, in order
        (one that does not is left out, and the next may fit). Where every
        name and version is ASCII and each entry under 128 bytes (nearly
        always), an entry's size is the two lengths plus six, and the run of
        entries that fits is found in C (summed, cut by bisection): no step
        per name where the rest are no smaller than the room left (a big
        client's 50,000 took ~0.3 s)."""
        if not names or not "".join(names).isascii() or not "".join(versions).isascii() or \
                max(map(len, names)) + max(map(len, versions)) + 4 >= 0x80:
            self._add_versions_one_by_one(names, versions)
            return
        sizes = list(map((6).__add__, map(operator.add, map(len, names), map(len, versions))))
        ends = list(itertools.accumulate(sizes))
        room = self.limit - self.used
        cut = bisect.bisect_right(ends, room)
        declared = self.initial_versions
        declared.update(zip(names[:cut], versions[:cut], strict=True))
        used = ends[cut - 1] if cut else 0
        rest = sizes[cut + 1:]  # (the one at the cut does not fit)
        if rest and room - used >= min(rest):
            for name, value, size in zip(names[cut + 1:], versions[cut + 1:], rest, strict=True):
                if used + size <= room:
                    declared[name] = value
                    used += size
        self.used += used

    def _add_versions_one_by_one(self, names: list[str], versions: list[str]) -> None:
        """:meth:`add_versions`, each entry sized by :func:`pair_size`."""
        declared = self.initial_versions
        for name, version in zip(names, versions, strict=True):
            size = pair_size(name, version)
            if self.fits(size):
                declared[name] = version
                self.used += size

    def add_name(self, field_name: str, name: str) -> None:
        if self._make_room(name, text_size(name)):
            self.names.setdefault(field_name, []).append(name)

    def add_names(self, field_name: str, names: list[str]) -> bool:
        """:meth:`add_name` for each of ``names``, in order, where each entry's
        size is its length plus two (ASCII names under 128 bytes: nearly all);
        whether it did (if not, it did nothing). Sizes are summed in C, and
        each request takes the run of names that fits it at once: no call
        per name."""
        # (a string joined of ASCII strings is ASCII, and says so in O(1))
        joined = "".join(names)
        if not names or not joined.isascii() or max(map(len, names)) >= 0x80:
            return False
        size = len(joined) + 2 * len(names)
        if self.fits(size):  # all in this request (2,000 names a turn: nearly always)
            self.names.setdefault(field_name, []).extend(names)
            self.used += size
            return True
        # ends[i]: the bytes of names[:i + 1]
        ends = list(itertools.accumulate(map((2).__add__, map(len, names))))
        taken = done = 0  # names taken, and their bytes
        while taken < len(names):
            cut = bisect.bisect_right(ends, done + self.limit - self.used, lo=taken)
            if cut > taken:
                self.names.setdefault(field_name, []).extend(names[taken:cut])
                self.used += ends[cut - 1] - done
            elif self.used > self.empty:
                self._flush()
                continue
            else:
                # (not even alone in a request: left out and logged)
                self.add_name(field_name, names[taken])
                cut = taken + 1
            taken, done = cut, ends[cut - 1]
        return True

    def add_locator(self, field_name: str, name: str, params: Params) -> None:
        if self._make_room(name, locator_size(name, params)):
            self.locators.setdefault(field_name, []).append((name, params))

    def _make_room(self, name: str, size: int) -> bool:
        """Whether an entry of ``size`` bytes fits, in this request or a new one."""
        if not self.fits(size) and self.used > self.empty:
            self._flush()
        if not self.fits(size):
            log.error("not subscribing %s %.80r...: %d bytes do not fit in a request to the "
                      "origin (upstream.max_request_size %d)", short_name(self.type_url), name,
                      size, self.limit)
            return False
        self.used += size
        return True

    def _flush(self) -> None:
        request = discovery_pb2.DeltaDiscoveryRequest(type_url=self.type_url)
        if not self.requests:
            if self.node is not None:
                request.node.CopyFrom(self.node)
            request.initial_resource_versions.update(self.initial_versions)
        for field_name, names in self.names.items():
            getattr(request, field_name).extend(names)
        for field_name, locators in self.locators.items():
            repeated = getattr(request, field_name)
            for name, params in locators:
                repeated.add(name=name, dynamic_parameters=dict(params))
        self.requests.append(request)
        self.names, self.locators = {}, {}
        self.used = self.empty

    def finish(self) -> list[Request]:
        if self.used > self.empty or not self.requests:
            self._flush()
        return self.requests
