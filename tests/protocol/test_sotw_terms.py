"""A SotW resource's version term is kept by the resource's id while it lives.

The term of each resource sent over SotW (its share of ``version_info``) is
hashed once and found again by id from C: a warm big client's 10,000 terms
summed in one pass, no object made per resource. An id is the resource's
only while it lives, so the term goes as the resource does, before another
object can take the id.
"""

from __future__ import annotations

import gc

import pytest

from relay.protocol import sotw
from relay.resource import CachedResource
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, pack


def made(name: str, port: int = 80) -> CachedResource:
    return CachedResource.from_message(ENDPOINT, pack(endpoints(name, port, port + 1)), name, "1")


def test_the_terms_are_each_resources_own_hash() -> None:
    resources = [made(f"term-{i}") for i in range(50)]
    expected = sum(sotw.held_term(r.name, r) for r in resources)
    assert sotw.own_terms(resources) == expected  # hashed
    assert sotw.own_terms(resources) == expected  # found


def test_known_terms_are_summed_without_a_call_or_an_object_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    resources = [made(f"known-{i}") for i in range(2_000)]
    expected = sotw.own_terms(resources)
    calls: list[str] = []
    monkeypatch.setattr(sotw, "own_term", lambda r: calls.append(r.name))
    monkeypatch.setattr(sotw, "held_term", lambda name, held: calls.append(name))
    refs = len(sotw._TERM_REFS)
    assert sotw.own_terms(resources) == expected
    assert calls == [] and len(sotw._TERM_REFS) == refs


def test_one_unknown_term_is_hashed_and_the_rest_found() -> None:
    resources = [made(f"mixed-{i}") for i in range(20)]
    sotw.own_terms(resources[:19])
    assert sotw.own_terms(resources) == sum(sotw.held_term(r.name, r) for r in resources)


def test_a_term_goes_with_its_resource_and_an_id_taken_again_gets_its_own() -> None:
    gc.collect()
    before = (len(sotw._OWN_TERMS), len(sotw._TERM_REFS))
    reused = 0
    for i in range(200):
        first = made(f"gone-{i}", 80)
        sotw.own_term(first)
        key = id(first)
        del first
        # (CPython gives a freed object's memory to the next of its size, often)
        second = made(f"other-{i}", 9_000)
        reused += id(second) == key
        assert sotw.own_term(second) == sotw.held_term(second.name, second)
        del second
    assert reused, "no id was taken again: the case is not exercised"
    gc.collect()
    assert (len(sotw._OWN_TERMS), len(sotw._TERM_REFS)) == before
