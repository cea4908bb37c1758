"""Dynamic parameter constraints: validation, canonical form and matching.

A resource variant carries ``DynamicParameterConstraints`` (an and/or/not
tree over single ``key == value`` / ``key exists`` tests); a client carries
dynamic parameters (a string -> string map). This module turns a constraints
message into an interned, immutable :class:`Constraints` and answers
"does this client get this variant?" (see ``shared/spec/dynamic-parameters.md``,
"Evaluating constraints against parameters" and "Select").

Semantics (spec rules 1-8):

* an unset message (no field of the ``type`` oneof) matches every parameter set,
  at the top and nested alike;
* ``constraint {key, value}`` matches iff ``key`` is present with exactly that
  value (case-sensitive); ``constraint {key, exists}`` iff ``key`` is present;
  a single constraint with neither is malformed;
* ``and_constraints`` matches iff all children do (an empty list matches);
  ``or_constraints`` iff at least one does (an empty list matches nothing);
  ``not_constraints`` iff its child does not;
* parameters the constraints do not mention never prevent a match.

Canonical key format (:attr:`Constraints.key`)::

    ""                      the unset top-level message (matches everything)
    eq("env","canary")      constraint {key: "env", value: "canary"}
    exists("region")        constraint {key: "region", exists: {}}
    and(A,B,...)            and_constraints, children sorted by their own key
    or(A,B,...)             or_constraints, children sorted by their own key
    not(A)                  not_constraints
    true                    an unset message nested inside the tree

Keys and values are JSON string literals, so any string (quotes, commas,
parentheses, control characters) is escaped and the format parses back
unambiguously. The form is *structural*: only the order of and/or children
is normalized. It does not flatten ``and(and(a,b),c)``, drop duplicates or
apply De Morgan, so structurally different messages keep different keys even
when they match the same parameters. Example::

    and_constraints {constraints: [{constraint {key: "env", value: "canary"}},
                                   {constraint {key: "region", exists {}}}]}
    -> 'and(eq("env","canary"),exists("region"))'
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from operator import attrgetter
from typing import Any, Literal, NamedTuple, TypeAlias, TypeVar

from envoy.service.discovery.v3 import discovery_pb2

from relay.errors import RelayError

__all__ = [
    "EMPTY_PARAMS",
    "UNCONSTRAINED",
    "Constraints",
    "InvalidConstraints",
    "Locator",
    "Params",
    "compile_constraints",
    "constraints_message",
    "params_of",
    "select_variant",
]

T = TypeVar("T")

Params = frozenset[tuple[str, str]]
"""A client's dynamic parameters as (key, value) pairs, each key at most once.

A frozenset so it can key caches and memo tables; CPython caches a
frozenset's hash, so looking the same object up again is cheap.
"""

EMPTY_PARAMS: Params = frozenset()
"""The parameters of a client that sent none."""


class Locator(NamedTuple):
    """A subscription to one resource: its name and the dynamic parameters it
    is wanted with (:data:`EMPTY_PARAMS` for a plain name)."""

    name: str
    params: Params = EMPTY_PARAMS

# How many distinct parameter sets params_of shares one object for (see there).
_SHARED_PARAMS_SIZE = 65536
_shared_params: dict[Params, Params] = {}

# How many distinct parameter sets one Constraints remembers results for.
# Subscribers share a few parameter groups, so a few thousand entries cover
# realistic fleets; the bound keeps clients that churn through parameter sets
# from growing memory without limit.
#
# These memo tables (and _shared_params) are plain dicts bounded by hand, not
# cachetools caches: with cachetools.FIFOCache as the memo,
# ``python -m benchmarks.constraints`` measured a memoized match at 127 ns
# instead of 87, and select_variant at 524 ns instead of 370 (same session).
# They sit on the fan-out path: every subscriber, every push.
_MEMO_SIZE = 4096

_DPC = discovery_pb2.DynamicParameterConstraints


def _evict_oldest(table: dict[Any, Any]) -> None:
    """Drop the oldest entry of a bounded dict (dicts keep insertion order)."""
    # Another thread may change the dict meanwhile; the bound is approximate.
    with suppress(KeyError, RuntimeError, StopIteration):
        del table[next(iter(table))]


def params_of(mapping: Mapping[str, str]) -> Params:
    """The :data:`Params` of a mapping (a dict or a protobuf ``map<string,string>``).

    Equal parameter sets usually come back as the same object. That is only
    an optimization: a memo lookup with the very object a memo entry was
    stored under stops at an identity check, while an equal but distinct
    frozenset must be compared element by element (hashing every pair), which
    more than doubles the cost of a memoized :meth:`Constraints.matches`.
    """
    if not mapping:
        return EMPTY_PARAMS
    params = frozenset(mapping.items())
    shared = _shared_params.get(params)
    if shared is not None:
        return shared
    if len(_shared_params) >= _SHARED_PARAMS_SIZE:
        _evict_oldest(_shared_params)  # forgetting an entry only costs speed
    _shared_params[params] = params
    return params


class InvalidConstraints(RelayError, ValueError):
    """A constraints message that cannot be evaluated; the message says what and where.

    For example ``"and_constraints[1].constraint: key 'env' has neither value
    nor exists"``. The relay NACKs the origin's response with this reason.
    """


# -- canonical tree -------------------------------------------------------------
#
# The tree is kept separately from the message so the canonical form (sorted
# children) can be rebuilt as a message, pickled, and turned into an evaluator
# without touching protobuf again.


@dataclass(slots=True, eq=False)
class _Leaf:
    param: str
    value: str | None  # None: ``exists``
    text: str


@dataclass(slots=True, eq=False)
class _List:
    op: Literal["and", "or"]
    children: tuple[_Node, ...]
    text: str


@dataclass(slots=True, eq=False)
class _Not:
    child: _Node
    text: str


@dataclass(slots=True, eq=False)
class _True:
    text: str = "true"


_Node: TypeAlias = _Leaf | _List | _Not | _True

_Evaluator = Callable[[Mapping[str, str]], bool]

_TRUE = _True()  # an unset message nested in the tree
_TOP = _True("")  # the unset top-level message: UNCONSTRAINED

_text = attrgetter("text")


class _Malformed(RelayError):
    """Raised inside the walk; each level adds its path segment on the way up.

    Building the path only on failure keeps the common (valid) walk free of
    string formatting per node.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.segments: list[str] = []


def _parse(msg: Any, depth: int, max_depth: int) -> _Node:
    """Validate one message of the tree (at ``depth``, 1 for the root) into a node."""
    if depth > max_depth:
        raise _Malformed(f"constraints nested deeper than {max_depth} levels")
    kind = msg.WhichOneof("type")
    if kind is None:
        return _TRUE
    if kind == "constraint":
        single = msg.constraint
        which = single.WhichOneof("constraint_type")
        # encode_basestring is JSON string escaping: it makes the key
        # unambiguous whatever the strings contain, keeps non-ASCII readable,
        # and is the C routine behind json.dumps without its per-call setup.
        if which == "value":
            return _Leaf(single.key, single.value,
                         f"eq({encode_basestring(single.key)},"
                         f"{encode_basestring(single.value)})")
        if which == "exists":
            return _Leaf(single.key, None, f"exists({encode_basestring(single.key)})")
        error = _Malformed(f"key {single.key!r} has neither value nor exists")
        error.segments.append("constraint")
        raise error
    if kind == "not_constraints":
        try:
            child = _parse(msg.not_constraints, depth + 1, max_depth)
        except _Malformed as e:
            e.segments.append(kind)
            raise
        return _Not(child, f"not({child.text})")
    if kind == "and_constraints" or kind == "or_constraints":
        children: list[_Node] = []
        for i, sub in enumerate(getattr(msg, kind).constraints):
            try:
                children.append(_parse(sub, depth + 1, max_depth))
            except _Malformed as e:
                e.segments.append(f"{kind}[{i}]")
                raise
        # Sorting children by their canonical text is what makes the form
        # independent of the order the origin listed them in.
        children.sort(key=_text)
        op: Literal["and", "or"] = "and" if kind == "and_constraints" else "or"
        return _List(op, tuple(children), f"{op}({','.join(c.text for c in children)})")
    # A oneof member added to the proto after this code was written: refuse
    # rather than guess, so an unknown constraint never silently matches.
    error = _Malformed("unsupported constraint type")
    error.segments.append(kind)
    raise error


def _evaluator(node: _Node) -> _Evaluator:
    """A closure evaluating ``node`` against a parameter dict (no memo)."""
    if isinstance(node, _Leaf):
        param, value = node.param, node.value
        if value is None:
            return lambda p: param in p
        # ``get`` gives None for a missing key, never equal to a str value.
        return lambda p: p.get(param) == value
    if isinstance(node, _Not):
        inner = _evaluator(node.child)
        return lambda p: not inner(p)
    if isinstance(node, _True):
        return lambda p: True
    fns = tuple(_evaluator(c) for c in node.children)
    if node.op == "and":
        if len(fns) == 1:
            return fns[0]
        if len(fns) == 2:
            first, second = fns
            return lambda p: first(p) and second(p)

        # Explicit loops, not all()/any() over a generator: the cold path
        # evaluates every new parameter set, and a generator frame per node
        # costs more than the work it wraps.
        def all_of(p: Mapping[str, str]) -> bool:
            for f in fns:  # noqa: SIM110
                if not f(p):
                    return False
            return True
        return all_of

    if len(fns) == 1:
        return fns[0]
    if len(fns) == 2:
        first, second = fns
        return lambda p: first(p) or second(p)

    def any_of(p: Mapping[str, str]) -> bool:
        for f in fns:  # noqa: SIM110
            if f(p):
                return True
        return False
    return any_of


def _keys_of(node: _Node) -> frozenset[str]:
    found: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, _Leaf):
            found.add(n.param)
        elif isinstance(n, _Not):
            stack.append(n.child)
        elif isinstance(n, _List):
            stack.extend(n.children)
    return frozenset(found)


def _message_of(node: _Node) -> Any:
    msg = _DPC()
    if isinstance(node, _Leaf):
        msg.constraint.key = node.param
        if node.value is None:
            msg.constraint.exists.SetInParent()
        else:
            msg.constraint.value = node.value
    elif isinstance(node, _Not):
        # SetInParent first: not(<unset>) must still select the oneof member.
        msg.not_constraints.SetInParent()
        msg.not_constraints.CopyFrom(_message_of(node.child))
    elif isinstance(node, _List):
        target = msg.and_constraints if node.op == "and" else msg.or_constraints
        # SetInParent so that an empty list still selects the oneof member.
        target.SetInParent()
        target.constraints.extend(_message_of(c) for c in node.children)
    return msg


# -- interned constraints -----------------------------------------------------


@dataclass(frozen=True, eq=False, slots=True, weakref_slot=True)
class Constraints:
    """A validated ``DynamicParameterConstraints`` in canonical form.

    Instances are interned: two messages with the same canonical form compile
    to the same object, so identity (``is``, ``==``, ``hash``) is canonical
    equality and one memo serves every resource and subscriber using them.
    Build them with :func:`compile_constraints`, never directly.

    ``key`` is the canonical string (format in the module docstring; ``""``
    for :data:`UNCONSTRAINED`); ``keys`` the distinct parameter keys the tree
    mentions.
    """

    key: str
    keys: frozenset[str]
    _node: _Node = field(repr=False)
    _evaluate: _Evaluator = field(repr=False)
    _memo: dict[Params, bool] = field(repr=False)
    # select_variant's preference, smallest first: most keys, then the
    # shortest and lexicographically smallest canonical key.
    _rank: tuple[int, int, str] = field(repr=False)

    def matches(self, params: Params) -> bool:
        """Whether a client with ``params`` gets a variant with these constraints.

        Memoized per parameter set: after the first evaluation this is one
        dict lookup. The memo is bounded (a few thousand parameter sets,
        oldest evicted first).
        """
        memo = self._memo
        try:
            # try/except rather than .get(): the hit is the hot path and this
            # is its cheapest form; a miss pays for an evaluation anyway.
            return memo[params]
        except KeyError:
            pass
        if not self.keys:
            # No parameter is mentioned: the result is a constant, and
            # remembering it per parameter set would only cost memory.
            return self._evaluate(_NO_PARAMS)
        result = self._evaluate(dict(params))
        if len(memo) >= _MEMO_SIZE:
            # FIFO rather than LRU keeps the hit path a bare dict lookup (an
            # LRU would reorder on every hit); a hot entry evicted by churn
            # is simply evaluated again.
            _evict_oldest(memo)
        memo[params] = result
        return result

    def __copy__(self) -> Constraints:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Constraints:
        return self

    def __reduce__(self) -> tuple[Callable[[_Node], Constraints], tuple[_Node]]:
        # Unpickling re-interns, so identity still means canonical equality.
        return _intern, (self._node,)


_NO_PARAMS: Mapping[str, str] = {}

_INTERNED: weakref.WeakValueDictionary[str, Constraints] = weakref.WeakValueDictionary()


def _intern(node: _Node) -> Constraints:
    """The one live :class:`Constraints` for ``node``'s canonical form."""
    key = node.text
    found = _INTERNED.get(key)
    if found is not None:
        return found
    keys = _keys_of(node)
    made = Constraints(key, keys, node, _evaluator(node), {}, (-len(keys), len(key), key))
    _INTERNED[key] = made
    return made


UNCONSTRAINED: Constraints = _intern(_TOP)
"""The constraints of a variant sent without any (``key == ""``): matches every client."""


def compile_constraints(msg: discovery_pb2.DynamicParameterConstraints | None,
                        max_depth: int = 16) -> Constraints:
    """Validate a ``DynamicParameterConstraints`` and return its interned canonical form.

    ``None`` or a message with no ``type`` set gives :data:`UNCONSTRAINED`.
    Depth counts the messages on the longest root-to-leaf path (a lone
    ``constraint`` is 1, ``not(constraint)`` is 2); more than ``max_depth``
    is malformed. Raises :class:`InvalidConstraints` naming the problem and
    its path for malformed input; never returns something that matches it.
    """
    if msg is None or msg.WhichOneof("type") is None:
        return UNCONSTRAINED
    try:
        node = _parse(msg, 1, max_depth)
    except _Malformed as e:
        where = ".".join(reversed(e.segments)) or "<root>"
        raise InvalidConstraints(f"{where}: {e.reason}") from None
    except RecursionError:
        # Only reachable with a max_depth near the interpreter's stack limit.
        raise InvalidConstraints("constraints nested too deeply to evaluate") from None
    return _intern(node)


def constraints_message(c: Constraints) -> discovery_pb2.DynamicParameterConstraints:
    """A ``DynamicParameterConstraints`` message of ``c``'s canonical form.

    Compiling it gives ``c`` back; :data:`UNCONSTRAINED` gives an unset message.
    """
    return _message_of(c._node)


def select_variant(candidates: Iterable[tuple[Constraints, T]],
                   params: Params) -> tuple[T | None, bool]:
    """The value of the candidate whose constraints match ``params``, and whether it was ambiguous.

    Several matches are an origin error (spec, "Select"): the choice is the
    candidate whose constraints mention the most distinct keys, then the
    smallest canonical key by ``(len(key), key)``, so every replica picks the
    same one whatever the input order; ``ambiguous`` is then True. Candidates
    with identical constraints cannot be told apart; the first such wins.
    Returns ``(None, False)`` when nothing matches.
    """
    best: Constraints | None = None
    chosen: T | None = None
    ambiguous = False
    for constraints, value in candidates:
        if not constraints.matches(params):
            continue
        if best is None:
            best, chosen = constraints, value
            continue
        ambiguous = True
        if constraints._rank < best._rank:
            best, chosen = constraints, value
    return chosen, ambiguous
