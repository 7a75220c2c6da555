"""``pgwork dashboard``: serve the web dashboard with uvicorn.

Defined here and attached to ``pgwork.cli.main`` by ``cli.py``; this module never
imports ``pgwork.cli``. The dashboard's packages (starlette, jinja2, uvicorn) are the
``pgwork[dashboard]`` extra, imported only when the command runs, so the rest of the
program works without them.

Binding to anything but a loopback address needs ``--auth`` (a password of at least
12 characters) or a token: a dashboard that can cancel and delete jobs is not left open
to a network by accident. Credentials can come from a file or the environment, so they
never show in ``ps``. The served app answers only the names it is served as (loopback
names with the port, the ``--host`` address, ``--allowed-host`` names), and every
action and failed login is logged on stderr (``pgwork.events``).
"""

from __future__ import annotations

import ipaddress
import logging
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
import click

from pgwork.cli._common import dsn_option, require_dsn, schema_option, stderr
from pgwork.cli._targets import load_target
from pgwork.errors import ConfigurationError

__all__ = ["dashboard"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


MIN_PASSWORD_LENGTH = 12


def _read_auth_file(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"cannot read --auth-file {str(path)!r}: {exc}") from None
    if not lines or not lines[0].strip():
        raise click.UsageError(f"--auth-file {str(path)!r} is empty: write USER:PASSWORD in it")
    return lines[0].strip()


def _authorize(auth: str | None, token: str | None, *, loopback: bool) -> Any:
    from pgwork.dashboard import BasicAuth, TokenAuth, allow_any

    if auth and token:
        raise click.UsageError("give --auth (or --auth-file) or a token, not both")
    if auth:
        user, sep, password = auth.partition(":")
        if not sep or not user or not password:
            raise click.UsageError("--auth takes USER:PASSWORD, both non-empty")
        if not loopback and len(password) < MIN_PASSWORD_LENGTH:
            raise click.UsageError(
                f"the --auth password is {len(password)} characters long: serving beyond "
                f"this machine needs at least {MIN_PASSWORD_LENGTH} (a passphrase of a few "
                "words will do)"
            )
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
    help="Require HTTP Basic with this user and password (visible in ps: prefer the "
    "variable or --auth-file).",
)
@click.option(
    "--auth-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Read USER:PASSWORD from the first line of this file.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME[:PORT]",
    help="Another name the dashboard is served as (a proxy's public name); repeatable. "
    "Requests naming any other host are refused.",
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
@click.option(
    "--schedules",
    "schedules_target",
    metavar="MODULE:ATTR",
    help="The cron schedules your workers run (a list of CronSchedule, or a function "
    "returning one), for the schedules page.",
)
def dashboard(
    dsn: str | None,
    schema: str,
    host: str,
    port: int,
    read_only: bool,
    auth: str | None,
    auth_file: Path | None,
    allowed_hosts: tuple[str, ...],
    token: str | None,
    base_path: str,
    schedules_target: str | None,
) -> None:
    """Serve the dashboard: queues, chains, jobs and workers, in a browser."""
    given = require_dsn(dsn)
    try:
        import uvicorn  # noqa: F401

        from pgwork.dashboard import create_dashboard  # noqa: F401
        from pgwork.dashboard._origin import parse_hosts
    except ImportError as exc:
        raise click.UsageError(
            f"the dashboard needs its extra: pip install 'pgwork[dashboard]' ({exc})"
        ) from None
    if auth_file is not None:
        if auth:
            raise click.UsageError("give --auth or --auth-file, not both")
        auth = _read_auth_file(auth_file)
    loopback = _is_loopback(host)
    authorize = _authorize(auth, token, loopback=loopback)
    if not (auth or token) and not loopback:
        raise click.UsageError(
            f"refusing to serve the dashboard on {host} without authentication: "
            "pass --auth-file (or PGWORK_DASHBOARD_AUTH=USER:PASSWORD) or set "
            "PGWORK_DASHBOARD_TOKEN, or bind to 127.0.0.1"
        )
    hosts = _served_names(host, port, allowed_hosts)
    try:
        parse_hosts(hosts)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    schedules = _load_schedules(schedules_target) if schedules_target else []
    _configure_logging()
    anyio.run(_serve, given, schema, host, port, read_only, authorize, base_path, hosts, schedules)


def _load_schedules(target: str) -> list[Any]:
    """The ``CronSchedule`` list ``target`` names (or a function's, called once)."""
    from pgwork.schedules import CronSchedule

    try:
        found = load_target(target, what="schedules", example="myapp.jobs:SCHEDULES")
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    if callable(found) and not isinstance(found, CronSchedule):
        try:
            found = found()
        except Exception as exc:
            raise click.UsageError(
                f"calling {target} for the schedules failed: {type(exc).__name__}: {exc}"
            ) from None
    if isinstance(found, CronSchedule):
        found = [found]
    if isinstance(found, (str, bytes)) or not isinstance(found, Iterable):
        raise click.UsageError(f"{target} is a {type(found).__name__}, not a list of CronSchedule")
    schedules = list(found)
    strays = [type(s).__name__ for s in schedules if not isinstance(s, CronSchedule)]
    if strays:
        raise click.UsageError(
            f"{target} holds {', '.join(sorted(set(strays)))}, not only CronSchedule"
        )
    return schedules


def _served_names(host: str, port: int, extra: tuple[str, ...]) -> list[str]:
    """The names a browser reaches this server by: the loopback names with the port,
    the bound address unless it is a wildcard, and the names given."""
    with_port = (lambda name: f"{name}:{port}") if port else (lambda name: name)
    names = [with_port(n) for n in ("127.0.0.1", "localhost", "[::1]")]
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        names.append(with_port(host))
    else:
        if not address.is_unspecified:
            names.append(with_port(f"[{address}]" if address.version == 6 else str(address)))
    return names + list(extra)


def _configure_logging() -> None:
    """The audit trail (actions, failed logins) and warnings on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("pgwork.events", "pgwork.dashboard"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)


async def _serve(
    dsn: str,
    schema: str,
    host: str,
    port: int,
    read_only: bool,
    authorize: Any,
    base_path: str,
    allowed_hosts: list[str],
    schedules: list[Any],
) -> None:
    import uvicorn

    from pgwork.client import create_client
    from pgwork.dashboard import create_dashboard
    from pgwork.job_types import JobTypeRegistry
    from pgwork.observability import LoggingObserver
    from pgwork.postgres.notify import PostgresNotifyAdapter
    from pgwork.postgres.state import PostgresStateAdapter

    state = await PostgresStateAdapter.connect(dsn, schema=schema, max_size=5)
    client = create_client(
        state_adapter=state,
        notify_adapter=PostgresNotifyAdapter(dsn, schema=schema),
        registry=JobTypeRegistry(),
        observers=[LoggingObserver()],
    )
    app = create_dashboard(
        client,
        authorize=authorize,
        base_path=base_path,
        read_only=read_only,
        allowed_hosts=allowed_hosts,
        schedules=schedules,
    )
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
