"""ScopedView: a Secret a client may not have does not exist for it (with no I/O).

The view reads a real cache; sessions read the view as a stream's would.
"""

from __future__ import annotations

from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2

from relay.authorization import NO_SECRET, IdentityPattern, SecretScope
from relay.cache import ABSENT, UNKNOWN, Update
from relay.constraints import EMPTY_PARAMS
from relay.core import Core
from relay.interest import InterestChange
from relay.protocol.session import Session
from relay.protocol.view import CacheView, ScopedView
from relay.resource import CachedResource
from relay.xds_types import CLUSTER, LISTENER, SECRET
from tests.builders import cluster, pack

Delta = discovery_pb2.DeltaDiscoveryRequest
Sotw = discovery_pb2.DiscoveryRequest

# what a client of namespace prod may have
PROD = SecretScope(frozenset({IdentityPattern("glob", "prod/*")}))


class Origin:
    """A cache written as the origin would."""

    def __init__(self) -> None:
        self.core = Core.create()
        self.cache = self.core.cache
        self.view: CacheView = self.core.serving.view

    def put(self, type_url: str, name: str, msg: object, aliases: tuple[str, ...] = ()
            ) -> CachedResource:
        resource = discovery_pb2.Resource(name=name, version="1", resource=pack(msg),
                                          aliases=list(aliases))  # type: ignore[arg-type]
        cached = CachedResource(type_url, name, "1", resource)
        # (as it answers the relay's wildcard too: wildcard clients here are served)
        self.cache.apply(type_url, Update([cached], wildcard_answered=True))
        return cached

    def secret(self, name: str, aliases: tuple[str, ...] = ()) -> CachedResource:
        return self.put(SECRET, name, secret_pb2.Secret(name=name), aliases)


def scoped(origin: Origin, scope: SecretScope = PROD) -> ScopedView:
    return ScopedView(origin.view, SECRET, scope)


def test_a_secret_inside_the_scope_is_there() -> None:
    origin = Origin()
    cert = origin.secret("prod/cert")
    assert scoped(origin).lookup(SECRET, "prod/cert", EMPTY_PARAMS) is cert


def test_a_secret_outside_the_scope_does_not_exist_whether_cached_or_not() -> None:
    origin = Origin()
    origin.secret("payments/cert")
    view = scoped(origin)
    assert origin.view.lookup(SECRET, "payments/cert", EMPTY_PARAMS) is not ABSENT
    assert view.lookup(SECRET, "payments/cert", EMPTY_PARAMS) is ABSENT
    # Unknown to the cache: still absent (the client never waits for the origin).
    assert origin.view.lookup(SECRET, "payments/other", EMPTY_PARAMS) is UNKNOWN
    assert view.lookup(SECRET, "payments/other", EMPTY_PARAMS) is ABSENT


def test_an_alias_of_a_secret_outside_the_scope_does_not_exist() -> None:
    origin = Origin()
    origin.secret("payments/cert", aliases=("prod/borrowed",))
    assert origin.view.lookup(SECRET, "prod/borrowed", EMPTY_PARAMS) is not ABSENT
    assert scoped(origin).lookup(SECRET, "prod/borrowed", EMPTY_PARAMS) is ABSENT


def test_a_wildcard_finds_only_the_secrets_inside_the_scope() -> None:
    origin = Origin()
    for name in ("prod/a", "payments/b", "prod/c", "default"):
        origin.secret(name)
    assert sorted(scoped(origin).names(SECRET)) == ["prod/a", "prod/c"]


def test_the_origins_error_about_a_secret_outside_the_scope_is_not_passed_on() -> None:
    origin = Origin()
    origin.cache.apply(SECRET, Update(errors=[
        discovery_pb2.ResourceError(resource_name=discovery_pb2.ResourceName(name=name),
                                    error_detail={"message": "no such key"})
        for name in ("prod/a", "payments/b")]))
    view = scoped(origin)
    assert view.has_errors(SECRET)
    assert view.error(SECRET, "payments/b", EMPTY_PARAMS) is None
    error = view.error(SECRET, "prod/a", EMPTY_PARAMS)
    assert error is not None and error.error_detail.message == "no such key"


def test_other_types_are_untouched() -> None:
    origin = Origin()
    found = origin.put(CLUSTER, "payments/c", cluster("payments/c"))
    view = scoped(origin, NO_SECRET)
    assert view.lookup(CLUSTER, "payments/c", EMPTY_PARAMS) is found
    assert list(view.names(CLUSTER)) == ["payments/c"]
    change = InterestChange({"payments/c": EMPTY_PARAMS}, {}, True)
    assert view.admit(CLUSTER, change) is change
    assert view.scope_of(CLUSTER) is None
    assert view.is_synced(CLUSTER) and not view.is_synced(LISTENER)  # the cache's word


def test_a_client_may_subscribe_only_to_secrets_inside_its_scope() -> None:
    """What reaches the interest index, and so the origin."""
    view = scoped(Origin())
    change = InterestChange({"prod/a": EMPTY_PARAMS, "payments/b": EMPTY_PARAMS},
                            {"prod/old": EMPTY_PARAMS, "payments/old": EMPTY_PARAMS}, True)
    assert view.admit(SECRET, change) == InterestChange(
        {"prod/a": EMPTY_PARAMS}, {"prod/old": EMPTY_PARAMS}, True)


def test_a_client_without_secrets_subscribes_to_none_not_even_the_wildcard() -> None:
    view = scoped(Origin(), NO_SECRET)
    assert not view.admit(SECRET, InterestChange({"prod/a": EMPTY_PARAMS}, {}, True))
    assert not view.admit(SECRET, InterestChange({}, {}, False))


def test_a_client_without_secrets_has_the_type_synced_from_the_start() -> None:
    origin = Origin()
    assert not origin.view.is_synced(SECRET)
    assert scoped(origin, NO_SECRET).is_synced(SECRET)
    assert not scoped(origin).is_synced(SECRET)  # it waits for the origin as anyone


def test_scopes_tell_clients_that_see_the_same_secrets() -> None:
    origin = Origin()
    assert scoped(origin).scope_of(SECRET) == scoped(origin, SecretScope(PROD.names)).scope_of(
        SECRET)
    assert scoped(origin).scope_of(SECRET) != scoped(origin, NO_SECRET).scope_of(SECRET)
    assert origin.view.scope_of(SECRET) is None


# -- as a session sees it ---------------------------------------------------------------


def test_a_delta_client_is_told_a_secret_outside_its_scope_was_removed() -> None:
    origin = Origin()
    origin.secret("prod/a")
    origin.secret("payments/b")
    session = Session("delta")
    session.receive(Delta(type_url=SECRET, resource_names_subscribe=["prod/a", "payments/b"]))
    [response] = session.due(scoped(origin)).responses
    assert [r.name for r in response.resources] == ["prod/a"]
    assert response.removed == ["payments/b"]


def test_a_delta_wildcard_gets_only_the_secrets_inside_the_scope() -> None:
    origin = Origin()
    origin.secret("prod/a")
    origin.secret("payments/b")
    session = Session("delta")
    session.receive(Delta(type_url=SECRET, resource_names_subscribe=["*"]))
    [response] = session.due(scoped(origin)).responses
    assert [r.name for r in response.resources] == ["prod/a"] and response.removed == []
    # a later change to a Secret outside the scope: nothing to say
    session.receive(Delta(type_url=SECRET, response_nonce=response.nonce))
    origin.secret("payments/b2")
    session.mark_changed(SECRET, frozenset({"payments/b2"}), False)
    assert session.due(scoped(origin)).responses == []


def test_a_sotw_client_gets_nothing_of_a_secret_outside_its_scope() -> None:
    origin = Origin()
    origin.secret("prod/a")
    origin.secret("payments/b")
    session = Session("sotw")
    session.receive(Sotw(type_url=SECRET, resource_names=["prod/a", "payments/b"]))
    [response] = session.due(scoped(origin)).responses
    assert [r.name for r in response.resources] == ["prod/a"]
    only_forbidden = Session("sotw")
    only_forbidden.receive(Sotw(type_url=SECRET, resource_names=["payments/b"]))
    assert only_forbidden.due(scoped(origin)).responses == []


def test_a_client_without_secrets_gets_an_empty_wildcard_answer_at_once() -> None:
    origin = Origin()  # the origin has not said a word about Secrets
    session = Session("sotw")
    session.receive(Sotw(type_url=SECRET, resource_names=["*"]))
    [response] = session.due(scoped(origin, NO_SECRET)).responses
    assert response.resources == []
