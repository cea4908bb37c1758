"""Drive gRPC's built-in xDS client from a separate process.

Run with the bootstrap in the environment (``GRPC_XDS_BOOTSTRAP_CONFIG`` holding the
JSON, or ``GRPC_XDS_BOOTSTRAP`` naming a file; the latter wins when both are set)::

    python -m tests.interop.xds_client_main --target xds:///svc --count 10 --interval 0.1
    python -m tests.interop.xds_client_main --target xds:///svc --stdin

Each RPC calls :data:`BACKEND_METHOD` (see ``tests.interop.grpc_xds.start_backend``) and
prints one JSON line to stdout::

    {"seq": 0, "ok": true, "backend": "A", "elapsed_ms": 1.3}
    {"seq": 1, "ok": false, "code": "DEADLINE_EXCEEDED", "details": "...", "elapsed_ms": 5001.2}

With ``--stdin`` one RPC is made per line read from stdin; ``quit`` or end of input
stops the process. Otherwise ``--count`` RPCs (0: until killed) are made ``--interval``
seconds apart.

The xDS client inside gRPC's C-core is process-global and its RPC API here is blocking,
which is why tests run it in a subprocess. This module imports nothing but grpc and the
standard library so that it starts quickly.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import grpc

#: The unary method every interop backend serves; the response body is the backend's label.
BACKEND_METHOD = "/relay.interop.Backend/Identify"


def call_once(stub: grpc.UnaryUnaryMultiCallable, seq: int, rpc_timeout: float,
              wait_for_ready: bool) -> dict[str, object]:
    """Make one RPC and describe its outcome as a JSON-ready dict."""
    start = time.monotonic()
    result: dict[str, object] = {"seq": seq}
    try:
        body = stub(b"", timeout=rpc_timeout, wait_for_ready=wait_for_ready)
    except grpc.RpcError as err:
        code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = err.details() if isinstance(err, grpc.Call) else str(err)
        result.update(ok=False, code=code.name, details=details)
    else:
        result.update(ok=True, backend=body.decode("utf-8", "replace"))
    result["elapsed_ms"] = round((time.monotonic() - start) * 1000, 2)
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="channel target, e.g. xds:///svc")
    parser.add_argument("--count", type=int, default=1, help="RPCs to make; 0 = forever")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between RPCs")
    parser.add_argument("--rpc-timeout", type=float, default=5.0, help="deadline per RPC")
    parser.add_argument("--wait-for-ready", action=argparse.BooleanOptionalAction,
                        default=True, help="queue RPCs until the channel has a config")
    parser.add_argument("--stdin", action="store_true",
                        help="make one RPC per line read from stdin instead of --count")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with grpc.insecure_channel(args.target) as channel:
        stub = channel.unary_unary(BACKEND_METHOD)  # no serializers: bytes in, bytes out

        def emit(seq: int) -> None:
            result = call_once(stub, seq, args.rpc_timeout, args.wait_for_ready)
            print(json.dumps(result), flush=True)

        seq = 0
        if args.stdin:
            while (line := sys.stdin.readline()) and line.strip() != "quit":
                emit(seq)
                seq += 1
        else:
            while args.count == 0 or seq < args.count:
                if seq:
                    time.sleep(args.interval)
                emit(seq)
                seq += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
