"""What every dashboard handler shares: the client, the templates, the URL prefix.

Rendering lives here so each page handler is a read and a template name. Every HTML
response is ``no-store`` (pages carry job payloads), and sets the CSRF cookie the forms
echo when the browser has none yet.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import wraps
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlencode

import anyio
import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from pgwork._flow_control import duration_text, rate_text
from pgwork.client import Client
from pgwork.dashboard import _format
from pgwork.dashboard._csrf import CSRF_FIELD, csrf_token
from pgwork.errors import DatabaseError

__all__ = ["READ_TIMEOUT", "Context", "bounded"]

NOTICE_COOKIE = "pgwork_notice"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pgwork.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["json_text"] = _format.json_text
    env.filters["short"] = _format.short_id
    env.filters["stamp"] = lambda d: f"{d:%Y-%m-%d %H:%M:%S} UTC" if d is not None else ""
    env.globals["duration"] = _format.duration
    env.filters["took"] = _format.took
    env.filters["rate"] = rate_text
    env.filters["window"] = lambda rate: duration_text(rate.per)
    return env


@dataclass
class Context:
    client_source: Client | Callable[[], Client]
    base_path: str
    read_only: bool
    env: jinja2.Environment

    @classmethod
    def build(
        cls, client: Client | Callable[[], Client], *, base_path: str, read_only: bool
    ) -> Context:
        return cls(client, base_path.rstrip("/"), read_only, _environment())

    @property
    def client(self) -> Client:
        source = self.client_source
        return source if isinstance(source, Client) else source()

    def prefix(self, request: Request) -> str:
        """Where the dashboard's own root is, as the browser sees it: the proxy's
        ``base_path`` plus the path it is mounted at in the ASGI app."""
        return self.base_path + str(request.scope.get("root_path", "")).rstrip("/")

    def url(self, request: Request, path: str, **query: Any) -> str:
        given = {k: v for k, v in query.items() if v not in (None, "")}
        tail = f"?{urlencode(given)}" if given else ""
        return f"{self.prefix(request)}{path}{tail}"

    def render(
        self, request: Request, template: str, status_code: int = 200, **values: Any
    ) -> HTMLResponse:
        csrf = csrf_token(request)
        notice = unquote(request.cookies.get(NOTICE_COOKIE) or "")
        now = datetime.now(UTC)
        body = self.env.get_template(template).render(
            request=request,
            url=lambda path, **q: self.url(request, path, **q),
            static=lambda name: self.url(request, f"/static/{name}"),
            read_only=self.read_only,
            csrf_field=CSRF_FIELD,
            csrf=csrf,
            notice=notice[:300] if notice else None,
            now=now,
            age=lambda moment: _format.age(moment, now),
            current=request.url.path,
            **values,
        )
        response = HTMLResponse(body, status_code=status_code)
        response.headers["cache-control"] = "no-store"
        cookie_path = self.prefix(request) or "/"
        if notice:
            response.delete_cookie(NOTICE_COOKIE, path=cookie_path)
        return response

    def error(self, request: Request, status_code: int, title: str, message: str) -> HTMLResponse:
        return self.render(
            request, "error.html", status_code=status_code, title=title, message=message
        )


# A page's reads must be done within this many seconds. A database that went away
# otherwise holds each request for the client's whole operation timeout (30 s by
# default) while the browser keeps the page it has; past the bound the page is a 503
# saying so, which the live refresh shows as stale data.
READ_TIMEOUT = 5.0


class _Page(Protocol):
    ctx: Context


P = TypeVar("P", bound=_Page)
Handler = Callable[[P, Request], Awaitable[Response]]


def bounded(handler: Handler[P]) -> Handler[P]:
    """A page's ``handler``, answering 503 when the database fails it or takes too long."""

    @wraps(handler)
    async def within_bound(self: P, request: Request) -> Response:
        try:
            with anyio.fail_after(READ_TIMEOUT):
                return await handler(self, request)
        except DatabaseError as exc:  # unreachable, or the client's own bound passed
            return self.ctx.error(request, 503, "Database unavailable", str(exc))
        except TimeoutError:
            message = f"The database gave no answer within {READ_TIMEOUT:g} s."
            return self.ctx.error(request, 503, "Database not answering", message)

    return within_bound
