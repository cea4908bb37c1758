"""Signing in to the console behind ``admin.token_file``, with no I/O.

A browser cannot send ``Authorization: Bearer`` on a page load, and the
token must never travel in a URL (it would sit in the history, the logs of
any proxy, the ``Referer``). So the console's login form POSTs the token
once, and the answer is a cookie that stands for it:

* its value is not the token: ``<expiry>.<HMAC-SHA256 keyed by the token
  over the admin origin (the request's Host) and the expiry>``. It proves
  the token was known, ends after :data:`SESSION_SECONDS`, is worth nothing
  once the token file changes (rotating the token signs everyone out), and
  is refused by an admin server at another host or port;
* ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's
  page sends it: no cross-site request forgery), ``Path=/``, host-only (no
  ``Domain``); over admin TLS also ``Secure`` and named with the
  ``__Host-`` prefix, which browsers only accept on exactly those terms.

The data endpoints take the cookie or the bearer header the other admin
endpoints take (see :func:`relay.admin.token_refusal`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

__all__ = ["COOKIE", "SECURE_COOKIE", "SESSION_SECONDS", "cookie_name", "session_cookie",
           "signed_in", "signed_out_cookie", "token_matches"]

#: How long a sign-in lasts, in seconds.
SESSION_SECONDS = 12 * 3600
#: The cookie's name without admin TLS, and with it.
COOKIE = "xds-relay-console"
SECURE_COOKIE = "__Host-xds-relay-console"


def cookie_name(tls: bool) -> str:
    return SECURE_COOKIE if tls else COOKIE


def token_matches(given: bytes, token: bytes) -> bool:
    """Whether ``given`` (the login form's, spaces around it dropped, as the
    token file's are) is the token, in time that does not tell how close it was."""
    return hmac.compare_digest(given.strip(), token)


def _signature(token: bytes, origin: str, expires: int) -> str:
    message = f"xds-relay console\n{origin}\n{expires}".encode()
    return hmac.new(token, message, hashlib.sha256).hexdigest()


def session_cookie(token: bytes, origin: str, now: float, tls: bool) -> str:
    """The ``Set-Cookie`` value for a browser that just gave the token to the
    admin server at ``origin`` (its Host header)."""
    expires = int(now) + SESSION_SECONDS
    attributes = ["HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={SESSION_SECONDS}"]
    if tls:
        attributes.append("Secure")
    value = f"{expires}.{_signature(token, origin, expires)}"
    return "; ".join([f"{cookie_name(tls)}={value}", *attributes])


def signed_out_cookie(tls: bool) -> str:
    """The ``Set-Cookie`` value that ends a sign-in."""
    attributes = ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=0"]
    if tls:
        attributes.append("Secure")
    return "; ".join([f"{cookie_name(tls)}=", *attributes])


def signed_in(cookies: Mapping[str, str], token: bytes, origin: str, now: float,
              tls: bool) -> bool:
    """Whether ``cookies`` carry a sign-in to the admin server at ``origin``
    under ``token`` that has not expired."""
    value = cookies.get(cookie_name(tls))
    if not value:
        return False
    expires_text, _, signature = value.partition(".")
    if not expires_text.isdigit() or len(expires_text) > 12:
        return False
    expires = int(expires_text)
    # compared first, whatever the expiry: the time taken tells nothing
    valid = hmac.compare_digest(signature.encode(),
                                _signature(token, origin, expires).encode())
    return valid and now < expires <= now + SESSION_SECONDS
