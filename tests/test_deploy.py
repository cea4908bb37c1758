"""The deployment files agree with each other and with the relay's config schema.

Neither Docker nor Kubernetes runs here, so the Dockerfile, docker-compose.yml,
docker-compose.tls.yml, deploy/compose/ and deploy/kubernetes/ are parsed and
cross-checked instead: every relay config validates, and a port, address, path,
grace period, Redis service, secret or certificate changed in one file only makes
a test here fail, naming both places. The compose TLS demo's certificates are
made here by its own script (deploy/compose/demo_certs.py) and every TLS hop of
the demo is tried with them: a handshake in memory, then the relay's authorization.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import fnmatch
import functools
import json
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import trustme
import yaml
from cryptography import x509
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2  # noqa: F401 (Any type)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401 (Any type)
from google.protobuf import json_format

from relay.authorization import Authorizer, PeerIdentity
from relay.certificates import load_key_pair
from relay.config import (
    AdminConfig,
    RelayConfig,
    ServerConfig,
    parse_config,
    parse_duration,
)

# Parsed files are cached (functools.cache) and shared between tests, which only read them.
REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_TLS = REPO / "docker-compose.tls.yml"
DEMO_CERTS = REPO / "deploy" / "compose" / "demo_certs.py"
KUBERNETES = REPO / "deploy" / "kubernetes"
RESOURCES = REPO / "config" / "resources"

ZONE_RELAYS = ("relay-zone-a", "relay-zone-b")
REDIS = "redis"
REDIS_DEFAULT_PORT = 6379
ENVOYS = {"envoy-zone-a": "relay-zone-a", "envoy-zone-b": "relay-zone-b"}
CERTS = "certs"  # docker-compose.tls.yml's one-shot service that makes the demo certificates
# Every TLS hop of the compose demo: client service -> the relay it connects to.
TLS_HOPS = {**ENVOYS, **{relay: "origin" for relay in ZONE_RELAYS}}
ALL_INTERFACES = ("0.0.0.0", "::")

LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
UPSTREAM_TLS_TYPE = ("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                     "UpstreamTlsContext")
CERT_MANAGER_SECRET_KEYS = {"cert_file": "tls.crt", "key_file": "tls.key",
                            "client_ca_file": "ca.crt"}


# --------------------------------------------------------------------------- helpers


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def _relay_config(text: str, source: str) -> RelayConfig:
    # upstream.files is relative to the working directory: the repository here,
    # WORKDIR in the image.
    with contextlib.chdir(REPO):
        return parse_config(text, source)


def _config_flag(args: list[str], where: str) -> str:
    assert "--config" in args, f"{where}: no --config in {args}"
    index = args.index("--config")
    assert index + 1 < len(args), f"{where}: --config without a value in {args}"
    return args[index + 1]


def _url_port_and_path(text: str, where: str) -> tuple[int, str]:
    match = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]*)", text)
    assert match is not None, f"{where}: no http://127.0.0.1:PORT/PATH in {text!r}"
    return int(match.group(1)), match.group(2)


def _redis_port(args: list[str]) -> int:
    """The port a redis-server started with these arguments listens on."""
    return int(args[args.index("--port") + 1]) if "--port" in args else REDIS_DEFAULT_PORT


def _redis_target(config: RelayConfig, where: str) -> tuple[str, int]:
    """The host and port of the Redis a relay config keeps its snapshot in."""
    persistence = config.persistence
    assert persistence is not None and persistence.redis is not None, (
        f"{where}: expected persistence.redis")
    url = urlsplit(persistence.redis.url)
    assert url.hostname is not None, f"{where}: no host in {persistence.redis.url}"
    return url.hostname, url.port or REDIS_DEFAULT_PORT


def _zone_key_prefix(config: RelayConfig, where: str) -> str:
    """The relay's snapshot key prefix: set explicitly, and naming its zone."""
    assert config.persistence is not None and config.persistence.redis is not None
    prefix = config.persistence.redis.key_prefix
    zone = config.node.locality.zone
    assert prefix is not None, f"{where}: set persistence.redis.key_prefix, one per zone"
    assert zone and zone in prefix, (
        f"{where}: key_prefix {prefix!r} should name the zone {zone!r}, which its replicas "
        f"share and other zones do not")
    return config.snapshot_prefix()


def _binds_all_interfaces(config: RelayConfig, where: str) -> None:
    for section in ("server", "admin"):
        address = getattr(config, section).address
        assert address.host in ALL_INTERFACES, (
            f"{where}: {section}.address is {address}; inside a container it must bind "
            f"{' or '.join(ALL_INTERFACES)} to be reachable")


# --------------------------------------------------------------------------- Dockerfile


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str

    def exec_form(self) -> list[str]:
        value = json.loads(self.args)
        assert isinstance(value, list), f"Dockerfile: {self.keyword} is not a JSON list"
        return [str(item) for item in value]


@functools.cache
def _instructions() -> list[Instruction]:
    """Every instruction of the Dockerfile, continuation lines joined."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
        pending = ""
    return instructions


def _final_stage() -> list[Instruction]:
    """The instructions from the last FROM on: what the image runs with."""
    instructions = _instructions()
    starts = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    assert starts, "Dockerfile: no FROM"
    return instructions[starts[-1]:]


def _only(keyword: str) -> Instruction:
    found = [ins for ins in _final_stage() if ins.keyword == keyword]
    assert len(found) == 1, f"Dockerfile: expected one {keyword} in the final stage, got {found}"
    return found[0]


def _image_config_path() -> str:
    return _config_flag(_only("CMD").exec_form(), "Dockerfile CMD")


def _image_copies() -> dict[str, str]:
    """Final-stage COPY from the build context: image path -> repository path."""
    workdir = PurePosixPath("/")
    copies: dict[str, str] = {}
    for ins in _final_stage():
        if ins.keyword == "WORKDIR":
            workdir = workdir / ins.args
        if ins.keyword != "COPY" or "--from=" in ins.args:
            continue
        *sources, dest = shlex.split(ins.args)
        for source in sources:
            copies[str(workdir / dest)] = source
    return copies


def _image_user() -> str:
    return _only("USER").args.split(":")[0]


def test_dockerfile_exposes_the_default_server_and_admin_ports() -> None:
    exposed = {int(port.split("/")[0]) for port in _only("EXPOSE").args.split()}
    defaults = {ServerConfig().address.port, AdminConfig().address.port}
    assert exposed == defaults, (
        f"Dockerfile EXPOSE {sorted(exposed)} != the relay's default server and admin ports "
        f"{sorted(defaults)} (relay/config/models.py)")


def test_dockerfile_entrypoint_is_the_console_script() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoint = _only("ENTRYPOINT").exec_form()
    assert entrypoint == ["xds-relay"], f"Dockerfile ENTRYPOINT is {entrypoint}"
    assert entrypoint[0] in scripts, (
        f"Dockerfile ENTRYPOINT {entrypoint[0]!r} is not a console script of pyproject.toml "
        f"({sorted(scripts)})")


def test_dockerfile_cmd_reads_the_config_where_kubernetes_mounts_it() -> None:
    cmd = _only("CMD").exec_form()
    assert cmd[0] == "run", f"Dockerfile CMD should start the relay with 'run', got {cmd}"
    container = _deployment_container()
    assert _image_config_path() == _config_flag(container["args"], "Deployment args"), (
        "Dockerfile CMD and relay-deployment.yaml args name different config files")


def test_dockerfile_runs_as_a_non_root_user_that_kubernetes_names() -> None:
    user = _image_user()
    assert user not in ("root", "0"), f"Dockerfile USER is {user!r}"
    assert user.isdigit(), f"Dockerfile USER {user!r} should be numeric for runAsNonRoot checks"
    pod_security = _deployment()["spec"]["template"]["spec"]["securityContext"]
    assert pod_security.get("runAsUser") == int(user), (
        f"relay-deployment.yaml runAsUser {pod_security.get('runAsUser')} != Dockerfile USER "
        f"{user}")


def test_dockerfile_healthcheck_asks_healthz_on_the_default_admin_port() -> None:
    check = _only("HEALTHCHECK").args
    assert " CMD " in f" {check}", f"Dockerfile HEALTHCHECK has no CMD: {check!r}"
    port, path = _url_port_and_path(check, "Dockerfile HEALTHCHECK")
    assert (port, path) == (AdminConfig().address.port, "/healthz"), (
        f"Dockerfile HEALTHCHECK asks :{port}{path}, expected "
        f":{AdminConfig().address.port}/healthz")
    assert _only("STOPSIGNAL").args == "SIGTERM", "the relay drains on SIGTERM"


def test_dockerfile_default_config_validates_and_serves_copied_resources() -> None:
    copies = _image_copies()
    image_path = _image_config_path()
    assert image_path in copies, (
        f"Dockerfile copies no config to {image_path}, the path its CMD runs with "
        f"(COPY targets: {sorted(copies)})")
    source = REPO / copies[image_path]
    config = _relay_config(source.read_text(), _relative(source))
    _binds_all_interfaces(config, _relative(source))
    exposed = {int(port) for port in _only("EXPOSE").args.split()}
    listened = {config.server.address.port, config.admin.address.port}
    assert listened == exposed, (
        f"{_relative(source)} listens on {sorted(listened)}, Dockerfile EXPOSE {sorted(exposed)}")
    assert config.upstream.files is not None, f"{_relative(source)}: expected upstream.files"
    relative = config.upstream.files.relative_to(REPO)
    workdir = [ins.args for ins in _final_stage() if ins.keyword == "WORKDIR"][-1]
    in_image = str(PurePosixPath(workdir) / relative)
    filled = [target for target, src in copies.items()
              if (relative.as_posix() + "/").startswith(src.rstrip("/") + "/")
              and in_image == target + relative.as_posix()[len(src.rstrip("/")):]]
    assert filled, (
        f"upstream.files {relative} resolves to {in_image} in the image, which no COPY fills "
        f"from {relative} (COPY: {copies})")


def _ignored(path: str, patterns: list[str]) -> bool:
    excluded = False
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        bare = pattern.lstrip("!").strip("/")
        matched = any(fnmatch.fnmatch(prefix, bare) or fnmatch.fnmatch(prefix, f"**/{bare}")
                      for prefix in prefixes)
        if matched:
            excluded = not negate
    return excluded


def test_dockerignore_keeps_everything_the_dockerfile_copies() -> None:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copied = [src for ins in _instructions() if ins.keyword == "COPY"
              and "--from=" not in ins.args for src in shlex.split(ins.args)[:-1]]
    assert copied, "Dockerfile copies nothing from the build context"
    for source in copied:
        assert (REPO / source).exists(), f"Dockerfile COPY {source}: not in the repository"
        assert not _ignored(source.rstrip("/"), patterns), (
            f"Dockerfile COPY {source} is excluded by .dockerignore")
    for heavy in (".venv", ".git", "tests"):
        assert _ignored(heavy, patterns), f".dockerignore should exclude {heavy}"


# --------------------------------------------------------------------------- compose


@functools.cache
def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and "services" in data, "docker-compose.yml: no services"
    return data["services"]


def _service(name: str) -> dict[str, Any]:
    services = _compose()
    assert name in services, f"docker-compose.yml: no service {name!r} ({sorted(services)})"
    return services[name]


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool


def _parse_mount(volume: object, where: str) -> Mount:
    assert isinstance(volume, str), f"{where}: use the short volume syntax SRC:DST[:ro]"
    source, target, *mode = volume.split(":")
    return Mount(source, target, mode == ["ro"])


def _service_mounts(service: dict[str, Any], where: str) -> list[Mount]:
    return [_parse_mount(volume, where) for volume in service.get("volumes", [])]


def _mounts(name: str) -> list[Mount]:
    return _service_mounts(_service(name), name)


def _mount_at(name: str, target: str) -> Mount:
    found = [m for m in _mounts(name) if m.target == target]
    assert len(found) == 1, f"docker-compose.yml {name}: nothing mounted at {target}"
    return found[0]


def _relay_services() -> list[str]:
    return [name for name, svc in _compose().items()
            if "build" in svc or str(svc.get("image", "")).startswith("xds-relay")]


@functools.cache
def _compose_relay_config(name: str) -> tuple[RelayConfig, Path]:
    command = _service(name).get("command") or _only("CMD").exec_form()
    mount = _mount_at(name, _config_flag(command, f"docker-compose.yml {name}"))
    path = (REPO / mount.source).resolve()
    assert path.is_file(), f"docker-compose.yml {name}: mounted config {mount.source} is missing"
    return _relay_config(path.read_text(), _relative(path)), path


@functools.cache
def _envoy_bootstrap(name: str) -> tuple[dict[str, Any], Path]:
    command = _service(name)["command"]
    assert "-c" in command, f"docker-compose.yml {name}: no -c BOOTSTRAP in {command}"
    mount = _mount_at(name, command[command.index("-c") + 1])
    path = (REPO / mount.source).resolve()
    assert path.is_file(), f"docker-compose.yml {name}: bootstrap {mount.source} is missing"
    return yaml.safe_load(path.read_text()), path


@dataclass(frozen=True)
class Published:
    host_ip: str
    host_port: int
    container_port: int


def _published(name: str) -> list[Published]:
    ports = []
    for entry in _service(name).get("ports", []):
        parts = str(entry).split("/")[0].split(":")
        assert len(parts) in (2, 3), f"{name}: port {entry!r} should be [IP:]HOST:CONTAINER"
        host_ip = parts[0] if len(parts) == 3 else "0.0.0.0"
        ports.append(Published(host_ip, int(parts[-2]), int(parts[-1])))
    return ports


def _depends_healthy(name: str, on: str) -> None:
    depends = _service(name).get("depends_on", {})
    assert isinstance(depends, dict) and on in depends, (
        f"docker-compose.yml {name}: should depend on {on} (depends_on: {depends})")
    assert depends[on].get("condition") == "service_healthy", (
        f"docker-compose.yml {name}: depends_on {on} should wait for service_healthy")
    assert "healthcheck" in _service(on), f"docker-compose.yml {on}: no healthcheck to wait for"


def _static_cluster(bootstrap: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    clusters = {c["name"]: c for c in bootstrap.get("static_resources", {}).get("clusters", [])}
    assert name in clusters, f"{where}: ADS names cluster {name!r}, static: {sorted(clusters)}"
    return clusters[name]


def _ads_cluster_name(bootstrap: dict[str, Any], where: str) -> str:
    services = bootstrap["dynamic_resources"]["ads_config"]["grpc_services"]
    assert len(services) == 1, f"{where}: expected one ADS gRPC service, got {services}"
    return str(services[0]["envoy_grpc"]["cluster_name"])


def _cluster_addresses(cluster: dict[str, Any]) -> list[tuple[str, int]]:
    return [(e["endpoint"]["address"]["socket_address"]["address"],
             e["endpoint"]["address"]["socket_address"]["port_value"])
            for group in cluster["load_assignment"]["endpoints"]
            for e in group["lb_endpoints"]]


@functools.cache
def _sample_resources() -> list[dict[str, Any]]:
    resources: list[dict[str, Any]] = []
    for path in sorted(RESOURCES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            resources += doc.get("resources", [doc])
    return resources


def test_compose_has_an_origin_two_zone_relays_and_their_envoys() -> None:
    expected = {"origin", *ZONE_RELAYS, *ENVOYS, REDIS}
    assert set(_compose()) == expected, f"docker-compose.yml services: {sorted(_compose())}"
    assert sorted(_relay_services()) == sorted(["origin", *ZONE_RELAYS])


@pytest.mark.parametrize("name", ["origin", *ZONE_RELAYS])
def test_compose_relay_config_is_mounted_read_only_validates_and_binds_all(name: str) -> None:
    config, path = _compose_relay_config(name)
    _binds_all_interfaces(config, _relative(path))
    for mount in _mounts(name):
        assert mount.read_only, f"docker-compose.yml {name}: mount {mount.source} should be :ro"


def test_compose_origin_serves_the_mounted_sample_resources() -> None:
    config, path = _compose_relay_config("origin")
    assert config.upstream.files == RESOURCES, (
        f"{_relative(path)}: upstream.files is {config.upstream.files}, expected config/resources")
    workdir = [ins.args for ins in _final_stage() if ins.keyword == "WORKDIR"][-1]
    target = str(PurePosixPath(workdir) / "config" / "resources")
    mount = _mount_at("origin", target)
    assert (REPO / mount.source).resolve() == RESOURCES, (
        f"docker-compose.yml origin: {target} mounts {mount.source}, not config/resources")


@pytest.mark.parametrize("name", ZONE_RELAYS)
def test_compose_zone_relay_follows_the_origin_service(name: str) -> None:
    config, path = _compose_relay_config(name)
    upstream = config.upstream.address
    assert upstream is not None, f"{_relative(path)}: expected upstream.address"
    assert upstream.host == "origin", (
        f"{_relative(path)}: upstream.address {upstream} should name the compose service origin")
    origin, origin_path = _compose_relay_config("origin")
    assert upstream.port == origin.server.address.port, (
        f"{_relative(path)}: upstream port {upstream.port} != {_relative(origin_path)} "
        f"server.address port {origin.server.address.port}")
    _depends_healthy(name, "origin")


def test_compose_redis_is_the_official_image_with_a_ping_healthcheck() -> None:
    redis = _service(REDIS)
    assert str(redis.get("image", "")).startswith("redis:"), (
        f"docker-compose.yml {REDIS}: expected the official redis image, got {redis.get('image')}")
    test = redis.get("healthcheck", {}).get("test", [])
    assert "redis-cli" in test and "ping" in test, (
        f"docker-compose.yml {REDIS}: the healthcheck should run redis-cli ping, got {test}")


def _compose_redis_args() -> list[str]:
    command = _service(REDIS).get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


@pytest.mark.parametrize("name", ZONE_RELAYS)
def test_compose_zone_relay_keeps_its_snapshot_in_the_redis_service(name: str) -> None:
    config, path = _compose_relay_config(name)
    where = _relative(path)
    host, port = _redis_target(config, where)
    assert host == REDIS, (
        f"{where}: persistence.redis.url names host {host!r}, not the compose service {REDIS}")
    assert port == _redis_port(_compose_redis_args()), (
        f"{where}: persistence.redis.url port {port} != the port docker-compose.yml {REDIS} "
        f"listens on ({_redis_port(_compose_redis_args())})")
    assert config.persistence is not None and config.persistence.redis is not None
    redis = config.persistence.redis
    has_password = redis.password_file is not None or urlsplit(redis.url).password is not None
    needs_password = "--requirepass" in _compose_redis_args()
    assert has_password == needs_password, (
        f"{where}: {'a' if has_password else 'no'} Redis password, but docker-compose.yml "
        f"{REDIS} {'requires' if needs_password else 'does not require'} one")
    _depends_healthy(name, REDIS)


def test_compose_zones_keep_their_snapshots_apart() -> None:
    prefixes: dict[str, str] = {}
    for name in ZONE_RELAYS:
        config, path = _compose_relay_config(name)
        prefix = _zone_key_prefix(config, _relative(path))
        assert prefix not in prefixes, (
            f"{name} and {prefixes[prefix]} share the key prefix {prefix!r} in one Redis: "
            f"each zone needs its own")
        prefixes[prefix] = name


@pytest.mark.parametrize(("envoy", "relay"), ENVOYS.items())
def test_compose_envoy_connects_to_its_zone_relay(envoy: str, relay: str) -> None:
    bootstrap, path = _envoy_bootstrap(envoy)
    where = _relative(path)
    cluster = _static_cluster(bootstrap, _ads_cluster_name(bootstrap, where), where)
    config, relay_path = _compose_relay_config(relay)
    expected = (relay, config.server.address.port)
    assert _cluster_addresses(cluster) == [expected], (
        f"{where}: xDS cluster points at {_cluster_addresses(cluster)}, expected {expected} "
        f"(service {relay}, server.address of {_relative(relay_path)})")
    locality = bootstrap["node"]["locality"]
    relay_locality = {"region": config.node.locality.region, "zone": config.node.locality.zone}
    assert locality == relay_locality, (
        f"{where}: node.locality {locality} != {_relative(relay_path)} locality {relay_locality}")
    _depends_healthy(envoy, relay)


@pytest.mark.parametrize("envoy", ENVOYS)
def test_envoy_bootstrap_uses_delta_ads_v3_over_a_static_http2_cluster(envoy: str) -> None:
    bootstrap, path = _envoy_bootstrap(envoy)
    where = _relative(path)
    # Field names, enum values and the typed options must be a valid Bootstrap.
    json_format.ParseDict(bootstrap, bootstrap_pb2.Bootstrap())
    dynamic = bootstrap["dynamic_resources"]
    ads = dynamic["ads_config"]
    assert (ads["api_type"], ads["transport_api_version"]) == ("DELTA_GRPC", "V3"), (
        f"{where}: ads_config should be DELTA_GRPC over V3, got {ads}")
    for kind in ("cds_config", "lds_config"):
        assert dynamic.get(kind) == {"ads": {}, "resource_api_version": "V3"}, (
            f"{where}: {kind} should come over ADS, V3: {dynamic.get(kind)}")
    cluster = _static_cluster(bootstrap, _ads_cluster_name(bootstrap, where), where)
    options = cluster.get("typed_extension_protocol_options", {}).get(HTTP_OPTIONS, {})
    http2 = "http2_protocol_options" in cluster or "http2_protocol_options" in options.get(
        "explicit_http_config", {})
    assert http2, f"{where}: xDS cluster {cluster['name']} needs HTTP/2 for gRPC"
    assert bootstrap["node"]["id"] == envoy, f"{where}: node.id should be {envoy}"


def test_envoy_subscriptions_find_what_the_sample_resources_hold() -> None:
    # Envoy's only xDS source is ADS: resources that point elsewhere would never resolve.
    resources = _sample_resources()
    listeners = [r for r in resources if r["@type"] == LISTENER_TYPE]
    clusters = [r for r in resources if r["@type"] == CLUSTER_TYPE]
    assert listeners and clusters, "config/resources should hold a listener and a cluster"
    for cluster in clusters:
        if cluster.get("type") == "EDS":
            source = cluster["eds_cluster_config"]["eds_config"]
            assert "ads" in source, f"cluster {cluster['name']}: EDS not over ADS: {source}"
    for listener in listeners:
        for chain in listener["filter_chains"]:
            for filt in chain["filters"]:
                rds = filt.get("typed_config", {}).get("rds")
                if rds is not None:
                    assert "ads" in rds["config_source"], (
                        f"listener {listener['name']}: RDS not over ADS: {rds}")


@pytest.mark.parametrize("envoy", ENVOYS)
def test_compose_envoy_publishes_its_admin_and_a_sample_listener(envoy: str) -> None:
    bootstrap, path = _envoy_bootstrap(envoy)
    admin_port = bootstrap["admin"]["address"]["socket_address"]["port_value"]
    assert admin_port == 9901, f"{_relative(path)}: Envoy admin on {admin_port}, expected 9901"
    listener_ports = {r["address"]["socket_address"]["port_value"]
                      for r in _sample_resources() if r["@type"] == LISTENER_TYPE}
    published = {p.container_port for p in _published(envoy)}
    assert published == {admin_port} | listener_ports, (
        f"docker-compose.yml {envoy} publishes container ports {sorted(published)}; Envoy "
        f"listens on admin {admin_port} and sample listeners {sorted(listener_ports)}")


@pytest.mark.parametrize("name", ["origin", *ZONE_RELAYS])
def test_compose_relay_publishes_and_probes_its_configured_ports(name: str) -> None:
    config, path = _compose_relay_config(name)
    listened = {config.server.address.port, config.admin.address.port}
    published = {p.container_port for p in _published(name)}
    assert published == listened, (
        f"docker-compose.yml {name} publishes container ports {sorted(published)}, "
        f"{_relative(path)} listens on {sorted(listened)}")
    test = _service(name)["healthcheck"]["test"]
    port, probe = _url_port_and_path(" ".join(test), f"docker-compose.yml {name} healthcheck")
    assert port == config.admin.address.port, (
        f"docker-compose.yml {name} healthcheck asks port {port}, {_relative(path)} admin is on "
        f"{config.admin.address.port}")
    assert probe in ("/ready", "/healthz"), f"{name} healthcheck asks {probe}"


def test_compose_published_host_ports_do_not_collide() -> None:
    seen: dict[int, str] = {}
    for name in _compose():
        for port in _published(name):
            assert port.host_port not in seen, (
                f"docker-compose.yml: host port {port.host_port} published by both "
                f"{seen[port.host_port]} and {name}")
            seen[port.host_port] = name


@pytest.mark.parametrize("name", ["origin", *ZONE_RELAYS])
def test_compose_stop_grace_period_outlasts_the_drain(name: str) -> None:
    config, path = _compose_relay_config(name)
    grace = _service(name).get("stop_grace_period")
    assert grace is not None, f"docker-compose.yml {name}: no stop_grace_period (default 10s)"
    assert parse_duration(grace) > config.server.drain_period, (
        f"docker-compose.yml {name}: stop_grace_period {grace} should exceed "
        f"{_relative(path)} server.drain_period {config.server.drain_period:g}s")


# --------------------------------------------------------------------------- compose over TLS
#
# docker-compose.tls.yml overrides docker-compose.yml: `docker compose -f docker-compose.yml
# -f docker-compose.tls.yml up`. The stack is merged here as compose merges it, the demo
# certificates made by the script the `certs` service runs, and each TLS hop checked with
# them: the files mounted, the configs valid, a handshake, the authorization.

COMPOSE_LIST_KEYS = ("ports", "expose", "dns", "dns_search", "tmpfs", "external_links")
COMPOSE_MAPPING_KEYS = ("depends_on", "environment", "labels")


@functools.cache
def _compose_tls_file() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_TLS.read_text())
    assert isinstance(data, dict) and "services" in data, "docker-compose.tls.yml: no services"
    return data


def _merge_service(base: dict[str, Any], override: dict[str, Any], where: str
                   ) -> dict[str, Any]:
    """One service of docker-compose.yml with its docker-compose.tls.yml entry applied:
    volumes merged by container path, mappings by key, ports and the like appended,
    anything else replaced."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if key == "volumes":
            by_target = {_parse_mount(v, where).target: v for v in base.get("volumes", [])}
            by_target |= {_parse_mount(v, where).target: v for v in value}
            merged[key] = list(by_target.values())
        elif key in COMPOSE_MAPPING_KEYS:
            assert isinstance(value, dict) and isinstance(base.get(key, {}), dict), (
                f"{where}: use the mapping form of {key} in both compose files")
            merged[key] = {**base.get(key, {}), **value}
        elif key in COMPOSE_LIST_KEYS:
            merged[key] = [*base.get(key, []), *value]
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@functools.cache
def _tls_stack() -> dict[str, dict[str, Any]]:
    override = _compose_tls_file()["services"]
    return {name: _merge_service(_compose().get(name, {}), override.get(name, {}),
                                 f"docker-compose.tls.yml {name}")
            for name in [*_compose(), *(n for n in override if n not in _compose())]}


def _tls_mount_at(name: str, target: str) -> Mount:
    found = [m for m in _service_mounts(_tls_stack()[name], name) if m.target == target]
    assert len(found) == 1, f"docker-compose.tls.yml {name}: nothing mounted at {target}"
    return found[0]


def _certs_out() -> str:
    """Where the certs service writes: its script's --out."""
    certs = _tls_stack()[CERTS]
    command = [str(a) for a in certs.get("command", [])]
    assert "--out" in command, f"docker-compose.tls.yml {CERTS}: no --out in {command}"
    return command[command.index("--out") + 1]


def _cert_volume() -> str:
    """The named volume the certs service fills and the others mount."""
    mount = _tls_mount_at(CERTS, _certs_out())
    volumes = _compose_tls_file().get("volumes") or {}
    assert mount.source in volumes, (
        f"docker-compose.tls.yml: {CERTS} writes into {mount.source}, which is not a named "
        f"volume of its top-level volumes ({sorted(volumes)})")
    return mount.source


def _cert_mount(name: str) -> Mount:
    found = [m for m in _service_mounts(_tls_stack()[name], name) if m.source == _cert_volume()]
    assert len(found) == 1, (
        f"docker-compose.tls.yml {name}: should mount volume {_cert_volume()} once, got {found}")
    return found[0]


def _tls_clients_and_servers() -> list[str]:
    """The services that hold a demo certificate: every relay and Envoy."""
    return [name for name in _tls_stack() if name not in (CERTS, REDIS)]


@functools.cache
def _demo_certs() -> Path:
    """The demo certificates, made by deploy/compose/demo_certs.py as the certs service does."""
    directory = Path(tempfile.mkdtemp(prefix="demo-certs-"))
    atexit.register(shutil.rmtree, directory, True)
    _run_demo_certs(directory / "certs")
    return directory / "certs"


def _run_demo_certs(out: Path, *args: str) -> None:
    # --owner would need root; the rest of the certs service's command, as it runs it.
    result = subprocess.run([sys.executable, str(DEMO_CERTS), "--out", str(out), *args],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, (
        f"{_relative(DEMO_CERTS)} --out {out} {' '.join(args)} failed: {result.stderr}")


def _tls_files(raw: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Every `*_file` of a tls section in a relay config, by dotted key."""
    files: dict[str, str] = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            files |= _tls_files(value, f"{dotted}.")
        elif key.endswith("_file") and ".tls." in f".{dotted}":
            files[dotted] = str(value)
    return files


@functools.cache
def _tls_relay_config(name: str) -> tuple[RelayConfig, dict[str, Any], Path]:
    """A relay of the TLS stack: its config validated against the demo certificates,
    its YAML as written, and the file."""
    service = _tls_stack()[name]
    command = service.get("command") or _only("CMD").exec_form()
    mount = _tls_mount_at(name, _config_flag(command, f"docker-compose.tls.yml {name}"))
    path = (REPO / mount.source).resolve()
    assert path.is_file(), (
        f"docker-compose.tls.yml {name}: mounted config {mount.source} is missing")
    text = path.read_text()
    raw = yaml.safe_load(text)
    target = _cert_mount(name).target
    for key, file in _tls_files(raw).items():
        assert PurePosixPath(file).parent == PurePosixPath(target), (
            f"{_relative(path)}: {key} {file} is not in {target}, where docker-compose.tls.yml "
            f"mounts the demo certificates (volume {_cert_volume()}) for {name}")
        assert (_demo_certs() / PurePosixPath(file).name).is_file(), (
            f"{_relative(path)}: {key} {file}: {_relative(DEMO_CERTS)} writes no "
            f"{PurePosixPath(file).name}")
    # The schema reads the files and checks each key against its certificate.
    text = text.replace(f"{target.rstrip('/')}/", f"{_demo_certs()}/")
    return _relay_config(text, _relative(path)), raw, path


@functools.cache
def _tls_envoy_bootstrap(name: str) -> tuple[dict[str, Any], Path]:
    command = _tls_stack()[name]["command"]
    mount = _tls_mount_at(name, command[command.index("-c") + 1])
    path = (REPO / mount.source).resolve()
    assert path.is_file(), f"docker-compose.tls.yml {name}: bootstrap {mount.source} is missing"
    return yaml.safe_load(path.read_text()), path


def _envoy_tls_context(bootstrap: dict[str, Any], where: str) -> dict[str, Any]:
    cluster = _static_cluster(bootstrap, _ads_cluster_name(bootstrap, where), where)
    socket = cluster.get("transport_socket", {})
    config: dict[str, Any] = socket.get("typed_config", {})
    assert config.get("@type") == UPSTREAM_TLS_TYPE, (
        f"{where}: xDS cluster {cluster['name']} needs a transport_socket with an "
        f"UpstreamTlsContext, got {socket}")
    return config


def _envoy_tls_files(context: dict[str, Any], where: str) -> dict[str, str]:
    common = context["common_tls_context"]
    [pair] = common.get("tls_certificates", [{}])
    files = {"certificate_chain": pair.get("certificate_chain", {}).get("filename"),
             "private_key": pair.get("private_key", {}).get("filename"),
             "trusted_ca": common.get("validation_context", {}).get("trusted_ca", {})
             .get("filename")}
    missing = [key for key, file in files.items() if not file]
    assert not missing, f"{where}: the TLS context sets no filename for {missing}"
    return {key: str(file) for key, file in files.items()}


def _peer_identity(cert_file: Path) -> PeerIdentity:
    """What gRPC reads from a client certificate: its SPIFFE ID (the one URI SAN) and DNS SANs."""
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return PeerIdentity()
    uris = names.get_values_for_type(x509.UniformResourceIdentifier)
    spiffe = uris[0] if len(uris) == 1 and uris[0].startswith("spiffe://") else None
    return PeerIdentity(spiffe, tuple(names.get_values_for_type(x509.DNSName)))


def _handshake(*, cert: Path, key: Path, client_ca: Path | None, trusted_ca: Path,
               client_cert: Path, client_key: Path, server_name: str) -> None:
    """A TLS handshake in memory between a server with these files (mutual when it has a
    client CA) and a client that checks it against ``trusted_ca`` and ``server_name``."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    if client_ca is not None:
        server.load_verify_locations(client_ca)
        server.verify_mode = ssl.CERT_REQUIRED
    server.set_alpn_protocols(["h2"])
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # checks the chain and the name
    client.load_verify_locations(trusted_ca)
    client.load_cert_chain(client_cert, client_key)
    client.set_alpn_protocols(["h2"])
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_client = client.wrap_bio(to_client, to_server, server_hostname=server_name)
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls_server = server.wrap_bio(server_in, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for side, end in (("client", tls_client), ("server", tls_server)):
            if not done[side]:
                with contextlib.suppress(ssl.SSLWantReadError):
                    end.do_handshake()
                    done[side] = True
        server_in.write(to_server.read())
        to_client.write(server_out.read())
        if all(done.values()):
            break
    assert all(done.values()), f"the handshake did not finish: {done}"
    assert tls_client.selected_alpn_protocol() == "h2", "gRPC needs ALPN h2"


def test_compose_tls_override_adds_the_certs_service_and_changes_only_files() -> None:
    override = _compose_tls_file()["services"]
    assert set(override) - set(_compose()) == {CERTS}, (
        f"docker-compose.tls.yml adds {sorted(set(override) - set(_compose()))}; expected "
        f"only {CERTS}")
    for name, entry in override.items():
        if name == CERTS:
            continue
        # Ports, healthchecks and grace periods stay docker-compose.yml's, which the tests
        # above check; the Envoys run as the user the demo certificates belong to.
        allowed = {"volumes", "depends_on"} | ({"user"} if name in ENVOYS else set())
        assert set(entry) <= allowed, (
            f"docker-compose.tls.yml {name} overrides {sorted(set(entry) - allowed)}; keep "
            f"to {sorted(allowed)}")
    assert set(_tls_clients_and_servers()) == {"origin", *ZONE_RELAYS, *ENVOYS}


def test_compose_tls_certs_service_runs_the_demo_script_in_the_relay_image() -> None:
    certs = _tls_stack()[CERTS]
    relay = _service("origin")
    assert (certs.get("image"), certs.get("build")) == (relay["image"], relay["build"]), (
        f"docker-compose.tls.yml {CERTS}: should run the relay image (it has cryptography): "
        f"image {relay['image']}, build {relay['build']}")
    entrypoint = [str(a) for a in certs.get("entrypoint", [])]
    assert entrypoint[:1] == ["python"] and len(entrypoint) == 2, (
        f"docker-compose.tls.yml {CERTS}: entrypoint should be python SCRIPT, got {entrypoint}")
    script = _tls_mount_at(CERTS, entrypoint[1])
    assert (REPO / script.source).resolve() == DEMO_CERTS and script.read_only, (
        f"docker-compose.tls.yml {CERTS}: {entrypoint[1]} should be {_relative(DEMO_CERTS)} "
        f"mounted read-only, got {script}")
    assert not _tls_mount_at(CERTS, _certs_out()).read_only, (
        f"docker-compose.tls.yml {CERTS}: it writes {_certs_out()}, mounted read-only")
    command = [str(a) for a in certs["command"]]
    assert "--owner" in command, f"docker-compose.tls.yml {CERTS}: no --owner in {command}"
    owner = command[command.index("--owner") + 1]
    image_user = _image_user()
    assert owner.split(":")[0] == image_user, (
        f"docker-compose.tls.yml {CERTS}: --owner {owner}, but the relays run as the "
        f"Dockerfile's USER {image_user}: they could not read their keys (0400)")
    assert str(certs.get("user", "")).split(":")[0] == "0", (
        f"docker-compose.tls.yml {CERTS}: --owner needs root (user: \"0:0\")")
    for envoy in ENVOYS:
        assert str(_tls_stack()[envoy].get("user")) == owner, (
            f"docker-compose.tls.yml {envoy}: user {_tls_stack()[envoy].get('user')}, but its "
            f"key belongs to {owner} (mode 0400)")


@pytest.mark.parametrize("name", ["origin", *ZONE_RELAYS, *ENVOYS])
def test_compose_tls_service_waits_for_the_certs_and_mounts_them_read_only(name: str) -> None:
    depends = _tls_stack()[name].get("depends_on", {})
    assert depends.get(CERTS, {}).get("condition") == "service_completed_successfully", (
        f"docker-compose.tls.yml {name}: should depend on {CERTS} with condition "
        f"service_completed_successfully (depends_on: {depends})")
    for mount in _service_mounts(_tls_stack()[name], name):
        assert mount.read_only, f"docker-compose.tls.yml {name}: mount {mount.source} should be :ro"
    _cert_mount(name)


@pytest.mark.parametrize("name", ["origin", *ZONE_RELAYS])
def test_compose_tls_relay_config_validates_and_serves_mutual_tls(name: str) -> None:
    config, _raw, path = _tls_relay_config(name)
    where = _relative(path)
    tls = config.server.tls
    assert tls is not None and tls.client_ca_file is not None, (
        f"{where}: expected server.tls with client_ca_file (mutual TLS)")
    assert config.server.authorization.allow, f"{where}: expected server.authorization.allow"
    if config.upstream.address is not None:
        assert config.upstream.tls is not None and config.upstream.tls.cert_file is not None, (
            f"{where}: the origin serves mutual TLS; expected upstream.tls with cert_file")


@pytest.mark.parametrize("name", ["origin", *ZONE_RELAYS])
def test_compose_tls_relay_config_is_the_plain_one_plus_tls(name: str) -> None:
    _config, raw, path = _tls_relay_config(name)
    _plain, plain_path = _compose_relay_config(name)
    stripped = copy.deepcopy(raw)
    for section, key in (("server", "tls"), ("server", "authorization"), ("upstream", "tls")):
        stripped.get(section, {}).pop(key, None)
    assert stripped == yaml.safe_load(plain_path.read_text()), (
        f"{_relative(path)} should be {_relative(plain_path)} plus server.tls, "
        f"server.authorization and upstream.tls; it differs in more")


@pytest.mark.parametrize("envoy", ENVOYS)
def test_compose_tls_envoy_bootstrap_is_the_plain_one_plus_a_tls_socket(envoy: str) -> None:
    bootstrap, path = _tls_envoy_bootstrap(envoy)
    where = _relative(path)
    json_format.ParseDict(bootstrap, bootstrap_pb2.Bootstrap())
    stripped = copy.deepcopy(bootstrap)
    cluster = _static_cluster(stripped, _ads_cluster_name(stripped, where), where)
    cluster.pop("transport_socket", None)
    plain, plain_path = _envoy_bootstrap(envoy)
    assert stripped == plain, (
        f"{where} should be {_relative(plain_path)} plus the xDS cluster's transport_socket; "
        f"it differs in more")
    target = PurePosixPath(_cert_mount(envoy).target)
    for key, file in _envoy_tls_files(_envoy_tls_context(bootstrap, where), where).items():
        assert PurePosixPath(file).parent == target, (
            f"{where}: {key} {file} is not in {target}, where docker-compose.tls.yml mounts "
            f"the demo certificates for {envoy}")
        assert (_demo_certs() / PurePosixPath(file).name).is_file(), (
            f"{where}: {key} {file}: {_relative(DEMO_CERTS)} writes no {PurePosixPath(file).name}")


@pytest.mark.parametrize(("client", "server"), TLS_HOPS.items())
def test_compose_tls_hop_shakes_hands_and_is_authorized(client: str, server: str) -> None:
    """The client's files (its Envoy bootstrap or upstream.tls) against the server's
    server.tls: a handshake with the demo certificates, then server.authorization."""
    server_config, _raw, server_path = _tls_relay_config(server)
    tls = server_config.server.tls
    assert tls is not None
    if client in ENVOYS:
        bootstrap, path = _tls_envoy_bootstrap(client)
        where = _relative(path)
        context = _envoy_tls_context(bootstrap, where)
        files = {key: _demo_certs() / PurePosixPath(file).name
                 for key, file in _envoy_tls_files(context, where).items()}
        cert, key, trusted_ca = (files["certificate_chain"], files["private_key"],
                                 files["trusted_ca"])
        matchers = context["common_tls_context"]["validation_context"].get(
            "match_typed_subject_alt_names", [])
        # Envoy checks no name unless told: the SNI alone would let any demo certificate pass.
        assert [(m["san_type"], m["matcher"]) for m in matchers] == [("DNS", {"exact": server})], (
            f"{where}: match_typed_subject_alt_names should be the DNS name {server}: {matchers}")
        server_name = server
        assert context.get("sni") == server, f"{where}: sni should be {server}"
        node_id = bootstrap["node"]["id"]
    else:
        config, _raw, path = _tls_relay_config(client)
        where = _relative(path)
        upstream = config.upstream
        assert upstream.tls is not None and upstream.address is not None
        assert upstream.tls.cert_file and upstream.tls.key_file and upstream.tls.ca_file, (
            f"{where}: upstream.tls needs ca_file, cert_file and key_file (mutual TLS)")
        cert, key, trusted_ca = upstream.tls.cert_file, upstream.tls.key_file, upstream.tls.ca_file
        server_name = upstream.tls.server_name or upstream.address.host
        node_id = config.node.id
    load_key_pair(cert, key)
    _handshake(cert=tls.cert_file, key=tls.key_file, client_ca=tls.client_ca_file,
               trusted_ca=trusted_ca, client_cert=cert, client_key=key, server_name=server_name)
    rules = server_config.server.authorization
    authorizer = Authorizer(rules.allow, rules.node_binding, rules.debug, rules.debug_loopback)
    identity = _peer_identity(cert)
    refused = authorizer.connect_error(identity) or authorizer.node_error(
        identity, base_pb2.Node(id=node_id))
    assert refused is None, f"{_relative(server_path)} refuses {client} ({where}): {refused}"
    # The allow list narrows: some certificate of the same demo CA is refused.
    others = [_peer_identity(path) for path in sorted(_demo_certs().glob("*.crt"))]
    assert any(authorizer.connect_error(other) for other in others), (
        f"{_relative(server_path)}: server.authorization.allow lets in every demo certificate")


def test_demo_certs_script_writes_a_matching_set(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    _run_demo_certs(out)
    names = _tls_clients_and_servers()
    expected = {"ca.crt", *(f"{name}.{ext}" for name in names for ext in ("crt", "key"))}
    written = {p.name for p in out.iterdir()}
    assert written == expected, (
        f"{_relative(DEMO_CERTS)} wrote {sorted(written)}; the TLS stack's services "
        f"{sorted(names)} each need NAME.crt and NAME.key, and ca.crt")
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    for name in names:
        cert_file, key_file = out / f"{name}.crt", out / f"{name}.key"
        load_key_pair(cert_file, key_file, out / "ca.crt")  # the key is the certificate's
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        cert.verify_directly_issued_by(ca)
        identity = _peer_identity(cert_file)
        assert identity.dns_names == (name,), f"{name}.crt: DNS names {identity.dns_names}"
        assert identity.spiffe_id is not None, f"{name}.crt: no SPIFFE ID (one URI SAN)"
        assert key_file.stat().st_mode & 0o777 == 0o400, f"{name}.key should be 0400"
        assert cert_file.stat().st_mode & 0o777 == 0o644, f"{name}.crt should be 0644"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _run_demo_certs(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, (
        "a second run should keep a complete, unexpired set")
    _run_demo_certs(out, "--force")
    assert (out / "ca.crt").read_bytes() != before["ca.crt"], "--force should start over"
    assert {p.name for p in out.iterdir()} == expected, "--force left other files behind"


# --------------------------------------------------------------------------- Kubernetes


@functools.cache
def _manifest(filename: str, kind: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((KUBERNETES / filename).read_text()) if d]
    found = [d for d in docs if d.get("kind") == kind]
    assert len(found) == 1, f"deploy/kubernetes/{filename}: expected one {kind}, got {len(found)}"
    return found[0]


def _deployment() -> dict[str, Any]:
    return _manifest("relay-deployment.yaml", "Deployment")


def _deployment_container() -> dict[str, Any]:
    containers = _deployment()["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"relay-deployment.yaml: expected one container: {containers}"
    container: dict[str, Any] = containers[0]
    return container


def _pod_labels() -> dict[str, str]:
    labels: dict[str, str] = _deployment()["spec"]["template"]["metadata"]["labels"]
    return labels


def _container_port(name_or_number: str | int) -> int:
    ports = {p["name"]: p["containerPort"] for p in _deployment_container()["ports"]}
    if isinstance(name_or_number, int):
        assert name_or_number in ports.values(), (
            f"relay-deployment.yaml: port {name_or_number} not among container ports {ports}")
        return name_or_number
    assert name_or_number in ports, (
        f"relay-deployment.yaml: no container port named {name_or_number!r} ({ports})")
    return int(ports[name_or_number])


def _configmap_text() -> str:
    configmap = _manifest("relay-configmap.yaml", "ConfigMap")
    filename = PurePosixPath(_config_flag(_deployment_container()["args"], "Deployment")).name
    assert filename in configmap["data"], (
        f"relay-configmap.yaml: no key {filename!r} (keys: {sorted(configmap['data'])})")
    text: str = configmap["data"][filename]
    return text


def _redis_deployment() -> dict[str, Any]:
    return _manifest("redis.yaml", "Deployment")


def _redis_container() -> dict[str, Any]:
    containers = _redis_deployment()["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"redis.yaml: expected one container: {containers}"
    container: dict[str, Any] = containers[0]
    return container


def _redis_secret_key() -> tuple[str, str]:
    """The Secret of redis-secret.yaml and its one key: the Redis password."""
    secret = _manifest("redis-secret.yaml", "Secret")
    keys = {**secret.get("data", {}), **secret.get("stringData", {})}
    assert len(keys) == 1, f"redis-secret.yaml: expected one key, the password, got {sorted(keys)}"
    return secret["metadata"]["name"], next(iter(keys))


def _kubernetes_namespace() -> str:
    namespace: str = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["namespace"]
    return namespace


def _certificate() -> dict[str, Any]:
    certificate = _manifest("relay-certificate.yaml", "Certificate")
    assert certificate["apiVersion"] == "cert-manager.io/v1", (
        f"relay-certificate.yaml: apiVersion {certificate['apiVersion']}, expected "
        f"cert-manager.io/v1")
    return certificate


@functools.cache
def _configmap_files() -> dict[str, str]:
    """The files the ConfigMap's config reads, by config key, as the pod sees them."""
    raw = yaml.safe_load(_configmap_text())
    upstream = raw["upstream"]
    files = {f"upstream.tls.{key}": path for key, path in (upstream.get("tls") or {}).items()
             if key.endswith("_file")}
    for section in ("server", "admin"):
        files |= {f"{section}.tls.{key}": path
                  for key, path in ((raw.get(section) or {}).get("tls") or {}).items()
                  if key.endswith("_file")}
    if "token_file" in (raw.get("admin") or {}):
        files["admin.token_file"] = raw["admin"]["token_file"]
    if "token_file" in upstream:
        files["upstream.token_file"] = upstream["token_file"]
    redis = (yaml.safe_load(_configmap_text()).get("persistence") or {}).get("redis") or {}
    if "password_file" in redis:
        files["persistence.redis.password_file"] = redis["password_file"]
    return files


@functools.cache
def _configmap_config() -> RelayConfig:
    # The schema reads the files the config names; they live in volumes the
    # kubelet mounts. Stand-ins of the same kinds let the config validate here;
    # test_kubernetes_files_the_relay_reads_are_mounted_from_their_sources
    # checks the real paths against the mounts.
    directory = Path(tempfile.mkdtemp(prefix="k8s-files-"))
    atexit.register(shutil.rmtree, directory, True)
    ca = trustme.CA()
    client = ca.issue_cert("xds-relay.xds-relay.svc")
    stand_ins = {"ca_file": ca.cert_pem.bytes(), "client_ca_file": ca.cert_pem.bytes(),
                 "cert_file": client.cert_chain_pems[0].bytes(),
                 "key_file": client.private_key_pem.bytes(), "token_file": b"a.jwt.token\n",
                 "password_file": b"a-redis-password\n"}
    text = _configmap_text()
    for key, path in _configmap_files().items():
        stand_in = directory / key
        stand_in.write_bytes(stand_ins[key.rsplit(".", 1)[-1]])
        text = text.replace(path, str(stand_in))
    return _relay_config(text, "deploy/kubernetes/relay-configmap.yaml:data.relay.yaml")


def test_kubernetes_configmap_config_validates_and_follows_an_origin() -> None:
    config = _configmap_config()
    _binds_all_interfaces(config, "relay-configmap.yaml")
    assert config.upstream.address is not None, "the Kubernetes relay should follow an origin"


def test_kubernetes_configmap_is_mounted_where_the_container_reads_it() -> None:
    container = _deployment_container()
    config_path = PurePosixPath(_config_flag(container["args"], "relay-deployment.yaml args"))
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert str(config_path.parent) in mounts, (
        f"relay-deployment.yaml: args read {config_path}, mounts are {sorted(mounts)}")
    mount = mounts[str(config_path.parent)]
    assert mount.get("readOnly") is True, "the config volume should be mounted readOnly"
    volumes = {v["name"]: v for v in _deployment()["spec"]["template"]["spec"]["volumes"]}
    volume = volumes[mount["name"]]
    configmap = _manifest("relay-configmap.yaml", "ConfigMap")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"], (
        f"volume {mount['name']} mounts ConfigMap {volume['configMap']['name']}, "
        f"relay-configmap.yaml defines {configmap['metadata']['name']}")
    items = volume["configMap"].get("items")
    files = {i["path"]: i["key"] for i in items} if items else {k: k for k in configmap["data"]}
    assert files.get(config_path.name) in configmap["data"], (
        f"volume {mount['name']} puts no ConfigMap key at {config_path.name} ({files})")


def test_kubernetes_each_replica_presents_its_own_istiod_node_id() -> None:
    container = _deployment_container()
    args = container["args"]
    assert "--node-id" in args, f"relay-deployment.yaml: no --node-id in {args}"
    value = args[args.index("--node-id") + 1]
    # istiod's form: TYPE~IP~POD.NAMESPACE~NAMESPACE.svc.cluster.local
    match = re.fullmatch(r"sidecar~\$\((\w+)\)~\$\((\w+)\)\.\$\((\w+)\)~\$\((\w+)\)"
                         r"\.svc\.cluster\.local", value)
    assert match, f"relay-deployment.yaml: --node-id {value!r} is not istiod's node id form"
    ip, pod, namespace, domain_namespace = match.groups()
    assert namespace == domain_namespace
    env = {e["name"]: e.get("valueFrom") for e in container.get("env", [])}
    for var, field in ((ip, "status.podIP"), (pod, "metadata.name"),
                       (namespace, "metadata.namespace")):
        assert env.get(var) == {"fieldRef": {"fieldPath": field}}, (
            f"relay-deployment.yaml: env {var} should come from {field}")
    fallback = _configmap_config().node.id.split("~")
    assert len(fallback) == 4 and fallback[0] == "sidecar", (
        f"relay-configmap.yaml: node.id {_configmap_config().node.id!r} is not in istiod's form")


def test_kubernetes_relay_follows_istiods_secured_port() -> None:
    upstream = _configmap_config().upstream
    assert upstream.address is not None and upstream.address.port == 15012
    assert upstream.tls is not None and upstream.tls.server_name == "istiod.istio-system.svc"
    assert upstream.token_file is not None
    assert upstream.initial_metadata.get("clusterid") == \
        _configmap_config().node.metadata["CLUSTER_ID"]
    assert upstream.initial_versions == "ignored"
    assert upstream.keepalive.time >= 15, "istiod refuses pings more often than every 15 s"


def test_kubernetes_files_the_relay_reads_are_mounted_from_their_sources() -> None:
    container = _deployment_container()
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _deployment()["spec"]["template"]["spec"]["volumes"]}
    files = _configmap_files()
    assert set(files) == {"upstream.tls.ca_file", "upstream.token_file",
                          "persistence.redis.password_file", "server.tls.cert_file",
                          "server.tls.key_file", "server.tls.client_ca_file"}
    for key, path in files.items():
        where = PurePosixPath(path)
        mount = mounts.get(str(where.parent))
        assert mount is not None, f"{key} {path}: no volume mounted at {where.parent}"
        assert mount.get("readOnly") is True, f"{key}: mount {mount['name']} is not readOnly"
        # A subPath mount is never updated: rotated certificates and tokens would not arrive.
        assert "subPath" not in mount, f"{key}: mount {mount['name']} uses subPath"
        volume = volumes[mount["name"]]
        if key.startswith("server.tls."):
            # The Secret cert-manager writes for relay-certificate.yaml, under its key names.
            secret_name = _certificate()["spec"]["secretName"]
            assert volume.get("secret", {}).get("secretName") == secret_name, (
                f"{key}: volume {mount['name']} should mount Secret {secret_name} (the "
                f"secretName of relay-certificate.yaml), got {volume}")
            secret_key = CERT_MANAGER_SECRET_KEYS[key.rsplit(".", 1)[-1]]
            items = {i["path"]: i["key"] for i in volume["secret"].get("items", [])} or \
                {k: k for k in CERT_MANAGER_SECRET_KEYS.values()}
            assert items.get(where.name) == secret_key, (
                f"{key}: {path} should be the Secret's key {secret_key!r}, as cert-manager "
                f"names it ({items})")
        elif key == "upstream.tls.ca_file":
            # Istio copies its root certificate into every namespace as this ConfigMap.
            assert volume["configMap"]["name"] == "istio-ca-root-cert"
            items = {i["path"]: i["key"] for i in volume["configMap"]["items"]}
            assert items.get(where.name) == "root-cert.pem", f"{key}: {items}"
        elif key == "persistence.redis.password_file":
            name, secret_key = _redis_secret_key()
            assert volume.get("secret", {}).get("secretName") == name, (
                f"{key}: volume {mount['name']} should mount Secret {name} (redis-secret.yaml), "
                f"got {volume}")
            # Without items, every key of the Secret is a file of its own name.
            items = {i["path"]: i["key"] for i in volume["secret"].get("items", [])} or \
                {secret_key: secret_key}
            assert items.get(where.name) == secret_key, (
                f"{key}: {path} should be the Secret's key {secret_key!r} ({items})")
        else:
            [source] = volume["projected"]["sources"]
            token = source["serviceAccountToken"]
            assert token["path"] == where.name and token["audience"] == "istio-ca", token


def test_kubernetes_certificate_names_the_service_and_renews_in_time() -> None:
    spec = _certificate()["spec"]
    issuer = spec["issuerRef"]
    assert issuer.get("kind", "Issuer") in ("Issuer", "ClusterIssuer") and issuer.get("name"), (
        f"relay-certificate.yaml: issuerRef should name an Issuer or ClusterIssuer: {issuer}")
    service = _manifest("relay-service.yaml", "Service")["metadata"]["name"]
    namespace = _kubernetes_namespace()
    dialled = {f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"}
    missing = dialled - set(spec.get("dnsNames", []))
    assert not missing, (
        f"relay-certificate.yaml dnsNames {spec.get('dnsNames')} lack {sorted(missing)}: the "
        f"names of Service {service} in namespace {namespace} (kustomization.yaml), which "
        f"clients dial and check the certificate against")
    # cert-manager's defaults: 90 days, renewed with a third left.
    duration = parse_duration(spec.get("duration", "2160h"))
    renew_before = (parse_duration(spec["renewBefore"]) if "renewBefore" in spec
                    else duration / 3)
    assert 0 < renew_before < duration, (
        f"relay-certificate.yaml: renewBefore {spec.get('renewBefore')} should be less than "
        f"duration {spec.get('duration')}")
    usages = spec.get("usages")
    assert usages is None or "server auth" in usages, (
        f"relay-certificate.yaml usages {usages}: the relay serves with it (server auth)")


def test_kubernetes_relay_serves_mutual_tls_to_the_mesh_workloads() -> None:
    config = _configmap_config()
    assert config.server.tls is not None and config.server.tls.client_ca_file is not None, (
        "relay-configmap.yaml: expected server.tls with client_ca_file (mutual TLS)")
    rules = config.server.authorization
    authorizer = Authorizer(rules.allow, rules.node_binding, rules.debug, rules.debug_loopback)
    # What the comments in relay-configmap.yaml say: a workload of the trust domain is let
    # in, a certificate of the same CA with DNS names only (the relay's own) is not.
    workload = PeerIdentity("spiffe://cluster.local/ns/default/sa/default")
    assert authorizer.connect_error(workload) is None, (
        f"relay-configmap.yaml: server.authorization.allow refuses {workload}")
    dns_names = tuple(_certificate()["spec"]["dnsNames"])
    assert authorizer.connect_error(PeerIdentity(None, dns_names)) is not None, (
        "relay-configmap.yaml: server.authorization.allow lets in any certificate of the CA, "
        "the relay's own too; name the clients' identities")

def test_kubernetes_relays_share_the_redis_service_beside_them() -> None:
    where = "relay-configmap.yaml"
    config = _configmap_config()
    host, port = _redis_target(config, where)
    service = _manifest("redis.yaml", "Service")
    name, namespace = service["metadata"]["name"], _kubernetes_namespace()
    names = {name, f"{name}.{namespace}", f"{name}.{namespace}.svc",
             f"{name}.{namespace}.svc.cluster.local"}
    assert host in names, (
        f"{where}: persistence.redis.url names host {host!r}, not the Service of redis.yaml "
        f"in namespace {namespace} ({' or '.join(sorted(names))})")
    ports = {p["port"]: p for p in service["spec"]["ports"]}
    assert port in ports, (
        f"{where}: persistence.redis.url port {port} is not a port of Service {name} "
        f"({sorted(ports)})")
    container = _redis_container()
    target = ports[port].get("targetPort", port)
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    container_port = named.get(target, target)
    assert container_port in named.values(), (
        f"redis.yaml: Service port {port} targets {target}, not a container port ({named})")
    listens = _redis_port([*container.get("command", []), *container.get("args", [])])
    assert container_port == listens, (
        f"redis.yaml: Service port {port} targets container port {container_port}, "
        f"redis-server listens on {listens}")
    _zone_key_prefix(config, where)


def test_kubernetes_redis_requires_the_password_the_relays_read() -> None:
    secret_name, secret_key = _redis_secret_key()
    container = _redis_container()
    args = [*container.get("command", []), *container.get("args", [])]
    assert "--requirepass" in args, f"redis.yaml: redis-server without --requirepass: {args}"
    variable = re.fullmatch(r"\$\((\w+)\)", args[args.index("--requirepass") + 1])
    assert variable, f"redis.yaml: --requirepass should be $(VAR) from the Secret: {args}"
    env = {e["name"]: e.get("valueFrom", {}) for e in container.get("env", [])}
    source = env.get(variable.group(1), {}).get("secretKeyRef")
    assert source == {"name": secret_name, "key": secret_key}, (
        f"redis.yaml: env {variable.group(1)} should come from Secret {secret_name} key "
        f"{secret_key} (redis-secret.yaml), got {source}")
    redis = _configmap_config().persistence
    assert redis is not None and redis.redis is not None and redis.redis.password_file, (
        "relay-configmap.yaml: the Redis requires a password: set persistence.redis."
        "password_file (test_kubernetes_files_the_relay_reads_are_mounted_from_their_sources "
        "checks it is the Secret's)")


def test_kubernetes_redis_service_selects_redis_only() -> None:
    redis_labels = _redis_deployment()["spec"]["template"]["metadata"]["labels"]
    relay_labels = _pod_labels()
    redis_selectors = {
        "redis.yaml Deployment spec.selector":
            _redis_deployment()["spec"]["selector"]["matchLabels"],
        "redis.yaml Service spec.selector": _manifest("redis.yaml", "Service")["spec"]["selector"],
    }
    for where, selector in redis_selectors.items():
        assert selector and selector.items() <= redis_labels.items(), (
            f"{where} {selector} does not select the Redis pod labels {redis_labels}")
        assert not selector.items() <= relay_labels.items(), (
            f"{where} {selector} also selects the relay pods {relay_labels}")
    relay_selectors = {
        "relay-service.yaml": _manifest("relay-service.yaml", "Service")["spec"]["selector"],
        "relay-pdb.yaml":
            _manifest("relay-pdb.yaml", "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    }
    for where, selector in relay_selectors.items():
        assert not selector.items() <= redis_labels.items(), (
            f"{where} {selector} also selects the Redis pod {redis_labels}")


def test_kubernetes_service_account_matches_the_namespace_istiod_checks() -> None:
    account = _manifest("relay-serviceaccount.yaml", "ServiceAccount")
    spec = _deployment()["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is False  # only the projected istio-ca token
    metadata = _configmap_config().node.metadata
    namespace = _kubernetes_namespace()
    assert metadata["NAMESPACE"] == namespace, (
        f"relay-configmap.yaml node.metadata.NAMESPACE {metadata['NAMESPACE']!r} should be "
        f"the namespace kustomization.yaml deploys to ({namespace!r})")
    assert metadata["SERVICE_ACCOUNT"] == account["metadata"]["name"]


def test_kubernetes_ports_match_the_config_and_the_service() -> None:
    config = _configmap_config()
    service = _manifest("relay-service.yaml", "Service")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    # With server.tls the relay ends TLS itself: a mesh that took the port for plaintext
    # gRPC (HTTP/2) would try to parse the TLS bytes, so it is declared tls.
    xds, protocol = ("tls-xds", "tls") if config.server.tls else ("grpc-xds", "grpc")
    admin, admin_protocol = ("https-admin", "https") if config.admin.tls else ("http-admin", "http")
    expected = {xds: config.server.address.port, admin: config.admin.address.port}
    for name, config_port in expected.items():
        assert name in ports, f"relay-service.yaml: no port {name!r} ({sorted(ports)})"
        target = _container_port(ports[name]["targetPort"])
        assert target == config_port, (
            f"relay-service.yaml {name} targets container port {target}, the ConfigMap's "
            f"config listens on {config_port}")
    assert ports[xds].get("appProtocol") == protocol, f"{xds} needs appProtocol: {protocol}"
    assert ports[admin].get("appProtocol") == admin_protocol, (
        f"{admin} needs appProtocol: {admin_protocol}")
    assert _container_port("xds") == config.server.address.port
    assert _container_port("admin") == config.admin.address.port


def test_kubernetes_probes_ask_ready_and_healthz_on_the_admin_port() -> None:
    container = _deployment_container()
    admin = _configmap_config().admin.address.port
    # /ready and /healthz need no admin.token_file token; with admin.tls they need HTTPS
    # (the kubelet does not check the certificate).
    scheme = "HTTPS" if _configmap_config().admin.tls else "HTTP"
    for probe, path in (("readinessProbe", "/ready"), ("livenessProbe", "/healthz"),
                        ("startupProbe", "/healthz")):
        assert probe in container, f"relay-deployment.yaml: no {probe}"
        get = container[probe].get("httpGet")
        assert get is not None, f"relay-deployment.yaml {probe}: expected httpGet"
        assert (get["path"], _container_port(get["port"])) == (path, admin), (
            f"relay-deployment.yaml {probe} asks {get['path']} on {get['port']}, expected "
            f"{path} on the admin port {admin}")
        assert get.get("scheme", "HTTP") == scheme, (
            f"relay-deployment.yaml {probe}: scheme {get.get('scheme', 'HTTP')}, the admin "
            f"server speaks {scheme}")


def test_kubernetes_prometheus_scrapes_metrics_on_the_admin_port() -> None:
    annotations = _deployment()["spec"]["template"]["metadata"]["annotations"]
    admin = _configmap_config().admin.address.port
    assert annotations.get("prometheus.io/scrape") == "true"
    assert annotations.get("prometheus.io/port") == str(admin), (
        f"prometheus.io/port {annotations.get('prometheus.io/port')} != admin port {admin}")
    assert annotations.get("prometheus.io/path") == "/metrics"


def test_kubernetes_selectors_match_the_pod_labels() -> None:
    labels = _pod_labels()
    selectors = {
        "Deployment spec.selector": _deployment()["spec"]["selector"]["matchLabels"],
        "Service spec.selector": _manifest("relay-service.yaml", "Service")["spec"]["selector"],
        "PodDisruptionBudget spec.selector":
            _manifest("relay-pdb.yaml", "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    }
    for spread in _deployment()["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
        selectors["topologySpreadConstraints"] = spread["labelSelector"]["matchLabels"]
    for where, selector in selectors.items():
        assert selector and selector.items() <= labels.items(), (
            f"{where} {selector} does not select the pod labels {labels}")


def test_kubernetes_termination_grace_outlasts_prestop_and_drain() -> None:
    spec = _deployment()["spec"]["template"]["spec"]
    drain = _configmap_config().server.drain_period
    pre_stop = _deployment_container().get("lifecycle", {}).get("preStop", {})
    command = pre_stop.get("exec", {}).get("command", [])
    pause = float(command[1]) if command[:1] == ["sleep"] else 0.0
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > pause + drain, (
        f"relay-deployment.yaml terminationGracePeriodSeconds {grace} should exceed preStop "
        f"{pause:g}s + the ConfigMap's server.drain_period {drain:g}s")


def test_kubernetes_relay_is_replicated_non_root_and_bounded() -> None:
    deployment = _deployment()
    replicas = deployment["spec"]["replicas"]
    assert replicas >= 2, f"relay-deployment.yaml: {replicas} replica(s), expected 2 or more"
    pdb = _manifest("relay-pdb.yaml", "PodDisruptionBudget")["spec"]
    if "maxUnavailable" in pdb:
        assert 0 < pdb["maxUnavailable"] < replicas, f"PDB maxUnavailable {pdb}"
    else:
        assert 0 < pdb["minAvailable"] < replicas, f"PDB minAvailable {pdb}"
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    container = _deployment_container()
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= container["resources"][bound].keys(), (
            f"relay-deployment.yaml: resources.{bound} should set cpu and memory")


def test_kubernetes_creates_the_namespace_it_deploys_to() -> None:
    namespace = _manifest("namespace.yaml", "Namespace")
    assert namespace["metadata"]["name"] == _kubernetes_namespace()


def test_kubernetes_says_how_to_build_and_push_the_unpublished_image() -> None:
    text = (KUBERNETES / "kustomization.yaml").read_text()
    image = yaml.safe_load(text)["images"][0]
    assert f"docker build -t registry.example.com/xds-relay:{image['newTag']} ." in text
    assert f"docker push registry.example.com/xds-relay:{image['newTag']}" in text


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    listed = sorted(kustomization["resources"])
    present = sorted(p.name for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")
    assert listed == present, (
        f"kustomization.yaml resources {listed} != manifests in deploy/kubernetes {present}")
    images = {i["name"] for i in kustomization.get("images", [])}
    image = _deployment_container()["image"].split(":")[0]
    assert not images or image in images, (
        f"kustomization.yaml images {sorted(images)} do not name the Deployment's {image}")
