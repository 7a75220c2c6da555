"""Who may use the dashboard, and what every response carries.

Every request passes, in order: the ``Host`` check (only the names the dashboard is
served as: no DNS rebinding), the failed-login lockout, ``authorize`` (static files
included, before anything is read), and for a state-changing request the same-origin
check; then the page, whose forms carry a CSRF token bound to a server secret (see
``_csrf``). Headers forbid framing and inline scripts, and keep pages with payloads out
of every cache — on every answer, a refusal or a crash included.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import inspect
import logging
from collections.abc import Awaitable, Callable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgwork.client import Client
from pgwork.dashboard._audit import (
    DASHBOARD_ACTION,
    DASHBOARD_AUTH_FAILED,
    client_address,
    emit,
    who,
)
from pgwork.dashboard._csrf import CsrfSigner, cookie_name
from pgwork.dashboard._origin import HostPattern, allowed_host, same_origin
from pgwork.dashboard._throttle import LoginThrottle
from pgwork.errors import DatabaseTimeoutError, DatabaseUnreachableError

__all__ = ["Authorize", "BasicAuth", "Guard", "TokenAuth", "allow_any"]

Authorize = Callable[[Request], "bool | Awaitable[bool]"]

log = logging.getLogger("pgwork.dashboard")

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

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
    # Not no-referrer: under it a browser sends "Origin: null" with the dashboard's own
    # forms, and the same-origin check could not tell them from another site's.
    (b"referrer-policy", b"same-origin"),
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
    """ASGI middleware: every check of the module docstring, in that order, then the
    security headers on whatever the dashboard answers."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        authorize: Authorize,
        hosts: tuple[HostPattern, ...] | None,
        signer: CsrfSigner,
        throttle: LoginThrottle,
        client: Client | Callable[[], Client],
        cookie_path: str,
    ) -> None:
        self.app = app
        self.authorize = authorize
        self.hosts = hosts
        self.signer = signer
        self.throttle = throttle
        self.client = client
        self.cookie_path = cookie_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        refusal = await self._refusal(request)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        nonce, new_nonce = self.signer.attach(request)
        started = False

        async def send_secured(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in {name for name, _ in SECURITY_HEADERS}
                ]
                if new_nonce:
                    headers.append((b"set-cookie", self._cookie(request, nonce)))
                message = {**message, "headers": headers + SECURITY_HEADERS}
            await send(message)

        try:
            await self.app(scope, receive, send_secured)
        except (DatabaseUnreachableError, DatabaseTimeoutError) as exc:
            if started:
                raise
            log.warning("pgwork dashboard: database unavailable: %s", exc)
            await _text(
                503,
                "Database unavailable: the dashboard cannot reach PostgreSQL right now "
                f"({type(exc).__name__}: {exc}). Reload the page to try again.\n",
                {"retry-after": "5"},
            )(scope, receive, send)
        except Exception:
            if started:
                raise
            log.exception("pgwork dashboard: unexpected error on %s", request.url.path)
            await _text(500, "Internal error: the dashboard failed to answer.\n")(
                scope, receive, send
            )

    def _cookie(self, request: Request, nonce: str) -> bytes:
        name = cookie_name(request.url.scheme)
        cookie: SimpleCookie = SimpleCookie()
        cookie[name] = nonce
        morsel = cookie[name]
        morsel["httponly"] = True
        morsel["samesite"] = "Strict"
        if request.url.scheme == "https":  # __Host-: Secure, path /, no Domain
            morsel["secure"] = True
            morsel["path"] = "/"
        else:
            root = str(request.scope.get("root_path", "")).rstrip("/")
            morsel["path"] = (self.cookie_path + root) or "/"
        return morsel.OutputString().encode("latin-1")

    async def _refusal(self, request: Request) -> Response | None:
        """The answer that stops this request before the dashboard sees it, if any."""
        scheme = request.url.scheme
        host = request.headers.get("host")
        if self.hosts is not None and not allowed_host(host, self.hosts, scheme):
            return _text(
                421,
                "Misdirected request: this dashboard is not served under the name in "
                "the Host header. Open it by its own address, or add the name to its "
                "allowed hosts (--allowed-host, create_dashboard(allowed_hosts=...)).\n",
            )
        if b"\x00" in unquote_to_bytes(request.scope.get("query_string", b"")) or (
            "\x00" in request.scope.get("path", "")
        ):
            return _text(400, "Bad request: the address holds a NUL character.\n")
        address = client_address(request)
        credentials = "authorization" in request.headers
        wait = self.throttle.retry_after(address)
        if wait is not None and credentials:
            self._auth_failed(request, address, wait)
            return _text(
                429,
                f"Too many failed logins from this address: try again in {int(wait) + 1} s.\n",
                {"retry-after": str(int(wait) + 1)},
            )
        decision: Any = self.authorize(request)
        if inspect.isawaitable(decision):
            decision = await decision
        if decision is not True:
            if credentials:
                self.throttle.failed(address)
                self._auth_failed(request, address, self.throttle.retry_after(address))
            return _auth_refusal(self.authorize)
        if credentials:
            self.throttle.succeeded(address)
        if request.method not in _SAFE_METHODS and not same_origin(
            host,
            request.headers.get("origin"),
            request.headers.get("sec-fetch-site"),
            scheme,
        ):
            emit(
                self.client,
                DASHBOARD_ACTION,
                action=request.url.path.rsplit("/", 1)[-1],
                user=who(request),
                client=address,
                ids=(),
                outcome="forbidden",
                message=f"cross-site request from {request.headers.get('origin')!r}",
            )
            return _text(
                403,
                "Cross-site request refused: actions can only be sent from the "
                "dashboard's own pages.\n",
            )
        return None

    def _auth_failed(self, request: Request, address: str, wait: float | None) -> None:
        emit(
            self.client,
            DASHBOARD_AUTH_FAILED,
            user=who(request),
            client=address,
            path=request.url.path,
            locked=wait is not None,
            retry_after_s=round(wait, 1) if wait is not None else None,
        )


def _text(status: int, body: str, headers: dict[str, str] | None = None) -> Response:
    return PlainTextResponse(
        body, status_code=status, headers={**SECURITY_HEADERS_TEXT, **(headers or {})}
    )


def _auth_refusal(authorize: Authorize) -> Response:
    challenge = getattr(authorize, "challenge", None)
    if isinstance(challenge, str):
        return _text(401, "Authentication required.\n", {"www-authenticate": challenge})
    return _text(403, "Not allowed.\n")


SECURITY_HEADERS_TEXT = {k.decode(): v.decode() for k, v in SECURITY_HEADERS}
