"""relay.constraints: evaluation rules, validation, canonical form, memo and selection."""

from __future__ import annotations

import copy
import itertools
import pickle
from collections.abc import Mapping
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from relay import constraints as constraints_module
from relay.constraints import (
    EMPTY_PARAMS,
    UNCONSTRAINED,
    Constraints,
    InvalidConstraints,
    compile_constraints,
    constraints_message,
    params_of,
    select_variant,
)

D = discovery_pb2.DynamicParameterConstraints
Single = D.SingleConstraint
Msg = Any  # generated protobuf classes carry no type information

# -- message builders -----------------------------------------------------------


def eq(key: str, value: str) -> Msg:
    return D(constraint=Single(key=key, value=value))


def exists(key: str) -> Msg:
    return D(constraint=Single(key=key, exists=Single.Exists()))


def neither(key: str) -> Msg:
    """A malformed single constraint: a key with neither value nor exists."""
    return D(constraint=Single(key=key))


def and_(*children: Msg) -> Msg:
    msg = D()
    msg.and_constraints.SetInParent()  # an empty list must still set the oneof
    msg.and_constraints.constraints.extend(children)
    return msg


def or_(*children: Msg) -> Msg:
    msg = D()
    msg.or_constraints.SetInParent()
    msg.or_constraints.constraints.extend(children)
    return msg


def not_(child: Msg) -> Msg:
    msg = D()
    msg.not_constraints.SetInParent()
    msg.not_constraints.CopyFrom(child)
    return msg


def unset() -> Msg:
    return D()


def nots(depth: int) -> Msg:
    """A chain of ``depth`` messages: depth-1 ``not``s around one constraint."""
    msg = exists("env")
    for _ in range(depth - 1):
        msg = not_(msg)
    return msg


def reference(msg: Msg, params: Mapping[str, str]) -> bool:
    """The spec's rules 1-8, evaluated directly over the raw message (no memo, no compile)."""
    kind = msg.WhichOneof("type")
    if kind is None:
        return True
    if kind == "constraint":
        single = msg.constraint
        if single.WhichOneof("constraint_type") == "value":
            return single.key in params and params[single.key] == single.value
        assert single.WhichOneof("constraint_type") == "exists"
        return single.key in params
    if kind == "and_constraints":
        return all(reference(c, params) for c in msg.and_constraints.constraints)
    if kind == "or_constraints":
        return any(reference(c, params) for c in msg.or_constraints.constraints)
    assert kind == "not_constraints"
    return not reference(msg.not_constraints, params)


def normal_form(msg: Msg) -> object:
    """A test-side canonical form: the message tree with and/or children as sorted multisets."""
    kind = msg.WhichOneof("type")
    if kind is None:
        return ("true",)
    if kind == "constraint":
        single = msg.constraint
        which = single.WhichOneof("constraint_type")
        return (which, single.key, single.value if which == "value" else None)
    if kind == "not_constraints":
        return ("not", normal_form(msg.not_constraints))
    children = [normal_form(c) for c in getattr(msg, kind).constraints]
    return (kind, tuple(sorted(children, key=repr)))


def matches(msg: Msg, params: Mapping[str, str]) -> bool:
    return compile_constraints(msg).matches(params_of(params))


# -- evaluation rules (table) -----------------------------------------------------

CANARY = {"env": "canary"}

EVALUATION_CASES = [
    # rule 2: value
    pytest.param(eq("env", "canary"), CANARY, True, id="value-match"),
    pytest.param(eq("env", "canary"), {"env": "prod"}, False, id="value-mismatch"),
    pytest.param(eq("env", "canary"), {}, False, id="value-missing-key"),
    pytest.param(eq("env", "canary"), {"region": "canary"}, False, id="value-other-key"),
    pytest.param(eq("env", "canary"), {"env": "Canary"}, False, id="value-case-sensitive-value"),
    pytest.param(eq("env", "canary"), {"ENV": "canary"}, False, id="value-case-sensitive-key"),
    pytest.param(eq("env", ""), {"env": ""}, True, id="value-empty-string-match"),
    pytest.param(eq("env", ""), {}, False, id="value-empty-string-missing-key"),
    # rule 3: exists
    pytest.param(exists("env"), {"env": "anything"}, True, id="exists-present"),
    pytest.param(exists("env"), {"env": ""}, True, id="exists-present-empty-value"),
    pytest.param(exists("env"), {}, False, id="exists-absent"),
    pytest.param(exists("env"), {"region": "x"}, False, id="exists-other-key"),
    # rules 5 and 6: and / or, including empty lists
    pytest.param(and_(), {}, True, id="and-empty-matches"),
    pytest.param(and_(), CANARY, True, id="and-empty-matches-with-params"),
    pytest.param(or_(), {}, False, id="or-empty-matches-nothing"),
    pytest.param(or_(), CANARY, False, id="or-empty-matches-nothing-with-params"),
    pytest.param(and_(eq("env", "canary"), exists("region")),
                 {"env": "canary", "region": "eu"}, True, id="and-all-match"),
    pytest.param(and_(eq("env", "canary"), exists("region")), CANARY, False, id="and-one-fails"),
    pytest.param(and_(eq("env", "canary"), exists("region"), exists("zone")),
                 {"env": "canary", "region": "eu", "zone": "a"}, True, id="and-three-match"),
    pytest.param(and_(eq("env", "canary"), exists("region"), exists("zone")),
                 {"env": "canary", "zone": "a"}, False, id="and-three-one-fails"),
    pytest.param(or_(eq("env", "canary"), eq("env", "prod")), {"env": "prod"}, True,
                 id="or-second-matches"),
    pytest.param(or_(eq("env", "canary"), eq("env", "prod")), {"env": "dev"}, False,
                 id="or-none-match"),
    pytest.param(or_(eq("env", "a"), eq("env", "b"), eq("env", "c")), {"env": "c"}, True,
                 id="or-three-last-matches"),
    pytest.param(or_(eq("env", "a"), eq("env", "b"), eq("env", "c")), {"env": "d"}, False,
                 id="or-three-none-match"),
    pytest.param(and_(exists("env")), CANARY, True, id="and-single-child"),
    pytest.param(or_(exists("env")), {}, False, id="or-single-child"),
    # rule 7: not
    pytest.param(not_(exists("env")), {}, True, id="not-absent-key"),
    pytest.param(not_(exists("env")), CANARY, False, id="not-present-key"),
    pytest.param(not_(eq("env", "canary")), {"env": "prod"}, True, id="not-value-mismatch"),
    pytest.param(not_(eq("env", "canary")), {}, True, id="not-value-missing-key"),
    pytest.param(not_(and_()), {}, False, id="not-empty-and"),
    pytest.param(not_(or_()), {}, True, id="not-empty-or"),
    # nesting, several levels
    pytest.param(not_(not_(eq("env", "canary"))), CANARY, True, id="double-not"),
    pytest.param(and_(or_(eq("env", "canary"), eq("env", "beta")), not_(exists("debug"))),
                 {"env": "beta"}, True, id="and-or-not-match"),
    pytest.param(and_(or_(eq("env", "canary"), eq("env", "beta")), not_(exists("debug"))),
                 {"env": "beta", "debug": "1"}, False, id="and-or-not-excluded"),
    pytest.param(or_(and_(eq("env", "prod"), not_(or_(eq("region", "eu"), exists("zone")))),
                     not_(exists("env"))),
                 {"env": "prod", "region": "us"}, True, id="four-levels-match"),
    pytest.param(or_(and_(eq("env", "prod"), not_(or_(eq("region", "eu"), exists("zone")))),
                     not_(exists("env"))),
                 {"env": "prod", "zone": "b"}, False, id="four-levels-no-match"),
    pytest.param(or_(and_(eq("env", "prod"), not_(or_(eq("region", "eu"), exists("zone")))),
                     not_(exists("env"))),
                 {"region": "eu"}, True, id="four-levels-default-branch"),
    # rule 1: unset, at the top and nested
    pytest.param(unset(), {}, True, id="unset-matches-empty"),
    pytest.param(unset(), CANARY, True, id="unset-matches-anything"),
    pytest.param(not_(unset()), CANARY, False, id="not-unset-matches-nothing"),
    pytest.param(and_(unset(), exists("env")), CANARY, True, id="nested-unset-in-and"),
    pytest.param(or_(unset(), exists("env")), {}, True, id="nested-unset-in-or"),
    # rule 8: unmentioned parameters never prevent a match
    pytest.param(eq("env", "canary"), {"env": "canary", "new-key": "x", "zone": "a"}, True,
                 id="unconstrained-extra-params-value"),
    pytest.param(not_(exists("env")), {"region": "eu", "zone": "a"}, True,
                 id="unconstrained-extra-params-not"),
    pytest.param(unset(), {"anything": "goes"}, True, id="unconstrained-extra-params-unset"),
    # the spec's example: A is canary, B the default for clients without env
    pytest.param(eq("env", "canary"), {"env": "prod"}, False, id="spec-example-a-prod"),
    pytest.param(not_(exists("env")), {"env": "prod"}, False, id="spec-example-b-prod"),
]


@pytest.mark.parametrize(("msg", "params", "expected"), EVALUATION_CASES)
def test_evaluation(msg: Msg, params: dict[str, str], expected: bool) -> None:
    c = compile_constraints(msg)
    assert reference(msg, params) is expected  # the table agrees with the spec's rules
    assert c.matches(params_of(params)) is expected
    assert c.matches(params_of(params)) is expected  # memoized path


def test_none_and_unset_are_unconstrained() -> None:
    assert compile_constraints(None) is UNCONSTRAINED
    assert compile_constraints(unset()) is UNCONSTRAINED
    assert UNCONSTRAINED.key == ""
    assert UNCONSTRAINED.keys == frozenset()
    assert UNCONSTRAINED.matches(EMPTY_PARAMS)
    assert UNCONSTRAINED.matches(params_of({"a": "b"}))
    assert constraints_message(UNCONSTRAINED) == unset()


# -- validation -----------------------------------------------------------------

MALFORMED_CASES = [
    pytest.param(neither("env"), "constraint: key 'env' has neither value nor exists",
                 id="single-top-level"),
    pytest.param(not_(neither("env")),
                 "not_constraints.constraint: key 'env' has neither value nor exists",
                 id="single-under-not"),
    pytest.param(and_(eq("region", "eu"), neither("env")),
                 "and_constraints[1].constraint: key 'env' has neither value nor exists",
                 id="single-in-and"),
    pytest.param(or_(unset(), neither("zone")),
                 "or_constraints[1].constraint: key 'zone' has neither value nor exists",
                 id="single-in-or-that-would-match"),
    pytest.param(or_(and_(exists("a"), not_(and_(exists("b"), exists("c"), neither(""))))),
                 "or_constraints[0].and_constraints[1].not_constraints.and_constraints[2]"
                 ".constraint: key '' has neither value nor exists",
                 id="single-deeply-nested"),
    pytest.param(nots(17), "constraints nested deeper than 16 levels", id="too-deep"),
    pytest.param(and_(exists("a"), nots(16)),
                 "and_constraints[1]" + ".not_constraints" * 15
                 + ": constraints nested deeper than 16 levels",
                 id="too-deep-under-and"),
]


@pytest.mark.parametrize(("msg", "reason"), MALFORMED_CASES)
def test_malformed_is_rejected_with_reason(msg: Msg, reason: str) -> None:
    with pytest.raises(InvalidConstraints) as raised:
        compile_constraints(msg)
    assert reason in str(raised.value)
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize("max_depth", [1, 2, 3, 16])
def test_depth_bound_is_inclusive(max_depth: int) -> None:
    assert compile_constraints(nots(max_depth), max_depth=max_depth).matches(
        params_of({"env": "x"})) is (max_depth % 2 == 1)
    with pytest.raises(InvalidConstraints, match=f"deeper than {max_depth} levels"):
        compile_constraints(nots(max_depth + 1), max_depth=max_depth)


def test_default_depth_bound_is_16() -> None:
    compile_constraints(nots(16))
    with pytest.raises(InvalidConstraints):
        compile_constraints(nots(17))


def test_depth_counts_lists_and_leaves() -> None:
    # and(or(constraint)) is three messages deep; an empty and is one.
    three = and_(or_(exists("a")))
    assert compile_constraints(three, max_depth=3).matches(params_of({"a": "1"}))
    with pytest.raises(InvalidConstraints):
        compile_constraints(three, max_depth=2)
    assert compile_constraints(and_(), max_depth=1).matches(EMPTY_PARAMS)
    # A top-level unset message is never too deep.
    assert compile_constraints(unset(), max_depth=0) is UNCONSTRAINED


# -- canonical form and interning --------------------------------------------------


def test_key_format_example() -> None:
    c = compile_constraints(and_(exists("region"), eq("env", "canary")))
    assert c.key == 'and(eq("env","canary"),exists("region"))'
    assert c.keys == frozenset({"env", "region"})
    assert compile_constraints(not_(or_())).key == "not(or())"
    assert compile_constraints(and_(unset())).key == "and(true)"


def test_and_or_children_are_order_independent() -> None:
    children = [eq("env", "canary"), exists("region"), not_(eq("zone", "a"))]
    for op in (and_, or_):
        compiled = {compile_constraints(op(*perm)) for perm in itertools.permutations(children)}
        assert len(compiled) == 1  # the same interned object for every order
    nested_a = and_(or_(exists("b"), exists("a")), eq("c", "1"))
    nested_b = and_(eq("c", "1"), or_(exists("a"), exists("b")))
    assert compile_constraints(nested_a) is compile_constraints(nested_b)
    assert compile_constraints(nested_a).key == compile_constraints(nested_b).key


DISTINCT = [
    eq("env", "canary"),
    eq("env", "Canary"),
    eq("Env", "canary"),
    eq("env", ""),
    exists("env"),
    exists(""),
    not_(exists("env")),
    not_(not_(exists("env"))),
    and_(),
    or_(),
    and_(exists("env")),
    or_(exists("env")),
    and_(exists("env"), exists("env")),
    and_(exists("a"), exists("b")),
    or_(exists("a"), exists("b")),
    and_(and_(exists("a"), exists("b")), exists("c")),
    and_(exists("a"), exists("b"), exists("c")),
    and_(unset()),
    not_(unset()),
    # strings that would break a naive key format
    eq("a", 'b"),eq("c'),
    and_(eq("a", "b"), eq("c", "")),
    eq("a,b", "c"),
    eq("a", "b,c"),
    exists('env")'),
    eq("k", "true"),
    eq("k", "caf\u00e9\n"),
]


def test_distinct_constraints_have_distinct_keys() -> None:
    compiled = [compile_constraints(m) for m in DISTINCT]
    assert len({c.key for c in compiled}) == len(DISTINCT)
    assert len({id(c) for c in compiled}) == len(DISTINCT)
    assert "" not in {c.key for c in compiled}


@pytest.mark.parametrize("msg", DISTINCT, ids=lambda m: compile_constraints(m).key)
def test_round_trip_through_message(msg: Msg) -> None:
    c = compile_constraints(msg)
    back = constraints_message(c)
    assert isinstance(back, D)
    assert normal_form(back) == normal_form(msg)
    assert compile_constraints(back) is c
    assert constraints_message(c) == back  # the canonical message is stable


def test_interned_survives_copy_and_pickle() -> None:
    c = compile_constraints(and_(eq("env", "canary"), exists("region")))
    assert copy.copy(c) is c
    assert copy.deepcopy(c) is c
    assert pickle.loads(pickle.dumps(c)) is c
    assert pickle.loads(pickle.dumps(UNCONSTRAINED)) is UNCONSTRAINED


def test_equality_and_hash_are_identity() -> None:
    a = compile_constraints(eq("env", "canary"))
    b = compile_constraints(eq("env", "canary"))
    assert a is b and a == b and hash(a) == hash(b)
    assert a != compile_constraints(eq("env", "prod"))
    assert {a: 1}[b] == 1


def test_constraints_are_frozen() -> None:
    c = compile_constraints(exists("env"))
    with pytest.raises(AttributeError):
        c.key = "other"  # type: ignore[misc]


def test_keys_lists_distinct_parameter_keys() -> None:
    c = compile_constraints(or_(and_(eq("env", "a"), exists("region")),
                                not_(eq("env", "b")), and_(), unset()))
    assert c.keys == frozenset({"env", "region"})


# -- params and memo --------------------------------------------------------------


def test_params_of() -> None:
    assert params_of({}) == EMPTY_PARAMS
    assert params_of({"env": "canary", "region": "eu"}) == frozenset(
        {("env", "canary"), ("region", "eu")})
    locator = discovery_pb2.ResourceLocator(name="x", dynamic_parameters={"env": "canary"})
    assert params_of(locator.dynamic_parameters) == params_of(CANARY)
    assert hash(params_of(CANARY)) == hash(params_of(dict(CANARY)))


def test_params_of_shares_equal_sets_within_a_bound() -> None:
    a = params_of({"env": "shared", "region": "eu"})
    b = params_of({"region": "eu", "env": "shared"})
    assert a is b
    size = constraints_module._SHARED_PARAMS_SIZE
    for i in range(size + 10):
        params_of({"churn": str(i)})
    assert len(constraints_module._shared_params) == size
    again = params_of({"env": "shared", "region": "eu"})
    assert again == a  # forgotten or not, still equal


def test_memo_returns_the_same_answer_for_equal_params() -> None:
    c = compile_constraints(and_(eq("env", "memo-test"), not_(exists("debug"))))
    first = params_of({"env": "memo-test"})
    equal = frozenset({("env", "memo-test")})  # equal, not the shared object
    assert first is not equal
    assert c.matches(first) and c.matches(equal)
    assert not c.matches(params_of({"env": "memo-test", "debug": "1"}))
    assert c._memo == {first: True, params_of({"env": "memo-test", "debug": "1"}): False}


def test_memo_is_bounded() -> None:
    c = compile_constraints(eq("env", "bounded-memo"))
    size = constraints_module._MEMO_SIZE
    for i in range(size + 50):
        assert not c.matches(params_of({"env": str(i)}))
    assert len(c._memo) == size
    assert c.matches(params_of({"env": "bounded-memo"}))
    assert not c.matches(params_of({"env": "0"}))  # evicted, recomputed correctly


def test_unconstrained_does_not_fill_its_memo() -> None:
    for i in range(10):
        assert UNCONSTRAINED.matches(params_of({"k": str(i)}))
    assert len(UNCONSTRAINED._memo) == 0


# -- select_variant ---------------------------------------------------------------


def c_(msg: Msg) -> Constraints:
    return compile_constraints(msg)


def test_select_single_match() -> None:
    variants = [(c_(eq("env", "canary")), "A"), (c_(not_(exists("env"))), "B")]
    assert select_variant(variants, params_of(CANARY)) == ("A", False)
    assert select_variant(variants, EMPTY_PARAMS) == ("B", False)
    assert select_variant([(UNCONSTRAINED, "only")], params_of(CANARY)) == ("only", False)


def test_select_no_match() -> None:
    variants = [(c_(eq("env", "canary")), "A"), (c_(not_(exists("env"))), "B")]
    assert select_variant(variants, params_of({"env": "prod"})) == (None, False)
    assert select_variant([], params_of(CANARY)) == (None, False)


SELECT_CASES = [
    pytest.param(
        [(eq("env", "canary"), "one-key"),
         (and_(eq("env", "canary"), exists("region")), "two-keys"),
         (unset(), "unconstrained")],
        {"env": "canary", "region": "eu"}, "two-keys", id="most-keys-wins"),
    pytest.param(
        [(eq("env", "canary"), "long"), (exists("env"), "short")],
        CANARY, "short", id="same-key-count-shorter-key-wins"),
    pytest.param(
        [(exists("b"), "b"), (exists("a"), "a"), (exists("c"), "c")],
        {"a": "1", "b": "1", "c": "1"}, "a", id="same-length-smallest-key-wins"),
    pytest.param(
        [(unset(), "default"), (and_(), "empty-and")],
        {}, "default", id="unconstrained-empty-key-is-smallest"),
    pytest.param(
        [(unset(), "default"), (eq("env", "canary"), "canary")],
        CANARY, "canary", id="constrained-beats-unconstrained"),
]


@pytest.mark.parametrize(("variants", "params", "expected"), SELECT_CASES)
def test_select_several_matches(variants: list[tuple[Msg, str]], params: dict[str, str],
                                expected: str) -> None:
    compiled = [(c_(m), v) for m, v in variants]
    for order in itertools.permutations(compiled):
        assert select_variant(order, params_of(params)) == (expected, True)
        assert select_variant(iter(order), params_of(params)) == (expected, True)


# -- properties ---------------------------------------------------------------------

KEYS = ["env", "region", "zone"]
VALUES = ["canary", "prod", "Prod", ""]

leaf_messages = st.one_of(
    st.builds(eq, st.sampled_from(KEYS), st.sampled_from(VALUES)),
    st.builds(exists, st.sampled_from(KEYS)),
    st.just(None).map(lambda _: unset()),
)


def constraint_messages(depth: int) -> st.SearchStrategy[Msg]:
    """Constraint messages at most ``depth`` + 1 messages deep."""
    if depth == 0:
        return leaf_messages
    sub = constraint_messages(depth - 1)
    return st.one_of(
        leaf_messages,
        st.lists(sub, max_size=3).map(lambda cs: and_(*cs)),
        st.lists(sub, max_size=3).map(lambda cs: or_(*cs)),
        sub.map(not_),
    )


messages = constraint_messages(3)  # up to 4 levels deep
param_dicts = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)
param_lists = st.lists(param_dicts, min_size=1, max_size=6)
PROPS = settings(max_examples=200, deadline=None)


@PROPS
@given(messages, param_lists)
def test_memoized_matches_equal_reference(msg: Msg, params: list[dict[str, str]]) -> None:
    c = compile_constraints(msg)
    for p in params:
        expected = reference(msg, p)
        assert c.matches(params_of(p)) is expected
        assert c.matches(params_of(p)) is expected  # memoized


@PROPS
@given(messages, param_lists)
def test_double_negation(msg: Msg, params: list[dict[str, str]]) -> None:
    for p in params:
        assert matches(not_(not_(msg)), p) == matches(msg, p)


@PROPS
@given(messages, messages, param_lists)
def test_de_morgan(a: Msg, b: Msg, params: list[dict[str, str]]) -> None:
    for p in params:
        assert matches(not_(and_(a, b)), p) == matches(or_(not_(a), not_(b)), p)
        assert matches(not_(or_(a, b)), p) == matches(and_(not_(a), not_(b)), p)


@PROPS
@given(st.lists(messages, max_size=4), st.randoms(use_true_random=False))
def test_and_or_commutative(children: list[Msg], rnd: Any) -> None:
    shuffled = list(children)
    rnd.shuffle(shuffled)
    for op in (and_, or_):
        assert compile_constraints(op(*children)).key == compile_constraints(op(*shuffled)).key
        assert compile_constraints(op(*children)) is compile_constraints(op(*shuffled))


@PROPS
@given(messages, messages)
def test_key_equal_iff_same_tree_up_to_child_order(a: Msg, b: Msg) -> None:
    same_key = compile_constraints(a).key == compile_constraints(b).key
    assert same_key == (normal_form(a) == normal_form(b))


@PROPS
@given(messages)
def test_round_trip_property(msg: Msg) -> None:
    c = compile_constraints(msg)
    assert compile_constraints(constraints_message(c)) is c
    assert c.keys == frozenset(
        k for k in KEYS if f'"{k}"' in c.key)  # keys are the ones the key mentions


@PROPS
@given(st.lists(messages, max_size=4), param_dicts, st.randoms(use_true_random=False))
def test_select_variant_ignores_input_order(msgs: list[Msg], p: dict[str, str],
                                            rnd: Any) -> None:
    candidates = [(compile_constraints(m), compile_constraints(m).key) for m in msgs]
    params = params_of(p)
    choice, ambiguous = select_variant(candidates, params)
    matching = [c for c, _ in candidates if c.matches(params)]
    assert ambiguous == (len(matching) > 1)
    if matching:
        best = min(matching, key=lambda c: (-len(c.keys), len(c.key), c.key))
        assert choice == best.key
    else:
        assert choice is None
    rnd.shuffle(candidates)
    assert select_variant(candidates, params) == (choice, ambiguous)
