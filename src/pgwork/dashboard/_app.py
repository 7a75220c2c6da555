"""``create_dashboard``: the Starlette app and its routes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from pgwork.client import Client
from pgwork.dashboard._actions import Actions
from pgwork.dashboard._context import Context
from pgwork.dashboard._csrf import CsrfSigner
from pgwork.dashboard._history_page import HistoryPage
from pgwork.dashboard._limits_page import LimitsPage
from pgwork.dashboard._origin import LOOPBACK_NAMES, parse_hosts
from pgwork.dashboard._pages import Pages
from pgwork.dashboard._security import Authorize, Guard
from pgwork.dashboard._throttle import LoginThrottle
from pgwork.dashboard._waiting_page import WaitingPage
from pgwork.dashboard._work_pages import WorkPages
from pgwork.errors import ConfigurationError
from pgwork.schedules import CronSchedule

__all__ = ["create_dashboard"]

_STATIC_TYPES = {"css": "text/css; charset=utf-8", "js": "text/javascript; charset=utf-8"}


def _static_files() -> dict[str, tuple[bytes, str]]:
    """Every asset, read once from the package: the dashboard needs no network."""
    folder = resources.files("pgwork.dashboard") / "static"
    files = {}
    for item in folder.iterdir():
        kind = item.name.rsplit(".", 1)[-1]
        if kind in _STATIC_TYPES:
            files[item.name] = (item.read_bytes(), _STATIC_TYPES[kind])
    return files


def create_dashboard(
    client: Client | Callable[[], Client],
    *,
    authorize: Authorize,
    base_path: str = "",
    read_only: bool = False,
    allowed_hosts: Iterable[str] = LOOPBACK_NAMES,
    csrf_secret: bytes | None = None,
    login_throttle: LoginThrottle | None = None,
    schedules: Sequence[CronSchedule[Any]] = (),
) -> Starlette:
    """An ASGI app to watch and operate pgwork's queues, chains, jobs and workers.

    Mount it in any ASGI app (``app.mount("/jobs", dashboard)``) or serve it alone
    (``pgwork dashboard``). ``client``: a ``Client``, or a function returning one, for
    an app that builds its client at startup. ``authorize(request)`` (sync or async)
    decides every request; ``pgwork.dashboard`` offers ``BasicAuth``, ``TokenAuth`` and,
    for a dashboard only trusted people can reach, ``allow_any``. ``base_path``: the
    path a reverse proxy serves the dashboard under, when it strips it before passing
    requests on. ``read_only``: show everything, change nothing.

    ``allowed_hosts``: the names (``host`` or ``host:port``) the dashboard is served as;
    a request whose ``Host`` names another is refused with 421, so a page that rebinds
    its own name to this address cannot read the dashboard. The default is this
    machine's loopback names; an application serving it under a public name lists
    that name, or ``["*"]`` when it checks ``Host`` itself. ``csrf_secret``: the key
    of the forms' tokens, to share between processes serving one dashboard (default:
    random per process). ``login_throttle``: how failed logins lock a client out
    (default ``LoginThrottle()``: 10 failures in 5 minutes, then 60 s, doubling).
    ``schedules``: the cron schedules your workers are given, for the schedules page
    (when each fires next, and whether its latest tick started a chain).
    """
    if not callable(authorize):
        raise ConfigurationError(
            "authorize must be a function of the request returning a bool (or an "
            "awaitable of one); use pgwork.dashboard.allow_any to let everyone in"
        )
    if base_path and (not base_path.startswith("/") or "//" in base_path):
        raise ConfigurationError(f"base_path must start with '/', got {base_path!r}")
    hosts = parse_hosts([allowed_hosts] if isinstance(allowed_hosts, str) else allowed_hosts)
    if csrf_secret is not None and (not isinstance(csrf_secret, bytes) or len(csrf_secret) < 16):
        raise ConfigurationError("csrf_secret must be at least 16 random bytes")
    context = Context.build(client, base_path=base_path, read_only=read_only)
    pages = Pages(context)
    actions = Actions(context)
    work = WorkPages(context, schedules=tuple(schedules))
    history = HistoryPage(context)
    flow = LimitsPage(context)
    waits = WaitingPage(context)
    files = _static_files()

    async def static(request: Request) -> Response:
        found = files.get(request.path_params["name"])
        if found is None:
            return await pages.not_found(request)
        body, media_type = found
        return Response(body, media_type=media_type, headers={"cache-control": "max-age=300"})

    routes = [
        Route("/", pages.overview, methods=["GET"]),
        Route("/chains", pages.chains, methods=["GET"]),
        Route("/chains/{chain_id}", pages.chain, methods=["GET"]),
        Route("/jobs/{job_id}", pages.job, methods=["GET"]),
        Route("/failed", pages.failed, methods=["GET"]),
        Route("/actions/{action}", actions.act, methods=["POST"]),
        Route("/static/{name}", static, methods=["GET"]),
        Route("/jobs", work.jobs, methods=["GET"]),
        Route("/queues", work.queues, methods=["GET"]),
        Route("/workers", work.workers, methods=["GET"]),
        Route("/errors", work.errors, methods=["GET"]),
        Route("/search", work.search, methods=["GET"]),
        Route("/schedules", work.schedules, methods=["GET"]),
        Route("/history", history.history, methods=["GET"]),
        Route("/limits", flow.limits, methods=["GET"]),
        Route("/waiting", waits.waiting, methods=["GET"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        path, root = request.url.path, str(request.scope.get("root_path", ""))
        path = path[len(root) :] if root and path.startswith(root) else path
        if request.method in ("GET", "HEAD") and path != "/" and path.endswith("/"):
            # A path-absolute redirect, built from the path alone: never from Host,
            # and never '//' (another site's address).
            target = context.prefix(request) + "/" + path.strip("/")
            if request.url.query:
                target += f"?{request.url.query}"
            return RedirectResponse(target, status_code=307)
        return await pages.not_found(request)

    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(
                Guard,
                authorize=authorize,
                hosts=hosts,
                signer=CsrfSigner(csrf_secret),
                throttle=login_throttle or LoginThrottle(),
                client=client,
                cookie_path=base_path.rstrip("/"),
            )
        ],
        exception_handlers={404: not_found},
    )
    # Starlette's own slash redirect builds an absolute URL from the Host header.
    app.router.redirect_slashes = False
    return app
