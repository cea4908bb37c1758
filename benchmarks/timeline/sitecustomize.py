"""Timeline tracer of :mod:`benchmarks.fanout_timeline`, loaded into a server
process by ``PYTHONPATH`` (Python imports ``sitecustomize`` at start-up).

Inactive unless ``FANOUT_TIMELINE`` names a file. Then, once the relay's (or
the bare server's) modules are imported, it wraps a few of their methods to
note when each step of a push happens, by ``time.monotonic()`` (one clock for
every process of the machine, so the clients' receipt times compare), and
the cyclic collector's runs; a thread writes the events to that file as JSON
twice a second. Measurement only: nothing of the relay imports this.

Events (name, monotonic seconds[, detail]):

* relay: ``read`` (an origin response read), ``parsed``, ``first_notify``
  (the first stream told of the change: the batch window's timer starts),
  ``applied`` (every stream told), ``window_end`` (the window's timer fired,
  with how many streams it wakes), ``woken`` (all woken), ``push`` (one
  stream builds its response, just before its write), ``request`` (one
  request, an ACK most often, handled);
* bare: ``change`` (the change command read), ``push`` (one stream's write);
* both: ``gc<generation>`` (a collection, with its milliseconds).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from typing import Any

OUT = os.environ.get("FANOUT_TIMELINE")
# per event, its times and details, as flat lists of numbers: a tuple per
# event would be a container the collector counts, and the tracer itself
# would set off the collections it reports
TIMES: dict[str, list[float]] = {}
DETAILS: dict[str, list[float]] = {}
now = time.monotonic


def note(event: str, detail: float = 0.0, at: float | None = None) -> None:
    if event not in TIMES:
        DETAILS[event] = []
        TIMES[event] = []
    TIMES[event].append(now() if at is None else at)
    DETAILS[event].append(detail)


def _write_out() -> None:
    assert OUT is not None
    while True:
        time.sleep(0.5)
        with open(OUT + ".tmp", "w") as out:
            # (copies: an event seen for the first time adds a key meanwhile)
            json.dump({"times": dict(TIMES), "details": dict(DETAILS)}, out)
        os.replace(OUT + ".tmp", OUT)


_gc_started = [0.0]


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_started[0] = now()
    else:
        note(f"gc{info['generation']}", round((now() - _gc_started[0]) * 1000, 3),
             _gc_started[0])


def _trace_relay() -> None:
    from relay.server import serving, streams
    from relay.upstream import client

    upstream = client.UpstreamClient
    parse = upstream._parse

    async def traced_parse(response: Any) -> Any:
        note("read")
        checked = await parse(response)
        note("parsed")
        return checked

    upstream._parse = staticmethod(traced_parse)  # type: ignore[method-assign]
    apply = upstream._apply

    def traced_apply(self: Any, *args: Any) -> None:
        note("applied")
        apply(self, *args)

    upstream._apply = traced_apply  # type: ignore[method-assign]
    context = serving.ServingContext
    wake_after_batch, end_batch = context.wake_after_batch, context._end_batch

    def traced_wake_after_batch(self: Any, stream: Any) -> None:
        if self._batch_timer is None:
            note("first_notify")
        wake_after_batch(self, stream)

    def traced_end_batch(self: Any) -> None:
        note("window_end", len(self._batched))
        end_batch(self)
        note("woken")

    context.wake_after_batch = traced_wake_after_batch  # type: ignore[method-assign]
    context._end_batch = traced_end_batch  # type: ignore[method-assign]
    stream_class = streams.DownstreamStream
    sent, handle_request = stream_class._sent, stream_class.handle_request

    def traced_sent(self: Any, plan: Any) -> bytes:
        note("push")
        return sent(self, plan)

    def traced_handle_request(self: Any, request: Any) -> Any:
        note("request")
        return handle_request(self, request)

    stream_class._sent = traced_sent  # type: ignore[method-assign]
    stream_class.handle_request = traced_handle_request  # type: ignore[method-assign]


def _trace_bare(bare: Any) -> None:
    server = bare.BareServer
    update = server.update

    def traced_update(self: Any, *args: Any) -> int:
        note("change")
        return update(self, *args)

    async def traced_serve(self: Any, requests: Any, context: Any) -> None:
        # BareServer._serve, with the push noted before each write
        stream = bare._Stream()
        self._streams.add(stream)
        reader = bare.asyncio.create_task(self._read(requests, stream))
        try:
            while (response := await stream.outbox.get()) is not None:
                note("push")
                await context.write(response)
        finally:
            reader.cancel()
            self._streams.discard(stream)

    server.update = traced_update  # type: ignore[method-assign]
    server._serve = traced_serve  # type: ignore[method-assign]


# the relay's modules, each with what it defines last (imported whole)
_RELAY_LAST = (("relay.server.streams", "_end_call"), ("relay.server.serving", "_take_one"),
               ("relay.upstream.client", "_one_pass"))


def _wait_and_trace() -> None:
    """Wrap the server's methods once its modules are imported whole (the
    methods are looked up at each call, so wrapping after start-up works)."""
    while True:
        time.sleep(0.001)
        modules = sys.modules
        # which server this is: ``python -m benchmarks.bare`` (whose module is
        # __main__; it imports the relay's modules too) or ``python -m relay``
        main = modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        name = getattr(spec, "name", "")
        if name == "benchmarks.bare":
            # (as soon as its class is: its server takes the handler at start)
            if hasattr(main, "BareServer"):
                _trace_bare(main)
                return
        elif name.startswith("relay") and all(hasattr(modules.get(module), attr)
                                              for module, attr in _RELAY_LAST):
            _trace_relay()
            return


if OUT:
    gc.callbacks.append(_gc_callback)
    threading.Thread(target=_write_out, daemon=True).start()
    threading.Thread(target=_wait_and_trace, daemon=True).start()
