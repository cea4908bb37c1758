"""The running config as the admin server's ``/config`` shows it: every key,
defaults included, written as the YAML would write it (``5ms``, ``1MiB``,
``host:port``), with secrets left out.

What is left out, as ``[redacted]``: the values of ``initial_metadata`` (the
headers sent to an origin often carry credentials; their names are shown),
and the password of any URL (``redis://:secret@cache:6379``,
``http://user:secret@collector:4318``). Files are shown by their paths, never
their contents: ``token_file``, ``password_file`` and the TLS keys are read
by the relay, not shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel

from relay.config.values import Shown

__all__ = ["REDACTED", "running_config"]

REDACTED = "[redacted]"
# keys whose values are redacted, whatever they hold (their names are shown)
_REDACTED_VALUES = frozenset({"initial_metadata"})


def running_config(config: BaseModel) -> dict[str, Any]:
    """``config`` (a :class:`~relay.config.RelayConfig`) as plain JSON, redacted."""
    return _section(config)


def _section(model: BaseModel) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if name in _REDACTED_VALUES and isinstance(value, dict):
            shown[name] = {str(key): REDACTED for key in value}
        else:
            shown[name] = _value(value, field.metadata)
    return shown


def _value(value: object, metadata: Sequence[object] = ()) -> Any:
    if value is None:
        return None
    if isinstance(value, BaseModel):
        return _section(value)
    for meta in metadata:
        if isinstance(meta, Shown):
            return meta.format(value)
    if isinstance(value, dict):
        return {str(key): _value(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_value(item) for item in value]
    if isinstance(value, bool | int | float):
        return value
    return _without_password(str(value))  # strings, addresses, paths


def _without_password(text: str) -> str:
    """``text``, with the password of a URL in it redacted."""
    if "://" not in text:
        return text
    try:
        url = urlsplit(text)
        password = url.password
    except ValueError:  # not a URL after all (a port that is no number)
        return text
    if not password:
        return text
    user = url.username or ""
    host = url.netloc.rsplit("@", 1)[1]
    return urlunsplit(url._replace(netloc=f"{user}:{REDACTED}@{host}"))
