"""A node group's registry entry: what a warm start restores a group from."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2

from relay.persistence.entries import CorruptEntry
from relay.persistence.groups import StoredGroup, decode_group, encode_group


def test_an_entry_reads_back_as_written() -> None:
    node = base_pb2.Node(id="relay-1", cluster="checkout")
    node.metadata.update({"NAMESPACE": "shop", "LABELS": {"app": "cart"}})
    group = StoredGroup("g-0123456789ab", ("cluster", "metadata.NAMESPACE"),
                        ("checkout", "shop"), node)
    assert decode_group(encode_group(group)) == group


@pytest.mark.parametrize(("entry", "why"), [
    (b"not json", "not a node group entry: Expecting value: line 1 column 1 (char 0)"),
    (b'{"id": "g-1", "fields": [], "key": []}', "not a node group entry: 'node'"),
    (b'{"id": "g-1", "fields": [], "key": [1], "node": ""}',
     "not a node group entry: id, fields and key are strings"),
    (b'{"id": "g-1", "fields": [], "key": [], "node": "%%"}',
     "not a node group entry: Only base64 data is allowed"),
])
def test_a_bad_entry_says_why(entry: bytes, why: str) -> None:
    with pytest.raises(CorruptEntry) as bad:
        decode_group(entry)
    assert str(bad.value) == why
