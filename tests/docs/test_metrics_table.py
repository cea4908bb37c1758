"""docs/operating.md's metrics table is what relays export on /metrics.

Real relays on 127.0.0.1 port 0 are put through traffic (the scripted
traffic of ``tests/test_observability.py``: origin, both protocols, a NACK,
refused, limited and rejected streams, a snapshot, a broken resource file;
and here a gRPC fetch, which makes a lease), and every series their pages
serve must have a row, under the name served, with the labels served; every
row must be a series some relay served, or one the traffic cannot make
(``NOT_PRODUCED_HERE`` there, with its reason).
"""

from __future__ import annotations

import asyncio
import functools
import re
import urllib.request

from envoy.service.discovery.v3 import discovery_pb2

from tests.docs.markdown import DOCS, section
from tests.harness import TIMEOUT, ScriptedOrigin, cluster, node, running_stack
from tests.test_observability import NOT_PRODUCED_HERE, Exported, scrapes

OPERATING = DOCS / "operating.md"
FETCH_CLUSTERS = "/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters"
_ROW = re.compile(r"^\| `((?:xds_relay|process|python)_\w+)(?:\{([\w,]*)\})?` \|", re.MULTILINE)
# Labels that are not the series' own: the histogram's bucket bound, and the
# instrumentation scope OpenTelemetry may add.
_NOT_DOCUMENTED = re.compile(r"^(le|otel_scope_\w+)$")
_HISTOGRAM_PARTS = ("_bucket", "_count", "_sum", "_created")


def documented() -> dict[str, frozenset[str]]:
    """The table's series, each with the labels its row names."""
    rows = _ROW.findall(section(OPERATING, "Metrics"))
    table = {name: frozenset(filter(None, labels.split(","))) for name, labels in rows}
    assert len(table) == len(rows), "a series has two rows"
    return table


def series(exported: Exported) -> dict[str, frozenset[str]]:
    """Exported sample names as the table writes them: a histogram once, by its
    name, with its own labels (not ``le``)."""
    names = set(exported.labels)
    found: dict[str, set[str]] = {}
    for name, labels in exported.labels.items():
        base = next((name.removesuffix(part) for part in _HISTOGRAM_PARTS
                     if name.endswith(part) and name.removesuffix(part) + "_bucket" in names),
                    name)
        found.setdefault(base, set()).update(
            label for label in labels if not _NOT_DOCUMENTED.match(label))
    return {name: frozenset(labels) for name, labels in found.items()}


async def _fetch_page() -> str:
    """/metrics of a relay that answered a gRPC fetch (its lease is a series)."""
    origin = ScriptedOrigin()
    origin.set(cluster("a"))
    async with running_stack(origin, linger="30s") as stack:
        fetch = stack.channel.unary_unary(
            FETCH_CLUSTERS, request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString)
        response = await fetch(discovery_pb2.DiscoveryRequest(node=node()), timeout=TIMEOUT)
        assert [r.type_url for r in response.resources] == [response.type_url]

        def scrape() -> str:
            url = f"http://127.0.0.1:{stack.relay.admin_port}/metrics"
            with urllib.request.urlopen(url, timeout=TIMEOUT) as reply:
                return str(reply.read().decode())

        return await asyncio.get_running_loop().run_in_executor(None, scrape)


@functools.cache
def exported() -> dict[str, frozenset[str]]:
    """Every series the relays served, with the labels seen on it."""
    pages = series(scrapes().single), series(Exported.of(asyncio.run(_fetch_page())))
    merged: dict[str, frozenset[str]] = {}
    for page in pages:
        for name, labels in page.items():
            merged[name] = merged.get(name, frozenset()) | labels
    return merged


def test_every_exported_series_has_a_row() -> None:
    assert "xds_relay_fetch_leases" in exported()  # the fetch made one
    assert sorted(set(exported()) - set(documented())) == [], \
        "series /metrics serves that docs/operating.md's table does not list"


def test_every_row_is_an_exported_series() -> None:
    never = set(documented()) - set(exported()) - set(NOT_PRODUCED_HERE)
    assert sorted(never) == [], "rows of docs/operating.md's table no relay exported"


def test_every_row_names_the_labels_of_its_series() -> None:
    table = documented()
    wrong = {name: (sorted(table[name]), sorted(labels))
             for name, labels in exported().items()
             if name.startswith("xds_relay_") and name in table and table[name] != labels}
    assert wrong == {}, "series: (labels in the table, labels exported)"


def test_the_series_the_issue_found_missing_has_its_row() -> None:
    # the dashboard's "rejected streams" panel reads it (issue 28)
    assert documented()["xds_relay_downstream_rejected_streams_total"] == {"protocol"}
