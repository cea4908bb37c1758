"""The file source: a directory of resource files as the relay's origin.

With ``upstream.files: DIR`` the relay serves what the YAML and JSON files
under ``DIR`` describe, much like Envoy's filesystem subscriptions. Each
resource is written the way Envoy's own YAML is: ``"@type"`` plus the
message's fields in the proto3 JSON mapping. A file holds one resource, a list
of them, ``resources: [...]`` (the shape of a ``DiscoveryResponse``), or
several YAML documents separated by ``---``.

A resource's version is a hash of its deterministic encoding, so an edit gives
only the edited resources a new version, and two relays (or one relay before
and after a restart) serving the same files agree on every version.

A file that cannot be used is reported (log, metric, the return value of
:meth:`FileSource.load`) and the content it last had when it was good keeps
being served: a typo while editing never takes resources away from clients.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Typed configs that resource files commonly embed in ``Any`` fields. ParseDict
# resolves an Any's "@type" in the default descriptor pool, which only holds
# messages whose generated modules have been imported.
import envoy.extensions.access_loggers.file.v3.file_pb2
import envoy.extensions.access_loggers.stream.v3.stream_pb2
import envoy.extensions.filters.http.router.v3.router_pb2
import envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2
import envoy.extensions.transport_sockets.tls.v3.tls_pb2
import envoy.extensions.upstreams.http.v3.http_protocol_options_pb2  # noqa: F401
import yaml
from google.protobuf import any_pb2, json_format, message

from relay.cache import ResourceCache
from relay.errors import RelayError
from relay.resource import CachedResource
from relay.telemetry import Metrics
from relay.xds_types import PUSH_ORDER, TYPE_PREFIX, message_class, short_name
from relay.yaml_nodes import duplicate_keys, locate, mapping_value, node_line, sequence_items

log = logging.getLogger("relay.sources.files")

#: File name endings the source reads; anything else in the directory is ignored.
SUFFIXES = frozenset({".yaml", ".yml", ".json"})
#: ``upstream.poll_interval`` when not configured: seconds between rescans.
DEFAULT_POLL_INTERVAL = 1.0

# Keys a ``DiscoveryResponse``-shaped file may have next to ``resources``. Their
# values are ignored: versions come from content, the type from each "@type".
_RESPONSE_KEYS = frozenset({"resources", "version_info", "type_url"})

# Where a ParseError says the bad value is: `... at "Cluster.load_assignment"`
# or `... at Cluster.endpoints[0]...`, and the unknown key it names, if any.
_ERROR_AT = re.compile(r' at "?([A-Za-z_][\w.\[\]]*?)"?\.*$')
_UNKNOWN_FIELD = re.compile(r'has no field named "([^"]+)"')
_INDEXED = re.compile(r"^([^\[]*)((?:\[\d+\])*)$")

#: What a scan found: every resource file and its (mtime_ns, size, inode).
Signature = dict[Path, tuple[int, int, int]]
_Key = tuple[str, str]  # (type URL, name)


@dataclass(frozen=True)
class FileError:
    """Why a file, or one resource in it, cannot be served."""

    path: Path
    line: int | None
    message: str

    def __str__(self) -> str:
        where = str(self.path) if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"


def resource_name(msg: message.Message) -> str:
    """The name an xDS resource goes by: ``name``, or ``cluster_name`` for endpoints.

    "" when the message has neither field or leaves it empty.
    """
    fields = msg.DESCRIPTOR.fields_by_name
    for field_name in ("name", "cluster_name"):
        field = fields.get(field_name)
        if field is not None and field.type == field.TYPE_STRING and not field.is_repeated:
            return str(getattr(msg, field_name))
    return ""


# -- reading one file ---------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """Safe YAML, read closer to the way Envoy reads it.

    Timestamp-looking scalars stay strings (proto3 JSON wants RFC 3339 strings
    for ``Timestamp``, and Envoy's YAML has no timestamp type). A key given
    twice is an error too: see :func:`_yaml_documents`.
    """


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _Bad(RelayError):
    """One problem in a file, raised while reading it and turned into a FileError."""

    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


@dataclass(frozen=True)
class _Parsed:
    """A resource read from a file, and the line it starts on."""

    resource: CachedResource
    line: int | None

    @property
    def key(self) -> _Key:
        return self.resource.type_url, self.resource.name


@dataclass(frozen=True)
class _FileResult:
    """What reading one file gave: its resources, or why it cannot be used."""

    resources: tuple[_Parsed, ...] = ()
    errors: tuple[FileError, ...] = ()


def _yaml_documents(text: str) -> Iterator[tuple[yaml.Node, Any]]:
    """Each document of a YAML stream as its node tree (for line numbers) and its data.

    A key given twice in one mapping is an error (a ``MarkedYAMLError`` at the
    repeat) rather than a silent override.
    """
    loader = _Loader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            assert node is not None  # check_node() said there is one
            # Before construction, which flattens `<<` merges into the tree.
            duplicates = duplicate_keys(node)
            if duplicates:
                first = duplicates[0]
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {first.key!r} (first on line {first.first_line})",
                    first.node.start_mark)
            yield node, loader.construct_document(node)
    finally:
        loader.dispose()


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (``json`` keeps the last silently)."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _resource_items(node: yaml.Node | None, data: Any) -> list[tuple[Any, yaml.Node | None]]:
    """The resources of one document, each with its node (None for JSON)."""
    if data is None:  # an empty document, e.g. after a trailing "---"
        return []
    if isinstance(data, list):
        return list(zip(data, sequence_items(node, len(data)), strict=True))
    if isinstance(data, dict) and "@type" in data:
        return [(data, node)]
    if isinstance(data, dict) and "resources" in data:
        extra = sorted(str(key) for key in data if key not in _RESPONSE_KEYS)
        if extra:
            raise _Bad(node_line(node), f"unexpected key {extra[0]!r} next to 'resources'")
        items, items_node = data["resources"], mapping_value(node, "resources")
        if items is None:
            return []
        if not isinstance(items, list):
            raise _Bad(node_line(items_node or node), "'resources' must be a list")
        return list(zip(items, sequence_items(items_node, len(items)), strict=True))
    raise _Bad(node_line(node), "expected a resource (a mapping with '@type'), a list of "
                                "them, or 'resources: [...]'")


def _error_line(node: yaml.Node | None, error: str) -> int | None:
    """The line of the value a ParseError complains about, as deep as it can be found."""
    if node is None:  # JSON: no node tree
        return None
    found = _ERROR_AT.search(error)
    # The first segment is the message type, not a key.
    segments = found.group(1).split(".")[1:] if found else []
    unknown = _UNKNOWN_FIELD.search(error)
    if unknown:
        segments.append(unknown.group(1))
    path: list[str | int] = []
    for segment in segments:
        parts = _INDEXED.match(segment)
        if parts is None:
            break
        path.append(parts.group(1))
        path += [int(index) for index in re.findall(r"\d+", parts.group(2))]
    return node_line(locate(node, path).node)


def _canonicalize_any(msg: message.Message) -> None:
    """Re-encode every nested ``Any`` deterministically.

    ParseDict packs an Any with a plain ``SerializeToString``, in which map
    entries may come out in an order that differs between processes. The
    version hash must not depend on that, so packed bodies are re-encoded.
    """
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for item in value.values():
                    _canonicalize_message(item)
        elif field.is_repeated:
            for item in value:
                _canonicalize_message(item)
        else:
            _canonicalize_message(value)


def _canonicalize_message(msg: message.Message) -> None:
    if not isinstance(msg, any_pb2.Any):
        _canonicalize_any(msg)
        return
    cls = message_class(msg.type_url)
    if cls is None:  # ParseDict resolved it, so this only guards against surprises
        return
    inner = cls.FromString(msg.value)
    _canonicalize_any(inner)
    msg.value = inner.SerializeToString(deterministic=True)


def _parse_resource(item: Any, node: yaml.Node | None = None) -> CachedResource:
    """One resource in Envoy's YAML/JSON form as a cache entry; raises ``_Bad``."""
    line = node_line(node)
    if not isinstance(item, dict):
        raise _Bad(line, f"a resource must be a mapping with '@type', not {type(item).__name__}")
    type_url = item.get("@type")
    if type_url is None:
        raise _Bad(line, "resource has no '@type'")
    if not isinstance(type_url, str) or "/" not in type_url:
        raise _Bad(line, f"'@type' must be a type URL such as "
                         f"{TYPE_PREFIX}envoy.config.cluster.v3.Cluster, not {type_url!r}")
    cls = message_class(type_url)
    if cls is None:
        raise _Bad(line, f"unknown @type {type_url!r}")
    # Clients subscribe with the googleapis prefix, whatever prefix the file used.
    type_url = TYPE_PREFIX + type_url.rsplit("/", 1)[1]
    msg = cls()
    try:
        json_format.ParseDict({k: v for k, v in item.items() if k != "@type"}, msg)
    except json_format.ParseError as exc:
        # ParseError texts can run over several lines (a list of valid fields);
        # the first says what is wrong, and logs want one line per error.
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _Bad(_error_line(node, text), f"{short_name(type_url)}: {text}") from exc
    name = resource_name(msg)
    if not name:
        field = "cluster_name" if "cluster_name" in msg.DESCRIPTOR.fields_by_name else "name"
        raise _Bad(line, f"{short_name(type_url)} has no {field}")
    _canonicalize_any(msg)
    body = msg.SerializeToString(deterministic=True)
    version = hashlib.sha256(body).hexdigest()[:16]
    return CachedResource.from_message(type_url, any_pb2.Any(type_url=type_url, value=body),
                                       name, version)


def _parse_file(path: Path) -> _FileResult:
    """Read one resource file. Any error makes the whole file unusable."""
    try:
        documents = _documents(path, _read_text(path))
    except _Bad as bad:
        return _FileResult(errors=(FileError(path, bad.line, bad.message),))
    return _file_resources(path, documents)


def _read_text(path: Path) -> str:
    """A file's text; raises ``_Bad`` when it cannot be read or is not UTF-8."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise _Bad(None, f"cannot read: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8-sig")  # tolerate a BOM, as editors on Windows write one
    except UnicodeDecodeError as exc:
        raise _Bad(None, f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def _documents(path: Path, text: str) -> list[tuple[yaml.Node | None, Any]]:
    """The documents of a file's text, JSON or YAML by its suffix, each with its
    node tree (None for JSON); raises ``_Bad`` when the text does not parse."""
    if path.suffix.lower() == ".json":
        try:
            return [(None, json.loads(text, object_pairs_hook=_json_object))] \
                if text.strip() else []
        except json.JSONDecodeError as exc:
            raise _Bad(exc.lineno, f"invalid JSON: {exc.msg}") from None
        except ValueError as exc:  # a duplicate key
            raise _Bad(None, f"invalid JSON: {exc}") from None
    try:
        return list(_yaml_documents(text))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise _Bad(mark.line + 1 if mark is not None else None,
                   f"invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise _Bad(None, f"invalid YAML: {exc}") from None


def _file_resources(path: Path, documents: list[tuple[yaml.Node | None, Any]]) -> _FileResult:
    """The resources of a file's documents, or every problem found in them
    (a resource that does not parse, a name given twice)."""
    resources: list[_Parsed] = []
    errors: list[FileError] = []
    first_line: dict[_Key, int | None] = {}
    for node, data in documents:
        try:
            items = _resource_items(node, data)
        except _Bad as bad:
            errors.append(FileError(path, bad.line, bad.message))
            continue
        for item, item_node in items:
            line = node_line(item_node)
            try:
                resource = _parse_resource(item, item_node)
            except _Bad as bad:
                errors.append(FileError(path, bad.line, bad.message))
                continue
            parsed = _Parsed(resource, line)
            if parsed.key in first_line:
                earlier = first_line[parsed.key]
                where = f"line {earlier}" if earlier is not None else "earlier in this file"
                errors.append(FileError(path, line, f"duplicate {short_name(resource.type_url)} "
                                                    f"{resource.name!r} (first on {where})"))
                continue
            first_line[parsed.key] = line
            resources.append(parsed)
    if errors:
        return _FileResult(errors=tuple(errors))
    return _FileResult(resources=tuple(resources))


def _wanted(file_name: str) -> bool:
    """A resource file, not a hidden file or an editor's backup, swap or lock file."""
    if file_name.startswith(".") or file_name.endswith(("~", ".swp")):
        return False
    return os.path.splitext(file_name)[1].lower() in SUFFIXES


def _raise(exc: OSError) -> None:
    raise exc


# -- the source ---------------------------------------------------------------


class FileSource:
    """Serves the resource files under ``directory`` through ``cache``.

    Call :meth:`load` once before serving, then run :meth:`run` as a task to
    follow edits. Every load makes the files the complete state of every type
    they use (and of every well-known type, possibly empty), so clients asking
    for a name no file defines are told it does not exist.
    """

    def __init__(self, directory: Path, cache: ResourceCache,
                 poll_interval: float = DEFAULT_POLL_INTERVAL,
                 metrics: Metrics | None = None) -> None:
        self.directory = Path(directory)
        self.cache = cache
        self.poll_interval = poll_interval
        self.metrics = metrics
        # The scan the cache reflects; None until the first load (or after the
        # directory could not be listed), so that run() loads at once.
        self._loaded: Signature | None = None
        # Per file, the resources it serves: its last good content.
        self._served: dict[Path, tuple[_Parsed, ...]] = {}
        self._errors: tuple[FileError, ...] = ()
        # Types ever served; a type stays listed so that its last resource's
        # removal reaches the cache.
        self._types_seen: set[str] = set(PUSH_ORDER)

    @property
    def errors(self) -> list[FileError]:
        """The problems of the last load (empty when every file is good)."""
        return list(self._errors)

    def scan(self) -> Signature:
        """Every resource file under the directory, sorted, with what identifies its content.

        The inode is part of it because editors and Kubernetes volume updates
        replace a file by renaming a new one over it, which may keep the old
        size and even the old mtime. Raises OSError if the directory (or one
        under it) cannot be listed: an unreadable directory is not an empty one.
        """
        found: Signature = {}
        for root, dirs, files in os.walk(self.directory, onerror=_raise):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for file_name in files:
                if not _wanted(file_name):
                    continue
                path = Path(root, file_name)
                try:
                    info = path.stat()
                except OSError:  # removed since listed, or a dangling symlink
                    continue
                if stat.S_ISREG(info.st_mode):
                    found[path] = (info.st_mtime_ns, info.st_size, info.st_ino)
        return dict(sorted(found.items()))

    def load(self) -> list[FileError]:
        """Scan and read every file once, and make the result what the cache serves.

        Returns the problems found (also logged and counted); files with a
        problem keep serving their last good content.
        """
        try:
            scanned, results = self._read()
        except OSError as exc:
            return self._directory_failed(exc)
        return self._apply(scanned, results)

    async def run(self) -> None:
        """Poll every ``poll_interval`` seconds and load whenever a file changed.

        Runs until cancelled. Unchanged polls only list and stat the files;
        listing and reading happen in a worker thread so the event loop keeps
        serving meanwhile.
        """
        while True:
            try:
                scanned = await asyncio.to_thread(self.scan)
                if scanned != self._loaded:
                    results = await asyncio.to_thread(self._parse_all, scanned)
                    self._apply(scanned, results)
            except OSError as exc:
                self._directory_failed(exc)
            except Exception:
                # A bug here must not stop the relay following its files; it
                # keeps serving the last state and tries again next poll.
                log.exception("loading %s failed", self.directory)
            await asyncio.sleep(self.poll_interval)

    # -- internals ---------------------------------------------------------

    def _read(self) -> tuple[Signature, dict[Path, _FileResult]]:
        # Stat before reading: a file changed while being read then differs
        # from the recorded scan, and the next poll reads it again.
        scanned = self.scan()
        return scanned, self._parse_all(scanned)

    @staticmethod
    def _parse_all(scanned: Signature) -> dict[Path, _FileResult]:
        return {path: _parse_file(path) for path in scanned}

    def _directory_failed(self, exc: OSError) -> list[FileError]:
        error = FileError(self.directory, None,
                          f"cannot list the directory: {exc.strerror or exc}")
        # Keep serving what was loaded; reload everything once it is readable.
        self._loaded = None
        self._report([error], previous=set(self._errors), reread=set())
        self._errors = (error,)
        return [error]

    def _apply(self, scanned: Signature, results: dict[Path, _FileResult]) -> list[FileError]:
        """Settle duplicates between files, then push every type into the cache."""
        bad: dict[Path, list[FileError]] = {
            path: list(result.errors) for path, result in results.items() if result.errors}
        keeper = self._settle_duplicates(scanned, results, bad)
        # A file falling back to its old content only holds names it held
        # before, so keeper[] never drops anything; it guards against serving
        # two resources under one name all the same.
        served = {path: kept for path in scanned
                  if (kept := tuple(p for p in self._contribution(path, results, bad)
                                    if keeper[p.key] == path))}
        errors = tuple(sorted((e for errs in bad.values() for e in errs),
                              key=lambda e: (e.path, e.line or 0, e.message)))
        previous_scan = self._loaded or {}
        self._report(errors, previous=set(self._errors),
                     reread={path for path in scanned if scanned[path] != previous_scan.get(path)})
        total, changed = self._push(served)
        self._report_mended(scanned, served, bad, total)

        first = self._loaded is None and not self._served
        self._served = served
        self._errors = errors
        self._loaded = scanned
        if changed or first:
            log.info("loaded %d resources from %d files in %s (%d changed, %d errors)",
                     total, len(scanned), self.directory, changed, len(errors))
        return list(errors)

    def _report_mended(self, scanned: Signature, served: dict[Path, tuple[_Parsed, ...]],
                       bad: dict[Path, list[FileError]], total: int) -> None:
        """Log each file (or the directory) that had a problem at the last load
        and has none now: what it serves again. A bad file that was removed
        is not mended: its removal is what the load logs."""
        for path in sorted({error.path for error in self._errors} - set(bad)):
            if path in scanned:
                log.info("%s mended: serving %d resources again", path,
                         len(served.get(path, ())))
            elif path == self.directory:
                log.info("%s mended: serving %d resources again", path, total)

    def _contribution(self, path: Path, results: dict[Path, _FileResult],
                      bad: dict[Path, list[FileError]]) -> tuple[_Parsed, ...]:
        """What a file offers this load: what it now holds, or its last good
        content while it is bad."""
        return self._served.get(path, ()) if path in bad else results[path].resources

    def _settle_duplicates(self, scanned: Signature, results: dict[Path, _FileResult],
                           bad: dict[Path, list[FileError]]) -> dict[_Key, Path]:
        """Which file keeps each name several files define. A file that loses
        a name is added to ``bad`` with why (it falls back to its old content)."""
        # Who served each name before this load: that file keeps it.
        holder_before = {parsed.key: path for path, served in self._served.items()
                         for parsed in served}
        while True:
            keeper: dict[_Key, Path] = {}
            claims: dict[_Key, list[tuple[Path, _Parsed]]] = {}
            for path in scanned:
                for parsed in self._contribution(path, results, bad):
                    claims.setdefault(parsed.key, []).append((path, parsed))
            to_holder: dict[Path, list[FileError]] = {}
            to_first: dict[Path, list[FileError]] = {}
            for key, claimants in claims.items():
                paths = [path for path, _ in claimants]
                before = holder_before.get(key)
                keeper[key] = before if before is not None and before in paths else paths[0]
                for path, parsed in claimants:
                    if path == keeper[key] or path in bad:
                        continue
                    losers = to_holder if keeper[key] == before else to_first
                    losers.setdefault(path, []).append(FileError(
                        path, parsed.line, f"duplicate {short_name(key[0])} {key[1]!r}: "
                                           f"already defined in {keeper[key]}"))
            # Settle conflicts with the files that held a name first: a file
            # that loses one falls back to its old content, which may free
            # names that others newly claimed and would otherwise lose.
            newly_bad = to_holder or to_first
            if not newly_bad:
                return keeper
            bad.update(newly_bad)

    def _push(self, served: dict[Path, tuple[_Parsed, ...]]) -> tuple[int, int]:
        """Make ``served`` the whole state of every type ever served: how many
        resources that is, and how many of them changed."""
        by_type: dict[str, list[CachedResource]] = {}
        for parsed_list in served.values():
            for parsed in parsed_list:
                by_type.setdefault(parsed.resource.type_url, []).append(parsed.resource)
        self._types_seen.update(by_type)
        changed = 0
        # Well-known types in make-before-break order, then the others sorted.
        for type_url in (*PUSH_ORDER, *sorted(self._types_seen - set(PUSH_ORDER))):
            resources = sorted(by_type.get(type_url, ()), key=lambda r: r.name)
            changed += len(self.cache.replace_type(type_url, resources))
        return sum(len(v) for v in by_type.values()), changed

    def _report(self, errors: Sequence[FileError], previous: set[FileError],
                reread: set[Path]) -> None:
        """Log and count each error once: when it first appears, or its file changed."""
        for error in errors:
            if error in previous and error.path not in reread:
                continue
            log.warning("%s", error)
            if self.metrics is not None:
                self.metrics.source_errors.add(1, {"source": "files"})
