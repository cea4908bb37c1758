"""The ``xds-relay`` command: run a relay, validate a config, list the config keys, run
the demo stack, or show a running relay's clients."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

from relay.config import ConfigError, RelayConfig, config_keys, load_config
from relay.logs import configure_logging
from relay.memory import exec_with_allocator
from relay.preflight import ports_in_use

_DESCRIPTION = """\
A caching xDS relay: one Delta-ADS stream to an origin control plane (or a
directory of resource files), many xDS clients (Envoy, gRPC) served from its
cache over ADS and the per-type discovery services, SotW and delta.
"""


_STATUS_DESCRIPTION = """\
Ask a running relay's admin API (/origins, /clients) which origins it follows
and which xDS clients it serves. First one line per origin: the server in
use, connected or not and since when, synced or not. Then one line per
stream (and per REST poller, protocol rest): node id, peer, protocol (and
worker, with --workers), per type whether the client is in sync with the
relay's cache (and the version it holds), and its last NACK. Per type:

  SYNCED    every resource ACKed at the version the cache has
  STALE     a response in flight, or the cache has moved on since: a push
            under way
  NOT SENT  cached resources the client subscribes to were not sent yet
  NACKED    the client rejected the latest response carrying a resource

--node ID shows every stream of that node in detail: when it connected and
last ACKed and NACKed, subscriptions, ACKs, the whole NACK message, each
resource's status and held and cached version.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xds-relay", description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version(),
                        help="print the relay's version (and Python's and gRPC's) and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(commands)
    _add_validate(commands)
    _add_keys(commands)
    _add_demo(commands)
    _add_status(commands)
    return parser


def _version() -> str:
    """``--version``: the installed package's version, and what it runs on."""
    from relay.version import build_info

    info = build_info()
    return f"xds-relay {info['version']} (Python {info['python']}, grpcio {info['grpc']})"


# what ``add_subparsers`` returns: each command below adds its parser to it
_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_run(commands: _Commands) -> None:
    run = commands.add_parser(
        "run", help="run one relay from a config file",
        description="Run one relay. It serves xDS on server.address, follows the origin at "
                    "upstream.address (or the files in upstream.files) and serves /ready, "
                    "/healthz, /clients, /origins, /config_dump, /config (the running config, "
                    "redacted), /logging (GET the log level, PUT ?level= to change it) and "
                    "/metrics on admin.address. SIGTERM "
                    "drains (readiness off, client streams closed spread over "
                    "server.drain_period) and exits 0; SIGINT stops at once. With --workers N, "
                    "N processes serve the clients on that port, fed by this one, which "
                    "follows the origin, serves admin and drains them all on SIGTERM. "
                    "'xds-relay keys' lists every config key with its default.")
    run.add_argument("--config", "-c", required=True, type=Path, metavar="FILE",
                     help="the relay's YAML config")
    run.add_argument("--node-id", metavar="ID",
                     help="override node.id from the config, e.g. with the pod's name so that "
                          "each replica is told apart by its origin")
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                     help="override logging.level from the config")
    run.add_argument("--workers", type=_worker_count, metavar="N",
                     help="override server.workers from the config: N processes serve "
                          "clients on server.address, fed over a local socket by one more "
                          "that follows the origin and serves admin (1: a single process)")


def _add_validate(commands: _Commands) -> None:
    validate = commands.add_parser(
        "validate", help="check a config file and exit",
        description="Check a config file. Prints 'ok' and exits 0 when it is valid; otherwise "
                    "prints each problem as FILE:LINE: FIELD: PROBLEM and exits 1.")
    validate.add_argument("--config", "-c", required=True, type=Path, metavar="FILE",
                          help="the YAML config to check")


def _add_keys(commands: _Commands) -> None:
    commands.add_parser(
        "keys", help="list every config key with its default and what it does",
        description="Print every config key, one per line, with its default and what it "
                    "does, read off the config schema itself. '(required)' marks a key the "
                    "config must set and '(none)' one left unset by default; durations and "
                    "sizes are written as in the config (5ms, 10s, 1MiB).")


def _add_demo(commands: _Commands) -> None:
    demo = commands.add_parser(
        "demo", help="run an origin and a relay on this machine, and show a client served",
        description="Start a local stack with no external dependency: an origin serving the "
                    "resource files in --resources, and a relay connected to it over a real "
                    "Delta-ADS stream. Prints where xDS clients connect and where metrics are "
                    "scraped, shows a client being served, and runs until Ctrl-C.")
    demo.add_argument("--resources", type=Path, default=Path("config/resources"),
                      help="directory of resource files (default: config/resources)")
    demo.add_argument("--port", type=int, default=18000, help="relay xDS port (18000)")
    demo.add_argument("--admin-port", type=int, default=19000, help="relay admin port (19000)")
    demo.add_argument("--origin-port", type=int, default=18001, help="origin xDS port (18001)")
    demo.add_argument("--once", action="store_true",
                      help="exit after showing the client served (for scripts and tests)")


def _add_status(commands: _Commands) -> None:
    from relay.status_command import DEFAULT_ADMIN, EXIT_CODES

    status = commands.add_parser(
        "status", help="show the clients a running relay serves, and whether they are in sync",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_CODES,
        description=_STATUS_DESCRIPTION)
    status.add_argument("--admin", default=DEFAULT_ADMIN, metavar="URL",
                        help=f"the relay's admin API, as admin.address serves it: http:// or "
                             f"https:// (with admin.tls) (default: {DEFAULT_ADMIN})")
    status.add_argument("--node", metavar="ID",
                        help="show every stream of the client with this node id in detail")
    status.add_argument("--token-file", type=Path, metavar="FILE",
                        help="a file holding the admin token (the relay's admin.token_file)")
    status.add_argument("--ca-file", type=Path, metavar="FILE",
                        help="PEM CA certificates to trust for an https:// admin API (default: "
                             "the system's)")
    status.add_argument("--timeout", type=_seconds, default=5.0, metavar="SECONDS",
                        help="how long to wait for the relay's answer (default: 5)")
    status.add_argument("--output", "-o", choices=["text", "json"], default="text",
                        help="text (default), or json: the relay's /clients answer, only the "
                             "streams of --node with it")
    status.add_argument("--check", action="store_true",
                        help="exit non-zero unless every client listed is synced in every "
                             "type: 4 when one NACKed, 5 when one is stale or not sent (see "
                             "below)")


def _seconds(text: str) -> float:
    """``--timeout``: a positive number of seconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return seconds


def _worker_count(text: str) -> int:
    """``--workers``, checked as ``server.workers`` is."""
    from relay.config.values import MAX_WORKERS

    if not text.isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"expected a number from 1 to {MAX_WORKERS}, "
                                         f"got {text!r}")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "keys":
            print("\n".join(str(key) for key in config_keys()))
            return 0
        if args.command == "validate":
            config = load_config(args.config)
            print(f"{args.config}: ok")
            for port in ports_in_use(config):  # valid, but it would not start here now
                print(f"xds-relay: warning: {port}", file=sys.stderr)
            return 0
        if args.command == "run":
            if argv is None:  # the command line (a call from Python keeps its process)
                exec_with_allocator()  # returns only if the allocator is chosen already
            config = load_config(args.config)
            if args.node_id:
                config = config.model_copy(update={
                    "node": config.node.model_copy(update={"id": args.node_id})})
            if args.workers is not None:
                config = config.model_copy(update={
                    "server": config.server.model_copy(update={"workers": args.workers})})
            busy = ports_in_use(config)
            if busy:
                print("\n".join(f"xds-relay: {port}" for port in busy), file=sys.stderr)
                return 1
            level = args.log_level or config.logging.level
            configure_logging(level, config.logging.format,
                              "hub" if config.server.workers > 1 else None)
            return asyncio.run(_run(config, level))
        if args.command == "status":
            from relay.status_command import run_status

            return run_status(args.admin, node=args.node, token_file=args.token_file,
                              ca_file=args.ca_file, timeout=args.timeout, output=args.output,
                              check=args.check)
        configure_logging("info")
        from relay.demo import run_demo

        return asyncio.run(run_demo(args.resources, args.port, args.admin_port,
                                    args.origin_port, once=args.once))
    except ConfigError as error:
        print(f"xds-relay: invalid config\n{error}", file=sys.stderr)
        return 1
    except OSError as error:  # a port in use, a file that cannot be read: the message says
        print(f"xds-relay: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


async def _run(config: RelayConfig, log_level: str) -> int:
    """Run until a signal (see ``serve_until_signalled``); with ``server.workers``
    above 1, as a hub and its workers (see :mod:`relay.workers`)."""
    if config.server.workers > 1:
        from relay.workers import run_hub

        return await run_hub(config, log_level)
    from relay.app import build_relay, serve_until_signalled, signal_queue
    from relay.runtime import tune_gc

    signals = signal_queue()
    relay = build_relay(config)
    try:
        await relay.start()
    except BaseException:
        # What did start (the xDS server, when admin's port is the one in use)
        # stops on this loop, not in gRPC's finalizer after the loop closed.
        await relay.stop(0)
        raise
    tune_gc()
    await serve_until_signalled(relay, signals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
