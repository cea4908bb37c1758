"""Where the bulk check of one origin response of 2,000 x 300 B goes, by stage.

Run from a tree's root (``python PATH/parse_stages.py [TREE]``; TREE, the
relay package's tree, defaults to the current directory). Prints, in ms (min
/ median of 20): decoding the DeltaDiscoveryResponse, re-encoding it, the
shadow parses of :mod:`relay.upstream.bulk` (``Listed``, ``Entries``,
``Checked``), framing the entries, making the cached copies, the whole
``parse_response``; then ``Checked`` against shadow types whose resource
names and versions are bytes, or not declared (unknown fields), and each
body decoded on its own (a ClusterLoadAssignment of 14 endpoints).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def timed(step: Callable[[], object], runs: int = 20) -> str:
    spent = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        spent.append((time.perf_counter() - start) * 1e3)
    return f"{min(spent):.2f} / {statistics.median(spent):.2f}"


def shadow_variants() -> tuple[Any, Any]:
    """Checked's shape with name and version as bytes, and with neither declared."""
    from envoy.config.endpoint.v3 import endpoint_pb2
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="parse_stages/shadows.proto",
                                              package="parse_stages", syntax="proto2")
    file.dependency.append(endpoint_pb2.DESCRIPTOR.name)
    body = ".envoy.config.endpoint.v3.ClusterLoadAssignment"
    shapes: dict[str, list[tuple[str, int, int, str | None]]] = {
        "BytesBody": [("type_url", 1, field.TYPE_BYTES, None),
                      ("value", 2, field.TYPE_MESSAGE, body)],
        "BytesResource": [("version", 1, field.TYPE_BYTES, None),
                          ("resource", 2, field.TYPE_MESSAGE, ".parse_stages.BytesBody"),
                          ("name", 3, field.TYPE_BYTES, None)],
        "Bytes": [("resources", 2, field.TYPE_MESSAGE, ".parse_stages.BytesResource")],
        "BareBody": [("value", 2, field.TYPE_MESSAGE, body)],
        "BareResource": [("resource", 2, field.TYPE_MESSAGE, ".parse_stages.BareBody")],
        "Bare": [("resources", 2, field.TYPE_MESSAGE, ".parse_stages.BareResource")],
    }
    for name, fields in shapes.items():
        made = file.message_type.add(name=name)
        for field_name, number, kind, type_name in fields:
            label = field.LABEL_REPEATED if field_name == "resources" else field.LABEL_OPTIONAL
            added = made.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name is not None:
                added.type_name = type_name
    pool = descriptor_pool.Default()
    pool.Add(file)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(
        f"parse_stages.{name}")) for name in ("Bytes", "Bare"))  # type: ignore[return-value]


def main() -> None:
    sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
    from envoy.config.endpoint.v3 import endpoint_pb2
    from envoy.service.discovery.v3 import discovery_pb2

    from benchmarks.cold_path import ENDPOINT, origin_responses
    from relay.resource import CachedResource
    from relay.runtime import tune_gc
    from relay.upstream import bulk
    from relay.upstream.responses import parse_response

    raw = origin_responses(2_000, 300, 2_000)[0]
    tune_gc()
    found = bulk.shadows(ENDPOINT)
    response = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
    encoded = response.SerializeToString()
    payloads = found.entries.FromString(encoded).resources
    entries = [bulk._entry_prefix(len(payload)) + payload for payload in payloads]
    joined = b"".join(entries)
    listed = bulk._plain_listed(found, encoded, ENDPOINT, 2_000)
    assert listed is not None
    names, versions = listed
    bodies = [resource.resource.value for resource in response.resources]
    as_bytes, bare = shadow_variants()
    stages: dict[str, Callable[[], object]] = {
        "decode the response": lambda: discovery_pb2.DeltaDiscoveryResponse.FromString(raw),
        "encode it again": response.SerializeToString,
        "Listed": lambda: bulk._plain_listed(found, encoded, ENDPOINT, 2_000),
        "Entries": lambda: list(found.entries.FromString(encoded).resources),
        "frame the entries": lambda: [bulk._entry_prefix(len(p)) + p for p in payloads],
        "Checked (decodes every body)": lambda: found.checked.FromString(joined),
        "the cached copies": lambda: CachedResource.from_encoded_many(
            ENDPOINT, names, versions or [], entries, 0.0),
        "parse_response, whole": lambda: parse_response(response),
        "Checked, names and versions as bytes": lambda: as_bytes.FromString(joined),
        "Checked, names and versions unknown": lambda: bare.FromString(joined),
        "each body on its own": lambda: [
            endpoint_pb2.ClusterLoadAssignment.FromString(body) for body in bodies],
    }
    print(f"2,000 x 300 B ({len(raw):,} bytes), ms (min / median of 20)")
    for stage, step in stages.items():
        print(f"| {stage} | {timed(step)} |")


if __name__ == "__main__":
    main()
