"""Every config key with its default and description, read off the models.

Generated from the pydantic models rather than kept by hand, so the listing
(``xds-relay keys``) cannot drift from what the relay accepts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from relay.config.models import RelayConfig, section_model
from relay.config.values import Shown

__all__ = ["REQUIRED", "UNSET", "ConfigKey", "config_keys"]

#: The default shown for a key that has none: the config must set it.
REQUIRED = "(required)"
#: The default shown for a key that is unset (``None``) unless the config sets it.
UNSET = "(none)"


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One leaf key: its dotted path, its default as YAML would write it, what it does."""

    key: str
    default: str
    description: str

    def __str__(self) -> str:
        return f"{self.key} = {self.default}  # {self.description}"


def config_keys(model: type[BaseModel] = RelayConfig, prefix: str = "") -> list[ConfigKey]:
    """The leaf keys of ``model`` and its sections, depth first in declaration order.

    A field holding a section (a model, optional or not) is not a key itself:
    its own fields are, under its name. Keys of an optional section such as
    ``upstream.tls`` show their defaults within that section.
    """
    keys: list[ConfigKey] = []
    for name, field in model.model_fields.items():
        section = section_model(field.annotation)
        if section is not None:
            keys += config_keys(section, f"{prefix}{name}.")
        else:
            keys.append(ConfigKey(f"{prefix}{name}", _default(field), field.description or ""))
    return keys


def _default(field: FieldInfo) -> str:
    """The field's default as it would be written in the YAML."""
    if field.is_required():
        return REQUIRED
    value = field.get_default(call_default_factory=True)
    if value is None:
        return UNSET
    for meta in field.metadata:
        if isinstance(meta, Shown):
            return meta.format(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict | list):
        return json.dumps(value)  # flow style: JSON is YAML
    text = str(value)  # strings, and values written as strings (addresses, paths)
    # Quoted where YAML would read the bare text as something else ("", "yes", "1.0").
    return text if yaml.safe_load(text) == text else json.dumps(text)
