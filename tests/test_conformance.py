"""The conformance table: every line of relay-invariants.md has checks.

The checks themselves live next to what they test (protocol state, stream
adapter, end to end) and are named ``test_invariant_N_...``; ``pytest -k
invariant_N`` runs those of line N. This table names each line and the test
below fails if a line is left without a check.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import invariant_numbers

INVARIANTS: dict[int, str] = {
    1: "delta: empty first subscribe is wildcard (LDS/CDS, or '*') and always answered",
    2: "delta: empty subscribe after names adds nothing; only '*' is wildcard; '-*' ends it",
    3: "delta: unsubscribing a name while wildcard resends it or reports it removed",
    4: "delta: every subscribed name is sent, even if the client should hold it",
    5: "delta: initial_resource_versions skip unchanged, resend changed, remove gone",
    6: "delta: a missing name is reported removed and stays subscribed",
    7: "per-resource versions are the origin's",
    8: "no name twice in a response; nonces non-empty and unique",
    9: "a plain ACK produces no response",
    10: "a NACK causes no resend; recorded; never forwarded upstream",
    11: "a stale delta nonce still changes the subscription",
    12: "aliases: subscription by alias delivers the canonical name with aliases",
    13: "variants sent with constraints are removed by removed_resource_names",
    14: "SotW LDS/CDS list everything; other types send changes only",
    15: "SotW version_info changes with content; foreign versions get a full resend",
    16: "SotW stale nonce gets nothing; first request is initial whatever its nonce",
    17: "SotW empty names after names means nothing; resubscribe resends",
    18: "TTL'd resources wrapped in Resource only for clients that support it (SotW)",
    19: "no response for a type the client did not subscribe to",
    20: "make-before-break order within one origin burst; cluster removals last",
    21: "one un-ACKed response per type; coalescing; slow clients slow nobody",
    22: "TTL: heartbeats forwarded as heartbeats; lapsed TTL removes; none invented",
    23: "do_not_cache: forwarded, never served from cache to a later client",
    24: "the node from the first request is kept for the stream",
    25: "one upstream stream; union subscription; subscribe/unsubscribe follow clients",
    26: "unusable origin responses are NACKed with a reason and kept from clients",
    27: "reconnect resends subscriptions and initial versions; jittered backoff",
    28: "origin unreachable: clients keep config; new clients served from cache",
    29: "before the first sync, clients wait rather than get an empty answer",
    30: "the cache holds variants separately and serves each subscriber its match",
    31: "parameter changes re-evaluate variants without resubscribing",
    # fleets
    32: "connections retired after max_connection_age; a declared reconnect costs nothing",
    33: "new streams past the admission rate wait, then UNAVAILABLE; open ones untouched",
    34: "no response over server.max_response_size unless one resource is larger",
    # federation
    35: "xdstp names compared in canonical form; each response names them as the client did",
    36: "delta globs get every member with their context, and removals; upstream once; "
        "SotW refused",
    37: "each name to the origin of its authority; one stream per origin; an outage, NACK "
        "or resync touches only its names",
    38: "a fallback only when unreachable and something is not cached; back when the "
        "primary answers; never two servers' resources",
}


TESTS = Path(__file__).resolve().parent
_TEST_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(test_invariant_\w+)\s*\(", re.MULTILINE)


def named_checks() -> dict[int, list[str]]:
    """Invariant number -> the tests (file::name) that say they check it.

    Read from the test files rather than from what pytest collected, so that
    the verdict does not depend on which tests a run selects.
    """
    covered: dict[int, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        if "node_modules" in path.parts:
            continue
        for name in _TEST_DEF.findall(path.read_text()):
            for number in invariant_numbers(name):
                covered.setdefault(number, []).append(f"{path.relative_to(TESTS)}::{name}")
    return covered


def test_every_invariant_has_at_least_one_named_check() -> None:
    covered = named_checks()
    missing = sorted(set(INVARIANTS) - set(covered))
    assert missing == [], f"invariants without a check: {missing}"
    unknown = sorted(set(covered) - set(INVARIANTS))
    assert unknown == [], f"tests name invariants that do not exist: {unknown}"


@pytest.mark.parametrize("name,numbers", [
    ("test_invariant_22_x", [22]),
    ("test_invariant_14_15_sotw", [14, 15]),
    ("test_invariant_18_22_heartbeats", [18, 22]),
    ("test_something_else", []),
])
def test_invariant_numbers_are_read_from_test_names(name: str, numbers: list[int]) -> None:
    assert invariant_numbers(name) == numbers
