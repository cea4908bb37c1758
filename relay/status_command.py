"""``xds-relay status``: which clients a running relay serves, and whether they are in sync.

It asks the relay's admin API (``/clients``, see
:func:`relay.server.status.client_summary`) and prints one line per
connected stream, or with ``--node`` every stream of one node in detail. The
formatting is pure (the ``/clients`` answer in, lines out); only
:func:`fetch_clients` does I/O.

Exit codes: :data:`OK`, :data:`UNREACHABLE`, :data:`NOT_FOUND`, and with
``--check`` :data:`NACKING` and :data:`NOT_SYNCED` (argparse's usage errors
are 2).
"""

from __future__ import annotations

import http.client
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from relay.errors import RelayError
from relay.server.status import NACKED, NOT_SENT, STALE, SYNCED
from relay.xds_types import PER_TYPE_SERVICES, push_rank, short_name

#: The admin API's address when admin.address is left at its default.
DEFAULT_ADMIN = "http://127.0.0.1:19000"

#: Exit codes.
OK = 0              # answered (with --check: every type of every client listed is synced)
UNREACHABLE = 1     # no usable answer: unreachable, TLS, HTTP error (401 too), not /clients
USAGE = 2           # a bad argument (argparse's own code)
NOT_FOUND = 3       # --node: no connected stream has that node id
NACKING = 4         # --check: a client's last response of some type was NACKed
NOT_SYNCED = 5      # --check: nothing NACKed, but a push is under way (stale or not_sent)

EXIT_CODES = f"""\
exit status:
  {OK}  answered; with --check, every type of every client listed is synced
  {UNREACHABLE}  the relay could not be asked: unreachable, no answer in --timeout, TLS
     failed, HTTP error (401: pass --token-file), or not a relay's /clients answer;
     with --check, also when a worker of --workers did not answer
  {USAGE}  bad arguments
  {NOT_FOUND}  --node ID: no connected client has that node id
  {NACKING}  --check: some client NACKed the last response of a type
  {NOT_SYNCED}  --check: no NACK, but some client is stale or not sent what the cache
     has (a push under way: try again shortly)
"""

# Column text is cut to this many characters in the one-line summary.
_VERSION_WIDTH = 16
_MESSAGE_WIDTH = 60
# --node: the names listed in full up to this many; beyond, a count.
_NAMES_LISTED = 8
# --node: resource rows shown in full up to this many; beyond, only the unsynced.
_ROWS_LISTED = 20

_SYNC_LABELS = {SYNCED: "SYNCED", STALE: "STALE", NACKED: "NACKED", NOT_SENT: "NOT SENT"}
_NOTHING = "-"


class StatusError(RelayError):
    """Why the relay could not be asked (the message is one line for stderr)."""

    def __init__(self, message: str, code: int = UNREACHABLE) -> None:
        super().__init__(message)
        self.code = code
        self.not_found = False  # the admin API answered 404: it has no such path


# -- asking the relay ------------------------------------------------------------------


def admin_url(text: str) -> str:
    """The admin API's base URL: ``http://`` is assumed when no scheme is given."""
    url = text.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise StatusError(f"--admin {text!r}: expected an http:// or https:// URL",
                          USAGE)
    return url


def read_token(path: Path) -> str:
    """The bearer token in ``path`` (surrounding whitespace dropped, as the relay does)."""
    try:
        token = path.read_bytes().strip()
    except OSError as error:
        raise StatusError(f"cannot read --token-file {path}: "
                          f"{error.strerror or error}") from None
    if not token:
        raise StatusError(f"--token-file {path} is empty")
    # Latin-1 puts the file's bytes on the wire unchanged.
    return token.decode("latin-1")


def fetch_clients(admin: str, token: str | None = None, ca_file: Path | None = None,
                  timeout: float = 5.0) -> dict[str, Any]:
    """The relay's ``/clients`` answer. Raises :class:`StatusError` saying why not.

    ``admin`` is a URL from :func:`admin_url`. The request goes straight to
    it: the admin API is a local or port-forwarded address, so
    ``HTTP(S)_PROXY`` are not used.
    """
    url = admin + "/clients"
    body = _get(admin, "/clients", token, ca_file, timeout)
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("clients"), list):
        raise StatusError(f"{url} did not answer with the relay's client list: is {admin} "
                          "a relay's admin address?")
    return answer


def fetch_origins(admin: str, token: str | None = None, ca_file: Path | None = None,
                  timeout: float = 5.0) -> list[dict[str, Any]] | None:
    """The relay's ``/origins`` answer: each origin's state (None: a relay
    older than ``/origins``, or one whose answer is not a list of them).
    Raises :class:`StatusError` as :func:`fetch_clients` does."""
    try:
        body = _get(admin, "/origins", token, ca_file, timeout)
    except StatusError as error:
        if error.not_found:
            return None
        raise
    try:
        origins = json.loads(body).get("origins")
    except (ValueError, AttributeError):
        return None
    if not isinstance(origins, list):
        return None
    return [origin for origin in origins if isinstance(origin, dict)]


def _get(admin: str, path: str, token: str | None, ca_file: Path | None,
         timeout: float) -> bytes:
    """The body of the admin API's answer to GET ``path``; :class:`StatusError` if none."""
    url = admin + path
    headers = {"Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https://"):
        try:
            context = ssl.create_default_context(
                cafile=str(ca_file) if ca_file is not None else None)
        except (OSError, ssl.SSLError) as error:
            raise StatusError(f"cannot use --ca-file {ca_file}: "
                              f"{getattr(error, 'strerror', None) or error}") from None
        handlers.append(urllib.request.HTTPSHandler(context=context))
    elif ca_file is not None:
        raise StatusError(f"--ca-file is for an https:// admin address, not {admin}", USAGE)
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(urllib.request.Request(url, headers=headers),
                         timeout=timeout) as reply:
            return bytes(reply.read())
    except urllib.error.HTTPError as error:
        raise _http_error(error, url, token is not None) from None
    except urllib.error.URLError as error:
        raise StatusError(f"cannot reach the relay's admin API at {admin}: "
                          f"{_reason(error.reason)}") from None
    except TimeoutError:
        raise StatusError(f"no answer from {admin} within {timeout:g}s "
                          "(--timeout)") from None
    except http.client.RemoteDisconnected:
        hint = " (with admin.tls, use an https:// --admin)" if url.startswith("http://") else ""
        raise StatusError(f"{admin} closed the connection without answering{hint}") from None
    except (OSError, ValueError) as error:  # a reset connection, a malformed header
        raise StatusError(f"asking {url} failed: {error}") from None


def _http_error(error: urllib.error.HTTPError, url: str, sent_token: bool) -> StatusError:
    if error.code == 401:
        if sent_token:
            return StatusError(f"{url}: 401, the token in --token-file is not the relay's "
                               "(admin.token_file)")
        return StatusError(f"{url}: 401, the relay's admin API needs a token: pass "
                           "--token-file (the file admin.token_file names)")
    try:
        detail = error.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        detail = []
    said = f": {_printable(detail[0])}" if detail else ""
    failed = StatusError(f"{url}: HTTP {error.code}{said}")
    failed.not_found = error.code == 404
    return failed


def _reason(reason: object) -> str:
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (f"TLS: {reason.verify_message or reason} (--ca-file: the CA that signed "
                "admin.tls's certificate)")
    if isinstance(reason, ssl.SSLError):
        hint = (" (no TLS there: without admin.tls, use an http:// --admin)"
                if reason.reason == "WRONG_VERSION_NUMBER" else "")
        return f"TLS: {reason.reason or reason}{hint}"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is the relay running? --admin gives its admin.address)"
    if isinstance(reason, TimeoutError):
        return "timed out (--timeout)"
    if isinstance(reason, OSError):
        return reason.strerror or str(reason)
    return str(reason)


# -- what the answer says ---------------------------------------------------------------


def streams_of(answer: Mapping[str, Any], node_id: str | None) -> list[dict[str, Any]]:
    """The answer's clients (every stream, or those of ``node_id``), by node id and peer."""
    clients = [c for c in answer.get("clients", []) if isinstance(c, dict)]
    if node_id is not None:
        clients = [c for c in clients if c.get("node_id") == node_id]
    return sorted(clients, key=lambda c: (str(c.get("node_id", "")), str(c.get("peer", "")),
                                          str(c.get("worker", ""))))


def unanswered_workers(answer: Mapping[str, Any]) -> list[int]:
    """With ``--workers``: the workers that did not answer (their clients are not listed)."""
    return [w.get("worker", -1) for w in answer.get("workers", [])
            if isinstance(w, dict) and not w.get("answered", True)]


def check_code(clients: Iterable[Mapping[str, Any]]) -> int:
    """``--check``'s exit code for these clients: :data:`NACKING` if a type of
    one is nacked, else :data:`NOT_SYNCED` if one is otherwise not synced
    (stale, not_sent, or not reported by an older relay), else :data:`OK`."""
    states = {state.get("sync") for client in clients for state in _types(client).values()}
    if NACKED in states:
        return NACKING
    if states - {SYNCED}:
        return NOT_SYNCED
    return OK


# per-type services by their short names (ADS has none: its streams show just the protocol)
_ABBREVIATIONS = {service.service: service.abbreviation for service in PER_TYPE_SERVICES}


def protocol_of(client: Mapping[str, Any]) -> str:
    """``sotw`` or ``delta`` for ADS; with the service's short name for a
    per-type service's stream (``sotw/CDS``)."""
    protocol = str(client.get("protocol", ""))
    service = _ABBREVIATIONS.get(str(client.get("service", "")))
    return protocol if service is None else f"{protocol}/{service}"


def origin_lines(origins: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    """One line per origin after a header: its name, the server in use (and
    whether that is a fallback), connected or not and since when (UTC, and
    how long ago from ``now``), whether synced, and its reconnects.

    With node groups each line is one group's stream to one origin (its name
    is ``ORIGIN/GROUP ID``): GROUP is the group's key values and its clients,
    and SYNCED says ``snapshot`` while a restored snapshot serves it."""
    grouped = any(isinstance(origin.get("group"), Mapping) for origin in origins)
    rows = [["ORIGIN", *(["GROUP"] if grouped else []), "SERVER", "STATE", "SYNCED",
             "RECONNECTS"]]
    for origin in origins:
        server = _printable(str(origin.get("server", "")))
        if origin.get("fallback"):
            server += " (fallback)"
        connected = bool(origin.get("connected"))
        since = origin.get("connected_since" if connected else "disconnected_since")
        state = "CONNECTED" if connected else "DISCONNECTED"
        if isinstance(since, int | float):
            state += f" since {_when(since, now)}"
        synced = "yes" if origin.get("synced") else \
            "snapshot" if origin.get("snapshot") else "no"
        rows.append([_printable(str(origin.get("origin", ""))),
                     *([_group_cell(origin.get("group"), True)] if grouped else []),
                     server, state, synced, str(origin.get("reconnects", _NOTHING))])
    return _table(rows)


def _group_cell(group: object, clients: bool = False) -> str:
    """A node group as a cell: its key's values (``-``: not grouped); with
    ``clients``, how many streams it serves."""
    if not isinstance(group, Mapping):
        return _NOTHING
    key = group.get("key")
    values = [str(value) for value in key] if isinstance(key, list) else []
    text = _cut(_printable(",".join(values)) or '""', _MESSAGE_WIDTH)
    if clients and isinstance(group.get("clients"), int):
        count = group["clients"]
        text += f" ({count} client{'s' if count != 1 else ''})"
    return text


def _when(stamp: float, now: float) -> str:
    """A Unix time as UTC, with how long before ``now`` it was."""
    at = datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{at} ({_age(now - stamp)} ago)"


def _age(seconds: float) -> str:
    """``45s``, ``3m20s``, ``2h05m``, ``3d04h``."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def summary_lines(clients: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per stream after a header: node, peer, protocol, (worker),
    (with node groups, GROUP: its group's key values), one column per type
    (its sync state and the version the client holds) and the last NACK.
    ``-``: nothing (the stream does not subscribe to the type)."""
    if not clients:
        return ["no clients are connected"]
    type_urls = sorted({t for client in clients for t in _types(client)},
                       key=lambda t: (push_rank(t), t))
    workers = any("worker" in client for client in clients)
    grouped = any("group" in client for client in clients)
    header = ["NODE", "PEER", "PROTOCOL", *(["WORKER"] if workers else []),
              *(["GROUP"] if grouped else []), *(short_name(t) for t in type_urls),
              "LAST NACK"]
    rows = [header]
    for client in clients:
        types = _types(client)
        row = [_printable(str(client.get("node_id", ""))) or '""',
               _printable(str(client.get("peer", ""))), protocol_of(client)]
        if workers:
            row.append(str(client.get("worker", _NOTHING)))
        if grouped:
            row.append(_group_cell(client.get("group")))
        row += [_type_cell(types[t]) if t in types else _NOTHING for t in type_urls]
        row.append(_last_nack_cell(types))
        rows.append(row)
    return _table(rows)


def detail_lines(clients: Sequence[Mapping[str, Any]], now: float | None = None
                 ) -> list[str]:
    """Every stream of one node in full: when it connected and last ACKed and
    NACKed (with ``now``, how long ago), per type its sync state,
    subscription, ACKed version (SotW) or nonce (delta), response in flight,
    last NACK with its whole message, and each resource's status, held and
    cached versions."""
    now = time.time() if now is None else now
    lines: list[str] = []
    for client in clients:
        if lines:
            lines.append("")
        head = (f"node {_printable(str(client.get('node_id', '')))}  "
                f"peer {_printable(str(client.get('peer', '')))}  "
                f"protocol {protocol_of(client)}")
        if "worker" in client:
            head += f"  worker {client['worker']}"
        group = client.get("group")
        if isinstance(group, Mapping):
            head += f"  group {_printable(str(group.get('id', '')))} ({_group_cell(group)})"
        lines.append(head)
        times = [f"{what} {_when(client[key], now)}" for key, what in (
            ("connected_since", "connected" if client.get("protocol") != "rest"
             else "first poll"), ("acked_at", "last ACK"), ("nacked_at", "last NACK"))
            if isinstance(client.get(key), int | float)]
        if times:
            lines.append(f"  {'; '.join(times)}")
        types = _types(client)
        if not types:
            lines.append("  (no type subscribed yet)")
        delta = client.get("protocol") == "delta"
        for type_url in sorted(types, key=lambda t: (push_rank(t), t)):
            lines += _type_detail(type_url, types[type_url], delta)
    return lines


def _type_detail(type_url: str, state: Mapping[str, Any], delta: bool) -> list[str]:
    lines = [f"  {short_name(type_url)}: {_sync_label(state)}  ({type_url})"]
    subscribed = [str(n) for n in state.get("subscribed", [])]
    total = state.get("subscribed_count", len(subscribed))  # a REST poller's: all it polls
    what = []
    if state.get("wildcard"):
        what.append("* (wildcard)")
    if subscribed:
        count = f"{total} name{'s' if total != 1 else ''}"
        if total <= _NAMES_LISTED:
            count += ": " + ", ".join(_printable(n) for n in subscribed)
        what.append(count)
    lines.append(f"    subscribed: {' + '.join(what) if what else 'nothing'}")
    acked = state.get("acked")
    if acked is None:
        lines.append("    acked: nothing yet")
    else:
        lines.append(f"    acked: {'nonce' if delta else 'version'} {_printable(str(acked))}")
    in_flight = state.get("in_flight")
    lines.append(f"    in flight: {_NOTHING if in_flight is None else 'nonce ' + str(in_flight)}")
    nack = state.get("last_nack")
    if isinstance(nack, dict):
        rejected = ""
        if "version" in nack:
            rejected = f", version {_printable(str(nack['version']))}"
        elif nack.get("versions"):
            pairs = [f"{_printable(str(n))} {_printable(str(v))}"
                     for n, v in sorted(nack["versions"].items())]
            shown = pairs[:_NAMES_LISTED] + (
                [f"{len(pairs) - _NAMES_LISTED} more"] if len(pairs) > _NAMES_LISTED else [])
            rejected = f", rejected {', '.join(shown)}"
        message = str(nack.get("message", "")).splitlines() or [""]
        lines.append(f"    last NACK: nonce {_printable(str(nack.get('nonce', '')))}{rejected}: "
                     f"{_printable(message[0])}")
        lines += [f"      {_printable(line)}" for line in message[1:]]
    else:
        lines.append("    last NACK: none")
    lines += _resource_rows(state)
    return lines


def _resource_rows(state: Mapping[str, Any]) -> list[str]:
    """A table of the type's resources: every one when few, else the unsynced."""
    versions: Mapping[str, str] = state.get("versions", {})
    unsynced: Mapping[str, Mapping[str, Any]] = state.get("unsynced", {})
    names = set(versions) | set(unsynced)
    if not state.get("wildcard"):
        names |= set(state.get("subscribed", []))
    if not names:
        return []
    listed = sorted(names) if len(names) <= _ROWS_LISTED else sorted(unsynced)
    rows = [["RESOURCE", "STATUS", "VERSION", "CACHED", ""]]
    for name in listed:
        entry = unsynced.get(name)
        if entry is None:
            # Not unsynced: ACKED at the version the cache has (or not
            # reported, by a relay older than ``sync``).
            held = versions.get(name, "")
            status = "acked" if "sync" in state and name in versions else "?"
            rows.append([_printable(name), status, _printable(held) or _NOTHING,
                         _printable(held) or _NOTHING, ""])
            continue
        held = str(entry.get("version", ""))
        if "cached_version" in entry:
            cached = entry["cached_version"]
            cached_text = "(not cached)" if cached is None else _printable(str(cached))
        else:
            cached_text = _printable(held) or _NOTHING
        notes = []
        if "name" in entry:
            notes.append(f"alias of {_printable(str(entry['name']))}")
        if "error" in entry:
            notes.append(f"origin error: {_printable(str(entry['error']))}")
        rows.append([_printable(name), str(entry.get("status", "?")),
                     _printable(held) or _NOTHING, cached_text, "; ".join(notes)])
    lines = ["    " + line for line in _table(rows)]
    if len(listed) < len(names):
        rest = len(names) - len(listed)
        lines.append(f"    ... and {rest} more, ACKED at the version the cache has")
    return lines


# -- cells and tables ---------------------------------------------------------------


def _types(client: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    types = client.get("types", {})
    return {str(t): s for t, s in types.items() if isinstance(s, dict)} \
        if isinstance(types, dict) else {}


def _sync_label(state: Mapping[str, Any]) -> str:
    sync = state.get("sync")
    return _SYNC_LABELS.get(sync, "UNKNOWN") if isinstance(sync, str) else "UNKNOWN"


def _type_cell(state: Mapping[str, Any]) -> str:
    """``SYNCED (v3)``: the sync state and the version the client holds of
    every resource of the type (``N versions`` when they differ)."""
    versions = {str(v) for v in state.get("versions", {}).values()}
    label = _sync_label(state)
    if not versions:
        return label
    if len(versions) == 1:
        return f"{label} ({_cut(_printable(versions.pop()), _VERSION_WIDTH)})"
    return f"{label} ({len(versions)} versions)"


def latest_nack(client: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """The type URL and ``last_nack`` of a stream's latest NACK (None: it
    NACKed nothing): of a type still nacked if any, the one with the highest
    nonce (the relay's nonces count up). The console shows the same."""
    nacks = [(state.get("sync") == NACKED, _stamp(state.get("nacked_at")),
              _nonce_order(state["last_nack"].get("nonce")), type_url, state["last_nack"])
             for type_url, state in _types(client).items()
             if isinstance(state.get("last_nack"), dict)]
    if not nacks:
        return None
    *_, type_url, nack = max(nacks, key=lambda n: n[:4])
    return type_url, nack


def _stamp(value: object) -> float:
    """A Unix time from /clients (when the relay says it), for ordering."""
    return float(value) if isinstance(value, int | float) else -1.0


def _last_nack_cell(types: Mapping[str, Mapping[str, Any]]) -> str:
    """The type and message of the stream's latest NACK (see :func:`latest_nack`)."""
    latest = latest_nack({"types": types})
    if latest is None:
        return _NOTHING
    type_url, nack = latest
    message = " ".join(str(nack.get("message", "")).split())
    return f"{short_name(type_url)}: {_cut(_printable(message), _MESSAGE_WIDTH)}"


def _nonce_order(nonce: object) -> tuple[int, str]:
    text = str(nonce)
    return (int(text), "") if text.isdigit() else (-1, text)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _printable(text: str) -> str:
    """``text`` with control characters escaped: node ids and messages come
    from clients, and must not drive the operator's terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows in columns two spaces apart, the last one unpadded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
                      + [row[-1]]).rstrip() for row in rows]


# -- the command --------------------------------------------------------------------------


def run_status(admin: str = DEFAULT_ADMIN, *, node: str | None = None,
               token_file: Path | None = None, ca_file: Path | None = None,
               timeout: float = 5.0, output: str = "text", check: bool = False,
               out: TextIO | None = None, err: TextIO | None = None,
               now: Callable[[], float] = time.time) -> int:
    """``xds-relay status``: ask, print, and return the exit code (see :data:`EXIT_CODES`)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        url = admin_url(admin)
        token = read_token(token_file) if token_file is not None else None
        answer = fetch_clients(url, token, ca_file, timeout)
        origins = fetch_origins(url, token, ca_file, timeout) if node is None else None
    except StatusError as error:
        print(f"xds-relay status: {error}", file=err)
        return error.code
    clients = streams_of(answer, node)
    silent = unanswered_workers(answer)
    for worker in silent:
        print(f"xds-relay status: worker {worker} did not answer; its clients are not listed",
              file=err)
    if node is not None and not clients:
        count = len(answer["clients"])
        print(f"xds-relay status: no connected client has node id {node!r} "
              f"({count} client{'s' if count != 1 else ''} connected)", file=err)
        return NOT_FOUND
    if output == "json":
        shown: dict[str, Any] = {"clients": clients}
        if "workers" in answer:
            shown["workers"] = answer["workers"]
        if origins is not None:
            shown["origins"] = origins
        print(json.dumps(shown, indent=2), file=out)
    elif node is not None:
        print("\n".join(detail_lines(clients, now())), file=out)
    else:
        lines = [*origin_lines(origins, now()), ""] if origins else []
        print("\n".join([*lines, *summary_lines(clients)]), file=out)
    if not check:
        return OK
    if silent:
        return UNREACHABLE
    return check_code(clients)
