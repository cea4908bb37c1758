"""Planned responses as bytes on the wire.

A response is its small fields followed by the resources' pre-encoded
entries (see :mod:`relay.encoding`). When one origin update reaches many
streams, most of them get the same response but for its nonce: a
:class:`PlanEncoder` encodes that body once per push and appends each
stream's nonce (protobuf allows fields in any order), so a fan-out to N
streams builds one response, not N.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Iterable
from typing import Any

from relay.encoding import encode_delta_response, encode_sotw_response, length_delimited_field
from relay.protocol.delta import DeltaResponsePlan
from relay.protocol.session import Plan

# ``nonce``: field 5 of both DiscoveryResponse and DeltaDiscoveryResponse.
_NONCE_FIELD = 5
# Plans with more resources than this are encoded on their own: such a
# response is rarely shared, and its key would cost as much as the encoding.
_SHARED_MAX_RESOURCES = 64
# How many distinct bodies are remembered (the oldest go first).
_SHARED_BODIES = 256
# (in C, for responses of thousands of resources)
_DELTA_ENTRY = operator.attrgetter("delta_entry")
_HEARTBEAT_ENTRY = operator.attrgetter("heartbeat_entry")
_SOTW_ENTRY = operator.attrgetter("sotw_entry")


def encode_plan(plan: Plan) -> bytes:
    """Serialize a planned response around its pre-encoded resources."""
    # (a plan's ``entries``: its page read them already, sizing it)
    if isinstance(plan, DeltaResponsePlan):
        entries: Iterable[bytes] = plan.entries if plan.entries is not None else \
            map(_DELTA_ENTRY, plan.resources)
        if plan.heartbeats:
            entries = itertools.chain(entries, map(_HEARTBEAT_ENTRY, plan.heartbeats))
        return encode_delta_response(plan.head(), entries)
    if not (plan.heartbeats or plan.wrapped):
        # (each its plain entry, nearly always: in C, not a generator's
        # Python per resource, ~5 % of a response of 10,000)
        return encode_sotw_response(plan.head(), plan.entries if plan.entries is not None
                                    else map(_SOTW_ENTRY, plan.resources))
    return encode_sotw_response(plan.head(), (
        r.sotw_heartbeat_entry if r.name in plan.heartbeats else
        r.sotw_wrapped_entry if r.name in plan.wrapped else r.sotw_entry
        for r in plan.resources))


def _shared_key(plan: Plan) -> tuple[Any, ...] | None:
    """What decides a plan's bytes but for its nonce; None for a plan not worth sharing."""
    if isinstance(plan, DeltaResponsePlan):
        if plan.removed or plan.removed_names or plan.errors or \
                len(plan.resources) + len(plan.heartbeats) > _SHARED_MAX_RESOURCES:
            return None
        # Resources compare by identity: the cache's objects, the same for all.
        return ("delta", plan.type_url, tuple(plan.resources), tuple(plan.heartbeats))
    if plan.errors or len(plan.resources) > _SHARED_MAX_RESOURCES:
        return None
    return ("sotw", plan.type_url, plan.version_info, tuple(plan.resources), plan.wrapped,
            plan.heartbeats)


class PlanEncoder:
    """Encodes plans, sharing the body of equal responses between streams."""

    def __init__(self) -> None:
        self._bodies: dict[tuple[Any, ...], bytes] = {}

    def encode(self, plan: Plan) -> bytes:
        key = _shared_key(plan)
        if key is None:
            return encode_plan(plan)
        body = self._bodies.get(key)
        if body is None:
            body = encode_plan(dataclasses.replace(plan, nonce=""))  # an empty field is left out
            if len(self._bodies) >= _SHARED_BODIES:
                del self._bodies[next(iter(self._bodies))]
            self._bodies[key] = body
        return body + length_delimited_field(_NONCE_FIELD, plan.nonce.encode())
