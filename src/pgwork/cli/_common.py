"""Pieces shared by the command modules of ``pgwork``: options, consoles, signals, migrations.

Kept apart so no command module imports another, nor ``pgwork.cli`` (which imports them
all). The environment variable names are declared here on the options, but click reads
them only while ``pgwork.cli.main`` parses a command line, so ``main`` stays the one entry
point that reads argv and the environment.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Coroutine
from functools import partial
from types import ModuleType
from typing import Any

import anyio
import anyio.abc
import click
from rich.console import Console

from pgwork.postgres._names import DEFAULT_SCHEMA

__all__ = [
    "LOOPS",
    "dsn_option",
    "load_migrations",
    "loop_options",
    "require_dsn",
    "schema_option",
    "stderr",
    "stdout",
    "stop_on_signals",
]


def stdout() -> Console:
    return Console(highlight=False, soft_wrap=True)


def stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def require_dsn(dsn: str | None) -> str:
    if not dsn:
        raise click.UsageError("no database given: pass --dsn, or set PGWORK_DSN or DATABASE_URL")
    return dsn


dsn_option = click.option(
    "--dsn",
    envvar=["PGWORK_DSN", "DATABASE_URL"],
    show_envvar=True,
    help="PostgreSQL DSN, e.g. postgresql://user:password@host:5432/dbname.",
)
schema_option = click.option(
    "--schema",
    envvar="PGWORK_SCHEMA",
    show_envvar=True,
    default=DEFAULT_SCHEMA,
    show_default=True,
    help="Schema holding pgwork's tables.",
)


# ``--loop``: the event loop a long-running command runs on.
LOOPS = ("auto", "asyncio", "uvloop")


def loop_options(choice: str) -> dict[str, Any]:
    """anyio's backend options for ``--loop CHOICE``.

    ``auto`` takes uvloop when it is installed (``pgwork[uvloop]``) and asyncio's own
    loop otherwise, as uvicorn, PgQueuer's and oban-py's command lines do, so a worker
    runs on the loop a user of those would expect; ``uvloop`` insists on it."""
    if choice == "asyncio":
        return {}
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise click.UsageError(
                "--loop uvloop: uvloop is not installed (pip install 'pgwork[uvloop]'; "
                "it has no Windows build)"
            ) from None
        return {}
    return {"use_uvloop": True}


def load_migrations() -> ModuleType:
    """Alembic, and SQLAlchemy under it, load only for the commands that migrate: the
    others (a worker above all) start without them."""
    from pgwork.postgres import migrate

    return migrate


async def stop_on_signals(
    stop: Callable[..., Coroutine[Any, Any, None]],
    tasks: anyio.abc.TaskGroup,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """First signal: graceful stop. Second: abort in-flight attempts and release them."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        received = 0
        async for signum in signals:
            received += 1
            name = signal.Signals(signum).name
            if received == 1:
                stderr().print(
                    f"[yellow]{name}: stopping; in-flight jobs may finish "
                    "(send it again to abort them and hand them back)[/]"
                )
                tasks.start_soon(stop)
            else:
                stderr().print(f"[yellow]{name}: aborting in-flight jobs[/]")
                tasks.start_soon(partial(stop, grace_period=0))
