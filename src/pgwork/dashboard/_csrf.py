"""CSRF tokens bound to a secret only the server holds.

The browser keeps a random nonce in a cookie; the forms carry HMAC(secret, nonce and
the request's credentials). A double-submit cookie alone (the form echoes the cookie)
falls to cookie tossing: a page on a sibling host (``evil.example.com`` next to
``dash.example.com``) can set a cookie for the parent domain, and then post a form
with the same value. Here a tossed nonce is worthless: its token needs the secret.
Over https the cookie is named ``__Host-pgwork_csrf``, which a browser accepts only
from this exact host (Secure, no Domain, path ``/``), so it cannot be tossed at all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

from starlette.requests import HTTPConnection

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "HOST_CSRF_COOKIE",
    "CsrfSigner",
    "cookie_name",
    "csrf_matches",
    "csrf_token",
]

CSRF_COOKIE = "pgwork_csrf"
HOST_CSRF_COOKIE = "__Host-pgwork_csrf"
CSRF_FIELD = "csrf"

_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")
_SCOPE_KEY = "pgwork.csrf"


def cookie_name(scheme: str) -> str:
    return HOST_CSRF_COOKIE if scheme == "https" else CSRF_COOKIE


class CsrfSigner:
    """Makes and checks the tokens of one dashboard. ``secret``: shared by every
    process serving it (a random one per process by default)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def nonce(self, conn: HTTPConnection) -> tuple[str, bool]:
        """The browser's nonce, and whether it is new (and must be set as a cookie)."""
        given = conn.cookies.get(cookie_name(conn.url.scheme), "")
        if _NONCE.fullmatch(given):
            return given, False
        return secrets.token_urlsafe(32), True

    def token(self, nonce: str, conn: HTTPConnection) -> str:
        """The token for ``nonce``, bound to the request's credentials too: a token
        taken with one login does not verify with another."""
        message = f"{nonce}\x00{conn.headers.get('authorization', '')}".encode()
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def attach(self, conn: HTTPConnection) -> tuple[str, bool]:
        """Work out this request's nonce and token, and keep the token for the page."""
        nonce, new = self.nonce(conn)
        conn.scope[_SCOPE_KEY] = (self, nonce, self.token(nonce, conn))
        return nonce, new


def csrf_token(conn: HTTPConnection) -> str:
    """The token a page's forms carry (set by the dashboard's middleware)."""
    found = conn.scope.get(_SCOPE_KEY)
    if found is None:
        raise RuntimeError("the CSRF middleware did not run for this request")
    return str(found[2])


def csrf_matches(conn: HTTPConnection, submitted: object) -> bool:
    """The submitted token is the one the server made for this browser's nonce
    (compared in constant time)."""
    found = conn.scope.get(_SCOPE_KEY)
    if found is None or not isinstance(submitted, str) or not submitted:
        return False
    _, _, expected = found
    return hmac.compare_digest(expected.encode(), submitted.encode())
