"""Secrets left out of what the relay shows: its admin views and CSDS.

As Envoy's admin does, a field marked ``(udpa.annotations.sensitive)`` in the
xDS protos (a ``Secret``'s private key, password, session ticket keys, a
generic secret, an OAuth2 token, ...) is shown as ``[redacted]``, wherever it
sits: inside ``Any`` fields too (a Listener's inline ``DownstreamTlsContext``).
What is sent to clients is never touched; only copies made for display are.
An ``Any`` of a type that no installed module describes is shown empty: what
cannot be read cannot be checked.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

from google.protobuf import any_pb2, symbol_database
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from udpa.annotations import sensitive_pb2

__all__ = ["REDACTED", "message_class", "redacted"]

REDACTED = "[redacted]"
_ANY = any_pb2.Any.DESCRIPTOR.full_name
_STRING, _BYTES = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES


def _is_sensitive(field: FieldDescriptor) -> bool:
    return bool(field.GetOptions().Extensions[sensitive_pb2.sensitive])


@cache
def _may_hold_secrets(descriptor: Descriptor) -> bool:
    """Whether a message of this type can hold a sensitive field (an ``Any``
    might hold anything). Messages that cannot are not walked."""
    return _reaches_secrets(descriptor, set())


def _reaches_secrets(descriptor: Descriptor, seen: set[str]) -> bool:
    if descriptor.full_name == _ANY:
        return True
    if descriptor.full_name in seen:
        return False  # a recursive type: decided where the cycle started
    seen.add(descriptor.full_name)
    for field in descriptor.fields:
        if _is_sensitive(field):
            return True
        if field.message_type is not None and _reaches_secrets(field.message_type, seen):
            return True
    return False


def redacted(body: any_pb2.Any) -> any_pb2.Any:
    """``body`` with every sensitive field replaced by ``[redacted]``: ``body``
    itself when it holds none, a copy otherwise."""
    copy = any_pb2.Any()
    copy.CopyFrom(body)
    return copy if _redact_any(copy) else body


def message_class(type_name: str) -> type[Message] | None:
    """The class of a message type, importing its package's modules if need be.

    A resource's ``Any`` fields (a Listener's filters and TLS context, ...)
    name types that nothing in the relay imports: their package's ``_pb2``
    modules (a type's package is its directory in xds-protos) are imported
    the first time one is asked for. None for a type no installed module has.
    """
    database = symbol_database.Default()
    try:
        found: type[Message] = database.GetSymbol(type_name)
        return found
    except KeyError:
        pass
    _import_package(type_name.rpartition(".")[0])
    try:
        found = database.GetSymbol(type_name)
        return found
    except KeyError:
        return None


# The protobuf packages of xds-protos: type names from resources (the origin's
# data) never make the relay import anything else.
_PROTO_ROOTS = ("envoy.", "xds.", "udpa.", "validate.")


@cache
def _import_package(package: str) -> None:
    """Import every ``_pb2`` module of a protobuf package (once, found or not)."""
    if not package.startswith(_PROTO_ROOTS):
        return
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    for location in spec.submodule_search_locations:
        for path in sorted(Path(location).glob("*_pb2.py")):
            with contextlib.suppress(ImportError):
                importlib.import_module(f"{package}.{path.stem}")


def _redact_any(holder: any_pb2.Any) -> bool:
    """Redact what ``holder`` packs, in place; whether anything was."""
    message_class_ = message_class(holder.TypeName())
    if message_class_ is None:
        # A type no installed module describes: it may hold anything, so
        # nothing of it is shown (fail closed); its type URL stays.
        if not holder.value:
            return False
        holder.value = b""
        return True
    message: Message = message_class_()
    if not _may_hold_secrets(message.DESCRIPTOR):
        return False
    message.ParseFromString(holder.value)
    if not _redact(message):
        return False
    holder.value = message.SerializeToString(deterministic=True)
    return True


def _redact(message: Message) -> bool:
    """Redact ``message`` in place; whether anything was."""
    if message.DESCRIPTOR.full_name == _ANY:
        return _redact_any(message)  # type: ignore[arg-type]
    changed = False
    for field, value in message.ListFields():
        if _is_sensitive(field):
            _blank(message, field, value)
            changed = True
        elif field.message_type is not None and _may_hold_secrets(field.message_type):
            if field.message_type.GetOptions().map_entry:
                items = value.values()
            elif field.is_repeated:
                items = value
            else:
                items = (value,)
            for item in items:
                changed = _redact(item) or changed
    return changed


def _blank(message: Message, field: FieldDescriptor, value: object) -> None:
    """Replace a sensitive field's every string or bytes with ``[redacted]``
    and clear its other values: nothing of it stays readable."""
    if field.type in (_STRING, _BYTES):
        marker = REDACTED if field.type == _STRING else REDACTED.encode()
        if field.is_repeated:
            container: Any = value
            container[:] = [marker] * len(container)
        else:
            setattr(message, field.name, marker)
    elif field.message_type is not None:
        if field.message_type.GetOptions().map_entry:
            mapping: Any = value
            for key in list(mapping):
                entry = mapping[key]
                if isinstance(entry, Message):
                    _blank_all(entry)
                else:
                    mapping[key] = _marker(entry)
        elif field.is_repeated:
            for item in value:  # type: ignore[attr-defined]
                _blank_all(item)
        else:
            _blank_all(value)  # type: ignore[arg-type]
    else:
        message.ClearField(field.name)


def _marker(value: object) -> object:
    """What stands for one scalar of a sensitive map."""
    if isinstance(value, str):
        return REDACTED
    if isinstance(value, bytes):
        return REDACTED.encode()
    return type(value)()


def _blank_all(message: Message) -> None:
    if message.DESCRIPTOR.full_name == _ANY:
        # Keep the type: a reader must still be able to decode what is left.
        holder: Any = message
        inner_class = message_class(holder.TypeName())
        if inner_class is None:
            holder.value = b""
            return
        inner: Message = inner_class()
        inner.ParseFromString(holder.value)
        _blank_all(inner)
        holder.value = inner.SerializeToString(deterministic=True)
        return
    for field, value in message.ListFields():
        _blank(message, field, value)
