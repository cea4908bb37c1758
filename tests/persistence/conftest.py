"""A real Redis for the snapshot tests, and a key prefix of each test's own."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.redis_server import RedisServer, redis_server

_prefixes = itertools.count(1)


@pytest.fixture(scope="session")
def redis() -> Iterator[RedisServer]:
    """One server for the session: tests keep apart by prefix."""
    with redis_server() as server:
        yield server


@pytest.fixture
def prefix() -> str:
    return f"test-{next(_prefixes)}"
