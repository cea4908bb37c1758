"""relay.yaml_nodes: lines and repeated keys in composed YAML node trees."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from relay.yaml_nodes import (
    duplicate_keys,
    locate,
    mapping_entry,
    mapping_value,
    node_line,
    sequence_items,
)


def compose(text: str) -> yaml.Node:
    """The node tree of one YAML document; line numbers below count from its first line."""
    node = yaml.compose(textwrap.dedent(text).lstrip("\n"), Loader=yaml.SafeLoader)
    assert node is not None
    return node


def scalar(node: yaml.Node | None) -> str:
    assert isinstance(node, yaml.ScalarNode)
    return str(node.value)


# -- lines and lookups -----------------------------------------------------------


def test_node_line_is_one_based_and_none_for_no_node() -> None:
    root = compose("""
        a: 1
        b:
          - x
        """)
    assert node_line(root) == 1
    assert node_line(mapping_value(root, "b")) == 3
    assert node_line(None) is None


def test_mapping_entry_gives_key_and_value_of_the_last_repeat() -> None:
    root = compose("""
        a: first
        b: other
        a: last
        """)
    entry = mapping_entry(root, "a")
    assert entry is not None
    key, value = entry
    assert (node_line(key), scalar(value)) == (3, "last")  # the value PyYAML keeps
    assert scalar(mapping_value(root, "b")) == "other"


@pytest.mark.parametrize(("text", "key"), [
    pytest.param("a: 1\n", "b", id="absent"),
    pytest.param("- a\n", "a", id="a-list"),
    pytest.param("a\n", "a", id="a-scalar"),
    pytest.param("? [a]\n: 1\n", "['a']", id="non-scalar-key"),
])
def test_mapping_lookups_find_nothing_where_there_is_no_such_key(text: str, key: str) -> None:
    root = compose(text)
    assert mapping_entry(root, key) is None
    assert mapping_value(root, key) is None
    assert mapping_value(None, key) is None


def test_sequence_items_pairs_items_only_with_a_list_of_that_length() -> None:
    root = compose("""
        items:
          - a
          - b
        other: x
        """)
    items = mapping_value(root, "items")
    assert [scalar(item) for item in sequence_items(items, 2)] == ["a", "b"]
    assert sequence_items(items, 3) == [None, None, None]
    assert sequence_items(mapping_value(root, "other"), 1) == [None]
    assert sequence_items(None, 2) == [None, None]


LOCATED = """
    server:
      address: x
    upstream:
      tls:
        ca_file: y
    list:
      - a
      - name: b
        port: 1
    """


@pytest.mark.parametrize(("path", "line", "depth"), [
    pytest.param((), 1, 0, id="root"),
    pytest.param(("server",), 1, 1, id="section-is-its-key-line"),
    pytest.param(("upstream", "tls", "ca_file"), 5, 3, id="nested-key"),
    pytest.param(("upstream", "tls", "cert_file"), 4, 2, id="absent-key-stops-at-parent"),
    pytest.param(("nope", "deeper"), 1, 0, id="absent-first-key"),
    pytest.param(("list", 1, "port"), 9, 3, id="through-a-list"),
    pytest.param(("list", 0), 7, 2, id="list-item-is-its-own-line"),
    pytest.param(("list", 5, "port"), 6, 1, id="index-out-of-range"),
    pytest.param(("list", -1), 6, 1, id="negative-index"),
    pytest.param(("list", "0"), 6, 1, id="string-on-a-list"),
    pytest.param(("server", "address", "x"), 2, 2, id="into-a-scalar"),
])
def test_locate_goes_as_deep_as_the_path_is_present(
        path: tuple[str | int, ...], line: int, depth: int) -> None:
    found = locate(compose(LOCATED), path)
    assert (found.line, found.depth) == (line, depth)


def test_locate_gives_the_value_node_and_matches_int_parts_as_mapping_keys() -> None:
    root = compose("""
        ports:
          0: zero
        block:
          inner: 1
        """)
    assert scalar(locate(root, ("ports", 0)).node) == "zero"
    found = locate(root, ("block",))
    # The key's line for messages about the key; the value's for the value itself.
    assert (found.line, node_line(found.node)) == (3, 4)


# -- repeated keys ---------------------------------------------------------------


def test_no_duplicates_in_a_document_without_repeats() -> None:
    assert duplicate_keys(compose(LOCATED)) == []


def test_duplicate_key_names_its_path_line_and_first_line() -> None:
    root = compose("""
        node: {id: a}
        upstream:
          address: x
          address: y
        """)
    [found] = duplicate_keys(root)
    assert (found.path, found.key, found.line, found.first_line) == (
        ("upstream", "address"), "address", 4, 3)
    assert found.node.start_mark.line + 1 == 4


def test_every_repeat_is_reported_in_document_order() -> None:
    root = compose("""
        a: 1
        b:
          c: 1
          c: 2
        a: 2
        a: 3
        """)
    assert [(d.path, d.line, d.first_line) for d in duplicate_keys(root)] == [
        (("b", "c"), 4, 3), (("a",), 5, 1), (("a",), 6, 1)]


def test_duplicates_inside_lists_have_indexed_paths() -> None:
    root = compose("""
        items:
          - {x: 1}
          - {x: 1, x: 2}
        """)
    [found] = duplicate_keys(root)
    assert found.path == ("items", 1, "x")


def test_same_key_in_different_mappings_is_not_a_duplicate() -> None:
    assert duplicate_keys(compose("a: {x: 1}\nb: {x: 1}\n")) == []


def test_keys_are_compared_by_their_text() -> None:
    # 1 and "1" construct to different keys, but a config or resource file
    # that means both is confusing either way.
    [found] = duplicate_keys(compose('1: a\n"1": b\n'))
    assert (found.key, found.line, found.first_line) == ("1", 2, 1)


def test_non_scalar_keys_are_not_compared() -> None:
    assert duplicate_keys(compose("? [a]\n: 1\n? [a]\n: 2\n")) == []


def test_merge_keys_are_not_duplicates_and_what_they_merge_is_searched() -> None:
    root = compose("""
        base: &base {a: 1, b: 2}
        one:
          <<: *base
          a: 3
        two:
          <<: [*base]
          <<: {c: 1, c: 2}
        """)
    # `a` overriding a merged `a`, and `<<` twice: neither is a repeated key.
    [found] = duplicate_keys(root)
    assert (found.path, found.line, found.first_line) == (("two", "c"), 7, 7)


def test_a_quoted_merge_key_is_an_ordinary_key() -> None:
    [found] = duplicate_keys(compose('"<<": 1\n"<<": 2\n'))
    assert found.key == "<<"


def test_aliased_nodes_are_searched_once_and_cycles_end() -> None:
    root = compose("""
        a: &dup {x: 1, x: 2}
        b: *dup
        c: &loop
          self: *loop
        """)
    [found] = duplicate_keys(root)
    assert found.path == ("a", "x")


def test_duplicates_must_be_found_before_construction_flattens_merges() -> None:
    text = "base: &b {a: 1}\nm:\n  <<: *b\n  a: 2\n"
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        assert root is not None
        assert duplicate_keys(root) == []
        loader.construct_document(root)
    finally:
        loader.dispose()
    # Construction merged `a: 1` into `m` in place: now it looks repeated.
    assert [d.path for d in duplicate_keys(root)] == [("m", "a")]
