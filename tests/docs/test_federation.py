"""docs/federation.md's examples are what the relay and gRPC would read.

Each YAML example validates as a relay config (with a node added where the
page shows only a part, and stand-ins for the files it names), the origins
it configures are the ones the page says, and the gRPC bootstrap names the
relay for each authority with a listener template of that authority.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trustme

from relay.config import ConfigError, RelayConfig, parse_config
from tests.docs.markdown import DOCS, blocks

FEDERATION = DOCS / "federation.md"
# The files the examples name: PEM roots, and tokens.
_PEM = re.compile(r"/[\w./-]+\.pem")
_TOKEN = re.compile(r"/var/run/secrets/tokens/[\w.-]+")


def example(text: str, files: Path) -> RelayConfig:
    """``text`` as a relay config, its files replaced by stand-ins under ``files``."""
    ca, token = files / "ca.pem", files / "token"
    ca.write_bytes(trustme.CA().cert_pem.bytes())
    token.write_text("a.jwt.token")
    text = _TOKEN.sub(str(token), _PEM.sub(str(ca), text))
    if not re.search(r"^node:", text, re.MULTILINE):
        text = "node: {id: docs}\n" + text
    return parse_config(text, "docs/federation.md")


def test_the_authorities_example_has_a_default_origin_and_two_authorities(
        tmp_path: Path) -> None:
    config = example(blocks(FEDERATION, "yaml")[0], tmp_path)
    assert list(config.origins()) == ["default", "east.example.com", "west.example.com"]
    assert str(config.authorities["east.example.com"].address) == "cp.east.example.com:18000"


def test_the_fallback_example_lists_a_server_with_credentials_of_its_own(
        tmp_path: Path) -> None:
    config = example(blocks(FEDERATION, "yaml")[1], tmp_path)
    assert config.upstream is not None
    (fallback,) = config.upstream.fallback
    assert str(fallback.address) == "istiod-backup.example.com:15012"
    assert fallback.tls is not None and fallback.token_file is not None


def test_every_yaml_example_validates(tmp_path: Path) -> None:
    for text in blocks(FEDERATION, "yaml"):
        example(text, tmp_path)  # raises ConfigError naming the line


def test_an_authority_named_default_is_refused_as_the_page_says(tmp_path: Path) -> None:
    text = blocks(FEDERATION, "yaml")[0].replace("east.example.com:", "default:", 1)
    with pytest.raises(ConfigError, match="'default' names the origin of upstream"):
        example(text, tmp_path)


def test_the_grpc_bootstrap_names_the_relay_for_each_authority() -> None:
    (bootstrap,) = (json.loads(block) for block in blocks(FEDERATION, "json"))
    (relay,) = bootstrap["xds_servers"]
    assert bootstrap["node"]["id"]
    assert bootstrap["authorities"], "a federation bootstrap names authorities"
    for authority, entry in bootstrap["authorities"].items():
        assert entry["xds_servers"] == [relay]
        # gRPC (A47) wants the template to be an xdstp name of the authority, of Listeners
        assert entry["client_listener_resource_name_template"] == \
            f"xdstp://{authority}/envoy.config.listener.v3.Listener/%s"
