"""gRPC's Node.js xDS client (``@grpc/grpc-js-xds``) gets its configuration through the relay.

The same scenario as ``test_grpc_xds_through_relay.py`` with a second xDS client we did not
write: origin -> relay -> ``node tests/interop/node/client.js`` (see that file for its
stdin/stdout line protocol). The Node dependencies are not vendored; install them with
``npm ci --prefix tests/interop/node`` (exact versions in ``package-lock.json``). Without
``node`` or that ``node_modules`` the test skips.

Environment
-----------
``@grpc/grpc-js-xds`` 1.14.1 with ``@grpc/grpc-js`` 1.14.7 (the xds package's peer range is
``~1.14.5``) on Node 20. ``require('@grpc/grpc-js-xds').register()`` installs the
``xds:`` resolver; no experimental flag is needed. The bootstrap is read from
``GRPC_XDS_BOOTSTRAP`` (a file path) or, only when that is unset,
``GRPC_XDS_BOOTSTRAP_CONFIG`` (the JSON) -- the same two variables and precedence as
C-core, so :func:`tests.interop.grpc_xds.client_env` and ``bootstrap_json`` serve both.
``GRPC_TRACE=xds_client`` (or ``GRPC_NODE_TRACE``) with ``GRPC_VERBOSITY=DEBUG`` traces every
discovery request on stderr (``NodeXdsClient(trace=True)``). The resources that satisfy
C-core (locality and weight on endpoints, router filter last) satisfy it too; an endpoint
group without a locality is NACKed with ``endpoints[0].locality unset``.

Observed protocol (through the relay; traced with ``GRPC_TRACE=xds_client``)
-------------------------------------------------------------------------
SotW ADS only (``StreamAggregatedResources``; the relay counts it as ``protocol="sotw"``),
one stream, opened on the channel's first RPC::

    -> LDS [svc]              ver=""        nonce=""   node: id, cluster, locality,
                                                       user_agent_name "gRPC Node Pure JS",
                                                       user_agent_version 1.14.1,
                                                       client_features envoy.lb.does_not_
                                                       support_overprovisioning
    <- LDS ver=ff00... nonce=1
    -> LDS [svc]              ver="ff00..." nonce="1"  (ACK)
    -> RDS [interop-route]    ver=""        nonce=""
    -> RDS [interop-route]    ver=...       nonce="2"  (ACK)
    -> CDS [interop-cluster]  ver=""        nonce=""
    -> CDS [interop-cluster]  ver=...       nonce="3"  (ACK)
    -> EDS [interop-cluster]  ver=""        nonce=""
    -> EDS [interop-cluster]  ver=...       nonce="4"  (ACK)
    ... endpoint change at the origin:  <- EDS nonce=5  -> EDS ver=... nonce="5" (ACK)

* Strictly sequential like C-core: LDS -> RDS -> CDS -> EDS, each subscribed only after the
  response it depends on; every request names its resources (LDS and CDS never wildcard);
  ``node`` only in the first request of the stream.
* Every response is ACKed (same names, the response's ``version_info`` and ``nonce``),
  before the watchers are notified. A NACK repeats the *last accepted* version, carries
  the rejected nonce and ``error_detail`` with code 14 (UNAVAILABLE) and the validation
  message; the old endpoints stay in use.
* Unlike C-core, closing the channel unsubscribes: grpc-js-xds sends, per type
  (order LDS, RDS, EDS, CDS), a request with **empty** ``resource_names`` and the last
  version/nonce, then ends the stream. On a stream whose first request named resources this
  means "nothing" (not the legacy wildcard); the relay must read it that way, and with
  ``linger: 0s`` it then unsubscribes from the origin -- asserted below.
* No TLS to the xDS server: grpc-js-xds 1.14.1 (the newest on npm as of this writing)
  accepts only ``google_default`` and ``insecure`` in ``xds_servers[].channel_creds``
  (``SUPPORTED_CHANNEL_CREDS_TYPES`` in ``src/xds-bootstrap.ts``; ``XdsSingleServerClient``
  in ``src/xds-client.ts`` builds its channel from those two only), not gRFC A65's ``tls``.
  A bootstrap with only ``tls`` fails validation ("must contain at least one entry with a
  type in [google_default,insecure]"); the resolver does not surface that error and
  ``wait_for_ready`` RPCs hang until their deadline without ever connecting. So the TLS and
  mTLS variants exist for C-core only (``test_grpc_xds_through_relay.py``);
  :func:`test_node_xds_client_cannot_use_tls_channel_creds_yet` notices an upgrade that
  adds them.
* Timings (loopback): ``require('@grpc/grpc-js-xds')`` takes ~1.4 s warm (about 20 s on a
  cold page cache); the first RPC, including the whole xDS exchange, ~200-300 ms; after an
  EDS push RPCs reach the new backend within ~15 ms.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Self

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relay.xds_types import CLUSTER, ENDPOINT, LISTENER, ROUTE, WILDCARD
from tests.harness import ScriptedOrigin, eventually, running_stack
from tests.interop import grpc_xds
from tests.interop.grpc_xds import (
    DEFAULT_CLUSTER,
    DEFAULT_ROUTE,
    ClientProcess,
    RpcResult,
    bootstrap_json,
    start_backend,
    tls_channel_creds,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = REPO_ROOT / "tests" / "interop" / "node"
CLIENT_JS = NODE_DIR / "client.js"
INSTALL_HINT = "npm ci --prefix tests/interop/node"
#: Exits 1 with a one-line reason unless both packages resolve to their entry files.
RESOLVE_PROBE = """
try { for (const p of ['@grpc/grpc-js', '@grpc/grpc-js-xds']) require.resolve(p); }
catch (err) { console.error(err.message.split('\\n')[0]); process.exit(1); }
"""
#: How grpc-js-xds's own bootstrap validation takes each bootstrap of a JSON list read
#: from stdin: a JSON list of null (accepted) or the error message.
BOOTSTRAP_PROBE = """
const { validateBootstrapConfig } = require('@grpc/grpc-js-xds/build/src/xds-bootstrap');
const check = (bootstrap) => {
  try { validateBootstrapConfig(bootstrap); return null; } catch (err) { return err.message; }
};
const bootstraps = JSON.parse(require('node:fs').readFileSync(0, 'utf8'));
console.log(JSON.stringify(bootstraps.map(check)));
"""
#: Loading grpc-js-xds takes ~1.4 s warm but can take ~20 s from a cold page cache.
STARTUP_TIMEOUT = 45.0


def node_or_skip() -> str:
    """The ``node`` executable, or skip the test with the reason it cannot run.

    Besides ``node_modules`` existing, both packages must resolve to their entry files: a
    partial tree (say one whose ``build/`` directories a ``.gitignore`` kept out of git)
    skips with the install hint instead of failing inside the child.
    """
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH; the Node.js xDS interop test needs Node >= 18.3")
    if not (NODE_DIR / "node_modules").is_dir():
        pytest.skip(f"{NODE_DIR / 'node_modules'} is missing; install it with `{INSTALL_HINT}`")
    probe = subprocess.run([node, "-e", RESOLVE_PROBE], cwd=NODE_DIR, capture_output=True,
                           text=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"{NODE_DIR / 'node_modules'} is incomplete ({probe.stderr.strip()}); "
                    f"reinstall it with `{INSTALL_HINT}`")
    return node


class NodeXdsClient(ClientProcess):
    """``node tests/interop/node/client.js`` with a given bootstrap.

    Use as ``async with NodeXdsClient(node, "xds:///svc", bootstrap) as client:``; entering
    waits until the child has loaded grpc-js-xds, and each :meth:`call` makes one RPC.
    """

    backend_timeout = 10.0

    def __init__(self, node: str, target: str, bootstrap: str, *,
                 rpc_timeout: float = 5.0, trace: bool = False) -> None:
        super().__init__(target, bootstrap, rpc_timeout=rpc_timeout, trace=trace)
        self.node = node

    async def start(self) -> Self:
        """Spawn the child and wait for its ``{"ready": true}`` line."""
        await self._spawn(self.node, str(CLIENT_JS),
                          "--target", self.target, "--rpc-timeout", str(self.rpc_timeout))
        ready = await self._read_line(STARTUP_TIMEOUT)
        if ready != {"ready": True}:
            raise RuntimeError(f"unexpected first line from client.js: {ready!r}")
        return self

    async def _command(self, command: str) -> dict[str, object]:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise RuntimeError("NodeXdsClient not started")
        proc.stdin.write(f"{command}\n".encode())
        await proc.stdin.drain()
        return await self._read_line(self.rpc_timeout + 10.0)

    async def _read_line(self, timeout: float) -> dict[str, object]:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout)
        if not line:
            await asyncio.sleep(0.1)  # let the stderr reader catch the last words
            raise RuntimeError(f"client.js exited ({proc.returncode}); stderr:\n{self.stderr}")
        data: dict[str, object] = json.loads(line)
        return data

    async def call(self) -> RpcResult:
        """Make one RPC through the child's channel."""
        result = RpcResult.from_line(json.dumps(await self._command("call")))
        self.results.append(result)
        return result

    async def close_channel(self) -> None:
        """Close the child's channel (it unsubscribes) but keep the process running."""
        answer = await self._command("close")
        assert answer == {"closed": True}, answer


def downstream_counts(registry: CollectorRegistry, metric: str) -> Counter[tuple[str, str]]:
    """``xds_relay_downstream_{metric}_total`` by (variant, short type name)."""
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name == f"xds_relay_downstream_{metric}_total":
                key = (sample.labels.get("protocol", ""), sample.labels.get("type", ""))
                counts[key] += int(sample.value)
    return counts


async def test_node_xds_client_reaches_backend_and_follows_endpoint_change() -> None:
    node = node_or_skip()
    backend_a, port_a = await start_backend("A")
    backend_b, port_b = await start_backend("B")
    origin = ScriptedOrigin()
    origin.set(*grpc_xds.xds_messages("svc", port_a))
    try:
        async with running_stack(origin) as stack:
            bootstrap = bootstrap_json(f"127.0.0.1:{stack.relay.xds_port}", "node-interop")
            async with NodeXdsClient(node, "xds:///svc", bootstrap) as client:
                await client.follows_endpoint_move(origin, port_b)

                # The client ACKed every response over SotW (the EDS push too) and
                # rejected nothing.
                acks = downstream_counts(stack.relay.registry, "acks")
                nacks = downstream_counts(stack.relay.registry, "nacks")
                assert not nacks, f"{nacks}\n{client.stderr[-3000:]}"
                assert {protocol for protocol, _ in acks} == {"sotw"}, acks
                assert acks[("sotw", "Listener")] >= 1, acks
                assert acks[("sotw", "RouteConfiguration")] >= 1, acks
                assert acks[("sotw", "Cluster")] >= 1, acks
                assert acks[("sotw", "ClusterLoadAssignment")] >= 2, acks

                # The relay asked the origin for each resource exactly once, on one stream.
                assert len(origin.streams) == 1
                subscribed = sorted((r.type_url, n) for r in origin.subscription_requests()
                                    for n in r.resource_names_subscribe)
                wanted = [(CLUSTER, DEFAULT_CLUSTER), (ENDPOINT, DEFAULT_CLUSTER),
                          (LISTENER, "svc"), (ROUTE, DEFAULT_ROUTE)]
                assert subscribed == wanted

                # Closing the channel sends SotW requests with empty resource_names. The
                # relay must take them as "unsubscribe all", not as a wildcard, and (with
                # linger 0s) drop its origin subscriptions.
                await client.close_channel()

                def unsubscribed() -> list[tuple[str, str]]:
                    return sorted((r.type_url, n) for r in origin.all_requests()
                                  for n in r.resource_names_unsubscribe)

                await eventually(lambda: unsubscribed() == wanted)
                assert not any(WILDCARD in r.resource_names_subscribe
                               for r in origin.all_requests())
                assert not downstream_counts(stack.relay.registry, "nacks")
    finally:
        await backend_a.stop(0)
        await backend_b.stop(0)


def test_node_xds_client_cannot_use_tls_channel_creds_yet(tmp_path: Path) -> None:
    """grpc-js-xds has no ``tls`` channel_creds (see the module docstring), hence no TLS or
    mTLS variant of the test above. When this fails, the installed grpc-js-xds accepts them:
    add those variants (as in ``test_grpc_xds_through_relay.py``) and drop this test."""
    node = node_or_skip()
    creds = tls_channel_creds(tmp_path / "ca.crt", tmp_path / "client.crt",
                              tmp_path / "client.key")
    bootstraps = [json.loads(bootstrap_json("127.0.0.1:1", "probe")),
                  json.loads(bootstrap_json("127.0.0.1:1", "probe", channel_creds=creds))]
    probe = subprocess.run([node, "-e", BOOTSTRAP_PROBE], input=json.dumps(bootstraps),
                           cwd=NODE_DIR, capture_output=True, text=True, timeout=30,
                           check=True)
    plaintext, tls = json.loads(probe.stdout)
    assert plaintext is None, plaintext  # the probe itself works
    assert tls is not None and "type in [google_default,insecure]" in tls, tls
