"""The click group every ``pgwork`` command hangs on, and the exit statuses they share.

A ``PgworkError`` raised by any command is printed as one red line on stderr (no
traceback) and exits with status 2, so scripts can tell "the command failed" from
``pgwork check``'s status 1, "the schema is not at head". This module imports no command:
the commands import it (for the statuses) and ``pgwork.cli`` attaches them to ``main``.
"""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape

from pgwork.cli._common import stderr
from pgwork.errors import PgworkError

__all__ = ["EXIT_ABANDONED", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NOT_AT_HEAD", "main"]

EXIT_NOT_AT_HEAD = 1
EXIT_ERROR = 2
# The worker stopped, but handlers that ignored cancellation were still running: the
# process ends without waiting for them (Python cannot stop them any other way).
EXIT_ABANDONED = 3
EXIT_INTERRUPTED = 130


class _Group(click.Group):
    """A click group that turns pgwork's errors into one readable line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (PgworkError, BaseExceptionGroup) as caught:
            exc = _pgwork_error(caught)
            if exc is None:
                raise
            message = " ".join(str(exc).split())
            stderr().print(f"[bold red]error:[/] [red]{escape(message)}[/]")
            ctx.exit(EXIT_ERROR)


def _pgwork_error(exc: BaseException) -> PgworkError | None:
    """The PgworkError in ``exc``, also from inside the exception groups of task groups."""
    if isinstance(exc, PgworkError):
        return exc
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _pgwork_error(exc.exceptions[0])
    return None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pgwork")
def main() -> None:
    """pgwork: durable background jobs stored in PostgreSQL."""
