"""Secrets left out of what the relay shows: its admin views and CSDS.

As Envoy's admin does, a field marked ``(udpa.annotations.sensitive)`` in the
xDS protos (a ``Secret``'s private key, password, session ticket keys, a
generic secret, an OAuth2 token, ...) is shown as ``[redacted]``, wherever it
sits: inside ``Any`` fields too (a Listener's inline ``DownstreamTlsContext``).
What is sent to clients is never touched; only copies made for display are.
An ``Any`` of a type that no installed module describes is shown empty: what
cannot be read cannot be checked.

A ``TypedStruct`` (``xds.type.v3`` or ``udpa.type.v1``) holds a message as
JSON in a ``Struct``; its type URL names the message. Its JSON is walked by
that type's fields (by proto name or JSON name, as a JSON parser reads them):
sensitive ones become ``"[redacted]"`` (bytes: that marker in base64, so the
JSON still parses), every other value is kept exactly as written. Where Envoy
would show secrets, the relay does not:

- a type URL that no installed module describes: Envoy shows the ``Struct``
  as it is; here it is left out, as an unknown ``Any``'s bytes are;
- JSON that does not parse as the named type (Envoy then shows it all): a key
  the type does not have, or a value of the wrong JSON kind where secrets may
  be, has its every string shown as ``"[redacted]"`` and its other scalars as
  ``null``; the rest is still walked by field name.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any, cast

from google.protobuf import any_pb2, struct_pb2, symbol_database
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from udpa.annotations import sensitive_pb2

__all__ = ["REDACTED", "message_class", "redacted"]

REDACTED = "[redacted]"
_ANY = any_pb2.Any.DESCRIPTOR.full_name
_STRING, _BYTES = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES
_TYPED_STRUCTS = frozenset({"xds.type.v3.TypedStruct", "udpa.type.v1.TypedStruct"})
# A TypedStruct's own fields, as JSON may spell them: the type is named, not walked.
_TYPE_URL_KEYS = frozenset({"type_url", "typeUrl"})
# Well-known types whose JSON is not an object of their fields: free JSON, and
# those shown as one scalar (wrappers, Duration, Timestamp, FieldMask). Inside
# an ``Any``'s JSON they sit under "value".
_FREE_JSON = frozenset(f"google.protobuf.{name}" for name in ("Struct", "Value", "ListValue"))
_SCALAR_JSON = frozenset(f"google.protobuf.{name}" for name in (
    "DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value", "UInt32Value",
    "BoolValue", "StringValue", "BytesValue", "Duration", "Timestamp", "FieldMask"))
_REDACTED_BASE64 = base64.b64encode(REDACTED.encode()).decode()


def _is_sensitive(field: FieldDescriptor) -> bool:
    return bool(field.GetOptions().Extensions[sensitive_pb2.sensitive])


@cache
def _may_hold_secrets(descriptor: Descriptor) -> bool:
    """Whether a message of this type can hold a sensitive field (an ``Any``
    might hold anything). Messages that cannot are not walked."""
    return _reaches_secrets(descriptor, set())


def _reaches_secrets(descriptor: Descriptor, seen: set[str]) -> bool:
    if descriptor.full_name == _ANY or descriptor.full_name in _TYPED_STRUCTS:
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
    if message.DESCRIPTOR.full_name in _TYPED_STRUCTS:
        return _redact_typed_struct(message, sensitive=False)
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
    if message.DESCRIPTOR.full_name in _TYPED_STRUCTS:
        _redact_typed_struct(message, sensitive=True)  # keeps the type URL too
        return
    for field, value in message.ListFields():
        _blank(message, field, value)


# --------------------------------------------------------------------------- TypedStruct
#
# A TypedStruct's message is JSON (a Struct), walked as its type's JSON mapping
# reads it rather than parsed and re-encoded: what is not sensitive stays
# exactly as the origin wrote it, and JSON that would not parse is still
# redacted field by field. ``sensitive`` is "under a sensitive field": then
# everything of the value goes, as _blank_all does to messages.


def _redact_typed_struct(message: Message, *, sensitive: bool) -> bool:
    """Redact a TypedStruct's JSON, in place; whether anything was."""
    typed: Any = message
    inner = _type_named(typed.type_url)
    if inner is None:
        # A type no installed module describes (fail closed, as for Any):
        # its JSON is left out, its type URL stays.
        if not typed.value.fields:
            return False
        typed.ClearField("value")
        return True
    return _walk_struct(typed.value, inner, sensitive)


def _type_named(type_url: str) -> Descriptor | None:
    """The message type a type URL names, if an installed module has it."""
    found = message_class(type_url.rpartition("/")[2]) if type_url else None
    return None if found is None else cast(Descriptor, found.DESCRIPTOR)


@cache
def _json_fields(descriptor: Descriptor) -> dict[str, FieldDescriptor]:
    """A message's fields by the keys its JSON may use: proto and JSON names."""
    fields = {field.name: field for field in descriptor.fields}
    fields.update((field.json_name, field) for field in descriptor.fields)
    return fields


def _walk_value(value: struct_pb2.Value, descriptor: Descriptor, sensitive: bool) -> bool:
    """Redact ``value``, the JSON of a ``descriptor`` message; whether anything was."""
    if not sensitive and not _may_hold_secrets(descriptor):
        return False
    kind = value.WhichOneof("kind")
    if kind is None or kind == "null_value":
        return False
    if descriptor.full_name in _FREE_JSON:
        return _scrub(value)  # reached only under a sensitive field
    if descriptor.full_name in _SCALAR_JSON:
        wrapped = descriptor.fields_by_name.get("value")
        if wrapped is not None:  # a wrapper: its one value, as a field of that type
            return _blank_scalar(value, wrapped)
        value.null_value = struct_pb2.NULL_VALUE
        return True
    if kind != "struct_value":
        return _scrub(value)  # not the object this message would be
    return _walk_struct(value.struct_value, descriptor, sensitive)


def _walk_struct(obj: struct_pb2.Struct, descriptor: Descriptor, sensitive: bool) -> bool:
    """Redact ``obj``, a JSON object that should be a ``descriptor`` message."""
    if not sensitive and not _may_hold_secrets(descriptor):
        return False
    name = descriptor.full_name
    if name in _FREE_JSON or name in _SCALAR_JSON:
        return _scrub_struct(obj)  # an object where these types' JSON is not one
    if name == _ANY:
        return _walk_any(obj, sensitive)
    return _walk_object(obj, descriptor, sensitive, skip=frozenset())


def _walk_object(obj: struct_pb2.Struct, descriptor: Descriptor, sensitive: bool,
                 skip: frozenset[str]) -> bool:
    """A message that is a JSON object, but for the keys in ``skip``."""
    if descriptor.full_name in _TYPED_STRUCTS:
        return _walk_typed_struct(obj, sensitive, skip)
    return _walk_fields(obj, descriptor, sensitive, skip)


def _walk_any(obj: struct_pb2.Struct, sensitive: bool) -> bool:
    """An ``Any`` in JSON: ``"@type"`` and the message's fields beside it (or
    under ``"value"`` for a well-known type whose JSON is not an object)."""
    type_url = obj.fields["@type"].string_value if "@type" in obj.fields else ""
    inner = _type_named(type_url)
    if inner is None:
        return _drop(obj, keep={"@type"} if type_url else set())
    if inner.full_name in _FREE_JSON or inner.full_name in _SCALAR_JSON or \
            inner.full_name == _ANY:
        changed = _drop(obj, keep={"@type", "value"})
        if "value" in obj.fields:
            changed = _walk_value(obj.fields["value"], inner, sensitive) or changed
        return changed
    return _walk_object(obj, inner, sensitive, skip=frozenset({"@type"}))


def _walk_typed_struct(obj: struct_pb2.Struct, sensitive: bool, skip: frozenset[str]
                       ) -> bool:
    """A TypedStruct in JSON: its type URL, and its message's JSON in "value"."""
    type_url = next((obj.fields[key].string_value for key in _TYPE_URL_KEYS
                     if key in obj.fields), "")
    inner = _type_named(type_url)
    changed = _drop(obj, keep=skip | _TYPE_URL_KEYS | ({"value"} if inner else set()))
    if inner is not None and "value" in obj.fields:
        changed = _walk_value(obj.fields["value"], inner, sensitive) or changed
    return changed


def _walk_fields(obj: struct_pb2.Struct, descriptor: Descriptor, sensitive: bool,
                 skip: frozenset[str]) -> bool:
    """Each key of ``obj`` as the field of ``descriptor`` it names."""
    fields = _json_fields(descriptor)
    changed = False
    for key, value in obj.fields.items():
        if key in skip:
            continue
        field = fields.get(key)
        if field is None:
            # A key the type does not have (a newer version's field?): it cannot
            # be told apart from a secret.
            changed = _scrub(value) or changed
            continue
        hidden = sensitive or _is_sensitive(field)
        kind = value.WhichOneof("kind")
        if kind is None or kind == "null_value":
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            if not hidden and (entry.message_type is None
                               or not _may_hold_secrets(entry.message_type)):
                continue
            if kind != "struct_value":
                changed = _scrub(value) or changed
                continue
            for item in value.struct_value.fields.values():
                changed = (_walk_value(item, entry.message_type, hidden)
                           if entry.message_type is not None
                           else _blank_scalar(item, entry, in_map=True)) or changed
        elif field.message_type is not None:
            if not hidden and not _may_hold_secrets(field.message_type):
                continue
            if not field.is_repeated:
                changed = _walk_value(value, field.message_type, hidden) or changed
            elif kind != "list_value":
                changed = _scrub(value) or changed
            else:
                for item in value.list_value.values:
                    changed = _walk_value(item, field.message_type, hidden) or changed
        elif not hidden:
            continue
        elif not field.is_repeated:
            changed = _blank_scalar(value, field) or changed
        elif kind == "list_value" and field.type in (_STRING, _BYTES):
            for item in value.list_value.values:
                changed = _blank_scalar(item, field) or changed
        else:
            # Other repeated scalars of a sensitive field are cleared, as Envoy does.
            value.null_value = struct_pb2.NULL_VALUE
            changed = True
    return changed


def _blank_scalar(value: struct_pb2.Value, field: FieldDescriptor, in_map: bool = False
                  ) -> bool:
    """One sensitive scalar in JSON: strings and bytes become the marker (bytes
    in base64, as JSON shows them); others are cleared (``null``), or in a map,
    where ``null`` does not parse, their type's zero."""
    kind = value.WhichOneof("kind")
    if kind is None or kind == "null_value":
        return False
    if field.type == _STRING:
        value.string_value = REDACTED
    elif field.type == _BYTES:
        value.string_value = _REDACTED_BASE64
    elif not in_map:
        value.null_value = struct_pb2.NULL_VALUE
    elif field.type == FieldDescriptor.TYPE_BOOL:
        value.bool_value = False
    else:
        value.number_value = 0
    return True


def _drop(obj: struct_pb2.Struct, keep: set[str] | frozenset[str]) -> bool:
    """Remove the keys of ``obj`` not in ``keep``; whether any were."""
    dropped = [key for key in obj.fields if key not in keep]
    for key in dropped:
        del obj.fields[key]
    return bool(dropped)


def _scrub(value: struct_pb2.Value) -> bool:
    """JSON nothing describes: every string shown as ``[redacted]``, every
    other scalar as ``null``; its shape (keys, lengths) stays."""
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return _scrub_struct(value.struct_value)
    if kind == "list_value":
        changed = False
        for item in value.list_value.values:
            changed = _scrub(item) or changed
        return changed
    if kind == "string_value":
        value.string_value = REDACTED
        return True
    if kind in ("number_value", "bool_value"):
        value.null_value = struct_pb2.NULL_VALUE
        return True
    return False


def _scrub_struct(obj: struct_pb2.Struct) -> bool:
    changed = False
    for value in obj.fields.values():
        changed = _scrub(value) or changed
    return changed
