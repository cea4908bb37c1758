"""CacheView.lookup of a name holding one plain resource reads the cache's
table of plain names (ResourceCache.served_one): no dict of the name's
variants is made for the call; any other name is looked up as before, and
each gives what it gave."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from relay.cache import ABSENT, UNKNOWN, ResourceCache, Update
from relay.constraints import EMPTY_PARAMS, Locator, params_of
from relay.protocol.view import CacheView
from relay.xds_types import ENDPOINT
from tests.test_cache_answer import resource
from tests.variants import CANARY as CANARY_ONLY

CANARY = params_of({"env": "canary"})


def test_a_plain_name_is_looked_up_without_its_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ResourceCache()
    plain, other = resource("plain"), resource("other")
    variant = resource("variant", CANARY_ONLY)
    cache.apply(ENDPOINT, Update([plain, other, variant], removed=["gone"],
                                 answered=["gone", "plain"]))
    asked: list[str] = []
    variants: Callable[..., Any] = ResourceCache.variants

    def counted(self: ResourceCache, type_url: str, name: str) -> Any:
        asked.append(name)
        return variants(self, type_url, name)

    monkeypatch.setattr(ResourceCache, "variants", counted)
    view = CacheView(cache)
    for params in (EMPTY_PARAMS, CANARY):
        assert view.lookup(ENDPOINT, "plain", params) is plain
        assert view.lookup(ENDPOINT, "other", params) is other
    assert asked == []
    assert view.lookup(ENDPOINT, "gone", EMPTY_PARAMS) is ABSENT
    assert view.lookup(ENDPOINT, "never", EMPTY_PARAMS) is UNKNOWN
    assert view.lookup(ENDPOINT, "variant", CANARY) is variant
    assert view.lookup(ENDPOINT, "variant", EMPTY_PARAMS) is UNKNOWN
    assert asked == ["gone", "never", "variant", "variant"]
    cache.apply(ENDPOINT, Update(answered=[Locator("never", CANARY)]))
    assert view.lookup(ENDPOINT, "never", CANARY) is ABSENT
