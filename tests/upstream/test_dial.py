"""How the relay dials its origin: options, credentials read at every connect."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from relay.upstream.dial import Dialer, DialError, OriginTLS


def test_channel_options_carry_the_limits_and_keepalive() -> None:
    options = dict(Dialer("istiod:15012", keepalive_time=45, keepalive_timeout=5,
                          max_response_size=1 << 28,
                          tls=OriginTLS(server_name="istiod.istio-system.svc")).options())
    assert options["grpc.max_receive_message_length"] == 1 << 28
    assert options["grpc.keepalive_time_ms"] == 45_000
    assert options["grpc.keepalive_timeout_ms"] == 5_000
    assert options["grpc.http2.max_pings_without_data"] == 0
    assert options["grpc.use_local_subchannel_pool"] == 1
    assert options["grpc.ssl_target_name_override"] == "istiod.istio-system.svc"
    assert "grpc.ssl_target_name_override" not in dict(Dialer("origin:1").options())


def test_the_token_is_read_again_at_every_connect(tmp_path: Path) -> None:
    token = tmp_path / "istio-token"
    token.write_text("first\n")
    dialer = Dialer("istiod:15012", token_file=token, initial_metadata=(("clusterid", "K"),))
    assert dialer.metadata() == (("authorization", "Bearer first"), ("clusterid", "K"))
    token.write_text("second")
    assert dialer.metadata()[0] == ("authorization", "Bearer second")


def test_an_unreadable_or_empty_token_is_a_dial_error(tmp_path: Path) -> None:
    token = tmp_path / "istio-token"
    expected = re.escape(f"cannot read upstream.token_file {token}: No such")
    with pytest.raises(DialError, match=expected):
        Dialer("istiod:15012", token_file=token).metadata()
    token.write_text("  \n")
    with pytest.raises(DialError, match="is empty"):
        Dialer("istiod:15012", token_file=token).metadata()


def test_certificates_are_read_when_a_channel_is_made(tmp_path: Path) -> None:
    missing = tmp_path / "root-cert.pem"
    with pytest.raises(DialError, match=r"cannot read upstream\.tls\.ca_file"):
        Dialer("istiod:15012", tls=OriginTLS(ca_file=missing)).channel()
