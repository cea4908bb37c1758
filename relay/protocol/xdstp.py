"""xDS resource names of the ``xdstp://`` form (xDS TP1), without I/O.

A federated client names resources as URIs::

    xdstp://AUTHORITY/TYPE/ID?CONTEXT_PARAMS

* ``AUTHORITY`` says who serves the name (the relay routes on it, see
  :func:`authority_of`); it may be empty;
* ``TYPE`` is the resource's fully qualified protobuf type, the type URL
  without ``type.googleapis.com/``: it must be the type of the request;
* ``ID`` is one or more path segments (``/`` separates them);
* ``CONTEXT_PARAMS`` are ``KEY=VALUE`` pairs joined by ``&``.

A name whose last ID segment is ``*`` is a *glob collection*: every resource
of that type, authority and parent path with the same context parameters
(``xdstp://auth/T/pool/m1`` is a member of ``xdstp://auth/T/pool/*``).

Two spellings of one name are the same name: the relay compares names in
their **canonical form**, which is the URI

* with its context parameters sorted by key (so ``?b=1&a=2`` is ``?a=2&b=1``,
  and no ``?`` when there are none);
* with each component percent-decoded and encoded again one way: a character
  the component may hold as it is (RFC 3986: letters, digits, ``-._~``,
  ``!$&'()*+,;=:@``, and in context parameters ``/?`` too) is written as it
  is, except the delimiters of the component (``&`` and ``=`` in a key,
  ``&`` in a value); anything else is ``%XX`` of its UTF-8 bytes, hex in
  capitals (``%7e`` is ``~``, ``%c3%a9`` is ``%C3%A9``).

A raw character no URI may hold (a space, ``"<>\\^`{|}``, a control
character, anything outside ASCII) makes a name malformed: it must come
percent-encoded, so that no two clients can mean different bytes by one
name. Processing directives (``#...``) belong to locators, not names, and
are refused too. Names that do not start with ``xdstp:`` are classic names,
which nothing here touches.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache

from relay.protocol.limits import shown
from relay.protocol.outcome import ProtocolError

__all__ = ["GLOB", "PREFIX", "GlobRefused", "XdstpError", "XdstpName", "authority_of",
           "canonical", "collection_of", "in_request", "is_glob", "is_xdstp", "parse",
           "type_in_request", "xdstp_among"]

#: What every xdstp name starts with (and no classic name may).
PREFIX = "xdstp:"
_SCHEME = "xdstp://"
#: The last ID segment of a glob collection.
GLOB = "*"

# RFC 3986 character classes.
_UNRESERVED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
_SUB_DELIMS = "!$&'()*+,;="
# What each component may hold as it is, besides "%XX".
_AUTHORITY_RAW = frozenset(_UNRESERVED + _SUB_DELIMS + ":@[]")
_SEGMENT_RAW = frozenset(_UNRESERVED + _SUB_DELIMS + ":@")
_QUERY_RAW = frozenset(_UNRESERVED + _SUB_DELIMS + ":@/?")
# What the canonical form writes as it is, per component: the raw set less
# the component's own delimiters (and "[]" only in an authority).
_AUTHORITY_KEPT = _AUTHORITY_RAW
_SEGMENT_KEPT = _SEGMENT_RAW
_KEY_KEPT = _QUERY_RAW - {"&", "="}
_VALUE_KEPT = _QUERY_RAW - {"&"}

_HEX = frozenset("0123456789abcdefABCDEF")
# A fully qualified protobuf message name: dotted identifiers, at least two.
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


class XdstpError(ProtocolError):
    """A malformed xdstp name; ``part`` names the part that is wrong
    (``scheme``, ``authority``, ``type``, ``id``, ``context parameter``,
    ``fragment``). A stream that sends one ends with INVALID_ARGUMENT."""

    def __init__(self, name: str, part: str, problem: str) -> None:
        super().__init__(f"resource name {shown(name, 200)!r} is not a valid xdstp name: "
                         f"{part}: {problem}")
        self.part = part


class GlobRefused(ProtocolError):
    """A glob collection asked for over state of the world (TP1: delta only)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"resource name {shown(name, 200)!r} is a glob collection: xDS "
                         "serves glob collections over the incremental (delta) protocol "
                         "only (TP1), not state of the world")


@dataclass(frozen=True, slots=True)
class XdstpName:
    """An xdstp name taken apart, every component percent-decoded.

    ``context`` is sorted by key, each key once; ``id`` has at least one
    segment. :meth:`format` writes the canonical form.
    """

    authority: str
    resource_type: str
    id: tuple[str, ...]
    context: tuple[tuple[str, str], ...] = ()

    @property
    def is_glob(self) -> bool:
        """Whether this names a glob collection (its last ID segment is ``*``)."""
        return self.id[-1] == GLOB

    def collection(self) -> XdstpName:
        """The glob collection a resource of this name belongs to: same
        authority, type, parent path and context parameters."""
        return XdstpName(self.authority, self.resource_type, (*self.id[:-1], GLOB),
                         self.context)

    def format(self) -> str:
        """The canonical form (see the module's docstring)."""
        text = (f"{_SCHEME}{_encode(self.authority, _AUTHORITY_KEPT)}/"
                f"{_encode(self.resource_type, _SEGMENT_KEPT)}/"
                + "/".join(_encode(segment, _SEGMENT_KEPT) for segment in self.id))
        if self.context:
            text += "?" + "&".join(f"{_encode(key, _KEY_KEPT)}={_encode(value, _VALUE_KEPT)}"
                                   for key, value in self.context)
        return text

    def __str__(self) -> str:
        return self.format()


def is_xdstp(name: str) -> bool:
    """Whether ``name`` is an xdstp name (well formed or not), not a classic one."""
    return name.startswith(PREFIX)


def parse(name: str) -> XdstpName:
    """Take an xdstp name apart; raises :class:`XdstpError` naming the wrong part."""
    if not name.startswith(_SCHEME):
        raise XdstpError(name, "scheme", "an xdstp name starts with 'xdstp://' "
                         "(xdstp://AUTHORITY/TYPE/ID)")
    rest = name[len(_SCHEME):]
    if "#" in rest:
        raise XdstpError(name, "fragment", "a resource name carries no '#' (processing "
                         "directives belong to locators); percent-encode it as %23")
    path, has_query, query = rest.partition("?")
    raw_authority, has_type, after = path.partition("/")
    authority = _decode(name, "authority", raw_authority, _AUTHORITY_RAW)
    raw_type, has_id, raw_id = after.partition("/")
    if not has_type or not raw_type:
        raise XdstpError(name, "type", "missing (xdstp://AUTHORITY/TYPE/ID)")
    resource_type = _decode(name, "type", raw_type, _SEGMENT_RAW)
    if not _TYPE_NAME.fullmatch(resource_type):
        raise XdstpError(name, "type", f"{shown(resource_type, 100)!r} is not a fully "
                         "qualified protobuf message name (such as "
                         "envoy.config.listener.v3.Listener)")
    if not has_id or not raw_id:
        raise XdstpError(name, "id", "missing (xdstp://AUTHORITY/TYPE/ID)")
    segments = tuple(_decode(name, "id", segment, _SEGMENT_RAW)
                     for segment in raw_id.split("/"))
    context: tuple[tuple[str, str], ...] = ()
    if has_query and query:
        context = _context(name, query)
    return XdstpName(authority, resource_type, segments, context)


def _context(name: str, query: str) -> tuple[tuple[str, str], ...]:
    """The context parameters of ``query``, sorted by key."""
    params: dict[str, str] = {}
    for pair in query.split("&"):
        raw_key, has_value, raw_value = pair.partition("=")
        if not has_value:
            raise XdstpError(name, "context parameter",
                             f"{shown(pair, 100)!r} is not KEY=VALUE")
        key = _decode(name, "context parameter", raw_key, _QUERY_RAW)
        if not key:
            raise XdstpError(name, "context parameter",
                             f"{shown(pair, 100)!r} has an empty key")
        if key in params:
            raise XdstpError(name, "context parameter",
                             f"{shown(key, 100)!r} is given twice")
        params[key] = _decode(name, "context parameter", raw_value, _QUERY_RAW)
    return tuple(sorted(params.items()))


def _decode(name: str, part: str, text: str, raw: frozenset[str]) -> str:
    """``text`` percent-decoded, or :class:`XdstpError` for a character the
    part may not hold as it is or an escape that is not ``%XX`` of UTF-8."""
    if raw.issuperset(text):
        return text  # nearly always: nothing to decode
    bad = next((c for c in text if c not in raw and c != "%"), None)
    if bad is not None:
        raise XdstpError(name, part, f"{bad!r} must be percent-encoded "
                         f"(as %{'%'.join(f'{b:02X}' for b in bad.encode())})")
    out = bytearray()
    index = 0
    while index < len(text):
        char = text[index]
        if char != "%":
            out += char.encode()
            index += 1
            continue
        escape = text[index + 1:index + 3]
        if len(escape) != 2 or not _HEX.issuperset(escape):
            raise XdstpError(name, part, f"{text[index:index + 3]!r} is not a "
                             "percent-escape (%XX, two hex digits)")
        out.append(int(escape, 16))
        index += 3
    try:
        return out.decode()
    except UnicodeDecodeError:
        raise XdstpError(name, part, f"{shown(text, 100)!r} is not UTF-8 once "
                         "percent-decoded") from None


def _encode(text: str, kept: frozenset[str]) -> str:
    if kept.issuperset(text):
        return text
    return "".join(char if char in kept else
                   "".join(f"%{byte:02X}" for byte in char.encode()) for char in text)


@lru_cache(maxsize=65_536)
def _parsed(name: str) -> tuple[XdstpName, str]:
    """``name`` taken apart, and its canonical form: remembered for the most
    recent names, as the same names come back (each change of a member of a
    collection somebody subscribes, each request naming it)."""
    parsed = parse(name)
    return parsed, parsed.format()


def canonical(name: str) -> str:
    """The canonical form of ``name`` (a classic name is its own); raises
    :class:`XdstpError` for a malformed xdstp name."""
    if not name.startswith(PREFIX):
        return name
    return _parsed(name)[1]


def authority_of(name: str) -> str | None:
    """The authority of an xdstp name, percent-decoded (None: a classic name,
    or one that does not start ``xdstp://``).

    Cheap, for routing every name: a malformed name (which clients are
    refused) gets its best guess, the text between ``xdstp://`` and the next
    ``/``, ``?`` or ``#``.
    """
    if not name.startswith(_SCHEME):
        return None
    start = len(_SCHEME)
    end = name.find("/", start)
    authority = name[start:] if end < 0 else name[start:end]
    if "?" in authority or "#" in authority:
        authority = authority.partition("?")[0].partition("#")[0]
    if "%" not in authority:
        return authority
    try:
        return _decode(name, "authority", authority, _AUTHORITY_RAW)
    except XdstpError:
        return authority


@lru_cache(maxsize=65_536)
def collection_of(name: str) -> str | None:
    """The canonical glob collection a resource named ``name`` belongs to.

    None for a classic name, a glob collection itself, or a malformed name.
    Remembered for the most recent names: it is asked once per change per
    resource of a type somebody subscribes a collection of.
    """
    if not name.startswith(PREFIX):
        return None
    try:
        parsed = _parsed(name)[0]
    except XdstpError:
        return None
    return None if parsed.is_glob else parsed.collection().format()


def is_glob(name: str) -> bool:
    """Whether ``name`` is a well-formed glob collection name."""
    if not name.startswith(PREFIX):
        return False
    try:
        return _parsed(name)[0].is_glob
    except XdstpError:
        return False


def type_in_request(name: str, type_url: str) -> str:
    """The canonical form of ``name`` as a request for ``type_url`` may carry
    it: well formed, and naming that type (the type URL's last part).
    Raises :class:`XdstpError` otherwise."""
    parsed, canon = _parsed(name)
    wanted = type_url.rsplit("/", 1)[-1]
    if parsed.resource_type != wanted:
        raise XdstpError(name, "type", f"the name is of type {shown(parsed.resource_type, 100)}, "
                         f"the request is for {shown(wanted, 100)}")
    return canon


def xdstp_among(names: Collection[str]) -> list[str]:
    """The xdstp names among ``names``, in their order.

    Costs one pass in C when there are none (the names of a classic client,
    checked on every subscription): they are joined and searched at once.
    A few names are looked at one by one, which costs less than a join.
    """
    if len(names) > 4 and PREFIX not in "\n".join(names):
        return []
    return [name for name in names if name.startswith(PREFIX)]


def in_request(names: Collection[str], type_url: str, globs: bool) -> dict[str, str]:
    """Each xdstp name among ``names`` (of a request for ``type_url``) with
    its canonical form, or the :class:`~relay.protocol.outcome.ProtocolError`
    that refuses the request: a malformed name (:class:`XdstpError`), one of
    another type, or a glob collection where ``globs`` are not served
    (:class:`GlobRefused`). Empty for classic names only, at the cost of
    :func:`xdstp_among`."""
    found = {}
    for name in xdstp_among(names):
        canon = found[name] = type_in_request(name, type_url)
        if not globs and is_glob(canon):
            raise GlobRefused(name)
    return found
