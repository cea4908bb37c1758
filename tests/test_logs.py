"""Log styles: JSON records carry time, level, logger, message and exception;
rate-limited warnings log the first of a kind and count the rest."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relay.logs import JsonFormatter, RateLimitedLog, quiet_grpc_core

REPO = Path(__file__).resolve().parents[1]


def test_json_record_has_fields_and_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("relay.upstream", logging.WARNING, __file__, 1,
                                   "origin %s failed", ("o:1",), exc_info=sys.exc_info())
    record.created = 0.0
    entry = json.loads(JsonFormatter().format(record))
    assert entry["time"] == "1970-01-01T00:00:00.000Z"
    assert (entry["level"], entry["logger"], entry["msg"]) == (
        "warning", "relay.upstream", "origin o:1 failed")
    assert entry["exc"].startswith("Traceback") and entry["exc"].endswith("ValueError: boom")


# --------------------------------------------------------------------------- RateLimitedLog


class FakeClock:
    """A ``now`` the test moves."""

    def __init__(self, start: float = 1000.0) -> None:
        self.time = start

    def __call__(self) -> float:
        return self.time


def rate_limited(caplog: pytest.LogCaptureFixture, interval: float = 60.0,
                 max_keys: int = 10_000) -> tuple[RateLimitedLog, FakeClock]:
    caplog.set_level(logging.WARNING, logger="relay.test.refusals")
    clock = FakeClock()
    log = RateLimitedLog(logging.getLogger("relay.test.refusals"), interval, clock, max_keys)
    return log, clock


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_the_first_line_of_a_kind_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    log, _ = rate_limited(caplog)
    log.warning("not_allowed", "refused %s (%s)", "ipv4:10.0.0.1:5", "not_allowed")
    assert logged(caplog) == ["refused ipv4:10.0.0.1:5 (not_allowed)"]
    assert caplog.records[0].levelno == logging.WARNING
    assert caplog.records[0].name == "relay.test.refusals"


def test_lines_within_the_interval_are_only_counted(caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog)
    log.warning("k", "refused %s", "a")
    for n in range(5):
        clock.time += 10
        log.warning("k", "refused %s", f"b{n}")
    assert logged(caplog) == ["refused a"]


def test_the_next_line_after_the_interval_tells_the_count(
        caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog, interval=60)
    log.warning("k", "refused %s", "a")
    clock.time += 10
    log.warning("k", "refused %s", "b")
    clock.time += 20
    log.warning("k", "refused %s", "c")
    clock.time += 41  # 71 s after the line logged
    log.warning("k", "refused %s", "d")
    assert logged(caplog) == [
        "refused a",
        "refused d (2 more like it in the 71s since the last one logged)"]


def test_the_count_starts_again_after_each_line_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog, interval=60)
    log.warning("k", "x")
    clock.time += 1
    log.warning("k", "x")
    clock.time += 60
    log.warning("k", "x")
    clock.time += 1
    log.warning("k", "x")
    clock.time += 1
    log.warning("k", "x")
    clock.time += 1
    log.warning("k", "x")
    clock.time += 60
    log.warning("k", "x")
    assert logged(caplog) == [
        "x",
        "x (1 more like it in the 61s since the last one logged)",
        "x (3 more like it in the 63s since the last one logged)"]


def test_a_quiet_interval_logs_the_next_line_plainly(caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog, interval=60)
    log.warning("k", "x")
    clock.time += 600
    log.warning("k", "x")
    assert logged(caplog) == ["x", "x"]


def test_the_interval_is_measured_from_the_line_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog, interval=60)
    log.warning("k", "x")  # at 1000
    clock.time = 1059.5
    log.warning("k", "x")
    assert logged(caplog) == ["x"]
    clock.time = 1060.0  # exactly one interval after the line logged
    log.warning("k", "x")
    assert logged(caplog) == ["x", "x (1 more like it in the 60s since the last one logged)"]


def test_kinds_are_limited_independently(caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog, interval=60)
    log.warning("not_allowed", "a1")
    log.warning("node_binding", "b1")
    clock.time += 5
    log.warning("not_allowed", "a2")
    log.warning("debug", "c1")
    clock.time += 30
    log.warning("node_binding", "b2")
    clock.time += 30  # 65 s after a1 and b1, 60 after c1
    log.warning("not_allowed", "a3")
    log.warning("node_binding", "b3")
    log.warning("debug", "c2")
    assert logged(caplog) == [
        "a1", "b1", "c1",
        "a3 (1 more like it in the 65s since the last one logged)",
        "b3 (1 more like it in the 65s since the last one logged)",
        "c2"]


def test_past_max_keys_tracking_starts_afresh(caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog, interval=60, max_keys=2)
    log.warning("a", "a1")
    log.warning("b", "b1")
    log.warning("a", "a2")  # counted
    log.warning("c", "c1")  # a third kind: a and b are forgotten
    log.warning("c", "c2")  # c is still tracked
    log.warning("a", "a3")  # logged again, its count lost
    assert logged(caplog) == ["a1", "b1", "c1", "a3"]
    clock.time += 60
    log.warning("c", "c3")
    assert logged(caplog)[-1] == "c3 (1 more like it in the 60s since the last one logged)"


def test_memory_stays_bounded_by_max_keys(caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog, interval=60, max_keys=10)
    for n in range(1_000):
        log.warning(f"peer-{n}", "refused %s", n)
        clock.time += 0.001
        assert len(log._seen) <= 10  # the only way to see the bound: its private record
    assert len(caplog.records) == 1_000


def test_a_message_with_a_percent_sign_and_no_args_keeps_its_count(
        caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog, interval=60)
    log.warning("k", "cache 100% full")
    log.warning("k", "cache 100% full")
    clock.time += 60
    log.warning("k", "cache 100% full")
    assert logged(caplog) == [
        "cache 100% full",
        "cache 100% full (1 more like it in the 60s since the last one logged)"]


# ------------------------------------------------------------- the bound per kind, all hosts


def test_each_host_of_a_kind_is_logged_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog, interval=10)
    for host in ("10.0.0.1", "10.0.0.2"):
        for _ in range(3):
            log.warning("invalid", "rejecting poll from %s", host, host=host)
    clock.time += 10
    log.warning("invalid", "rejecting poll from %s", "10.0.0.1", host="10.0.0.1")
    assert logged(caplog) == [
        "rejecting poll from 10.0.0.1",
        "rejecting poll from 10.0.0.2",
        "rejecting poll from 10.0.0.1 (2 more like it in the 10s since the last one logged)"]


def test_many_hosts_log_at_most_per_kind_lines_of_a_kind_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="relay.test.refusals")
    clock = FakeClock()
    log = RateLimitedLog(logging.getLogger("relay.test.refusals"), 10, clock, per_kind=3)
    for n in range(2_000):  # one line from each of 2,000 addresses
        log.warning("invalid", "rejecting poll from %s", f"10.0.{n // 256}.{n % 256}",
                    host=f"10.0.{n // 256}.{n % 256}")
    log.warning("streams", "refusing stream from %s", "10.9.9.9", host="10.9.9.9")
    assert logged(caplog) == ["rejecting poll from 10.0.0.0", "rejecting poll from 10.0.0.1",
                              "rejecting poll from 10.0.0.2",
                              "refusing stream from 10.9.9.9"]  # another kind has room
    clock.time += 4
    log.warning("invalid", "rejecting poll from %s", "10.0.0.3", host="10.0.0.3")
    assert len(caplog.records) == 4  # still the same interval
    clock.time += 6  # an interval after the kind's first line
    log.warning("invalid", "rejecting poll from %s", "10.0.0.9", host="10.0.0.9")
    assert logged(caplog)[-1] == (
        "rejecting poll from 10.0.0.9 (1998 more of this kind, from any host, left out in "
        "the 10s since the last one logged)")


def test_a_host_left_out_by_the_kinds_bound_is_logged_when_the_kind_has_room(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="relay.test.refusals")
    clock = FakeClock()
    log = RateLimitedLog(logging.getLogger("relay.test.refusals"), 10, clock, per_kind=1)
    log.warning("k", "from a", host="a")
    log.warning("k", "from b", host="b")  # the kind's one line is spent
    clock.time += 10
    log.warning("k", "from b", host="b")  # b's own record was never started: logged
    log.warning("k", "from a", host="a")
    assert logged(caplog) == [
        "from a",
        "from b (1 more of this kind, from any host, left out in the 10s since the last one "
        "logged)"]


def test_both_counts_are_told_together(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="relay.test.refusals")
    clock = FakeClock()
    log = RateLimitedLog(logging.getLogger("relay.test.refusals"), 10, clock, per_kind=1)
    log.warning("k", "100% from a", host="a")
    log.warning("k", "100% from a", host="a")  # a's own bound
    log.warning("k", "100% from b", host="b")  # the kind's bound
    clock.time += 12
    log.warning("k", "100% from a", host="a")
    assert logged(caplog)[-1] == (
        "100% from a (1 more like it in the 12s since the last one logged) (1 more of this "
        "kind, from any host, left out in the 12s since the last one logged)")


def test_lines_without_a_host_are_bounded_per_kind_as_before(
        caplog: pytest.LogCaptureFixture) -> None:
    log, clock = rate_limited(caplog, interval=10)
    for _ in range(5):
        log.warning("identity", "refused")
    clock.time += 10
    log.warning("identity", "refused")
    assert logged(caplog) == ["refused",
                              "refused (4 more like it in the 10s since the last one logged)"]


def test_kinds_tracked_stay_bounded_by_max_keys(caplog: pytest.LogCaptureFixture) -> None:
    log, _ = rate_limited(caplog, max_keys=10)
    for n in range(100):
        log.warning(f"kind-{n}", "x", host=f"h{n}")
        assert len(log._kinds) <= 10 and len(log._seen) <= 10  # private: the only view


# ------------------------------------------------------------------------ gRPC's core


def test_grpc_core_logs_from_error_up_unless_the_operator_said_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    quiet_grpc_core()
    assert os.environ["GRPC_VERBOSITY"] == "ERROR"
    monkeypatch.setenv("GRPC_VERBOSITY", "INFO")
    quiet_grpc_core()
    assert os.environ["GRPC_VERBOSITY"] == "INFO"


GARBAGE_TO_A_TLS_SERVER = """
import asyncio, socket, sys
from pathlib import Path
if sys.argv[1] == "quiet":
    from relay.logs import quiet_grpc_core
    quiet_grpc_core()
import grpc
from tests.certs import Authority

async def main() -> None:
    leaf = Authority(Path(sys.argv[2])).relay_leaf()
    server = grpc.aio.server()
    port = server.add_secure_port(
        "127.0.0.1:0", grpc.ssl_server_credentials([(leaf.key_pem, leaf.cert_pem)]))
    await server.start()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
            sock.settimeout(5)
            assert sock.recv(100) == b""  # the relay hung up: the handshake failed
    await server.stop(None)

asyncio.run(main())
"""


@pytest.mark.parametrize("mode", ["quiet", "default"])
def test_a_failed_tls_handshake_is_logged_by_grpc_only_when_not_quieted(
        mode: str, tmp_path: Path) -> None:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("GRPC_")}
    result = subprocess.run([sys.executable, "-c", GARBAGE_TO_A_TLS_SERVER, mode,
                             str(tmp_path)], capture_output=True, text=True, timeout=60,
                            cwd=REPO, env=environ, check=False)
    assert result.returncode == 0, result.stderr
    failed = [line for line in result.stderr.splitlines() if "Handshake failed" in line]
    # Left to itself gRPC logs each one (the premise: if this changes, so may the fix).
    assert len(failed) == (0 if mode == "quiet" else 3), result.stderr
