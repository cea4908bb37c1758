"""The console's client list: rows from /clients records, queries, pages, merges."""

from __future__ import annotations

from typing import Any

import pytest

from relay.console.clients import MAX_LIMIT, BadQuery, ClientTable, Page, Query, merge_pages
from relay.xds_types import CLUSTER, ENDPOINT, LISTENER


def record(node_id: str, peer: str = "ipv4:10.0.0.1:1", protocol: str = "delta",
           **syncs: Any) -> dict[str, Any]:
    """A /clients record whose types have these ``sync`` states (by short name:
    cds, eds, lds); ``nack_<type>`` gives a type's last NACK message."""
    urls = {"cds": CLUSTER, "eds": ENDPOINT, "lds": LISTENER}
    types: dict[str, Any] = {}
    for key, sync in syncs.items():
        if key.startswith("nack_"):
            continue
        nack = syncs.get(f"nack_{key}")
        types[urls[key]] = {"sync": sync, "last_nack": None if nack is None else
                            {"nonce": str(len(types) + 1), "message": nack, "version": "v1"}}
    return {"node_id": node_id, "peer": peer, "protocol": protocol,
            "service": "envoy.service.discovery.v3.AggregatedDiscoveryService", "types": types}


RECORDS = [
    record("b", cds="synced", eds="synced"),
    record("a", cds="synced", eds="stale"),
    record("c", cds="nacked", nack_cds="cluster x: bad policy"),
    record("d", lds="not_sent"),
    record("e"),
]


def nodes(page: Page) -> list[str]:
    return [row.node_id for row in page.rows]


def test_a_row_is_its_worst_type_and_latest_nack() -> None:
    table = ClientTable(RECORDS)
    rows = {row.node_id: row for row in table.rows}
    assert [rows[n].worst for n in "abcde"] == ["stale", "synced", "nacked", "not_sent",
                                                  "synced"]
    assert (rows["c"].nack_type, rows["c"].nack_message) == (CLUSTER, "cluster x: bad policy")
    assert rows["b"].types == ((CLUSTER, "synced"), (ENDPOINT, "synced"))


def test_worst_first_then_by_node_id() -> None:
    assert nodes(ClientTable(RECORDS).page(Query())) == ["c", "a", "d", "b", "e"]


def test_counts_cover_every_stream_whatever_the_query() -> None:
    page = ClientTable(RECORDS).page(Query(state="nacked"))
    assert (page.total, page.matched, nodes(page)) == (5, 1, ["c"])
    assert page.states == {"nacked": 1, "stale": 1, "not_sent": 1, "synced": 2}
    assert page.types[CLUSTER] == {"nacked": 1, "synced": 2}


def test_search_finds_node_ids_peers_and_nack_messages_in_any_case() -> None:
    table = ClientTable([*RECORDS, record("f", peer="ipv4:10.9.9.9:5")])
    assert nodes(table.page(Query(search="BAD POLICY"))) == ["c"]
    assert nodes(table.page(Query(search="10.9.9"))) == ["f"]
    assert nodes(table.page(Query(search="nothing like it"))) == []


def test_sorts_by_a_column_either_way() -> None:
    table = ClientTable(RECORDS)
    assert nodes(table.page(Query(sort="node"))) == ["a", "b", "c", "d", "e"]
    assert nodes(table.page(Query(sort="node", descending=True))) == ["e", "d", "c", "b", "a"]


def test_pages_by_offset_and_limit() -> None:
    table = ClientTable(RECORDS)
    assert nodes(table.page(Query(sort="node", offset=1, limit=2))) == ["b", "c"]
    assert nodes(table.page(Query(sort="node", offset=1, limit=2), through=True)) == \
        ["a", "b", "c"]


def test_a_query_from_parameters() -> None:
    query = Query.from_params({"q": " envoy ", "state": "stale", "sort": "peer",
                               "order": "desc", "offset": "50", "limit": "25"})
    assert query == Query("envoy", "stale", "peer", True, 50, 25)
    assert Query.from_params({}) == Query()


@pytest.mark.parametrize(("params", "message"), [
    ({"state": "broken"}, "state 'broken': expected one of nacked, stale, not_sent, synced"),
    ({"sort": "age"}, "sort 'age': expected one of worst, node, peer, protocol, worker"),
    ({"order": "up"}, "order 'up': expected asc or desc"),
    ({"limit": "0"}, f"limit 0: expected 1 to {MAX_LIMIT}"),
    ({"limit": "many"}, "limit 'many': expected a whole number"),
    ({"offset": "-1"}, "offset -1: expected 0 to 1000000000"),
])
def test_a_bad_query_says_what_is_wrong(params: dict[str, str], message: str) -> None:
    with pytest.raises(BadQuery) as raised:
        Query.from_params(params)
    assert str(raised.value) == message


def test_a_query_survives_its_json() -> None:
    query = Query("x", "nacked", "worker", True, 10, 20)
    assert Query.from_params(query.to_json()) == query


def test_workers_pages_merge_in_the_query_s_order() -> None:
    one = ClientTable([record("a", cds="synced"), record("c", cds="nacked", nack_cds="no")],
                      worker=1)
    two = ClientTable([record("b", cds="nacked", nack_cds="no"), record("d", cds="stale")],
                      worker=2)
    query = Query(offset=1, limit=2)
    pages = [Page.from_json(table.page(query, through=True).to_json(), query)
             for table in (one, two)]
    merged = merge_pages(pages, query)
    # worst first: b, c (nacked), d (stale), a (synced); the page is the 2nd and 3rd
    assert nodes(merged) == ["c", "d"]
    assert (merged.total, merged.matched) == (4, 4)
    assert merged.states == {"nacked": 2, "stale": 1, "not_sent": 0, "synced": 1}
    assert merged.types == {CLUSTER: {"nacked": 2, "stale": 1, "synced": 1}}


def test_a_client_s_records_by_node_id_and_peer() -> None:
    table = ClientTable([record("a", peer="p1"), record("a", peer="p2"), record("b", peer="p1")])
    assert [r["peer"] for r in table.records_of("a", "p2")] == ["p2"]
    assert table.records_of("z", "p1") == []
