"""``pgwork dashboard``: serve the web dashboard with uvicorn.

Defined here and attached to ``pgwork.cli.main`` by ``cli.py``; this module never
imports ``pgwork.cli``. The dashboard's packages (starlette, jinja2, uvicorn) are the
``pgwork[dashboard]`` extra, imported only when the command runs, so the rest of the
program works without them.

Binding to anything but a loopback address needs ``--auth`` or a token: a dashboard
that can cancel and delete jobs is not left open to a network by accident.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import anyio
import click

from pgwork.cli._common import dsn_option, require_dsn, schema_option, stderr

__all__ = ["dashboard"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _authorize(auth: str | None, token: str | None) -> Any:
    from pgwork.dashboard import BasicAuth, TokenAuth, allow_any

    if auth and token:
        raise click.UsageError("give --auth or a token, not both")
    if auth:
        user, sep, password = auth.partition(":")
        if not sep or not user or not password:
            raise click.UsageError("--auth takes USER:PASSWORD, both non-empty")
        return BasicAuth(user, password)
    if token:
        try:
            return TokenAuth(token)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    return allow_any


@click.command(short_help="Serve the web dashboard (needs pgwork[dashboard]).")
@dsn_option
@schema_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8321, show_default=True)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing.")
@click.option(
    "--auth",
    metavar="USER:PASSWORD",
    envvar="PGWORK_DASHBOARD_AUTH",
    show_envvar=True,
    help="Require HTTP Basic with this user and password.",
)
@click.option(
    "--token",
    envvar="PGWORK_DASHBOARD_TOKEN",
    show_envvar=True,
    help="Require this token (Bearer, or as the Basic password); prefer the variable.",
)
@click.option(
    "--base-path",
    default="",
    help="Path prefix a reverse proxy serves the dashboard under (and strips).",
)
def dashboard(
    dsn: str | None,
    schema: str,
    host: str,
    port: int,
    read_only: bool,
    auth: str | None,
    token: str | None,
    base_path: str,
) -> None:
    """Serve the dashboard: queues, chains, jobs and workers, in a browser."""
    given = require_dsn(dsn)
    try:
        import uvicorn  # noqa: F401

        from pgwork.dashboard import create_dashboard  # noqa: F401
    except ImportError as exc:
        raise click.UsageError(
            f"the dashboard needs its extra: pip install 'pgwork[dashboard]' ({exc})"
        ) from None
    authorize = _authorize(auth, token)
    if not (auth or token) and not _is_loopback(host):
        raise click.UsageError(
            f"refusing to serve the dashboard on {host} without authentication: "
            "pass --auth USER:PASSWORD or set PGWORK_DASHBOARD_TOKEN, or bind to 127.0.0.1"
        )
    anyio.run(_serve, given, schema, host, port, read_only, authorize, base_path)


async def _serve(
    dsn: str,
    schema: str,
    host: str,
    port: int,
    read_only: bool,
    authorize: Any,
    base_path: str,
) -> None:
    import uvicorn

    from pgwork.client import create_client
    from pgwork.dashboard import create_dashboard
    from pgwork.job_types import JobTypeRegistry
    from pgwork.postgres.notify import PostgresNotifyAdapter
    from pgwork.postgres.state import PostgresStateAdapter

    state = await PostgresStateAdapter.connect(dsn, schema=schema, max_size=5)
    client = create_client(
        state_adapter=state,
        notify_adapter=PostgresNotifyAdapter(dsn, schema=schema),
        registry=JobTypeRegistry(),
        observers=[],
    )
    app = create_dashboard(client, authorize=authorize, base_path=base_path, read_only=read_only)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    stderr().print(f"pgwork dashboard on http://{shown}:{port}{base_path}/ (Ctrl-C stops it)")
    try:
        await server.serve()
    finally:
        with anyio.CancelScope(shield=True):
            await client.close()
