"""End to end: a snapshot of derived versions is no news when the origin resends it.

An origin such as istiod sends no per-resource version; the relay derives
one from the content (:meth:`~relay.resource.CachedResource.from_origin`,
or :meth:`~relay.resource.CachedResource.from_encoded` for a response of
:data:`~relay.upstream.bulk.BULK_FROM` plain resources or more). A relay
restarted from its snapshot while the origin is away must derive the same
versions from what it stored as it does from the origin's next copy of the
same bytes: otherwise, when the origin returns and resends everything (as
istiod does on every new stream), every restored resource looks changed,
and every client that already holds it, one that reconnected declaring its
versions (``initial_resource_versions``) included, is sent it once more.

The origin's responses before and after the restart are checked one by one
or in bulk, in each combination: a snapshot is always restored one by one
(:mod:`relay.persistence.entries`), so each meets both derivations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from relay.cache import CacheChange, ResourceCache
from relay.resource import CachedResource
from relay.upstream.bulk import BULK_FROM
from relay.xds_types import CLUSTER
from tests.builders import cluster
from tests.e2e.test_persistence import DELTA_ADS, SOTW_ADS, running, written
from tests.harness import XdsClient, eventually, names_of, node
from tests.istiod import IstiodOrigin, IstiodStream

COUNT = BULK_FROM + 8
SMALL = BULK_FROM // 4  # a response of this many is checked one by one


class PiecewiseIstiod(IstiodOrigin):
    """istiod that sends what one response would hold in pieces of ``piece``."""

    def __init__(self, piece: int) -> None:
        super().__init__()
        self.piece = piece

    def _send(self, stream: IstiodStream, type_url: str, names: Iterable[str],
              removed: Iterable[str] = ()) -> None:
        listed = list(names)
        for start in range(0, max(len(listed), 1), self.piece):
            super()._send(stream, type_url, listed[start:start + self.piece],
                          removed if start == 0 else ())


def names(count: int) -> list[str]:
    return [f"c{i:03d}" for i in range(count)]


def cached(relay_cache: ResourceCache, count: int) -> dict[str, CachedResource]:
    """The unconstrained variant of each name, as the relay's cache holds it."""
    found: dict[str, CachedResource] = {}
    for name in names(count):
        variants = relay_cache.variants(CLUSTER, name)
        assert isinstance(variants, Mapping), name
        found[name] = variants[""]
    return found


async def versions(client: XdsClient, count: int) -> dict[str, str]:
    """The responses, each ACKed, until ``count`` names came: name -> version."""
    got: dict[str, str] = {}
    while len(got) < count:
        response = await client.recv()
        assert list(response.removed_resources) == []
        got.update({r.name: r.version for r in response.resources})
        await client.ack(response)
    return got


@pytest.fixture
def from_encoding(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the resources made from their encoding (the bulk check's)."""
    made: list[str] = []
    original = CachedResource.from_encoded

    def counted(type_url: str, name: str, version: str, entry: bytes,
                received: float) -> CachedResource:
        made.append(name)
        return original(type_url, name, version, entry, received)

    monkeypatch.setattr(CachedResource, "from_encoded", counted)
    return made


async def synced_and_stopped(origin: IstiodOrigin, section: str, count: int
                             ) -> tuple[dict[str, str], dict[str, bytes]]:
    """A relay synced with ``origin`` through a wildcard delta client, its
    snapshot written, then stopped: the versions the client holds and the
    digests the relay cached."""
    async with running(origin.port, section) as (relay, channel):
        envoy = XdsClient(channel, DELTA_ADS, True)
        await envoy.send(node=node("envoy"), type_url=CLUSTER, resource_names_subscribe=["*"])
        held = await versions(envoy, count)
        await written(relay)
        digests = {name: r.digest for name, r in cached(relay.cache, count).items()}
        envoy.close()
    return held, digests


@pytest.mark.parametrize(("count", "before", "after"), [
    (SMALL, SMALL, SMALL), (COUNT, COUNT, COUNT), (COUNT, SMALL, COUNT), (COUNT, COUNT, SMALL),
], ids=["one-by-one", "bulk", "one-by-one-then-bulk", "bulk-then-one-by-one"])
async def test_a_restored_snapshot_is_no_news_when_the_origin_resends_the_same_bytes(
        tmp_path: Path, from_encoding: list[str], count: int, before: int, after: int) -> None:
    section = f'persistence: {{directory: "{tmp_path / "snapshot"}"}}'
    clusters = [cluster(name) for name in names(count)]
    origin = await PiecewiseIstiod(before).start()
    origin.set(*clusters)
    held, digests = await synced_and_stopped(origin, section, count)
    assert sorted(held) == names(count)
    assert all(len(version) == 16 for version in held.values())  # derived: none from the origin
    assert len(from_encoding) == (count if before >= BULK_FROM else 0)
    port = origin.port
    await origin.stop()  # the origin goes away; the relay restarts meanwhile
    from_encoding.clear()

    async with running(port, section) as (relay, channel):
        assert relay.restored is not None and relay.restored.resources == count
        restored = cached(relay.cache, count)
        assert {name: r.version for name, r in restored.items()} == held
        assert {name: r.digest for name, r in restored.items()} == digests
        assert all(r.derived_version for r in restored.values())
        changes: list[CacheChange] = []
        relay.cache.add_listener(changes.append)

        # Envoy reconnects declaring what it holds: the first answer of a
        # wildcard subscription is sent, and holds nothing. A SotW client
        # new since the restart is served the snapshot.
        envoy = XdsClient(channel, DELTA_ADS, True)
        await envoy.send(node=node("envoy"), type_url=CLUSTER, resource_names_subscribe=["*"],
                         initial_resource_versions=held)
        answer = await envoy.recv()
        assert (list(answer.resources), list(answer.removed_resources)) == ([], [])
        await envoy.ack(answer)
        sotw = XdsClient(channel, SOTW_ADS, False)
        await sotw.send(node=node("sotw"), type_url=CLUSTER)
        whole = await sotw.recv()
        assert names_of(whole) == names(count)
        await sotw.ack(whole)

        # The origin returns and resends everything, the same bytes.
        revived = PiecewiseIstiod(after)
        revived.set(*clusters)
        await revived.start(port)
        try:
            await eventually(lambda: bool(revived.streams) and
                             revived.streams[0].resources_sent == count and
                             revived.streams[0].all_answered())
            assert revived.streams[0].nacks == []
            assert len(from_encoding) == (count if after >= BULK_FROM else 0)
            await envoy.expect_nothing(within=1.0)  # past the reconcile grace (0.5 s)
            await sotw.expect_nothing(within=0.1)
            assert [sorted(change.names) for change in changes] == []
            resent = cached(relay.cache, count)
            assert {name: r.version for name, r in resent.items()} == held
            assert {name: r.digest for name, r in resent.items()} == digests
        finally:
            envoy.close()
            sotw.close()
            await revived.stop()
