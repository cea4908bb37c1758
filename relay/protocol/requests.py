"""The requests the protocol state reads, as types mypy can check.

The generated xDS messages carry no type information (mypy sees ``Any``, as
``envoy.*`` is imported without stubs), so a union of the generated classes
would check nothing. These protocols name the fields the protocol code reads,
with their types: a ``DiscoveryRequest`` is a :class:`SotwRequest`, a
``DeltaDiscoveryRequest`` a :class:`DeltaRequest`. A field read that neither
message has, or one used as the wrong type, is a type error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeAlias

from envoy.config.core.v3 import base_pb2

__all__ = ["DeltaRequest", "ErrorDetail", "Request", "ResourceLocator", "SotwRequest"]


class ErrorDetail(Protocol):
    """A NACK's reason (``google.rpc.Status``)."""

    code: int
    message: str


class ResourceLocator(Protocol):
    """A name subscribed with dynamic parameters (``ResourceLocator``)."""

    name: str
    dynamic_parameters: Mapping[str, str]


class _RequestFields(Protocol):
    """What both protocols' requests carry."""

    type_url: str
    response_nonce: str
    node: base_pb2.Node
    error_detail: ErrorDetail

    def HasField(self, field_name: str) -> bool:
        """Whether a message field (``node``, ``error_detail``) is set."""


class SotwRequest(_RequestFields, Protocol):
    """A state-of-the-world ``DiscoveryRequest``: the whole subscription each time."""

    version_info: str
    resource_names: Sequence[str]
    resource_locators: Sequence[ResourceLocator]

    def CopyFrom(self, other: SotwRequest) -> None:
        """Become a copy of ``other``."""

    def ClearField(self, field_name: str) -> None:
        """Unset a field."""


class DeltaRequest(_RequestFields, Protocol):
    """An incremental ``DeltaDiscoveryRequest``: subscription changes only."""

    resource_names_subscribe: Sequence[str]
    resource_names_unsubscribe: Sequence[str]
    resource_locators_subscribe: Sequence[ResourceLocator]
    resource_locators_unsubscribe: Sequence[ResourceLocator]
    initial_resource_versions: Mapping[str, str]


# What a stream receives: its protocol (its gRPC method) says which.
Request: TypeAlias = SotwRequest | DeltaRequest
