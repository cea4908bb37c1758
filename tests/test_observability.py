"""The dashboard and the alert rules ask only for what a relay exports.

``deploy/grafana/xds-relay.json``, ``deploy/prometheus/xds-relay-rules.yaml`` and
its PrometheusRule copy (``deploy/kubernetes/monitoring/``) are parsed, and every
series their PromQL names must be one that real relays serve on ``/metrics``
after scripted traffic (origin, both protocols, a NACK, a push, refused,
limited and rejected streams, a snapshot saved and restored, a broken resource
file), under the name exported (``_total``, ``_bucket``...), with the labels the
queries match and group by: as one process serves them, and as the hub of
``--workers`` merges them. ``promtool`` checks the rules and runs their unit
tests (``deploy/prometheus/xds-relay-rules.test.yaml``); without it those tests
skip, saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from envoy.config.cluster.v3 import cluster_pb2
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
from google.rpc import status_pb2
from prometheus_client.parser import text_string_to_metric_families

from relay.app import Relay, build_relay
from relay.config import RelayConfig, parse_config
from relay.workers.metrics import merge_metrics
from relay.xds_types import CLUSTER
from tests.builders import cluster, endpoints
from tests.certs import Authority, tls_channel
from tests.harness import (
    ADS,
    TIMEOUT,
    ScriptedOrigin,
    XdsClient,
    eventually,
    node,
    relay_config,
)
from tests.variants import CANARY, DPC

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "deploy" / "grafana" / "xds-relay.json"
PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS / "xds-relay-rules.yaml"
RULES_TEST = PROMETHEUS / "xds-relay-rules.test.yaml"
MONITORING = REPO / "deploy" / "kubernetes" / "monitoring"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
RELAY_SOURCE = REPO / "relay"

DELTA_ADS = ADS + "DeltaAggregatedResources"
SOTW_ADS = ADS + "StreamAggregatedResources"

# The series Prometheus makes itself for every target, not the relay.
PROMETHEUS_SERIES = frozenset({"up"})
# Labels Prometheus adds to every series it scrapes (the target's).
TARGET_LABELS = frozenset({"job", "instance"})
# Series that the scripted relays below do not produce (name on /metrics: the
# instrument relay/ defines), each with why. The test fails when one of them is
# produced after all (then it leaves this list), is used by no query, or is no
# longer defined in relay/.
NOT_PRODUCED_HERE = {
    # counted by the hub of --workers when a worker process exits; starting
    # processes and killing one would cost this test seconds
    "xds_relay_worker_restarts_total": "xds_relay_worker_restarts",
}

# Counted by a relay serving files (upstream.files) only.
FILE_SOURCE_ERRORS = "xds_relay_source_errors_total"

# Names of the relay's series, as a query writes them (and Prometheus's `up`).
_SERIES = re.compile(r"(?<![\w$.])((?:xds_relay|process|python)_[a-zA-Z0-9_]+|up)\b"
                     r"(?:\s*\{([^}]*)\})?")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\(\s*(.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)")
_LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


# -- the files ---------------------------------------------------------------------------


@functools.cache
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> Iterator[dict[str, Any]]:
    """Every panel but rows, those of collapsed rows included."""
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


@functools.cache
def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"] if "alert" in rule]


@functools.cache
def prometheus_rule() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(PROMETHEUS_RULE.read_text())
    return loaded


@dataclass(frozen=True)
class Query:
    """One PromQL expression and where it is."""

    where: str
    expr: str
    legend: str = ""


def queries() -> list[Query]:
    """Every PromQL expression of the dashboard and of both rule files."""
    found = [Query(f"dashboard panel {panel['title']!r} target {target['refId']}",
                   target["expr"], target.get("legendFormat", ""))
             for panel in panels() for target in panel.get("targets", [])]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["query"] == variable["definition"], variable["name"]
            match = _LABEL_VALUES.fullmatch(variable["query"])
            assert match, f"dashboard variable {variable['name']}: not label_values(...)"
            # label_values(series, label) asks for that label of that series
            found.append(Query(f"dashboard variable {variable['name']}",
                               f"sum by ({match[2]}) ({match[1]})"))
    for where, groups in (("rules", rule_groups()),
                          ("PrometheusRule", prometheus_rule()["spec"]["groups"])):
        found += [Query(f"{where} {rule.get('alert') or rule.get('record')}", str(rule["expr"]))
                  for group in groups for rule in group["rules"]]
    return found


def series_in(expr: str) -> dict[str, set[str]]:
    """The series an expression names, each with the label names its matchers use."""
    without_strings = _STRING.sub('""', expr)
    named: dict[str, set[str]] = {}
    for match in _SERIES.finditer(without_strings):
        labels = named.setdefault(match[1], set())
        if match[2]:
            labels.update(_MATCHER_LABEL.findall(match[2]))
    return named


def grouping_labels(expr: str) -> set[str]:
    """The label names of every by/without/on/ignoring/group_* clause."""
    return {label.strip() for clause in _GROUPING.findall(_STRING.sub('""', expr))
            for label in clause.split(",") if label.strip()}


# -- what relays export --------------------------------------------------------------------


@dataclass(frozen=True)
class Exported:
    """What ``/metrics`` served: every sample name, with the label names seen on it."""

    labels: dict[str, frozenset[str]]

    @classmethod
    def of(cls, *pages: str) -> Exported:
        labels: dict[str, set[str]] = {}
        for page in pages:
            for family in text_string_to_metric_families(page):
                for sample in family.samples:
                    labels.setdefault(sample.name, set()).update(sample.labels)
        return cls({name: frozenset(names) for name, names in labels.items()})


@dataclass(frozen=True)
class Scrapes:
    """Pages of one process (``single``), and the same merged as the hub of
    ``--workers`` merges its workers' pages with its own (``workers``)."""

    single: Exported
    workers: Exported


@functools.cache
def scrapes() -> Scrapes:
    """What relays serve after the traffic of :func:`_traffic` (run once, shared)."""
    with tempfile.TemporaryDirectory() as directory:
        # a directory of resource files, one of which the relay cannot use
        resources = Path(directory) / "resources"
        resources.mkdir()
        (resources / "broken.yaml").write_text("resources: [unclosed\n")
        pages = asyncio.run(_traffic(Path(directory)))
    # The hub's page is a single relay's (its origin and cache series); each
    # worker's too (its clients). The same page in both roles shows which
    # labels each series has once merged.
    merged = [merge_metrics(page, {1: page, 2: page}).decode() for page in pages]
    return Scrapes(Exported.of(*pages), Exported.of(*merged))


def wanted_names() -> set[str]:
    """The relay's series the queries use: what the traffic must make a relay export."""
    names = {name for query in queries() for name in series_in(query.expr)}
    return names - PROMETHEUS_SERIES - set(NOT_PRODUCED_HERE)


async def _scrape(admin_port: int) -> str:
    def fetch() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics",
                                    timeout=TIMEOUT) as reply:
            return str(reply.read().decode())

    return await asyncio.get_running_loop().run_in_executor(None, fetch)


async def _scrape_when(admin_port: int, names: set[str]) -> str:
    """``/metrics`` once it serves every one of ``names`` (counters appear at
    their first count, which may follow the request that caused it), or after
    :data:`TIMEOUT`, as it is then (and the test names what is missing)."""
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while True:
        page = await _scrape(admin_port)
        if names <= set(Exported.of(page).labels) or \
                asyncio.get_running_loop().time() > deadline:
            return page
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _serving(config: RelayConfig) -> AsyncIterator[Relay]:
    relay = build_relay(config)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop(0)


async def _ended(client: XdsClient, **request: Any) -> grpc.aio.AioRpcError:
    """Send ``request`` on ``client``: the error that ends its stream."""
    await client.send(**request)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        while True:
            await client.recv()
    client.close()
    return error.value


def _variant(label: str) -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(name="svc", alt_stat_name=label)


async def _traffic(directory: Path) -> list[str]:
    """Run relays through what the dashboard and the alerts watch; their pages."""
    wanted = wanted_names() - {FILE_SOURCE_ERRORS}  # that one from _files_relay
    ca = Authority(directory)
    leaf = ca.relay_leaf()
    snapshot = directory / "snapshot"
    origin = await ScriptedOrigin().start()
    try:
        origin.set(cluster("a"), cluster("b"), endpoints("a", 1001), version="v1")
        # Two variants that both match env=canary, region=eu: a variant conflict.
        origin.set_variant(_variant("canary"), CANARY, "1")
        origin.set_variant(_variant("canary-eu"), DPC(and_constraints={"constraints": [
            CANARY, DPC(constraint={"key": "region", "exists": {}})]}), "1")
        # TLS for the certificate's expiry; CSDS for loopback off, to be refused.
        server = (f"tls: {{cert_file: '{leaf.cert_file}', key_file: '{leaf.key_file}'}}, "
                  f"authorization: {{debug_loopback: false}}")
        config = parse_config(relay_config(origin.port, server=server,
                                           limits="names_per_request: 3")
                              + f"persistence: {{directory: '{snapshot}'}}\n")

        # A first relay saves a snapshot of two clusters; one entry is then
        # spoiled, so the next relay restores one and skips one.
        async with _serving(config) as relay:
            channel = tls_channel(relay.xds_port, ca)
            first = XdsClient(channel, DELTA_ADS, delta=True)
            await first.send(node=node("first"), type_url=CLUSTER,
                             resource_names_subscribe=["a", "b"])
            # (waited for here: a stop just after a change may leave it unwritten)
            await eventually(lambda: len(list(snapshot.rglob("*.entry"))) == 2)
            first.close()
            await channel.close()
        entries = sorted(snapshot.rglob("*.entry"))
        entries[0].write_bytes(b"not a snapshot entry")

        # The origin ends the next relay's first stream: it reconnects.
        origin.drop_first_streams = len(origin.streams) + 1
        async with _serving(config) as relay:
            channel = tls_channel(relay.xds_port, ca)
            try:
                page = await _clients(channel, origin, relay.admin_port, wanted)
            finally:
                await channel.close()
    finally:
        await origin.stop()
    return [page, await _files_relay(directory / "resources")]


async def _clients(channel: grpc.aio.Channel, origin: ScriptedOrigin, admin_port: int,
                   wanted: set[str]) -> str:
    """A delta client that answers late (an update coalesced), a SotW client
    that NACKs, a variant conflict, and streams limited, rejected and refused;
    the relay's page while the first two are still subscribed."""
    delta = XdsClient(channel, DELTA_ADS, delta=True)
    sotw = XdsClient(channel, SOTW_ADS, delta=False)
    try:
        await delta.send(node=node("delta"), type_url=CLUSTER, resource_names_subscribe=["a"])
        held = await delta.recv()  # not answered yet: later updates wait, and coalesce
        await sotw.send(node=node("sotw"), type_url=CLUSTER, resource_names=["a"])
        rejected = await sotw.recv()
        await sotw.send(type_url=CLUSTER, resource_names=["a"], response_nonce=rejected.nonce,
                        error_detail=status_pb2.Status(code=3, message="rejected by the test"))
        for timeout_s in (2, 3):  # each applied (ACKed by the relay) before the next
            # (sent on every stream the origin had: the first relay's too)
            sent = origin.set(cluster("a", timeout_s=timeout_s), version=f"v{timeout_s}")
            await eventually(lambda nonces=sent: any(map(origin.acked, nonces)))
        await delta.ack(held)
        while True:  # the latest update, v3 (v2 never went out: it was coalesced)
            latest = await delta.recv()
            await delta.ack(latest)
            if [r.version for r in latest.resources] == ["v3"]:
                break

        variants = XdsClient(channel, DELTA_ADS, delta=True)
        params = node("variants")
        params.dynamic_parameters[CLUSTER].params["env"] = "canary"
        await variants.send(node=params, type_url=CLUSTER, resource_locators_subscribe=[
            {"name": "svc", "dynamic_parameters": {"env": "canary", "region": "eu"}}])
        await variants.ack(await variants.recv())
        variants.close()

        limited = await _ended(XdsClient(channel, DELTA_ADS, delta=True), node=node("greedy"),
                               type_url=CLUSTER, resource_names_subscribe=["a", "b", "c", "d"])
        assert limited.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, limited
        invalid = await _ended(XdsClient(channel, DELTA_ADS, delta=True), node=node("odd"),
                               type_url="type.googleapis.com/made.Up")
        assert invalid.code() == grpc.StatusCode.INVALID_ARGUMENT, invalid
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel).FetchClientStatus(
                csds_pb2.ClientStatusRequest(), timeout=TIMEOUT)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value
        return await _scrape_when(admin_port, wanted)
    finally:
        delta.close()
        sotw.close()


async def _files_relay(resources: Path) -> str:
    """The page of a relay serving ``resources``, a directory with a file it cannot use."""
    config = parse_config(f"""
node: {{id: relay-files, cluster: xds-relay}}
server: {{address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{files: '{resources}'}}
""")
    async with _serving(config) as relay:
        return await _scrape_when(relay.admin_port, {FILE_SOURCE_ERRORS})


# -- the dashboard ---------------------------------------------------------------------------


def test_dashboard_is_an_importable_grafana_dashboard_on_a_datasource_variable() -> None:
    board = dashboard()
    assert board["uid"] == "xds-relay" and board["title"] == "xds-relay"
    assert 36 <= board["schemaVersion"] <= 41
    assert board.get("id") is None, "an exported id would clash on import"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert variables[name]["type"] == "query", name
        assert variables[name]["datasource"]["uid"] == "${datasource}", name
        assert variables[name]["includeAll"] and variables[name]["multi"], name


def test_every_dashboard_panel_has_a_description_and_queries_the_datasource_variable(
        ) -> None:
    ids = [panel["id"] for panel in dashboard()["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels():
        title = panel["title"]
        assert len(panel.get("description", "")) > 40, f"{title}: says what to look at"
        assert panel["datasource"]["uid"] == "${datasource}", title
        targets = panel.get("targets", [])
        assert targets and all(t.get("expr") for t in targets), f"{title}: no query"
        for target in targets:
            assert target["datasource"]["uid"] == "${datasource}", title
            # each query filters on the job and instance variables
            assert 'job=~"$job"' in target["expr"] and 'instance=~"$instance"' in target["expr"], (
                f"{title}: {target['expr']}")
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, title


def test_dashboard_legends_name_only_labels_their_query_keeps() -> None:
    for query in queries():
        kept = grouping_labels(query.expr) | {"le"}
        for label in _LEGEND_LABEL.findall(query.legend):
            assert label in kept, f"{query.where}: legend {{{{{label}}}}} not in {query.expr}"


def test_panels_over_time_of_the_origin_streams_say_which_origin() -> None:
    """A relay with authorities has a stream per origin: a panel over time that
    folded them into one series would show a relay down without saying which
    origin (the overview's stat may fold them: it is red when any is down)."""
    per_origin = ("xds_relay_upstream_connected", "xds_relay_upstream_reconnects_total")
    checked = 0
    for panel in panels():
        if panel["type"] == "stat":
            continue
        for target in panel.get("targets", []):
            if not any(series in target["expr"] for series in per_origin):
                continue
            checked += 1
            assert "origin" in grouping_labels(target["expr"]), (
                f"{panel['title']}: {target['expr']}")
            assert "{{origin}}" in target.get("legendFormat", ""), panel["title"]
    assert checked >= 2


# -- the alert rules ---------------------------------------------------------------------------


def test_every_alert_has_a_severity_a_summary_a_description_and_a_for_duration() -> None:
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names)), "alert names repeat"
    assert {"XdsRelayOriginDisconnected", "XdsRelayNotReady", "XdsRelayDown"} <= set(names)
    for rule in alerts():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"], name
        assert len(rule["annotations"]["description"]) > 100, f"{name}: what to look at"
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name


def test_the_prometheus_rule_has_the_same_groups_as_the_rules_file() -> None:
    resource = prometheus_rule()
    assert (resource["apiVersion"], resource["kind"]) == ("monitoring.coreos.com/v1",
                                                         "PrometheusRule")
    assert resource["spec"]["groups"] == rule_groups(), (
        f"{PROMETHEUS_RULE.relative_to(REPO)} and {RULES.relative_to(REPO)} differ: "
        "change both")


def test_the_monitoring_kustomization_lists_its_manifests_and_the_base_does_not() -> None:
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    present = sorted(p.name for p in MONITORING.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == present
    base = yaml.safe_load((MONITORING.parent / "kustomization.yaml").read_text())
    # the base applies without the Prometheus operator's CRDs
    assert not any("monitoring" in resource for resource in base["resources"])


def test_the_unit_tests_see_every_alert_fire_and_not_fire() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())
    assert tests["rule_files"] == [RULES.name]
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in tests["tests"]:
        for case in test["alert_rule_test"]:
            (fired if case["exp_alerts"] else quiet).add(case["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - fired == set(), "alerts no unit test sees fire"
    assert names - quiet == set(), "alerts no unit test sees stay quiet"


# -- promtool ----------------------------------------------------------------------------------


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found: install Debian's prometheus package")
    return subprocess.run([path, *map(str, args)], capture_output=True, text=True,
                          timeout=60, check=False)


def test_promtool_accepts_the_rules_file() -> None:
    checked = promtool("check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_accepts_the_prometheus_rule_spec(tmp_path: Path) -> None:
    spec = tmp_path / "prometheusrule-spec.yaml"
    spec.write_text(yaml.safe_dump(prometheus_rule()["spec"]))
    checked = promtool("check", "rules", spec)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    tested = promtool("test", "rules", RULES_TEST)
    assert tested.returncode == 0, tested.stdout + tested.stderr


# -- the queries against what relays export -------------------------------------------------


def test_every_series_the_queries_use_is_exported_by_a_relay() -> None:
    exported = scrapes()
    missing = {query.where: sorted(set(series_in(query.expr)) - PROMETHEUS_SERIES
                                   - set(NOT_PRODUCED_HERE) - set(exported.single.labels))
               for query in queries()}
    assert {where: names for where, names in missing.items() if names} == {}
    merged = wanted_names() - set(exported.workers.labels)
    assert merged == set(), "series the hub of --workers does not serve"


def test_every_label_the_queries_match_or_keep_is_on_its_series() -> None:
    exported = scrapes()

    def labels_of(name: str) -> frozenset[str]:
        return (exported.single.labels.get(name, frozenset())
                | exported.workers.labels.get(name, frozenset()) | TARGET_LABELS)

    for query in queries():
        named = series_in(query.expr)
        for name, matched in named.items():
            if name in PROMETHEUS_SERIES or name in NOT_PRODUCED_HERE:
                assert matched <= TARGET_LABELS, f"{query.where}: {name} has only {matched}"
                continue
            unknown = matched - labels_of(name)
            assert not unknown, f"{query.where}: {name} has no label {sorted(unknown)}"
        # a label an aggregation keeps or matches on is on one of its series
        on_some = set().union(*(labels_of(name) for name in named)) if named else set()
        unknown = grouping_labels(query.expr) - on_some
        assert not unknown, f"{query.where}: no series has {sorted(unknown)}: {query.expr}"


def test_the_series_not_produced_here_are_few_used_and_still_the_relays() -> None:
    exported = scrapes()
    used = {name for query in queries() for name in series_in(query.expr)}
    source = "\n".join(path.read_text() for path in RELAY_SOURCE.rglob("*.py"))
    for name, instrument in NOT_PRODUCED_HERE.items():
        assert name not in exported.single.labels, f"{name} is exported: drop it from the list"
        assert name in used, f"{name} is used by no query: drop it from the list"
        assert f'"{instrument}"' in source, f"relay/ no longer defines {instrument}"
