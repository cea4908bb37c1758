"""What the pages promise, checked: the front page fits, the conformance
table is the tests' own, every alert has a runbook entry, and the client
bootstraps are ones Envoy and gRPC would read."""

from __future__ import annotations

import json
import re

import yaml

# The typed configs the Envoy bootstraps name in "@type", so that parsing resolves them.
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from google.protobuf import json_format

from tests.docs.markdown import DOCS, REPO, blocks, section
from tests.test_conformance import INVARIANTS
from tests.test_observability import alerts

README = REPO / "README.md"
CLIENTS = DOCS / "connecting-clients.md"
_INVARIANT_ROW = re.compile(r"^\| (\d+) \| (.+?) \| \[", re.MULTILINE)


def test_the_readme_is_a_front_page_with_the_two_commands_on_its_first_screen() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < 150
    first_screen = "\n".join(lines[:24])
    assert "\nmake run    #" in first_screen and "\nmake test   #" in first_screen
    assert "](docs/diagrams/where.svg)" in README.read_text()


def test_the_conformance_table_is_the_one_the_tests_keep() -> None:
    rows = _INVARIANT_ROW.findall(section(DOCS / "protocol.md", "Conformance"))
    table = {int(number): text.replace("\\*", "*").replace("\\|", "|") for number, text in rows}
    assert len(table) == len(rows)
    assert table == INVARIANTS, "docs/protocol.md's table and tests/test_conformance.py differ"


def test_every_alert_has_a_runbook_entry() -> None:
    runbook = section(DOCS / "operating.md", "Runbook")
    entries = re.findall(r"^### (\w+)$", runbook, re.MULTILINE)
    assert entries == [rule["alert"] for rule in alerts()], "one entry per alert, in order"
    for entry in re.split(r"^### \w+$", runbook, flags=re.MULTILINE)[1:]:
        assert re.search(r"^1\. ", entry, re.MULTILINE), "each entry says what to check first"


def test_the_envoy_bootstraps_are_envoy_bootstraps() -> None:
    bootstraps = [doc for doc in map(yaml.safe_load, blocks(CLIENTS, "yaml"))
                  if isinstance(doc, dict) and "dynamic_resources" in doc]
    assert len(bootstraps) == 2  # the Kubernetes one and the REST one
    for doc in bootstraps:
        # unknown fields, wrong types and unresolvable @types raise
        json_format.ParseDict(doc, bootstrap_pb2.Bootstrap())
    kubernetes = json_format.ParseDict(bootstraps[0], bootstrap_pb2.Bootstrap())
    relay = kubernetes.static_resources.clusters[0]
    assert kubernetes.dynamic_resources.ads_config.grpc_services[0].envoy_grpc.cluster_name \
        == relay.name
    assert relay.transport_socket.typed_config.Is(tls_pb2.UpstreamTlsContext.DESCRIPTOR)
    address = relay.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert (address.socket_address.address, address.socket_address.port_value) == (
        "xds-relay.xds-relay.svc", 18000)


def test_the_grpc_bootstrap_names_the_relay_with_tls_credentials() -> None:
    (bootstrap,) = (json.loads(block) for block in blocks(CLIENTS, "json"))
    (server,) = bootstrap["xds_servers"]
    assert server["server_uri"] == "xds-relay.xds-relay.svc:18000"
    (creds,) = server["channel_creds"]
    assert creds["type"] == "tls"
    assert set(creds["config"]) == {"ca_certificate_file", "certificate_file",
                                    "private_key_file"}
    assert bootstrap["node"]["id"] and bootstrap["node"]["cluster"]
