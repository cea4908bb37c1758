"""TLS benchmark: what TLS and mutual TLS cost the relay's fan-out and connection storms.

The runs of :mod:`benchmarks.fanout` (a warm server, N streams connecting
at once, then updates fanned out to all; see it for what each figure
means), in one session, against fresh servers of each mode, alternating:

* ``plaintext``: the relay as :mod:`benchmarks.fanout` runs it, the baseline;
* ``tls``: the same with ``server.tls`` (certificate and key, no client CA);
* ``mtls``: with ``server.tls.client_ca_file`` too (every client presents a
  certificate) and ``server.authorization.allow: ["spiffe://bench/ns/*/sa/*"]``,
  so that every stream's certificate identity is checked;
* ``bare-tls``, ``bare-tls-default``: the bare ``grpc.aio`` server of
  :mod:`benchmarks.bare` over TLS with the relay's certificate and key, with
  the relay's gRPC options and with gRPC's defaults: the baselines of ``tls``
  (what TLS costs any ``grpc.aio`` server, and what is the relay's own);
* ``bare``, ``bare-default``: the same in plaintext, the baselines of
  ``plaintext``.

One CA (``trustme``, :mod:`tests.certs`) signs every certificate, ECDSA
P-256: the relay's (``relay.test``, 127.0.0.1), and for mTLS one client
certificate per client worker process (``spiffe://bench/ns/bench/sa/client-<i>``;
its streams share it, which costs the relay nothing it would save: it caches
no verification or identity across connections) and one for the stream
that keeps the resource cached. The client workers get the CA, and their
certificate and key, as PEM in their arguments.

Every client stream has a connection of its own (a local subchannel pool per
channel) and, over TLS, makes a full handshake: gRPC resumes TLS sessions
only for channels given a session cache (``grpc.ssl_session_cache``,
``grpc.experimental.session_cache``), and these are given none (checked
with grpc 1.85: the server's ``ssl_session_reused`` is false for every
connection without one, true from the second with one).

Before the runs, a check that authorization runs in ``mtls``: a client whose
identity the allow list does not match is refused (PERMISSION_DENIED).

Each figure is reported as min and median over runs for each mode, then as
ratios of like with like (min over min, median over median): TLS and mTLS
over the bare TLS servers, TLS / plaintext, mTLS / plaintext, mTLS / TLS,
plaintext relay over the bare servers, bare TLS / bare. Beyond
:mod:`benchmarks.fanout`'s table, to show where the cost goes: the server's
CPU on its main thread (Python's event loop; gRPC's ``event_engine`` threads
do the handshakes, HTTP/2 and encryption, and have the rest), and the client
workers' CPU during the storm (the handshakes' client side, which on a small
machine competes with the relay for the same cores).

The relay runs from ``--relay-src`` (default: this checkout), as in
:mod:`benchmarks.fanout`; ``--before-src DIR`` adds the mode ``tls-before``,
``tls`` with the relay of another tree (an export of an earlier commit):
before and after in one invocation, alternating.

Usage (about 5 minutes per N on 2 cores)::

    .venv/bin/python -m benchmarks.tls [--streams 1000,2000] [--runs 3] [--rounds 5]
        [--workers 2] [--relay-src DIR] [--before-src DIR]
        [--modes bare,bare-default,bare-tls,bare-tls-default,plaintext,tls,mtls]

Writes tables to stdout and JSON to ``benchmarks/results/tls.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import grpc

from benchmarks.fanout import Server, bare_server, measure, relay_server
from benchmarks.processes import ClientTLS, new_streams, subscription
from benchmarks.report import revision, server_tables, summarize_servers, write_results
from tests.certs import Authority

MODES = ("bare", "bare-default", "bare-tls", "bare-tls-default", "plaintext", "tls", "mtls",
         "tls-before")
MODE_LABELS = {"bare": "bare", "bare-default": "bare default", "bare-tls": "bare TLS",
               "bare-tls-default": "bare TLS default", "plaintext": "plaintext",
               "tls": "TLS", "mtls": "mTLS", "tls-before": "TLS before"}
# (numerator, denominator) of each ratio reported
RATIOS = (("tls", "bare-tls"), ("tls", "bare-tls-default"), ("mtls", "bare-tls"),
          ("mtls", "bare-tls-default"), ("tls", "plaintext"), ("mtls", "plaintext"),
          ("mtls", "tls"), ("plaintext", "bare"), ("plaintext", "bare-default"),
          ("bare-tls", "bare"), ("tls-before", "bare-tls"),
          ("tls-before", "bare-tls-default"), ("tls", "tls-before"))
ALLOW = "spiffe://bench/ns/*/sa/*"
# label of each figure, in the order reported
FIGURES = {
    "storm_all_ms": "storm: all streams answered (ms)",
    "storm_median_stream_ms": "storm: median stream answered (ms)",
    "storm_cpu_ms": "storm: server CPU (ms)",
    "storm_main_thread_cpu_ms": "storm: server CPU, main thread (ms)",
    "storm_client_cpu_ms": "storm: client workers' CPU (ms)",
    "update_all_ms": "update reaches all streams (ms)",
    "update_median_stream_ms": "update reaches median stream (ms)",
    "cpu_ms_per_update": "server CPU per update (ms)",
    "main_thread_cpu_ms_per_update": "server CPU per update, main thread (ms)",
    "rss_kib_per_stream": "RSS per idle stream (KiB)",
}


class Certificates:
    """The session's CA, the relay's certificate, and client certificates
    (issued when first asked for), in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.ca = Authority(directory)
        self.relay = self.ca.relay_leaf()
        self._clients: dict[str, ClientTLS] = {}

    def server_tls(self) -> ClientTLS:
        """What a TLS client needs: the CA."""
        return ClientTLS(self.ca.cert_pem)

    def client(self, name: str, spiffe_id: str | None = None) -> ClientTLS:
        """What an mTLS client ``name`` needs: the CA, its certificate and key
        (identity ``spiffe://bench/ns/bench/sa/<name>`` unless given)."""
        if name not in self._clients:
            leaf = self.ca.issue(name, spiffe_id=spiffe_id or f"spiffe://bench/ns/bench/sa/{name}")
            self._clients[name] = ClientTLS(self.ca.cert_pem, leaf.cert_pem, leaf.key_pem)
        return self._clients[name]

    def server_extra(self, mutual: bool) -> str:
        """The relay's ``server`` keys for TLS (``mutual``: and mTLS with ``ALLOW``)."""
        files = {"cert_file": str(self.relay.cert_file), "key_file": str(self.relay.key_file)}
        if not mutual:
            return f"tls: {json.dumps(files)}"
        files["client_ca_file"] = str(self.ca.cert_file)
        return f"tls: {json.dumps(files)}, authorization: {{allow: {json.dumps([ALLOW])}}}"


def starters(certificates: Certificates, src: Path | None = None, before: Path | None = None
             ) -> dict[str, Callable[[], AbstractAsyncContextManager[Server]]]:
    """How to start a fresh server of each mode (the relay's from ``src``,
    ``tls-before``'s from ``before``)."""
    plain = certificates.server_tls()
    files = (certificates.relay.cert_file, certificates.relay.key_file)
    return {
        "bare": bare_server,
        "bare-default": functools.partial(bare_server, "bare-default", "default"),
        "bare-tls": functools.partial(bare_server, "bare-tls", "relay", files,
                                      lambda name: plain),
        "bare-tls-default": functools.partial(bare_server, "bare-tls-default", "default",
                                              files, lambda name: plain),
        "plaintext": functools.partial(relay_server, "plaintext", src=src),
        "tls": functools.partial(relay_server, "tls", certificates.server_extra(False),
                                 lambda name: plain, src=src),
        "mtls": functools.partial(relay_server, "mtls", certificates.server_extra(True),
                                  certificates.client, src=src),
        "tls-before": functools.partial(relay_server, "tls-before",
                                        certificates.server_extra(False), lambda name: plain,
                                        src=before),
    }


async def check_authorization(certificates: Certificates, src: Path | None = None) -> None:
    """That ``mtls`` authorizes: an allowed client is answered, another refused."""
    stranger = certificates.client("stranger", "spiffe://elsewhere/ns/bench/sa/stranger")
    async with starters(certificates, src)["mtls"]() as server:
        for tls, allowed in ((certificates.client("keeper"), True), (stranger, False)):
            channels, calls = new_streams(server.target, 1, tls=tls)
            try:
                # the refusal may come before the subscription's write is done
                await calls[0].write(subscription(0))
                await calls[0].read()
                refused = None
            except grpc.aio.AioRpcError as error:
                refused = error.code()
            finally:
                await channels[0].close()
            if refused != (None if allowed else grpc.StatusCode.PERMISSION_DENIED):
                raise RuntimeError(f"mtls authorization: {'allowed' if allowed else 'stranger'}"
                                   f" client got {refused or 'an answer'}")


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per figure, each mode's spread and the ratios in ``RATIOS`` (of modes run)."""
    return summarize_servers(runs, list(FIGURES), RATIOS)


def tables(summary: dict[str, Any], modes: Sequence[str]) -> str:
    """Each mode's min and median, then the ratios (min / median)."""
    return server_tables(summary, FIGURES, modes, MODE_LABELS)


async def run_all(args: argparse.Namespace, modes: Sequence[str]) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as directory:
        certificates = Certificates(Path(directory))
        start = starters(certificates, args.relay_src, args.before_src)
        if "mtls" in modes:
            await check_authorization(certificates, args.relay_src)
        for n in (int(x) for x in args.streams.split(",")):
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
            for run in range(args.runs):
                # rotate the order, to spread the machine's noise over the modes
                for mode in [*modes[run % len(modes):], *modes[:run % len(modes)]]:
                    result = await measure(start[mode], n, args.rounds, args.workers,
                                           args.streams_per_connection)
                    runs[mode].append(result)
                    print(json.dumps({"streams": n, "mode": mode, "run": run, **result}),
                          flush=True)
            results.append({"streams": n, "runs": runs, "summary": summarize(runs)})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1000", help="values of N, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs per mode")
    parser.add_argument("--rounds", type=int, default=5, help="updates per run")
    parser.add_argument("--workers", type=int, default=2, help="client worker processes")
    parser.add_argument("--streams-per-connection", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"a subset of {','.join(MODES)}")
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the tree the relay runs from (default: this checkout)")
    parser.add_argument("--before-src", type=Path,
                        help="another tree, run as the mode tls-before (added to --modes): "
                             "before and after in one invocation, alternating")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/tls.json"))
    args = parser.parse_args()
    asked = args.modes.split(",") + (["tls-before"] if args.before_src else [])
    modes = [m for m in MODES if m in asked]
    if unknown := set(asked) - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    if "tls-before" in modes and args.before_src is None:
        parser.error("tls-before runs the tree given by --before-src")
    args.relay_src = args.relay_src.resolve()
    commit = revision(args.relay_src)
    started = time.monotonic()
    results = asyncio.run(run_all(args, modes))
    elapsed = time.monotonic() - started
    for result in results:
        loads = [run["load"] for runs in result["runs"].values() for run in runs]
        print(f"\n{result['streams']} streams, {args.runs} runs per mode, relay at {commit} "
              f"({args.relay_src}), 1-minute load {min(loads):.1f}-{max(loads):.1f}:\n"
              f"{tables(result['summary'], modes)}")
    print(f"\n{elapsed:.0f} s in all")
    write_results(args.out, "benchmarks.tls", runs=args.runs, rounds=args.rounds,
                  workers=args.workers, allow=[ALLOW], elapsed_s=round(elapsed),
                  relay_src=str(args.relay_src), revision=commit,
                  before_src=None if args.before_src is None else str(args.before_src),
                  results=results)


if __name__ == "__main__":
    main()
