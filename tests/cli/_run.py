"""Running one ``pgwork`` command against a test's database."""

from __future__ import annotations

from click.testing import CliRunner, Result

from pgwork.cli import main


def run(runner: CliRunner, dsn: str, *args: str, width: int = 160) -> Result:
    """``pgwork ARGS --dsn DSN``, its tables ``width`` columns wide."""
    return runner.invoke(main, [*args, "--dsn", dsn], env={"COLUMNS": str(width)})
