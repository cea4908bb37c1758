"""The xds-relay command, run as a real process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import typing
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from envoy.service.discovery.v3 import discovery_pb2
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from relay.server.services import DRAINING
from relay.xds_types import CLUSTER
from tests.ports import free_port

DELTA_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"

REPO = Path(__file__).resolve().parent.parent


def xds_relay(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relay", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout, check=False)


def test_help_documents_every_command() -> None:
    result = xds_relay("--help")
    assert result.returncode == 0
    for command in ("run", "validate", "demo"):
        assert command in result.stdout
    assert "--config" in xds_relay("run", "--help").stdout
    assert "FILE:LINE: FIELD: PROBLEM" in xds_relay("validate", "--help").stdout


def test_validate_accepts_shipped_configs() -> None:
    for name in ("relay.yaml", "origin.yaml"):
        result = xds_relay("validate", "--config", f"config/{name}")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"config/{name}: ok"


def test_validate_names_file_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "relay.yaml"
    bad.write_text("node:\n  id: x\nserver:\n  address: nope\nupstream:\n  adress: a:1\n")
    result = xds_relay("validate", "--config", str(bad))
    assert result.returncode == 1
    assert f"{bad}:4: server.address: invalid address 'nope'" in result.stderr
    assert f"{bad}:6: upstream.adress: unknown key" in result.stderr


def test_validate_names_a_bad_workers_count(tmp_path: Path) -> None:
    bad = tmp_path / "relay.yaml"
    bad.write_text("node: {id: x}\nupstream: {address: 'a:1'}\nserver:\n  workers: 0\n")
    result = xds_relay("validate", "--config", str(bad))
    assert result.returncode == 1
    assert f"{bad}:4: server.workers: must be from 1 to 1024, got 0" in result.stderr


def test_run_refuses_a_bad_workers_flag() -> None:
    result = xds_relay("run", "--config", "config/relay.yaml", "--workers", "none")
    assert result.returncode == 2
    assert "--workers: expected a number from 1 to 1024, got 'none'" in result.stderr


def test_version_is_the_installed_package_version() -> None:
    from importlib import metadata

    result = xds_relay("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"xds-relay {metadata.version('xds-relay')} (Python ")
    assert f"grpcio {metadata.version('grpcio')})" in result.stdout


def _listening() -> socket.socket:
    """A socket another process would find listening on a loopback port."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    return taken


def _config_listening(tmp_path: Path, key: str, port: int) -> Path:
    """A file-source config listening on port 0 everywhere but ``key``."""
    sections = {"server.address": "server", "admin.address": "admin", "rest.address": "rest"}
    addresses = {section: "127.0.0.1:0" for section in sections.values()}
    addresses[sections[key]] = f"127.0.0.1:{port}"
    config = tmp_path / "relay.yaml"
    config.write_text("node: {id: x}\n" + "".join(
        f"{section}: {{address: \"{address}\"}}\n" for section, address in addresses.items())
        + f"upstream: {{files: \"{REPO / 'config/resources'}\"}}\n")
    return config


@pytest.mark.parametrize("key", ["server.address", "admin.address", "rest.address"])
def test_run_on_a_port_in_use_says_so_in_one_line_naming_the_key(tmp_path: Path,
                                                                  key: str) -> None:
    with _listening() as taken:
        port = taken.getsockname()[1]
        result = xds_relay("run", "--config", str(_config_listening(tmp_path, key, port)))
    assert result.returncode == 1
    assert result.stderr == f"xds-relay: cannot listen on 127.0.0.1:{port} ({key}): the port " \
                            f"is in use\n"


def test_validate_warns_of_a_port_in_use(tmp_path: Path) -> None:
    with _listening() as taken:
        port = taken.getsockname()[1]
        config = _config_listening(tmp_path, "admin.address", port)
        result = xds_relay("validate", "--config", str(config))
    assert result.returncode == 0
    assert result.stdout == f"{config}: ok\n"
    assert result.stderr == (f"xds-relay: warning: cannot listen on 127.0.0.1:{port} "
                             f"(admin.address): the port is in use\n")
    # Free again: nothing to warn of.
    assert xds_relay("validate", "--config", str(config)).stderr == ""


async def test_a_relay_failing_to_start_stops_what_did_start(tmp_path: Path) -> None:
    # The admin port is taken after the check (here: never checked), once the
    # xDS server listens: run stops the xDS server on its own loop, rather
    # than leaving it to gRPC's finalizer after the loop is closed.
    from relay.cli import _run
    from relay.config import load_config
    from relay.config.values import Address
    from relay.preflight import PortInUse, ports_in_use

    with _listening() as taken:
        config = load_config(_config_listening(tmp_path, "admin.address",
                                               taken.getsockname()[1]))
        xds = free_port()
        config = config.model_copy(update={"server": config.server.model_copy(
            update={"address": Address("127.0.0.1", xds)})})
        with pytest.raises(OSError, match=r"\(admin\.address\)"):
            await _run(config, "info")
        assert ports_in_use(config) == [PortInUse("admin.address", config.admin.address)]


def test_the_shipped_configs_and_the_demo_listen_on_loopback_by_default() -> None:
    from relay.config import load_config, parse_config
    from relay.demo import _origin_config, _relay_config

    configs = {name: load_config(REPO / "config" / name) for name in ("relay.yaml",
                                                                      "origin.yaml")}
    configs["demo relay"] = parse_config(_relay_config(18000, 19000, 18001))
    configs["demo origin"] = parse_config(_origin_config(REPO / "config/resources", 18001))
    configs["defaults"] = parse_config("node: {id: a}\nupstream: {address: 'o:1'}\n")
    for name, config in configs.items():
        assert (config.server.address.host, config.admin.address.host) == (
            "127.0.0.1", "127.0.0.1"), name
    # and they say what to change for a zone's other hosts
    for name in ("relay.yaml", "origin.yaml"):
        assert "0.0.0.0:" in (REPO / "config" / name).read_text(), name


def test_run_refuses_a_bad_config_without_starting(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = xds_relay("run", "--config", str(missing))
    assert result.returncode == 1
    assert str(missing) in result.stderr


def test_demo_shows_a_client_served_through_the_relay() -> None:
    result = xds_relay("demo", "--once", "--port", "0", "--admin-port", "0",
                       "--origin-port", "0")
    assert result.returncode == 0, result.stderr
    assert "xDS clients connect to 127.0.0.1:" in result.stdout
    assert "/metrics" in result.stdout
    assert "-> Cluster: service_a, service_b" in result.stdout
    assert "-> Listener: listener_0" in result.stdout
    assert "-> ClusterLoadAssignment: service_a, service_b" in result.stdout


def test_run_serves_files_and_drains_on_sigterm(tmp_path: Path) -> None:
    admin, xds = free_port(), free_port()
    config = tmp_path / "origin.yaml"
    config.write_text(f"""
node: {{id: cli-test}}
server: {{address: "127.0.0.1:{xds}", drain_period: 1s}}
admin: {{address: "127.0.0.1:{admin}"}}
upstream: {{files: "{REPO / 'config/resources'}"}}
logging: {{format: json}}
""")
    proc = subprocess.Popen([sys.executable, "-m", "relay", "run", "--config", str(config)],
                            cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    hold_open = threading.Event()

    def requests() -> Iterator[discovery_pb2.DeltaDiscoveryRequest]:
        yield discovery_pb2.DeltaDiscoveryRequest(node={"id": "client"}, type_url=CLUSTER)
        hold_open.wait(30)

    try:
        deadline = time.monotonic() + 20
        status = 0
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1) as r:
                    status = r.status
                    break
            except OSError:
                time.sleep(0.05)
        assert status == 200
        with urllib.request.urlopen(
                f"http://127.0.0.1:{admin}/config_dump?type=Cluster", timeout=5) as reply:
            dump = reply.read().decode()
        assert '"service_a"' in dump and '"service_b"' in dump
        with grpc.insecure_channel(f"127.0.0.1:{xds}") as channel:
            stream = channel.stream_stream(
                DELTA_ADS, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)(requests())
            first = next(stream)
            assert sorted(r.name for r in first.resources) == ["service_a", "service_b"]
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.RpcError) as closed:
                next(stream)
            assert closed.value.code() == grpc.StatusCode.UNAVAILABLE
            assert closed.value.details() == DRAINING
        assert proc.wait(10) == 0
        assert time.monotonic() - sent < 5
    finally:
        hold_open.set()
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read() if proc.stderr else ""
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    messages = [(r["level"], r["logger"], r["msg"]) for r in records]
    assert ("info", "relay", f"serving xDS on 127.0.0.1:{xds}, admin on 127.0.0.1:{admin}") \
        in messages
    assert messages[-4:] == [
        ("info", "relay", "SIGTERM: draining over 1.0s (signal again to stop now)"),
        ("info", "relay", "draining: closing 1 client streams over 1.0s"),
        ("info", "relay", messages[-2][2]),
        ("info", "relay", "shutting down")]
    assert messages[-2][2].startswith("drained in ")
    assert all(r["time"].endswith("Z") for r in records)


async def test_run_node_id_flag_overrides_the_config(tmp_path: Path) -> None:
    from tests.harness import ScriptedOrigin, cluster

    origin = await ScriptedOrigin().start()
    origin.set(cluster("a"))
    xds = free_port()
    config = tmp_path / "relay.yaml"
    config.write_text(f"""
node: {{id: from-config}}
server: {{address: "127.0.0.1:{xds}"}}
admin: {{address: "127.0.0.1:0"}}
upstream: {{address: "127.0.0.1:{origin.port}"}}
""")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay", "run", "--config", str(config), "--node-id", "pod-7",
        cwd=REPO, stderr=asyncio.subprocess.DEVNULL)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{xds}") as channel:
            call = channel.stream_stream(
                DELTA_ADS, request_serializer=discovery_pb2.DeltaDiscoveryRequest.SerializeToString,
                response_deserializer=discovery_pb2.DeltaDiscoveryResponse.FromString)(
                    wait_for_ready=True)
            await call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=CLUSTER))
            request = await origin.next_request(timeout=20)
            assert request.node.id == "pod-7"
            assert request.node.cluster == "xds-relay"
            call.cancel()
    finally:
        proc.terminate()
        await proc.wait()
        await origin.stop()


def test_validate_names_a_missing_origin_certificate(tmp_path: Path) -> None:
    config = tmp_path / "relay.yaml"
    config.write_text("node: {id: x}\nupstream:\n  address: istiod.istio-system.svc:15012\n"
                      "  tls: {ca_file: /var/run/secrets/istio/root-cert.pem}\n")
    result = xds_relay("validate", "--config", str(config))
    assert result.returncode == 1
    assert (f"{config}:4: upstream.tls.ca_file: file not found: "
            "/var/run/secrets/istio/root-cert.pem") in result.stderr


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every leaf field under ``model`` by dotted key, sections walked into (optional or not)."""
    leaves: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        # A list or mapping of sections (upstream.fallback, authorities) is one key.
        is_container = typing.get_origin(field.annotation) in (list, dict)
        types = () if is_container else typing.get_args(field.annotation) or (field.annotation,)
        sections = [t for t in types if isinstance(t, type) and issubclass(t, BaseModel)]
        if sections:
            leaves.update(_leaf_fields(sections[0], f"{prefix}{name}."))
        else:
            leaves[f"{prefix}{name}"] = field
    return leaves


def _config_setting(key: str, value: object) -> str:
    """A valid config that sets ``key`` (dotted) to ``value``, and otherwise only what it must."""
    document: dict[str, Any] = {"node": {"id": "a"}, "upstream": {"address": "origin:18000"},
                                "metrics": {"otlp": {"endpoint": "http://collector:4318"}},
                                "persistence": {"redis": {"url": "redis://cache:6379"}}}
    if key.startswith("upstream.node_groups."):  # a section with a required key of its own
        document["upstream"]["node_groups"] = {"key": ["cluster"]}
    *sections, leaf = key.split(".")
    mapping = document
    for section in sections:
        mapping = mapping.setdefault(section, {})
    mapping[leaf] = value
    return yaml.safe_dump(document)


def test_keys_lists_every_config_key_once_with_its_default() -> None:
    from relay.config import RelayConfig, parse_config

    result = xds_relay("keys")
    assert result.returncode == 0, result.stderr
    listed: dict[str, str] = {}
    for line in result.stdout.splitlines():
        match = re.fullmatch(r"(\S+) = (\S.*?)  # (\S[^\n]*)", line)
        assert match is not None, f"not 'key = default  # description': {line!r}"
        key, default, _description = match.groups()
        assert key not in listed, f"{key} listed twice"
        listed[key] = default
    fields = _leaf_fields(RelayConfig)
    assert list(listed) == list(fields)  # every leaf, nothing else, in declaration order
    for key, field in fields.items():
        shown = listed[key]
        if field.is_required():
            assert shown == "(required)", key
            continue
        default = field.get_default(call_default_factory=True)
        if default is None:
            assert shown == "(none)", key
            continue
        # What is shown is what a config would write: writing it gives the default.
        config: Any = parse_config(_config_setting(key, yaml.safe_load(shown)), f"{key}.yaml")
        for part in key.split("."):
            config = getattr(config, part)
        assert config == default, f"{key} = {shown} reads as {config!r}, not {default!r}"


def test_help_points_at_the_keys_listing() -> None:
    assert "keys" in xds_relay("--help").stdout
    assert "xds-relay keys" in " ".join(xds_relay("run", "--help").stdout.split())
