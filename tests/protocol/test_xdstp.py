"""relay.protocol.xdstp: xdstp names taken apart, canonical form, globs, errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.protocol.outcome import ProtocolError
from relay.protocol.xdstp import (
    XdstpError,
    XdstpName,
    authority_of,
    canonical,
    collection_of,
    is_glob,
    is_xdstp,
    parse,
    type_in_request,
)

LDS = "envoy.config.listener.v3.Listener"
EDS = "envoy.config.endpoint.v3.ClusterLoadAssignment"


# -- taking a name apart -------------------------------------------------------


def test_a_name_is_taken_apart_into_authority_type_id_and_sorted_context() -> None:
    assert parse(f"xdstp://east.example.com/{LDS}/grpc/server/a?b=2&a=1") == XdstpName(
        "east.example.com", LDS, ("grpc", "server", "a"), (("a", "1"), ("b", "2")))


def test_the_authority_may_be_empty() -> None:
    assert parse(f"xdstp:///{LDS}/x") == XdstpName("", LDS, ("x",))


def test_components_are_percent_decoded() -> None:
    assert parse(f"xdstp://a%2Eb/{LDS}/one%2Ftwo/%C3%A9?k%3D=v%26w") == XdstpName(
        "a.b", LDS, ("one/two", "é"), (("k=", "v&w"),))


def test_a_value_may_hold_an_equals_sign_the_key_is_cut_at_the_first() -> None:
    assert parse(f"xdstp://a/{LDS}/x?k=v=w").context == (("k", "v=w"),)


def test_an_empty_query_is_no_context() -> None:
    assert parse(f"xdstp://a/{LDS}/x?").context == ()


# -- the canonical form ----------------------------------------------------------


@pytest.mark.parametrize("spelled,expected", [
    # context parameters sorted by key
    (f"xdstp://a/{LDS}/x?zone=b&region=a", f"xdstp://a/{LDS}/x?region=a&zone=b"),
    # no '?' without parameters
    (f"xdstp://a/{LDS}/x?", f"xdstp://a/{LDS}/x"),
    # unreserved characters written as they are, escapes in capitals
    (f"xdstp://a/{LDS}/%7efoo%2d", f"xdstp://a/{LDS}/~foo-"),
    (f"xdstp://a/{LDS}/%c3%a9", f"xdstp://a/{LDS}/%C3%A9"),
    # a '/' inside a segment stays escaped (it is not a separator)
    (f"xdstp://a/{LDS}/one%2ftwo", f"xdstp://a/{LDS}/one%2Ftwo"),
    # sub-delimiters need no escape in a path, '&' and '=' do in a key
    (f"xdstp://a/{LDS}/a%2C?%26=%3D", f"xdstp://a/{LDS}/a,?%26=="),
    # an authority may hold ':' and '@' and IP-literal brackets as they are
    (f"xdstp://u@[::1]:80/{LDS}/x", f"xdstp://u@[::1]:80/{LDS}/x"),
])
def test_canonical_form(spelled: str, expected: str) -> None:
    assert canonical(spelled) == expected


def test_a_canonical_name_is_its_own_canonical_form() -> None:
    name = f"xdstp://east.example.com/{EDS}/pool/m1?a=1&b=2"
    assert canonical(name) == name


def test_a_classic_name_is_untouched() -> None:
    for name in ("outbound|80||svc.ns.svc.cluster.local", "", "XDSTP://a/b.c/d", "*"):
        assert canonical(name) == name
        assert authority_of(name) is None
        assert collection_of(name) is None
        assert not is_glob(name)
        assert not is_xdstp(name)


# -- authorities ----------------------------------------------------------------


@pytest.mark.parametrize("name,authority", [
    (f"xdstp://east.example.com/{LDS}/x", "east.example.com"),
    (f"xdstp:///{LDS}/x", ""),
    (f"xdstp://a%2Eb/{LDS}/x", "a.b"),
    ("xdstp://only-an-authority", "only-an-authority"),
    ("xdstp://auth?x=1", "auth"),
    ("outbound|80||svc", None),
    ("xdstp:no-slashes", None),
])
def test_authority_of(name: str, authority: str | None) -> None:
    assert authority_of(name) == authority


# -- glob collections --------------------------------------------------------------


def test_a_glob_collection_ends_with_a_star_segment() -> None:
    assert is_glob(f"xdstp://a/{EDS}/pool/*")
    assert is_glob(f"xdstp://a/{EDS}/pool/*?b=2&a=1")
    assert is_glob(f"xdstp://a/{EDS}/*")
    assert not is_glob(f"xdstp://a/{EDS}/pool/m*")
    assert not is_glob(f"xdstp://a/{EDS}/*/m")
    assert not is_glob(f"xdstp://a/{EDS}/pool/*?bad")  # malformed: not a glob


def test_a_member_belongs_to_the_glob_of_its_parent_path_and_context() -> None:
    assert collection_of(f"xdstp://a/{EDS}/pool/m1") == f"xdstp://a/{EDS}/pool/*"
    assert collection_of(f"xdstp://a/{EDS}/pool/m1?z=1&a=2") == \
        f"xdstp://a/{EDS}/pool/*?a=2&z=1"
    assert collection_of(f"xdstp://a/{EDS}/m1") == f"xdstp://a/{EDS}/*"
    # only the immediate parent: a deeper resource is in its own collection
    assert collection_of(f"xdstp://a/{EDS}/pool/sub/m1") == f"xdstp://a/{EDS}/pool/sub/*"


def test_a_glob_and_a_malformed_name_belong_to_no_collection() -> None:
    assert collection_of(f"xdstp://a/{EDS}/pool/*") is None
    assert collection_of("xdstp://a/T/pool/m1") is None


# -- errors name the part that is wrong --------------------------------------------


@pytest.mark.parametrize("name,part,problem", [
    ("xdstp:a/b", "scheme", "an xdstp name starts with 'xdstp://' (xdstp://AUTHORITY/TYPE/ID)"),
    ("xdstp://a b/x.Y/z", "authority", "' ' must be percent-encoded (as %20)"),
    ("xdstp://auth", "type", "missing (xdstp://AUTHORITY/TYPE/ID)"),
    ("xdstp://auth//x", "type", "missing (xdstp://AUTHORITY/TYPE/ID)"),
    ("xdstp://auth/Listener/x", "type",
     "'Listener' is not a fully qualified protobuf message name "
     "(such as envoy.config.listener.v3.Listener)"),
    (f"xdstp://auth/{LDS}", "id", "missing (xdstp://AUTHORITY/TYPE/ID)"),
    (f"xdstp://auth/{LDS}/", "id", "missing (xdstp://AUTHORITY/TYPE/ID)"),
    (f"xdstp://auth/{LDS}/a|b", "id", "'|' must be percent-encoded (as %7C)"),
    (f"xdstp://auth/{LDS}/é", "id", "'é' must be percent-encoded (as %C3%A9)"),
    (f"xdstp://auth/{LDS}/%4", "id", "'%4' is not a percent-escape (%XX, two hex digits)"),
    (f"xdstp://auth/{LDS}/%ff", "id", "'%ff' is not UTF-8 once percent-decoded"),
    (f"xdstp://auth/{LDS}/x?k", "context parameter", "'k' is not KEY=VALUE"),
    (f"xdstp://auth/{LDS}/x?a=1&&b=2", "context parameter", "'' is not KEY=VALUE"),
    (f"xdstp://auth/{LDS}/x?=v", "context parameter", "'=v' has an empty key"),
    (f"xdstp://auth/{LDS}/x?k=1&k=2", "context parameter", "'k' is given twice"),
    (f"xdstp://auth/{LDS}/x?k=a b", "context parameter", "' ' must be percent-encoded (as %20)"),
    (f"xdstp://auth/{LDS}/x#alt=y", "fragment",
     "a resource name carries no '#' (processing directives belong to locators); "
     "percent-encode it as %23"),
])
def test_a_malformed_name_is_refused_naming_the_part(name: str, part: str, problem: str) -> None:
    with pytest.raises(XdstpError) as raised:
        parse(name)
    assert raised.value.part == part
    assert str(raised.value) == f"resource name {name!r} is not a valid xdstp name: " \
        f"{part}: {problem}"
    assert isinstance(raised.value, ProtocolError)  # a stream ends with INVALID_ARGUMENT


def test_a_request_carries_names_of_its_own_type_only() -> None:
    type_url = f"type.googleapis.com/{LDS}"
    assert type_in_request(f"xdstp://a/{LDS}/x?b=1&a=2", type_url) == \
        f"xdstp://a/{LDS}/x?a=2&b=1"
    with pytest.raises(XdstpError) as raised:
        type_in_request(f"xdstp://a/{EDS}/x", type_url)
    assert raised.value.part == "type"
    assert str(raised.value) == (
        f"resource name 'xdstp://a/{EDS}/x' is not a valid xdstp name: type: the name is "
        f"of type {EDS}, the request is for {LDS}")


# -- properties ----------------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
_TYPES = st.lists(_IDENT, min_size=2, max_size=4).map(".".join)
_NAMES = st.builds(
    XdstpName,
    authority=_TEXT,
    resource_type=_TYPES,
    id=st.lists(_TEXT, min_size=1, max_size=4).map(tuple).filter(lambda i: i != ("",)),
    context=st.dictionaries(_TEXT.filter(bool), _TEXT, max_size=4).map(
        lambda params: tuple(sorted(params.items()))),
)


@given(_NAMES)
def test_parse_of_format_is_the_name(name: XdstpName) -> None:
    assert parse(name.format()) == name


@given(_NAMES)
def test_canonical_form_is_idempotent(name: XdstpName) -> None:
    once = canonical(name.format())
    assert canonical(once) == once
    assert once == name.format()


@given(_NAMES, st.randoms(use_true_random=False))
def test_every_order_of_the_context_is_one_name(name: XdstpName, random: object) -> None:
    shuffled = list(name.context)
    random.shuffle(shuffled)  # type: ignore[attr-defined]
    spelled = XdstpName(name.authority, name.resource_type, name.id, tuple(shuffled))
    # formatting keeps the given order: the canonical form sorts it
    assert canonical(spelled.format()) == name.format()


@given(_NAMES)
def test_a_member_and_its_collection_share_authority_type_parent_and_context(
        name: XdstpName) -> None:
    if name.is_glob:
        assert collection_of(name.format()) is None
        return
    glob = parse(collection_of(name.format()) or "")
    assert glob.is_glob
    assert (glob.authority, glob.resource_type, glob.id[:-1], glob.context) == \
        (name.authority, name.resource_type, name.id[:-1], name.context)
    assert authority_of(name.format()) == name.authority
