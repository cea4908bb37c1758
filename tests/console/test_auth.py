"""Signing in to the console: a cookie that stands for the token, never is it."""

from __future__ import annotations

from relay.console.auth import (
    COOKIE,
    SECURE_COOKIE,
    SESSION_SECONDS,
    session_cookie,
    signed_in,
    signed_out_cookie,
    token_matches,
)

TOKEN = b"the-admin-token"
ORIGIN = "127.0.0.1:19000"
NOW = 1_800_000_000.0


def cookies_of(set_cookie: str) -> dict[str, str]:
    name, _, value = set_cookie.split(";")[0].partition("=")
    return {name: value}


def test_the_cookie_is_strict_http_only_and_not_the_token() -> None:
    set_cookie = session_cookie(TOKEN, ORIGIN, NOW, tls=False)
    name_value, *attributes = set_cookie.split("; ")
    assert name_value.startswith(f"{COOKIE}=") and TOKEN.decode() not in name_value
    assert attributes == ["HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={SESSION_SECONDS}"]


def test_over_tls_it_is_secure_and_host_only() -> None:
    set_cookie = session_cookie(TOKEN, ORIGIN, NOW, tls=True)
    assert set_cookie.startswith(f"{SECURE_COOKIE}=") and set_cookie.endswith("; Secure")
    assert "Domain" not in set_cookie


def test_the_cookie_signs_in_until_it_expires() -> None:
    cookies = cookies_of(session_cookie(TOKEN, ORIGIN, NOW, tls=False))
    assert signed_in(cookies, TOKEN, ORIGIN, NOW + 60, tls=False)
    assert not signed_in(cookies, TOKEN, ORIGIN, NOW + SESSION_SECONDS, tls=False)


def test_a_new_token_signs_everyone_out() -> None:
    cookies = cookies_of(session_cookie(TOKEN, ORIGIN, NOW, tls=False))
    assert not signed_in(cookies, b"rotated-token", ORIGIN, NOW, tls=False)


def test_the_cookie_is_worth_nothing_at_another_admin_origin() -> None:
    cookies = cookies_of(session_cookie(TOKEN, ORIGIN, NOW, tls=False))
    assert not signed_in(cookies, TOKEN, "127.0.0.1:19001", NOW, tls=False)


def test_a_forged_or_stretched_cookie_is_refused() -> None:
    value = cookies_of(session_cookie(TOKEN, ORIGIN, NOW, tls=False))[COOKIE]
    expires, _, signature = value.partition(".")
    later = str(int(expires) + 3600)
    for forged in (f"{later}.{signature}", f"{expires}.{'0' * 64}", "garbage", "",
                   f"{10**13}.{signature}"):
        assert not signed_in({COOKIE: forged}, TOKEN, ORIGIN, NOW, tls=False), forged


def test_the_plain_cookie_does_not_count_over_tls() -> None:
    cookies = cookies_of(session_cookie(TOKEN, ORIGIN, NOW, tls=False))
    assert not signed_in(cookies, TOKEN, ORIGIN, NOW, tls=True)


def test_signing_out_expires_the_cookie() -> None:
    assert signed_out_cookie(False) == f"{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"


def test_the_form_s_token_is_compared_as_the_file_s_is() -> None:
    assert token_matches(b"  the-admin-token\n", TOKEN)
    assert not token_matches(b"the-admin-toke", TOKEN)
