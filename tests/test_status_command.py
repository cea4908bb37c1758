"""``xds-relay status`` without a relay: /clients answers in, lines and exit codes out."""

from __future__ import annotations

import http.server
import io
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay.status_command import (
    NACKING,
    NOT_FOUND,
    NOT_SYNCED,
    OK,
    UNREACHABLE,
    USAGE,
    StatusError,
    admin_url,
    check_code,
    detail_lines,
    origin_lines,
    protocol_of,
    read_token,
    run_status,
    streams_of,
    summary_lines,
    unanswered_workers,
)
from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, SECRET

CUSTOM = "type.googleapis.com/example.Custom"


def state(sync: str | None = "synced", versions: dict[str, str] | None = None, **more: Any
          ) -> dict[str, Any]:
    """One type of one client, as /clients shows it."""
    return {"subscribed": [], "wildcard": False, "versions": versions or {}, "acked": None,
            "in_flight": None, "last_nack": None, "sync": sync, "unsynced": {}, **more}


def client(node_id: str, types: dict[str, Any], protocol: str = "delta",
           peer: str = "ipv4:10.0.0.1:5000", **more: Any) -> dict[str, Any]:
    return {"node_id": node_id, "peer": peer, "protocol": protocol, "types": types, **more}


def nack(message: str, nonce: str = "3", **rejected: Any) -> dict[str, Any]:
    return {"nonce": nonce, "message": message, **rejected}


# -- the summary ----------------------------------------------------------------


def test_summary_has_a_column_per_type_in_push_order_and_a_dash_where_not_subscribed() -> None:
    lines = summary_lines([
        client("a", {LISTENER: state(versions={"l": "7"}),
                     CLUSTER: state("stale", {"x": "1", "y": "2"})}),
        client("b", {CUSTOM: state("not_sent"), ENDPOINT: state("nacked", {"e": "v9"})},
               protocol="sotw", peer="ipv4:10.0.0.2:6"),
    ])
    assert lines == [
        "NODE  PEER                PROTOCOL  Cluster             ClusterLoadAssignment  "
        "Listener    Custom    LAST NACK",
        "a     ipv4:10.0.0.1:5000  delta     STALE (2 versions)  -                      "
        "SYNCED (7)  -         -",
        "b     ipv4:10.0.0.2:6     sotw      -                   NACKED (v9)            "
        "-           NOT SENT  -",
    ]


def test_summary_has_a_worker_column_when_the_relay_runs_workers() -> None:
    lines = summary_lines([client("a", {}, worker=2), client("b", {}, worker=1)])
    assert lines == ["NODE  PEER                PROTOCOL  WORKER  LAST NACK",
                     "a     ipv4:10.0.0.1:5000  delta     2       -",
                     "b     ipv4:10.0.0.1:5000  delta     1       -"]


def test_summary_cuts_long_versions() -> None:
    [_, row] = summary_lines([client("a", {CLUSTER: state(versions={"x": "f" * 40})})])
    assert row.endswith("SYNCED (" + "f" * 13 + "...)  -")


def test_last_nack_is_of_a_type_still_nacked_else_the_latest_one_whitespace_folded() -> None:
    earlier = state(last_nack=nack("old\n  news", nonce="9"))
    later = state(last_nack=nack("newer", nonce="10"))
    still = state("nacked", last_nack=nack("still\tbad", nonce="2"))
    assert summary_lines([client("a", {CLUSTER: earlier, ENDPOINT: later})])[1].endswith(
        "ClusterLoadAssignment: newer")
    assert summary_lines([client("a", {CLUSTER: earlier, SECRET: still})])[1].endswith(
        "Secret: still bad")
    assert summary_lines([client("a", {CLUSTER: earlier})])[1].endswith(
        "Cluster: old news")


def test_last_nack_message_is_cut_to_sixty_characters() -> None:
    [_, row] = summary_lines([client("a", {CLUSTER: state(last_nack=nack("x" * 100))})])
    assert row.endswith("Cluster: " + "x" * 57 + "...")


def test_control_characters_from_clients_are_escaped() -> None:
    [_, row] = summary_lines([client("evil\x1b[2J", {
        CLUSTER: state(last_nack=nack("bell\x07"))})])
    assert row.startswith("evil\\x1b[2J  ") and row.endswith("Cluster: bell\\x07")


def test_summary_of_no_client_says_so() -> None:
    assert summary_lines([]) == ["no clients are connected"]


def test_a_relay_without_sync_shows_unknown() -> None:
    old = state(versions={"x": "1"})
    del old["sync"], old["unsynced"]
    assert summary_lines([client("a", {CLUSTER: old})])[1].split()[3:5] == ["UNKNOWN", "(1)"]


# -- one node in detail -------------------------------------------------------------


def test_detail_lists_names_when_few_and_every_resource_against_the_cache() -> None:
    lines = detail_lines([client("a", {ENDPOINT: state(
        "stale", versions={"e1": "1", "e2": "1", "alias": "4"}, subscribed=["e1", "e2", "alias",
                                                                             "new", "lost"],
        acked="5", in_flight="6", unsynced={
            "e2": {"status": "sent", "version": "1", "cached_version": "2"},
            "alias": {"status": "acked", "version": "4", "name": "real", "cached_version": None},
            "new": {"status": "requested", "cached_version": "3"},
            "lost": {"status": "received_error", "error": "denied"}})}, worker=1)])
    assert lines == [
        "node a  peer ipv4:10.0.0.1:5000  protocol delta  worker 1",
        f"  ClusterLoadAssignment: STALE  ({ENDPOINT})",
        "    subscribed: 5 names: e1, e2, alias, new, lost",
        "    acked: nonce 5",
        "    in flight: nonce 6",
        "    last NACK: none",
        "    RESOURCE  STATUS          VERSION  CACHED",
        "    alias     acked           4        (not cached)  alias of real",
        "    e1        acked           1        1",
        "    e2        sent            1        2",
        "    lost      received_error  -        -             origin error: denied",
        "    new       requested       -        3",
    ]


def test_detail_of_many_names_counts_them_and_lists_only_the_unsynced() -> None:
    names = [f"n{i:03}" for i in range(100)]
    lines = detail_lines([client("a", {CLUSTER: state(
        "nacked", versions=dict.fromkeys(names, "1"), subscribed=names, acked="00ff",
        last_nack=nack("line one\nline two", version="0100"),
        unsynced={"n007": {"status": "nacked", "version": "1"}})}, protocol="sotw")])
    assert lines == [
        "node a  peer ipv4:10.0.0.1:5000  protocol sotw",
        f"  Cluster: NACKED  ({CLUSTER})",
        "    subscribed: 100 names",
        "    acked: version 00ff",
        "    in flight: -",
        "    last NACK: nonce 3, version 0100: line one",
        "      line two",
        "    RESOURCE  STATUS  VERSION  CACHED",
        "    n007      nacked  1        1",
        "    ... and 99 more, ACKED at the version the cache has",
    ]


def test_detail_of_a_delta_nack_names_the_versions_it_rejected() -> None:
    lines = detail_lines([client("a", {CLUSTER: state(
        "nacked", wildcard=True, last_nack=nack("no", versions={"b": "2", "a": "1"}))})])
    assert lines[2:6] == ["    subscribed: * (wildcard)", "    acked: nothing yet",
                          "    in flight: -", "    last NACK: nonce 3, rejected a 1, b 2: no"]


def test_detail_separates_the_streams_of_one_node() -> None:
    lines = detail_lines([client("a", {}), client("a", {}, peer="ipv4:10.0.0.1:5001")])
    assert lines == ["node a  peer ipv4:10.0.0.1:5000  protocol delta",
                     "  (no type subscribed yet)", "",
                     "node a  peer ipv4:10.0.0.1:5001  protocol delta",
                     "  (no type subscribed yet)"]


# -- what the answer says -------------------------------------------------------------


def test_streams_are_selected_by_node_id_and_sorted_by_node_and_peer() -> None:
    answer = {"clients": [client("b", {}), client("a", {}, peer="p2"),
                          client("a", {}, peer="p1")]}
    assert [(c["node_id"], c["peer"]) for c in streams_of(answer, None)] == [
        ("a", "p1"), ("a", "p2"), ("b", "ipv4:10.0.0.1:5000")]
    assert [c["peer"] for c in streams_of(answer, "a")] == ["p1", "p2"]
    assert streams_of(answer, "c") == []


def test_workers_that_did_not_answer_are_named() -> None:
    assert unanswered_workers({"clients": [], "workers": [
        {"worker": 1, "answered": True}, {"worker": 2, "answered": False}]}) == [2]
    assert unanswered_workers({"clients": []}) == []


@pytest.mark.parametrize(("syncs", "code"), [
    (["synced", "synced"], OK),
    (["synced", "stale"], NOT_SYNCED),
    (["not_sent", "synced"], NOT_SYNCED),
    (["stale", "nacked"], NACKING),
    ([None], NOT_SYNCED),  # a relay too old to say
])
def test_check_code_is_the_worst_type_of_any_client(syncs: list[str | None], code: int
                                                     ) -> None:
    clients = [client(str(i), {CLUSTER: state(sync)}) for i, sync in enumerate(syncs)]
    assert check_code(clients) == code


def test_admin_url_assumes_http_and_refuses_other_schemes() -> None:
    assert admin_url("127.0.0.1:19000/") == "http://127.0.0.1:19000"
    assert admin_url("https://relay:19000") == "https://relay:19000"
    with pytest.raises(StatusError) as raised:
        admin_url("ftp://relay")
    assert (str(raised.value), raised.value.code) == (
        "--admin 'ftp://relay': expected an http:// or https:// URL", USAGE)


def test_token_file_is_stripped_and_must_not_be_empty(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  s3cret\n")
    assert read_token(path) == "s3cret"
    path.write_text("\n")
    with pytest.raises(StatusError, match=r"^--token-file .* is empty$"):
        read_token(path)
    with pytest.raises(StatusError, match=r"^cannot read --token-file .*missing: No such file"):
        read_token(tmp_path / "missing")


# -- the command against HTTP servers that are not relays ---------------------------------


def command(*args: Any, **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_status(*args, out=out, err=err, **options)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def web_server() -> Iterator[tuple[str, dict[str, tuple[int, bytes]]]]:
    """An HTTP server answering each path with the (status, body) its dict says."""
    answers: dict[str, tuple[int, bytes]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers.get(self.path, (404, b"nothing here\n"))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answers
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def web(web_server: tuple[str, dict[str, tuple[int, bytes]]]
        ) -> tuple[str, dict[str, tuple[int, bytes]]]:
    """:func:`web_server`, with no answer set."""
    web_server[1].clear()
    return web_server


def test_a_clients_answer_is_printed_and_an_unanswering_worker_warned_of(
        web: tuple[str, dict[str, tuple[int, bytes]]]) -> None:
    url, answers = web
    answers["/clients"] = (200, b'{"clients": [], "workers": [{"worker": 1, "answered": false}]}')
    assert command(url) == (OK, "no clients are connected\n", "xds-relay status: worker 1 did "
                            "not answer; its clients are not listed\n")
    assert command(url, check=True)[0] == UNREACHABLE


def test_an_http_error_is_reported_with_the_first_line_of_its_body(
        web: tuple[str, dict[str, tuple[int, bytes]]]) -> None:
    url, _ = web
    assert command(url) == (UNREACHABLE, "",
                            f"xds-relay status: {url}/clients: HTTP 404: nothing here\n")


def test_an_answer_that_is_not_a_client_list_is_reported(
        web: tuple[str, dict[str, tuple[int, bytes]]]) -> None:
    url, answers = web
    answers["/clients"] = (200, b"<html>hello</html>")
    assert command(url) == (UNREACHABLE, "", f"xds-relay status: {url}/clients did not answer "
                            f"with the relay's client list: is {url} a relay's admin address?\n")


def test_a_node_not_connected_is_not_found(
        web: tuple[str, dict[str, tuple[int, bytes]]]) -> None:
    url, answers = web
    answers["/clients"] = (200, b'{"clients": [{"node_id": "a", "types": {}}]}')
    assert command(url, node="b") == (NOT_FOUND, "", "xds-relay status: no connected client "
                                      "has node id 'b' (1 client connected)\n")


def test_a_relay_that_does_not_answer_in_time_is_reported() -> None:
    with socket.socket() as listening:  # accepts connections (the backlog), never answers
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        assert command(url, timeout=0.2) == (
            UNREACHABLE, "", f"xds-relay status: no answer from {url} within 0.2s (--timeout)\n")


def test_a_ca_file_with_plain_http_is_a_usage_error(tmp_path: Path) -> None:
    assert command("http://127.0.0.1:1", ca_file=tmp_path / "ca.pem") == (
        USAGE, "", "xds-relay status: --ca-file is for an https:// admin address, not "
                   "http://127.0.0.1:1\n")


def test_https_to_a_plain_http_admin_says_there_is_no_tls(
        web: tuple[str, dict[str, tuple[int, bytes]]]) -> None:
    url, _ = web
    secure = url.replace("http://", "https://")
    assert command(secure) == (UNREACHABLE, "", f"xds-relay status: cannot reach the relay's "
                               f"admin API at {secure}: TLS: WRONG_VERSION_NUMBER (no TLS "
                               f"there: without admin.tls, use an http:// --admin)\n")


@pytest.mark.parametrize(("service", "shown"), [
    ("envoy.service.discovery.v3.AggregatedDiscoveryService", "sotw"),
    ("envoy.service.cluster.v3.ClusterDiscoveryService", "sotw/CDS"),
    ("envoy.service.runtime.v3.RuntimeDiscoveryService", "sotw/RTDS"),
    (None, "sotw"),  # a relay from before /clients named the service
])
def test_protocol_names_a_per_type_service(service: str | None, shown: str) -> None:
    client = {"protocol": "sotw", **({"service": service} if service else {})}
    assert protocol_of(client) == shown


# -- origins and times ----------------------------------------------------------------

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def origin(name: str = "default", **more: Any) -> dict[str, Any]:
    return {"origin": name, "server": "cp:18000", "fallback": False, "connected": True,
            "connected_since": NOW - 125, "synced": True, "reconnects": 0,
            "last_response": {CLUSTER: NOW - 3}, **more}


def test_origins_say_where_each_is_connected_since_when_and_whether_synced() -> None:
    assert origin_lines([
        origin(),
        origin("edge", server="backup:18000", fallback=True, connected=False,
               connected_since=None, disconnected_since=NOW - 7300, synced=False,
               reconnects=4),
        origin("idle", connected=False, connected_since=None, synced=False),
    ], NOW) == [
        "ORIGIN   SERVER                   STATE                                                "
        "SYNCED  RECONNECTS",
        "default  cp:18000                 CONNECTED since 2023-11-14T22:11:15Z (2m05s ago)     "
        "yes     0",
        "edge     backup:18000 (fallback)  DISCONNECTED since 2023-11-14T20:11:40Z (2h01m ago)  "
        "no      4",
        "idle     cp:18000                 DISCONNECTED                                         "
        "no      0",
    ]


def test_the_summary_starts_with_the_origins_when_the_relay_lists_them(
        web: tuple[str, dict[str, tuple[int, bytes]]]) -> None:
    url, answers = web
    answers["/clients"] = (200, json.dumps({"clients": [
        client("a", {CLUSTER: state()})]}).encode())
    answers["/origins"] = (200, json.dumps({"origins": [origin()]}).encode())
    code, out, err = command(url, now=lambda: NOW)
    assert (code, err) == (OK, "")
    assert out.splitlines() == [
        "ORIGIN   SERVER    STATE                                             SYNCED  RECONNECTS",
        "default  cp:18000  CONNECTED since 2023-11-14T22:11:15Z (2m05s ago)  yes     0",
        "",
        "NODE  PEER                PROTOCOL  Cluster  LAST NACK",
        "a     ipv4:10.0.0.1:5000  delta     SYNCED   -",
    ]
    code, out, _ = command(url, output="json")
    assert json.loads(out) == {"clients": [client("a", {CLUSTER: state()})],
                               "origins": [origin()]}


def test_a_relay_without_origins_gets_the_clients_alone(
        web: tuple[str, dict[str, tuple[int, bytes]]]) -> None:
    url, answers = web
    answers["/clients"] = (200, b'{"clients": []}')  # /origins: 404, an older relay
    assert command(url) == (OK, "no clients are connected\n", "")
    answers["/origins"] = (200, b'{"origins": []}')  # a relay of no origin (files)
    assert command(url) == (OK, "no clients are connected\n", "")


def test_detail_says_when_the_stream_connected_and_was_last_answered() -> None:
    lines = detail_lines([client("a", {}, connected_since=NOW - 3600, acked_at=NOW - 45,
                                 nacked_at=None)], NOW)
    assert lines[:2] == [
        "node a  peer ipv4:10.0.0.1:5000  protocol delta",
        "  connected 2023-11-14T21:13:20Z (1h00m ago); last ACK 2023-11-14T22:12:35Z (45s ago)"]
    poller = detail_lines([client("p", {}, protocol="rest", connected_since=NOW - 86400 * 2,
                                  nacked_at=NOW)], NOW)
    assert poller[1] == ("  first poll 2023-11-12T22:13:20Z (2d00h ago); "
                         "last NACK 2023-11-14T22:13:20Z (0s ago)")


def test_the_latest_nack_is_the_latest_in_time_when_the_relay_says_when() -> None:
    # REST pollers' NACKs carry no nonce: when they came decides
    lines = summary_lines([client("p", {
        CLUSTER: state("synced", last_nack=nack("old", nonce=""), nacked_at=NOW - 60),
        ENDPOINT: state("synced", last_nack=nack("new", nonce=""), nacked_at=NOW - 5)},
        protocol="rest")])
    assert lines[1].endswith("ClusterLoadAssignment: new")


def test_detail_counts_every_name_a_rest_poller_polls_for() -> None:
    lines = detail_lines([client("p", {CLUSTER: state(subscribed=["a", "b"],
                                                       subscribed_count=250)},
                                 protocol="rest")], NOW)
    assert "    subscribed: 250 names" in lines


# -- node groups --------------------------------------------------------------------


def test_summary_has_a_group_column_with_node_groups() -> None:
    lines = summary_lines([
        client("a", {}, group={"id": "g-0a1b2c3d4e5f", "key": ["checkout", "shop"]}),
        client("b", {}, group={"id": "g-ffffffffffff", "key": ["payments", ""]}),
        client("poller", {}, protocol="rest"),  # a REST poller: no stream, no group shown
    ])
    assert lines == ["NODE    PEER                PROTOCOL  GROUP          LAST NACK",
                     "a       ipv4:10.0.0.1:5000  delta     checkout,shop  -",
                     "b       ipv4:10.0.0.1:5000  delta     payments,      -",
                     "poller  ipv4:10.0.0.1:5000  rest      -              -"]


def test_origins_of_node_groups_name_each_groups_key_clients_and_snapshot() -> None:
    assert origin_lines([
        origin("default/g-0a1b2c3d4e5f",
               group={"id": "g-0a1b2c3d4e5f", "key": ["checkout"], "clients": 2}),
        origin("default/g-ffffffffffff", connected=False, connected_since=None,
               synced=False, snapshot=True,
               group={"id": "g-ffffffffffff", "key": ["payments"], "clients": 1}),
    ], NOW) == [
        "ORIGIN                  GROUP                 SERVER    STATE"
        "                                             SYNCED    RECONNECTS",
        "default/g-0a1b2c3d4e5f  checkout (2 clients)  cp:18000  CONNECTED since "
        "2023-11-14T22:11:15Z (2m05s ago)  yes       0",
        "default/g-ffffffffffff  payments (1 client)   cp:18000  DISCONNECTED"
        "                                      snapshot  0",
    ]


def test_detail_names_the_streams_group() -> None:
    [head, *_] = detail_lines([client("a", {}, group={"id": "g-0a1b2c3d4e5f",
                                                      "key": ["checkout"]})], NOW)
    assert head == ("node a  peer ipv4:10.0.0.1:5000  protocol delta  "
                    "group g-0a1b2c3d4e5f (checkout)")
