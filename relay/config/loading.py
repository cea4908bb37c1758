"""Reading a config: YAML to a node tree and data, data to :class:`RelayConfig`.

The YAML is composed once into a node tree; the plain Python data built from
that tree is validated by pydantic, and the tree itself is kept so that every
problem, a repeated key or a pydantic error, can be traced back to its line.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from relay.config.errors import ConfigError
from relay.config.models import RelayConfig, section_model
from relay.config.values import yaml_kind
from relay.yaml_nodes import KeyPath, duplicate_keys, locate

__all__ = ["load_config", "parse_config"]


def load_config(path: str | os.PathLike[str]) -> RelayConfig:
    """Read and validate the config file at ``path``.

    Raises :class:`ConfigError` (naming the file) when it cannot be read, is
    not valid YAML, or does not match the schema.
    """
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError as exc:
        raise ConfigError(source, None, "", f"cannot read file: not UTF-8 ({exc.reason})") from exc
    except OSError as exc:
        raise ConfigError(source, None, "", f"cannot read file: {exc.strerror or exc}") from exc
    return parse_config(text, source)


def parse_config(text: str, source: str = "<string>") -> RelayConfig:
    """Validate config ``text``; ``source`` names it in errors (a file name)."""
    root, data = _parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(source, root.start_mark.line + 1, "",
                          f"expected a mapping at the top level, got {yaml_kind(data)}")
    # Reported along with schema errors so one run shows everything to fix.
    errors = _duplicate_key_errors(root, source)
    try:
        config = RelayConfig.model_validate(data)
    except ValidationError as exc:
        errors += [_convert_error(error, root, source) for error in exc.errors()]
    if errors:
        raise ConfigError.collect(errors)
    return config


def _parse_yaml(text: str, source: str) -> tuple[yaml.Node, object]:
    """Compose ``text`` into a node tree and construct its data from it.

    Composing once and constructing from the same tree keeps the marks used
    for line numbers in step with the data pydantic sees.
    """
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        # Duplicate checks and line lookups must see the tree as written:
        # construction flattens `<<` merges into it in place.
        tree = _copy_tree(root) if root is not None else None
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(source, line, "", f"invalid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(source, None, "", f"invalid YAML: {exc}") from exc
    finally:
        loader.dispose()
    if tree is None or data is None:  # no document, or an explicit `---` with nothing in it
        raise ConfigError(source, None, "",
                          "empty document: expected a mapping with at least 'node' and 'upstream'")
    return tree, data


def _copy_tree(node: yaml.Node) -> yaml.Node:
    """A shallow structural copy of a node tree (aliases stay shared)."""
    memo: dict[int, yaml.Node] = {}

    def copy(n: yaml.Node) -> yaml.Node:
        if id(n) in memo:
            return memo[id(n)]
        if isinstance(n, yaml.MappingNode):
            clone: yaml.Node = yaml.MappingNode(n.tag, [], n.start_mark, n.end_mark)
            memo[id(n)] = clone
            clone.value = [(copy(k), copy(v)) for k, v in n.value]
        elif isinstance(n, yaml.SequenceNode):
            clone = yaml.SequenceNode(n.tag, [], n.start_mark, n.end_mark)
            memo[id(n)] = clone
            clone.value = [copy(item) for item in n.value]
        else:
            clone = n
            memo[id(n)] = clone
        return clone

    return copy(node)


def _duplicate_key_errors(root: yaml.Node, source: str) -> list[ConfigError]:
    """Keys repeated within one mapping (PyYAML would silently keep the last)."""
    return [ConfigError(source, duplicate.line, _dotted(duplicate.path),
                        f"duplicate key (first set on line {duplicate.first_line})")
            for duplicate in duplicate_keys(root)]


def _dotted(path: KeyPath) -> str:
    """A path in the document as ``a.b[0].c``, for every error (lists: metadata,
    ``server.authorization.allow``)."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text = f"{text}.{part}" if text else part
    return text


def _line_of(root: yaml.Node, loc: Sequence[int | str]) -> int:
    """The line of the deepest element of ``loc`` present in the YAML tree.

    For a mapping key that is the key's line (so errors about a whole section
    point at ``upstream:``); for the document itself, where it starts.
    """
    return locate(root, loc).line


def _section_model(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``loc``, if any."""
    model: type[BaseModel] = RelayConfig
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list of sections (server.authorization.secrets)
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        inner = section_model(field.annotation) or _item_model(field.annotation)
        if inner is None:
            return None
        model = inner
    return model


def _item_model(annotation: object) -> type[BaseModel] | None:
    """The model of the items of a list field (``list[X]`` or ``list[X] | None``)."""
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is list:
            return section_model(typing.get_args(arg)[0])
    return None


_TYPE_ERRORS: dict[str, str] = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
}


def _convert_error(error: Any, root: yaml.Node, source: str) -> ConfigError:
    """Turn one pydantic error into a ConfigError with a human problem text."""
    loc: list[int | str] = list(error["loc"])
    kind = error["type"]
    value = error.get("input")
    if loc and loc[-1] == "[key]":  # pydantic's marker for a bad mapping key
        loc.pop()
        # a key that is text but not what the mapping takes (an authority, say)
        # says why; any other is not text at all
        kind = kind if kind == "value_error" and isinstance(value, str) else "invalid_key"
    if kind == "missing":
        return ConfigError(source, _line_of(root, loc[:-1]), _dotted(tuple(loc)), "field required")
    if kind == "extra_forbidden":
        model = _section_model(loc[:-1])
        allowed = ", ".join(model.model_fields) if model is not None else ""
        problem = f"unknown key (allowed: {allowed})" if allowed else "unknown key"
        return ConfigError(source, _line_of(root, loc), _dotted(tuple(loc)), problem)
    if kind == "invalid_key":
        problem = f"keys must be strings, got {yaml_kind(value)} {value!r}"
    elif kind in _TYPE_ERRORS:
        problem = f"expected {_TYPE_ERRORS[kind]}, got {yaml_kind(value)}"
    elif kind == "string_too_short":
        problem = "must not be empty"
    elif kind in ("value_error", "assertion_error") and "error" in error.get("ctx", {}):
        problem = str(error["ctx"]["error"])
    else:
        problem = error["msg"]
    return ConfigError(source, _line_of(root, loc), _dotted(tuple(loc)), problem)
