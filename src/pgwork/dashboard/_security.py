"""Who may use the dashboard, and what every response carries.

``authorize`` decides every request, static files included, before anything is read.
State-changing requests are POST forms with a CSRF token (double submit: a random
cookie the page set, echoed in a hidden field, compared in constant time), so another
site cannot make an operator's browser retry or delete jobs. Headers forbid framing and
inline scripts, and keep pages with payloads out of every cache.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "Authorize",
    "BasicAuth",
    "TokenAuth",
    "allow_any",
    "csrf_matches",
]

Authorize = Callable[[Request], "bool | Awaitable[bool]"]

CSRF_COOKIE = "pgwork_csrf"
CSRF_FIELD = "csrf"

# No inline script or style anywhere: the one script and stylesheet are files of the
# package; the chart is inline SVG drawn with presentation attributes.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def allow_any(request: Request) -> bool:
    """Let every request in: only for a dashboard reachable by trusted people alone
    (bound to 127.0.0.1, or behind a proxy that authenticates)."""
    return True


class BasicAuth:
    """HTTP Basic with one user and password, compared in constant time."""

    challenge = 'Basic realm="pgwork dashboard", charset="UTF-8"'

    def __init__(self, username: str, password: str) -> None:
        if not username or not password:
            raise ValueError("BasicAuth needs a non-empty username and password")
        self._expected = f"{username}:{password}".encode()

    def __call__(self, request: Request) -> bool:
        given = _basic_credentials(request)
        return given is not None and hmac.compare_digest(given, self._expected)


class TokenAuth:
    """A shared secret, sent as ``Authorization: Bearer <token>`` or, so a browser can
    log in, as the password of HTTP Basic (any user name)."""

    challenge = 'Basic realm="pgwork dashboard", charset="UTF-8"'

    def __init__(self, token: str) -> None:
        if len(token) < 16:
            raise ValueError("a dashboard token must be at least 16 characters long")
        self._token = token.encode()

    def __call__(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer":
            return hmac.compare_digest(value.strip().encode(), self._token)
        given = _basic_credentials(request)
        if given is None:
            return False
        _, _, password = given.partition(b":")
        return hmac.compare_digest(password, self._token)


def _basic_credentials(request: Request) -> bytes | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


class Guard:
    """ASGI middleware: ask ``authorize`` about every HTTP request, then add the
    security headers to whatever the dashboard answers."""

    def __init__(self, app: ASGIApp, *, authorize: Authorize) -> None:
        self.app = app
        self.authorize = authorize

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        decision: Any = self.authorize(Request(scope, receive))
        if inspect.isawaitable(decision):
            decision = await decision
        if decision is not True:
            await _refusal(self.authorize)(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in {name for name, _ in SECURITY_HEADERS}
                ]
                message = {**message, "headers": headers + SECURITY_HEADERS}
            await send(message)

        await self.app(scope, receive, send_secured)


def _refusal(authorize: Authorize) -> Response:
    challenge = getattr(authorize, "challenge", None)
    headers = dict(SECURITY_HEADERS_TEXT)
    if isinstance(challenge, str):
        headers["www-authenticate"] = challenge
        return PlainTextResponse("Authentication required.\n", status_code=401, headers=headers)
    return PlainTextResponse("Not allowed.\n", status_code=403, headers=headers)


SECURITY_HEADERS_TEXT = {k.decode(): v.decode() for k, v in SECURITY_HEADERS}


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_matches(request: Request, submitted: object) -> bool:
    """The form's token equals the cookie's. Another site can make a browser post a
    form here, but can neither read the cookie nor set it (it is SameSite=Strict)."""
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not isinstance(submitted, str) or not submitted:
        return False
    return hmac.compare_digest(cookie.encode(), submitted.encode())
