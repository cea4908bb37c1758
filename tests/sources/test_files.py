"""FileSource: a directory of Envoy YAML/JSON resource files as the relay's origin."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from prometheus_client import CollectorRegistry

from relay.cache import ABSENT, UNKNOWN, CacheChange, ResourceCache
from relay.sources.files import FileError, FileSource, resource_name
from relay.telemetry import Metrics, new_metrics, prometheus_provider
from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, PUSH_ORDER, ROUTE, RUNTIME, SECRET

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "resources"
CLUSTER_AT = '"@type": type.googleapis.com/envoy.config.cluster.v3.Cluster'
HCM_AT = ('"@type": type.googleapis.com/'
          "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager")
ROUTER_AT = '"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router'


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def cluster_doc(name: str, timeout: str = "1s") -> str:
    return f"{CLUSTER_AT}\nname: {name}\ntype: EDS\nconnect_timeout: {timeout}\n"


class Recorder:
    """A cache and every change it announced."""

    def __init__(self) -> None:
        self.cache = ResourceCache()
        self.changes: list[CacheChange] = []
        self.cache.add_listener(self.changes.append)

    def changed(self, type_url: str) -> set[str]:
        """Names of ``type_url`` announced since the last :meth:`clear`."""
        return {n for c in self.changes if c.type_url == type_url for n in c.names}

    def clear(self) -> None:
        self.changes.clear()

    def version(self, type_url: str, name: str) -> str:
        found = self.cache.variants(type_url, name)
        assert found is not ABSENT and found is not UNKNOWN, f"{name}: {found}"
        return found[""].version


def source_for(directory: Path, metrics: Metrics | None = None) -> tuple[FileSource, Recorder]:
    recorder = Recorder()
    return FileSource(directory, recorder.cache, poll_interval=0.05, metrics=metrics), recorder


def errors_counted(registry: CollectorRegistry) -> float:
    return sum(sample.value for metric in registry.collect() for sample in metric.samples
               if sample.name == "xds_relay_source_errors_total"
               and sample.labels.get("source") == "files")


# -- file shapes ---------------------------------------------------------------


def test_every_file_shape_loads(tmp_path: Path) -> None:
    write(tmp_path, "single.yaml", cluster_doc("single"))
    write(tmp_path, "list.yml", f"""
        - {CLUSTER_AT}
          name: list_a
        - {CLUSTER_AT}
          name: list_b
        """)
    write(tmp_path, "mapping.yaml", f"""
        version_info: ignored
        resources:
        - {CLUSTER_AT}
          name: mapped
        """)
    write(tmp_path, "multi.yaml", f"""
        {CLUSTER_AT}
        name: doc_1
        ---
        "@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
        cluster_name: doc_1
        endpoints:
        - lb_endpoints:
          - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 80}}}}}}
        ---
        """)
    write(tmp_path, "sub/dir/resource.json", """
        {"resources": [
          {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
           "name": "from_json", "connectTimeout": "2.5s"}
        ]}
        """)
    source, rec = source_for(tmp_path)

    assert source.load() == []

    assert sorted(rec.cache.names(CLUSTER)) == [
        "doc_1", "from_json", "list_a", "list_b", "mapped", "single"]
    assert list(rec.cache.names(ENDPOINT)) == ["doc_1"]
    body = next(r for r in rec.cache.resources(CLUSTER) if r.name == "from_json").body
    parsed = cluster_pb2.Cluster.FromString(body.value)
    assert body.type_url == CLUSTER
    assert parsed.connect_timeout.ToMilliseconds() == 2500
    cla = endpoint_pb2.ClusterLoadAssignment.FromString(
        next(iter(rec.cache.resources(ENDPOINT))).body.value)
    assert cla.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value == 80


def test_nested_any_with_type_is_parsed(tmp_path: Path) -> None:
    write(tmp_path, "listener.yaml", f"""
        "@type": type.googleapis.com/envoy.config.listener.v3.Listener
        name: l
        filter_chains:
        - filters:
          - name: hcm
            typed_config:
              {HCM_AT}
              stat_prefix: in
              route_config: {{name: inline}}
              http_filters:
              - name: router
                typed_config:
                  {ROUTER_AT}
        """)
    source, rec = source_for(tmp_path)
    assert source.load() == []
    assert list(rec.cache.names(LISTENER)) == ["l"]


def test_ignores_hidden_backup_and_other_files(tmp_path: Path) -> None:
    write(tmp_path, "kept.yaml", cluster_doc("kept"))
    write(tmp_path, ".hidden.yaml", cluster_doc("hidden"))
    write(tmp_path, "kept.yaml~", cluster_doc("backup"))
    write(tmp_path, "kept.yaml.swp", cluster_doc("swap"))
    write(tmp_path, "notes.txt", cluster_doc("text"))
    write(tmp_path, ".git/config.yaml", cluster_doc("in_hidden_dir"))
    write(tmp_path, "empty.yaml", "# nothing yet\n")
    source, rec = source_for(tmp_path)
    assert source.load() == []
    assert list(rec.cache.names(CLUSTER)) == ["kept"]


def test_every_well_known_type_becomes_synced_even_when_empty(tmp_path: Path) -> None:
    source, rec = source_for(tmp_path)
    assert source.load() == []
    for type_url in PUSH_ORDER:
        assert rec.cache.is_synced(type_url)
        assert rec.cache.variants(type_url, "anything") is ABSENT
    # Pushed in make-before-break order: clusters before listeners before routes.
    order = [c.type_url for c in rec.changes]
    assert order == list(PUSH_ORDER)


def test_resource_name_handles_name_and_cluster_name() -> None:
    assert resource_name(cluster_pb2.Cluster(name="c")) == "c"
    assert resource_name(endpoint_pb2.ClusterLoadAssignment(cluster_name="e")) == "e"
    assert resource_name(cluster_pb2.Cluster()) == ""


def test_file_error_format() -> None:
    assert str(FileError(Path("d/a.yaml"), 3, "bad")) == "d/a.yaml:3: bad"
    assert str(FileError(Path("d/a.yaml"), None, "bad")) == "d/a.yaml: bad"


# -- versions and changes --------------------------------------------------------


def test_versions_are_content_hashes_stable_across_instances(tmp_path: Path) -> None:
    write(tmp_path, "clusters.yaml", cluster_doc("a") + "---\n" + cluster_doc("b", "2s"))
    first, rec1 = source_for(tmp_path)
    second, rec2 = source_for(tmp_path)
    assert first.load() == second.load() == []

    for name in ("a", "b"):
        assert rec1.version(CLUSTER, name) == rec2.version(CLUSTER, name)
    resource = next(r for r in rec1.cache.resources(CLUSTER) if r.name == "a")
    assert resource.version == hashlib.sha256(resource.body.value).hexdigest()[:16]
    assert rec1.version(CLUSTER, "a") != rec1.version(CLUSTER, "b")
    # Moving a resource to another file, or reformatting it, keeps its version.
    (tmp_path / "clusters.yaml").unlink()
    write(tmp_path, "b.yaml", "{'@type': 'type.googleapis.com/envoy.config.cluster.v3.Cluster',"
                              " connect_timeout: 2s, type: EDS, name: b}")
    rec1.clear()
    assert first.load() == []
    assert rec1.version(CLUSTER, "b") == rec2.version(CLUSTER, "b")
    assert rec1.changed(CLUSTER) == {"a"}


def test_map_order_inside_any_does_not_change_version(tmp_path: Path) -> None:
    def listener(keys: list[str]) -> str:
        per_filter = "".join(
            f"""
                        {key}:
                          {ROUTER_AT}
                          suppress_envoy_headers: true"""
            for key in keys)
        return f"""
            "@type": type.googleapis.com/envoy.config.listener.v3.Listener
            name: l
            filter_chains:
            - filters:
              - name: hcm
                typed_config:
                  {HCM_AT}
                  stat_prefix: in
                  route_config:
                    name: inline
                    virtual_hosts:
                    - name: vh
                      domains: ["*"]
                      typed_per_filter_config:{per_filter}
            """

    keys = [f"filter_{i}" for i in range(30)]
    write(tmp_path / "one", "l.yaml", listener(keys))
    write(tmp_path / "two", "l.yaml", listener(keys[::-1]))
    one, rec1 = source_for(tmp_path / "one")
    two, rec2 = source_for(tmp_path / "two")
    assert one.load() == two.load() == []
    version = rec1.version(LISTENER, "l")
    assert rec2.version(LISTENER, "l") == version
    # Map order inside a packed Any can differ from one process to the next;
    # other processes (a restart, another replica) must agree all the same.
    script = ("import sys; from pathlib import Path; from relay.cache import ResourceCache; "
              "from relay.sources.files import FileSource; c = ResourceCache(); "
              "assert FileSource(Path(sys.argv[1]), c).load() == []; "
              "print(next(iter(c.resources(sys.argv[2]))).version)")
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "one"), LISTENER],
                             capture_output=True, text=True, check=True, timeout=30)
        assert out.stdout.strip() == version


def test_changing_one_resource_changes_only_its_version(tmp_path: Path) -> None:
    write(tmp_path, "clusters.yaml", cluster_doc("a") + "---\n" + cluster_doc("b"))
    write(tmp_path, "other.yaml", cluster_doc("c"))
    source, rec = source_for(tmp_path)
    source.load()
    before = {name: rec.version(CLUSTER, name) for name in "abc"}
    rec.clear()

    write(tmp_path, "clusters.yaml", cluster_doc("a") + "---\n" + cluster_doc("b", "5s"))
    assert source.load() == []

    assert rec.changes == [CacheChange(CLUSTER, frozenset({"b"}))]
    assert rec.version(CLUSTER, "a") == before["a"]
    assert rec.version(CLUSTER, "c") == before["c"]
    assert rec.version(CLUSTER, "b") != before["b"]
    # Loading again with nothing changed tells nobody anything.
    rec.clear()
    assert source.load() == []
    assert rec.changes == []


def test_deleted_file_removes_its_resources(tmp_path: Path) -> None:
    write(tmp_path, "keep.yaml", cluster_doc("kept"))
    gone = write(tmp_path, "gone.yaml", f"""
        - {CLUSTER_AT}
          name: gone
        - "@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
          cluster_name: gone
        """)
    source, rec = source_for(tmp_path)
    assert source.load() == []
    assert set(rec.cache.names(CLUSTER)) == {"kept", "gone"}
    rec.clear()

    gone.unlink()
    assert source.load() == []

    assert rec.cache.variants(CLUSTER, "gone") is ABSENT
    assert rec.cache.variants(ENDPOINT, "gone") is ABSENT
    assert rec.changed(CLUSTER) == {"gone"}
    assert rec.changed(ENDPOINT) == {"gone"}
    assert rec.version(CLUSTER, "kept")


def test_type_outside_push_order_is_emptied_when_its_last_resource_goes(tmp_path: Path) -> None:
    # Any named message can be served; this one is not a well-known xDS type.
    named = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
    path = write(tmp_path, "ext.yaml", f'"@type": {named}\nname: ext\n')
    source, rec = source_for(tmp_path)
    assert source.load() == []
    assert list(rec.cache.names(named)) == ["ext"]

    path.unlink()
    rec.clear()
    assert source.load() == []
    assert rec.cache.variants(named, "ext") is ABSENT
    assert rec.changed(named) == {"ext"}


# -- broken files ----------------------------------------------------------------


@pytest.mark.parametrize(("broken", "line", "problem"), [
    pytest.param("name: a\ntype: [EDS\n", 3, "invalid YAML", id="yaml-syntax"),
    pytest.param('"@type": type.googleapis.com/no.Such\nname: a\n', 1, "unknown @type",
                 id="unknown-type"),
    pytest.param(f"{CLUSTER_AT}\nname: a\nconnect_timout: 1s\n", 3,
                 'no field named "connect_timout"', id="unknown-field"),
    pytest.param(f"{CLUSTER_AT}\nname: a\nconnect_timeout: soon\n", 3, "connect_timeout",
                 id="bad-value"),
    pytest.param(f"{CLUSTER_AT}\ntype: EDS\n", 1, "Cluster has no name", id="missing-name"),
    pytest.param(f"{CLUSTER_AT}\nname: a\nname: b\n", 3, "duplicate key 'name'",
                 id="duplicate-key"),
    pytest.param(f"{cluster_doc('a')}---\n{cluster_doc('a')}", 6, "duplicate Cluster 'a'",
                 id="duplicate-in-file"),
    pytest.param("- just a string\n", 1, "must be a mapping", id="not-a-mapping"),
])
def test_broken_file_is_reported_and_previous_content_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        broken: str, line: int, problem: str) -> None:
    provider, registry = prometheus_provider()
    path = write(tmp_path, "clusters.yaml", cluster_doc("a"))
    write(tmp_path, "other.yaml", cluster_doc("other"))
    source, rec = source_for(tmp_path, new_metrics(provider))
    assert source.load() == []
    version = rec.version(CLUSTER, "a")
    rec.clear()

    path.write_text(broken)
    with caplog.at_level(logging.WARNING, logger="relay.sources.files"):
        errors = source.load()

    assert len(errors) == 1, errors
    assert errors[0].path == path
    assert errors[0].line == line
    assert problem in errors[0].message
    assert str(errors[0]).startswith(f"{path}:{line}: ")
    assert [r.getMessage() for r in caplog.records] == [str(errors[0])]
    assert errors_counted(registry) == 1
    assert source.errors == errors
    # The file's last good content is still what clients get.
    assert rec.version(CLUSTER, "a") == version
    assert rec.changed(CLUSTER) == set()

    # Fixed: served again, error gone.
    path.write_text(cluster_doc("a", "3s"))
    assert source.load() == []
    assert rec.version(CLUSTER, "a") != version


def test_a_mended_file_is_logged_with_what_it_serves_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, "clusters.yaml", cluster_doc("a") + "---\n" + cluster_doc("b"))
    write(tmp_path, "other.yaml", cluster_doc("other"))
    source, _ = source_for(tmp_path)
    assert source.load() == []
    path.write_text("name: [\n")
    assert len(source.load()) == 1

    path.write_text(cluster_doc("a", "3s") + "---\n" + cluster_doc("b"))
    with caplog.at_level(logging.INFO, logger="relay.sources.files"):
        assert source.load() == []
        assert source.load() == []  # mended once: the next load says nothing of it

    assert [r.getMessage() for r in caplog.records if " mended: " in r.getMessage()] == [
        f"{path} mended: serving 2 resources again"]


def test_a_broken_file_removed_is_not_mended(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, "bad.yaml", "name: [\n")
    write(tmp_path, "good.yaml", cluster_doc("good"))
    source, _ = source_for(tmp_path)
    assert len(source.load()) == 1
    path.unlink()
    with caplog.at_level(logging.INFO, logger="relay.sources.files"):
        assert source.load() == []
    assert not [r for r in caplog.records if " mended: " in r.getMessage()]


def test_a_directory_listed_again_is_mended(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "resources"
    write(directory, "c.yaml", cluster_doc("c") + "---\n" + cluster_doc("d"))
    source, _ = source_for(directory)
    assert source.load() == []
    directory.rename(tmp_path / "elsewhere")
    assert len(source.load()) == 1
    (tmp_path / "elsewhere").rename(directory)
    with caplog.at_level(logging.INFO, logger="relay.sources.files"):
        assert source.load() == []
    assert [r.getMessage() for r in caplog.records if " mended: " in r.getMessage()] == [
        f"{directory} mended: serving 2 resources again"]


def test_bad_file_on_first_load_contributes_nothing(tmp_path: Path) -> None:
    write(tmp_path, "good.yaml", cluster_doc("good"))
    write(tmp_path, "bad.json", '{"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",'
                                '\n "name": "bad",\n "type": }')
    source, rec = source_for(tmp_path)
    errors = source.load()
    assert [(e.path.name, e.line) for e in errors] == [("bad.json", 3)]
    assert "invalid JSON" in errors[0].message
    assert list(rec.cache.names(CLUSTER)) == ["good"]
    assert rec.cache.variants(CLUSTER, "bad") is ABSENT


def test_repeated_key_is_found_at_any_depth_and_named_with_both_lines(tmp_path: Path) -> None:
    write(tmp_path, "c.yaml", f"""
        {CLUSTER_AT}
        name: a
        load_assignment:
          cluster_name: a
          cluster_name: b
        """)
    source, _ = source_for(tmp_path)
    assert [(e.line, e.message) for e in source.load()] == [
        (5, "invalid YAML: duplicate key 'cluster_name' (first on line 4)")]


def test_yaml_merge_keys_are_not_repeated_keys(tmp_path: Path) -> None:
    # The second resource overrides the merged-in name: not a key given twice.
    write(tmp_path, "c.yaml", f"""
        - &a
          {CLUSTER_AT}
          name: a
          type: EDS
          connect_timeout: 1s
        - <<: *a
          name: b
        """)
    source, rec = source_for(tmp_path)
    assert source.load() == []
    assert list(rec.cache.names(CLUSTER)) == ["a", "b"]


def test_unchanged_broken_file_is_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    provider, registry = prometheus_provider()
    write(tmp_path, "bad.yaml", "name: [\n")
    write(tmp_path, "good.yaml", cluster_doc("good"))
    source, _ = source_for(tmp_path, new_metrics(provider))
    with caplog.at_level(logging.WARNING, logger="relay.sources.files"):
        assert len(source.load()) == 1
        write(tmp_path, "good.yaml", cluster_doc("good", "2s"))
        assert len(source.load()) == 1  # still reported to the caller ...
    assert len(caplog.records) == 1     # ... but logged and counted once
    assert errors_counted(registry) == 1


def test_duplicate_name_across_files_first_load_keeps_first_sorted(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", cluster_doc("dup"))
    write(tmp_path, "b.yaml", cluster_doc("dup", "9s") + "---\n" + cluster_doc("only_b"))
    source, rec = source_for(tmp_path)
    errors = source.load()
    assert [(e.path.name, e.line) for e in errors] == [("b.yaml", 1)]
    assert "duplicate Cluster 'dup': already defined in" in errors[0].message
    assert str(tmp_path / "a.yaml") in errors[0].message
    # The bad file contributes nothing, not even its other resources.
    assert list(rec.cache.names(CLUSTER)) == ["dup"]
    body = next(iter(rec.cache.resources(CLUSTER))).body
    assert cluster_pb2.Cluster.FromString(body.value).connect_timeout.seconds == 1


def test_duplicate_name_across_files_holder_keeps_it(tmp_path: Path) -> None:
    write(tmp_path, "b.yaml", cluster_doc("dup"))
    source, rec = source_for(tmp_path)
    assert source.load() == []
    version = rec.version(CLUSTER, "dup")

    write(tmp_path, "a.yaml", cluster_doc("dup", "9s"))  # sorts first, but came later
    errors = source.load()

    assert [e.path.name for e in errors] == ["a.yaml"]
    assert rec.version(CLUSTER, "dup") == version


def test_moving_a_resource_between_files_in_one_load_is_not_a_duplicate(
        tmp_path: Path) -> None:
    write(tmp_path, "b.yaml", cluster_doc("moving") + "---\n" + cluster_doc("stays"))
    source, rec = source_for(tmp_path)
    assert source.load() == []
    version = rec.version(CLUSTER, "moving")

    write(tmp_path, "b.yaml", cluster_doc("stays"))
    write(tmp_path, "a.yaml", cluster_doc("moving"))
    rec.clear()
    assert source.load() == []
    assert rec.version(CLUSTER, "moving") == version
    assert rec.changes == []


def test_unreadable_directory_keeps_serving(tmp_path: Path) -> None:
    directory = tmp_path / "resources"
    write(directory, "c.yaml", cluster_doc("c"))
    source, rec = source_for(directory)
    assert source.load() == []

    directory.rename(tmp_path / "elsewhere")
    errors = source.load()

    assert [(e.path, e.line) for e in errors] == [(directory, None)]
    assert rec.version(CLUSTER, "c")


# -- the sample resources --------------------------------------------------------


def test_sample_resources_load_without_errors() -> None:
    source, rec = source_for(SAMPLES)
    assert source.load() == []
    assert list(rec.cache.names(LISTENER)) == ["listener_0"]
    assert list(rec.cache.names(ROUTE)) == ["route_0"]
    assert sorted(rec.cache.names(CLUSTER)) == ["service_a", "service_b"]
    assert sorted(rec.cache.names(ENDPOINT)) == ["service_a", "service_b"]
    for empty in (SECRET, RUNTIME):
        assert rec.cache.is_synced(empty)
        assert list(rec.cache.names(empty)) == []


# -- polling -----------------------------------------------------------------------


async def test_run_picks_up_changes_and_is_cancellable(tmp_path: Path) -> None:
    path = write(tmp_path, "c.yaml", cluster_doc("a"))
    source, rec = source_for(tmp_path)
    seen: dict[str, asyncio.Event] = {"changed": asyncio.Event(), "added": asyncio.Event()}

    def on_change(change: CacheChange) -> None:
        if change.type_url != CLUSTER:
            return
        if "a" in change.names:
            seen["changed"].set()
        if "b" in change.names:
            seen["added"].set()

    source.load()
    version = rec.version(CLUSTER, "a")
    rec.cache.add_listener(on_change)
    task = asyncio.create_task(source.run())
    try:
        path.write_text(cluster_doc("a", "10s"))
        await asyncio.wait_for(seen["changed"].wait(), timeout=5)
        assert rec.version(CLUSTER, "a") != version

        write(tmp_path, "new/b.json",
              '{"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "b"}')
        await asyncio.wait_for(seen["added"].wait(), timeout=5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert task.cancelled()


async def test_run_loads_at_once_without_a_prior_load(tmp_path: Path) -> None:
    write(tmp_path, "c.yaml", cluster_doc("a"))
    source, rec = source_for(tmp_path)
    synced = asyncio.Event()
    rec.cache.add_listener(lambda change: synced.set() if change.type_url == CLUSTER else None)
    task = asyncio.create_task(source.run())
    try:
        await asyncio.wait_for(synced.wait(), timeout=5)
        assert list(rec.cache.names(CLUSTER)) == ["a"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
