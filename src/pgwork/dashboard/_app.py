"""``create_dashboard``: the Starlette app and its routes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pgwork.client import Client
from pgwork.dashboard._actions import Actions
from pgwork.dashboard._context import Context
from pgwork.dashboard._pages import Pages
from pgwork.dashboard._security import Authorize, Guard
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
    schedules: Sequence[CronSchedule[Any]] = (),
) -> Starlette:
    """An ASGI app to watch and operate pgwork's queues, chains, jobs and workers.

    Mount it in any ASGI app (``app.mount("/jobs", dashboard)``) or serve it alone
    (``pgwork dashboard``). ``client``: a ``Client``, or a function returning one, for
    an app that builds its client at startup. ``authorize(request)`` (sync or async)
    decides every request; ``pgwork.dashboard`` offers ``BasicAuth``, ``TokenAuth`` and,
    for a dashboard only trusted people can reach, ``allow_any``. ``base_path``: the
    path a reverse proxy serves the dashboard under, when it strips it before passing
    requests on. ``read_only``: show everything, change nothing. ``schedules``: the
    cron schedules your workers are given, for the schedules page (when each fires
    next, and whether its latest tick started a chain).
    """
    if not callable(authorize):
        raise ConfigurationError(
            "authorize must be a function of the request returning a bool (or an "
            "awaitable of one); use pgwork.dashboard.allow_any to let everyone in"
        )
    if base_path and (not base_path.startswith("/") or "//" in base_path):
        raise ConfigurationError(f"base_path must start with '/', got {base_path!r}")
    context = Context.build(client, base_path=base_path, read_only=read_only)
    pages = Pages(context)
    actions = Actions(context)
    work = WorkPages(context, schedules=tuple(schedules))
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
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return await pages.not_found(request)

    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, authorize=authorize)],
        exception_handlers={404: not_found},
    )
