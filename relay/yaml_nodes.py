"""Line numbers and repeated keys in composed YAML node trees.

The data PyYAML constructs has no line numbers, and of a key given twice in
one mapping it silently keeps the last. The config loader and the file source
both compose YAML into a node tree first and use these helpers on that tree:
to find the line of a node or of a path of keys and list indexes, and to find
keys repeated within one mapping. Each user words its own messages.

Pure functions of the node tree: no I/O, and nothing of the config schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import yaml

__all__ = [
    "MERGE_TAG",
    "DuplicateKey",
    "KeyPath",
    "Location",
    "duplicate_keys",
    "locate",
    "mapping_entry",
    "mapping_value",
    "node_line",
    "sequence_items",
]

#: The tag of a ``<<`` merge key: not a key of its own mapping but a merge of another.
MERGE_TAG = "tag:yaml.org,2002:merge"

#: A path into a node tree: mapping keys and list indexes, from the root.
KeyPath = tuple[str | int, ...]


def node_line(node: yaml.Node | None) -> int | None:
    """The 1-based line ``node`` starts on; ``None`` for no node."""
    return node.start_mark.line + 1 if node is not None else None


def _start_line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def mapping_entry(node: yaml.Node | None, key: str) -> tuple[yaml.ScalarNode, yaml.Node] | None:
    """The key and value nodes of ``key`` in a mapping node, or ``None``.

    Of a key given twice, the last: the one whose value PyYAML keeps.
    """
    if not isinstance(node, yaml.MappingNode):
        return None
    for key_node, value_node in reversed(node.value):
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return key_node, value_node
    return None


def mapping_value(node: yaml.Node | None, key: str) -> yaml.Node | None:
    """The value node of ``key`` in a mapping node (see :func:`mapping_entry`), or ``None``."""
    entry = mapping_entry(node, key)
    return entry[1] if entry is not None else None


def sequence_items(node: yaml.Node | None, count: int) -> list[yaml.Node | None]:
    """The item nodes of a sequence node of ``count`` items; ``None`` for each otherwise.

    For pairing constructed list items with their nodes: where the node is not
    the list the data came from (JSON, a merge), no item has a line.
    """
    if isinstance(node, yaml.SequenceNode) and len(node.value) == count:
        return list(node.value)
    return [None] * count


@dataclass(frozen=True, slots=True)
class Location:
    """The deepest element of a path found in a node tree (see :func:`locate`)."""

    #: Its value: the node a mapping key maps to, or the list item itself.
    node: yaml.Node
    #: Its line: the key's for a mapping entry, the item's own for a list item.
    line: int
    #: How many elements of the path were found (0: only the root).
    depth: int


def locate(root: yaml.Node, path: Sequence[str | int]) -> Location:
    """Follow ``path`` (mapping keys, list indexes) from ``root`` as far as it goes.

    A mapping is searched for a scalar key equal to ``str(part)`` (the last
    such key, as PyYAML keeps it); a list is indexed by an ``int`` part. The
    walk stops at the first part that is absent, so a path that goes wrong
    half way still locates what it got right.
    """
    node, line, depth = root, _start_line(root), 0
    for part in path:
        if isinstance(node, yaml.MappingNode):
            entry = mapping_entry(node, str(part))
            if entry is None:
                break
            line, node = _start_line(entry[0]), entry[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                break
            node = node.value[part]
            line = _start_line(node)
        else:
            break
        depth += 1
    return Location(node, line, depth)


@dataclass(frozen=True, slots=True)
class DuplicateKey:
    """A key given a second (or later) time in one mapping."""

    #: From the root to the repeated key, that key last (merge keys add nothing).
    path: KeyPath
    #: The repeated key's node: its ``start_mark`` is where the repeat is.
    node: yaml.ScalarNode
    #: The line the key was first given on.
    first_line: int

    @property
    def key(self) -> str:
        """The repeated key."""
        return str(self.node.value)

    @property
    def line(self) -> int:
        """The line of the repeat."""
        return _start_line(self.node)


def duplicate_keys(root: yaml.Node) -> list[DuplicateKey]:
    """Every key repeated within one mapping under ``root``, in document order.

    Keys are compared by their scalar text; keys that are not scalars are not
    compared. ``<<`` merge keys are not keys of their mapping (PyYAML merges
    each of them), but what they merge is searched like any other value. Call
    it on a tree that has not been constructed: construction flattens merges
    into the mappings in place. Aliased nodes are searched once.
    """
    found: list[DuplicateKey] = []
    seen: set[int] = set()

    def walk(node: yaml.Node, path: KeyPath) -> None:
        if id(node) in seen:  # aliases make the tree a graph, possibly a cyclic one
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int] = {}
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == MERGE_TAG:
                    walk(value, path)
                    continue
                here = (*path, key.value)
                if key.value in first_line:
                    found.append(DuplicateKey(here, key, first_line[key.value]))
                else:
                    first_line[key.value] = _start_line(key)
                walk(value, here)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, (*path, index))

    walk(root, ())
    return found
